"""Shared fixtures: the `weightlift` binary under test, and the object-storage servers (s3s-fs and nginx started
on 127.0.0.1) of the tests that load from URLs. A missing server skips its tests, unless
WEIGHTLIFT_REQUIRE_SERVERS=1 (CI), where it fails."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _find_binary() -> Path:
    env = os.environ.get("WEIGHTLIFT_BIN")
    if env:
        return Path(env)
    for profile in ("release", "debug"):
        candidate = ROOT / "target" / profile / "weightlift"
        if candidate.exists():
            return candidate
    found = shutil.which("weightlift")
    if found:
        return Path(found)
    raise RuntimeError("no weightlift binary: build it (cargo build) or set WEIGHTLIFT_BIN")


@pytest.fixture(scope="session")
def wl_bin() -> Path:
    return _find_binary()


class Cli:
    def __init__(self, binary: Path):
        self.binary = binary

    def run(self, *args: str | os.PathLike, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(self.binary), *map(str, args)], capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise AssertionError(f"weightlift {' '.join(map(str, args))} failed ({proc.returncode}): {proc.stderr}")
        return proc

    def json(self, *args: str | os.PathLike) -> dict:
        return json.loads(self.run(*args).stdout)


@pytest.fixture(scope="session")
def wl(wl_bin: Path) -> Cli:
    return Cli(wl_bin)


ACCESS_KEY, SECRET_KEY = "weightlift-test", "weightlift-test-secret"


def _missing(what: str):
    if os.environ.get("WEIGHTLIFT_REQUIRE_SERVERS") == "1":
        pytest.fail(f"{what} (WEIGHTLIFT_REQUIRE_SERVERS=1)")
    pytest.skip(what)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(port: int, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited at start ({proc.returncode})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not listen on {port}")
            time.sleep(0.02)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """s3s-fs serving a fresh folder with bucket ``bucket`` (yielded: the bucket's folder, whose files are its
    objects), its endpoint and keys in ``os.environ`` (which subprocesses inherit) while the module's tests run."""
    binary = os.environ.get("WEIGHTLIFT_S3S_FS") or shutil.which("s3s-fs") or shutil.which(
        "s3s-fs", path=os.path.expanduser("~/.cargo/bin"))
    if not binary:
        _missing("no s3s-fs here (cargo install s3s-fs --features binary, or set WEIGHTLIFT_S3S_FS)")
    root = tmp_path_factory.mktemp("s3")
    (root / "bucket").mkdir()
    port = _free_port()
    proc = subprocess.Popen([binary, "--host", "127.0.0.1", "--port", str(port), "--access-key", ACCESS_KEY,
                             "--secret-key", SECRET_KEY, str(root)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait(port, proc, "s3s-fs")
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": ACCESS_KEY,
           "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield root / "bucket"
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    """nginx serving a fresh folder: yields the folder and the base URL."""
    binary = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")
    if not binary:
        _missing("no nginx here (apt-get install nginx-light)")
    base = tmp_path_factory.mktemp("nginx")
    root = base / "www"
    root.mkdir()
    port = _free_port()
    (base / "nginx.conf").write_text(
        f"daemon off; master_process off; worker_processes 1; pid {base}/nginx.pid; error_log {base}/error.log;\n"
        "events { worker_connections 256; }\n"
        f"http {{ access_log off; client_body_temp_path {base}/t; proxy_temp_path {base}/t; "
        f"fastcgi_temp_path {base}/t; uwsgi_temp_path {base}/t; scgi_temp_path {base}/t;\n"
        f"server {{ listen 127.0.0.1:{port}; root {root}; }} }}\n")
    proc = subprocess.Popen([binary, "-p", str(base), "-c", str(base / "nginx.conf")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait(port, proc, "nginx")
    yield root, f"http://127.0.0.1:{port}"
    proc.kill()
    proc.wait()
