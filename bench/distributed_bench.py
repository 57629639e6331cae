"""weightlift.distributed on several GPUs of one host: rates against one GPU and the disk, bytes read from storage,
and bit-equality with single-GPU loads. Meant for 2 GPUs; any number works.

    torchrun --standalone --nproc_per_node 2 bench/distributed_bench.py OUTDIR [--scratch DIR] [--gib 4] [--runs 3]

``--device cpu`` (gloo, CPU tensors, no copy ceilings) with a small ``--gib`` and ``--no-cold`` checks the script
itself on a machine without GPUs.

Rank 0 writes two checkpoints into DIR (default /tmp/weightlift-distributed-bench; reused when present): a ~4 GiB
bf16 file written by ``safetensors.torch.save_file`` and a sharded checkpoint written by ``transformers``
``save_pretrained``. Measured in this one run, in this order:

- ceilings: pinned host→device copy per GPU (alone and all GPUs at once); the page cache read by one ``dd``; the
  disk read cold by 8 parallel ``dd iflag=direct`` (after dropping the caches; needs root);
- warm (file in the page cache): one GPU loading alone with ``weightlift.load_file``; every rank loading the whole
  file itself (the status quo: the file read once per GPU); ``weightlift.distributed.load_file`` with each
  collective and block size; the sharded checkpoint the same way; fastsafetensors with its process group when it
  is importable;
- bit-equality on every rank: the distributed load, the single-GPU weightlift load and ``safetensors`` load;
- tensor-parallel slices (rows of q/k/v/gate/up, columns of o/down): rate, bytes read, equality with slices;
- storage bytes (from the reports) against the file's tensor bytes and size;
- cold (caches dropped right before each): the disk ceiling, the distributed load and the one-GPU load,
  interleaved; with ``--cold-pairs N``, N more rounds of one GPU alone and the distributed default (also with one
  GPU's lanes split over the ranks) in rotating order, each ratio taken within its round, their median with a 95 %
  confidence interval (``--pairs-only``: only these, for a figure of many rounds in a few minutes).

Writes OUTDIR/distributed.json (rank 0) and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import weightlift
import weightlift.distributed as wd

GiB = 1 << 30
DEV = "cuda:0"  # this rank's device, set in main


def on_gpu() -> bool:
    return DEV.startswith("cuda")


def sync() -> None:
    if on_gpu():
        torch.cuda.synchronize()


def log(msg: str) -> None:
    if dist.get_rank() == 0:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def max_over_ranks(x: float) -> float:
    t = torch.tensor([x], dtype=torch.float64, device=DEV if on_gpu() else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def gather(obj) -> list:
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def timed(fn, participate: bool = True):
    """Runs ``fn`` on the participating ranks from a common start; returns (result, wall seconds of the slowest)."""
    dist.barrier()
    sync()
    t0 = time.perf_counter()
    out = fn() if participate else None
    sync()
    return out, max_over_ranks(time.perf_counter() - t0 if participate else 0.0)


def drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def stats(xs: list[float]) -> dict:
    return {"best": max(xs), "median": statistics.median(xs), "all": xs}


#: The replicated path's alternatives (weightlift.distributed's _READ_AHEAD, _READERS and _READ_DEPTH), timed side
#: by side: "read_ahead" (the default: each rank reads two steps' blocks at once on threads while the collectives
#: run), "read_ahead_1" (one step's blocks at a time: the default until 2026-11-28), "contiguous" (each rank reads one
#: contiguous share of the file, a block per step, one broadcast from each rank per step), "lockstep" (read, exchange,
#: collective, in turn), "one_reader" (rank 0 reads everything, one broadcast per step: NVLink fan-out).
VARIANTS = {
    "read_ahead": (True, "all", 2, "interleaved"),
    "read_ahead_1": (True, "all", 1, "interleaved"),
    "contiguous": (True, "all", 2, "contiguous"),
    "lockstep": (False, "all", 1, "interleaved"),
    "one_reader": (True, "one", 2, "interleaved"),
    # One step (a block larger than the file): each rank's share in one engine call, then one all-gather; and one
    # rank reading everything in one call, then one broadcast. What splitting the reads into steps costs cold.
    "one_step": (True, "all", 2, "interleaved"),
    "one_reader_one_step": (True, "one", 2, "interleaved"),
}
#: Arguments of load_file per variant beside the defaults.
VARIANT_ARGS = {"one_step": {"block_bytes": 1 << 40}, "one_reader_one_step": {"block_bytes": 1 << 40}}


def variant_load(path: Path, dev: str, name: str, **kw) -> dict:
    wd._READ_AHEAD, wd._READERS, wd._READ_DEPTH, wd._SPAN = VARIANTS[name]
    try:
        return wd.load_file(str(path), device=dev, **{**VARIANT_ARGS.get(name, {}), **kw})
    finally:
        wd._READ_AHEAD, wd._READERS, wd._READ_DEPTH, wd._SPAN = VARIANTS["read_ahead"]


BREAKDOWN = ("rank", "seconds", "read_depth", "span", "read_seconds", "read_wait_seconds", "exchange_seconds", "collective_wait_seconds", "storage_bytes", "direct_policy")


def breakdown(report: dict) -> dict:
    """Where each rank's time went (seconds), and its per-step timeline: [read start, read end, status exchange
    done, collective launched], seconds since the load's start."""
    return {"steps": report["steps"], "block_bytes": report["block_bytes"], "ranks": [{**{k: r.get(k) for k in BREAKDOWN}, "timeline": [[round(x, 4) for x in row] for row in r.get("timeline", [])]} for r in report["ranks"]]}


