"""The load server (`python -m weightlift serve`, `weightlift serve`): loads onto a GPU read by another process into
this process's memory, every byte compared with the safetensors package's; loads it cannot serve read here, with the
reason in the report; and without a GPU, a server that says it cannot run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")
import weightlift  # noqa: E402
from weightlift import _core  # noqa: E402
import weightlift.safetensors as wst  # noqa: E402

GPU = torch.cuda.is_available() and weightlift.cuda_available()


def _checkpoint(path: Path) -> dict:
    """A file written by safetensors itself (offsets as upstream lays them out), several dtypes and odd sizes, no
    zeros."""
    g = torch.Generator().manual_seed(11)
    tensors = {
        "embed": torch.randn(1031, 96, generator=g).to(torch.bfloat16),
        "a.weight": torch.randn(333, 17, generator=g),
        "a.bias": torch.randn(17, generator=g).to(torch.float16),
        "ids": torch.randint(1, 1 << 40, (77,), generator=g, dtype=torch.int64),
        "mask": torch.randint(1, 255, (3, 5, 7), generator=g, dtype=torch.uint8),
        "big": torch.randn(3 << 20, generator=g).to(torch.bfloat16),
    }
    st.save_file(tensors, str(path))
    return st.load_file(str(path))


def _same(loaded: dict, ref: dict) -> None:
    assert set(loaded) == set(ref)
    for k, v in ref.items():
        got = loaded[k].cpu()
        assert got.dtype == v.dtype and got.shape == v.shape, k
        assert torch.equal(got.reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8)), k


def test_the_server_setting_is_a_setting_like_the_others():
    assert "server" in [s.name for s in weightlift.SETTINGS]
    for value, shown in (("off", "off"), ("auto", "auto"), ("/run/x/s.sock", "/run/x/s.sock")):
        eng = _core.new_engine(server=value)
        assert eng.settings()["server"]["value"] == shown
    assert _core.new_engine().settings()["server"]["value"] in ("auto", os.environ.get("WEIGHTLIFT_SERVER", "auto"))


def test_host_loads_never_ask_a_server(tmp_path):
    ref = _checkpoint(tmp_path / "w.safetensors")
    eng = _core.new_engine(server=str(tmp_path / "nobody.sock"))
    _same(wst.load_file(tmp_path / "w.safetensors", engine=eng), ref)
    assert weightlift.last_report().get("server") is None


@pytest.mark.skipif(GPU, reason="checks the error without a GPU")
def test_serve_without_a_gpu_says_so_and_leaves_no_socket(tmp_path):
    sock = tmp_path / "s.sock"
    p = subprocess.run([sys.executable, "-m", "weightlift", "serve", "--socket", str(sock)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert "CUDA unavailable" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and "panicked" not in p.stderr
    assert not sock.exists()


class Server:
    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(mode=0o700, exist_ok=True)
        self.log = open(path.parent / "server.log", "w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "weightlift", "serve", "--socket", str(path)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while True:
            assert self.proc.poll() is None, self.output()
            self.log.seek(0)
            if "listening" in self.log.read():
                with socket.socket(socket.AF_UNIX) as c:
                    c.connect(str(path))
                return
            assert time.monotonic() < deadline, self.output()
            time.sleep(0.05)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self, sig=signal.SIGINT) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path / "serve" / "server.sock")
    yield s
    s.stop()


@pytest.mark.skipif(not GPU, reason="needs a CUDA device")
def test_a_load_through_the_server_is_byte_exact(tmp_path, server):
    f = tmp_path / "w.safetensors"
    ref = _checkpoint(f)
    eng = _core.new_engine(server=str(server.path))
    for _ in range(2):  # a second load: the server opens the new allocations again
        loaded = wst.load_file(f, device="cuda:0", engine=eng)
        rep = weightlift.last_report()
        assert rep["backend"] == "server", rep
        # The client's report counts tensor bytes; the server's, the blocks it read (small neighbours share a block
        # that mirrors the file, gaps included).
        nbytes = sum(v.numel() * v.element_size() for v in ref.values())
        assert rep["bytes"] == nbytes, rep
        assert rep["server"]["used"] is True, rep["server"]
        assert nbytes <= rep["server"]["report"]["bytes"] <= f.stat().st_size, rep["server"]
        assert "load server" in rep["backend_reason"]
        _same(loaded, ref)
        del loaded
    # Another file of the same name: the server checks identity, not names, and the bytes are the new file's.
    f.unlink()
    ref2 = _checkpoint(f)
    _same(wst.load_file(f, device="cuda:0", engine=eng), ref2)
    assert weightlift.last_report()["backend"] == "server"
    assert "served" in server.output()  # python -m weightlift serve logs each load served


@pytest.mark.skipif(not GPU, reason="needs a CUDA device")
def test_memory_the_server_cannot_open_is_read_here_with_the_reason(tmp_path, server):
    f = tmp_path / "w.safetensors"
    ref = _checkpoint(f)
    eng = _core.new_engine(server=str(server.path), device_memory="pool")
    _same(wst.load_file(f, device="cuda:0", engine=eng), ref)
    rep = weightlift.last_report()
    assert rep["backend"] != "server" and rep["server"]["used"] is False
    assert "cannot be shared with another process" in rep["server"]["reason"], rep["server"]


@pytest.mark.skipif(not GPU, reason="needs a CUDA device")
def test_a_server_that_died_leaves_loads_to_this_process(tmp_path, server):
    f = tmp_path / "w.safetensors"
    ref = _checkpoint(f)
    eng = _core.new_engine(server=str(server.path))
    _same(wst.load_file(f, device="cuda:0", engine=eng), ref)
    assert weightlift.last_report()["backend"] == "server"
    server.stop(signal.SIGKILL)  # no clean-up: the socket file stays, nobody listens
    assert server.path.exists()
    _same(wst.load_file(f, device="cuda:0", engine=eng), ref)
    rep = weightlift.last_report()
    assert rep["backend"] != "server" and "connecting" in rep["server"]["reason"], rep["server"]
    # A new server replaces the stale socket; SIGINT stops it cleanly and removes its socket.
    again = Server(server.path)
    _same(wst.load_file(f, device="cuda:0", engine=eng), ref)
    assert weightlift.last_report()["backend"] == "server"
    assert again.stop() == 0 and not server.path.exists()
    _same(wst.load_file(f, device="cuda:0", engine=eng), ref)
    assert "no load server listens there" in weightlift.last_report()["server"]["reason"]


@pytest.mark.skipif(not GPU, reason="needs a CUDA device")
def test_a_server_at_its_limit_refuses_and_the_load_is_read_here(tmp_path, server):
    f = tmp_path / "w.safetensors"
    ref = _checkpoint(f)
    eng = _core.new_engine(server=str(server.path))
    # Connections that never send a request hold their slots (until they close, or for 30 s). With 63 of them the
    # load takes the last slot; with 64 it is refused.
    idle = []

    def connect() -> None:
        c = socket.socket(socket.AF_UNIX)
        c.connect(str(server.path))
        idle.append(c)

    try:
        for _ in range(63):
            connect()
        time.sleep(1)  # the server accepts them in turn
        _same(wst.load_file(f, device="cuda:0", engine=eng), ref)
        assert weightlift.last_report()["backend"] == "server", weightlift.last_report()["server"]
        while True:  # one more each time (a slot may still be held by the load before, finishing): refused soon
            connect()
            _same(wst.load_file(f, device="cuda:0", engine=eng), ref)
            rep = weightlift.last_report()
            if rep["backend"] != "server":
                break
            assert len(idle) < 68, "the server never reached its limit"
            time.sleep(0.2)
        assert rep["server"]["used"] is False, rep["server"]
        assert "the server is busy: 64 connections" in rep["server"]["reason"], rep["server"]
    finally:
        for c in idle:
            c.close()
    # The slots come back as those connections end: the server serves again.
    deadline = time.monotonic() + 10
    while True:
        _same(wst.load_file(f, device="cuda:0", engine=eng), ref)
        if weightlift.last_report()["backend"] == "server":
            break
        assert time.monotonic() < deadline, weightlift.last_report()["server"]
        time.sleep(0.05)
    assert server.proc.poll() is None


@pytest.mark.skipif(not GPU, reason="needs a CUDA device")
def test_a_second_server_on_the_same_socket_is_refused(tmp_path, server):
    p = subprocess.run([sys.executable, "-m", "weightlift", "serve", "--socket", str(server.path)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "already listens" in p.stderr, p.stderr
