#!/usr/bin/env python3
"""Do host->device copies into freshly allocated device memory run slower than into memory written before?

Why: a warm 4.49 GB `load_file` into PyTorch's memory, its cache emptied before each load, takes 3-5 ms longer in
the engine than one into weightlift's pool, which keeps its memory between loads; with PyTorch's cudaMallocAsync
backend the lanes no longer wait for their blocks and the gap stays (bench/results/2026-11-27-h200-o). If copies
into fresh memory run slower even when it was allocated beforehand, the pinned copy into reused memory is a ceiling
that loads into fresh memory cannot reach; if not, what costs is allocating beside the copies.

With the CUDA driver alone (ctypes, bench/driver_probe.py's helpers; no torch, no weightlift), ``--rounds`` times:
a buffer kept for the whole run, written once before (``reused``, right after the previous round freed its
memory; ``reused_settled``, ``--settle`` seconds later); then a fresh ``cuMemAlloc`` of ``--gib`` GiB, copied
into twice (``cumemalloc_first``, ``cumemalloc_second``) and freed; then the same from the device's stream-ordered
pool trimmed to nothing just before (``pool_first``, ``pool_second``), and once more from the pool trimmed
``--settle`` seconds before (``pool_first_settled``). Each copy fills the whole buffer
in 4 MiB host->device copies on one stream from pinned memory holding a pattern; the last copy of each kind is read
back and compared with the pattern. Prints one line per figure; writes them all, and the medians, as JSON.

Usage: fresh_memory_probe.py OUT.json [--gib 4] [--rounds 5] [--settle 0.2]
"""

import argparse
import ctypes
import json
import statistics
import time

from driver_probe import MIB, U64, Ctx, alloc_async_chunks, ck, dev_alloc, free_async

CHUNK = 4 * MIB
SRC_BYTES = 256 * MIB


def pattern_source() -> ctypes.c_void_p:
    """Pinned memory holding bytes that differ from their neighbours (a counter mod 251), not zeros."""
    p = ctypes.c_void_p()
    ck("cuMemAllocHost_v2", ctypes.byref(p), ctypes.c_size_t(SRC_BYTES))
    block = bytes(i % 251 for i in range(1 << 16))
    for off in range(0, SRC_BYTES, len(block)):
        ctypes.memmove(p.value + off, block, len(block))
    return p


def fill(src: ctypes.c_void_p, dst: int, total: int, stream) -> float:
    """Copies `total` bytes into [dst, dst + total) in 4 MiB pieces, the source cycling; returns GB/s."""
    t = time.perf_counter()
    for off in range(0, total, CHUNK):
        ck("cuMemcpyHtoDAsync_v2", U64(dst + off), ctypes.c_void_p(src.value + off % SRC_BYTES),
           ctypes.c_size_t(min(CHUNK, total - off)), stream)
    ck("cuStreamSynchronize", stream)
    return total / (time.perf_counter() - t) / 1e9


def same_as_source(src: ctypes.c_void_p, dst: int, total: int) -> bool:
    """Reads the buffer's first and last 256 MiB back and compares them with what the copies put there."""
    back = (ctypes.c_char * SRC_BYTES)()
    for start in (0, total - SRC_BYTES):
        ck("cuMemcpyDtoH_v2", back, U64(dst + start), ctypes.c_size_t(SRC_BYTES))
        # `start` is a multiple of the source's size, so the source lines up with the buffer there.
        if start % SRC_BYTES or ctypes.string_at(src.value, SRC_BYTES) != bytes(back):
            return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--gib", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--settle", type=float, default=0.2, help="seconds to wait after freeing, for the *_settled cases")
    a = ap.parse_args()
    total = a.gib << 30
    ctx = Ctx()
    stream = ctx.stream()
    src = pattern_source()
    kept = dev_alloc(total)
    fill(src, kept.value, total, stream)  # written once: from now on, memory written before
    runs: dict = {k: [] for k in ("reused", "reused_settled", "cumemalloc_first", "cumemalloc_second", "pool_first",
                                   "pool_second", "pool_first_settled", "cumemalloc_alloc_secs", "pool_alloc_secs")}
    checks = {}
    for r in range(a.rounds):
        runs["reused"].append(fill(src, kept.value, total, stream))  # right after the last round's frees
        time.sleep(a.settle)
        runs["reused_settled"].append(fill(src, kept.value, total, stream))
        checks["reused"] = same_as_source(src, kept.value, total)

        t = time.perf_counter()
        p = dev_alloc(total)
        runs["cumemalloc_alloc_secs"].append(time.perf_counter() - t)
        runs["cumemalloc_first"].append(fill(src, p.value, total, stream))
        runs["cumemalloc_second"].append(fill(src, p.value, total, stream))
        checks["cumemalloc"] = same_as_source(src, p.value, total)
        ck("cuMemFree_v2", U64(p.value))

        ctx.pool_trim()
        secs, (q,) = alloc_async_chunks(ctx, total, total, stream)  # one allocation of `total`, synchronised
        runs["pool_alloc_secs"].append(secs)
        runs["pool_first"].append(fill(src, q.value, total, stream))
        runs["pool_second"].append(fill(src, q.value, total, stream))
        checks["pool"] = same_as_source(src, q.value, total)
        free_async([q], stream)
        ctx.pool_trim()
        time.sleep(a.settle)
        _, (q,) = alloc_async_chunks(ctx, total, total, stream)
        runs["pool_first_settled"].append(fill(src, q.value, total, stream))
        checks["pool_settled"] = same_as_source(src, q.value, total)
        free_async([q], stream)
        ctx.pool_trim()
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.4g}" for k, v in runs.items()), flush=True)
    medians = {k: statistics.median(v) for k, v in runs.items()}
    print("medians:", json.dumps({k: round(v, 5) for k, v in medians.items()}))
    print("read back the same as written:", checks)
    with open(a.out, "w") as f:
        json.dump({"gib": a.gib, "chunk_bytes": CHUNK, "runs": runs, "medians": medians, "checks": checks}, f, indent=1)


if __name__ == "__main__":
    main()
