"""Paths that are not regular files, and writers killed mid-write.

Every entry point refuses a FIFO, a socket or a character device at once with NotARegularFileError naming the path
(each case runs in a subprocess with a deadline, so a blocking open fails the test instead of hanging it), and a
save removes the temporary files that killed writers left, but never a live writer's."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
weightlift = pytest.importorskip("weightlift")
st = pytest.importorskip("safetensors.torch")

# Runs each entry point on one path and prints, per entry point, the exception's class names and message.
ENTRY_POINTS = r"""
import json, sys, torch, weightlift
path = sys.argv[1]
results = {}
def attempt(name, fn):
    try:
        fn()
        results[name] = {"classes": [], "message": "no error"}
    except Exception as e:
        results[name] = {"classes": [c.__name__ for c in type(e).__mro__], "message": str(e)}
t = torch.empty(4, dtype=torch.uint8)
attempt("load_file", lambda: weightlift.load_file(path))
attempt("safe_open", lambda: weightlift.safe_open(path, framework="pt"))
attempt("load_gguf", lambda: weightlift.load_gguf(path))
attempt("Loader.load_tensor", lambda: weightlift.Loader(device="cpu").load_tensor(path, 4, torch.uint8))
attempt("File.load_storage", lambda: weightlift.File(path, "r").load_storage(t.untyped_storage()))
attempt("File(w)", lambda: weightlift.File(path, "w"))
def register():
    import weightlift.cufile as cufile
    with cufile.Session() as session:
        session.register_handle(path)
attempt("cufile Session.register_handle", register)
print(json.dumps(results))
"""


def entry_point_errors(path: Path) -> dict:
    try:
        proc = subprocess.run([sys.executable, "-c", ENTRY_POINTS, str(path)], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{path}: an entry point blocked for 120 s")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def special_files(tmp_path):
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    bare = tmp_path / "checkpoint"
    os.mkfifo(bare)
    sock_path = tmp_path / "model.gguf"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(sock_path))
    yield {"FIFO": fifo, "FIFO without extension": bare, "socket": sock_path, "character device": Path("/dev/null")}
    sock.close()


def test_fifos_sockets_and_devices_are_refused_at_once_everywhere(special_files):
    for what, path in special_files.items():
        for entry, got in entry_point_errors(path).items():
            assert "NotARegularFileError" in got["classes"], f"{what} via {entry}: {got}"
            assert "OSError" in got["classes"] and "WeightliftError" in got["classes"], f"{what} via {entry}: {got}"
            assert str(path) in got["message"] and "not a regular file" in got["message"], f"{what} via {entry}: {got}"


def test_a_directory_is_an_is_a_directory_error_everywhere(tmp_path):
    for entry, got in entry_point_errors(tmp_path).items():
        assert "IsADirectoryError" in got["classes"], f"{entry}: {got}"
        assert str(tmp_path) in got["message"], f"{entry}: {got}"


WRITER = r"""
import sys, torch, weightlift
big = torch.arange(1 << 27, dtype=torch.int32)  # 512 MiB of distinct values
print("ready", flush=True)
weightlift.save_file({"big": big}, sys.argv[1])
"""


def writing_size(pid: int, folder: Path) -> int | None:
    """The size of the file process ``pid`` is writing in ``folder``: unnamed (``/proc/PID/fd/N`` reads
    ``FOLDER/#INODE (deleted)``) or, on a filesystem without O_TMPFILE, ``NAME.weightlift-tmp-...``."""
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = Path(os.readlink(fd))
            if link.parent == folder and (link.name.startswith("#") or ".weightlift-tmp-" in link.name):
                return fd.stat().st_size
        except OSError:
            continue  # closed in between
    return None


def stopped_writer(target: Path) -> subprocess.Popen:
    """A writer process stopped (SIGSTOP) in the middle of a save_file to ``target``."""
    for _ in range(3):
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(target)], stdout=subprocess.PIPE)
        assert p.stdout.readline().strip() == b"ready"
        deadline = time.monotonic() + 60
        while p.poll() is None and time.monotonic() < deadline:
            if (writing_size(p.pid, target.parent) or 0) > 0:
                p.send_signal(signal.SIGSTOP)
                if writing_size(p.pid, target.parent):
                    return p
                p.send_signal(signal.SIGCONT)  # it finished the write in between: try again
                break
            time.sleep(0.001)
        p.kill()
        p.wait()
    pytest.fail("could not stop a writer in the middle of its write in three tries")


