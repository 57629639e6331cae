"""The Python package against the packages it replaces: every tensor equal in dtype, shape and bytes to what
`safetensors` (and `gguf`) give, on the CPU and, where a GPU is usable, on cuda:0."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
weightlift = pytest.importorskip("weightlift")
st = pytest.importorskip("safetensors.torch")
gguf = pytest.importorskip("gguf")

GPU = torch.cuda.is_available() and weightlift.cuda_available()
DEVICES = ["cpu"] + (["cuda:0"] if GPU else [])
if not GPU:
    print("GPU cases skipped: torch.cuda.is_available() =", torch.cuda.is_available(), "/ weightlift:", weightlift.probe()["cuda"])


def raw_bytes(t: "torch.Tensor") -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same(got: dict, ref: dict, device: str) -> None:
    assert set(got) == set(ref)
    for k, r in ref.items():
        g = got[k]
        assert g.dtype == r.dtype, k
        assert tuple(g.shape) == tuple(r.shape), k
        assert g.device == torch.device(device), k
        assert raw_bytes(g) == raw_bytes(r), k


@pytest.fixture(scope="module")
def files(tmp_path_factory, wl):
    d = tmp_path_factory.mktemp("ckpt")
    out = {}
    wl.run("generate", d / "small.safetensors", "--layout", "many-small", "--tensors", "300", "--seed", "4")
    wl.run("generate", d / "llama.safetensors", "--layout", "llama", "--size", "24MiB", "--seed", "5")
    wl.run("generate", d / "aligned.safetensors", "--layout", "many-small", "--tensors", "60", "--align", "4096", "--seed", "6")
    wl.run("generate", d / "model.gguf", "--layout", "llama", "--size", "12MiB", "--format", "gguf", "--seed", "7")
    wl.run("generate", d / "small.gguf", "--layout", "many-small", "--tensors", "80", "--format", "gguf", "--seed", "8")
    out.update({k: d / f for k, f in [("small", "small.safetensors"), ("llama", "llama.safetensors"), ("aligned", "aligned.safetensors"), ("gguf", "model.gguf"), ("small_gguf", "small.gguf")]})
    g = torch.Generator().manual_seed(0)
    upstream = {
        "f32": torch.randn(3, 5, generator=g),
        "bf16": torch.randn(7, 3, generator=g).to(torch.bfloat16),
        "f16": torch.randn(2, 2, 2, generator=g).to(torch.float16),
        "f64": torch.randn(1, generator=g).to(torch.float64),
        "i64": torch.randint(-9, 9, (4,), generator=g),
        "i8": torch.randint(-9, 9, (6,), generator=g, dtype=torch.int8),
        "u8": torch.randint(0, 255, (9,), generator=g, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "f8e4m3": torch.randn(4, generator=g).to(torch.float8_e4m3fn),
        "f8e5m2": torch.randn(4, generator=g).to(torch.float8_e5m2),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
        "odd": torch.randn(3, 1, 7, generator=g),
    }
    out["upstream"] = d / "upstream.safetensors"
    st.save_file(upstream, str(out["upstream"]), metadata={"format": "pt", "origin": "test"})
    shards = {"model-00001-of-00002.safetensors": {"a": torch.randn(4, 4, generator=g)}, "model-00002-of-00002.safetensors": {"b": torch.randn(8, generator=g).to(torch.bfloat16), "c": torch.arange(5)}}
    wm = {}
    for fname, ts in shards.items():
        st.save_file(ts, str(d / fname))
        wm.update({k: fname for k in ts})
    out["index"] = d / "model.safetensors.index.json"
    out["index"].write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["small", "llama", "aligned", "upstream"])
def test_load_file_equals_safetensors(files, device, name):
    path = files[name]
    got = weightlift.load_file(path, device=device)
    # Upstream readers also see the padding tensors of 4 KiB-aligned files; weightlift hides them.
    ref = {k: v for k, v in st.load_file(str(path), device=device).items() if not k.startswith("__weightlift_pad_")}
    assert_same(got, ref, device)
    report = weightlift.last_report()
    assert report["bytes"] == sum(t.numel() * t.element_size() for t in ref.values())
    assert report["backend"] in ("uring", "pread")


@pytest.mark.parametrize("device", DEVICES)
def test_release_memory_between_loads(files, device, monkeypatch):
    """release_memory() frees what the engine keeps between loads (with a device cache asked for); loads before and
    after it, and tensors loaded before it, keep every byte."""
    monkeypatch.setenv("WEIGHTLIFT_DEVICE_CACHE_BYTES", "1GiB")
    ref = st.load_file(str(files["llama"]), device=device)
    before = weightlift.load_file(files["llama"], device=device)
    assert weightlift._core.shared_engine().settings()["device_cache_bytes"]["source"] == "environment"
    weightlift.release_memory()
    assert_same(before, ref, device)
    assert_same(weightlift.load_file(files["llama"], device=device), ref, device)
    # The device pool's threshold is the process's: the engine that set it puts it back when it goes, and the
    # shared engine is replaced once the variable is gone (other tests measure free device memory).
    monkeypatch.undo()
    assert weightlift._core.shared_engine().settings()["device_cache_bytes"]["source"] == "default"


@pytest.mark.parametrize("device", DEVICES)
def test_prepare_sets_up_what_the_first_load_would(files, device):
    """prepare() on a fresh engine sets up every lane's staging (pinned for a GPU; for a GPU also a stream per lane
    and one for allocation); asked again it finds everything set up; a load after it sets up no staging, and every
    byte equals safetensors'."""
    engine = weightlift._core.new_engine()
    first = weightlift.prepare(device, engine=engine)
    staging = first["staging"]
    if staging is None:
        pytest.skip(f"{device}'s data path does not read through the lanes: {first['path']}")
    assert staging["lanes"] > 0 and staging["lanes_set_up"] == staging["lanes"], first
    assert staging["pinned"] == device.startswith("cuda"), first
    assert staging["bytes"] == staging["lanes"] * staging["slots_per_lane"] * staging["slot_bytes"] > 0, first
    if device.startswith("cuda"):
        assert first["streams"] == staging["lanes"] + 1 and first["pool_secs"] is not None, first
        host = first["staging_host"]  # faulted in before the device was touched, then pinned in place
        assert host["pinned"] is False and host["lanes"] == staging["lanes"], first
        if engine.device_memory == "torch":  # the default: PyTorch's allocator has the loads' side stream ready
            assert first["torch_secs"] is not None and first["torch_secs"] <= first["seconds"], first
            assert torch.device(device).index in weightlift._core._side_streams, first
        else:
            assert first["torch_secs"] is None, first
    else:
        assert first["staging_host"] is None and first["torch_secs"] is None, first
    again = weightlift.prepare(device, engine=engine)
    assert again["staging"]["lanes_set_up"] == 0, again
    assert first["kernels_secs"] is None, first
    # kernels=True: the decoders' kernels of packed and checked loads too (none for host memory)
    kernels = weightlift.prepare(device, kernels=True, engine=engine)["kernels_secs"]
    assert kernels == 0.0 if device == "cpu" else kernels > 0, kernels
    ref = st.load_file(str(files["llama"]), device=device)
    assert_same(weightlift.load_file(files["llama"], device=device, engine=engine), ref, device)
    times = weightlift.last_report()["times"]
    assert times["staging_setup_thread_secs"] == 0 and times["staging_wait_thread_secs"] == 0, times


