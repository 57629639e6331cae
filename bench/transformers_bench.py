#!/usr/bin/env python3
"""Time to a ready transformers model on a GPU: weightlift.transformers.from_pretrained against transformers' own
from_pretrained(device_map=DEVICE) and against from_pretrained inside weightlift.transformers.patch(), on checkpoints
written here by save_pretrained (a ~1 B-parameter Llama in bf16, sharded; a MiniLM-shaped BERT encoder in float32).

"Ready" means the call returned a model in eval mode on the device and the device was synchronised. Warm runs read
page-cached files (each file is read once first); cold runs drop the page cache right before each run
(`sync; echo 3 > /proc/sys/vm/drop_caches`, needs root). Methods are interleaved run by run; each method is called
once untimed first (CUDA context, weightlift's engine, transformers' lazy imports), and that first call is reported
on its own. After the timings, the three models of each checkpoint are compared: every parameter and buffer byte
for byte, and the outputs of one forward pass bit for bit.

Usage: python3 bench/transformers_bench.py OUTDIR [--runs 3] [--device cuda:0] [--dir /tmp]
Writes OUTDIR/transformers.json and prints a summary.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

# Deterministic cuBLAS, so that two loads of the same weights give the same bits (set before CUDA starts).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def say(msg: str) -> None:
    """Progress on stderr, so that a run cut short shows where it was."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        return True
    except OSError:
        return False


def read_through(folder: str) -> None:
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), "rb") as f:
            while f.read(16 << 20):
                pass


def build(kind: str, root: str, device: str, tiny: bool) -> dict:
    import torch
    import transformers as T

    if tiny:  # a smoke run of this script off the GPU machine: same code, small shapes
        config = (T.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, tie_word_embeddings=True) if kind == "llama-1b" else
                  T.BertConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128))
        cls, auto, dtype, shard = ((T.LlamaForCausalLM, T.AutoModelForCausalLM, torch.bfloat16, "40KB") if kind == "llama-1b" else
                                   (T.BertModel, T.AutoModel, torch.float32, "10GB"))
    elif kind == "llama-1b":
        # Llama-3.2-1B's shape with a 32k vocabulary: 1.03 B parameters, tied embeddings, bf16, 500 MB shards.
        config = T.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                               num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096,
                               tie_word_embeddings=True, rope_theta=500000.0)
        cls, auto, dtype, shard = T.LlamaForCausalLM, T.AutoModelForCausalLM, torch.bfloat16, "500MB"
    else:
        # all-MiniLM-L6-v2's shape: 22.7 M parameters, float32, one file.
        config = T.BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                              intermediate_size=1536, max_position_embeddings=512)
        cls, auto, dtype, shard = T.BertModel, T.AutoModel, torch.float32, "10GB"
    folder = os.path.join(root, kind)
    torch.manual_seed(0)
    with torch.device(device):
        model = cls._from_config(config, dtype=dtype)
    with torch.no_grad():
        for p in model.parameters():  # norms start at one and biases at zero: make every tensor distinct
            p.add_(torch.randn_like(p) * 0.02)
    t = time.perf_counter()
    model.save_pretrained(folder, max_shard_size=shard)
    saved = time.perf_counter() - t
    info = {"kind": kind, "class": cls.__name__, "parameters": model.num_parameters(), "dtype": str(dtype),
            "files": sorted(os.listdir(folder)), "bytes": sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)),
            "save_seconds": saved}
    del model
    release()
    return {"folder": folder, "auto": auto, "info": info}


def methods(device: str, accelerate: bool) -> dict:
    import weightlift.transformers as wt

    def direct(auto, folder):
        return wt.from_pretrained(auto, folder, device=device)

    if accelerate and device != "cpu":
        def reference(auto, folder):
            return auto.from_pretrained(folder, device_map=device)

        def patched(auto, folder):
            with wt.patch():
                return auto.from_pretrained(folder, device_map=device)
    else:  # transformers needs accelerate for device_map; without it users load on the host and move the model
        def reference(auto, folder):
            return auto.from_pretrained(folder).to(device)

        def patched(auto, folder):
            with wt.patch():
                return auto.from_pretrained(folder).to(device)
    return {"weightlift": direct, "transformers": reference, "transformers+patch": patched}


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, auto, folder) -> tuple[float, object]:
    sync()
    t = time.perf_counter()
    model = fn(auto, folder)
    sync()
    return time.perf_counter() - t, model


def release() -> None:
    import torch

    gc.collect()
    sync()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def stats(xs: list[float]) -> dict:
    return {"runs": xs, "median": statistics.median(xs), "best": min(xs)} if xs else {}


def measure(ckpt: dict, fns: dict, runs: int, cold_ok: bool) -> dict:
    auto, folder = ckpt["auto"], ckpt["folder"]
    out = {name: {"first_call": None, "warm": [], "cold": []} for name in fns}
    read_through(folder)
    for name, fn in fns.items():
        out[name]["first_call"], model = timed(fn, auto, folder)
        say(f"first call {name}: {out[name]['first_call']:.2f} s")
        del model
        release()
    for _ in range(runs):
        for name, fn in fns.items():
            read_through(folder)
            secs, model = timed(fn, auto, folder)
            out[name]["warm"].append(secs)
            say(f"warm {name}: {secs:.3f} s")
            del model
            release()
    if cold_ok:
        for _ in range(runs):
            for name, fn in fns.items():
                t = time.perf_counter()
                drop_caches()
                dropped = time.perf_counter() - t
                secs, model = timed(fn, auto, folder)
                out[name]["cold"].append(secs)
                say(f"cold {name}: {secs:.3f} s (dropping the page cache took {dropped:.1f} s)")
                del model
                release()
    return {name: {"first_call": v["first_call"], "warm": stats(v["warm"]), "cold": stats(v["cold"])} for name, v in out.items()}


