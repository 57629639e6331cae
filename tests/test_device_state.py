"""Every public entry point leaves the caller's CUDA state as it found it: torch's current device (and with it the
thread's current context) stays what the caller chose, whichever device weightlift used. Each case runs in a fresh
process, so that weightlift's first driver call happens inside the entry point under test (the case the leak of
``probe()`` came from: torch's runtime had made device 0 current before weightlift started the driver). Needs two
GPUs; skips with the reason elsewhere."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
    pytest.skip("needs two CUDA devices (torch sees "
                f"{torch.cuda.device_count() if torch.cuda.is_available() else 0})", allow_module_level=True)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(7)
    path = tmp_path_factory.mktemp("state") / "m.safetensors"
    save_file({f"model.layers.{i}.w": torch.randint(-1000, 1000, (256, 64), generator=g, dtype=torch.int16)
               for i in range(4)}, str(path))
    return path


CASES = {
    "probe": "weightlift.probe()",
    "probe a path": "weightlift.probe(PATH)",
    "load_file to cuda:1": "check(weightlift.load_file(PATH, device='cuda:1'))",
    "load_file to cuda:0": "check(weightlift.load_file(PATH, device='cuda:0'))",
    "safe_open on cuda:1": "with weightlift.safe_open(PATH, framework='pt', device='cuda:1') as f:\n"
                           "    check({k: f.get_tensor(k) for k in f.keys()})",
    "prepare cuda:1": "weightlift.prepare('cuda:1')",
    "prepare cuda:1 with its kernels": "weightlift.prepare('cuda:1', kernels=True)",
    "release_memory after a load": "check(weightlift.load_file(PATH, device='cuda:1')); weightlift.release_memory()",
    "Loader on cuda:1": "weightlift.Loader(device='cuda:1').load_tensor(PATH, 1024, torch.int16)",
    "layer streamer on cuda:1": "s = weightlift.LayerStreamer(PATH, device='cuda:1')\n"
                                "for i in range(len(s)):\n    s.load_layer(i)\ns.close()",
    "gds File into cuda:1": "x = torch.empty(4096, dtype=torch.uint8, device='cuda:1')\n"
                            "weightlift.File(PATH, 'r').load_storage(x.untyped_storage(), 0)",
    "cufile Session on cuda:1": "x = torch.empty(4096, dtype=torch.uint8, device='cuda:1')\n"
                                "with weightlift.cufile.Session() as s:\n"
                                "    s.register_buffer(x); fh = s.register_handle(PATH, 'r'); s.read(fh, x, 4096, 0, 0)",
    "dstorage_gpu on cuda:1": "from weightlift.dstorage_gpu import DirectStorageLoader\n"
                              "DirectStorageLoader(device='cuda:1').load_tensor(PATH, 1024, torch.int16)",
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("chosen", [0, 1])
def test_the_callers_device_is_left_as_found(ckpt: Path, case: str, chosen: int) -> None:
    body = CASES[case].replace("PATH", repr(str(ckpt)))
    program = textwrap.dedent(f"""
        import torch, weightlift
        from safetensors.torch import load_file as reference
        ref = reference({str(ckpt)!r})
        def check(loaded):
            for k, v in ref.items():
                assert torch.equal(loaded[k].cpu(), v), k
        torch.cuda.set_device({chosen})
        torch.zeros(1, device="cuda")
        """) + body + textwrap.dedent(f"""
        torch.cuda.synchronize()
        now = torch.cuda.current_device()
        assert now == {chosen}, f"current device {{now}} after the call, {chosen} before"
        torch.zeros(1, device="cuda")  # the runtime still works on the caller's device
        assert torch.cuda.current_device() == {chosen}
        print("ok")
        """)
    p = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "ok" in p.stdout, f"{case}, device {chosen}: {p.stderr[-1500:]}"


def test_prepare_on_a_fresh_thread_makes_no_context_on_another_gpu(ckpt: Path) -> None:
    """``weightlift.prepare("cuda:1")`` on a thread of its own (as docs/distributed.md shows for a rank at start-up),
    in a process that works on device 1 only: a fresh thread's current device is 0, and setting it back there after
    making the loads' side stream would create device 0's primary context, memory on a GPU the rank never uses."""
    program = textwrap.dedent(f"""
        import ctypes, threading, torch, weightlift
        from safetensors.torch import load_file as reference
        cuda = ctypes.CDLL("libcuda.so.1")
        assert cuda.cuInit(0) == 0
        def active(ordinal):
            dev, flags, state = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
            assert cuda.cuDeviceGet(ctypes.byref(dev), ordinal) == 0
            assert cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(state)) == 0
            return bool(state.value)
        torch.cuda.set_device(1)
        torch.zeros(1, device="cuda:1")
        assert not active(0), "device 0 had a context before the call"
        errors = []
        def run():
            try:
                weightlift.prepare("cuda:1")
            except Exception as e:
                errors.append(e)
        t = threading.Thread(target=run)
        t.start(); t.join()
        assert not errors, errors
        loaded = weightlift.load_file({str(ckpt)!r}, device="cuda:1")
        for k, v in reference({str(ckpt)!r}).items():
            assert torch.equal(loaded[k].cpu(), v), k
        assert not active(0), "prepare('cuda:1') on a fresh thread made a context on device 0"
        assert torch.cuda.current_device() == 1
        print("ok")
        """)
    p = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr[-1500:]