@pytest.mark.parametrize("device", DEVICES)
def test_tensors_handed_over_in_their_dtype_and_shape(tmp_path, device):
    """Tensors of the dtypes DLPack has reach torch through one capsule of their own dtype and shape (no byte tensor
    behind them), the others as bytes viewed as their dtype: every dtype, a scalar and an empty tensor equal to
    safetensors'; a capsule whose shape does not take the buffer's bytes is refused."""
    g = torch.Generator().manual_seed(5)
    tensors = {
        "bool": torch.tensor([[True, False], [False, True]]),
        "u8": torch.randint(0, 255, (3, 4), generator=g, dtype=torch.uint8),
        "i8": torch.randint(-100, 100, (5,), generator=g, dtype=torch.int8),
        "i16": torch.randint(-30000, 30000, (2, 3), generator=g, dtype=torch.int16),
        "i32": torch.randint(-(2**31), 2**31 - 1, (7,), generator=g, dtype=torch.int32),
        "i64": torch.randint(-(2**62), 2**62, (2, 2, 2), generator=g, dtype=torch.int64),
        "f16": torch.randn(3, 3, generator=g).to(torch.float16),
        "bf16": torch.randn(4, 1, 5, generator=g).to(torch.bfloat16),
        "f32": torch.randn(6, generator=g),
        "f64": torch.randn(2, 5, generator=g, dtype=torch.float64),
        "u16": torch.randint(0, 60000, (4,), generator=g, dtype=torch.int32).to(torch.uint16),
        "f8": torch.randn(9, generator=g).to(torch.float8_e4m3fn),
        "scalar": torch.tensor(-1.5, dtype=torch.bfloat16),
        "empty": torch.zeros(0, 4, dtype=torch.float16),
    }
    path = tmp_path / "dtypes.safetensors"
    st.save_file(tensors, str(path))
    got = weightlift.load_file(path, device=device)
    assert_same(got, st.load_file(str(path), device=device), device)
    for name, t in got.items():
        typed = name not in ("u16", "f8")  # "empty" is made by torch.empty: no byte tensor behind it either
        assert (t._base is None) == typed, f"{name}: handed over {'typed' if t._base is None else 'as bytes'}"
    ckpt = weightlift.safetensors._checkpoint(path)
    infos = {i.name: i for i in ckpt.tensors}
    buffers = dict(zip([i.name for i in ckpt.tensors], ckpt.load(weightlift._core.shared_engine(), device, None, False)))
    assert buffers["f32"].typed_capsule("F32", [6]) is not None
    assert buffers["f8"].typed_capsule("F8_E4M3", [9]) is None and buffers["u16"].typed_capsule("U16", [4]) is None
    with pytest.raises(weightlift.InvalidArgumentError, match="does not take"):
        buffers["f32"].typed_capsule("F32", [7])
    with pytest.raises(weightlift.InvalidArgumentError, match="does not take"):
        buffers["i64"].typed_capsule("I64", [-1, 8])
    assert infos["scalar"].shape == [] and got["scalar"].shape == ()


