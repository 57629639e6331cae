#!/usr/bin/env python3
"""What a fresh process's first `cuMemHostRegister` costs, and what makes it cheap: the CUDA driver alone (ctypes,
no torch, no weightlift), each case in a fresh process.

A fresh process's first load sets up the lanes' staging one pin at a time, and the first pin of the process took
5.4 ms where the next fifteen took 0.3-0.9 ms each (8 MiB each, `weightlift load -vv` on an H200): every other lane
waited for it. Each case here makes a context, optionally does one thing first, then pins four 8 MiB regions of
huge-page-advised, touched anonymous memory, as a lane does, timing each pin:

- ``none``: nothing first.
- ``pin-4k`` / ``pin-2m``: pin and unpin one small region first (4 KiB; one 2 MiB huge page).
- ``alloc``: `cuMemAlloc` of 2 MiB and its free first.
- ``pool``: 2 MiB from the device's stream-ordered pool and back first.
- ``beside-alloc``: nothing first, but another thread allocates 4 GiB in 64 MiB pieces while the pins run (a load's
  device memory is allocated while its lanes set up).

Usage: first_pin_probe.py OUT.json [--runs N]. Prints one line per process and writes them all as JSON.
"""

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import threading
import time

MIB = 1 << 20
CASES = ("none", "pin-4k", "pin-2m", "alloc", "pool", "beside-alloc")


def child(case: str) -> dict:
    cuda = ctypes.CDLL("libcuda.so.1")
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

    def ck(name, *args):
        r = getattr(cuda, name)(*args)
        if r != 0:
            raise RuntimeError(f"{name} failed with CUDA error {r}")

    def region(n: int) -> int:
        """n bytes of anonymous memory on a 2 MiB boundary, advised MADV_HUGEPAGE and touched page by page."""
        raw = libc.mmap(None, n + 2 * MIB, 3, 0x22, -1, 0)  # PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS
        if raw in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        p = (raw + 2 * MIB - 1) & ~(2 * MIB - 1)
        libc.madvise(p, n, 14)  # MADV_HUGEPAGE
        ctypes.memset(p, 1, n)
        return p

    def pin(p: int, n: int) -> float:
        t = time.perf_counter()
        ck("cuMemHostRegister_v2", ctypes.c_void_p(p), ctypes.c_size_t(n), 1)  # PORTABLE
        return time.perf_counter() - t

    t0 = time.perf_counter()
    ck("cuInit", 0)
    dev = ctypes.c_int()
    ck("cuDeviceGet", ctypes.byref(dev), 0)
    ctx = ctypes.c_void_p()
    ck("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    ck("cuCtxSetCurrent", ctx)
    out: dict = {"case": case, "context_s": time.perf_counter() - t0}
    regions = [region(8 * MIB) for _ in range(4)]
    t = time.perf_counter()
    if case in ("pin-4k", "pin-2m"):
        n = 4096 if case == "pin-4k" else 2 * MIB
        p = region(n)
        pin(p, n)
        ck("cuMemHostUnregister", ctypes.c_void_p(p))
    elif case == "alloc":
        d = ctypes.c_uint64()
        ck("cuMemAlloc_v2", ctypes.byref(d), ctypes.c_size_t(2 * MIB))
        ck("cuMemFree_v2", d)
    elif case == "pool":
        d, s = ctypes.c_uint64(), ctypes.c_void_p()
        ck("cuStreamCreate", ctypes.byref(s), 1)
        ck("cuMemAllocAsync", ctypes.byref(d), ctypes.c_size_t(2 * MIB), s)
        ck("cuMemFreeAsync", d, s)
        ck("cuStreamSynchronize", s)
    out["first_step_s"] = time.perf_counter() - t
    allocator = None
    if case == "beside-alloc":
        def allocate() -> None:
            ck("cuCtxSetCurrent", ctx)
            ptrs = []
            for _ in range(64):
                d = ctypes.c_uint64()
                ck("cuMemAlloc_v2", ctypes.byref(d), ctypes.c_size_t(64 * MIB))
                ptrs.append(d)
            for d in ptrs:
                ck("cuMemFree_v2", d)
        allocator = threading.Thread(target=allocate)
        allocator.start()
    out["pins_s"] = [pin(p, 8 * MIB) for p in regions]
    if allocator is not None:
        allocator.join()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child)))
        return 0
    if not a.out:
        ap.error("OUT.json is required")
    results = []
    for _ in range(a.runs):
        for case in CASES:  # interleaved: the host's state drifts between runs
            p = subprocess.run([sys.executable, __file__, "--child", case], capture_output=True, text=True)
            if p.returncode != 0:
                results.append({"case": case, "error": p.stderr.strip()[-500:]})
            else:
                results.append(json.loads(p.stdout))
            print(json.dumps(results[-1]), flush=True)
    summary = {}
    for case in CASES:
        ok = [r for r in results if r["case"] == case and "pins_s" in r]
        if ok:
            summary[case] = {"first_step_ms": round(statistics.median(r["first_step_s"] for r in ok) * 1e3, 3),
                             "first_pin_ms": round(statistics.median(r["pins_s"][0] for r in ok) * 1e3, 3),
                             "later_pins_ms": round(statistics.median(x for r in ok for x in r["pins_s"][1:]) * 1e3,
                                                    3)}
    print(json.dumps(summary, indent=1))
    with open(a.out, "w") as f:
        json.dump({"results": results, "summary_medians": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
