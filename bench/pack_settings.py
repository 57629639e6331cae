#!/usr/bin/env python3
"""Warm packed loads under several engine settings, each in a fresh process: the effective rate (raw bytes per
second of wall time) of a `.wlpack` of weight-like bf16 beside the plain file it was packed from and the plain file
loaded with ``verify=True``, interleaved run by run, with the parts of each load's report (reading, allocation,
waiting for the GPU decoder, hashing) — to find what a packed load and a checked load wait on.

Usage: python bench/pack_settings.py OUTDIR [--size 4GiB] [--runs 5] [--dir DIR] [--variant "NAME=VALUE ..."]...
The default variants: the defaults, larger decode batches (256 and 512 MiB), fewer lanes, 2 MiB chunks. Writes
OUTDIR/pack-settings.json and prints one line per variant; where the ``pack_open`` example sits beside
``WEIGHTLIFT_BIN``, also the steps of opening the pack (``pack_open`` in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pack_load_bench as plb  # noqa: E402  (the same weights, packer and ceiling)

VARIANTS = [
    "",
    "WEIGHTLIFT_PACK_BATCH_BYTES=512MiB",
    "WEIGHTLIFT_PACK_BATCH_BYTES=256MiB",
    "WEIGHTLIFT_THREADS=12",
    "WEIGHTLIFT_CHUNK_BYTES=2MiB",
]


def figures(report: dict) -> dict:
    """The numbers of a load's report that say where its time went."""
    out = {k: report.get(k) for k in ("seconds", "alloc_secs", "lanes", "peak_staging_bytes")}
    out.update({f"checks.{k}": v for k, v in (report.get("checks") or {}).items() if isinstance(v, (int, float))})
    out.update({f"times.{k}": v for k, v in (report.get("times") or {}).items()})
    out.update({f"pack.{k}": v for k, v in (report.get("pack") or {}).items() if isinstance(v, (int, float))})
    return out


def keep_freed_device_memory() -> None:
    """Sets the release threshold of device 0's default stream-ordered pool (the one weightlift allocates from) to
    its maximum, so freed memory stays in the pool instead of going back to the system at the next synchronisation:
    variant ``WL_BENCH_POOL_RELEASE_THRESHOLD=max`` (a question for this bench, not a weightlift setting)."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    dev, pool = ctypes.c_int(), ctypes.c_void_p()
    for r in (cuda.cuDeviceGet(ctypes.byref(dev), 0), cuda.cuDeviceGetDefaultMemPool(ctypes.byref(pool), dev)):
        if r != 0:
            raise RuntimeError(f"CUDA driver error {r}")
    threshold = ctypes.c_uint64(2**64 - 1)
    if cuda.cuMemPoolSetAttribute(pool, 4, ctypes.byref(threshold)) != 0:  # CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
        raise RuntimeError("cuMemPoolSetAttribute failed")


def child(plain: str, packed: str, runs: int, device: str) -> dict:
    import torch
    import weightlift

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def one(path: str, verify: bool = False) -> tuple[float, dict]:
        sync()
        t = time.perf_counter()
        tensors = weightlift.load_file(path, device, verify=verify)
        sync()
        secs = time.perf_counter() - t
        report = weightlift.last_report() or {}
        del tensors
        return secs, figures(report)

    def phases(path: str) -> dict:
        """One load_file, cut where weightlift's Python front does its steps (its private helpers): opening the
        checkpoint (parsing its index), the engine's load, making tensors of the buffers, the device sync."""
        from weightlift import _core
        from weightlift.safetensors import _checkpoint

        sync()
        t0 = time.perf_counter()
        ckpt = _checkpoint(path)
        t1 = time.perf_counter()
        buffers = ckpt.load(_core.shared_engine(), device, None, False)
        t2 = time.perf_counter()
        tensors = {i.name: _core.info_tensor(b, i) for i, b in zip(ckpt.tensors, buffers)}
        t3 = time.perf_counter()
        sync()
        t4 = time.perf_counter()
        engine_s = (weightlift.last_report() or {}).get("seconds")
        del tensors, buffers
        t5 = time.perf_counter()
        return {"open_s": t1 - t0, "load_call_s": t2 - t1, "engine_s": engine_s, "tensors_s": t3 - t2,
                "sync_s": t4 - t3, "free_s": t5 - t4}

    torch.zeros(1, device=device)
    if os.environ.get("WL_BENCH_POOL_RELEASE_THRESHOLD") == "max":
        keep_freed_device_memory()
    one(plain), one(packed), one(plain, True)  # first loads: staging, decoder and hash kernels start-up
    out: dict = {"plain": [], "packed": [], "plain_verify": []}
    for _ in range(runs):
        for name, path, verify in (("plain", plain, False), ("packed", packed, False), ("plain_verify", plain, True)):
            secs, fig = one(path, verify)
            out[name].append({"wall_s": secs, **fig})
    out["phases"] = {"plain": [phases(plain) for _ in range(3)], "packed": [phases(packed) for _ in range(3)]}
    return out


