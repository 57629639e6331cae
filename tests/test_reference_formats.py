"""`weightlift inspect` and `weightlift generate` against independent readers and writers: the `safetensors`
and `gguf` Python packages must agree with weightlift on names, dtypes, shapes, byte ranges and bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

safetensors = pytest.importorskip("safetensors")
gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

LAYOUTS = ["llama", "many-small", "single-huge"]


def tensor_bytes(t: "torch.Tensor") -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def check_safetensors_agree(wl, path: Path) -> dict:
    info = wl.json("inspect", "--json", path)
    data = path.read_bytes()
    ours = {t["name"]: t for t in info["tensors"]}
    with safe_open(str(path), framework="pt") as f:
        names = set(f.keys())
        visible = {n for n in names if not n.startswith("__weightlift_pad_")}
        assert visible == set(ours), "tensor names differ"
        for name in visible:
            t = f.get_tensor(name)
            mine = ours[name]
            assert list(t.shape) == mine["shape"], name
            expected_dtype = {
                "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
                "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16, "U16": torch.uint16, "I32": torch.int32,
                "I64": torch.int64, "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
                "U32": torch.uint32, "U64": torch.uint64,
            }[mine["dtype"]]
            assert t.dtype == expected_dtype, name
            raw = tensor_bytes(t)
            assert len(raw) == mine["nbytes"], name
            assert data[mine["offset"]:mine["offset"] + mine["nbytes"]] == raw, name
        meta = f.metadata() or {}
    file_meta = info["files"][0]["metadata"] or {}
    assert meta == file_meta
    return info


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("align", [None, 4096])
def test_generated_safetensors_read_by_safetensors(wl, tmp_path, layout, align):
    path = tmp_path / f"{layout}.safetensors"
    args = ["generate", path, "--size", "6MiB", "--layout", layout, "--seed", "3"]
    if align:
        args += ["--align", str(align)]
    wl.run(*args)
    info = check_safetensors_agree(wl, path)
    assert info["format"] == "safetensors"
    assert info["total_bytes"] > 0
    if align:
        assert all(t["offset"] % align == 0 for t in info["tensors"] if t["nbytes"])


def test_files_written_by_safetensors_read_identically(wl, tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "f32": torch.randn(3, 5, generator=g),
        "bf16": torch.randn(7, generator=g).to(torch.bfloat16),
        "f16": torch.randn(2, 2, 2, generator=g).to(torch.float16),
        "f64": torch.randn(1, generator=g).to(torch.float64),
        "i64": torch.randint(-9, 9, (4,), generator=g),
        "i32": torch.randint(-9, 9, (3, 1), generator=g, dtype=torch.int32),
        "i16": torch.randint(-9, 9, (5,), generator=g, dtype=torch.int16),
        "i8": torch.randint(-9, 9, (6,), generator=g, dtype=torch.int8),
        "u8": torch.randint(0, 255, (9,), generator=g, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "f8e4m3": torch.randn(4, generator=g).to(torch.float8_e4m3fn),
        "f8e5m2": torch.randn(4, generator=g).to(torch.float8_e5m2),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
    }
    path = tmp_path / "written.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt", "note": "upstream"})
    info = check_safetensors_agree(wl, path)
    shapes = {t["name"]: t["shape"] for t in info["tensors"]}
    assert shapes["scalar"] == [] and shapes["empty"] == [0, 3]


def test_sharded_checkpoint_written_by_transformers_style_index(wl, tmp_path):
    import json

    g = torch.Generator().manual_seed(1)
    shards = {
        "model-00001-of-00002.safetensors": {"a": torch.randn(4, 4, generator=g), "b": torch.randn(3, generator=g)},
        "model-00002-of-00002.safetensors": {"c": torch.randn(8, generator=g).to(torch.bfloat16)},
    }
    weight_map = {}
    for fname, ts in shards.items():
        save_file(ts, str(tmp_path / fname))
        weight_map.update({k: fname for k in ts})
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    info = wl.json("inspect", "--json", index)
    assert len(info["files"]) == 2
    by_name = {t["name"]: t for t in info["tensors"]}
    assert set(by_name) == {"a", "b", "c"}
    for fname, ts in shards.items():
        data = (tmp_path / fname).read_bytes()
        for name, t in ts.items():
            mine = by_name[name]
            assert info["files"][mine["file"]]["path"].endswith(fname)
            assert data[mine["offset"]:mine["offset"] + mine["nbytes"]] == tensor_bytes(t)


def flatten(v):
    if isinstance(v, list):
        return [x for item in v for x in flatten(item)]
    return [v]


def field_value(field, ours):
    """A GGUF metadata field as plain Python. The gguf package flattens nested arrays (its `contents()` walks every
    leaf), so for those compare weightlift's nested value flattened; the nesting itself is checked by the Rust
    round-trip tests."""
    nested = sum(1 for t in field.types if t == gguf.GGUFValueType.ARRAY) > 1
    return field.contents(), (flatten(ours) if nested else ours)


def check_gguf_agree(wl, path: Path) -> dict:
    info = wl.json("inspect", "--json", "--all-metadata", path)
    reader = gguf.GGUFReader(str(path))
    data = path.read_bytes()
    ours = {t["name"]: t for t in info["tensors"]}
    assert {t.name for t in reader.tensors} == set(ours)
    for t in reader.tensors:
        mine = ours[t.name]
        assert mine["dtype"] == t.tensor_type.name, t.name
        assert mine["shape"] == [int(d) for d in reversed(t.shape)], t.name
        assert mine["offset"] == t.data_offset, t.name
        assert mine["nbytes"] == t.n_bytes, t.name
        assert data[mine["offset"]:mine["offset"] + mine["nbytes"]] == t.data.tobytes(), t.name
    meta = info["files"][0]["metadata"]
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        want, got = field_value(field, meta[key])
        if isinstance(want, float):
            assert got == pytest.approx(want), key
        elif isinstance(want, list) and want and isinstance(want[0], float):
            assert got == pytest.approx(want), key
        else:
            assert got == want, key
    assert set(meta) == {k for k in reader.fields if not k.startswith("GGUF.")}
    return info


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("align", [None, 4096])
def test_generated_gguf_read_by_gguf(wl, tmp_path, layout, align):
    path = tmp_path / f"{layout}.gguf"
    args = ["generate", path, "--size", "6MiB", "--layout", layout, "--format", "gguf", "--seed", "5"]
    if align:
        args += ["--align", str(align)]
    wl.run(*args)
    info = check_gguf_agree(wl, path)
    assert info["format"] == "gguf"


# ggml-common.h today has `static_assert(sizeof(block_q8_1) == 2*sizeof(ggml_half) + QK8_1)` (36 bytes); the gguf
# package still lists the older float-scaled layout (40 bytes). Q8_1 never appears in model files (it is an
# intermediate of ggml's dot products), so weightlift follows ggml.
GGUF_PY_STALE = {"Q8_1"}


def test_every_ggml_type_sized_like_gguf(wl, tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "all.gguf"), "llama")
    rng = np.random.default_rng(0)
    expected = {}
    for qtype, (block, type_size) in gguf.GGML_QUANT_SIZES.items():
        if qtype.name in GGUF_PY_STALE:
            continue
        rows, blocks = 3, 2
        raw = rng.integers(1, 255, size=(rows, blocks * type_size), dtype=np.uint8)
        writer.add_tensor(f"t_{qtype.name}", raw, raw_shape=(rows, blocks * type_size), raw_dtype=qtype)
        expected[f"t_{qtype.name}"] = (qtype.name, [rows, blocks * block], rows * blocks * type_size)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    info = check_gguf_agree(wl, tmp_path / "all.gguf")
    got = {t["name"]: (t["dtype"], t["shape"], t["nbytes"]) for t in info["tensors"]}
    assert got == expected


def test_files_written_by_gguf_read_identically(wl, tmp_path):
    path = tmp_path / "w.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("upstream")
    writer.add_uint32("answer", 42)
    writer.add_array("words", ["a", "bc", "def"])
    writer.add_array("nums", [1.5, -2.0])
    writer.add_bool("flag", True)
    rng = np.random.default_rng(1)
    writer.add_tensor("w32", rng.standard_normal((4, 8)).astype(np.float32))
    writer.add_tensor("w16", rng.standard_normal((16,)).astype(np.float16))
    writer.add_tensor("i8", rng.integers(-5, 5, size=(3, 3), dtype=np.int8))
    q = rng.integers(1, 255, size=(2, 34 * 2), dtype=np.uint8)
    writer.add_tensor("q8", q, raw_shape=(2, 68), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    info = check_gguf_agree(wl, path)
    assert info["files"][0]["gguf_version"] == 3
    shapes = {t["name"]: t["shape"] for t in info["tensors"]}
    assert shapes["q8"] == [2, 64]
    assert shapes["w32"] == [4, 8]
