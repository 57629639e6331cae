"""Loads from a bucket shaped like a cloud's, against curl's ceiling and the peers, all in one run.

A cloud bucket answers each GET after 20-80 ms and gives it ~90 MB/s; a client reaches the link's rate only with
many GETs in flight. The bucket here is nginx (Debian's nginx-light with libnginx-mod-http-echo) serving a folder
path-style (tests/servers/bucket.py renders tests/servers/nginx-bucket.conf): a time to first byte, a cap per GET,
a share of 503 SlowDown answers. With --link-gbps it runs in a network namespace behind a veth pair whose sending
side is capped (tc tbf), standing for the NIC; where the kernel or the rights refuse, the run says so and goes on
over loopback.

Every load runs in a fresh process (what a fleet's process pays; its CUDA context made before the clock starts),
is timed around the call alone, reports its peak resident memory, and is checked after its clock stopped against
a plain read of the local file (dtype, shape and a checksum of every tensor: wlbench.checkpoint).

Cases (each --runs times; best and median):
  shapes     for time to first byte 0, 30, 80 ms x per-GET cap 90 MB/s, none: curl's ceiling (128 parallel ranged
             GETs of 16 MiB, over keep-alive connections, into /dev/null), weightlift's load_file(s3://) at its
             defaults, the Run:ai streamer at its defaults
  main       the cloud's shape (30 ms, 90 MB/s): curl with 16/64/128 GETs; weightlift load_file to the device and
             to host memory, safe_open per key, the .wlpack, a bucket answering 1 % of requests 503; the Run:ai
             streamer at concurrency 8 (its default), 4, 16, 32, 64 (also its published curve's points:
             0.53 / 1.78 / 3.07 GB/s at 4 / 16 / 32 on AWS, for the calibration); KvikIO's RemoteFile at 64
             threads and 16 MiB tasks (its authors' advice for remote files; its default is one thread); boto3's
             download then safetensors' load_file; from_pretrained of a Llama saved by save_pretrained in >= 30
             shards against load_file of its index, and the time to parse its headers in round trips
  http       the same file from nginx without shaping: curl's ceiling against weightlift's http:// load

Usage: python bench/remote_bench.py OUTDIR [--dir DIR] [--size 4GiB] [--runs 3] [--device cuda:0]
           [--weightlift-bin PATH] [--link-gbps 100] [--only main,shapes,http] [--quick]
Writes OUTDIR/remote.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
sys.path.insert(0, os.path.join(ROOT, "tests", "servers"))

import bucket  # noqa: E402 - tests/servers/bucket.py

from wlbench.checkpoint import Reference, open_checkpoint, reference, verify  # noqa: E402
from wlbench.files import make_upstream, parse_size, save_random_llama  # noqa: E402

# Dummy keys: nginx ignores SigV4; the clients still sign.
ENV = {"AWS_ACCESS_KEY_ID": "weightlift-bench", "AWS_SECRET_ACCESS_KEY": "weightlift-bench-secret",
       "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
       "AWS_EC2_METADATA_DISABLED": "true", "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0"}
CLOUD = {"ttfb_s": 0.03, "get_rate": "90m"}
# The Run:ai streamer's published S3 curve (docs/src/benchmarks.md of run-ai/runai-model-streamer, Appendix C:
# Llama-3-8B, 15 GB, g5.12xlarge, streamer 0.6.0, a bucket in the same region): concurrency -> GB/s.
RUNAI_PUBLISHED = {4: 0.53, 16: 1.78, 32: 3.07}


def say(*a) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def stats(seconds: list, nbytes: int) -> dict:
    best, med = min(seconds), statistics.median(seconds)
    return {"best_gbps": nbytes / best / 1e9, "median_gbps": nbytes / med / 1e9,
            "seconds": [round(s, 4) for s in seconds]}


# ---------------------------------------------------------------- the child: one load in a fresh process


def peak_rss_mib() -> float:
    """This process's peak resident memory (VmHWM: per address space, so unlike ru_maxrss it does not start at the
    parent's size at fork)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def child(spec: dict) -> dict:
    """One load (`spec["op"]`), timed around the call, checked after: seconds, peak RSS, what the loader said."""
    import torch

    dev = spec["device"]
    if dev.startswith("cuda"):
        torch.zeros(1, device=dev)
        torch.cuda.synchronize(dev)
    os.environ.update(spec.get("env", {}))
    rss_before = peak_rss_mib()
    op, url = spec["op"], spec["url"]

    def sync():
        if dev.startswith("cuda"):
            torch.cuda.synchronize(dev)

    extra: dict = {}
    if op == "weightlift-from_pretrained":
        # transformers' modelling modules are imported before the clock starts (seconds of imports a serving process
        # pays once): what is timed is reading the model.
        import transformers.modeling_utils  # noqa: F401
        from transformers import AutoModelForCausalLM

        import weightlift.transformers as wtr

        wtr._hooks()
        spec["from_pretrained"] = lambda u, d: wtr.from_pretrained(AutoModelForCausalLM, u, device=d)
    t0 = time.perf_counter()
    if op in ("weightlift", "weightlift-host", "weightlift-wlpack"):
        import weightlift

        loaded = weightlift.load_file(url, device="cpu" if op == "weightlift-host" else dev)
        sync()
        extra["report"] = weightlift.last_report()
    elif op == "weightlift-safe_open":
        import weightlift
        import weightlift.safetensors as wst

        loaded = {}
        with wst.safe_open(url, framework="pt", device=dev) as f:
            for k in f.keys():
                loaded[k] = f.get_tensor(k)
        sync()
    elif op == "weightlift-from_pretrained":
        model = spec["from_pretrained"](url, dev)
        sync()
        loaded = None
        extra["parameters"] = sum(p.numel() for p in model.parameters())
    elif op == "weightlift-parse":
        import weightlift

        ckpt = weightlift._native.Checkpoint([url])
        loaded = None
        extra["tensors"] = len(ckpt.files)
    elif op == "runai":
        from runai_model_streamer import SafetensorsStreamer

        loaded = {}
        with SafetensorsStreamer() as s:
            s.stream_file(url, device=dev)
            for name, t in s.get_tensors():
                loaded[name] = t.to(dev) if str(t.device) != dev else t
        sync()
    elif op == "kvikio":
        import kvikio

        with kvikio.RemoteFile.open_http(url, nbytes=spec["nbytes"]) as f:
            buf = torch.empty(spec["nbytes"], dtype=torch.uint8, device=dev)
            f.read(buf)
        sync()
        from wlbench.checkpoint import RawBytes

        loaded = RawBytes(buf, 0)
    elif op == "boto3":
        import boto3
        from safetensors.torch import load_file as st_load_file

        client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
        bucket_name, key = url[len("s3://"):].split("/", 1)
        client.download_file(bucket_name, key, spec["download_to"])
        loaded = st_load_file(spec["download_to"], device=dev)
        sync()
    else:
        raise ValueError(f"no op {op}")
    seconds = time.perf_counter() - t0
    rss_peak = peak_rss_mib()
    if spec.get("reference") and loaded is not None:
        ref = Reference.from_json(json.loads(Path(spec["reference"]).read_text()))
        verify(loaded, ref, open_checkpoint(spec["local"]), dev)
        extra["checked"] = True
    if op == "boto3":
        os.unlink(spec["download_to"])
    return {"seconds": seconds, "rss_before_mib": rss_before, "rss_peak_mib": rss_peak, **extra}


