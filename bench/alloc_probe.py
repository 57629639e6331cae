#!/usr/bin/env python3
"""How a GPU load's device allocation slows its copies: weightlift's `load_file` of one warm file with its tensors'
memory from PyTorch's caching allocator one block at a time (the default), from one slab for the whole load (each
block a view of it), and from weightlift's own stream-ordered pool (``device_memory=pool``).

Why: in a warm 4 GiB load on an H200 the lanes waited for copies 0.57 s of their 1.4 s (bench/results, a load's
``backpressure_thread_secs``), while PyTorch allocated the blocks for 46 of the load's 88 ms; copies ran 26 % slower
beside another thread's allocations in bench/driver_probe.py (2026-11-24-h100-i).

Each variant runs in a fresh process (`--child VARIANT`): the CUDA context first (timed apart), then ``--runs``
loads with `torch.cuda.empty_cache()` before each, as bench/shapes.py's warm case does (so every load allocates
anew; the pool keeps its memory). The last load of each process is compared byte for byte with `safetensors`' own
load of the file. Variants alternate, ``--rounds`` times.

Usage: alloc_probe.py FILE OUT.json [--device cuda:0] [--runs 5] [--rounds 2]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import same_as_safetensors

VARIANTS = ("torch", "slab-one", "slab-1g", "slab-geo", "pool")


def slab_allocator(total: int, first: int, cap: int):
    """An ``alloc(nbytes)`` for `weightlift._core.device_allocator`'s contract that carves 512-byte-aligned views
    out of uint8 tensors (slabs) made as the blocks come (inside the load's clock): the first of ``first`` bytes,
    each next one twice the last, at most ``cap`` and at most what the load still needs (``total`` in all); a block
    larger than that gets a slab of its own size."""
    from weightlift import _core

    state = {"slabs": 0}
    real = _core.device_allocator

    def device_allocator(engine, device):
        alloc, stream = real(engine, device)
        if alloc is None:
            return alloc, stream
        cur = {"slab": None, "size": 0, "used": 0, "next": first, "left": total}

        def carve(nbytes: int):
            need = (nbytes + 511) // 512 * 512
            if cur["slab"] is None or cur["used"] + need > cur["size"]:
                size = max(need, min(cur["next"], cap, max(cur["left"], need)))
                cur.update(slab=alloc(size), size=size, used=0, next=min(cap, cur["next"] * 2))
                cur["left"] -= size
                state["slabs"] += 1
            start = cur["used"]
            cur["used"] = start + need
            return cur["slab"][start : start + nbytes]

        return carve, stream

    _core.device_allocator = device_allocator
    return state


SLAB_POLICIES = {"slab-one": (1 << 62, 1 << 62), "slab-1g": (1 << 30, 1 << 30), "slab-geo": (64 << 20, 1 << 30)}


def child(path: str, device: str, variant: str, runs: int) -> dict:
    import torch

    on_gpu = device.startswith("cuda")
    sync = (lambda: torch.cuda.synchronize(device)) if on_gpu else (lambda: None)
    t0 = time.perf_counter()
    torch.zeros(1, device=device)
    sync()
    ctx_s = time.perf_counter() - t0
    import weightlift
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        sizes = [f.get_slice(k).get_shape() for k in f.keys()]
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    state = None
    if variant in SLAB_POLICIES:
        width = {"BF16": 2, "F16": 2, "F32": 4, "U8": 1, "I8": 1, "F64": 8, "I64": 8, "I32": 4}
        per = max(width.get(d, 8) for d in dtypes)
        total = sum(((per * _numel(s)) + 511) // 512 * 512 for s in sizes)
        state = slab_allocator(total, *SLAB_POLICIES[variant])
    out: dict = {"variant": variant, "cuda_context_s": ctx_s, "seconds": [], "reports": []}
    loaded = None
    for _ in range(runs):
        loaded = None
        if on_gpu:
            torch.cuda.empty_cache()
        t = time.perf_counter()
        loaded = weightlift.load_file(path, device=device)
        sync()
        out["seconds"].append(time.perf_counter() - t)
        rep = weightlift.last_report()
        out["reports"].append({k: rep.get(k) for k in ("seconds", "device_memory", "times")})
    if state is not None:
        out["slabs"] = state["slabs"]
    out["nbytes"] = sum(v.numel() * v.element_size() for v in loaded.values())
    same_as_safetensors.check(path, loaded, variant)
    out["verified"] = True
    return out


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.file, a.device, a.child, a.runs)))
        return 0
    if not a.out:
        ap.error("OUT.json is required")
    results = []
    for _ in range(a.rounds):
        for v in VARIANTS:
            env = dict(os.environ, WEIGHTLIFT_SERVER="off")
            if v == "pool":
                env["WEIGHTLIFT_DEVICE_MEMORY"] = "pool"
            p = subprocess.run([sys.executable, __file__, a.file, "--device", a.device, "--runs", str(a.runs),
                                "--child", v], capture_output=True, text=True, env=env)
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            r = json.loads(lines[-1]) if p.returncode == 0 and lines else {"variant": v, "error": p.stderr[-800:]}
            results.append(r)
            if "seconds" in r:
                gbps = [r["nbytes"] / s / 1e9 for s in r["seconds"]]
                allocs = [x["times"]["alloc"] for x in r["reports"]]
                back = [x["times"]["backpressure_thread_secs"] for x in r["reports"]]
                print(f"{v:8s} first {gbps[0]:6.2f} GB/s, later median {statistics.median(gbps[1:]):6.2f} "
                      f"(best {max(gbps[1:]):6.2f}); alloc ms {[round(x * 1e3, 1) for x in allocs]}; "
                      f"back-pressure s {[round(x, 3) for x in back]}", flush=True)
            else:
                print(v, "error:", r["error"], flush=True)
    summary = {}
    for v in VARIANTS:
        ok = [r for r in results if r.get("variant") == v and "seconds" in r]
        if ok:
            later = [r["nbytes"] / s / 1e9 for r in ok for s in r["seconds"][1:]]
            first = [r["nbytes"] / r["seconds"][0] / 1e9 for r in ok]
            summary[v] = {"first_gbps": [round(x, 2) for x in first],
                          "later_median_gbps": round(statistics.median(later), 2),
                          "later_best_gbps": round(max(later), 2)}
    print(json.dumps(summary, indent=1))
    with open(a.out, "w") as f:
        json.dump({"file": a.file, "results": results, "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
