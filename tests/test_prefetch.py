"""safetensors 0.9's ``safe_open(...).prefetch(plan, device=, threads=)`` and ``get_tensor_meta``, as weightlift offers
them: code written against upstream runs unchanged. Checkpoints written by ``safetensors.torch.save_file``.

Without a GPU: every refusal upstream makes before it touches CUDA (a cpu device, numpy, each malformed plan entry,
F6, an empty plan, arguments of the wrong type), with upstream's message, compared side by side with upstream where
safetensors >= 0.9 is installed. With a GPU: what a loader hands out (whole tensors and row slices, equal to
upstream's own read of the file), once each, by take or iteration, and what close and several loaders do."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import load_file as upstream_load, save_file

import weightlift
from weightlift import PrefetchLoader, TensorMeta, safe_open

try:
    from safetensors import PrefetchLoader as _UpstreamLoader  # noqa: F401 - present from safetensors 0.9 on
    from safetensors import safe_open as upstream_open

    UPSTREAM = True
except ImportError:
    UPSTREAM = False

needs_cuda = pytest.mark.skipif(not weightlift.cuda_available(), reason="no usable CUDA GPU here")


@pytest.fixture
def ckpt(tmp_path):
    g = torch.Generator().manual_seed(5)
    tensors = {
        "fp32_2d": torch.randn(3, 4, generator=g),
        "bf16_2d": torch.randn(2, 4, generator=g).to(torch.bfloat16),
        "fp16_3d": torch.randn(2, 3, 4, generator=g).to(torch.float16),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 5, dtype=torch.float16),
        "i64": torch.arange(5, dtype=torch.int64),
    }
    path = tmp_path / "p.safetensors"
    save_file(tensors, str(path))
    return path, upstream_load(str(path))


def outcome(call):
    """The exception's class name and message, or "ok"."""
    try:
        call()
        return "ok"
    except Exception as e:  # noqa: BLE001 - compared by name and text
        return (type(e).__mro__[0].__name__, str(e))


# (what is called, the handle's device, upstream's exception class, its message)
REFUSALS = [
    (lambda f: f.prefetch(), "cpu", "SafetensorError", "prefetch loads to cuda devices, not cpu"),
    (lambda f: f.prefetch(device="cpu"), "cuda:0", "SafetensorError", "prefetch loads to cuda devices, not cpu"),
    (lambda f: f.prefetch({"nope": None}), "cuda:0", "SafetensorError", "File does not contain tensor nope"),
    (lambda f: f.prefetch({1: None}), "cuda:0", "SafetensorError", "prefetch plan keys must be tensor names"),
    (lambda f: f.prefetch({"fp32_2d": 3}), "cuda:0", "SafetensorError",
     "prefetch plan values must be None or a slice, got <class 'int'> for fp32_2d"),
    (lambda f: f.prefetch({"fp32_2d": slice(0, 3, 2)}), "cuda:0", "SafetensorError",
     "prefetch plan slices must have step 1, got 2 for fp32_2d"),
    (lambda f: f.prefetch({"fp32_2d": slice(0, 3, 0)}), "cuda:0", "SafetensorError",
     "invalid prefetch plan slice for fp32_2d: ValueError: slice step cannot be zero"),
    (lambda f: f.prefetch({"fp32_2d": slice(0.0, 2)}), "cuda:0", "SafetensorError",
     "prefetch plan slice bounds for fp32_2d must be integers or None"),
    (lambda f: f.prefetch({"fp32_2d": slice(0, 10)}), "cuda:0", "SafetensorError",
     "prefetch plan slice stop 10 for fp32_2d is out of range for 3 rows"),
    (lambda f: f.prefetch({"fp32_2d": slice(-4, None)}), "cuda:0", "SafetensorError",
     "prefetch plan slice start -4 for fp32_2d is out of range for 3 rows"),
    (lambda f: f.prefetch({"scalar": slice(0, 1)}), "cuda:0", "SafetensorError",
     "cannot slice rows of the 0-d tensor scalar"),
    (lambda f: f.prefetch({}), "cuda:0", "SafetensorError", "prefetch plan selects no tensors"),
    (lambda f: f.prefetch([1]), "cuda:0", "TypeError", "'list' object is not an instance of 'dict'"),
    (lambda f: f.prefetch(threads=-1), "cuda:0", "OverflowError", "can't convert negative int to unsigned"),
    (lambda f: f.prefetch(threads="8"), "cuda:0", "TypeError", "'str' object cannot be interpreted as an integer"),
    (lambda f: f.prefetch(device="cuda:x"), "cuda:0", "ValueError", "invalid digit found in string"),
    (lambda f: f.prefetch(device="gpu"), "cuda:0", "SafetensorError", "device gpu is invalid"),
    (lambda f: f.get_tensor_meta("nope"), "cpu", "SafetensorError", "File does not contain tensor nope"),
]


@pytest.mark.parametrize("case", range(len(REFUSALS)))
def test_refusals_match_upstream(ckpt, case):
    call, device, cls, message = REFUSALS[case]
    path, _ = ckpt
    with safe_open(str(path), framework="pt", device=device) as f:
        got = outcome(lambda: call(f))
    assert got != "ok" and got[1] == message, got
    if cls == "SafetensorError":
        # weightlift's own class, which is also a SafetensorError where safetensors is installed.
        from safetensors import SafetensorError

        with safe_open(str(path), framework="pt", device=device) as f:
            with pytest.raises(SafetensorError):
                call(f)
    else:
        assert got[0] == cls, got
    if UPSTREAM:
        with upstream_open(str(path), framework="pt", device=device) as u:
            want = outcome(lambda: call(u))
        assert want == (cls, message), f"upstream changed: {want}"