def run_child(spec: dict, env: dict, timeout: int = 900) -> dict:
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)], env=env,
                       capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"{spec['op']} exited {p.returncode}: {p.stderr.strip()[-800:]}")
    return json.loads(lines[-1])


def runs_of(spec: dict, env: dict, runs: int, nbytes: int) -> dict:
    out = [run_child(spec, env) for _ in range(runs)]
    r = stats([o["seconds"] for o in out], nbytes)
    r["rss_peak_mib"] = max(o["rss_peak_mib"] - o["rss_before_mib"] for o in out)
    last = out[-1]
    if "report" in last:
        net = (last["report"] or {}).get("network") or {}
        r["network"] = {k: net.get(k) for k in ("requests", "heads", "retries", "throttled", "first_byte_secs")}
        r["gets"] = {k: (net.get("gets") or {}).get(k) for k in ("setting", "phase", "start", "last", "peak_in_flight",
                                                                   "max", "why")}
        r["staging_bytes"] = (last["report"] or {}).get("peak_staging_bytes")
    for k in ("parameters", "checked"):
        if k in last:
            r[k] = last[k]
    return r


# ---------------------------------------------------------------- ceilings


def curl_rate(url: str, size: int, streams: int, part: int, runs: int) -> dict:
    """The object read by `streams` curl processes at once, each GETting its share of `part`-byte ranges in turn
    over one keep-alive connection, into /dev/null."""
    ranges = [(o, min(size, o + part) - 1) for o in range(0, size, part)]
    per = [rs for rs in (ranges[i::streams] for i in range(streams)) if rs]

    def one(rs):
        args = ["curl"]
        for a, b in rs:
            args += ["-sS", "--fail", "-o", "/dev/null", "-r", f"{a}-{b}", url, "--next"]
        subprocess.run(args[:-1], check=True)

    secs = []
    for _ in range(runs):
        t = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(len(per)) as pool:
            list(pool.map(one, per))
        secs.append(time.perf_counter() - t)
    return {**stats(secs, size), "streams": len(per), "part_mib": part >> 20}