def test_save_file_killed_midway_leaves_nothing_behind_and_a_live_writer_is_not_disturbed(tmp_path):
    """Backs SECURITY.md: an interrupted write leaves nothing behind, even after SIGKILL."""
    target = tmp_path / "model.safetensors"
    writer = stopped_writer(target)
    try:
        # Alive (stopped) mid-write: another save to the same path neither waits for it nor disturbs it.
        first = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
        weightlift.save_file(first, target)
        assert writing_size(writer.pid, tmp_path), "a live writer lost its temporary file"
        assert torch.equal(st.load_file(str(target))["a"], first["a"])
    finally:
        writer.kill()  # SIGKILL: nothing in the writer runs any more
        writer.wait()
    assert sorted(f.name for f in tmp_path.iterdir()) == ["model.safetensors"], "the killed writer left a file"
    assert torch.equal(st.load_file(str(target))["a"], first["a"])
    second = {"b": torch.arange(5, dtype=torch.int64) * 7}
    weightlift.save_file(second, target)
    assert torch.equal(st.load_file(str(target))["b"], second["b"])
    assert sorted(f.name for f in tmp_path.iterdir()) == ["model.safetensors"]


def test_the_python_package_never_unpickles_or_evaluates():
    """Backs SECURITY.md: checkpoint bytes are parsed as data only. No module of the package imports pickle (or
    marshal, shelve, dill) or calls torch.load, eval, exec or compile."""
    import ast

    package = Path(weightlift.__file__).parent
    banned_modules = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "joblib"}
    banned_calls = {"eval", "exec", "compile", "__import__"}
    sources = sorted(package.glob("*.py"))
    assert sources, package
    for source in sources:
        tree = ast.parse(source.read_text(), str(source))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                names = {(node.module or "").split(".")[0]}
            else:
                names = set()
            assert not names & banned_modules, f"{source.name}:{node.lineno} imports {names & banned_modules}"
            if isinstance(node, ast.Call):
                f = node.func
                if isinstance(f, ast.Name):  # the builtins; re.compile and the like are fine
                    assert f.id not in banned_calls, f"{source.name}:{node.lineno} calls {f.id}"
                is_torch_load = isinstance(f, ast.Attribute) and f.attr == "load" and isinstance(f.value, ast.Name) and f.value.id in {"torch", "t"}
                assert not is_torch_load, f"{source.name}:{node.lineno} calls torch.load"


