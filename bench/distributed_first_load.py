#!/usr/bin/env python3
"""The first ``weightlift.distributed.load_file`` of a process against its later ones, by stage, in fresh process
groups: what a fleet that loads once per process pays on top of the steady-state load.

    distributed_first_load.py FILE --out OUT.json [--procs 2] [--runs 3] [--modes none,prepare] [--device cuda]

Each run starts, per mode, a fresh ``torchrun`` of ``--procs`` processes (NCCL on GPUs, one GPU each; gloo with
``--device cpu``). Each process makes its process group and a barrier (not counted), then by its mode does nothing
("none") or calls ``weightlift.prepare(device)`` ("prepare", timed apart), then loads FILE three times with the
file in the page cache: the wall time of each load (slowest rank), when its first read started, and the time in
each stage of the load (the loader's own methods, timed from outside: header and plan, the status exchange, the
steps, the reports' gathering; nested, so a method's time includes the methods it calls, and ``gather_ints`` counts
every call). Rank 0's figures of every load, then per mode the medians of the first load and of the later ones, go
to OUT.json. The last load of each run is checked against ``safetensors`` on rank 0 (every tensor).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time

MODES = ("none", "prepare")
STAGES = {"_Load": ("_prepare", "_start", "_replicate", "_finish"), "_Group": ("gather_ints", "any_failed", "objects")}


def child(path: str, mode: str, device: str) -> None:
    import torch
    import torch.distributed as dist

    import weightlift
    import weightlift.distributed as wd

    from wlbench.procgroup import init

    dev = init(device, 5)
    rank = dist.get_rank()

    def sync() -> None:
        if dev.startswith("cuda"):
            torch.cuda.synchronize()

    times: dict[str, float] = {}

    def timed_method(cls: type, name: str) -> None:
        f = getattr(cls, name)

        @functools.wraps(f)
        def g(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                times[name] = times.get(name, 0.0) + time.perf_counter() - t

        setattr(cls, name, g)

    for cls, names in STAGES.items():
        for name in names:
            timed_method(getattr(wd, cls), name)
    dist.barrier()
    sync()
    out: dict = {"mode": mode, "world": dist.get_world_size(), "device": dev}
    t = time.perf_counter()
    if mode == "prepare":
        weightlift.prepare(dev)
    out["prepare_s"] = time.perf_counter() - t
    loads = []
    for _ in range(3):
        times.clear()
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        got = wd.load_file(path, device=dev)
        sync()
        wall = time.perf_counter() - t0
        slowest = torch.tensor([wall], dtype=torch.float64, device=dev)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        rep = wd.last_report()
        me = next(r for r in rep["ranks"] if r["rank"] == rank)
        loads.append({"wall_s": float(slowest.item()), "first_read_at_s": me["timeline"][0][0] if me.get("timeline") else None,
                      "stages_s": dict(times), "gbps": rep["summary"]["checkpoint_bytes"] / float(slowest.item()) / 1e9})
    if rank == 0:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from same_as_safetensors import check

        check(path, got, "distributed")
        out["loads"] = loads
        print(json.dumps(out), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--out")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--child", metavar="MODE", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.file, a.child, a.device)
        return 0
    if not a.out:
        ap.error("--out is required")
    modes = [m for m in a.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes: a comma-separated list of {', '.join(MODES)}")
    subprocess.run(["cat", a.file], stdout=subprocess.DEVNULL, check=True)  # into the page cache
    rows = []
    for i in range(a.runs):
        for mode in modes:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(a.procs),
                   os.path.abspath(__file__), a.file, "--device", a.device, "--child", mode]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            if p.returncode != 0 or not lines:
                raise SystemExit(f"run {i} {mode} exited {p.returncode}: {p.stderr[-1500:]}")
            row = json.loads(lines[-1])
            rows.append(row)
            print(mode, [round(x["wall_s"], 4) for x in row["loads"]], file=sys.stderr, flush=True)
    summary = {}
    for mode in modes:
        rs = [r for r in rows if r["mode"] == mode]
        first = statistics.median(r["loads"][0]["wall_s"] for r in rs)
        later = statistics.median(x["wall_s"] for r in rs for x in r["loads"][1:])
        summary[mode] = {"median_prepare_s": statistics.median(r["prepare_s"] for r in rs), "median_first_s": first,
                         "median_later_s": later, "first_to_later": first / later,
                         "median_first_stages_s": {k: statistics.median(r["loads"][0]["stages_s"].get(k, 0.0) for r in rs) for n in STAGES.values() for k in n},
                         "median_later_stages_s": {k: statistics.median(x["stages_s"].get(k, 0.0) for r in rs for x in r["loads"][1:]) for n in STAGES.values() for k in n}}
    with open(a.out, "w") as f:
        json.dump({"file": a.file, "bytes": os.path.getsize(a.file), "procs": a.procs, "rows": rows, "summary": summary,
                   "checked": "every tensor of rank 0's last load of each run against safetensors"}, f, indent=1)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
