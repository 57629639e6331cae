#!/usr/bin/env python3
"""What handing loaded buffers to PyTorch costs per tensor: ``torch.from_dlpack`` of a byte buffer then a dtype view
and reshape (weightlift's way before dd798ed, still the way for fp8 and wide unsigned types), against one DLPack
capsule of the tensor's own dtype and shape (``weightlift._core.info_tensors``, what ``load_file`` does now).

A checkpoint is loaded once; its buffers are then handed over again and again, the two ways interleaved, and each
result is checked against the other (dtype, shape, address). Checkpoints: FILE arguments, or a generated one of
``--tensors`` small bf16 tensors when none is given.

Usage: handover.py OUT.json [FILE ...] [--device cuda:0] [--rounds 7] [--tensors 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time


def old_way(buffers, infos, torch):
    from weightlift import _core

    table = _core.torch_dtypes()
    out = []
    for b, i in zip(buffers, infos):
        raw = torch.from_dlpack(b)
        shape = tuple(int(d) for d in i.storage_shape)
        name = "U8" if i.quantized else i.dtype
        if name == "U8":
            out.append(raw.reshape(shape))
        elif raw.numel() == 0:
            out.append(torch.empty(shape, dtype=table[name], device=raw.device))
        else:
            out.append(raw.view(table[name]).reshape(shape))
    return out


def measure(path: str, device: str, rounds: int) -> dict:
    import torch
    import weightlift
    from weightlift import _core
    from weightlift.safetensors import _checkpoint

    ckpt = _checkpoint(path)
    infos = ckpt.tensors
    buffers = ckpt.load(_core.shared_engine(), device, None, False)
    ways = {"from_dlpack_then_view": lambda: old_way(buffers, infos, torch),
            "typed_capsule": lambda: _core.info_tensors(buffers, infos)}
    a, b = ways["from_dlpack_then_view"](), ways["typed_capsule"]()
    for x, y, i in zip(a, b, infos):
        if x.dtype != y.dtype or x.shape != y.shape or (x.numel() and x.data_ptr() != y.data_ptr()):
            raise SystemExit(f"{i.name}: the two ways differ ({x.dtype} {tuple(x.shape)} against {y.dtype} {tuple(y.shape)})")
    del a, b
    times: dict = {k: [] for k in ways}
    for _ in range(rounds):
        for name, f in ways.items():
            t = time.perf_counter()
            got = f()
            times[name].append((time.perf_counter() - t) / len(infos))
            del got
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"file": path, "tensors": len(infos), "device": device, "per_tensor_s": times,
            "median_per_tensor_us": {k: v * 1e6 for k, v in med.items()},
            "speedup": med["from_dlpack_then_view"] / med["typed_capsule"], "weightlift": weightlift.__version__}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("files", nargs="*")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tensors", type=int, default=2000)
    args = ap.parse_args()
    import torch
    from safetensors.torch import save_file

    files = list(args.files)
    tmp = None
    if not files:
        tmp = tempfile.TemporaryDirectory()
        g = torch.Generator().manual_seed(1)
        path = os.path.join(tmp.name, f"small-{args.tensors}.safetensors")
        save_file({f"t{i}": torch.randn(64, 64, generator=g).to(torch.bfloat16) for i in range(args.tensors)}, path)
        files = [path]
    if args.device.startswith("cuda"):
        torch.zeros(1, device=args.device)
    rows = [measure(f, args.device, args.rounds) for f in files]
    for r in rows:
        m = r["median_per_tensor_us"]
        print(f"{os.path.basename(r['file'])}: {r['tensors']} tensors on {r['device']}: from_dlpack then view "
              f"{m['from_dlpack_then_view']:.1f} us, one typed capsule {m['typed_capsule']:.1f} us per tensor "
              f"({r['speedup']:.2f}x)", flush=True)
    with open(args.out, "w") as f:
        json.dump({"script": "bench/handover.py", "argv": sys.argv[1:], "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
