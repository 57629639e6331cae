"""A one-shot load into host memory by a fresh process against np.fromfile in a fresh process, interleaved.

The file: a checkpoint written by safetensors.torch.save_file (bf16, llama-shaped; --size, default 2GiB), warm in
the page cache. Each pair runs `weightlift load FILE --device cpu --json` in a fresh process (its engine's clock,
the report's ``seconds``, and the process's wall time) and, in a fresh Python process with numpy imported,
``np.fromfile(FILE, dtype=np.uint8)`` timed around the call; the order alternates within pairs. Both pay for fresh
pages of the process's memory, whose cost swings on virtual machines from run to run (the hypervisor backs guest
memory on first touch): only pairs taken side by side compare, and the figure is the median of the pairs' ratios.

Where the time goes: the same pairs with `--host-pages base` (4 KiB pages for the destination) and `--threads 1` (one
lane), each against its own np.fromfile. The first pair of each variant warms up and is not counted. The loaded
bytes are checked once: `weightlift load --verify` compares every byte with a second read of the file.

Writes OUT/host.json. Usage: python bench/host_bench.py OUT --weightlift-bin BIN [--dir DIR] [--size 2GiB]
[--pairs 9]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)

from wlbench.files import make_upstream, parse_size  # noqa: E402

FROMFILE = """
import sys, time
import numpy as np
t = time.perf_counter()
a = np.fromfile(sys.argv[1], dtype=np.uint8)
t = time.perf_counter() - t
print(a.nbytes, t)
"""

VARIANTS = {
    "default": [],
    "host_pages=base": ["--host-pages", "base"],
    "threads=1": ["--threads", "1"],
}


def weightlift_once(wl: str, path: str, extra: list) -> dict:
    t = time.perf_counter()
    p = subprocess.run([wl, "load", path, "--device", "cpu", "--json", *extra], capture_output=True, text=True)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"weightlift load failed ({p.returncode}): {p.stderr[-2000:]}")
    rep = json.loads(p.stdout)
    return {"bytes": rep["bytes"], "secs": rep["seconds"], "wall_secs": wall, "lanes": rep.get("lanes"),
            "gbps": rep["bytes"] / rep["seconds"] / 1e9}


def fromfile_once(path: str) -> dict:
    p = subprocess.run([sys.executable, "-c", FROMFILE, path], capture_output=True, text=True, check=True)
    nbytes, secs = p.stdout.split()
    return {"bytes": int(nbytes), "secs": float(secs), "gbps": int(nbytes) / float(secs) / 1e9}


def pairs(wl: str, path: str, extra: list, n: int) -> dict:
    rows = []
    for i in range(n + 1):
        if i % 2 == 0:
            a = weightlift_once(wl, path, extra)
            b = fromfile_once(path)
        else:
            b = fromfile_once(path)
            a = weightlift_once(wl, path, extra)
        if i > 0:  # the first pair warms up
            rows.append({"weightlift": a, "np_fromfile": b, "ratio": a["gbps"] / b["gbps"]})
    return {
        "pairs": rows,
        "median_ratio": statistics.median(r["ratio"] for r in rows),
        "median_weightlift_gbps": statistics.median(r["weightlift"]["gbps"] for r in rows),
        "median_np_fromfile_gbps": statistics.median(r["np_fromfile"]["gbps"] for r in rows),
        "median_weightlift_wall_secs": statistics.median(r["weightlift"]["wall_secs"] for r in rows),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--weightlift-bin", required=True)
    ap.add_argument("--dir", default=os.path.expanduser("~/.cache/weightlift/bench"))
    ap.add_argument("--size", default="2GiB")
    ap.add_argument("--pairs", type=int, default=9)
    args = ap.parse_args()
    if args.pairs < 1:
        ap.error("--pairs must be at least 1")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.dir, f"host-{args.size}.safetensors")
    make_upstream(path, parse_size(args.size), seed=17)
    subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)  # warm in the page cache
    check = subprocess.run([args.weightlift_bin, "load", path, "--device", "cpu", "--verify", "--json"],
                           capture_output=True, text=True)
    if check.returncode != 0:
        print(f"host_bench: weightlift load --verify failed: {check.stderr[-2000:]}", file=sys.stderr)
        return 1
    verified = json.loads(check.stdout).get("verified")
    result: dict = {
        "file": path,
        "file_bytes": os.path.getsize(path),
        "verified": verified,
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                    "thp": open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip()
                    if os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled") else None},
        "variants": {},
    }
    for name, extra in VARIANTS.items():
        v = pairs(args.weightlift_bin, path, extra, args.pairs)
        v["args"] = extra
        result["variants"][name] = v
        print(f"{name}: weightlift {v['median_weightlift_gbps']:.2f} GB/s, np.fromfile {v['median_np_fromfile_gbps']:.2f}, "
              f"median ratio of {args.pairs} pairs {v['median_ratio']:.2f}", flush=True)
        with open(os.path.join(args.out, "host.json"), "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
