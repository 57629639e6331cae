"""The layer streamer and reads by LBA from Python.

LayerStreamer: every layer handed back equal, byte for byte, to what the `safetensors` package reads, in sequential
passes and random order, with 1–3 slots; stream_model runs tiny transformers models (Llama, GPT-2, Qwen2) layer by
layer with logits bit-equal to the whole model's. weightlift.nvme: reads by LBA into host tensors, numpy arrays and
integer addresses against a file and (where losetup works) a real loop block device, named regions, and the errors
of each. GPU variants run on cuda:0 where a GPU is usable, with the reason printed otherwise."""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
weightlift = pytest.importorskip("weightlift")
st_torch = pytest.importorskip("safetensors.torch")

from weightlift import nvme  # noqa: E402

GPU = torch.cuda.is_available() and weightlift.cuda_available()
DEVICES = ["cpu"] + (["cuda:0"] if GPU else [])
if not GPU:
    print("layer/nvme GPU cases skipped: no usable CUDA device:", weightlift.probe()["cuda"])


def raw(t: "torch.Tensor") -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.fixture(scope="module")
def decoder(tmp_path_factory) -> Path:
    """A decoder-shaped checkpoint written by the safetensors package: 6 layers of mixed dtypes plus embeddings."""
    g = torch.Generator().manual_seed(3)
    tensors = {"model.embed_tokens.weight": torch.randn(64, 32, generator=g).to(torch.bfloat16)}
    for i in range(6):
        p = f"model.layers.{i}."
        tensors[p + "self_attn.q_proj.weight"] = torch.randn(32, 32, generator=g).to(torch.bfloat16)
        tensors[p + "mlp.up_proj.weight"] = torch.randn(48 + i, 32, generator=g)
        tensors[p + "input_layernorm.weight"] = torch.randn(32, generator=g).to(torch.float16)
        tensors[p + "step"] = torch.randint(0, 1000, (3,), generator=g)
    tensors["lm_head.weight"] = torch.randn(64, 32, generator=g).to(torch.bfloat16)
    path = tmp_path_factory.mktemp("layers") / "decoder.safetensors"
    st_torch.save_file(tensors, str(path))
    return path


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("slots", [1, 2, 3])
def test_every_layer_in_any_order(decoder, device, slots):
    ref = st_torch.load_file(str(decoder))
    with weightlift.LayerStreamer(decoder, device=device, slots=slots) as s:
        assert len(s) == 6
        assert s.rest == ["model.embed_tokens.weight", "lm_head.weight"] or sorted(s.rest) == sorted(["model.embed_tokens.weight", "lm_head.weight"])
        rng = random.Random(slots)
        order = list(range(6)) * 2 + [rng.randrange(6) for _ in range(12)]
        for i in order:
            got = s.load_layer(i)
            assert sorted(got) == sorted(k for k in ref if k.startswith(f"model.layers.{i}."))
            for name, t in got.items():
                assert t.dtype == ref[name].dtype and t.shape == ref[name].shape and str(t.device) == device
                assert raw(t) == raw(ref[name]), name
        st = s.stats()
        assert st["requests"] == len(order)
        assert st["loads"] >= 6
        if slots >= 2:
            assert st["ready_hits"] > 0, st


def test_groupings(decoder):
    names = [[f"model.layers.{i}.step"] for i in range(3)]
    with weightlift.LayerStreamer(decoder, names, device="cpu") as s:
        assert len(s) == 3
        assert list(s.load_layer(2)) == ["model.layers.2.step"]
    with weightlift.LayerStreamer(decoder, lambda n: 0 if "norm" in n else None, device="cpu") as s:
        assert len(s) == 1 and len(s.load_layer(0)) == 6
    with pytest.raises(weightlift.InvalidArgumentError, match="does not hold"):
        weightlift.LayerStreamer(decoder, [["nope"]], device="cpu")
    with pytest.raises(weightlift.InvalidArgumentError, match="one layer"):
        weightlift.LayerStreamer(decoder, [["lm_head.weight"], ["lm_head.weight"]], device="cpu")
    with pytest.raises(weightlift.InvalidArgumentError, match="at least one slot"):
        weightlift.LayerStreamer(decoder, device="cpu", slots=0)
    with weightlift.LayerStreamer(decoder, device="cpu") as s:
        with pytest.raises(weightlift.InvalidArgumentError, match="layer 6"):
            s.load_layer(6)


def test_views_outlive_the_streamer(decoder):
    """A view taken from a slot keeps its memory alive after close (the bytes are the last layer's)."""
    s = weightlift.LayerStreamer(decoder, device="cpu", slots=1)
    t = s.load_layer(4)["model.layers.4.step"]
    s.close()
    del s
    assert raw(t) == raw(st_torch.load_file(str(decoder))["model.layers.4.step"])


