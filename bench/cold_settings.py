"""Cold loads under several engine settings, in rotated rounds: what the default's buffered reads (kept in the page
cache for the next process) cost against O_DIRECT and deeper queues on the disk at hand.

The peers that beat weightlift cold on the H100 of 2026-12-07 (InstantTensor 2.69 GB/s, fastsafetensors 2.67,
weightlift 2.38, the 16-buffered-reader ceiling 2.39) read with O_DIRECT and many requests in flight (InstantTensor:
io_depth 512 of 8 MiB). This measures whether weightlift's own O_DIRECT path (`--cache bypass`) and deeper queues
reach them on the same disk, each load in a fresh process (`weightlift load --json`), the page cache dropped before
each, the settings' order rotated per round so that no setting always runs first.

Usage: python bench/cold_settings.py OUTDIR [--dir DIR] [--size 4GiB] [--rounds 3] [--device cuda:0]
           [--weightlift-bin PATH]
Writes OUTDIR/cold-settings.json. Needs root (drop_caches).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)

from wlbench.files import make_upstream, parse_size  # noqa: E402
from wlbench.pagecache import cold_unavailable, drop_caches  # noqa: E402

# name -> environment of the load (the CLI reads every setting from WEIGHTLIFT_*).
SETTINGS = {
    "default": {},
    # A lane's reads in flight are capped by its staging slots (min(2 x queue depth, staging per lane / read size)):
    # each depth comes with staging for that many 16 MiB cold reads per lane of 16 (1 GiB for 4, 2 GiB for 8).
    "queue-depth-4": {"WEIGHTLIFT_QUEUE_DEPTH": "4", "WEIGHTLIFT_STAGING_BYTES": "1GiB"},
    "bypass": {"WEIGHTLIFT_PAGE_CACHE": "bypass"},
    "bypass-queue-depth-4": {"WEIGHTLIFT_PAGE_CACHE": "bypass", "WEIGHTLIFT_QUEUE_DEPTH": "4",
                             "WEIGHTLIFT_STAGING_BYTES": "1GiB"},
    "bypass-queue-depth-8": {"WEIGHTLIFT_PAGE_CACHE": "bypass", "WEIGHTLIFT_QUEUE_DEPTH": "8",
                             "WEIGHTLIFT_STAGING_BYTES": "2GiB"},
    # Larger reads with far more in flight: cold reads are four chunks (32 MiB here), 4 slots a lane in 2 GiB of
    # staging, with O_DIRECT and buffered.
    "bypass-8MiB-queue-depth-8": {"WEIGHTLIFT_PAGE_CACHE": "bypass", "WEIGHTLIFT_QUEUE_DEPTH": "8",
                                  "WEIGHTLIFT_CHUNK_BYTES": "8MiB", "WEIGHTLIFT_STAGING_BYTES": "2GiB"},
    "8MiB-queue-depth-8": {"WEIGHTLIFT_QUEUE_DEPTH": "8", "WEIGHTLIFT_CHUNK_BYTES": "8MiB",
                           "WEIGHTLIFT_STAGING_BYTES": "2GiB"},
    # fastsafetensors 0.5.0's shape: 512 KiB O_DIRECT reads from one cursor in file order, two slots a lane.
    "bypass-512KiB": {"WEIGHTLIFT_PAGE_CACHE": "bypass", "WEIGHTLIFT_CHUNK_BYTES": "128KiB"},
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--dir", default=os.path.expanduser("~/.cache/weightlift/bench"))
    ap.add_argument("--size", default="4GiB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--weightlift-bin", default=shutil.which("weightlift"))
    a = ap.parse_args()
    why = cold_unavailable("drop_caches")
    if why:
        print(f"cold_settings: {why}", file=sys.stderr)
        return 2
    if not a.weightlift_bin:
        print("cold_settings: no weightlift binary (--weightlift-bin)", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.dir, exist_ok=True)
    path = os.path.join(a.dir, f"upstream-{a.size}.safetensors")
    make_upstream(path, parse_size(a.size), 0)
    names = list(SETTINGS)
    runs: dict = {n: [] for n in names}
    for r in range(a.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            drop_caches([path], "drop_caches")
            env = {**os.environ, **SETTINGS[name]}
            t = time.perf_counter()
            proc = subprocess.run([a.weightlift_bin, "load", path, "--device", a.device, "--json"], env=env,
                                  capture_output=True, text=True)
            wall = time.perf_counter() - t
            if proc.returncode != 0:
                runs[name].append({"error": proc.stderr.strip()[-500:]})
                print(f"round {r} {name}: failed: {proc.stderr.strip()[-200:]}", flush=True)
                continue
            rep = json.loads(proc.stdout)
            keep = {k: rep.get(k) for k in ("gbps", "seconds", "direct_bytes", "buffered_bytes", "lanes",
                                            "queue_depth", "cache", "direct_policy")}
            runs[name].append({**keep, "process_wall_s": wall})
            print(f"round {r} {name}: {rep.get('gbps'):.3f} GB/s (direct {rep.get('direct_bytes')}, "
                  f"queue depth {rep.get('queue_depth')})", flush=True)
    summary = {}
    for name in names:
        rates = [x["gbps"] for x in runs[name] if "gbps" in x]
        if rates:
            summary[name] = {"best_gbps": max(rates), "median_gbps": statistics.median(rates), "runs_gbps": rates}
    result = {"script": "bench/cold_settings.py", "argv": sys.argv[1:], "file": path,
              "file_bytes": os.path.getsize(path), "settings": SETTINGS, "runs": runs, "summary": summary}
    with open(os.path.join(a.out, "cold-settings.json"), "w") as f:
        json.dump(result, f, indent=1)
    for name, s in summary.items():
        print(f"{name}: {s['best_gbps']:.3f} best, {s['median_gbps']:.3f} median", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
