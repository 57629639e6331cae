#!/usr/bin/env python3
"""Why the first weightlift load of a fresh Python process is slower than its second: does the process's first use
of that much device memory account for it?

Each run is a fresh process: torch makes the CUDA context, then the variant touches device memory (or not), then two
``weightlift.load_file`` calls of the same warm file onto the device are timed (each synchronised, its tensors freed
before the next). Variants:

- ``none``: nothing before the first load;
- ``torch``: ``torch.empty`` of the file's size, freed, ``torch.cuda.empty_cache()`` (cudaMalloc / cudaFree);
- ``pool``: ``cuMemAllocAsync`` of the file's size from the device's default pool (the pool weightlift allocates
  from), freed and synchronised, so that the pool gives the memory back to the system before the load;
  ``pool:SIZE`` (``pool:2MiB``) the same with SIZE bytes;
- ``env:NAME=VALUE``: nothing touched, the child process run with that environment variable set (a weightlift
  setting, say ``env:WEIGHTLIFT_STAGING_PAGES=base``);
- ``warmup``: ``weightlift.load_file`` of another, small file first (8 tensors, 64 MiB; ``warmup:SIZE``), so that
  the engine, its lanes and their staging exist before the timed loads;
- ``prepare``: ``weightlift.prepare(device)`` (the engine's lanes' staging, streams and a first use of the pool
  set up before the load; its report is kept as ``prepared``);
- ``prepare-thread``: ``weightlift.prepare(device)`` on a thread started before torch makes the CUDA context (as a
  program would start it at start-up), joined before the loads (the wait counts in ``touch_s``);
- several joined by ``+`` (``warmup+pool:4GiB``), in that order.

Each run also gives ``start_to_loaded_s``: the context, the variant and the first load together.

Usage: first_load_alloc.py FILE OUT.json [--runs 3] [--device cuda:0] [--variants none,torch,pool,pool:2MiB]
Prints one line per process and writes every run's times and the first load's report (``times``) as JSON.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

VARIANTS = ("none", "torch", "pool")
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def size_of(text: str) -> int:
    for unit, mult in UNITS.items():
        if text.endswith(unit):
            return int(text[: -len(unit)]) * mult
    return int(text)


PREPARED: list = []
BACKGROUND: list = []
FAILED: list = []


def prepare_in_background(device: str) -> None:
    import weightlift

    try:
        PREPARED.append(weightlift.prepare(device))
    except Exception as e:  # re-raised by the variant's join
        FAILED.append(repr(e))


def touch(variant: str, nbytes: int, device: str) -> float:
    import torch

    t = time.perf_counter()
    for part in variant.split("+"):
        touch_one(part, nbytes, device)
    torch.cuda.synchronize(device)
    return time.perf_counter() - t


def touch_one(variant: str, nbytes: int, device: str) -> None:
    import torch

    if variant == "prepare-thread":
        for t in BACKGROUND:
            t.join()
        if len(PREPARED) != len(BACKGROUND):
            raise RuntimeError(f"weightlift.prepare on its thread failed: {FAILED}")
    elif variant == "prepare":
        import weightlift

        PREPARED.append(weightlift.prepare(device))
    elif variant.startswith("warmup"):
        import tempfile

        import weightlift
        from safetensors.torch import save_file

        size = size_of(variant.split(":", 1)[1]) if ":" in variant else 64 << 20
        with tempfile.TemporaryDirectory() as d:
            f = os.path.join(d, "warmup.safetensors")
            save_file({f"t{i}": torch.randint(0, 255, (size // 8,), dtype=torch.uint8) for i in range(8)}, f)
            got = weightlift.load_file(f, device)
            del got
    elif variant == "torch":
        x = torch.empty(nbytes, dtype=torch.uint8, device=device)
        del x
        torch.cuda.empty_cache()
    elif variant.startswith("env:"):
        pass  # the variable was set in this process's environment
    elif variant.startswith("pool"):
        from driver_probe import ck  # the driver through ctypes, each call checked

        if ":" in variant:
            nbytes = size_of(variant.split(":", 1)[1])
        ptr = ctypes.c_uint64()
        ck("cuMemAllocAsync", ctypes.byref(ptr), ctypes.c_size_t(nbytes), None)
        ck("cuMemFreeAsync", ptr, None)
        ck("cuStreamSynchronize", None)


def child(path: str, variant: str, device: str) -> dict:
    import torch
    import weightlift

    start = time.perf_counter()
    if "prepare-thread" in variant.split("+"):
        import threading

        BACKGROUND.append(threading.Thread(target=prepare_in_background, args=(device,)))
        BACKGROUND[-1].start()
    torch.cuda.set_device(device)  # the driver calls of `touch` act on the current device
    t = time.perf_counter()
    torch.zeros(1, device=device)
    context_s = time.perf_counter() - t
    touch_s = touch(variant, os.path.getsize(path), device)
    out: dict = {"variant": variant, "cuda_context_s": context_s, "touch_s": touch_s}
    if PREPARED:
        out["prepared"] = PREPARED
    for name in ("first", "second"):
        torch.cuda.synchronize(device)
        t = time.perf_counter()
        tensors = weightlift.load_file(path, device)
        torch.cuda.synchronize(device)
        out[f"{name}_s"] = time.perf_counter() - t
        out[f"{name}_times"] = (weightlift.last_report() or {}).get("times")
        del tensors
        if name == "first":
            out["start_to_loaded_s"] = time.perf_counter() - start
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("out")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated: none, torch, pool, pool:SIZE, env:NAME=VALUE, warmup, warmup:SIZE, prepare, prepare-thread, A+B")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.file, args.child, args.device)))
        return 0
    variants = args.variants.split(",")
    for v in variants:
        for part in v.split("+"):
            known = part in ("none", "torch", "pool", "warmup", "prepare", "prepare-thread") or part.startswith(
                ("pool:", "warmup:"))
            if not (known or (part.startswith("env:") and "=" in part)):
                ap.error(f"unknown variant {part!r} (none, torch, pool[:SIZE], warmup[:SIZE], prepare, prepare-thread, env:NAME=VALUE)")
    with open(args.file, "rb") as f:  # into the page cache
        while f.read(64 << 20):
            pass
    rows: list = []
    for _ in range(args.runs):
        for v in variants:
            env = dict(os.environ)
            for part in v.split("+"):
                if part.startswith("env:"):
                    name, _, value = part[4:].partition("=")
                    env[name] = value
            run = subprocess.run([sys.executable, __file__, args.file, args.out, "--device", args.device, "--child", v],
                                 capture_output=True, text=True, timeout=300, env=env)
            if run.returncode != 0:
                print(f"{v}: failed: {run.stderr[-800:]}", flush=True)
                rows.append({"variant": v, "error": run.stderr[-2000:]})
                continue
            r = json.loads(run.stdout.strip().splitlines()[-1])
            r["ratio"] = r["first_s"] / r["second_s"]
            rows.append(r)
            alloc = (r["first_times"] or {}).get("alloc")
            print(f"{v:11.30s} touch {r['touch_s'] * 1e3:7.1f} ms  first {r['first_s'] * 1e3:6.1f} ms  second "
                  f"{r['second_s'] * 1e3:6.1f} ms  ratio {r['ratio']:.3f}  first load's allocation "
                  f"{(alloc or 0) * 1e3:.1f} ms  context+variant+first {r['start_to_loaded_s'] * 1e3:.1f} ms", flush=True)
    medians = {v: statistics.median(r["ratio"] for r in rows if r.get("variant") == v and "ratio" in r)
               for v in variants if any(r.get("variant") == v and "ratio" in r for r in rows)}
    print("median first/second:", {k: round(x, 3) for k, x in medians.items()}, flush=True)
    to_loaded = {v: statistics.median(r["start_to_loaded_s"] for r in rows if r.get("variant") == v and "ratio" in r)
                 for v in medians}
    print("median context+variant+first (s):", {k: round(x, 4) for k, x in to_loaded.items()}, flush=True)
    with open(args.out, "w") as f:
        json.dump({"file": args.file, "bytes": os.path.getsize(args.file), "device": args.device, "runs": rows,
                   "median_ratio": medians,
                   "median_start_to_loaded_s": to_loaded}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