transformers = None


def _tiny_models():
    global transformers
    transformers = pytest.importorskip("transformers")
    T = transformers
    small = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, max_position_embeddings=64)
    return {
        "llama": (T.LlamaConfig(vocab_size=96, num_key_value_heads=2, tie_word_embeddings=False, **small), T.LlamaForCausalLM),
        "qwen2": (T.Qwen2Config(vocab_size=96, num_key_value_heads=2, tie_word_embeddings=True, **small), T.Qwen2ForCausalLM),
        "gpt2": (T.GPT2Config(vocab_size=96, n_embd=64, n_layer=4, n_head=4, n_positions=64), T.GPT2LMHeadModel),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_stream_model_equals_the_whole_model(tmp_path, arch, device):
    config, cls = _tiny_models()[arch]
    torch.manual_seed(0)
    model = cls(config)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    dtype = torch.float32 if arch == "gpt2" else torch.bfloat16
    model = model.to(dtype)
    model.save_pretrained(tmp_path / arch)
    ids = torch.randint(0, 96, (2, 10), generator=g)
    whole = cls.from_pretrained(tmp_path / arch).to(device).eval()
    with torch.no_grad():
        want = whole(input_ids=ids.to(device)).logits
    del whole
    streamed = cls.from_pretrained(tmp_path / arch).eval()
    handle = weightlift.stream_model(streamed, tmp_path / arch / "model.safetensors", device=device, slots=2)
    # The layers' own weights left the model: only the slots hold them.
    assert all(p.device.type == "meta" for n, p in streamed.named_parameters() if f"{handle.prefix}." in n)
    with torch.no_grad():
        for _ in range(2):  # twice: the second pass reuses the slots
            got = streamed(input_ids=ids.to(device)).logits
            assert raw(got) == raw(want)
    assert got.abs().sum() > 0
    st = handle.stats()
    assert st["requests"] == 2 * config.num_hidden_layers if hasattr(config, "num_hidden_layers") else st["requests"] == 8
    handle.close()


def test_stream_model_refuses_a_mismatched_model(tmp_path):
    config, cls = _tiny_models()["llama"]
    model = cls(config).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "m")
    other = cls(config)  # float32: no conversion while streaming
    with pytest.raises(weightlift.InvalidArgumentError, match="float32"):
        weightlift.stream_model(other, tmp_path / "m" / "model.safetensors", device="cpu")


# --- weightlift.nvme ---------------------------------------------------------------------------------------------


def pattern(n: int) -> bytes:
    return ((np.arange(n, dtype=np.uint64) * 2654435761) >> 13).astype(np.uint8).tobytes()


@pytest.fixture()
def image(tmp_path) -> tuple[Path, bytes]:
    data = pattern(256 * 4096 + 77)
    path = tmp_path / "disk.img"
    path.write_bytes(data)
    return path, data