# ---------------------------------------------------------------- the run


class Run:
    def __init__(self, args, out: Path):
        self.args, self.out = args, out
        self.result: dict = {"args": vars(args), "cases": {}, "skipped": {}}
        self.work = Path(args.dir) / "remote"
        self.root = self.work / "root"
        (self.root / "bucket").mkdir(parents=True, exist_ok=True)
        self.ref_file = self.work / "reference.json"

    def bucket(self, shape: dict) -> "bucket.Bucket":
        link = self.args.link_gbps
        try:
            b = bucket.Bucket(self.root, bucket.Shape(**shape), workers=min(16, os.cpu_count() or 1),
                              link_gbps=link)
            self.result.setdefault("link", {"gbps": link, "how": "tc tbf on a veth pair into a network namespace"}
                                   if link else {"gbps": None, "how": "loopback, uncapped"})
            return b
        except bucket.LinkCapRefused as e:
            self.result["link"] = {"gbps": None, "refused": str(e), "how": "loopback, uncapped"}
            self.args.link_gbps = None
            say("no link cap:", e)
            return bucket.Bucket(self.root, bucket.Shape(**shape), workers=min(16, os.cpu_count() or 1))

    def env(self, b: "bucket.Bucket", **more) -> dict:
        return {**os.environ, **ENV, "AWS_ENDPOINT_URL": b.base, **more}

    def case(self, group: dict, name: str, fn) -> None:
        try:
            group[name] = fn()
            say(name, f"{group[name]['best_gbps']:.3f} GB/s (median {group[name]['median_gbps']:.3f})")
        except Exception as e:  # noqa: BLE001 - one case failing is reported, the run goes on
            self.result["skipped"][name] = f"{type(e).__name__}: {str(e)[-600:]}"
            say(name, "failed:", self.result["skipped"][name][:300])
        # Written after every case: a run stopped by a time limit keeps what it measured.
        (self.out / "remote.json").write_text(json.dumps({**self.result, "incomplete": "written mid-run"}, indent=1,
                                                         default=str))

    def spec(self, op: str, url: str, local: Path, **more) -> dict:
        return {"op": op, "url": url, "device": self.dev, "reference": str(self.ref_file), "local": str(local),
                **more}


