#!/usr/bin/env python3
"""The first GPU-kernel use of a process: a packed load, and a load checked against its manifest (``verify=True``),
timed first and second in fresh processes, with and without setting the engine up beforehand, its cost told apart.

    first_kernel_probe.py PLAIN.safetensors PACK.wlpack --out OUT.json [--device cuda:0] [--procs 3] [--log DIR]
                          [--modes none,prepare,kernels]

PLAIN needs its manifest (``weightlift checksum PLAIN``); PACK is ``weightlift pack PLAIN PACK``. Each fresh process
makes its CUDA context first (not counted), then, by its mode, does nothing ("none"), calls
``weightlift.prepare(device)`` ("prepare": staging, streams, pool) or ``weightlift.prepare(device, kernels=True)``
("kernels": the decoders' kernels too), timed apart, then loads one kind (PACK, or PLAIN with ``verify=True``)
twice and checks every tensor of the last load against ``safetensors``' own read of PLAIN. The figure, per kind and
mode: first / second seconds, median over the processes (the goal: within 1.1 once the set-up was done beforehand).
With ``--log DIR`` each process writes the engine's debug records (its ``weightlift`` logger, each with the time it
happened) to ``DIR/KIND-MODE-N.log``: where a first load's extra time goes. ``--modes`` runs only those modes
(``--modes kernels --procs 9``: the goal's own figure over more processes in the same time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

KINDS = ("pack", "verify")
MODES = ("none", "prepare", "kernels")


def child(plain: str, pack: str, device: str, kind: str, mode: str, log: "str | None") -> None:
    import torch

    import weightlift

    if log:
        import logging

        handler = logging.FileHandler(log)
        handler.setFormatter(logging.Formatter("%(created).6f %(threadName)s %(message)s"))
        logger = logging.getLogger("weightlift")
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)

    torch.zeros(1, device=device)
    torch.cuda.synchronize()
    out: dict = {"kind": kind, "mode": mode}
    t0 = time.perf_counter()
    if mode != "none":
        out["prepared"] = weightlift.prepare(device, kernels=mode == "kernels")
    out["prepare_s"] = time.perf_counter() - t0
    path, verify = (pack, False) if kind == "pack" else (plain, True)
    times, reports = [], []
    for i in range(2):
        if log:
            logging.getLogger("weightlift").info("load %d starts", i + 1)
        t0 = time.perf_counter()
        loaded = weightlift.load_file(path, device=device, verify=verify)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        reports.append(weightlift.last_report())
    out["seconds"] = times
    out["reports"] = reports
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from same_as_safetensors import check

    check(plain, loaded, kind)
    print(json.dumps(out), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plain")
    ap.add_argument("pack")
    ap.add_argument("--out")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--procs", type=int, default=3)
    ap.add_argument("--log", metavar="DIR", help="each process's engine debug records, in DIR")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated modes to run (default: all)")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "MODE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if not a.child and not a.out:
        ap.error("--out is required")
    if a.child:
        child(a.plain, a.pack, a.device, *a.child, a.log)
        return 0
    modes = [m for m in a.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes: a comma-separated list of {', '.join(MODES)}")
    rows = []
    for i in range(a.procs):
        for kind in KINDS:
            for mode in modes:
                extra = []
                if a.log:
                    os.makedirs(a.log, exist_ok=True)
                    extra = ["--log", os.path.join(a.log, f"{kind}-{mode}-{i}.log")]
                p = subprocess.run([sys.executable, os.path.abspath(__file__), a.plain, a.pack, "--device", a.device,
                                    "--child", kind, mode, *extra], capture_output=True, text=True, timeout=600)
                lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
                if p.returncode != 0 or not lines:
                    raise SystemExit(f"child {kind} {mode} exited {p.returncode}: {p.stderr[-800:]}")
                row = json.loads(lines[-1])
                rows.append(row)
                print(kind, mode, f"prepare {row['prepare_s']:.4f}", [round(x, 4) for x in row["seconds"]], file=sys.stderr, flush=True)
    summary: dict = {}
    for kind in KINDS:
        for mode in modes:
            rs = [r for r in rows if r["kind"] == kind and r["mode"] == mode]
            summary[f"{kind}_{mode}"] = {
                "median_prepare_s": statistics.median(r["prepare_s"] for r in rs),
                "median_first_s": statistics.median(r["seconds"][0] for r in rs),
                "median_second_s": statistics.median(r["seconds"][1] for r in rs),
                "median_first_to_second": statistics.median(r["seconds"][0] / r["seconds"][1] for r in rs),
            }
    with open(a.out, "w") as f:
        json.dump({"rows": rows, "summary": summary, "goal_first_to_second": 1.1, "checked": "every tensor of the "
                   "last load of each process against safetensors' read of the plain file"}, f, indent=1)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