def test_lba_reads_from_a_file(image):
    path, data = image
    dev = nvme.NVMeGPU(path)
    assert (dev.block_size, dev.blocks, dev.is_block_device) == (512, (256 * 4096) // 512, False)
    # Into a tensor, a numpy array, and an integer address of host memory.
    t = torch.empty(3 * 512, dtype=torch.uint8)
    assert dev.read(lba=4, count=3, gpu_ptr=t) == 1536
    assert t.numpy().tobytes() == data[4 * 512 : 7 * 512]
    a = np.zeros(1024, dtype=np.uint8)
    dev.read(lba=10, count=2, gpu_ptr=a)
    assert a.tobytes() == data[10 * 512 : 12 * 512]
    b = np.zeros(512, dtype=np.uint8)
    dev.read(1, 1, b.ctypes.data, device="cpu")
    assert b.tobytes() == data[512:1024]
    # The tutorial's shapes: read_to_gpu (here into host memory) and the module-level PyTorch style.
    got = dev.read_to_gpu(lba=8, size_mb=0.5, device="cpu")
    assert got.nbytes == 1 << 19 and got.numpy().tobytes() == data[8 * 512 : 8 * 512 + (1 << 19)]
    nvme.init(path, block_size=4096)
    x = torch.empty(2, 1024, dtype=torch.float32)  # 8 KiB: two blocks
    assert nvme.read_into_tensor(x, lba=3) == 8192
    assert raw(x) == data[3 * 4096 : 5 * 4096]
    nvme.cleanup()
    with pytest.raises(weightlift.InvalidArgumentError, match="init"):
        nvme.read_into_tensor(x, lba=0)


def test_lba_errors(image, tmp_path):
    path, _ = image
    dev = nvme.Device(path, 4096)
    t = torch.empty(4096 * 2, dtype=torch.uint8)
    with pytest.raises(weightlift.InvalidArgumentError, match="LBA 255"):
        dev.read(255, 2, t)
    with pytest.raises(weightlift.InvalidArgumentError, match="holds 4096 bytes"):
        dev.read(0, 2, torch.empty(4096, dtype=torch.uint8))
    with pytest.raises(weightlift.InvalidArgumentError, match="whole number"):
        dev.read_into_tensor(torch.empty(100, dtype=torch.uint8), 0)
    with pytest.raises(weightlift.InvalidArgumentError, match="power of two"):
        nvme.Device(path, 1000)
    with pytest.raises(weightlift.InvalidArgumentError, match="contiguous"):
        dev.read(0, 1, torch.empty(4096, 2, dtype=torch.uint8).t())
    with pytest.raises(FileNotFoundError):
        nvme.Device(tmp_path / "missing.img")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(weightlift.NotARegularFileError):
        nvme.Device(fifo)


def test_regions(image):
    path, data = image
    regions = nvme.Device(path, 4096).regions()
    regions["weights"] = (0, 200)
    regions["kv_cache"] = (200, 56)
    assert dict(regions) == {"kv_cache": (200, 56), "weights": (0, 200)}
    out = torch.empty(3 * 4096, dtype=torch.uint8)
    assert regions.read("kv_cache", 10, 3, out) == 3 * 4096
    assert out.numpy().tobytes() == data[210 * 4096 : 213 * 4096]
    regions.read_into_tensor("weights", out, index=1)
    assert out.numpy().tobytes() == data[4096 : 4 * 4096]
    with pytest.raises(weightlift.InvalidArgumentError, match="kv_cache"):
        regions.read("kv_cache", 54, 3, out)
    with pytest.raises(weightlift.InvalidArgumentError, match="optimizer"):
        regions.read("optimizer", 0, 1, out)
    with pytest.raises(weightlift.InvalidArgumentError, match="LBA 250"):
        regions["past"] = (250, 10)
    del regions["weights"]
    assert list(regions) == ["kv_cache"]
    with pytest.raises(KeyError):
        del regions["weights"]


def test_lba_reads_from_a_loop_block_device(tmp_path):
    data = pattern(2 << 20)
    img = tmp_path / "loop.img"
    img.write_bytes(data)
    try:
        out = subprocess.run(["losetup", "--find", "--show", "--sector-size", "4096", str(img)], capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no losetup")
    if out.returncode != 0:
        pytest.skip(f"losetup failed: {out.stderr.strip()}")
    loop = out.stdout.strip()
    try:
        dev = nvme.Device(loop)
        assert dev.is_block_device and dev.block_size == 4096 and dev.blocks == (2 << 20) // 4096
        t = torch.empty(5 * 4096, dtype=torch.uint8)
        dev.read(7, 5, t)
        assert t.numpy().tobytes() == data[7 * 4096 : 12 * 4096]
        with pytest.raises(weightlift.InvalidArgumentError, match="multiple"):
            nvme.Device(loop, 512)
    finally:
        subprocess.run(["losetup", "-d", loop], check=False)


@pytest.mark.skipif(not GPU, reason="needs a CUDA device")
def test_lba_reads_into_gpu_memory(image):
    path, data = image
    dev = nvme.Device(path, 4096)
    t = torch.empty(4 * 4096, dtype=torch.uint8, device="cuda:0")
    dev.read(lba=2, count=4, gpu_ptr=t)
    assert t.cpu().numpy().tobytes() == data[2 * 4096 : 6 * 4096]
    # An integer device address (what a pycuda allocation gives with int()).
    u = torch.zeros(2 * 4096, dtype=torch.uint8, device="cuda:0")
    dev.read(9, 2, u.data_ptr())
    assert u.cpu().numpy().tobytes() == data[9 * 4096 : 11 * 4096]
    got = dev.read_to_gpu(lba=0, size_mb=0.25)
    assert got.is_cuda and got.cpu().numpy().tobytes() == data[: 1 << 18]


def test_layer_streamer_refuses_a_packed_checkpoint(tmp_path, wl):
    """A pack's tensors are not at the offsets its index gives: reading them by offset would hand out compressed
    bytes as weights, so the layer streamer refuses it."""
    src = tmp_path / "m.safetensors"
    wl.run("generate", src, "--size", "2MiB")
    wl.run("pack", src, tmp_path / "m.wlpack")
    with pytest.raises(weightlift.InvalidArgumentError, match="packed checkpoint"):
        weightlift.LayerStreamer(tmp_path / "m.wlpack", device="cpu")
