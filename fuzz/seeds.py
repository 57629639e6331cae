"""Fuzzing seeds written by the upstream packages: safetensors files from ``safetensors``, GGUF files from
``gguf`` (with quantized tensors from ``gguf.quants``), and Hugging Face style shard indexes.

Usage: python fuzz/seeds.py DIR  (writes DIR/<target>/upstream_*; run by scripts/fuzz). Tensors are tiny: the
fuzzer works on headers, and every byte of a seed costs time on every execution."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import save_file


def llama_like(rng: np.random.Generator, layers: int) -> dict[str, np.ndarray]:
    t = {"model.embed_tokens.weight": rng.standard_normal((8, 4)).astype(np.float16)}
    for i in range(layers):
        p = f"model.layers.{i}"
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            t[f"{p}.self_attn.{name}.weight"] = rng.standard_normal((4, 4)).astype(np.float16)
        t[f"{p}.input_layernorm.weight"] = rng.standard_normal(4).astype(np.float32)
    t["model.norm.weight"] = rng.standard_normal(4).astype(np.float32)
    return t


def write_safetensors(out: Path, rng: np.random.Generator) -> None:
    mixed = {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "f64": rng.standard_normal(2),
        "i64": rng.integers(-9, 9, 4),
        "i8": rng.integers(-9, 9, (2, 2)).astype(np.int8),
        "u16": rng.integers(0, 99, 3).astype(np.uint16),
        "bool": rng.integers(0, 2, 5).astype(bool),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }
    save_file(mixed, str(out / "upstream_mixed.safetensors"), metadata={"format": "np", "note": "seed"})
    save_file(llama_like(rng, 2), str(out / "upstream_llama.safetensors"))
    save_file({}, str(out / "upstream_empty.safetensors"))


def write_gguf(out: Path, rng: np.random.Generator) -> None:
    for version_name, quant in (("q8_0", gguf.GGMLQuantizationType.Q8_0), ("q4_0", gguf.GGMLQuantizationType.Q4_0)):
        path = out / f"upstream_{version_name}.gguf"
        w = gguf.GGUFWriter(str(path), "llama")
        w.add_name("seed")
        w.add_context_length(64)
        w.add_uint32("llama.block_count", 1)
        w.add_float32("llama.rope.freq_base", 10000.0)
        w.add_bool("general.flag", True)
        w.add_array("tokenizer.ggml.tokens", ["<s>", "</s>", "a", "b"])
        w.add_array("tokenizer.ggml.scores", [0.0, 0.5, 1.0, 1.5])
        w.add_tensor("token_embd.weight", rng.standard_normal((2, 32)).astype(np.float32))
        w.add_tensor("blk.0.attn_norm.weight", rng.standard_normal(32).astype(np.float16))
        q = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), quant)
        w.add_tensor("blk.0.attn_q.weight", q, raw_dtype=quant)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


def write_shard_indexes(out: Path, rng: np.random.Generator) -> None:
    t = llama_like(rng, 2)
    names = sorted(t)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    total = sum(a.nbytes for a in t.values())
    weight_map = {n: shard for shard, ns in shards.items() for n in ns}
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "upstream_model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    # The fuzz target places one shard, s.safetensors holding "w", beside every index it reads.
    local = {"metadata": {"total_size": 2, "format": "pt"}, "weight_map": {"w": "s.safetensors"}}
    (out / "upstream_local.safetensors.index.json").write_text(json.dumps(local, indent=2))


def main() -> None:
    root = Path(sys.argv[1])
    rng = np.random.default_rng(15)
    for target, write in (("safetensors", write_safetensors), ("gguf", write_gguf), ("shard_index", write_shard_indexes)):
        out = root / target
        out.mkdir(parents=True, exist_ok=True)
        write(out, rng)
        detect = root / "detect"
        detect.mkdir(parents=True, exist_ok=True)
        for f in out.glob("upstream_*"):
            (detect / f.name).write_bytes(f.read_bytes())


if __name__ == "__main__":
    main()
