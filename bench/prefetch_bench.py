"""safetensors 0.9's prefetch against weightlift's, and against weightlift's whole-file load, in one run.

A checkpoint written by safetensors.torch.save_file (bf16, llama-shaped; --size), warm in the page cache. Timed,
each --runs times in this process (best and median), onto --device:

  weightlift-load_file       weightlift.load_file(path, device)
  weightlift-prefetch        weightlift.safe_open(path).prefetch(device=...), every tensor taken by iterating it
  upstream-prefetch-T-B      safetensors' own safe_open(path, backend=B).prefetch(device=..., threads=T), iterated,
                             for T in 8, 16 and B in mmap, pread (its authors' settings; needs safetensors >= 0.9)

After its clock stopped, each load is checked against a plain read of the file (dtype, shape and a checksum of every
tensor: wlbench.checkpoint). Writes OUT/prefetch.json with each case and the ratios the goals name.

Usage: python bench/prefetch_bench.py OUT [--dir DIR] [--size 4GiB] [--runs 3] [--device cuda:0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)

from wlbench.checkpoint import open_checkpoint, reference, verify  # noqa: E402
from wlbench.files import make_upstream, parse_size  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--dir", default=os.path.expanduser("~/.cache/weightlift/bench"))
    ap.add_argument("--size", default="4GiB")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--device", default="cuda:0")
    args = ap.parse_args()
    import torch

    import weightlift

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.dir, f"prefetch-{args.size}.safetensors")
    make_upstream(path, parse_size(args.size), seed=9)
    ckpt = open_checkpoint(path)
    ref = reference(ckpt, args.device)
    nbytes = ckpt.tensor_bytes
    dev = args.device
    result: dict = {"file": ckpt.describe(), "device": dev, "runs": args.runs, "cases": {}, "skipped": {}}

    def sync():
        torch.cuda.synchronize(dev)

    def timed(name, fn):
        secs, last = [], None
        try:
            for _ in range(args.runs):
                last = None
                torch.cuda.empty_cache()
                t = time.perf_counter()
                last = fn()
                sync()
                secs.append(time.perf_counter() - t)
            verify(last, ref, ckpt, dev)
            best, med = min(secs), statistics.median(secs)
            result["cases"][name] = {"best_gbps": nbytes / best / 1e9, "median_gbps": nbytes / med / 1e9,
                                     "seconds": [round(s, 4) for s in secs], "checked": True}
            print(f"{name}: {nbytes / best / 1e9:.2f} GB/s best, {nbytes / med / 1e9:.2f} median", flush=True)
        except Exception as e:  # noqa: BLE001 - a case that cannot run here is reported
            result["skipped"][name] = f"{type(e).__name__}: {str(e)[-400:]}"
            print(f"{name}: skipped: {result['skipped'][name][:200]}", flush=True)

    with open(path, "rb") as f:  # warm: the file in the page cache
        while f.read(64 << 20):
            pass
    timed("weightlift-load_file", lambda: weightlift.load_file(path, device=dev))

    def wl_prefetch():
        with weightlift.safe_open(path, framework="pt") as f, f.prefetch(device=dev) as loader:
            return dict(loader)
    timed("weightlift-prefetch", wl_prefetch)
    try:
        from safetensors import PrefetchLoader  # noqa: F401 - present from safetensors 0.9 on
        from safetensors import safe_open as upstream_open

        for threads in (8, 16):
            for backend in ("mmap", "pread"):
                def up(threads=threads, backend=backend):
                    with upstream_open(path, framework="pt", backend=backend) as f:
                        with f.prefetch(device=dev, threads=threads) as loader:
                            return dict(loader)
                timed(f"upstream-prefetch-{threads}-{backend}", up)
    except ImportError as e:
        result["skipped"]["upstream-prefetch"] = f"safetensors has no prefetch here: {e}"
    c = result["cases"]
    ups = [v["best_gbps"] for k, v in c.items() if k.startswith("upstream-prefetch")]
    if "weightlift-prefetch" in c:
        wl = c["weightlift-prefetch"]["best_gbps"]
        result["summary"] = {
            "prefetch_over_best_upstream": wl / max(ups) if ups else None,
            "prefetch_over_load_file": wl / c["weightlift-load_file"]["best_gbps"] if "weightlift-load_file" in c
            else None,
        }
        print("summary", json.dumps(result["summary"]), flush=True)
    with open(os.path.join(args.out, "prefetch.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(1)