def test_log_records_are_dated_when_their_event_happened(tmp_path, caplog):
    """The engine's events reach `logging` when the call returns, each dated when it happened: the plan's record
    is older than the reads that follow it, not the time of the hand-over."""
    import logging

    path = tmp_path / "dated.safetensors"
    g = torch.Generator().manual_seed(11)
    ref = {f"t{i}": torch.randn(1 << 20, generator=g) for i in range(48)}
    st.save_file(ref, str(path))  # 192 MiB
    caplog.set_level(logging.DEBUG, logger="weightlift")
    before = time.time()
    got = weightlift.load_file(path)
    after = time.time()
    report = weightlift.last_report()
    planned = [r for r in caplog.records if r.name == "weightlift" and r.getMessage().startswith("planned")]
    assert planned, [r.getMessage() for r in caplog.records]
    when = planned[-1].created
    assert before <= when <= after
    # Dated at hand-over, the record would be younger than all of the reads (which must take long enough to tell).
    assert report["times"]["io"] >= 0.002, report["times"]
    assert after - when >= 0.5 * report["times"]["io"], (after - when, report["times"])
    assert planned[-1].lineno > 0 and planned[-1].pathname.endswith(".rs"), (planned[-1].pathname, planned[-1].lineno)
    start = logging._startTime / 1e9 if logging._startTime > 1e15 else logging._startTime  # ns from Python 3.13
    assert abs(planned[-1].relativeCreated - (when - start) * 1000) < 1.0
    assert_same(got, ref, "cpu")


def test_process_stream_is_one_stream_per_device_or_a_cuda_error(files):
    """The side stream torch's blocks are made on: one per device for the process, the same handle each time;
    without CUDA, weightlift's CudaError."""
    from weightlift import _core, _native

    if not GPU:
        with pytest.raises(weightlift.CudaError):
            _native.process_stream(0)
        return
    a, b = _native.process_stream(0), _native.process_stream(0)
    assert a == b != 0
    got = weightlift.load_file(files["llama"], device="cuda:0")
    assert_same(got, st.load_file(str(files["llama"])), "cuda:0")
    if weightlift._core.shared_engine().device_memory == "torch":
        assert _core._side_streams[0].cuda_stream == a


def test_a_forked_child_grows_its_own_descriptor_table():
    """A child made by fork gets a descriptor table only as large as the parent's highest open descriptor, however
    large the parent's had grown: its first engine grows the child's own (at once, the child having one thread), so
    that no open inside its loads waits for the kernel to grow it (see weightlift::io::fdtable)."""
    code = (
        "import os, resource, sys, time, weightlift\n"
        "def fd_slots():\n"
        "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('FDSize:'))\n"
        "limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]\n"
        "want = 1024 if limit == resource.RLIM_INFINITY else min(1024, limit)\n"
        "if want <= 64:\n"
        "    print('skip: descriptor limit', want); sys.exit(0)\n"
        "t = time.monotonic()\n"
        "while fd_slots() < want and time.monotonic() - t < 5:\n"
        "    time.sleep(0.005)  # grown at import, on a thread of its own where the process has several\n"
        "print('parent', fd_slots(), flush=True)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    before = fd_slots()\n"
        "    weightlift._core.new_engine()\n"
        "    print('child', before, fd_slots(), want, flush=True)\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
    )
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    if out.stdout.startswith("skip"):
        pytest.skip(out.stdout.strip())
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    parent = int(lines["parent"])
    before, after, want = (int(x) for x in lines["child"].split())
    assert parent >= want, out.stdout
    assert before < want, f"the child inherited a table of {before} slots: nothing to test ({out.stdout})"
    assert after >= want, out.stdout


def test_prepare_refuses_what_it_cannot_set_up():
    with pytest.raises(weightlift.InvalidArgumentError):
        weightlift.prepare("tpu:0")
    if not GPU:
        with pytest.raises(weightlift.CudaError):
            weightlift.prepare("cuda:0")


