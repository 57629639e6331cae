#!/usr/bin/env python3
"""The first GPU-kernel use of a process: a packed load, and a load checked against its manifest (``verify=True``),
timed first and second in fresh processes, with the time spent building the kernels told apart.

    first_kernel_probe.py PLAIN.safetensors PACK.wlpack --out OUT.json [--device cuda:0] [--procs 3]

PLAIN needs its manifest (``weightlift checksum PLAIN``); PACK is ``weightlift pack PLAIN PACK``. Each fresh process
makes its CUDA context first (not counted), then loads PACK twice and PLAIN with ``verify=True`` twice (the order of
the two kinds alternating from process to process), then checks every tensor of both loads against ``safetensors``'
own read of PLAIN. The figure: first / second seconds of each kind, median over the processes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def child(plain: str, pack: str, device: str, pack_first: bool) -> None:
    import torch

    import weightlift

    torch.zeros(1, device=device)
    out: dict = {}
    kinds = [("pack", pack, False), ("verify", plain, True)]
    if not pack_first:
        kinds.reverse()
    for kind, path, verify in kinds:
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            loaded = weightlift.load_file(path, device=device, verify=verify)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            last = loaded
        out[kind] = times
        out[kind + "_report"] = weightlift.last_report()
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from same_as_safetensors import check

        check(plain, last, kind)
    print(json.dumps(out), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plain")
    ap.add_argument("pack")
    ap.add_argument("--out")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--procs", type=int, default=3)
    ap.add_argument("--child", choices=("pack-first", "verify-first"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if not a.child and not a.out:
        ap.error("--out is required")
    if a.child:
        child(a.plain, a.pack, a.device, a.child == "pack-first")
        return 0
    rows = []
    for i in range(a.procs):
        order = "pack-first" if i % 2 == 0 else "verify-first"
        p = subprocess.run([sys.executable, os.path.abspath(__file__), a.plain, a.pack, "--device", a.device,
                            "--child", order], capture_output=True, text=True, timeout=600)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if p.returncode != 0 or not lines:
            raise SystemExit(f"child exited {p.returncode}: {p.stderr[-800:]}")
        row = json.loads(lines[-1])
        row["order"] = order
        rows.append(row)
        print(order, {k: [round(x, 4) for x in row[k]] for k in ("pack", "verify")}, file=sys.stderr, flush=True)
    summary = {k: {"median_first_s": statistics.median(r[k][0] for r in rows),
                   "median_second_s": statistics.median(r[k][1] for r in rows),
                   "median_first_to_second": statistics.median(r[k][0] / r[k][1] for r in rows)}
               for k in ("pack", "verify")}
    with open(a.out, "w") as f:
        json.dump({"rows": rows, "summary": summary, "checked": "every tensor of the last load of each kind "
                   "against safetensors' read of the plain file"}, f, indent=1)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
