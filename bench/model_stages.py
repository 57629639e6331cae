#!/usr/bin/env python3
"""Where the time to a ready transformers model goes: the steps of transformers' from_pretrained and of
weightlift.transformers.from_pretrained, timed by wrapping the functions that do them (wall clock, per thread, the
outermost call only), warm, for the checkpoints of bench/transformers_bench.py.

Each step's time is the median over the runs; "unaccounted" is the call's time less the steps of the calling thread.
weightlift reads the checkpoint on a thread of its own while transformers builds the model: that read is reported as
an interval (start and end from the start of the call), beside the steps of the calling thread.

Usage: python3 bench/model_stages.py OUTDIR [--runs 7] [--device cuda:0] [--models bert-minilm,llama-1b]
Writes OUTDIR/model-stages.json and prints a table.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformers_bench as tb  # noqa: E402  (the same checkpoints and methods)


class Stages:
    """Wraps functions so that each outermost call on a thread adds (name, thread, start, end) to the record."""

    def __init__(self) -> None:
        self.record: list[tuple[str, str, float, float]] = []
        self._depth = threading.local()
        self._undo: list = []

    def wrap(self, owner: object, attr: str, name: str) -> None:
        raw = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
        fn = raw.__func__ if kind else raw

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            depth = getattr(self._depth, name, 0)
            setattr(self._depth, name, depth + 1)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                setattr(self._depth, name, depth)
                if depth == 0:
                    self.record.append((name, threading.current_thread().name, start, time.perf_counter()))

        setattr(owner, attr, kind(timed) if kind else timed)
        self._undo.append((owner, attr, raw))

    def undo(self) -> None:
        for owner, attr, raw in reversed(self._undo):
            setattr(owner, attr, raw)
        self._undo.clear()


def install(stages: Stages, model_classes: list) -> None:
    import torch
    import transformers
    from transformers import modeling_utils

    import weightlift.transformers as wt

    pm = modeling_utils.PreTrainedModel
    stages.wrap(transformers.AutoConfig, "from_pretrained", "config")
    stages.wrap(modeling_utils, "_get_resolved_checkpoint_files", "resolve files")
    stages.wrap(modeling_utils, "_get_dtype", "dtype rules")
    for cls in model_classes:
        stages.wrap(cls, "__init__", "model __init__ (meta)")
    stages.wrap(modeling_utils, "caching_allocator_warmup", "allocator warm-up")
    stages.wrap(modeling_utils, "convert_and_load_state_dict_in_model", "state dict into model")
    stages.wrap(pm, "_finalize_model_loading", "finalize (missing keys, buffers, ties)")
    stages.wrap(torch.nn.Module, "eval", "eval()")
    stages.wrap(torch.nn.Module, "to", "Module.to")
    stages.wrap(wt, "_load_aligned" if hasattr(wt, "_load_aligned") else "load_file", "weightlift read")
    stages.wrap(wt._Prefetch, "take", "wait for the read")
    stages.wrap(wt, "_aligned", "align copies")


def run(fn, auto, folder, stages: Stages) -> dict:
    stages.record.clear()
    tb.sync()
    t0 = time.perf_counter()
    model = fn(auto, folder)
    t_sync = time.perf_counter()
    tb.sync()
    t_end = time.perf_counter()
    total = t_end - t0
    del model
    main = threading.current_thread().name
    steps: dict[str, float] = {}
    other: dict[str, list[float]] = {}
    for name, thread, start, end in stages.record:
        if thread == main:
            steps[name] = steps.get(name, 0.0) + (end - start)
        else:
            other.setdefault(name, [start - t0, end - t0])
    steps["device sync at the end"] = t_end - t_sync
    steps["unaccounted"] = total - sum(steps.values())
    return {"total": total, "steps": steps, "other_threads": other}


def median_of(runs: list[dict]) -> dict:
    names = sorted({k for r in runs for k in r["steps"]})
    threads = sorted({k for r in runs for k in r["other_threads"]})
    return {
        "total": statistics.median(r["total"] for r in runs),
        "steps": {k: statistics.median(r["steps"].get(k, 0.0) for r in runs) for k in names},
        "other_threads": {k: [statistics.median(r["other_threads"][k][i] for r in runs if k in r["other_threads"]) for i in (0, 1)]
                          for k in threads},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--models", default="bert-minilm,llama-1b")
    ap.add_argument("--tiny", action="store_true", help="small shapes (a smoke run off the GPU machine)")
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)

    import torch
    import transformers

    try:
        import accelerate  # noqa: F401
        have_accelerate = True
    except ImportError:
        have_accelerate = False
    if args.device.startswith("cuda"):
        torch.zeros(1, device=args.device)
    root = tempfile.mkdtemp(prefix="wl-model-stages-", dir=args.dir)
    result = {"transformers": transformers.__version__, "torch": torch.__version__, "device": args.device,
              "gpu": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else None,
              "runs": args.runs, "models": {}}
    try:
        for kind in args.models.split(","):
            ckpt = tb.build(kind, root, args.device, args.tiny)
            fns = tb.methods(args.device, have_accelerate)
            tb.read_through(ckpt["folder"])
            for fn in fns.values():  # first calls (CUDA context, engine, lazy imports) are not what is measured
                fn(ckpt["auto"], ckpt["folder"])
                tb.release()
            stages = Stages()
            install(stages, [getattr(transformers, ckpt["info"]["class"])])
            runs: dict[str, list] = {name: [] for name in fns}
            try:
                for _ in range(args.runs):
                    for name, fn in fns.items():
                        runs[name].append(run(fn, ckpt["auto"], ckpt["folder"], stages))
                        tb.release()
            finally:
                stages.undo()
            entry = {**ckpt["info"], "methods": {name: {"median": median_of(r), "runs": r} for name, r in runs.items()}}
            result["models"][kind] = entry
            shutil.rmtree(ckpt["folder"], ignore_errors=True)
            print(table(kind, entry), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    with open(os.path.join(args.outdir, "model-stages.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


def table(kind: str, entry: dict) -> str:
    methods = entry["methods"]
    names = sorted({k for m in methods.values() for k in m["median"]["steps"]})
    lines = [f"{kind} ({entry['parameters'] / 1e6:.1f} M parameters), medians in ms",
             f"  {'step':42s}" + "".join(f"{n:>20s}" for n in methods)]
    lines.append(f"  {'TOTAL':42s}" + "".join(f"{m['median']['total'] * 1e3:20.2f}" for m in methods.values()))
    for k in names:
        lines.append(f"  {k:42s}" + "".join(f"{m['median']['steps'].get(k, 0.0) * 1e3:20.2f}" for m in methods.values()))
    for n, m in methods.items():
        for k, (a, b) in m["median"]["other_threads"].items():
            lines.append(f"  {n}: {k} on its own thread from {a * 1e3:.2f} to {b * 1e3:.2f} ms")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