def prepare_files(run: Run, size: int) -> tuple:
    import torch

    local = run.work / f"model-{run.args.size}.safetensors"
    make_upstream(str(local), size, seed=5)
    shutil.copyfile(local, run.root / "bucket" / "model.safetensors")
    wl = run.args.weightlift_bin
    packed = run.work / f"model-{run.args.size}.wlpack"
    if not packed.exists() or packed.stat().st_mtime < local.stat().st_mtime:
        subprocess.run([wl, "pack", str(local), str(packed)], check=True, stdout=subprocess.DEVNULL)
    shutil.copyfile(packed, run.root / "bucket" / "model.wlpack")
    ckpt = open_checkpoint(str(local))
    run.ref_file.write_text(json.dumps(reference(ckpt, run.check_dev).to_json()))
    llama = run.work / "llama-shards"
    if not (llama / "model.safetensors.index.json").exists():
        # >= 30 shards, as large models are published.
        save_random_llama(str(llama), small=run.args.quick, device="cpu", shard_size="32MB")
    dst = run.root / "bucket" / "llama"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(llama, dst)
    del torch
    return local, packed, llama


def shapes_sweep(run: Run, local: Path, size: int) -> None:
    sweep = run.result["shapes"] = []
    for ttfb in (0.0, 0.03, 0.08):
        for rate in ("90m", "0"):
            b = run.bucket({"ttfb_s": ttfb, "get_rate": rate})
            try:
                row: dict = {"ttfb_ms": ttfb * 1e3, "get_cap": rate if rate != "0" else "none"}
                url_http, env = b.url("bucket/model.safetensors"), run.env(b)
                run.case(row, "curl-128x16MiB", lambda: curl_rate(url_http, size, 128, 16 << 20, run.args.runs))
                run.case(row, "weightlift", lambda: runs_of(run.spec("weightlift", "s3://bucket/model.safetensors",
                                                                     local), env, run.args.runs, size))
                run.case(row, "runai-default", lambda: runs_of(run.spec("runai", "s3://bucket/model.safetensors",
                                                                        local), env, run.args.runs, size))
                if "curl-128x16MiB" in row and "weightlift" in row:
                    row["weightlift_over_curl"] = row["weightlift"]["best_gbps"] / row["curl-128x16MiB"]["best_gbps"]
                if "runai-default" in row and "weightlift" in row:
                    row["weightlift_over_runai"] = row["weightlift"]["best_gbps"] / row["runai-default"]["best_gbps"]
                sweep.append(row)
            finally:
                b.stop()