@pytest.mark.parametrize("device", DEVICES)
def test_sharded_checkpoint(files, device):
    got = weightlift.load_file(files["index"], device=device)
    ref = {}
    for f in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        ref.update(st.load_file(str(files["index"].parent / f), device=device))
    assert_same(got, ref, device)


@pytest.mark.parametrize("device", DEVICES)
def test_safe_open_reads_what_is_asked(files, device):
    path = files["upstream"]
    with weightlift.safe_open(path, framework="pt", device=device) as f, st.safe_open(str(path), framework="pt", device=device) as r:
        assert f.keys() == sorted(r.keys())
        assert f.metadata() == r.metadata()
        for k in r.keys():
            g, e = f.get_tensor(k), r.get_tensor(k)
            assert g.dtype == e.dtype and g.shape == e.shape and raw_bytes(g) == raw_bytes(e)
        sl, sr = f.get_slice("odd"), r.get_slice("odd")
        assert sl.get_shape() == sr.get_shape() and sl.get_dtype() == sr.get_dtype()
        assert torch.equal(sl[1:3], sr[1:3])
        assert weightlift.last_report()["bytes"] == 2 * 7 * 4  # two rows of 1×7 floats, not the tensor
        assert torch.equal(sl[:, :, 2:5], sr[:, :, 2:5])
        assert torch.equal(sl[2], sr[2])
        with pytest.raises(KeyError):
            f.get_tensor("nope")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["llama", "small", "upstream"])
@pytest.mark.parametrize("order", ["file", "random", "reversed"])
def test_streaming_safe_open_gives_every_tensor_in_any_order(files, device, name, order):
    path = files[name]
    ref = st.load_file(str(path), device=device)
    eng = weightlift.Loader(device=device, prefetch_bytes="2MiB")._engine
    with weightlift.safe_open(path, framework="pt", device=device, engine=eng) as f:
        keys = f.offset_keys()
        if order == "random":
            random.Random(3).shuffle(keys)
        elif order == "reversed":
            keys.reverse()
        for k in keys:
            g = f.get_tensor(k)
            assert g.dtype == ref[k].dtype and g.shape == ref[k].shape and raw_bytes(g) == raw_bytes(ref[k]), k
        # Asked again: read again, the same bytes.
        assert raw_bytes(f.get_tensor(keys[0])) == raw_bytes(ref[keys[0]])
    stats = f.stream_stats()
    total = sum(t.numel() * t.element_size() for t in ref.values())
    assert stats["streamed_bytes"] + stats["on_demand_bytes"] >= total
    assert stats["wasted_bytes"] == 0
    if order == "file":
        assert stats["on_demand_reads"] == 0, stats


def test_streaming_safe_open_counts_what_it_read_ahead_for_nothing(files):
    eng = weightlift.Loader(device="cpu", prefetch_bytes="4MiB")._engine
    with weightlift.safe_open(files["llama"], framework="pt", engine=eng) as f:
        first = f.offset_keys()[0]
        f.get_tensor(first)
        time.sleep(0.3)
    stats = f.stream_stats()
    assert 0 < stats["wasted_bytes"] <= 4 * (1 << 20) + os.path.getsize(files["llama"]) // 4, stats


@pytest.mark.parametrize("device", DEVICES)
def test_save_file_round_trips_through_safetensors(files, tmp_path, device):
    src = st.load_file(str(files["upstream"]), device=device)
    out = tmp_path / "saved.safetensors"
    weightlift.save_file(src, out, metadata={"k": "v"})
    back = st.load_file(str(out))
    assert_same(back, {k: v.cpu() for k, v in src.items()}, "cpu")
    with st.safe_open(str(out), "pt") as f:
        assert f.metadata() == {"k": "v"}
    aligned = tmp_path / "aligned.safetensors"
    weightlift.save_file(src, aligned, align=4096)
    assert_same(weightlift.load_file(aligned), {k: v.cpu() for k, v in src.items()}, "cpu")
    upstream_view = st.load_file(str(aligned))
    assert {k for k in upstream_view if not k.startswith("__weightlift_pad_")} == set(src)


