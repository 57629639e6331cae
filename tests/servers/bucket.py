"""A bucket shaped like a cloud's, for the object-storage tests and bench/remote_bench.py: nginx (Debian's
nginx-light and libnginx-mod-http-echo) serving a folder path-style from ``nginx-bucket.conf`` beside this file, with a
time to first byte, a cap per GET, a share of 503 SlowDown answers and a request-rate limit (see the template).

``Bucket(root, Shape(...))`` starts it on 127.0.0.1, or, with ``link_gbps``, inside a network namespace of its own
behind a veth pair whose sending side is capped by a token bucket (``tc qdisc ... tbf``), standing for the NIC of a
machine reading a cloud bucket; that needs root, iproute2 and the kernel's tbf, and says why where it cannot.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

TEMPLATE = Path(__file__).with_name("nginx-bucket.conf")
ECHO_MODULES = ("/usr/lib/nginx/modules/ngx_http_echo_module.so", "/usr/lib64/nginx/modules/ngx_http_echo_module.so")


@dataclasses.dataclass(frozen=True)
class Shape:
    """What the bucket does to each request."""

    ttfb_s: float = 0.0
    """Seconds before each answer's first byte."""
    get_rate: str = "0"
    """nginx's limit_rate of each GET's body ("90m" is about a cloud bucket's 85-90 MB/s; "0" for none)."""
    slowdown: float = 0.0
    """Share of requests answered 503 SlowDown (0 to 1)."""
    retry_after_s: "int | None" = None
    """The Retry-After of a SlowDown answer (None: no header, as S3 sends)."""
    req_rate: str = "1000000r/s"
    """Requests a second before the limit answers 503 SlowDown."""
    req_burst: int = 1000000
    """Requests over the rate let through at once."""

    def describe(self) -> dict:
        return dataclasses.asdict(self)


def nginx_binary() -> str | None:
    """nginx: ``WEIGHTLIFT_NGINX`` (a bundle's copy), else on PATH or in /usr/sbin."""
    given = os.environ.get("WEIGHTLIFT_NGINX")
    if given:
        return given if os.access(given, os.X_OK) else None
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


def echo_module() -> str | None:
    """The echo module: ``WEIGHTLIFT_NGINX_ECHO`` (a bundle's copy, built for the same nginx), else Debian's."""
    given = os.environ.get("WEIGHTLIFT_NGINX_ECHO")
    if given:
        return given if os.path.exists(given) else None
    return next((m for m in ECHO_MODULES if os.path.exists(m)), None)


def missing() -> str | None:
    """Why the bucket cannot be started here, or None."""
    if not nginx_binary():
        return "no nginx here (apt-get install nginx-light)"
    if not echo_module():
        return "no nginx echo module here (apt-get install libnginx-mod-http-echo)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def render(shape: Shape, *, root: Path, prefix: Path, port: int, workers: int = 1, access_log: Path | None = None,
           listen: str = "127.0.0.1") -> str:
    """The nginx configuration for `shape` over `root` (which holds the bucket folders)."""
    text = TEMPLATE.read_text()
    drop = ["@SLOWDOWN@"] if shape.slowdown <= 0 else []
    drop += ["@RETRY_AFTER@"] if shape.retry_after_s is None else []
    text = "\n".join(line for line in text.splitlines() if not any(d in line for d in drop)) + "\n"
    values = {
        # As root, nginx's workers would otherwise run as nobody, who may not read the files.
        "USER": "user root;" if os.geteuid() == 0 else "",
        "ECHO_MODULE": echo_module() or "ngx_http_echo_module.so",
        "WORKERS": str(workers),
        "PREFIX": str(prefix),
        "ACCESS_LOG": f"{access_log} bucket" if access_log else "off",
        "TTFB_S": f"{shape.ttfb_s:.3f}",
        "RATE": shape.get_rate,
        "SLOWDOWN": f"{shape.slowdown * 100:.2f}%",
        "RETRY_AFTER": str(shape.retry_after_s or 0),
        "REQ_RATE": shape.req_rate,
        "REQ_BURST": str(shape.req_burst),
        "PORT": str(port),
        "ROOT": str(root),
    }
    for k, v in values.items():
        text = text.replace(f"@{k}@", v)
    text = text.replace("listen 127.0.0.1:", f"listen {listen}:")
    return text


