#!/usr/bin/env python3
"""Why opening a pack costs more inside a run of loads than alone: times ``weightlift``'s opening of a pack's index
(the step ``load_file`` starts with) in one process, several ways interleaved:

- ``alone``: opened again right after the previous opening;
- ``after_load``: opened right after a ``load_file`` of the pack onto the device returned and was synchronised
  (its tensors freed first), as in a run of loads;
- ``after_load_pause``: the same with a pause of ``--pause`` seconds between the load and the opening;
- ``after_alloc``: opened right after allocating, filling and freeing an eighth as many bytes of host memory as the
  load's tensors hold, in 4 MiB pieces (fresh pages taken from the system and given back).

Usage: pack_open_timing.py PACK OUT.json [--device cuda:0] [--rounds 9] [--pause 0.05]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pack")
    ap.add_argument("out")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--pause", type=float, default=0.05)
    args = ap.parse_args()
    import torch
    import weightlift
    from weightlift.safetensors import _checkpoint

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize(args.device)

    def opening() -> float:
        t = time.perf_counter()
        ckpt = _checkpoint(args.pack)
        secs = time.perf_counter() - t
        del ckpt
        return secs

    def load() -> int:
        tensors = weightlift.load_file(args.pack, args.device)
        sync()
        n = sum(t.nbytes for t in tensors.values())
        del tensors
        sync()
        return n

    nbytes = load()  # the first load: engine, staging, decoder set up
    times: dict = {k: [] for k in ("alone", "after_load", "after_load_pause", "after_alloc")}
    for _ in range(args.rounds):
        opening()
        times["alone"].append(opening())
        load()
        times["after_load"].append(opening())
        load()
        time.sleep(args.pause)
        times["after_load_pause"].append(opening())
        pieces = [bytearray(4 << 20) for _ in range(max(1, nbytes // (4 << 20)) // 8)]
        del pieces
        times["after_alloc"].append(opening())
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print("opening the pack, median ms:", {k: round(v, 2) for k, v in med.items()}, flush=True)
    with open(args.out, "w") as f:
        json.dump({"script": "bench/pack_open_timing.py", "argv": sys.argv[1:], "times_s": times,
                   "median_ms": med, "load_bytes": nbytes}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