def _sparse_checkpoint(path: Path, length: int) -> None:
    """One U8 tensor of `length` bytes whose data is a hole: long to read in small pieces, cheap on disk (for
    cancellation only; no byte of it is checked)."""
    header = json.dumps({"t": {"dtype": "U8", "shape": [length], "data_offsets": [0, length]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        f.truncate(8 + len(header) + length)


def _slow_load(tmp_path: Path):
    """A 2 GiB sparse checkpoint and an engine that reads it slowly (one lane, 4 KiB reads, no page cache): a load
    that is still running half a second in."""
    from weightlift import _core

    big = tmp_path / "sparse.safetensors"
    _sparse_checkpoint(big, 2 << 30)
    return big, _core.new_engine(threads=1, chunk_bytes="4KiB", cache="bypass")


@pytest.fixture(autouse=True)
def _ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt in these tests whatever the runner left: a Python started with SIGINT ignored
    (a background job of a non-interactive shell, `cmd &`) keeps it ignored, and `_thread.interrupt_main` then does
    nothing."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def _interrupt_after(seconds: float):
    """Raises KeyboardInterrupt in the main thread after `seconds`, as Ctrl-C does; returns the timer and a list that
    receives the time it fired."""
    import _thread
    import threading

    sent = []

    def interrupt():
        sent.append(time.perf_counter())
        _thread.interrupt_main()

    timer = threading.Timer(seconds, interrupt)
    timer.start()
    return timer, sent


def _gpu() -> bool:
    import torch

    import weightlift

    return torch.cuda.is_available() and weightlift.cuda_available()


@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_ctrl_c_interrupts_a_load_within_a_fraction_of_a_second_and_the_engine_goes_on(tmp_path, device):
    import safetensors.torch as st
    import torch

    import weightlift.safetensors as wst

    if device != "cpu" and not _gpu():
        pytest.skip("needs a CUDA device")
    big, engine = _slow_load(tmp_path)
    if device != "cpu":
        wst.load_file(_small(tmp_path), device, engine=engine)  # CUDA context, pools and staging exist before
        torch.cuda.synchronize()
        allocated_before = torch.cuda.memory_allocated()
        free_before = torch.cuda.mem_get_info()[0]
    timer, sent = _interrupt_after(0.5)
    try:
        with pytest.raises(KeyboardInterrupt):
            wst.load_file(big, device, engine=engine)
    finally:
        timer.cancel()
    took = time.perf_counter() - sent[0]
    print(f"KeyboardInterrupt {took * 1e3:.0f} ms after Ctrl-C ({device})")
    assert took < 0.5, took
    if device != "cpu":
        # The interrupted load's device memory went back (the 2 GiB destination included): its blocks to torch's
        # allocator at once (device_memory=torch), and from there to the device on empty_cache.
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == allocated_before
        torch.cuda.empty_cache()
        free_after = torch.cuda.mem_get_info()[0]
        print(f"device memory free before {free_before}, after {free_after}")
        assert free_after >= free_before - (64 << 20)
    # The engine is usable afterwards, and loads the right bytes.
    small = _small(tmp_path)
    got = wst.load_file(small, device, engine=engine)
    ref = st.load_file(str(small))
    assert got.keys() == ref.keys()
    for k in ref:
        assert got[k].dtype == ref[k].dtype and torch.equal(got[k].cpu().view(torch.uint8), ref[k].view(torch.uint8))


def _small(tmp_path):
    import safetensors.torch as st
    import torch

    small = tmp_path / "small.safetensors"
    if not small.exists():
        g = torch.Generator().manual_seed(7)
        st.save_file({f"w{i}": torch.randn(64, 33 + i, generator=g) for i in range(8)}, str(small))
    return small


def test_ctrl_c_interrupts_a_streaming_get_tensor(tmp_path):
    import weightlift

    big, engine = _slow_load(tmp_path)
    timer, sent = _interrupt_after(0.5)
    try:
        with pytest.raises(KeyboardInterrupt):
            with weightlift.safe_open(big, framework="pt", device="cpu", engine=engine) as f:
                f.get_tensor("t")
    finally:
        timer.cancel()
    took = time.perf_counter() - sent[0]
    print(f"KeyboardInterrupt {took * 1e3:.0f} ms after Ctrl-C, stream closed")
    assert took < 0.5, took


def _tensor_ranges(path: Path) -> dict[str, tuple[int, int]]:
    """Each tensor's absolute byte range, from the safetensors header."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    return {k: (8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"}


def _raw(t: "torch.Tensor") -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_randomized_faults_on_the_python_apis(tmp_path, device, wl, monkeypatch):
    """The Python fronts under random EIO (the test hook WEIGHTLIFT_INJECT_EIO, at a random offset or none):
    load_file, safe_open (every key in random order, and a slice), Loader.load_tensor, File.load_storage and
    load_into. Each round either returns every byte right (checked against safetensors and the file's bytes), or
    raises weightlift.IoError naming the file and an offset; a fault inside the bytes the call reads always fails
    it; the engine loads correctly afterwards. Bounded by WEIGHTLIFT_SOAK_SECONDS / 3 (default 5 s); the seed is
    printed (WEIGHTLIFT_SOAK_SEED replays it)."""
    import random

    if device != "cpu" and not (torch.cuda.is_available() and weightlift.cuda_available()):
        pytest.skip("needs a GPU")
    seconds = max(2.0, float(os.environ.get("WEIGHTLIFT_SOAK_SECONDS", "15")) / 3)
    seed = int(os.environ.get("WEIGHTLIFT_SOAK_SEED", str(time.time_ns() % 1_000_000)))
    print(f"python fault soak: seed {seed} (WEIGHTLIFT_SOAK_SEED={seed} replays it), {seconds:.0f} s, {device}")
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(5)
    tensors = {f"w{i}": torch.randn(64 + i, 129, generator=g) for i in range(12)}
    tensors["b"] = torch.randn(33, generator=g).to(torch.bfloat16)
    path = tmp_path / "m.safetensors"
    st.save_file(tensors, str(path))
    ref = st.load_file(str(path))
    ranges = _tensor_ranges(path)
    data = path.read_bytes()
    size = len(data)
    rounds = failed = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        api = rng.choice(["load_file", "safe_open", "slice", "load_tensor", "load_storage", "load_into"])
        offset = rng.randrange(size) if rng.random() < 0.75 else None
        name = rng.choice(list(tensors))
        raw_at = rng.randrange(size // 2)
        raw_n = rng.randrange(1, size - raw_at)
        want = {  # the bytes each call reads
            "load_file": list(ranges.values()),
            "safe_open": list(ranges.values()),
            "slice": [(ranges[name][0], ranges[name][0] + 3 * ranges_row(tensors[name]))],
            "load_tensor": [(0, raw_n)],
            "load_storage": [(raw_at, raw_at + raw_n)],
            "load_into": list(ranges.values()),
        }[api]
        inside = offset is not None and any(a <= offset < b for a, b in want)
        what = f"round {rounds} (seed {seed}): {api}, EIO at {offset}"
        if offset is None:
            monkeypatch.delenv("WEIGHTLIFT_INJECT_EIO", raising=False)
        else:
            monkeypatch.setenv("WEIGHTLIFT_INJECT_EIO", f"{path}@{offset}")
        try:
            if api == "load_file":
                got = weightlift.load_file(path, device)
                assert all(_raw(got[k]) == _raw(ref[k]) for k in ref), what
            elif api == "safe_open":
                with weightlift.safe_open(path, framework="pt", device=device) as f:
                    keys = list(f.keys())
                    rng.shuffle(keys)
                    for k in keys:
                        assert _raw(f.get_tensor(k)) == _raw(ref[k]), f"{what}: {k}"
            elif api == "slice":
                with weightlift.safe_open(path, framework="pt", device=device) as f:
                    assert _raw(f.get_slice(name)[:3]) == _raw(ref[name][:3]), what
            elif api == "load_tensor":
                t = weightlift.Loader(device=device).load_tensor(path, raw_n, torch.uint8)
                assert _raw(t) == data[:raw_n], what
            elif api == "load_storage":
                t = torch.empty(raw_n, dtype=torch.uint8, device=device)
                weightlift.File(path, "r").load_storage(t.untyped_storage(), offset=raw_at)
                assert _raw(t) == data[raw_at : raw_at + raw_n], what
            else:
                model = torch.nn.ParameterDict({k: torch.nn.Parameter(torch.empty_like(v)) for k, v in ref.items()})
                weightlift.load_into(model, path, device=device)
                assert all(_raw(model[k]) == _raw(ref[k]) for k in ref), what
            assert not inside, f"{what}: a fault inside the bytes read ended in success"
        except weightlift.WeightliftError as e:
            failed += 1
            assert offset is not None, f"{what}: failed without a fault: {e}"
            assert isinstance(e, weightlift.IoError), f"{what}: {type(e).__mro__}: {e}"
            assert str(path) in str(e) and "offset" in str(e), f"{what}: {e}"
        rounds += 1
    monkeypatch.delenv("WEIGHTLIFT_INJECT_EIO", raising=False)
    got = weightlift.load_file(path, device)
    assert all(_raw(got[k]) == _raw(ref[k]) for k in ref)
    print(f"python fault soak: {rounds} rounds, {failed} failed as they should")
    assert rounds >= 20 and failed > 0


def ranges_row(t: "torch.Tensor") -> int:
    """Bytes of one row (first dimension) of `t`."""
    return t[0].numel() * t.element_size()


def test_ctrl_c_during_the_hand_over_of_log_records_still_interrupts(tmp_path):
    """A long call hands the engine's log records to `logging` every 50 ms while it runs; a Ctrl-C whose
    KeyboardInterrupt is raised inside a logging handler (Python code runs there) still interrupts the call."""
    import _thread
    import logging

    import weightlift.safetensors as wst

    big, engine = _slow_load(tmp_path)
    seen = []

    class Interrupting(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())
            if len(seen) == 1:
                _thread.interrupt_main()  # the signal's handler runs at the next bytecode: here, in this handler
                for _ in range(1000):
                    pass

    logger = logging.getLogger("weightlift")
    handler, level = Interrupting(level=logging.DEBUG), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        t0 = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            wst.load_file(big, "cpu", engine=engine)
        took = time.perf_counter() - t0
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert seen, "no record was handed over while the load ran"
    print(f"interrupted {took:.2f} s into the load, {len(seen)} records handed over")
    assert took < 5, took
