#!/usr/bin/env python3
"""A transformers model run layer by layer under a GPU memory cap: weightlift.stream_model against the whole model.

The checkpoint is the ~1 B-parameter Llama of transformers_bench.py (bf16, written by save_pretrained, sharded). The
whole model runs first, uncapped: its logits are the reference, and its forward time is the compute time. Then the
process's GPU memory is capped (torch.cuda.set_per_process_memory_fraction) below the model's weight bytes, loading
the whole model under the cap is tried (it must fail), and the model runs with its decoder layers streamed through
1 slot (no overlap possible: each layer is read, then computed) and through 2 slots (the next layer is read while
the current one computes). Every streamed forward's logits must equal the reference bit for bit.

Overlap = (time with 1 slot − time with 2 slots) / min(compute time, read time): 1.0 when the shorter of the two
is entirely hidden behind the longer, 0 when nothing overlaps. Timings are medians of --runs forwards after one
untimed forward; the checkpoint is page-cached (read once before).

Usage: python3 bench/layer_streamer_bench.py OUTDIR [--runs 5] [--device cuda:0] [--batch 8] [--seq 1024] [--tiny]
Writes OUTDIR/layer_streamer.json and prints a summary.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import transformers_bench  # noqa: E402  (the checkpoint builder)


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def timed_forwards(model, ids, device: str, runs: int) -> tuple[list[float], "object"]:
    import torch

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
    with torch.no_grad():
        out = model(input_ids=ids).logits  # untimed: first call
        sync(device)
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            out = model(input_ids=ids).logits
            sync(device)
            times.append(time.perf_counter() - t)
    return times, out


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def raw(t) -> bytes:
    import torch

    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--cap", type=float, default=0.6, help="GPU memory cap as a fraction of the model's weight bytes plus activations")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--tiny", action="store_true", help="small shapes: a smoke run of this script (with --device cpu off the GPU machine)")
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)

    import torch
    import transformers
    import weightlift
    import weightlift.transformers as wt

    cuda = args.device.startswith("cuda")
    if cuda and (not torch.cuda.is_available() or not weightlift.cuda_available()):
        print("layer streamer bench: no usable CUDA device", file=sys.stderr)
        return 2
    root = tempfile.mkdtemp(prefix="wl-layers-bench-", dir=args.dir)
    result: dict = {
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
                     "weightlift": weightlift.__version__},
        "gpu": torch.cuda.get_device_name(args.device) if cuda else None,
        "device": args.device,
        "tiny": args.tiny,
        "runs": args.runs,
    }
    try:
        say("building the checkpoint")
        ckpt = transformers_bench.build("llama-1b", root, "cpu", args.tiny)
        say(f"built: {ckpt['info']['files']}")
        folder, auto = ckpt["folder"], ckpt["auto"]
        transformers_bench.read_through(folder)
        files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
        index = os.path.join(folder, "model.safetensors.index.json")
        source = index if os.path.exists(index) else os.path.join(folder, files[0])
        weight_bytes = sum(os.path.getsize(os.path.join(folder, f)) for f in files)
        vocab = 256 if args.tiny else 32000
        g = torch.Generator().manual_seed(0)
        batch, seq = (2, 16) if args.tiny else (args.batch, args.seq)
        ids = torch.randint(0, vocab, (batch, seq), generator=g).to(args.device)
        result["model"] = {**ckpt["info"], "weight_bytes": weight_bytes, "batch": batch, "seq": seq}

        # 1. The whole model, uncapped: reference logits and compute time.
        whole = wt.from_pretrained(auto, folder, device=args.device)
        say("whole model loaded")
        base = torch.cuda.memory_allocated(args.device) if cuda else 0
        times, ref = timed_forwards(whole, ids, args.device, args.runs)
        ref_bytes = raw(ref)
        # What a forward allocates beyond the weights (torch's allocator; the weights may live in weightlift's).
        activations = torch.cuda.max_memory_allocated(args.device) - base if cuda else None
        compute = statistics.median(times)
        result["whole"] = {"forward_seconds": times, "median": compute, "activation_bytes": activations}
        del whole, ref
        gc.collect()

        # 2. The cap (torch's allocator, which the streamer's slots and the rest of the model use): --cap of the
        # weights plus a forward's activations, so the whole model (weights + activations) cannot fit under it.
        cap_bytes = None
        if cuda:
            torch.cuda.empty_cache()
            total = torch.cuda.get_device_properties(args.device).total_memory
            need = weight_bytes + activations
            cap_bytes = int(args.cap * weight_bytes + activations)
            torch.cuda.set_per_process_memory_fraction(cap_bytes / total, args.device)
            try:
                blob = torch.empty(need, dtype=torch.uint8, device=args.device)
                del blob
                whole_under_cap = "allocated (the cap is not binding)"
            except torch.OutOfMemoryError as e:
                whole_under_cap = f"OutOfMemoryError allocating the whole model's {need} bytes: {str(e).splitlines()[0][:160]}"
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(args.device)
            result["cap"] = {"bytes": cap_bytes, "whole_model_needs": need, "cap_over_need": cap_bytes / need,
                             "whole_model_under_cap": whole_under_cap}

        # 3. Streamed through 1 and 2 slots.
        result["streamed"] = {}
        for slots in (1, 2):
            say(f"streamed, {slots} slot(s)")
            model = wt.from_pretrained(auto, folder, device="cpu")
            handle = weightlift.stream_model(model, source, device=args.device, slots=slots)
            before = handle.stats()
            times, out = timed_forwards(model, ids, args.device, args.runs)
            after = handle.stats()
            equal = raw(out) == ref_bytes
            n = args.runs + 1
            entry = {
                "forward_seconds": times,
                "median": statistics.median(times),
                "logits_bit_equal": equal,
                "peak_bytes": torch.cuda.max_memory_allocated(args.device) if cuda else None,  # under the cap
                "within_cap": (torch.cuda.max_memory_allocated(args.device) <= cap_bytes) if cuda else None,
                "slot_bytes": handle.streamer.slot_bytes,
                "layers": len(handle.streamer),
                "read_seconds_per_forward": (after["load_seconds"] - before["load_seconds"]) / n,
                "wait_seconds_per_forward": (after["wait_seconds"] - before["wait_seconds"]) / n,
                "bytes_per_forward": (after["bytes"] - before["bytes"]) / n,
                "stats": after,
            }
            entry["read_gbps"] = entry["bytes_per_forward"] / entry["read_seconds_per_forward"] / 1e9 if entry["read_seconds_per_forward"] else None
            result["streamed"][f"slots_{slots}"] = entry
            handle.close()
            del model, out
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
        one, two = result["streamed"]["slots_1"], result["streamed"]["slots_2"]
        # With one slot every layer is read on every forward and nothing hides it: that is the read time.
        read = one["read_seconds_per_forward"]
        hidden = one["median"] - two["median"]
        result["overlap"] = {
            "compute_seconds": compute,
            "read_seconds": read,
            "one_slot_seconds": one["median"],
            "two_slots_seconds": two["median"],
            "hidden_seconds": hidden,
            "overlap_fraction": hidden / min(compute, read) if min(compute, read) > 0 else None,
            "two_slots_over_bound": two["median"] / max(compute, read),
            "what_is_hidden": "compute behind reads" if read >= compute else "reads behind compute",
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    with open(os.path.join(args.outdir, "layer_streamer.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    ok = all(e["logits_bit_equal"] for e in result["streamed"].values())
    o = result["overlap"]
    print(f"layer streamer: {result['streamed']['slots_2']['layers']} layers, batch {batch}x{seq}; whole model {o['compute_seconds'] * 1e3:.1f} ms/forward;"
          f" streamed 1 slot {o['one_slot_seconds'] * 1e3:.1f} ms, 2 slots {o['two_slots_seconds'] * 1e3:.1f} ms; reads {o['read_seconds'] * 1e3:.1f} ms"
          f" ({result['streamed']['slots_2']['read_gbps'] or 0:.1f} GB/s); overlap {o['overlap_fraction'] or 0:.2f} ({o['what_is_hidden']});"
          f" cap {result.get('cap', {}).get('bytes')} B, whole model under it: {result.get('cap', {}).get('whole_model_under_cap')};"
          f" logits bit-equal: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
