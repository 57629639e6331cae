"""bench/same_as_safetensors.py, the byte check the bench scripts share: passes on an exact load (NaNs included),
names the tensor when one byte differs, when a shape differs or when a tensor is missing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import same_as_safetensors  # noqa: E402

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")


@pytest.fixture()
def checkpoint(tmp_path: Path) -> tuple[Path, dict]:
    g = torch.Generator().manual_seed(3)
    # Random bits as bf16: many are NaN, which a numeric comparison would call different from themselves.
    tensors = {f"t{i}": torch.randint(-(2**15), 2**15, (64, 33), generator=g, dtype=torch.int16).view(torch.bfloat16)
               for i in range(4)}
    path = tmp_path / "c.safetensors"
    st.save_file(tensors, str(path))
    return path, st.load_file(str(path))


def test_an_exact_load_passes(checkpoint) -> None:
    path, loaded = checkpoint
    assert any(torch.isnan(t).any() for t in loaded.values())
    same_as_safetensors.check(str(path), loaded, "exact")


def test_one_changed_byte_is_named(checkpoint) -> None:
    path, loaded = checkpoint
    loaded["t2"].view(torch.uint8).view(-1)[1234] ^= 1
    with pytest.raises(SystemExit, match="probe: t2 differs"):
        same_as_safetensors.check(str(path), loaded, "probe")


def test_a_reshaped_or_missing_tensor_is_named(checkpoint) -> None:
    path, loaded = checkpoint
    loaded["t1"] = loaded["t1"].reshape(33, 64)
    with pytest.raises(SystemExit, match="t1 differs"):
        same_as_safetensors.check(str(path), loaded, "probe")
    del loaded["t0"]
    with pytest.raises(SystemExit, match="t0 is missing"):
        same_as_safetensors.check(str(path), loaded, "probe")