def test_save_file_killed_midway_leaves_the_old_file(tmp_path):
    target = tmp_path / "t.safetensors"
    weightlift.save_file({"x": torch.arange(10)}, target)
    before = target.read_bytes()
    code = (
        "import torch, weightlift, sys\n"
        "print('ready', flush=True)\n"
        f"weightlift.save_file({{'big': torch.ones(512 << 20, dtype=torch.uint8)}}, {str(target)!r})\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"ready"
    time.sleep(0.3)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert target.read_bytes() == before
    assert list(tmp_path.iterdir()) == [target], "the killed writer left a file behind"


@pytest.mark.parametrize("device", DEVICES)
def test_dstorage_loader(tmp_path, device):
    rng = np.random.default_rng(1)
    paths = []
    for i, n in enumerate([1, 1000, 4097, 100_003]):
        p = tmp_path / f"w{i}.bin"
        rng.standard_normal(n).astype(np.float32).tofile(p)
        paths.append((p, n))
    loader = weightlift.Loader(device=device, threads=2)
    assert loader.settings()["threads"] == {"value": "2", "source": "set by caller"}
    for p, n in paths:
        t = loader.load_tensor(p, n)
        assert t.dtype == torch.float32 and t.shape == (n,) and t.device == torch.device(device)
        assert np.array_equal(t.cpu().numpy(), np.fromfile(p, dtype=np.float32))
    many = loader.load_tensors(paths, torch.float32)
    for (p, n), t in zip(paths, many):
        assert np.array_equal(t.cpu().numpy(), np.fromfile(p, dtype=np.float32))
    half = loader.load_tensor(paths[2][0], 3000, torch.int16)
    assert np.array_equal(half.cpu().numpy(), np.fromfile(paths[2][0], dtype=np.int16, count=3000))
    t, secs = loader.load_tensor_timed(paths[3][0], 100_003)
    assert secs > 0 and t.numel() == 100_003
    t = weightlift.load_tensor(paths[1][0], 1000, device=device)
    assert np.array_equal(t.cpu().numpy(), np.fromfile(paths[1][0], dtype=np.float32))
    with pytest.raises(weightlift.FormatError, match="w0.bin"):
        loader.load_tensor(paths[0][0], 2)


@pytest.mark.parametrize("device", DEVICES)
def test_gds_file(tmp_path, device):
    data = np.random.default_rng(2).integers(0, 255, size=10_000, dtype=np.uint8)
    path = tmp_path / "g.bin"
    data.tofile(path)
    f = weightlift.File(path, "r")
    storage = torch.empty(4096, dtype=torch.uint8, device=device).untyped_storage()
    f.load_storage(storage, offset=100)
    assert bytes(torch.empty(0, dtype=torch.uint8, device=device).set_(storage).cpu().numpy()) == data[100:4196].tobytes()
    buf = torch.empty(1000, dtype=torch.uint8, device=device)
    assert f.pread(buf, 9500) == 500  # short count at the end of the file
    assert buf[:500].cpu().numpy().tobytes() == data[9500:].tobytes()
    assert f.pread(buf, 20_000) == 0
    with pytest.raises(weightlift.IoError):
        f.load_storage(storage, offset=8000)
    with pytest.raises(weightlift.InvalidArgumentError):
        f.pwrite(buf, 0)
    out = tmp_path / "o.bin"
    w = weightlift.File(out, "w")
    src = torch.arange(1000, dtype=torch.float32, device=device)
    w.save_storage(src.untyped_storage(), offset=0)
    assert w.pwrite(src[:10], 4000) == 40
    back = np.fromfile(out, dtype=np.float32)
    assert np.array_equal(back[:1000], np.arange(1000, dtype=np.float32))
    assert np.array_equal(back[1000:1010], np.arange(10, dtype=np.float32))


def test_gds_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        weightlift.File(tmp_path / "missing.bin", "r")
    ro = tmp_path / "ro.bin"
    ro.write_bytes(b"x" * 10)
    ro.chmod(0o444)
    if os.geteuid() != 0:  # root ignores file permissions
        with pytest.raises(PermissionError):
            weightlift.File(ro, "r+")
    with pytest.raises(weightlift.InvalidArgumentError):
        weightlift.File(ro, "rw?")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["gguf", "small_gguf"])
def test_load_gguf_equals_gguf_package(files, device, name):
    ck = weightlift.load_gguf(files[name], device=device)
    reader = gguf.GGUFReader(str(files[name]))
    assert set(ck.tensors) == {t.name for t in reader.tensors}
    for t in reader.tensors:
        got = ck.tensors[t.name]
        assert got.device == torch.device(device)
        assert ck.types[t.name] == t.tensor_type.name
        assert ck.shapes[t.name] == tuple(int(d) for d in reversed(t.shape))
        if t.tensor_type.name == "BF16":
            # numpy has no bfloat16: the gguf package shows BF16 rows as bytes; weightlift gives torch.bfloat16.
            assert got.dtype == torch.bfloat16 and tuple(got.shape) == ck.shapes[t.name], t.name
        else:
            assert tuple(got.shape) == tuple(t.data.shape), t.name
        assert raw_bytes(got) == t.data.tobytes(), t.name
    assert ck.metadata["general.architecture"] == "llama"