class LinkCapRefused(RuntimeError):
    """The network namespace or the link cap could not be made here (the reason is the message)."""


class Bucket:
    """nginx serving `root` shaped as `shape`; ``base`` is its URL (http://HOST:PORT). A context manager."""

    def __init__(self, root: Path, shape: Shape = Shape(), *, workers: int = 1, access_log: bool = False,
                 link_gbps: float | None = None):
        why = missing()
        if why:
            raise FileNotFoundError(why)
        self.root, self.shape, self.link_gbps = Path(root), shape, link_gbps
        self.prefix = Path(tempfile.mkdtemp(prefix="wl-bucket-"))
        (self.prefix / "tmp").mkdir()
        self.log = self.prefix / "access.log" if access_log else None
        self.netns = None
        host = "127.0.0.1"
        if link_gbps:
            host = self._make_netns(link_gbps)
        self.port = free_port()
        conf = self.prefix / "nginx.conf"
        conf.write_text(render(shape, root=self.root, prefix=self.prefix, port=self.port, workers=workers,
                               access_log=self.log, listen=host))
        cmd = [nginx_binary(), "-p", str(self.prefix), "-c", str(conf)]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.base = f"http://{host}:{self.port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection((host, self.port), timeout=0.2).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    err = self.proc.stderr.read().decode(errors="replace") if self.proc.poll() is not None else ""
                    self.stop()
                    raise RuntimeError(f"nginx did not start ({self.prefix}/error.log): {err.strip()}")
                time.sleep(0.02)

    def _make_netns(self, gbps: float) -> str:
        """A namespace holding the server's end of a veth pair, its sending side capped at `gbps`; its address."""
        if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
            raise LinkCapRefused("a capped link needs root, ip and tc (iproute2)")
        ns = f"wlb{os.getpid() % 100000}"
        a, b = f"{ns}a", f"{ns}b"
        steps = [
            ["ip", "netns", "add", ns],
            ["ip", "link", "add", a, "type", "veth", "peer", "name", b],
            ["ip", "link", "set", b, "netns", ns],
            ["ip", "addr", "add", "10.231.7.1/30", "dev", a],
            ["ip", "link", "set", a, "up"],
            ["ip", "netns", "exec", ns, "ip", "addr", "add", "10.231.7.2/30", "dev", b],
            ["ip", "netns", "exec", ns, "ip", "link", "set", b, "up"],
            ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"],
            # The token bucket holds about 1 ms of traffic at the cap (at least 1 MiB): a NIC's rate, not a queue.
            ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", b, "root", "tbf", "rate", f"{gbps * 1000:.0f}mbit",
             "burst", str(max(1 << 20, int(gbps * 1e9 / 8 / 1000))), "latency", "20ms"],
        ]
        self.netns, self._veth = ns, a
        for step in steps:
            r = subprocess.run(step, capture_output=True, text=True)
            if r.returncode != 0:
                self._drop_netns()
                raise LinkCapRefused(f"{' '.join(step)}: {r.stderr.strip()}")
        return "10.231.7.2"

    def _drop_netns(self) -> None:
        if self.netns:
            subprocess.run(["ip", "link", "del", self._veth], capture_output=True)
            subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
            self.netns = None

    def url(self, key: str) -> str:
        """The http:// URL of `key` (BUCKET/NAME)."""
        return f"{self.base}/{key}"

    def requests(self) -> list[tuple[str, str, int]]:
        """(method, path, status) of every request served so far (needs ``access_log=True``)."""
        if not self.log or not self.log.exists():
            return []
        out = []
        for line in self.log.read_text().splitlines():
            method, path, *rest = line.split(" ")
            status = next((int(w[7:]) for w in rest if w.startswith("status=")), 0)
            out.append((method, path, status))
        return out

    def stop(self) -> None:
        if getattr(self, "proc", None) and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._drop_netns()
        shutil.rmtree(self.prefix, ignore_errors=True)

    def __enter__(self) -> "Bucket":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
