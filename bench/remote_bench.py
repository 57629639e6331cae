"""Loads from object storage against the server's own ceiling and the peers, all in one run.

An S3-compatible server (s3s-fs) runs on 127.0.0.1 over a folder on this machine's disk; a checkpoint of
weight-like bf16 written by safetensors.torch.save_file, and its `.wlpack`, are put in its bucket with
`weightlift upload` (so the server keeps their ETags and does not hash a whole file per GET). The server's files stay
in the page cache for the warm cases: loads over loopback where the network and the disk are out of the way and the
client and the server's serving rate are what is measured; the cold cases (root only) drop the page cache before each
run, so the server reads its disk. Cases, each timed --runs times:

  ceiling        parallel ranged GETs of the whole object by curl (SigV4-signed) into /dev/null, at several
                 concurrencies: the rate at which this server serves this object to a client that does nothing with
                 the bytes (the best concurrency is the ceiling)
  weightlift     `weightlift.load_file("s3://…", device=DEV)` (every tensor on the GPU), the same into host memory,
                 `safe_open` over the URL taking every tensor in file order, the `.wlpack` from the bucket (raw bytes
                 delivered per second, and what crossed the network), and the same file loaded from the local disk
                 (warm) for comparison
  sweep          `weightlift load URL` (the CLI) under request sizes and counts (WEIGHTLIFT_CHUNK_BYTES: objects are
                 read in GETs of 4× the chunk; WEIGHTLIFT_QUEUE_DEPTH, WEIGHTLIFT_THREADS): what the defaults are
                 chosen from
  http           the same file and `.wlpack` from nginx on 127.0.0.1 (far faster than s3s-fs on one host, so the
                 client's own limit shows): curl's ceiling, weightlift, KvikIO's RemoteFile over http://
  cold           the ceiling's best concurrency, weightlift's load_file and the `.wlpack`, each after drop_caches
  cache_dir      load_file with cache_dir: the first load (from the server, writing the local copy), then the next
                 ones (from the copy)
  from_pretrained  weightlift.transformers.from_pretrained("s3://bucket/llama/") of a Llama (~1.1 GB) written by
                 save_pretrained in shards, against load_file of its index URL; every parameter checked
  peers          KvikIO's RemoteFile (the object's bytes into one device buffer), the Run:ai model streamer from
                 s3:// (tensors to the device), and download-then-load (boto3's download_file to the local disk,
                 then safetensors.torch.load_file to the device: the road most users take today), where they import

Every tensor weightlift loads from the bucket, and the peers' bytes, are compared with the local file as
safetensors reads it. The S3 server's output goes to DIR/remote/s3s-fs.log; if it exits midway it is started again
(same files, same port) and the exit is recorded in the JSON (server_exits).

Usage: python bench/remote_bench.py OUTDIR [--dir DIR] [--size 4GiB] [--runs 3] [--device cuda:0]
                                   [--s3s-fs PATH] [--weightlift-bin PATH] [--nginx PATH] [--no-sweep]
Writes OUTDIR/remote.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)

from pack_load_bench import drop_caches  # noqa: E402 - the bench folder is on the path from here

ACCESS_KEY, SECRET_KEY, REGION = "weightlift-bench", "weightlift-bench-secret", "us-east-1"


def say(*a) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def parse_size(s: str) -> int:
    for u, m in {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}.items():
        if s.endswith(u):
            return int(float(s[: -len(u)]) * m)
    return int(s)


def find(given: str | None, name: str) -> str | None:
    for c in (given, os.path.join(ROOT, "bin", name), shutil.which(name),
              os.path.expanduser(f"~/.cargo/bin/{name}"), os.path.join(ROOT, "target", "release", name)):
        if c and os.access(c, os.X_OK):
            return c
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int, proc: subprocess.Popen, what: str) -> str:
    """The server's base URL once it accepts connections on `port` (20 s at most)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return f"http://127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start (exit {proc.poll()})")
            time.sleep(0.05)