# ---------------------------------------------------------------- checkpoints


def write_big(path: Path, gib: float) -> None:
    """Llama-like layers of random bf16 tensors (never zeros), about ``gib`` GiB, by safetensors.torch.save_file."""
    import safetensors.torch as st

    g = torch.Generator(device=DEV).manual_seed(1234)
    hidden, inter, vocab = (4096, 11008, 32000) if gib >= 1 else (256, 688, 1000)
    layer = 4 * hidden * hidden + 3 * hidden * inter + 2 * hidden
    layers = max(1, int((gib * GiB / 2 - 2 * vocab * hidden) // layer))
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "lm_head.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + f"self_attn.{n}_proj.weight": (hidden, hidden) for n in "qkvo"})
        shapes.update({p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden), p + "mlp.down_proj.weight": (hidden, inter)})
        shapes.update({p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,)})
    tensors = {n: torch.randn(s, generator=g, device=DEV, dtype=torch.float32).to(torch.bfloat16).cpu() for n, s in shapes.items()}
    tmp = path.with_suffix(".tmp")
    st.save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, path)


def write_hf(folder: Path, small: bool) -> None:
    """A Llama model of random weights (~1.1 GB bf16; ~10 MB when ``small``) saved by transformers in shards of
    about a third of it, with an index (``wlbench.files.save_random_llama``)."""
    from wlbench.files import save_random_llama

    save_random_llama(str(folder), small, DEV)


def prepare(scratch: Path, gib: float) -> tuple[Path, Path]:
    big, hf = scratch / f"llama-{gib:g}gib-bf16.safetensors", scratch / "hf-llama-sharded"
    if dist.get_rank() == 0:
        scratch.mkdir(parents=True, exist_ok=True)
        if not big.exists():
            log(f"writing {big}")
            write_big(big, gib)
        if not (hf / "model.safetensors.index.json").exists():
            log(f"writing {hf}")
            write_hf(hf, small=gib < 1)
    dist.barrier()
    return big, hf / "model.safetensors.index.json"


def shard_files(index: Path) -> list[Path]:
    weight_map = json.loads(index.read_text())["weight_map"]
    return [index.parent / f for f in sorted(set(weight_map.values()))]


def make_resident(paths: list[Path]) -> None:
    if dist.get_rank() == 0:
        for p in paths:
            subprocess.run(["dd", f"if={p}", "of=/dev/null", "bs=16M", "status=none"], check=True)
    dist.barrier()


# ---------------------------------------------------------------- ceilings


def h2d_gbps(nbytes: int = GiB, reps: int = 5) -> float:
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    host.fill_(7)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    return reps * nbytes / (time.perf_counter() - t0) / 1e9


