"""bench/shapes.py: its checks catch a changed byte, and a small run on the host gives well-formed, verified
results (the GPU cases run on the GPU machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import shapes  # noqa: E402

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
pytest.importorskip("safetensors")
shapes.torch, shapes.np = torch, np


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("shapes") / "upstream.safetensors"
    shapes.make_upstream(str(path), 3 << 20, seed=1)
    return path


def test_upstream_layout_is_llama_and_unaligned(upstream: Path) -> None:
    ckpt = shapes.open_checkpoint(str(upstream))
    names = ckpt.names()
    assert "model.embed_tokens.weight" in names and "lm_head.weight" in names
    assert all(e.dtype == "BF16" for e in ckpt.entries)
    assert ckpt.tensor_bytes >= 3 << 20
    assert any(e.offset % 4096 for e in ckpt.entries), "save_file's layout leaves offsets unaligned"


def test_checks_catch_one_changed_byte(upstream: Path) -> None:
    from safetensors.torch import load_file

    ckpt = shapes.open_checkpoint(str(upstream))
    ref = shapes.reference(ckpt, "cpu")
    loaded = load_file(str(upstream))
    shapes.verify(loaded, ref, ckpt, "cpu")
    name = ckpt.entries[len(ckpt.entries) // 2].name
    loaded[name] = loaded[name].clone()
    shapes.flat_bytes(loaded[name])[1234] ^= 1
    with pytest.raises(ValueError, match="differ"):
        shapes.verify(loaded, ref, ckpt, "cpu")

    raw = shapes.RawBytes(torch.from_numpy(np.fromfile(str(upstream), dtype=np.uint8)), 0)
    shapes.verify(raw, ref, ckpt, "cpu")
    raw.data[ckpt.entries[-1].offset + 7] ^= 0x80
    with pytest.raises(ValueError, match="differ"):
        shapes.verify(raw, ref, ckpt, "cpu")


def test_gpu_checksum_matches_itself_across_chunks() -> None:
    """The positional sums (used on GPUs) computed in one block and in several agree, and see a swap of words."""
    data = torch.randint(0, 256, (3 * shapes.CHUNK + 6,), dtype=torch.uint8)
    words = data.view(torch.int16).to(torch.int64) & 0xFFFF
    a, b = shapes._sums(words, 0)
    half = words.numel() // 2
    a1, b1 = shapes._sums(words[:half], 0)
    a2, b2 = shapes._sums(words[half:], half)
    assert (a, b) == (a1 + a2, b1 + b2)
    assert a == int(words.sum())
    words[10], words[11] = 1, 2
    a, b = shapes._sums(words, 0)
    swapped = words.clone()
    swapped[[10, 11]] = swapped[[11, 10]]
    assert shapes._sums(swapped, 0) == (a, b - 1)


def test_host_run_is_well_formed_and_verified(upstream: Path, tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    cmd = [sys.executable, str(ROOT / "bench" / "shapes.py"), "--file", str(upstream), "--device", "cpu",
           "--runs", "1", "--cases", "warm,tmpfs,host", "--methods", "weightlift.load_file,safetensors.load_file,np.fromfile",
           "--shm-dir", str(tmp_path / "shm")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    absent = [s["reason"] for s in out["skipped"] if s["reason"].startswith("import weightlift failed")]
    if absent:
        pytest.skip(absent[0])
    assert not [s for s in out["skipped"] if s["reason"] != "loads onto CUDA devices only"], out["skipped"]
    got = {(r["method"], r["case"]) for r in out["results"]}
    assert ("weightlift.load_file", "warm") in got and ("safetensors.load_file", "tmpfs") in got
    assert ("np.fromfile", "host, fresh memory, warm file (interleaved pairs)") in got
    for r in out["results"]:
        assert r["verified"] is True
        assert r["best"] >= r["median"] > 0 and len(r["runs_gbps"]) >= 1
    assert not (tmp_path / "shm" / upstream.name).exists(), "tmpfs copies are removed at exit"


def test_positional_checksum_of_an_odd_start_equals_that_of_a_copy() -> None:
    data = torch.randint(0, 256, (10_001,), dtype=torch.uint8)
    view = data[1:]
    assert view.storage_offset() == 1
    assert shapes.positional(view) == shapes.positional(view.clone())
    changed = view.clone()
    changed[5000] ^= 1
    assert shapes.positional(changed) != shapes.positional(view)