def start_server(binary: str, root: Path, port: int | None = None) -> tuple[subprocess.Popen, str]:
    """s3s-fs over `root` on 127.0.0.1 (`port`, or a free one); its output goes to `root`/../s3s-fs.log."""
    (root / "bucket").mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    log = open(root.parent / "s3s-fs.log", "ab")
    proc = subprocess.Popen([binary, "--host", "127.0.0.1", "--port", str(port), "--access-key", ACCESS_KEY,
                             "--secret-key", SECRET_KEY, str(root)], stdout=log, stderr=subprocess.STDOUT)
    return proc, listening(port, proc, "s3s-fs")


class Server:
    """The S3 server of the run, started again (same port, same files) if it has exited, each exit recorded: an
    earlier run's server stopped answering midway and nothing said why."""

    def __init__(self, binary: str, root: Path, result: dict):
        self.binary, self.root, self.result = binary, root, result
        self.proc, self.endpoint = start_server(binary, root)
        self.port = int(self.endpoint.rsplit(":", 1)[1])

    def ensure(self, before: str) -> None:
        if self.proc.poll() is None:
            return
        log = (self.root.parent / "s3s-fs.log").read_bytes()[-2000:].decode(errors="replace")
        self.result.setdefault("server_exits", []).append({"exit": self.proc.returncode, "before": before, "log_tail": log})
        say(f"s3s-fs had exited ({self.proc.returncode}) before {before}; starting it again. Log: {log[-400:]}")
        self.proc, _ = start_server(self.binary, self.root, self.port)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def start_nginx(binary: str, root: Path, work: Path) -> tuple[subprocess.Popen, str]:
    """nginx serving `root` on 127.0.0.1 (sendfile, one worker per CPU up to 16), in the foreground."""
    port = free_port()
    (work / "tmp").mkdir(parents=True, exist_ok=True)
    conf = work / "nginx.conf"
    w = work
    conf.write_text(
        ""
        # As root, nginx's workers would otherwise run as nobody, who cannot read files under /root.
        + ("user root; " if os.geteuid() == 0 else "")
        + f"daemon off; worker_processes {min(16, os.cpu_count() or 1)}; pid {w}/nginx.pid; error_log {w}/error.log;\n"
        "events { worker_connections 1024; }\n"
        f"http {{ access_log off; client_body_temp_path {w}/tmp; proxy_temp_path {w}/tmp; fastcgi_temp_path {w}/tmp;\n"
        f"uwsgi_temp_path {w}/tmp; scgi_temp_path {w}/tmp; sendfile on; tcp_nopush on; keepalive_requests 100000;\n"
        f"server {{ listen 127.0.0.1:{port}; root {root}; }} }}\n")
    proc = subprocess.Popen([binary, "-p", str(w), "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    return proc, listening(port, proc, f"nginx ({w}/error.log)")


def timed(fn, runs: int, before=None) -> dict:
    secs = []
    extra = None
    for _ in range(runs):
        if before:
            before()
        t = time.perf_counter()
        extra = fn()
        secs.append(time.perf_counter() - t)
    return {"seconds": secs, "best_s": min(secs), "median_s": statistics.median(secs), "last": extra}


def rate(nbytes: int, r: dict) -> dict:
    return {"best_gbps": nbytes / r["best_s"] / 1e9, "median_gbps": nbytes / r["median_s"] / 1e9,
            "seconds": [round(s, 4) for s in r["seconds"]]}


def curl_ceiling(url: str, size: int, streams: int, part: int, runs: int, before=None, signed: bool = True) -> dict:
    """The object read by `streams` curl processes at once, each GETting parts of `part` bytes in turn."""
    ranges = [(o, min(size, o + part) - 1) for o in range(0, size, part)]
    per = [rs for rs in (ranges[i::streams] for i in range(streams)) if rs]

    def one_stream(rs):
        common = ["-sS", "--fail", "-o", "/dev/null"]
        if signed:
            common += ["--aws-sigv4", f"aws:amz:{REGION}:s3", "--user", f"{ACCESS_KEY}:{SECRET_KEY}",
                       "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"]
        # One curl per stream, its GETs one after another (--next: each its own range) over one connection, which
        # curl keeps between them.
        args = ["curl"]
        for a, b in rs:
            args += [*common, "-r", f"{a}-{b}", url, "--next"]
        subprocess.run(args[:-1], check=True)

    def once():
        with concurrent.futures.ThreadPoolExecutor(streams) as pool:
            list(pool.map(one_stream, per))

    return rate(size, timed(once, runs, before))


def from_pretrained_case(work: Path, wl: str, dev: str, runs: int, sync, small: bool = False) -> dict:
    """A Llama of random bf16 weights (~1.1 GB, 8 layers of width 2048; ``wlbench.files.save_random_llama``) written
    by save_pretrained in shards of 400 MB with their index, uploaded to s3://bucket/llama/: weightlift.transformers.from_pretrained from the bucket,
    timed, every parameter and buffer equal to transformers' own from_pretrained of the local folder; beside it
    weightlift.load_file of the index URL (the same bytes without building the model)."""
    import torch
    from transformers import AutoModelForCausalLM
    from wlbench.files import save_random_llama

    import weightlift
    import weightlift.transformers as wtr

    folder = work / ("hf-llama-small" if small else "hf-llama")
    if not (folder / "model.safetensors.index.json").exists():
        save_random_llama(str(folder), small, dev)  # small: a check of the script (~10 MB)
    for f in sorted(folder.iterdir()):
        subprocess.run([wl, "upload", str(f), f"s3://bucket/llama/{f.name}"], check=True, stdout=subprocess.DEVNULL)
    weights = sum(t.nbytes for t in weightlift._native.inspect([str(folder / "model.safetensors.index.json")])["tensors"])

    def load():
        m = wtr.from_pretrained(AutoModelForCausalLM, "s3://bucket/llama/", device=dev)
        sync()
        return m
    r = timed(load, runs)
    ref = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16).to(dev)
    want, got = ref.state_dict(), r["last"].state_dict()
    assert want.keys() == got.keys(), "from_pretrained s3://: other parameter names"
    for k, v in want.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), f"from_pretrained s3://: {k} differs"
    del ref, want, got
    index = timed(lambda: weightlift.load_file("s3://bucket/llama/model.safetensors.index.json", device=dev), runs)
    return {**rate(weights, r), "weight_bytes": weights, "files": len(list(folder.iterdir())),
            "load_file_index": rate(weights, index),
            "checked": "every parameter and buffer equal to transformers' from_pretrained of the local folder"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--dir", default=os.path.expanduser("~/.cache/weightlift/bench"))
    ap.add_argument("--size", default="4GiB")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--s3s-fs", dest="s3s_fs")
    ap.add_argument("--weightlift-bin", dest="wl")
    ap.add_argument("--nginx", help="nginx binary for the HTTP cases (default: nginx on PATH or /usr/sbin/nginx)")
    ap.add_argument("--sweep", action=argparse.BooleanOptionalAction, default=True,
                    help="the sweep of GET sizes and counts (default on)")
    args = ap.parse_args()

    import torch
    from safetensors.torch import load_file as st_load_file

    import weightlift
    import weightlift.safetensors as wst
    from pack_load_bench import weights_bf16

    # A run stopped by SIGTERM (a time limit) still writes what it measured, marked incomplete.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.dir) / "remote"
    work.mkdir(parents=True, exist_ok=True)
    dev = args.device if torch.cuda.is_available() else "cpu"
    result: dict = {"size": args.size, "device": dev, "runs": args.runs, "cases": {}, "skipped": {}}

    server_bin, wl = find(args.s3s_fs, "s3s-fs"), find(args.wl, "weightlift")
    if not server_bin or not wl:
        result["error"] = f"needs s3s-fs ({server_bin}) and the weightlift binary ({wl})"
        (out / "remote.json").write_text(json.dumps(result, indent=1))
        say(result["error"])
        return 1

    local = work / f"weights-{args.size}.safetensors"
    packed = work / f"weights-{args.size}.wlpack"
    if not local.exists():
        say("writing", local)
        weights_bf16(local, parse_size(args.size), dev if dev != "cpu" else "cpu")
    if not packed.exists() or packed.stat().st_mtime < local.stat().st_mtime:
        say("packing", packed)
        subprocess.run([wl, "pack", str(local), str(packed)], check=True, stdout=subprocess.DEVNULL)
    size, packed_size = local.stat().st_size, packed.stat().st_size
    result.update(file_bytes=size, pack_bytes=packed_size)

    server_root = work / "s3root"
    shutil.rmtree(server_root, ignore_errors=True)
    (work / "s3s-fs.log").unlink(missing_ok=True)
    server = Server(server_bin, server_root, result)
    endpoint = server.endpoint
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
           "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION, "AWS_ALLOW_HTTP": "true",
           "AWS_EC2_METADATA_DISABLED": "true", "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0"}
    os.environ.update(env)
    url, pack_url = "s3://bucket/model.safetensors", "s3://bucket/model.wlpack"
    http_url = f"{endpoint}/bucket/model.safetensors"
    try:
        for src, dst in ((local, url), (packed, pack_url)):
            t = time.perf_counter()
            subprocess.run([wl, "upload", str(src), dst], check=True, stdout=subprocess.DEVNULL)
            say(f"uploaded {dst} in {time.perf_counter() - t:.1f} s")
        cases = result["cases"]

        # The ceiling first: it also brings the server's copies into the page cache.
        if shutil.which("curl"):
            best = None
            for streams, part in ((8, 16 << 20), (16, 16 << 20), (32, 16 << 20), (16, 64 << 20)):
                name = f"curl-{streams}x{part >> 20}MiB"
                cases[name] = curl_ceiling(http_url, size, streams, part, args.runs)
                say(name, f"{cases[name]['best_gbps']:.2f} GB/s")
                if best is None or cases[name]["best_gbps"] > cases[best]["best_gbps"]:
                    best = name
            result["ceiling"] = {"case": best, "gbps": cases[best]["best_gbps"]}
        else:
            result["skipped"]["ceiling"] = "curl is not installed"

        reference = st_load_file(str(local), device=dev)

        def check(tensors: dict, what: str) -> None:
            assert tensors.keys() == reference.keys(), f"{what}: other tensor names"
            for k, v in reference.items():
                assert torch.equal(tensors[k], v), f"{what}: {k} differs"

        def sync():
            if dev != "cpu":
                torch.cuda.synchronize()

        def kvikio_read(open_file, what: str) -> dict:
            """KvikIO's RemoteFile (opened by `open_file(kvikio)`) read whole into one device buffer, bytes checked."""
            import kvikio

            def read():
                buf = torch.empty(size, dtype=torch.uint8, device=dev)
                with open_file(kvikio) as f:
                    f.read(buf)
                sync()
                return buf
            r = timed(read, args.runs)
            expect = torch.frombuffer(bytearray(local.read_bytes()), dtype=torch.uint8).to(dev)
            assert torch.equal(r["last"], expect), f"{what}: bytes differ"
            return rate(size, r)

        def wl_load(location, device):
            def f():
                t = weightlift.load_file(location, device=device)
                sync()
                return t
            return f

        check(wl_load(url, dev)(), "weightlift load_file s3:// → " + dev)
        r = timed(wl_load(url, dev), args.runs)
        cases["weightlift-s3"] = {**rate(size, r), "network": (weightlift.last_report() or {}).get("network")}
        r = timed(wl_load(url, "cpu"), args.runs)
        check({k: v.to(dev) for k, v in r["last"].items()}, "weightlift load_file s3:// → cpu")
        cases["weightlift-s3-host"] = rate(size, r)
        r = timed(wl_load(str(local), dev), args.runs)
        cases["weightlift-local-warm"] = rate(size, r)

        def wl_safe_open():
            got = {}
            with wst.safe_open(url, framework="pt", device=dev) as f:
                for k in f.keys():
                    got[k] = f.get_tensor(k)
            sync()
            return got
        r = timed(wl_safe_open, args.runs)
        check(r["last"], "weightlift safe_open s3://")
        cases["weightlift-s3-safe_open"] = rate(size, r)

        r = timed(wl_load(pack_url, dev), args.runs)
        check(r["last"], "weightlift load_file of the .wlpack from s3://")
        cases["weightlift-s3-wlpack"] = {**rate(size, r), "network_gbps": packed_size / r["best_s"] / 1e9,
                                         "network": (weightlift.last_report() or {}).get("network")}
        for name in ("weightlift-s3", "weightlift-s3-host", "weightlift-local-warm", "weightlift-s3-safe_open",
                     "weightlift-s3-wlpack"):
            say(name, f"{cases[name]['best_gbps']:.2f} GB/s")
        # Cold: the server's files out of the page cache before each run (root only), so the server reads its disk.
        server.ensure("the cold cases")
        if drop_caches():
            cold = result["cold"] = {}
            best = result.get("ceiling", {}).get("case")
            if best:
                streams, part = best.split("-")[1].split("x")
                cold["ceiling"] = curl_ceiling(http_url, size, int(streams), int(part[:-3]) << 20, args.runs,
                                               before=drop_caches)
            cold["weightlift-s3"] = rate(size, timed(wl_load(url, dev), args.runs, before=drop_caches))
            r = timed(wl_load(pack_url, dev), args.runs, before=drop_caches)
            cold["weightlift-s3-wlpack"] = {**rate(size, r), "network_gbps": packed_size / r["best_s"] / 1e9}
            for name, c in cold.items():
                say("cold", name, f"{c['best_gbps']:.2f} GB/s")
        else:
            result["skipped"]["cold"] = "needs root (drop_caches)"


        # A local copy as the bytes stream (cache_dir): the first load writes it, the next ones read it.
        server.ensure("the cache_dir case")
        cache = work / "object-cache"
        shutil.rmtree(cache, ignore_errors=True)

        def wl_cached():
            t = wst.load_file(url, device=dev, cache_dir=str(cache))
            sync()
            return t
        first = timed(wl_cached, 1)
        check(first["last"], "weightlift load_file s3:// with cache_dir (first: from the server)")
        first_net = (weightlift.last_report() or {}).get("network") or {}
        r = timed(wl_cached, args.runs)
        check(r["last"], "weightlift load_file s3:// with cache_dir (from the local copy)")
        cases["weightlift-s3-cache_dir"] = {"first": rate(size, first), "first_network": first_net, **rate(size, r),
                                            "network": (weightlift.last_report() or {}).get("network")}
        say("weightlift-s3-cache_dir", f"first {cases['weightlift-s3-cache_dir']['first']['best_gbps']:.2f} GB/s,"
            f" then {cases['weightlift-s3-cache_dir']['best_gbps']:.2f} GB/s")
        shutil.rmtree(cache, ignore_errors=True)

        # from_pretrained("s3://…") of a Llama written by save_pretrained (shards and index in the bucket).
        server.ensure("the from_pretrained case")
        try:
            cases["weightlift-s3-from_pretrained"] = from_pretrained_case(work, wl, dev, args.runs, sync,
                                                                          small=size < (1 << 30))
            c = cases["weightlift-s3-from_pretrained"]
            say("weightlift-s3-from_pretrained", f"{c['best_gbps']:.2f} GB/s (load_file of its index:"
                f" {c['load_file_index']['best_gbps']:.2f})")
        except ImportError as e:
            result["skipped"]["weightlift-s3-from_pretrained"] = f"transformers is not importable: {e}"
        server.ensure("the sweep and the peers")

        # The sweep: the CLI under request sizes and counts (each a fresh process: first loads included).
        # The defaults first ({}), then GETs of 4, 16 and 64 MiB (4× the chunk), 1 to 4 in flight per lane.
        sweep = result["sweep"] = []
        configs = [{}] + [{"WEIGHTLIFT_CHUNK_BYTES": c, "WEIGHTLIFT_QUEUE_DEPTH": q, "WEIGHTLIFT_STAGING_BYTES": "2GiB"}
                          for c in ("1MiB", "4MiB", "16MiB") for q in ("1", "2", "4")]
        for config in configs if args.sweep else []:
            e = dict(os.environ, **config)
            best = None
            for _ in range(min(args.runs, 2)):
                p = subprocess.run([wl, "load", "--device", dev, "--json", url], env=e, capture_output=True, text=True)
                if p.returncode != 0:
                    best = {"error": p.stderr.strip()[-300:]}
                    break
                rep = json.loads(p.stdout.strip().splitlines()[-1])
                if best is None or rep["gbps"] > best["gbps"]:
                    best = {"gbps": rep["gbps"], "requests": (rep.get("network") or {}).get("requests")}
            sweep.append({"settings": config, **best})
            say("sweep", config or "defaults", best)

        # Peers.
        try:
            cases["kvikio-RemoteFile"] = kvikio_read(lambda k: k.RemoteFile.open_s3("bucket", "model.safetensors"),
                                                     "KvikIO")
        except Exception as e:  # noqa: BLE001 - a peer that cannot run here is reported, not fatal
            result["skipped"]["kvikio-RemoteFile"] = f"{type(e).__name__}: {e}"
        server.ensure("the Run:ai streamer")
        try:
            from runai_model_streamer import SafetensorsStreamer

            def runai():
                got = {}
                with SafetensorsStreamer() as s:
                    s.stream_files([url], device=dev)
                    for name, t in s.get_tensors():
                        got[name] = t.to(dev, non_blocking=True)
                sync()
                return got
            r = timed(runai, args.runs)
            check(r["last"], "Run:ai streamer")
            cases["runai-streamer"] = rate(size, r)
        except Exception as e:  # noqa: BLE001
            result["skipped"]["runai-streamer"] = f"{type(e).__name__}: {e}"
        server.ensure("boto3")
        try:
            import boto3

            client = boto3.client("s3", endpoint_url=endpoint, region_name=REGION)
            dl = work / "downloaded.safetensors"

            def download_then_load():
                client.download_file("bucket", "model.safetensors", str(dl))
                t = st_load_file(str(dl), device=dev)
                sync()
                return t
            r = timed(download_then_load, args.runs)
            check(r["last"], "boto3 download + safetensors")
            dl.unlink()
            cases["boto3-download+safetensors"] = rate(size, r)
        except Exception as e:  # noqa: BLE001
            result["skipped"]["boto3-download+safetensors"] = f"{type(e).__name__}: {e}"
        # HTTP from nginx (a server much faster than s3s-fs on one host): the client's own limit over loopback.
        nginx_bin = find(args.nginx, "nginx") or find(None, "/usr/sbin/nginx")
        if nginx_bin and shutil.which("curl"):
            www = work / "www"
            www.mkdir(exist_ok=True)
            for src, name in ((local, "model.safetensors"), (packed, "model.wlpack")):
                dst = www / name
                if not dst.exists() or dst.stat().st_size != src.stat().st_size:
                    shutil.copyfile(src, dst)
            nginx, http_base = start_nginx(nginx_bin, www, work / "nginx")
            try:
                h = result["http"] = {}
                hurl, hpack = f"{http_base}/model.safetensors", f"{http_base}/model.wlpack"
                hbest = None
                for streams, part in ((8, 16 << 20), (16, 16 << 20), (32, 16 << 20), (16, 64 << 20)):
                    name = f"curl-{streams}x{part >> 20}MiB"
                    h[name] = curl_ceiling(hurl, size, streams, part, args.runs, signed=False)
                    if hbest is None or h[name]["best_gbps"] > h[hbest]["best_gbps"]:
                        hbest = name
                h["ceiling"] = {"case": hbest, "gbps": h[hbest]["best_gbps"]}
                check(wl_load(hurl, dev)(), "weightlift load_file http:// → " + dev)
                h["weightlift"] = rate(size, timed(wl_load(hurl, dev), args.runs))
                r = timed(wl_load(hpack, dev), args.runs)
                check(r["last"], "weightlift load_file of the .wlpack over http://")
                h["weightlift-wlpack"] = {**rate(size, r), "network_gbps": packed_size / r["best_s"] / 1e9}
                try:
                    h["kvikio-RemoteFile"] = kvikio_read(lambda k: k.RemoteFile.open_http(hurl), "KvikIO over http")
                except Exception as e:  # noqa: BLE001
                    result["skipped"]["http kvikio-RemoteFile"] = f"{type(e).__name__}: {e}"
                for name, c in h.items():
                    if "best_gbps" in c:
                        say("http", name, f"{c['best_gbps']:.2f} GB/s")
            finally:
                # SIGTERM: nginx's master stops its workers (SIGKILL would leave them running, orphaned).
                nginx.terminate()
                try:
                    nginx.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    nginx.kill()
                    nginx.wait()
        else:
            result["skipped"]["http"] = "needs nginx and curl"

        for name in ("kvikio-RemoteFile", "runai-streamer", "boto3-download+safetensors"):
            if name in cases:
                say(name, f"{cases[name]['best_gbps']:.2f} GB/s")
            else:
                say(name, "skipped:", result["skipped"][name][:200])

        peers = [n for n in ("kvikio-RemoteFile", "runai-streamer", "boto3-download+safetensors") if n in cases]
        best_peer = max(peers, key=lambda n: cases[n]["best_gbps"]) if peers else None
        wl_rate = cases["weightlift-s3"]["best_gbps"]
        result["summary"] = {
            "weightlift_s3_gbps": wl_rate,
            "ceiling_gbps": result.get("ceiling", {}).get("gbps"),
            "ratio_to_ceiling": wl_rate / result["ceiling"]["gbps"] if "ceiling" in result else None,
            "best_peer": best_peer,
            "ratio_to_best_peer": wl_rate / cases[best_peer]["best_gbps"] if best_peer else None,
            "wlpack_effective_gbps": cases["weightlift-s3-wlpack"]["best_gbps"],
            "wlpack_over_plain": cases["weightlift-s3-wlpack"]["best_gbps"] / wl_rate,
            "safe_open_over_load_file": cases["weightlift-s3-safe_open"]["best_gbps"] / wl_rate,
        }
        if "weightlift-s3-cache_dir" in cases:
            c = cases["weightlift-s3-cache_dir"]
            result["summary"]["cache_dir"] = {"first_gbps": c["first"]["best_gbps"], "next_gbps": c["best_gbps"],
                                              "first_over_plain": c["first"]["best_gbps"] / wl_rate}
        if "weightlift-s3-from_pretrained" in cases:
            c = cases["weightlift-s3-from_pretrained"]
            result["summary"]["from_pretrained"] = {"gbps": c["best_gbps"],
                                                    "over_load_file_of_its_index": c["best_gbps"] / c["load_file_index"]["best_gbps"]}
        if "http" in result and "weightlift" in result["http"]:
            h = result["http"]
            result["summary"]["http"] = {
                "weightlift_gbps": h["weightlift"]["best_gbps"],
                "ceiling_gbps": h["ceiling"]["gbps"],
                "ratio_to_ceiling": h["weightlift"]["best_gbps"] / h["ceiling"]["gbps"],
                "ratio_to_kvikio": h["weightlift"]["best_gbps"] / h["kvikio-RemoteFile"]["best_gbps"]
                if "kvikio-RemoteFile" in h else None,
                "wlpack_over_plain": h["weightlift-wlpack"]["best_gbps"] / h["weightlift"]["best_gbps"],
            }
        if "cold" in result:
            c = result["cold"]
            result["summary"]["cold"] = {
                "weightlift_s3_gbps": c["weightlift-s3"]["best_gbps"],
                "ratio_to_ceiling": c["weightlift-s3"]["best_gbps"] / c["ceiling"]["best_gbps"] if "ceiling" in c
                else None,
                "wlpack_over_plain": c["weightlift-s3-wlpack"]["best_gbps"] / c["weightlift-s3"]["best_gbps"],
            }
        say("summary", json.dumps(result["summary"]))
    except Exception:
        result["error"] = traceback.format_exc()
        say(result["error"])
    finally:
        if "summary" not in result and "error" not in result:
            result["incomplete"] = "stopped before the end (SIGTERM or interrupt): the cases above are complete"
        server.stop()
        shutil.rmtree(server_root, ignore_errors=True)
        (out / "remote.json").write_text(json.dumps(result, indent=1, default=str))
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