def main_shape(run: Run, local: Path, packed: Path, llama: Path, size: int) -> None:
    m = run.result["main"] = {"shape": CLOUD}
    b = run.bucket(CLOUD)
    try:
        env, url = run.env(b), "s3://bucket/model.safetensors"
        http = b.url("bucket/model.safetensors")
        for streams in (16, 64, 128):
            run.case(m, f"curl-{streams}x16MiB", lambda: curl_rate(http, size, streams, 16 << 20, run.args.runs))
        runs = run.args.runs
        run.case(m, "weightlift", lambda: runs_of(run.spec("weightlift", url, local), env, runs, size))
        run.case(m, "weightlift-host", lambda: runs_of(run.spec("weightlift-host", url, local), env, runs, size))
        run.case(m, "weightlift-safe_open", lambda: runs_of(run.spec("weightlift-safe_open", url, local), env, runs,
                                                            size))
        run.case(m, "weightlift-wlpack", lambda: runs_of(run.spec("weightlift-wlpack", "s3://bucket/model.wlpack",
                                                                  local), env, runs, size))
        if "weightlift-wlpack" in m:
            m["weightlift-wlpack"]["network_gbps"] = packed.stat().st_size / min(m["weightlift-wlpack"]["seconds"]) / 1e9
        for conc in (8, 4, 16, 32, 64):
            e = run.env(b, RUNAI_STREAMER_OBJ_CONCURRENCY=str(conc))
            name = "runai-default" if conc == 8 else f"runai-{conc}"
            run.case(m, name, lambda: runs_of(run.spec("runai", url, local), e, runs, size))
        m["runai_calibration"] = {str(c): {"published_gbps": g, "here_gbps": m.get(f"runai-{c}", {}).get("best_gbps")}
                                  for c, g in RUNAI_PUBLISHED.items()}
        if run.dev.startswith("cuda"):
            e = run.env(b, KVIKIO_NTHREADS="64", KVIKIO_TASK_SIZE=str(16 << 20))
            run.case(m, "kvikio-64x16MiB", lambda: runs_of(run.spec("kvikio", http, local, nbytes=size), e, runs,
                                                           size))
        else:
            run.result["skipped"]["kvikio-64x16MiB"] = "KvikIO's RemoteFile reads into device buffers here: no GPU"
        dl = str(run.work / "downloaded.safetensors")
        run.case(m, "boto3-download+safetensors", lambda: runs_of(run.spec("boto3", url, local, download_to=dl), env,
                                                                  runs, size))
        # Sharded: the model as save_pretrained wrote it, >= 30 shards.
        weights = sum(os.path.getsize(f) for f in llama.glob("*.safetensors"))
        m["llama"] = {"shards": len(list(llama.glob("*.safetensors"))), "bytes": weights}
        index = "s3://bucket/llama/model.safetensors.index.json"
        run.case(m, "weightlift-index", lambda: runs_of({**run.spec("weightlift", index, local), "reference": None},
                                                        env, runs, weights))
        run.case(m, "weightlift-from_pretrained", lambda: runs_of(
            {**run.spec("weightlift-from_pretrained", "s3://bucket/llama/", local), "reference": None}, env, runs,
            weights))
        try:
            parse = [run_child({**run.spec("weightlift-parse", index, local), "reference": None}, env)["seconds"]
                     for _ in range(runs)]
            m["llama"]["parse_seconds"] = parse
            m["llama"]["parse_round_trips"] = min(parse) / CLOUD["ttfb_s"]
        except Exception as e:  # noqa: BLE001
            run.result["skipped"]["parse"] = str(e)[-300:]
    finally:
        b.stop()
    # 1 % of requests answered 503 SlowDown (without Retry-After, as S3 answers).
    b = run.bucket({**CLOUD, "slowdown": 0.01})
    try:
        run.case(m, "weightlift-1pct-503", lambda: runs_of(run.spec("weightlift", "s3://bucket/model.safetensors",
                                                                    local), run.env(b), run.args.runs, size))
    finally:
        b.stop()


def plain_http(run: Run, local: Path, size: int) -> None:
    h = run.result["http"] = {}
    b = run.bucket({})
    try:
        url = b.url("bucket/model.safetensors")
        for streams, part in ((16, 16 << 20), (64, 16 << 20), (16, 64 << 20)):
            run.case(h, f"curl-{streams}x{part >> 20}MiB", lambda: curl_rate(url, size, streams, part, run.args.runs))
        run.case(h, "weightlift", lambda: runs_of(run.spec("weightlift", url, local), run.env(b), run.args.runs, size))
    finally:
        b.stop()


