"""One rank of the distributed-load tests (tests/test_distributed.py starts several): joins a gloo process group,
runs every scenario in order and writes, per scenario, each returned tensor's dtype, shape and SHA-256 of its bytes,
the load report, or the error raised, to OUTDIR/rank<R>.json. The test compares them with references it computes
itself. With a config naming ``remote`` checkpoints (URLs), it runs the loads from objects instead and keeps the
tensors themselves (OUTDIR/rank<R>-<scenario>.pt), for the test to compare with ``torch.equal``; with ``"device":
"cuda"`` too, those loads go to each rank's GPU over NCCL.

    python tests/distributed_worker.py RANK WORLD PORT CONFIG.json OUTDIR
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import random
import sys
import time
import traceback

import torch
import torch.distributed as dist

import weightlift
import weightlift.distributed as wd


def digest(tensors: dict) -> dict:
    out = {}
    for name, t in tensors.items():
        raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        out[name] = [str(t.dtype), list(t.shape), str(t.device), hashlib.sha256(raw).hexdigest()]
    return out


def attempt(fn) -> dict:
    try:
        tensors = fn()
    except Exception as e:  # noqa: BLE001 - the test inspects what was raised
        return {
            "error": type(e).__name__,
            "message": str(e),
            "distributed_error": isinstance(e, wd.DistributedError),
            "weightlift_error": isinstance(e, weightlift.WeightliftError),
            "failures": getattr(e, "failures", None),
            "cause": repr(e.__cause__) if e.__cause__ else None,
            "trace": traceback.format_exc(),
        }
    return {"tensors": digest(tensors), "report": wd.last_report()}


def kept(fn, path: str) -> dict:
    """``attempt`` keeping the returned tensors (cloned out of the load's shared buffer) in ``path``."""
    try:
        tensors = fn()
    except Exception as e:  # noqa: BLE001 - the test inspects what was raised
        return {"error": type(e).__name__, "message": str(e), "trace": traceback.format_exc()}
    torch.save({k: v.clone().cpu() for k, v in tensors.items()}, path)
    return {"report": wd.last_report()}


def remote(urls: dict, rank: int, world: int, outdir: str, device: str = "cpu") -> dict:
    """Loads from objects: replicated (both collectives, in several steps), a shard index whose shards are found
    beside it in the bucket, and slices along dims 0 and 1 (the latter exchanged); onto ``device`` (``cuda``: this
    rank's GPU, over NCCL)."""
    cpu = {"device": f"cuda:{rank}" if device == "cuda" else "cpu"}
    spec = {"rows": (0, world, rank), "cols": (1, world, rank)}
    scenarios = {
        "all_gather": lambda: wd.load_file(urls["mixed"], collective="all_gather", block_bytes=8192, **cpu),
        "broadcast": lambda: wd.load_file(urls["mixed"], collective="broadcast", block_bytes=8192, **cpu),
        "index": lambda: wd.load_file(urls["index"], **cpu),
        "shard": lambda: wd.load_file(urls["mixed"], shard=spec, block_bytes=8192, **cpu),
    }
    return {key: kept(fn, os.path.join(outdir, f"rank{rank}-{key}.pt")) for key, fn in scenarios.items()}


SOAK_ROUNDS = 24


def soak(cfg: dict, cpu: dict) -> list:
    """A randomized fault soak: rounds of replicated loads (a random checkpoint, collective and block size), most
    with an EIO at a random offset of one of the files (the same on every rank: the seed is shared), each round's
    outcome recorded for the test to judge."""
    rng = random.Random(cfg.get("soak_seed", 7))
    shards = sorted(set(json.load(open(cfg["index"]))["weight_map"].values()))
    folder = os.path.dirname(cfg["index"])
    rounds = []
    for _ in range(SOAK_ROUNDS):
        name = rng.choice(["mixed", "aligned", "index"])
        target = cfg[name] if name != "index" else os.path.join(folder, rng.choice(shards))
        offset = rng.randrange(os.path.getsize(target)) if rng.random() < 0.75 else None
        collective = rng.choice(["all_gather", "broadcast"])
        block = rng.choice([4096, 8192, 65536, 1 << 20])
        if offset is not None:
            os.environ["WEIGHTLIFT_INJECT_EIO"] = f"{target}@{offset}"
        try:
            r = attempt(lambda: wd.load_file(cfg[name], collective=collective, block_bytes=block, **cpu))
        finally:
            os.environ.pop("WEIGHTLIFT_INJECT_EIO", None)
        r.pop("report", None)
        r.pop("trace", None)
        rounds.append({"name": name, "target": target, "offset": offset, "collective": collective, "block": block, **r})
    return rounds


def main() -> None:
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    with open(sys.argv[4]) as f:
        cfg = json.load(f)
    out_path = os.path.join(sys.argv[5], f"rank{rank}.json")
    # {"remote": ..., "device": "cuda"}: the loads from objects onto each rank's GPU, over NCCL.
    on_gpu = cfg.get("device") == "cuda"
    if on_gpu:
        torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl" if on_gpu else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    results: dict = {}

    def save() -> None:
        with open(out_path + ".tmp", "w") as f:
            json.dump(results, f)
        os.replace(out_path + ".tmp", out_path)

    if "remote" in cfg:
        results.update(remote(cfg["remote"], rank, world, sys.argv[5], cfg.get("device", "cpu")))
        save()
        dist.destroy_process_group()
        return
    mixed, index, aligned = cfg["mixed"], cfg["index"], cfg["aligned"]
    cpu = {"device": "cpu"}
    results["all_gather"] = attempt(lambda: wd.load_file(mixed, collective="all_gather", block_bytes=8192, **cpu))
    results["broadcast"] = attempt(lambda: wd.load_file(mixed, collective="broadcast", block_bytes=8192, **cpu))
    results["index"] = attempt(lambda: wd.load_file(index, **cpu))
    results["aligned"] = attempt(lambda: wd.load_file(aligned, block_bytes=4096, **cpu))
    # The replicated path's measured alternatives (bench/distributed_bench.py times them): lockstep reading, and one
    # reader that broadcasts everything.
    wd._READ_AHEAD = False
    results["lockstep"] = attempt(lambda: wd.load_file(mixed, block_bytes=8192, **cpu))
    wd._READ_AHEAD, wd._SPAN = True, "contiguous"
    results["contiguous"] = attempt(lambda: wd.load_file(mixed, block_bytes=8192, **cpu))
    wd._SPAN = "interleaved"
    wd._READERS = "one"
    results["one_reader"] = attempt(lambda: wd.load_file(mixed, block_bytes=8192, **cpu))
    os.environ["WEIGHTLIFT_INJECT_EIO"] = f"{mixed}@{cfg['eio_offset']}"
    results["one_reader_eio"] = attempt(lambda: wd.load_file(mixed, block_bytes=8192, **cpu))
    del os.environ["WEIGHTLIFT_INJECT_EIO"]
    wd._READERS = "all"
    spec = {"rows": (0, world, rank), "cols": (1, world, rank), "w3d": (2, world, rank), "w3d_mid": (1, world, rank)}
    results["shard_dict"] = attempt(lambda: wd.load_file(mixed, shard=spec, block_bytes=8192, **cpu))
    # Slices of another world than the group's: each rank reads its row segments itself.
    odd = {"cols": (1, world + 1, rank), "w3d": (2, world + 1, world - rank)}
    results["shard_segments"] = attempt(lambda: wd.load_file(mixed, shard=odd, block_bytes=8192, **cpu))
    last_dim = lambda name, shape: (len(shape) - 1, world, rank) if len(shape) >= 2 else None  # noqa: E731
    results["shard_callable"] = attempt(lambda: wd.load_file(mixed, shard=last_dim, **cpu))

    # Two pretend hosts: ranks 0..world-2 on one, the last rank alone on the other.
    wd._host_name = lambda: "host-a" if rank < world - 1 else "host-b"
    results["split_host"] = attempt(lambda: wd.load_file(mixed, split="host", block_bytes=8192, **cpu))
    wd._host_name = lambda: "host-a"
    save()

    os.environ["WEIGHTLIFT_INJECT_EIO"] = f"{mixed}@{cfg['eio_offset']}"
    results["eio"] = attempt(lambda: wd.load_file(mixed, block_bytes=8192, **cpu))
    del os.environ["WEIGHTLIFT_INJECT_EIO"]
    results["after_eio"] = attempt(lambda: wd.load_file(mixed, block_bytes=8192, **cpu))
    results["mismatch"] = attempt(lambda: wd.load_file(mixed if rank != 1 else aligned, **cpu))
    results["bad_spec"] = attempt(lambda: wd.load_file(mixed, shard={"rows": (0, world, rank + (rank == 1) * world)}, **cpu))
    save()
    results["soak"] = soak(cfg, cpu)
    save()

    # Last: one rank stops answering (it sleeps past the deadline); the others must raise in time, not hang.
    if rank == world - 1:
        time.sleep(5)
        os._exit(0)
    start = time.monotonic()
    results["rank_hangs"] = attempt(lambda: wd.load_file(mixed, block_bytes=8192, timeout=2, **cpu))
    results["rank_hangs"]["elapsed_s"] = time.monotonic() - start
    save()
    os._exit(0)  # the group cannot be torn down cleanly without the silent rank


if __name__ == "__main__":
    main()
