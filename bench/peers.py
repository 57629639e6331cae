#!/usr/bin/env python3
"""Times what users run today to get a checkpoint onto a GPU, on the same files `weightlift bench` uses, so both
land in one results file: safetensors' load_file(device=...), torch.load(mmap=True) then .to(device), and
np.fromfile then .to(device) (raw bytes). Prints one JSON object on stdout.

Cases: "cold" drops the page cache before each run (needs root), "warm" reads the file once first, "tmpfs" loads a
copy in /dev/shm. Every run is synchronised with the device before the clock stops.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        return True
    except OSError:
        return False


def warm(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(16 << 20):
            pass


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", required=True, help="safetensors checkpoint on disk")
    ap.add_argument("--shm-file", help="the same checkpoint on tmpfs")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cases", default="cold,warm,tmpfs")
    args = ap.parse_args()

    try:
        import numpy as np
        import torch
        from safetensors.torch import load_file
    except ImportError as e:
        print(json.dumps({"skipped": f"python peers need torch, numpy and safetensors: {e}"}))
        return 0
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(json.dumps({"skipped": "torch sees no CUDA device"}))
        return 0
    device = torch.device(args.device)
    torch.zeros(1, device=device)  # create the context outside the timings

    def to_pt(src: str) -> str:
        dst = src + ".pt"
        if not os.path.exists(dst) or os.path.getmtime(dst) < os.path.getmtime(src):
            torch.save(load_file(src), dst)
        return dst

    def m_safetensors(path: str) -> int:
        t = load_file(path, device=str(device))
        torch.cuda.synchronize(device)
        n = sum(v.nbytes for v in t.values())
        del t
        return n

    def m_torch_load(path: str) -> int:
        sd = torch.load(to_pt_cache[path], mmap=True, weights_only=True)
        out = {k: v.to(device) for k, v in sd.items()}
        torch.cuda.synchronize(device)
        n = sum(v.nbytes for v in out.values())
        del out, sd
        return n

    def m_fromfile(path: str) -> int:
        a = np.fromfile(path, dtype=np.uint8)
        t = torch.from_numpy(a).to(device)
        torch.cuda.synchronize(device)
        n = t.nbytes
        del t, a
        return n

    paths = {"cold": args.file, "warm": args.file}
    if args.shm_file:
        paths["tmpfs"] = args.shm_file
    to_pt_cache = {p: to_pt(p) for p in set(paths.values())}
    methods = {
        "safetensors.torch.load_file": m_safetensors,
        "torch.load(mmap=True) → .to(device)": m_torch_load,
        "np.fromfile → .to(device)": m_fromfile,
    }
    results = []
    can_drop = os.geteuid() == 0
    for case in args.cases.split(","):
        if case not in paths or (case == "cold" and not can_drop):
            continue
        path = paths[case]
        for name, fn in methods.items():
            rates = []
            for _ in range(args.runs):
                if case == "cold":
                    drop_caches()
                else:
                    warm(path)
                    if name.startswith("torch.load"):
                        warm(to_pt_cache[path])
                torch.cuda.empty_cache()
                t0 = time.perf_counter()
                n = fn(path)
                rates.append(n / (time.perf_counter() - t0) / 1e9)
            results.append({"method": name, "case": case, "runs_gbps": rates})
            print(f"peers: {name} {case}: best {max(rates):.2f} GB/s", file=sys.stderr)
    print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name(device), "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
