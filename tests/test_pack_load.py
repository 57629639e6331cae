"""Packed checkpoints (`weightlift pack`) through every Python front: `load_file`, `safe_open` (`get_tensor` in any
order, `get_slice`), `load_into`; every tensor equal in dtype, shape and bytes to what the `safetensors` package
reads from the original file written by `safetensors.torch.save_file`. A damaged pack raises ChecksumError or
FormatError naming what is wrong. On cuda:0 both decoders run (the GPU's where NVRTC loads, and nvCOMP for its
codecs)."""

from __future__ import annotations

import json
import random

import pytest

torch = pytest.importorskip("torch")
weightlift = pytest.importorskip("weightlift")
st = pytest.importorskip("safetensors.torch")

GPU = torch.cuda.is_available() and weightlift.cuda_available()
DEVICES = ["cpu"] + (["cuda:0"] if GPU else [])


def raw_bytes(t: "torch.Tensor") -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same(got: dict, ref: dict, device: str) -> None:
    assert list(got) == list(ref) or set(got) == set(ref)
    for k, r in ref.items():
        g = got[k]
        assert (g.dtype, tuple(g.shape)) == (r.dtype, tuple(r.shape)), k
        assert g.device == torch.device(device), k
        assert raw_bytes(g) == raw_bytes(r), k


@pytest.fixture(scope="module")
def packed(tmp_path_factory, wl):
    d = tmp_path_factory.mktemp("pack")
    g = torch.Generator().manual_seed(3)
    tensors = {
        "embed.weight": (torch.randn(1000, 384, generator=g) * 0.02).to(torch.bfloat16),
        "layers.0.attn.q.weight": (torch.randn(384, 384, generator=g) * 0.02).to(torch.bfloat16),
        "layers.0.norm.weight": torch.ones(384) + torch.randn(384, generator=g) * 0.01,
        "half": torch.randn(77, 3, generator=g).to(torch.float16),
        "f64": torch.randn(5, generator=g).to(torch.float64),
        "ids": torch.randint(-(2**40), 2**40, (123,), generator=g),
        "mask": torch.rand(31, generator=g) > 0.5,
        "u8": torch.randint(0, 255, (100_003,), generator=g, dtype=torch.uint8),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
    }
    src = d / "model.safetensors"
    st.save_file(tensors, str(src), metadata={"format": "pt", "note": "packed"})
    out = {"src": src}
    for codec in ("huffman", "zstd", "lz4", "deflate", "raw"):
        out[codec] = d / f"model.{codec}.wlpack"
        wl.run("pack", src, out[codec], "--codec", codec)
    out["default"] = d / "model.wlpack"
    wl.run("pack", src, out["default"])
    return out


def test_packs_use_huffman_by_default(packed, wl):
    """The default codec is weightlift's Huffman stream (decoded on the GPU by its own kernel); planes that do not
    shrink are stored raw; the default pack is the --codec huffman pack, byte for byte."""
    info = wl.json("inspect", packed["default"], "--json")
    assert set(info["streams"]) <= {"huffman", "raw"} and info["streams"].get("huffman", 0) > 0, info["streams"]
    assert packed["default"].read_bytes() == packed["huffman"].read_bytes()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("codec", ["huffman", "zstd", "lz4", "deflate", "raw"])
def test_load_file_of_a_pack_equals_the_original(packed, device, codec):
    ref = st.load_file(str(packed["src"]), device=device)
    got = weightlift.load_file(packed[codec], device)
    assert_same(got, ref, device)
    report = weightlift.last_report()
    assert report["pack"]["raw_bytes"] == sum(t.numel() * t.element_size() for t in ref.values())
    if device == "cpu":
        assert report["pack"]["decoder"] == "cpu"
    if codec in ("zstd", "huffman"):
        assert report["pack"]["stored_bytes"] < report["pack"]["raw_bytes"]
    # verify=True: a pack's chunks are all checked as they decode.
    assert_same(weightlift.load_file(packed[codec], device, verify=True), ref, device)


@pytest.mark.parametrize("device", DEVICES)
def test_safe_open_of_a_pack_in_random_order_and_slices(packed, device):
    ref = st.load_file(str(packed["src"]), device=device)
    from weightlift.safetensors import safe_open

    with safe_open(packed["zstd"], framework="pt", device=device) as f:
        keys = list(f.keys())
        assert sorted(keys) == sorted(ref)
        assert f.metadata() == {"format": "pt", "note": "packed"}
        random.Random(1).shuffle(keys)
        got = {k: f.get_tensor(k) for k in keys}
        # Asked again after it was taken: read again, same bytes.
        assert raw_bytes(f.get_tensor(keys[0])) == raw_bytes(ref[keys[0]])
        rows = f.get_slice("embed.weight")[10:20]
        assert raw_bytes(rows) == raw_bytes(ref["embed.weight"][10:20])
        assert rows.device == torch.device(device)
    assert_same(got, ref, device)


