"""The files a run measures: the upstream checkpoint (a llama-shaped bf16 file written by
``safetensors.torch.save_file``), its ``torch.save`` copy, copies on tmpfs, and the same tensors written by
transformers' ``save_pretrained`` (shards and index). Each is reused while its source is unchanged."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from wlbench import log
from wlbench.checkpoint import Checkpoint, open_checkpoint
from wlbench.methods import Target, method_named


def parse_size(s: str) -> int:
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10**3, "mb": 10**6, "gb": 10**9, "b": 1}
    low = s.strip().lower()
    for u, mult in units.items():
        if low.endswith(u):
            return int(float(low[: -len(u)]) * mult)
    return int(low)


def llama_tensors(h: int, layers: int) -> list:
    """The names and shapes of weightlift's synthetic llama layout (crates/weightlift-format synth), bf16."""
    step = 256 if h >= 256 else 32
    inter, kv, vocab = -(-(h * 11 // 4) // step) * step, max(h // 4, 32), min(h * 8, 32000)
    out = [("model.embed_tokens.weight", (vocab, h))]
    for i in range(layers):
        p = f"model.layers.{i}"
        out += [(f"{p}.input_layernorm.weight", (h,)), (f"{p}.self_attn.q_proj.weight", (h, h)),
                (f"{p}.self_attn.k_proj.weight", (kv, h)), (f"{p}.self_attn.v_proj.weight", (kv, h)),
                (f"{p}.self_attn.o_proj.weight", (h, h)), (f"{p}.post_attention_layernorm.weight", (h,)),
                (f"{p}.mlp.gate_proj.weight", (inter, h)), (f"{p}.mlp.up_proj.weight", (inter, h)),
                (f"{p}.mlp.down_proj.weight", (h, inter))]
    return out + [("model.norm.weight", (h,)), ("lm_head.weight", (vocab, h))]


def llama_plan(size: int) -> list:
    """The widest model of which one layer fits in `size`, then the fewest layers that reach `size`."""
    nbytes = lambda ts: 2 * sum(math.prod(s) for _, s in ts)  # noqa: E731
    h = 4096
    while h > 64 and nbytes(llama_tensors(h, 1)) > size:
        h //= 2
    one = nbytes(llama_tensors(h, 1))
    per_layer = nbytes(llama_tensors(h, 2)) - one
    return llama_tensors(h, 1 + -(-max(0, size - one) // per_layer))


def make_upstream(path: str, size: int, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    plan = llama_plan(size)
    if os.path.exists(path):
        try:
            have = open_checkpoint(path)
            if sorted((e.name, e.shape, e.dtype) for e in have.entries) == sorted((n, s, "BF16") for n, s in plan):
                log(f"reusing {path} ({have.tensor_bytes / 2**30:.2f} GiB, {len(have.entries)} tensors)")
                return
        except (ValueError, OSError, KeyError) as e:
            log(f"rewriting {path}: {e}")
    t0 = time.perf_counter()
    g = torch.Generator().manual_seed(seed)
    tensors = {n: torch.randn(s, generator=g).mul_(0.02).to(torch.bfloat16) for n, s in plan}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    save_file(tensors, path + ".partial", metadata={"format": "pt"})
    os.replace(path + ".partial", path)
    log(f"wrote {path} with safetensors.torch.save_file: {len(plan)} tensors, "
        f"{os.path.getsize(path) / 2**30:.2f} GiB in {time.perf_counter() - t0:.1f} s")


def save_random_llama(folder: str, small: bool, device: str, shard_size: "str | None" = None) -> None:
    """A Llama of random bf16 weights (seeded: every run writes the same) saved by transformers' ``save_pretrained``
    in shards with their index, published whole (written beside ``folder``, then renamed): ~1.1 GB, 8 layers of
    width 2048 in shards of 400 MB; ~10 MB when ``small`` (2 layers of width 256, shards of 4 MB: a check of a
    script). ``shard_size`` overrides the shard size (``"32MB"``: ~34 shards of the large one; a small one is then
    cut in shards of 256 KB, ~40 of them)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    h, i, n, v = (256, 688, 2, 1000) if small else (2048, 5632, 8, 32000)
    cfg = LlamaConfig(hidden_size=h, intermediate_size=i, num_hidden_layers=n, num_attention_heads=16,
                      num_key_value_heads=16, vocab_size=v)
    torch.manual_seed(7)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    tmp = folder.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    size = ("256KB" if small else shard_size) if shard_size else ("4MB" if small else "400MB")
    model.save_pretrained(tmp, max_shard_size=size)
    del model
    os.replace(tmp, folder)


def fresh(copy: str, source: str) -> bool:
    return os.path.exists(copy) and os.path.getmtime(copy) >= os.path.getmtime(source)


def make_pt(source: str, pt: str) -> None:
    """A torch.save copy of the checkpoint's tensors, for torch.load(mmap=True)."""
    if fresh(pt, source):
        return
    import torch
    from safetensors.torch import load_file

    t0 = time.perf_counter()
    torch.save(load_file(source), pt + ".partial")
    os.replace(pt + ".partial", pt)
    log(f"wrote {pt} with torch.save in {time.perf_counter() - t0:.1f} s")


def llama_config(ckpt: Checkpoint) -> Any:
    import transformers

    shapes = {e.name: e.shape for e in ckpt.entries}
    try:
        vocab, h = shapes["model.embed_tokens.weight"]
        kv = shapes["model.layers.0.self_attn.k_proj.weight"][0]
        inter = shapes["model.layers.0.mlp.gate_proj.weight"][0]
    except (KeyError, ValueError) as e:
        raise ValueError(f"not a llama-shaped checkpoint ({e})") from None
    layers = len({n.split(".")[2] for n in shapes if n.startswith("model.layers.")})
    head_dim = next(d for d in (128, 64, 32, 16, 8, 4, 2, 1) if h % d == 0 and kv % d == 0)
    return transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=h, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=h // head_dim, num_key_value_heads=kv // head_dim, head_dim=head_dim,
        tie_word_embeddings="lm_head.weight" not in shapes)


def sized_llama_config(size: int) -> Any:
    """A Llama config of width 5120 (MLP 13824, 40 heads, vocabulary 32000) with as many layers as give at least
    `size` bf16 tensor bytes (48 layers: 31.1 GB); below 1 GB, width 256 and MLP 688 (a check of a script)."""
    from transformers import LlamaConfig

    h, i, heads, v = (5120, 13824, 40, 32000) if size >= 1 << 30 else (256, 688, 4, 1000)
    per_layer = 2 * (4 * h * h + 3 * h * i + 2 * h)
    fixed = 2 * (2 * v * h + h)
    layers = max(1, -(-(size - fixed) // per_layer))
    return LlamaConfig(hidden_size=h, intermediate_size=i, num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=heads, vocab_size=v, tie_word_embeddings=False)


def save_sized_llama(folder: str, size: int, device: str, shard_size: str) -> str:
    """A Llama of random bf16 weights (seeded) of at least `size` tensor bytes (:func:`sized_llama_config`), made in
    bf16 on `device` where it is a GPU (else the CPU) and saved by transformers' ``save_pretrained`` in shards of
    `shard_size` with their index, published whole (written beside `folder`, then renamed); reused while its config
    and shard size match. Nothing of `size` bytes is written twice (no single-file source), so a disk of twice the
    checkpoint is not needed. Returns the index's path (a one-shard model has none: an error)."""
    import torch
    from transformers import LlamaForCausalLM

    cfg = sized_llama_config(size)
    index = os.path.join(folder, "model.safetensors.index.json")
    stamp = json.dumps({"config": cfg.to_dict(), "shard_size": shard_size, "seed": 7}, sort_keys=True, default=str)
    stamp_file = os.path.join(folder, "made.json")
    if os.path.exists(index) and os.path.exists(stamp_file) and open(stamp_file).read() == stamp:
        log(f"reusing {folder}")
        return index
    t0 = time.perf_counter()
    torch.manual_seed(7)
    where = device if device.startswith("cuda") else "cpu"
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(where):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    tmp = folder.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, max_shard_size=shard_size)
    del model
    if where.startswith("cuda"):
        torch.cuda.empty_cache()
    if not os.path.exists(os.path.join(tmp, "model.safetensors.index.json")):
        raise ValueError(f"save_pretrained wrote one shard in {tmp}: give a smaller --shard-size")
    with open(os.path.join(tmp, "made.json"), "w") as f:
        f.write(stamp)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    log(f"wrote {folder} with save_pretrained: {cfg.num_hidden_layers} layers of width {cfg.hidden_size}, "
        f"{time.perf_counter() - t0:.1f} s")
    return index


def make_sharded(source: Checkpoint, out_dir: str, shard_size: str) -> str:
    """The checkpoint's tensors written by transformers' save_pretrained (shards and index); reused while the
    source file is unchanged."""
    import torch
    import transformers
    from safetensors.torch import load_file

    index = os.path.join(out_dir, "model.safetensors.index.json")
    stamp = f"{source.path}:{os.path.getsize(source.path)}:{os.path.getmtime(source.path)}:{shard_size}"
    stamp_file = os.path.join(out_dir, "source.txt")
    if os.path.exists(index) and os.path.exists(stamp_file) and open(stamp_file).read() == stamp:
        return index
    t0 = time.perf_counter()
    config = llama_config(source)
    shutil.rmtree(out_dir, ignore_errors=True)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    model.load_state_dict(load_file(source.path), strict=True, assign=True)
    model.save_pretrained(out_dir, max_shard_size=shard_size)
    del model
    if not os.path.exists(index):
        raise ValueError(f"save_pretrained wrote no index in {out_dir} (one shard?)")
    with open(stamp_file, "w") as f:
        f.write(stamp)
    log(f"wrote {out_dir} with transformers {transformers.__version__} save_pretrained in "
        f"{time.perf_counter() - t0:.1f} s")
    return index


def copy_checkpoint_to(ckpt: Checkpoint, directory: str, made: list) -> str:
    """The checkpoint copied into `directory` (a multi-file one: its index and every shard); what a loader is given
    there."""
    for f in ckpt.files:
        if f != ckpt.path:
            copy_to(f, directory, made)
    return copy_to(ckpt.path, directory, made)


def copy_to(src: str, directory: str, made: list) -> str:
    os.makedirs(directory, exist_ok=True)
    dst = os.path.join(directory, os.path.basename(src))
    if not (os.path.exists(dst) and os.path.getsize(dst) == os.path.getsize(src) and fresh(dst, src)):
        shutil.copyfile(src, dst)
    made.append(dst)
    return dst


@dataclass
class Files:
    disk: Target
    tmpfs: Optional[Target] = None
    tmpfs_why: Optional[str] = None
    sharded: Optional[Target] = None
    sharded_why: Optional[str] = None
    made: list = field(default_factory=list)  # tmpfs copies to remove at exit


def prepare_files(args: argparse.Namespace, families: list, ckpt: Checkpoint) -> Files:
    pt = None
    torch_load = method_named("torch.load(mmap=True) .to(device)")
    filters = args.methods.split(",") if args.methods else [""]
    # A .pt copy of a single file only (torch.load takes one file; its row is skipped for shards).
    if len(ckpt.files) == 1 and any(w in torch_load.name for w in filters) and set(families) & {"cold", "warm", "tmpfs", "restart"}:
        pt = ckpt.path + ".pt"
        make_pt(ckpt.path, pt)
    files = Files(Target("disk", ckpt, pt))
    if "tmpfs" in families:
        shm_ok = os.path.isdir(os.path.dirname(args.shm_dir.rstrip("/")) or "/")
        if args.shm_file or shm_ok:
            shm = args.shm_file or copy_checkpoint_to(ckpt, args.shm_dir, files.made)
            shm_pt = copy_to(pt, args.shm_dir, files.made) if pt and shm_ok else None
            files.tmpfs = Target("tmpfs", open_checkpoint(shm), shm_pt)
        else:
            files.tmpfs_why = f"no tmpfs: {os.path.dirname(args.shm_dir)} is not a directory"
    if "sharded" in families:
        try:
            out_dir = os.path.splitext(ckpt.path)[0] + "-save_pretrained"
            files.sharded = Target("sharded", open_checkpoint(make_sharded(ckpt, out_dir, args.shard_size)))
        except Exception as e:
            files.sharded_why = f"{type(e).__name__}: {e}"
            log(f"sharded case skipped: {files.sharded_why}")
    return files


# ---------------------------------------------------------------------------------------------------------------
