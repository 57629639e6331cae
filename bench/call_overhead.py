#!/usr/bin/env python3
"""Where a Python `weightlift.load_file` call spends the time outside the engine's own clock, on a GPU.

On an H200 the engine's clock (`last_report()["seconds"]`) of a warm 4.49 GB load ran about 1 ms under the
caller's (bench/results/2026-11-27-h200-i). This times, for each of ``--runs`` warm loads in one process (after two
untimed ones), the steps of `weightlift.safetensors.load_file` as it makes them:

- ``checkpoint_s``: opening the file and parsing its header (`_checkpoint`);
- ``prepare_s``: the CUDA check, the engine lookup and the device allocator (`check_cuda`, `shared_engine`,
  `device_allocator`);
- ``native_s``: the native load (`Checkpoint.load`), of which ``engine_s`` is the engine's report and the rest the
  binding's own (its worker thread, the report's conversion, the buffers);
- ``tensors_s``: the tensors made from the buffers (`info_tensors`);
- ``sync_s``: `torch.cuda.synchronize()` after the call returned (the copies are done by then: this is what a
  caller's clock adds);
- ``engine_*``: the engine's report's own times (allocation, planning, I/O, and the lanes' time delivering, waiting
  for copies and setting up, summed over the lanes).

Each load's memory is freed and PyTorch's cache emptied before the next, as bench/shapes.py's warm case does
(``--keep-cache``: not emptied, so that PyTorch's allocator hands out the blocks it cached, as in a process that
reloads a model without emptying the cache; ``--settle S``: emptied, then S seconds of waiting before the clock
starts, so that what the driver does after a free is not timed). The last load is compared byte for byte with
`safetensors`' load.

Usage: call_overhead.py FILE OUT.json [--device cuda:0] [--runs 7] [--keep-cache] [--settle S]
"""

import argparse
import json
import statistics
import sys
import time

import same_as_safetensors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("out")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--keep-cache", action="store_true", help="do not empty PyTorch's cache between loads")
    ap.add_argument("--settle", type=float, default=0.0,
                    help="seconds to wait after emptying PyTorch's cache, before the clock starts")
    a = ap.parse_args()

    import torch

    import weightlift
    from weightlift import _core
    from weightlift import safetensors as wst

    on_gpu = a.device.startswith("cuda")

    def sync() -> None:
        if on_gpu:
            torch.cuda.synchronize(a.device)

    def timed_load() -> "tuple[dict, dict]":
        t0 = time.perf_counter()
        ckpt = wst._checkpoint(a.file)
        t1 = time.perf_counter()
        _core.check_cuda(a.device)
        engine = _core.shared_engine()
        alloc, stream = _core.device_allocator(engine, a.device)
        t2 = time.perf_counter()
        buffers = ckpt.load(engine, a.device, None, False, 0, alloc, stream)
        t3 = time.perf_counter()
        infos = ckpt.tensors
        tensors = {i.name: t for i, t in zip(infos, _core.info_tensors(buffers, infos))}
        t4 = time.perf_counter()
        sync()
        t5 = time.perf_counter()
        report = weightlift.last_report()
        engine_s = report["seconds"]
        steps = {"checkpoint_s": t1 - t0, "prepare_s": t2 - t1, "native_s": t3 - t2, "engine_s": engine_s,
                 "binding_s": (t3 - t2) - engine_s, "tensors_s": t4 - t3, "sync_s": t5 - t4, "call_s": t5 - t0,
                 **{f"engine_{k}": v for k, v in report["times"].items() if isinstance(v, (int, float))}}
        return steps, tensors

    sync()
    loaded = None
    for _ in range(2):
        loaded = None
        if on_gpu and not a.keep_cache:
            torch.cuda.empty_cache()
        _, loaded = timed_load()
    runs = []
    for _ in range(a.runs):
        loaded = None
        if on_gpu and not a.keep_cache:
            torch.cuda.empty_cache()
        time.sleep(a.settle)
        steps, loaded = timed_load()
        runs.append(steps)
        print(" ".join(f"{k} {v * 1e3:.3f}ms" for k, v in steps.items()), flush=True)
    same_as_safetensors.check(a.file, loaded, "weightlift.load_file")
    medians = {k: round(statistics.median(r[k] for r in runs) * 1e3, 3) for k in runs[0]}
    print("medians, ms:", json.dumps(medians))
    with open(a.out, "w") as f:
        json.dump({"file": a.file, "device": a.device, "keep_cache": a.keep_cache, "settle_s": a.settle,
                   "tensors": len(loaded), "runs": runs, "medians_ms": medians, "verified": True}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