def median(rows: list, key: str):
    xs = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return statistics.median(xs) if xs else None


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--size", default="4GiB")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--device", default="cuda:0", help="cpu: a smoke run of this script off the GPU machine")
    ap.add_argument("--codec", default="huffman", help="the pack's codec (weightlift pack --codec)")
    ap.add_argument("--variant", action="append", help='space-separated NAME=VALUE settings (repeatable); "" for the defaults')
    args = ap.parse_args()
    args.outdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="wl-pack-settings-", dir=args.dir))
    plain, packed = work / "weights.safetensors", work / "weights.wlpack"
    try:
        plb.weights_bf16(plain, plb.parse_size(args.size), args.device)
        packing = plb.pack(plain, packed, args.codec)
        plb.checksum(plain)  # the manifest verify=True checks against
        raw = sum(t["data_offsets"][1] - t["data_offsets"][0] for k, t in _header(plain).items() if k != "__metadata__")
        for p in (plain, packed):  # into the page cache
            with open(p, "rb") as f:
                while f.read(64 << 20):
                    pass
        result = {"size": args.size, "codec": args.codec, "raw_bytes": raw, "pack": packing, "runs": args.runs,
                  "device": args.device, "variants": {},
                  "pinned_ceiling_gbps": plb.pinned_ceiling(args.device) if args.device.startswith("cuda") else None}
        for variant in args.variant if args.variant is not None else VARIANTS:
            env = dict(os.environ)
            env.update(dict(kv.split("=", 1) for kv in variant.split()))
            run = subprocess.run([sys.executable, __file__, "--child", str(plain), str(packed), str(args.runs), args.device],
                                 env=env, capture_output=True, text=True, timeout=300)
            if run.returncode != 0:
                result["variants"][variant or "defaults"] = {"error": run.stderr[-2000:]}
                print(f"{variant or 'defaults'}: failed", run.stderr[-500:], flush=True)
                continue
            rows = json.loads(run.stdout.strip().splitlines()[-1])
            entry = {"runs": rows, "plain_gbps": raw / median(rows["plain"], "wall_s") / 1e9,
                     "packed_gbps": raw / median(rows["packed"], "wall_s") / 1e9,
                     "verify_cost_median_of_pairs": statistics.median(
                         v["wall_s"] / p["wall_s"] - 1 for p, v in zip(rows["plain"], rows["plain_verify"]))}
            for name in ("plain", "packed", "plain_verify"):
                entry[f"{name}_medians"] = {k: median(rows[name], k) for k in rows[name][0]}
            entry["phases_medians"] = {n: {k: median(v, k) for k in v[0]} for n, v in rows["phases"].items()}
            result["variants"][variant or "defaults"] = entry
            m = entry["packed_medians"]
            print(f"{variant or 'defaults':40s} plain {entry['plain_gbps']:6.2f} GB/s  packed {entry['packed_gbps']:6.2f} GB/s "
                  f"({entry['packed_gbps'] / (result['pinned_ceiling_gbps'] or float('nan')):.3f} of pinned); packed: wall {m['wall_s'] * 1e3:.1f} ms, "
                  f"engine {m['seconds'] * 1e3:.1f}, reads {1e3 * (m.get('times.io') or 0):.1f}, alloc {1e3 * (m.get('times.alloc') or 0):.1f}, "
                  f"decode wait {1e3 * (m.get('pack.decode_secs') or 0):.1f}; verify +{100 * entry['verify_cost_median_of_pairs']:.1f} %", flush=True)
            for n, ph in entry["phases_medians"].items():
                print(f"    {n} load_file's steps, ms: " + ", ".join(f"{k[:-2]} {1e3 * v:.1f}" for k, v in ph.items() if v is not None), flush=True)
        # The steps of opening the pack, timed by examples/pack_open where it sits beside the weightlift binary.
        wl = os.environ.get("WEIGHTLIFT_BIN", "weightlift")
        opener = Path(shutil.which(wl) or wl).parent / "pack_open"
        if opener.is_file():
            run = subprocess.run([str(opener), str(packed), "30"], capture_output=True, text=True, timeout=120)
            result["pack_open"] = json.loads(run.stdout) if run.returncode == 0 else {"error": run.stderr[-2000:]}
            print("opening the pack, ms (min / median of 30): " + ", ".join(
                f"{k} {v['min_ms']:.2f} / {v['median_ms']:.2f}" for k, v in result["pack_open"].items() if k != "error"),
                flush=True)
        with open(args.outdir / "pack-settings.json", "w") as f:
            json.dump(result, f, indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _header(path: Path) -> dict:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))


if __name__ == "__main__":
    sys.exit(main())