def compare(ckpt: dict, fns: dict, device: str) -> dict:
    """Every parameter and buffer, and one forward pass, of each method's model against transformers'."""
    import torch

    auto, folder = ckpt["auto"], ckpt["folder"]
    models = {name: fn(auto, folder) for name, fn in fns.items()}
    ref = models["transformers"]
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, ref.config.vocab_size, (2, 64), generator=g).to(device)
    mask = torch.ones_like(ids)
    mask[1, 40:] = 0

    def state(m):
        return dict(m.named_parameters(remove_duplicate=False)) | dict(m.named_buffers(remove_duplicate=False))

    def out(m):
        with torch.no_grad():
            r = m(input_ids=ids, attention_mask=mask)
        return r["logits"] if "logits" in r else r["last_hidden_state"]

    def same(a, b):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))

    ref_state, ref_out = state(ref), out(ref)
    result = {"reference_repeatable": same(ref_out, out(ref))}
    for name, m in models.items():
        if name == "transformers":
            continue
        s = state(m)
        differing = sorted(k for k in ref_state if k not in s or not same(s[k].detach(), ref_state[k].detach()))
        result[name] = {
            "tensors": len(ref_state),
            "tensors_differing": differing[:20],
            "names_equal": set(s) == set(ref_state),
            "on_device": all(t.device == torch.device(device) for t in s.values()),
            "eval_mode": not m.training,
            "outputs_bit_equal": same(out(m), ref_out),
        }
    del models, ref
    release()
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where to write the checkpoints (local disk)")
    ap.add_argument("--models", default="llama-1b,bert-minilm")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold runs (they drop the whole page cache)")
    ap.add_argument("--tiny", action="store_true", help="small shapes: a smoke run of this script (with --device cpu off the GPU machine)")
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)

    import torch
    import transformers
    import weightlift
    import weightlift.transformers as wt

    if args.device.startswith("cuda") and (not torch.cuda.is_available() or not weightlift.cuda_available()):
        print("transformers bench: no usable CUDA device", file=sys.stderr)
        return 2
    try:
        import accelerate  # noqa: F401
        have_accelerate = True
    except ImportError:
        have_accelerate = False
    torch.zeros(1, device=args.device)
    root = tempfile.mkdtemp(prefix="wl-transformers-bench-", dir=args.dir)
    started = time.perf_counter()
    say("dropping the page cache once (checks that cold runs can happen)")
    cold_ok = not args.no_cold and drop_caches()
    say(f"cold runs: {cold_ok}")
    result = {
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
                     "weightlift": weightlift.__version__, "accelerate": have_accelerate},
        "gpu": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else None,
        "device": args.device,
        "tiny": args.tiny,
        "checkpoint_dir": root,
        "cold_runs": cold_ok,
        "baseline": "from_pretrained(device_map=...)" if have_accelerate else "from_pretrained() then .to(device) (accelerate absent)",
        "tested_transformers": wt.TESTED_TRANSFORMERS,
        "models": {},
    }
    try:
        for kind in args.models.split(","):
            say(f"building {kind}")
            ckpt = build(kind, root, args.device, args.tiny)
            say(f"built {kind}: {ckpt['info']['files']}")
            fns = methods(args.device, have_accelerate)
            times = measure(ckpt, fns, args.runs, cold_ok)
            report = weightlift.last_report()
            entry = {**ckpt["info"], "times": times, "equality": compare(ckpt, fns, args.device),
                     "weightlift_last_load": {k: report.get(k) for k in ("backend", "bytes", "seconds", "gbps", "direct_bytes", "buffered_bytes")} if report else None}
            for case in ("warm", "cold"):
                base, ours, patched = (times[n][case].get("median") for n in ("transformers", "weightlift", "transformers+patch"))
                if base and ours:
                    entry[f"{case}_speedup_median"] = base / ours
                    entry[f"{case}_patch_over_direct"] = patched / ours
            result["models"][kind] = entry
            shutil.rmtree(ckpt["folder"], ignore_errors=True)
            print(summary(kind, entry), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result["total_seconds"] = time.perf_counter() - started
    with open(os.path.join(args.outdir, "transformers.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    ok = all(all(v.get("outputs_bit_equal") and not v.get("tensors_differing") for k, v in m["equality"].items() if isinstance(v, dict))
             for m in result["models"].values())
    print(f"total {result['total_seconds']:.0f} s; every model equal to transformers': {ok}")
    return 0 if ok else 1


def summary(kind: str, e: dict) -> str:
    lines = [f"{kind}: {e['parameters'] / 1e6:.1f} M parameters, {e['bytes'] / 1e9:.2f} GB in {len(e['files'])} files"]
    for name, t in e["times"].items():
        w, c = t["warm"], t["cold"]
        cold = f", cold median {c['median']:.3f} s best {c['best']:.3f}" if c else ""
        lines.append(f"  {name:20s} first {t['first_call']:.3f} s, warm median {w['median']:.3f} s best {w['best']:.3f}{cold}")
    for case in ("warm", "cold"):
        if f"{case}_speedup_median" in e:
            lines.append(f"  {case}: transformers / weightlift {e[f'{case}_speedup_median']:.2f}x, "
                         f"patch / direct {e[f'{case}_patch_over_direct']:.3f}")
    lines.append(f"  equality: {json.dumps(e['equality'])}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