def dd_parallel(path: Path, n: int = 8) -> float:
    """Cold read rate of ``path`` by ``n`` parallel O_DIRECT dd, each over 1/n of the file (GB/s)."""
    size = path.stat().st_size
    bs = 4 << 20
    blocks = -(-size // bs)
    per = -(-blocks // n)
    drop_caches()
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(["dd", f"if={path}", "of=/dev/null", f"bs={bs}", "iflag=direct", f"skip={i * per}", f"count={per}", "status=none"])
        for i in range(n)
    ]
    for p in procs:
        p.wait()
    return size / (time.perf_counter() - t0) / 1e9


def dd_warm(path: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=16M", "status=none"], check=True)
    return path.stat().st_size / (time.perf_counter() - t0) / 1e9


def ceilings(big: Path) -> dict:
    rank = dist.get_rank()
    out = {}
    if rank == 0:
        out["page_cache_one_dd_gbps"] = dd_warm(big)
    dist.barrier()
    if not on_gpu():
        return out
    alone, _ = timed(lambda: h2d_gbps(), participate=rank == 0)
    out["h2d_pinned_gbps_one_gpu"] = gather(alone)[0]
    together, _ = timed(lambda: h2d_gbps())
    out["h2d_pinned_gbps_all_gpus"] = gather(together)
    return out


# ---------------------------------------------------------------- loads


def tensor_bytes(tensors: dict) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def raw(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def same(a: dict, b: dict) -> tuple[bool, str]:
    if set(a) != set(b):
        return False, f"names differ: {sorted(set(a) ^ set(b))[:5]}"
    for k in a:
        x, y = a[k], b[k]
        if x.dtype != y.dtype or tuple(x.shape) != tuple(y.shape) or not torch.equal(raw(x), raw(y)):
            return False, f"{k} differs"
    return True, "bit-equal"


def warm_runs(path: Path, runs: int, dev: str, checkpoint_bytes: int) -> dict:
    rank = dist.get_rank()
    res = {}
    xs = []
    for _ in range(runs):
        out, s = timed(lambda: weightlift.load_file(str(path), device=dev), participate=rank == 0)
        xs.append(checkpoint_bytes / s / 1e9)
        del out
    res["one_gpu_gbps"] = stats(xs)
    xs = []
    for _ in range(runs):
        out, s = timed(lambda: weightlift.load_file(str(path), device=dev))
        xs.append(checkpoint_bytes / s / 1e9)
        del out
    res["every_rank_reads_all_gbps"] = stats(xs)
    for coll in ("all_gather", "broadcast"):
        for block in (None, 64 << 20, 256 << 20):
            xs, reports = [], []
            for _ in range(runs):
                out, s = timed(lambda: wd.load_file(str(path), device=dev, collective=coll, block_bytes=block))
                xs.append(checkpoint_bytes / s / 1e9)
                reports.append(wd.last_report())
                del out
            key = f"distributed_{coll}_block_{'auto' if block is None else block >> 20}"
            rep = reports[-1]
            res[key] = {
                **stats(xs),
                "block_bytes": rep["block_bytes"],
                "steps": rep["steps"],
                "summary": rep["summary"],
                "ranks": [{k: r[k] for k in ("rank", "storage_requested_bytes", "storage_bytes", "group_bytes_received", "seconds", "read_seconds", "wait_seconds", "direct_policy")} for r in rep["ranks"]],
            }
    for name in ("read_ahead_1", "contiguous", "lockstep", "one_reader"):
        xs = []
        for _ in range(runs):
            out, s = timed(lambda: variant_load(path, dev, name))
            xs.append(checkpoint_bytes / s / 1e9)
            rep = wd.last_report()
            del out
        res[f"variant_{name}"] = {**stats(xs), "breakdown": breakdown(rep)}
    best_dist = max(v["best"] for k, v in res.items() if k.startswith("distributed_"))
    best_auto = res[f"distributed_{'all_gather' if on_gpu() else 'broadcast'}_block_auto"]["best"]  # the defaults
    res["ratio_best_distributed_to_one_gpu"] = best_dist / res["one_gpu_gbps"]["best"]
    res["ratio_default_distributed_to_one_gpu"] = best_auto / res["one_gpu_gbps"]["best"]
    return res


def check_bits(path: Path, dev: str) -> dict:
    import safetensors.torch as st

    d = wd.load_file(str(path), device=dev)
    rep = wd.last_report()
    single = weightlift.load_file(str(path), device=dev)
    ok1, why1 = same(d, single)
    del single
    if path.name.endswith(".index.json"):
        ref = {}
        for f in shard_files(path):
            ref.update(st.load_file(str(f), device=dev))
    else:
        ref = st.load_file(str(path), device=dev)
    ok2, why2 = same(d, ref)
    del ref, d
    if on_gpu():
        torch.cuda.empty_cache()
    per_rank = gather({"vs_weightlift_single_gpu": [ok1, why1], "vs_safetensors": [ok2, why2]})
    files = [path] if not path.name.endswith(".index.json") else shard_files(path)
    file_bytes = sum(f.stat().st_size for f in files)
    s = rep["summary"]
    return {
        "bit_equal": all(r["vs_weightlift_single_gpu"][0] and r["vs_safetensors"][0] for r in per_rank),
        "per_rank": per_rank,
        "file_bytes": file_bytes,
        "tensor_bytes": s["checkpoint_bytes"],
        "storage_requested_bytes": s["storage_requested_bytes"],
        "storage_bytes": s["storage_bytes"],
        "header_bytes_all_ranks": sum(r["header_bytes"] for r in rep["ranks"]),
        "requested_equals_tensor_bytes": s["storage_requested_bytes"] == s["checkpoint_bytes"],
        "storage_bytes_over_file_bytes": s["storage_bytes"] / file_bytes,
    }


def tp_spec(world: int, rank: int):
    """Megatron-style tensor parallelism: q/k/v/gate/up/embeddings/lm_head by rows, o/down by columns."""

    def spec(name: str, shape: tuple) -> "tuple[int, int, int] | None":
        if len(shape) != 2:
            return None
        return (1 if name.endswith(("o_proj.weight", "down_proj.weight")) else 0, world, rank)

    return spec


def tp_runs(path: Path, runs: int, dev: str, checkpoint_bytes: int) -> dict:
    """Tensor-parallel slices of the file: rate, bytes read in all, and equality with slices of a full load."""
    world, rank = dist.get_world_size(), dist.get_rank()
    spec = tp_spec(world, rank)
    xs = []
    for _ in range(runs):
        out, s = timed(lambda: wd.load_file(str(path), device=dev, shard=spec))
        xs.append(checkpoint_bytes / s / 1e9)
        rep = wd.last_report()
    full = weightlift.load_file(str(path), device=dev)
    want = {}
    for name, t in full.items():
        sp = spec(name, tuple(t.shape))
        want[name] = t if sp is None else torch.tensor_split(t, world, sp[0])[rank]
    equal = same(out, want)
    del full, want, out
    s = rep["summary"]
    return {
        "gbps_whole_checkpoint_per_wall_second": stats(xs),
        "bit_equal_to_slices_of_a_full_load": all(ok for ok, _ in gather(equal)),
        "storage_requested_bytes": s["storage_requested_bytes"],
        "storage_bytes": s["storage_bytes"],
        "tensor_bytes": s["checkpoint_bytes"],
        "group_bytes_received": s["group_bytes_received"],
        "ranks": [{k: r[k] for k in ("rank", "bytes", "storage_bytes", "group_bytes_received", "seconds", "read_seconds", "wait_seconds")} for r in rep["ranks"]],
    }


def cold_seconds(fn, participate: bool = True) -> float:
    """``fn`` timed as ``timed`` does, the page cache dropped right before (by rank 0) and the memory of its result
    given back after, before the next load."""
    if dist.get_rank() == 0:
        drop_caches()
    dist.barrier()
    out, s = timed(fn, participate=participate)
    del out
    if on_gpu():
        torch.cuda.empty_cache()
    return s


def cold_runs(big: Path, runs: int, dev: str, checkpoint_bytes: int, peers: dict) -> dict:
    """Interleaved, caches dropped right before each: the disk ceiling, the distributed load (each variant), one GPU
    alone, and the peers' distributed loads (``peers``: name -> load function)."""
    rank = dist.get_rank()
    rates: dict[str, list[float]] = {}
    breakdowns: dict[str, list] = {}
    disk = []

    def cold(name: str, fn, participate: bool = True) -> None:
        rates.setdefault(name, []).append(checkpoint_bytes / cold_seconds(fn, participate) / 1e9)
        if name in VARIANTS:
            breakdowns.setdefault(name, []).append(breakdown(wd.last_report()))

    for _ in range(runs):
        if rank == 0:
            disk.append(dd_parallel(big))
        for name in VARIANTS:
            cold(name, lambda: variant_load(big, dev, name))
        cold("one_gpu", lambda: weightlift.load_file(str(big), device=dev), participate=rank == 0)
        for name, fn in peers.items():
            try:
                cold(name, fn)
            except Exception as e:  # noqa: BLE001 - a peer's failure is recorded, not fatal
                rates.setdefault(name, []).append(0.0)
                breakdowns.setdefault("errors", []).append(f"{name}: {type(e).__name__}: {e}")
    disk = gather(disk)[0]
    one = statistics.median(rates["one_gpu"])
    return {
        "disk_8dd_direct_gbps": stats(disk),
        **{f"{k}_gbps": stats(v) for k, v in rates.items()},
        # the default (read-ahead) keeps its old key: earlier runs' "distributed_gbps"
        "distributed_gbps": stats(rates["read_ahead"]),
        "ratio_to_one_gpu_median": {k: statistics.median(v) / one for k, v in rates.items()},
        "ratio_distributed_to_disk_median": statistics.median(rates["read_ahead"]) / statistics.median(disk),
        "ratio_distributed_to_disk_best": max(rates["read_ahead"]) / max(disk),
        "breakdowns": breakdowns,
    }


def median_ci95(xs: list[float]) -> list[float]:
    """A distribution-free 95 % confidence interval of the median of ``xs`` (order statistics; the sign test's
    binomial with p = 1/2): the whole range where there are too few values for one."""
    n, xs = len(xs), sorted(xs)
    k = 0  # the largest k with P(Binomial(n, 1/2) <= k - 1) <= 0.025: the interval is xs[k-1] .. xs[n-k]
    while k + 1 <= n and sum(math.comb(n, i) for i in range(k + 1)) / 2**n <= 0.025:
        k += 1
    return [xs[k - 1], xs[n - k]] if k >= 1 else [xs[0], xs[-1]]


#: The members of the cold rounds by default (--pair-members): one GPU alone, the distributed default, and the
#: default with one GPU's lanes split over the ranks. Any name of VARIANTS may be added.
PAIR_MEMBERS = "one_gpu,read_ahead,lanes_split"


def cold_pairs(big: Path, rounds: int, dev: str, checkpoint_bytes: int, members: list[str]) -> dict:
    """Rounds of cold loads, caches dropped right before each, of ``members``: "one_gpu" (one GPU alone, always
    first in the list), a name of VARIANTS (the distributed load so), "lanes_split" (the default with each rank's
    engine at ``threads`` = one GPU's lanes / world: as many reads in flight on the disk as one GPU alone keeps).
    Their order rotates from round to round (a drift of the disk over the run falls on each alike), and each
    distributed load's ratio is taken against the one-GPU load of its round. The disk's cold rate varies by 10-20 %
    from one load to the next on these VMs: the ratios' median over many rounds, with its confidence interval, says
    more than medians of a few runs each."""
    rank, world = dist.get_rank(), dist.get_world_size()
    lanes = int(weightlift._core.shared_engine().settings()["threads"]["value"])
    split_engine = weightlift._core.new_engine(threads=max(1, lanes // world)) if "lanes_split" in members else None

    def load(name: str) -> tuple[float, "dict | None"]:
        """Seconds of the cold load ``name``, and what its report says."""
        if name == "one_gpu":
            s = cold_seconds(lambda: weightlift.load_file(str(big), device=dev), participate=rank == 0)
            rep = weightlift.last_report() if rank == 0 else None
            keep = ("seconds", "times", "read_ops", "lanes", "direct_bytes", "buffered_bytes", "resident_bytes")
            return s, {k: rep.get(k) for k in keep} if rep else None
        if name == "lanes_split":
            s = cold_seconds(lambda: variant_load(big, dev, "read_ahead", engine=split_engine))
        else:
            s = cold_seconds(lambda: variant_load(big, dev, name))
        return s, breakdown(wd.last_report())

    rows = []
    for i in range(rounds):
        order = members[i % len(members):] + members[: i % len(members)]
        got, reports = {}, {}
        for name in order:
            s, reports[name] = load(name)
            got[name] = checkpoint_bytes / s / 1e9
        rows.append({"order": order, **{f"{k}_gbps": v for k, v in got.items()},
                     **{f"{k}_ratio": got[k] / got["one_gpu"] for k in members[1:]}, "reports": reports})
    out: dict = {"members": members, "rounds": rows, "lanes_one_gpu": lanes, "lanes_split_per_rank": max(1, lanes // world)}
    for k in members:
        out[f"{k}_gbps"] = stats([r[f"{k}_gbps"] for r in rows])
    for k in members[1:]:
        ratios = [r[f"{k}_ratio"] for r in rows]
        out[f"{k}_ratio_median"] = statistics.median(ratios)
        out[f"{k}_ratio_median_ci95"] = median_ci95(ratios)
        out[f"{k}_rounds_at_or_above_one"] = sum(x >= 1.0 for x in ratios)
    if "read_ahead" in members:  # the default's figures under the names the goals read
        out["ratio_median"], out["ratio_median_ci95"] = out["read_ahead_ratio_median"], out["read_ahead_ratio_median_ci95"]
        out["pairs_at_or_above_one"] = out["read_ahead_rounds_at_or_above_one"]
    return out


def fastsafetensors_load(paths: list[Path], dev: str):
    """fastsafetensors with its process group: the files split over the ranks, every tensor on every rank."""
    from fastsafetensors import SafeTensorsFileLoader

    world = dist.get_world_size()

    def load() -> dict:
        loader = SafeTensorsFileLoader(dist.group.WORLD, torch.device(dev), nogds=True)
        loader.add_filenames({r: [str(p) for p in paths[r::world]] for r in range(world)})
        fb = loader.copy_files_to_device()
        out = {k: fb.get_tensor(k).clone() for k in sorted(fb.key_to_rank_lidx)}
        fb.close()
        loader.close()
        return out

    return load, "SafeTensorsFileLoader(process group, nogds=True), files split over ranks, get_tensor per key"


def runai_load(paths: list[Path], dev: str):
    """The Run:ai streamer's distributed streaming (each rank reads a share, broadcasts it over the process group;
    RUNAI_STREAMER_DIST=1 for files: by default it distributes only object-storage reads)."""
    from runai_model_streamer import SafetensorsStreamer

    os.environ["RUNAI_STREAMER_DIST"] = "1"

    def load() -> dict:
        out = {}
        with SafetensorsStreamer() as streamer:
            streamer.stream_files([str(p) for p in paths], device=dev, is_distributed=True)
            for name, t in streamer.get_tensors():
                out[name] = t.clone().detach()  # its staging buffers are reused: the docs' own clone
        return out

    return load, "SafetensorsStreamer.stream_files(device=cuda:N, is_distributed=True), RUNAI_STREAMER_DIST=1"


PEERS = {"fastsafetensors": fastsafetensors_load, "runai_distributed": runai_load}


def peer_runs(name: str, paths: list[Path], runs: int, dev: str, checkpoint_bytes: int, reference: dict | None) -> dict:
    try:
        load, how = PEERS[name](paths, dev)
    except Exception as e:  # noqa: BLE001 - any import failure is a reason to skip
        return {"skipped": f"{name} is not importable: {type(e).__name__}: {e}"}
    try:
        xs = []
        for _ in range(runs):
            out, s = timed(load)
            xs.append(checkpoint_bytes / s / 1e9)
        res = {"warm_gbps": stats(xs), "how": how}
        if reference is not None:
            ok = same(out, reference)[0]
            res["bit_equal_to_weightlift_distributed"] = all(gather(ok))
        return res
    except Exception as e:  # noqa: BLE001
        return {"skipped": f"{name} failed here: {type(e).__name__}: {e}"}


def cold_peers(paths: list[Path], dev: str) -> dict:
    out = {}
    for name, make in PEERS.items():
        try:
            out[name] = make(paths, dev)[0]
        except Exception:  # noqa: BLE001 - not importable: its warm entry says why
            pass
    return out


# ---------------------------------------------------------------- main


def main() -> None:
    global DEV
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/weightlift-distributed-bench"))
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold runs (they drop the page cache)")
    ap.add_argument("--cold-pairs", type=int, default=0, metavar="N",
                    help="N more rounds of cold loads in rotating order: one GPU alone, the distributed default, and "
                    "the default with one GPU's lanes split over the ranks; ratios taken within each round (not with --no-cold)")
    ap.add_argument("--pair-members", default=PAIR_MEMBERS, help=f"the loads of each cold round, one_gpu first (default "
                    f"{PAIR_MEMBERS}; any of {', '.join(VARIANTS)} may be named)")
    ap.add_argument("--pairs-only", action="store_true", help="only the cold rounds (with --cold-pairs): no warm "
                    "runs, no checks, no peers, no cold runs of the variants")
    args = ap.parse_args()
    members = [m for m in args.pair_members.split(",") if m]
    if not members or members[0] != "one_gpu" or len(members) < 2 or any(m not in (*VARIANTS, "lanes_split") for m in members[1:]):
        ap.error(f"--pair-members: one_gpu, then one or more of {', '.join((*VARIANTS, 'lanes_split'))}")
    from wlbench.procgroup import init

    DEV = init(args.device, 10)
    rank, world = dist.get_rank(), dist.get_world_size()
    start = time.perf_counter()
    result: dict = {
        "world": world,
        "device": DEV,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if on_gpu() else [],
        "torch": torch.__version__,
        "python": platform.python_version(),
        "weightlift": weightlift.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if on_gpu() else None,
    }
    big, hf = prepare(args.scratch, args.gib)
    result["filesystem"] = subprocess.run(["df", "-T", str(args.scratch)], capture_output=True, text=True).stdout
    hf_files = shard_files(hf)
    make_resident([big, *hf_files])
    result["residency_big"] = weightlift.probe(big)["file"] if rank == 0 else None
    big_bytes, hf_bytes = tensor_bytes_of(big), tensor_bytes_of(hf)
    result["checkpoints"] = {
        "big": {"path": str(big), "file_bytes": big.stat().st_size, "tensor_bytes": big_bytes},
        "hf": {"index": str(hf), "files": len(hf_files), "file_bytes": sum(f.stat().st_size for f in hf_files), "tensor_bytes": hf_bytes},
    }
    if args.pairs_only:
        if args.cold_pairs <= 0:
            ap.error("--pairs-only needs --cold-pairs N")
        if os.geteuid() != 0:
            ap.error("the cold pairs drop the page cache: they need root")
        log(f"cold pairs: {args.cold_pairs}")
        result["cold_pairs_big"] = cold_pairs(big, args.cold_pairs, DEV, big_bytes, members)
        return finish(args, result, start)
    log("ceilings")
    result["ceilings"] = ceilings(big)
    log("warm, one file")
    result["warm_big"] = warm_runs(big, args.runs, DEV, big_bytes)
    log("warm, sharded save_pretrained checkpoint")
    result["warm_hf"] = warm_runs(hf, args.runs, DEV, hf_bytes)
    log("bit-equality and storage bytes")
    result["check_big"] = check_bits(big, DEV)
    result["check_hf"] = check_bits(hf, DEV)
    log("tensor-parallel slices")
    result["tp_big"] = tp_runs(big, args.runs, DEV, big_bytes)
    log("peers: fastsafetensors, the Run:ai streamer (distributed)")
    reference = wd.load_file(str(big), device=DEV)
    for name in PEERS:
        result[f"{name}_big"] = peer_runs(name, [big], args.runs, DEV, big_bytes, reference)
    del reference
    for name in PEERS:
        result[f"{name}_hf"] = peer_runs(name, hf_files, args.runs, DEV, hf_bytes, None)
    if on_gpu():
        torch.cuda.empty_cache()
    if args.no_cold:
        result["cold_big"] = {"skipped": "--no-cold"}
    elif os.geteuid() != 0:
        result["cold_big"] = {"skipped": "dropping the page cache needs root"}
    else:
        log("cold")
        result["cold_big"] = cold_runs(big, args.runs, DEV, big_bytes, cold_peers([big], DEV))
        if args.cold_pairs > 0:
            log(f"cold pairs: {args.cold_pairs}")
            result["cold_pairs_big"] = cold_pairs(big, args.cold_pairs, DEV, big_bytes, members)
    result["goals"] = goals(result)
    finish(args, result, start)


def finish(args: argparse.Namespace, result: dict, start: float) -> None:
    """Writes the result (rank 0), prints its goals, and leaves the process group."""
    rank = dist.get_rank()
    result["seconds"] = time.perf_counter() - start
    if "goals" in result:
        result["goals"]["seconds"] = result["seconds"]
    else:
        pairs = result["cold_pairs_big"]
        result["goals"] = {k: v for k, v in pairs.items() if k.endswith(("ratio_median", "ratio_median_ci95", "at_or_above_one"))}
        result["goals"]["cold_ratio_to_one_gpu_goal"] = 1.0
    if rank == 0:
        args.outdir.mkdir(parents=True, exist_ok=True)
        (args.outdir / "distributed.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result["goals"], indent=1))
        print(f"wrote {args.outdir / 'distributed.json'} in {result['seconds']:.0f} s")
    dist.barrier()
    dist.destroy_process_group()


def tensor_bytes_of(path: Path) -> int:
    return sum(t.nbytes for t in weightlift._native.inspect([str(path)])["tensors"])


def goals(r: dict) -> dict:
    cold = r["cold_big"]
    return {
        "bit_equal": r["check_big"]["bit_equal"] and r["check_hf"]["bit_equal"],
        "storage_requested_equals_tensor_bytes": r["check_big"]["requested_equals_tensor_bytes"] and r["check_hf"]["requested_equals_tensor_bytes"],
        "storage_bytes_over_file_bytes": [r["check_big"]["storage_bytes_over_file_bytes"], r["check_hf"]["storage_bytes_over_file_bytes"]],
        "tp_slices_bit_equal": r["tp_big"]["bit_equal_to_slices_of_a_full_load"],
        "tp_storage_requested_equals_tensor_bytes": r["tp_big"]["storage_requested_bytes"] == r["tp_big"]["tensor_bytes"],
        # Checkpoint bytes per second of the slowest rank, against one GPU loading alone: the time until every GPU
        # holds the model, against one GPU's.
        "warm_ratio_to_one_gpu_default": r["warm_big"]["ratio_default_distributed_to_one_gpu"],
        "warm_ratio_to_one_gpu_best_setting": r["warm_big"]["ratio_best_distributed_to_one_gpu"],
        # Bytes landed on all the GPUs per second (world × the above), against one GPU's rate: the goal's measure.
        "warm_aggregate_ratio_default": r["world"] * r["warm_big"]["ratio_default_distributed_to_one_gpu"],
        "warm_aggregate_ratio_default_sharded_checkpoint": r["world"] * r["warm_hf"]["ratio_default_distributed_to_one_gpu"],
        "warm_ratio_goal": 1.8,
        "warm_variants_gbps_best": {k: r["warm_big"][f"variant_{k}"]["best"] for k in ("read_ahead_1", "contiguous", "lockstep", "one_reader")},
        "cold_ratio_to_disk_median": cold.get("ratio_distributed_to_disk_median"),
        # Each GPU's cold rate against one GPU loading alone (medians), per variant and peer: the goal is >= 1.0.
        "cold_ratio_to_one_gpu_median": cold.get("ratio_to_one_gpu_median"),
        "cold_ratio_to_one_gpu_goal": 1.0,
        # The same from pairs of cold loads (--cold-pairs): the median of the pairs' ratios and its 95 % interval.
        "cold_pairs_ratio_median": r.get("cold_pairs_big", {}).get("ratio_median"),
        "cold_pairs_ratio_median_ci95": r.get("cold_pairs_big", {}).get("ratio_median_ci95"),
        "seconds": None,
    }


if __name__ == "__main__":
    sys.exit(main())