def summary(run: Run) -> dict:
    r = run.result
    s: dict = {}
    m = r.get("main", {})

    def g(d, k):
        return d.get(k, {}).get("best_gbps")

    if m:
        wl, curl = g(m, "weightlift"), max(filter(None, (g(m, f"curl-{n}x16MiB") for n in (16, 64, 128))),
                                           default=None)
        runai = [g(m, k) for k in m if k.startswith("runai-") and isinstance(m[k], dict) and "best_gbps" in m[k]]
        s["main"] = {
            "weightlift_gbps": wl, "curl_128_gbps": g(m, "curl-128x16MiB"), "best_curl_gbps": curl,
            "over_curl_128": wl / g(m, "curl-128x16MiB") if wl and g(m, "curl-128x16MiB") else None,
            "over_runai_default": wl / g(m, "runai-default") if wl and g(m, "runai-default") else None,
            "over_runai_best": wl / max(runai) if wl and runai else None,
            "over_kvikio": wl / g(m, "kvikio-64x16MiB") if wl and g(m, "kvikio-64x16MiB") else None,
            "over_boto3": wl / g(m, "boto3-download+safetensors") if wl and g(m, "boto3-download+safetensors")
            else None,
            "wlpack_over_plain": g(m, "weightlift-wlpack") / wl if wl and g(m, "weightlift-wlpack") else None,
            "slowdown_1pct_over_clean": g(m, "weightlift-1pct-503") / wl if wl and g(m, "weightlift-1pct-503")
            else None,
            "from_pretrained_over_index": g(m, "weightlift-from_pretrained") / g(m, "weightlift-index")
            if g(m, "weightlift-from_pretrained") and g(m, "weightlift-index") else None,
            "parse_round_trips": m.get("llama", {}).get("parse_round_trips"),
            "peak_rss_mib": m.get("weightlift", {}).get("rss_peak_mib"),
        }
    h = r.get("http", {})
    if h.get("weightlift"):
        curl = max(v["best_gbps"] for k, v in h.items() if k.startswith("curl"))
        s["http"] = {"weightlift_gbps": g(h, "weightlift"), "curl_gbps": curl, "over_curl": g(h, "weightlift") / curl}
    return s


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        try:
            print(json.dumps(child(json.loads(sys.argv[2])), default=str))
            return 0
        except Exception:  # noqa: BLE001 - the parent reports it
            print(traceback.format_exc(), file=sys.stderr)
            return 1
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--dir", default=os.path.expanduser("~/.cache/weightlift/bench"))
    ap.add_argument("--size", default="4GiB")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--weightlift-bin", default=shutil.which("weightlift") or os.path.join(ROOT, "target/release/weightlift"))
    ap.add_argument("--link-gbps", type=float, help="cap the link to the bucket (tc tbf in a network namespace)")
    ap.add_argument("--only", default="main,shapes,http", help="which groups: main, shapes, http")
    ap.add_argument("--quick", action="store_true", help="a small Llama for the sharded case (a check of the script)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run = Run(args, out)
    run.dev = args.device if torch.cuda.is_available() else "cpu"
    run.check_dev = run.dev
    run.result["device"] = run.dev
    why = bucket.missing()
    if why:
        run.result["error"] = why
        (out / "remote.json").write_text(json.dumps(run.result, indent=1))
        return 1
    try:
        size_arg = parse_size(args.size)
        local, packed, llama = prepare_files(run, size_arg)
        size = local.stat().st_size
        run.result.update(file_bytes=size, pack_bytes=packed.stat().st_size)
        groups = args.only.split(",")
        if "main" in groups:
            main_shape(run, local, packed, llama, size)
        if "http" in groups:
            plain_http(run, local, size)
        if "shapes" in groups:
            shapes_sweep(run, local, size)
        run.result["summary"] = summary(run)
        say("summary", json.dumps(run.result["summary"]))
    except Exception:  # noqa: BLE001
        run.result["error"] = traceback.format_exc()
        say(run.result["error"])
    finally:
        if "summary" not in run.result and "error" not in run.result:
            run.result["incomplete"] = "stopped before the end (SIGTERM or interrupt): the cases above are complete"
        (out / "remote.json").write_text(json.dumps(run.result, indent=1, default=str))
    return 1 if "error" in run.result else 0


if __name__ == "__main__":
    sys.exit(main())