def test_numpy_and_f6_are_refused(tmp_path, ckpt):
    path, _ = ckpt
    with safe_open(str(path), framework="np") as f:
        assert outcome(lambda: f.prefetch(device="cuda:0"))[1] == 'prefetch is only compatible with framework="pt"'
    # A header naming an F6 tensor (torch has no such dtype), written by hand as upstream's own test does.
    header = json.dumps({"x": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [0, 3]}}).encode()
    header += b" " * (-len(header) % 8)
    f6 = tmp_path / "f6.safetensors"
    f6.write_bytes(struct.pack("<Q", len(header)) + header + b"\x01\x02\x03")
    for opener in [safe_open] + ([upstream_open] if UPSTREAM else []):
        with opener(str(f6), framework="pt", device="cuda:0") as f:
            got = outcome(lambda: f.prefetch())
        assert got[1] == "prefetch cannot hand out dtype F6_E2M3: torch has no matching dtype", (opener, got)


def test_tensor_meta_is_the_header_entry(ckpt):
    path, _ = ckpt
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    with safe_open(str(path), framework="pt") as f:
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            meta = f.get_tensor_meta(name)
            assert isinstance(meta, TensorMeta)
            assert (meta.dtype, meta.shape, meta.data_offsets) == (entry["dtype"], entry["shape"], tuple(entry["data_offsets"]))
            with pytest.raises(AttributeError):
                meta.dtype = "F16"
        if UPSTREAM:
            with upstream_open(str(path), framework="pt") as u:
                for name in f.keys():
                    assert repr(f.get_tensor_meta(name)) == repr(u.get_tensor_meta(name)), name


@needs_cuda
def test_a_loader_hands_out_each_planned_tensor_once(ckpt):
    path, want = ckpt
    plan = {"fp32_2d": slice(1, 3), "i64": slice(2, 5), "fp16_3d": None, "empty": None, "scalar": None}
    with safe_open(str(path), framework="pt") as f:
        loader = f.prefetch(plan, device="cuda:0", threads=2)
        assert isinstance(loader, PrefetchLoader)
        assert loader.names() == [n for n in f.offset_keys() if n in plan] and len(loader) == len(plan)
        got = loader.take("fp32_2d")
        assert got.device.type == "cuda" and torch.equal(got.cpu(), want["fp32_2d"][1:3])
        with pytest.raises(weightlift.WeightliftError, match="fp32_2d: tensor already delivered"):
            loader.take("fp32_2d")
        with pytest.raises(weightlift.WeightliftError, match="tensor bf16_2d is not in the prefetch plan"):
            loader.take("bf16_2d")
        rest = dict(loader)
        assert sorted(rest) == sorted(set(plan) - {"fp32_2d"})
        assert torch.equal(rest["i64"].cpu(), want["i64"][2:5])
        for k in ("fp16_3d", "empty", "scalar"):
            assert rest[k].dtype == want[k].dtype and torch.equal(rest[k].cpu(), want[k]), k
        assert dict(loader) == {}, "each tensor is handed out once"
        loader.close()
        # The handle keeps working beside (and after) its loaders.
        assert torch.equal(f.get_tensor("bf16_2d").cpu(), want["bf16_2d"])


@needs_cuda
def test_close_and_several_loaders(ckpt):
    path, want = ckpt
    f = safe_open(str(path), framework="pt", device="cuda:0")
    a, b = f.prefetch(), f.prefetch({"fp32_2d": slice(-3, 3)})
    f.close()  # loaders outlive their handle
    assert torch.equal(b.take("fp32_2d").cpu(), want["fp32_2d"])
    with a:
        x = a.take("i64")
    with pytest.raises(weightlift.WeightliftError, match="fp32_2d: prefetch loader closed"):
        a.take("fp32_2d")
    assert torch.equal(x.cpu(), want["i64"]), "tensors handed out keep their memory after close"
    it = iter(b)
    b.close()
    with pytest.raises(weightlift.WeightliftError, match="prefetch loader closed"):
        next(it)


@needs_cuda
@pytest.mark.skipif(not hasattr(torch, "float4_e2m1fn_x2"), reason="this torch has no float4_e2m1fn_x2")
def test_f4_rows(tmp_path):
    # F4 [4, 8]: 4 bytes a row, torch holds it as float4_e2m1fn_x2 [4, 4].
    raw = bytes(range(16))
    header = json.dumps({"f4": {"dtype": "F4", "shape": [4, 8], "data_offsets": [0, 16]}}).encode()
    header += b" " * (-len(header) % 8)
    path = tmp_path / "f4.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + raw)
    with safe_open(str(path), framework="pt") as f, f.prefetch({"f4": slice(1, 3)}, device="cuda:0") as loader:
        t = loader.take("f4")
    assert t.dtype == torch.float4_e2m1fn_x2 and tuple(t.shape) == (2, 4)
    assert t.view(torch.uint8).cpu().flatten().tolist() == list(raw[4:12])