@pytest.mark.parametrize("device", DEVICES)
def test_load_into_a_module_from_a_pack(packed, device):
    ref = st.load_file(str(packed["src"]), device=device)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(1000, 384, dtype=torch.bfloat16)

    m = M()
    result = weightlift.load_into(m, packed["lz4"], strict=False, device=device)
    assert "embed.weight" not in result.unexpected_keys
    assert raw_bytes(m.embed.weight) == raw_bytes(ref["embed.weight"])


def _first_stream(pack):
    """The first tensor of a pack's header, and the pack offset and length of its first chunk's first stream (read
    from the layout: 32-byte preamble, JSON header, 32-byte chunk records, 32-byte stream records)."""
    data = pack.read_bytes()
    header_len = int.from_bytes(data[8:16], "little")
    header = json.loads(data[32 : 32 + header_len])
    tensor = header["tensors"][0]
    chunks_at = 32 + header_len
    chunk = chunks_at + 32 * tensor["chunks"][0]
    first_stream = int.from_bytes(data[chunk + 24 : chunk + 32], "little")
    rec = chunks_at + 32 * header["chunks"] + 32 * first_stream
    offset, stored = (int.from_bytes(data[rec + 8 * i : rec + 8 * i + 8], "little") for i in range(2))
    return tensor["name"], offset, stored


@pytest.mark.parametrize("device", DEVICES)
def test_a_damaged_pack_names_tensor_and_chunk(packed, tmp_path, device):
    # In the raw pack a flipped byte still decodes: only the chunk's checksum can tell.
    name, offset, stored = _first_stream(packed["raw"])
    data = bytearray(packed["raw"].read_bytes())
    data[offset + stored // 2] ^= 0x10
    bad = tmp_path / "bad.wlpack"
    bad.write_bytes(bytes(data))
    with pytest.raises(weightlift.ChecksumError, match="chunk 0") as e:
        weightlift.load_file(bad, device)
    assert name in str(e.value) and "bad.wlpack" in str(e.value)
    # In a compressed pack the damaged stream may fail to decode instead: FormatError or ChecksumError, naming the
    # tensor.
    for codec in ("zstd", "huffman"):
        name, offset, stored = _first_stream(packed[codec])
        for at in (offset + stored // 2, offset):  # the middle of the stream; a Huffman stream's header
            data = bytearray(packed[codec].read_bytes())
            data[at] ^= 0x10
            bad.write_bytes(bytes(data))
            with pytest.raises((weightlift.ChecksumError, weightlift.FormatError), match="chunk 0") as e:
                weightlift.load_file(bad, device)
            assert name in str(e.value)
    cut = tmp_path / "cut.wlpack"
    cut.write_bytes(packed["zstd"].read_bytes()[:-7])
    with pytest.raises(weightlift.FormatError, match="cut.wlpack"):
        weightlift.load_file(cut, device)
    # The engine goes on loading good packs.
    assert_same(weightlift.load_file(packed["zstd"], device), st.load_file(str(packed["src"]), device=device), device)


@pytest.mark.skipif(not GPU, reason="needs a GPU")
@pytest.mark.parametrize("codec", ["huffman", "zstd"])
def test_both_decoders_agree_on_the_gpu(packed, wl, codec):
    ref = st.load_file(str(packed["src"]), device="cuda:0")
    got = weightlift.load_file(packed[codec], "cuda:0")
    assert_same(got, ref, "cuda:0")
    report = weightlift.last_report()["pack"]
    decoder = report["decoder"]
    if codec == "huffman" and decoder == "gpu":
        # weightlift's own kernel: nvCOMP is not needed (where NVRTC is missing, the CPU decodes it, saying so).
        assert "no nvCOMP codec" in report["decoder_reason"], report
    cpu = wl.json("load", packed[codec], "--device", "cuda:0", "--decoder", "cpu", "--json", "--no-ceiling")
    assert cpu["pack"]["decoder"] == "cpu"
    auto = wl.json("load", packed[codec], "--device", "cuda:0", "--json", "--no-ceiling")
    assert auto["pack"]["decoder"] == decoder, auto["pack"]


def test_a_packed_stream_taken_from_several_threads(packed):
    """Four threads take from one packed stream at once: one decodes, the others wait for it; every tensor right,
    each handed out once."""
    from concurrent.futures import ThreadPoolExecutor

    from weightlift import _core, _native

    ref = st.load_file(str(packed["src"]))
    ckpt = _native.Checkpoint([str(packed["lz4"])])
    stream = ckpt.stream(_core.shared_engine(), "cpu")
    infos = {i.name: i for i in ckpt.tensors}
    with ThreadPoolExecutor(4) as ex:
        got = dict(zip(infos, ex.map(lambda k: _core.info_tensor(stream.take(k), infos[k]), infos)))
    assert_same(got, ref, "cpu")
    with pytest.raises(weightlift.WeightliftError, match="already taken"):
        stream.take(next(iter(infos)))
    stream.close()
    assert not stream.open