@pytest.mark.parametrize("device", DEVICES)
def test_load_into_a_module(tmp_path, device):
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    ref = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    path = tmp_path / "m.safetensors"
    st.save_file(ref, str(path))
    target = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)).to(device)
    result = weightlift.load_into(target, path)
    assert result.missing_keys == [] and result.unexpected_keys == []
    for k, v in target.state_dict().items():
        assert v.device == torch.device(device) and torch.equal(v.cpu(), ref[k])
    x = torch.randn(2, 8)
    target.cpu()
    model.load_state_dict(ref)
    assert torch.allclose(target(x), model(x))
    extra = dict(ref, **{"extra.weight": torch.ones(1)})
    del extra["2.bias"]
    st.save_file(extra, str(path))
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "2.bias".*\n\tUnexpected key\(s\) in state_dict: "extra.weight"'):
        weightlift.load_into(target, path)
    res = weightlift.load_into(target, path, strict=False)
    assert res.missing_keys == ["2.bias"] and res.unexpected_keys == ["extra.weight"]


def test_hostile_and_wrong_inputs_raise_the_right_exceptions(tmp_path, wl_bin):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes((200_000_000).to_bytes(8, "little") + b"{}")
    with pytest.raises(weightlift.FormatError, match="bad.safetensors.*header length"):
        weightlift.load_file(bad)
    with pytest.raises(ValueError):  # FormatError is a ValueError too
        weightlift.load_file(bad)
    trunc = tmp_path / "trunc.safetensors"
    trunc.write_bytes(b"\x40\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(weightlift.FormatError, match="past the end"):
        weightlift.load_file(trunc)
    with pytest.raises(FileNotFoundError):
        weightlift.load_file(tmp_path / "nope.safetensors")
    with pytest.raises(IsADirectoryError):
        weightlift.load_file(tmp_path)
    good = tmp_path / "g.safetensors"
    st.save_file({"x": torch.ones(2)}, str(good))
    with pytest.raises(weightlift.InvalidArgumentError):
        weightlift.load_file(good, device="tpu:0")
    with pytest.raises(weightlift.InvalidArgumentError, match="unknown setting"):
        weightlift.Loader(device="cpu", bogus=1)
    with pytest.raises(weightlift.InvalidArgumentError, match="chunk_bytes"):
        weightlift.Loader(device="cpu", chunk_bytes=1000)
    with pytest.raises(weightlift.TensorNotFoundError):
        weightlift.safe_open(good).get_tensor("y")
    with pytest.raises(weightlift.InvalidArgumentError):
        weightlift.save_file({"x": torch.ones(2)}, tmp_path / "m.safetensors", metadata={"k": 1})
    if not GPU:
        with pytest.raises(weightlift.CudaError, match="unavailable"):
            weightlift.load_file(good, device="cuda:0")


@pytest.mark.parametrize("device", DEVICES)
def test_eight_threads_at_once(files, device):
    ref = st.load_file(str(files["small"]))
    loader = weightlift.Loader(device=device)

    def one(i):
        if i % 2:
            return weightlift.load_file(files["small"], device=device)
        with weightlift.safe_open(files["small"], device=device) as f:
            return f.get_tensors(list(ref))

    with ThreadPoolExecutor(8) as ex:
        results = list(ex.map(one, range(16)))
    for got in results:
        assert_same(got, {k: v.to(device) for k, v in ref.items()}, device)
    del loader


def test_probe_and_reports(files):
    p = weightlift.probe(files["llama"])
    assert {"cuda", "io_uring", "cufile", "settings", "file"} <= set(p)
    assert p["file"]["len"] == os.path.getsize(files["llama"])
    assert p["file"]["logical_block_size"] >= 512
    weightlift.load_file(files["llama"])
    r = weightlift.last_report()
    for key in ("bytes", "seconds", "gbps", "backend", "direct_bytes", "buffered_bytes", "peak_staging_bytes"):
        assert key in r
    names = [s.name for s in weightlift.SETTINGS]
    assert names[:5] == ["chunk_bytes", "queue_depth", "staging_bytes", "threads", "direct"]
    assert {"cache", "backend", "prefetch_bytes", "host_cache_bytes"} <= set(names)
    # Each variable is its setting's name, but for the page-cache policy (WEIGHTLIFT_CACHE names the folder of
    # generated checkpoints).
    renamed = {"cache": "WEIGHTLIFT_PAGE_CACHE"}
    assert all(s.env == renamed.get(s.name, "WEIGHTLIFT_" + s.name.upper()) for s in weightlift.SETTINGS)
    # One name per setting everywhere: every row is a keyword the engine takes, reported back under that name.
    loader = weightlift.Loader(device="cpu", **{s.name: s.default for s in weightlift.SETTINGS if s.values})
    assert set(loader.settings()) == set(names)
    with pytest.raises(weightlift.InvalidArgumentError, match="unknown setting"):
        weightlift.Loader(device="cpu", io="pread")


@pytest.mark.skipif(not GPU, reason="needs a CUDA device")
def test_gpu_tensors_are_ready_for_kernels_on_the_current_stream(files):
    # The checkpoint holds random bytes (NaNs included), so the kernel works on the bits: XOR as 16-bit integers.
    ref = st.load_file(str(files["llama"]))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        got = weightlift.load_file(files["llama"], device="cuda:0")
        flipped = {k: v.view(torch.int16) ^ 0x5A5A for k, v in got.items()}
    side.synchronize()
    for k, v in ref.items():
        assert raw_bytes(got[k]) == raw_bytes(v), k
        assert torch.equal(flipped[k].cpu(), v.view(torch.int16) ^ 0x5A5A), k


@pytest.mark.skipif(not GPU, reason="needs a CUDA device")
@pytest.mark.parametrize("memory", ["torch", "pool"])
def test_freeing_gpu_tensors_frees_their_memory(files, memory):
    engine = weightlift._core.new_engine(device_memory=memory)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free0, _ = torch.cuda.mem_get_info()
    ref = st.load_file(str(files["llama"]))
    for i in range(5):
        got = weightlift.load_file(files["llama"], device="cuda:0", engine=engine)
        n = sum(t.numel() * t.element_size() for t in got.values())
        if i == 0:
            assert_same(got, ref, "cuda:0")
        del got
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # torch's cache holds what its allocator gave the tensors
    free1, _ = torch.cuda.mem_get_info()
    assert free0 - free1 < max(n, 64 << 20), (free0, free1, n)


@pytest.mark.skipif(not GPU, reason="needs a CUDA device")
def test_gpu_tensors_come_from_torchs_allocator_unless_asked_otherwise(files):
    ref = st.load_file(str(files["llama"]))
    n = sum(t.numel() * t.element_size() for t in ref.values())
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated(0)
    got = weightlift.load_file(files["llama"], device="cuda:0")
    assert weightlift.last_report()["device_memory"] == "torch"
    assert torch.cuda.memory_allocated(0) - base >= n  # torch counts them as its own
    assert_same(got, {k: v.to("cuda:0") for k, v in ref.items()}, "cuda:0")
    with weightlift.safe_open(files["llama"], device="cuda:0") as f:
        one = f.get_tensor(next(iter(ref)))
    assert raw_bytes(one) == raw_bytes(ref[next(iter(ref))])
    del got, one
    assert torch.cuda.memory_allocated(0) == base  # freed at once, back in torch's cache
    pool = weightlift._core.new_engine(device_memory="pool")
    got = weightlift.load_file(files["llama"], device="cuda:0", engine=pool)
    assert weightlift.last_report()["device_memory"] == "pool"
    assert torch.cuda.memory_allocated(0) == base
    assert_same(got, {k: v.to("cuda:0") for k, v in ref.items()}, "cuda:0")
    before = os.environ.pop("WEIGHTLIFT_DEVICE_MEMORY", None)
    try:
        assert weightlift._core.shared_engine().device_memory == "torch"
        os.environ["WEIGHTLIFT_DEVICE_MEMORY"] = "pool"
        assert weightlift._core.shared_engine().device_memory == "pool"
    finally:
        os.environ.pop("WEIGHTLIFT_DEVICE_MEMORY", None)
        if before is not None:
            os.environ["WEIGHTLIFT_DEVICE_MEMORY"] = before


@pytest.mark.skipif(not GPU, reason="needs a CUDA device")
def test_a_failing_device_allocator_fails_the_load_and_nothing_else(files):
    ref = st.load_file(str(files["llama"]))
    engine = weightlift._core.new_engine()
    ckpt = weightlift._native.Checkpoint([str(files["llama"])])

    def raising(nbytes):
        raise ValueError(f"no {nbytes} bytes today")

    with pytest.raises(ValueError, match="bytes today"):
        ckpt.load(engine, "cuda:0", None, False, 0, raising, 0)

    def too_small(nbytes):
        return torch.empty(1, dtype=torch.uint8, device="cuda:0")

    with pytest.raises(ValueError, match="the allocator gave 1 bytes"):
        ckpt.load(engine, "cuda:0", None, False, 0, too_small, 0)
    with pytest.raises(ValueError, match="not a CUDA tensor"):
        ckpt.load(engine, "cuda:0", None, False, 0, lambda n: torch.empty(n, dtype=torch.uint8), 0)
    with pytest.raises(ValueError, match="not contiguous"):
        ckpt.load(engine, "cuda:0", None, False, 0, lambda n: torch.empty(2 * n, dtype=torch.uint8, device="cuda:0")[::2], 0)

    # Failing part way: the blocks made before the failure go back to torch at once.
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated(0)
    calls = []

    def third_fails(nbytes):
        calls.append(nbytes)
        if len(calls) == 3:
            raise ValueError("the third block is refused")
        return torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")

    with pytest.raises(ValueError, match="third block"):
        ckpt.load(engine, "cuda:0", None, False, 0, third_fails, 0)
    assert len(calls) == 3
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated(0) == base

    def oom(nbytes):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (raised by the test)")

    with pytest.raises(weightlift.OutOfMemoryError, match="out of memory"):
        ckpt.load(engine, "cuda:0", None, False, 0, oom, 0)
    # The real thing: torch's allocator refuses past its memory fraction.
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(0.0, 0)
    try:
        with pytest.raises(weightlift.OutOfMemoryError, match="cuda:0"):
            weightlift.load_file(files["llama"], device="cuda:0")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
    got = weightlift.load_file(files["llama"], device="cuda:0")
    assert_same(got, {k: v.to("cuda:0") for k, v in ref.items()}, "cuda:0")


@pytest.mark.skipif(not GPU, reason="needs a CUDA device")
def test_gpu_initiated_nvme_backend(files):
    ref = st.load_file(str(files["small"]))
    got = weightlift.load_file(files["small"], device="cuda:0", backend="nvme-sim")
    report = weightlift.last_report()
    assert report["backend"] == "nvme-sim" and report["nvme"]["commands"] > 0
    assert_same(got, {k: v.to("cuda:0") for k, v in ref.items()}, "cuda:0")


@pytest.mark.parametrize("device", DEVICES)
def test_load_file_verify_checks_every_byte_against_the_manifest(files, tmp_path, device):
    import shutil

    src = tmp_path / "v.safetensors"
    shutil.copy(files["upstream"], src)
    with pytest.raises(weightlift.ChecksumError, match="weightlift checksum"):
        weightlift.load_file(src, device, verify=True)
    wl = os.environ.get("WEIGHTLIFT_BIN", "weightlift")
    subprocess.run([wl, "checksum", str(src)], check=True, capture_output=True)
    got = weightlift.load_file(src, device, verify=True)
    ref = st.load_file(str(files["upstream"]), device=device)
    assert_same(got, ref, device)
    # Every byte was hashed: on the GPU for device tensors (read back where its hash kernels cannot run), while the
    # load ran where the path has lanes (not cuFile).
    report = weightlift.last_report()
    checks = report["checks"]
    assert checks["bytes"] == sum(t.numel() * t.element_size() for t in ref.values()), checks
    if device == "cpu":
        assert checks["on"] == "cpu", checks
    else:
        assert checks["on"] == "cuda:0" or checks["on"].startswith("cpu, read back from the device"), checks
    if "cufile" not in report["backend"] and checks["on"] in ("cpu", "cuda:0"):
        assert checks["overlapped_bytes"] > 0, checks
    # A manifest that lacks a tensor of the file is an error naming the tensor, not a silent pass.
    manifest = Path(str(src) + ".xxh3.json")
    full = manifest.read_text()
    m = json.loads(full)
    dropped = m["tensors"].pop()["name"]
    manifest.write_text(json.dumps(m))
    with pytest.raises(weightlift.ChecksumError, match=dropped):
        weightlift.load_file(src, device, verify=True)
    manifest.write_text(full)
    # One byte changed in the file after the manifest was written: the load names the tensor and chunk.
    header = 8 + int.from_bytes(src.read_bytes()[:8], "little")
    info = json.loads(src.read_bytes()[8:header])
    name = next(k for k in info if k != "__metadata__")
    begin = header + info[name]["data_offsets"][0]
    with open(src, "r+b") as f:
        f.seek(begin + 3)
        b = f.read(1)
        f.seek(begin + 3)
        f.write(bytes([b[0] ^ 0x40]))
    with pytest.raises(weightlift.ChecksumError, match=name) as e:
        weightlift.load_file(src, device, verify=True)
    if device != "cpu":
        # Device tensors are hashed on their GPU, not copied back.
        assert "checked on cuda:0" in str(e.value)
    assert weightlift.load_file(src, device).keys() == ref.keys()  # without verify, loaded as it is


@pytest.mark.skipif(not GPU or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_the_callers_current_device_is_left_as_found(files):
    """torch takes a thread's device from its current CUDA context; loading onto another GPU, handing the tensors
    over, probing the devices and freeing the tensors leave this thread on the device it chose."""
    import gc

    torch.cuda.set_device(0)
    ref = st.load_file(str(files["llama"]), device="cuda:1")
    got = weightlift.load_file(files["llama"], device="cuda:1")
    assert torch.cuda.current_device() == 0
    assert_same(got, ref, "cuda:1")
    weightlift.probe()
    assert torch.cuda.current_device() == 0
    del got
    gc.collect()
    torch.cuda.synchronize(1)
    assert torch.cuda.current_device() == 0
    assert torch.zeros(1, device="cuda").device == torch.device("cuda:0")
