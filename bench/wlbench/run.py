"""A whole run of bench/shapes.py: the files, the reference checksums, the ceilings, each family in turn (a SIGTERM
or ``--time-limit`` ends them where they are), the best peers and the goals, as one JSON object."""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import time
from typing import Any, Optional

from wlbench import log
from wlbench.ceilings import measure_ceilings
from wlbench.checkpoint import open_checkpoint, reference
from wlbench.children import cuda_context
from wlbench.families import (family_cli, family_first_load, family_host, family_restart, family_sharded,
                              family_storage, find_cli)
from wlbench.files import Files, make_upstream, parse_size, prepare_files
from wlbench.goals import best_peers, goals, log_goals
from wlbench.methods import Options
from wlbench.pagecache import cold_unavailable
from wlbench.timing import Run

FAMILIES = ("cold", "warm", "tmpfs", "restart", "first-load", "cli", "sharded", "host")
STORAGE_CASES = ("cold", "warm", "tmpfs")


def versions() -> dict:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in ("torch", "numpy", "safetensors", "weightlift", "transformers", "kvikio-cu13", "libkvikio-cu13",
                 "fastsafetensors", "runai-model-streamer", "instanttensor", "cupy-cuda13x"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def host_info() -> dict:
    mem = None
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return {"cpus": os.cpu_count(), "mem_bytes": mem, "kernel": platform.release()}



class OutOfTime(BaseException):
    """Raised in the main thread by SIGTERM (``timeout`` sends it) or by ``--time-limit``'s alarm. A BaseException,
    so that no family's ``except Exception`` takes it for a failed method: it ends the run, which still reports what
    it measured."""


def _out_of_time(signum: int, frame: Any) -> None:
    raise OutOfTime(signal.Signals(signum).name)


def run_families(run: Run, args: argparse.Namespace, families: list, files: Files, ref_file: str,
                 time_limit: Optional[float] = None) -> dict:
    """Each family in turn; ``seconds`` per family. A SIGTERM, or the end of ``time_limit`` seconds from now, ends
    the family it interrupts and the rest (:class:`OutOfTime`): ``run.stopped`` says where and why, and every family
    not finished is listed under ``skipped``."""
    seconds: dict = {}
    handlers = {sig: signal.signal(sig, _out_of_time) for sig in (signal.SIGTERM, signal.SIGALRM)}
    try:
        if time_limit is not None:
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, time_limit))
        _families(run, args, families, files, ref_file, seconds)
    except OutOfTime as e:
        fam = next((f for f in ["ceilings", *families] if f not in seconds), "ceilings")
        why = "SIGTERM" if str(e) == "SIGTERM" else f"--time-limit {args.time_limit:g} s"
        run.stopped = {"family": fam, "by": why, "families_not_finished": [f for f in families if f not in seconds]}
        log(f"stopped by {why} during {fam}: the families not finished are skipped; what was measured is reported")
        for f in run.stopped["families_not_finished"]:
            run.skip("*", f, f"not finished: the run was stopped by {why} during {fam}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, h in handlers.items():
            signal.signal(sig, h)
    return seconds


def _families(run: Run, args: argparse.Namespace, families: list, files: Files, ref_file: str, seconds: dict) -> None:
    cold_why = cold_unavailable(args.cold)
    t0 = time.perf_counter()
    log("== ceilings")
    run.ceilings = measure_ceilings(run, families, files, cold_why)
    seconds["ceilings"] = round(time.perf_counter() - t0, 1)
    for fam in families:
        t0 = time.perf_counter()
        log(f"== {fam}")
        if fam in STORAGE_CASES:
            target = files.tmpfs if fam == "tmpfs" else files.disk
            why = files.tmpfs_why if fam == "tmpfs" else (cold_why if fam == "cold" else None)
            family_storage(run, fam, None if why else target, why)
        elif fam == "restart":
            family_restart(run, files.disk, ref_file, cold_why)
        elif fam == "first-load":
            family_first_load(run, files.disk, ref_file)
        elif fam == "cli":
            family_cli(run, files.disk, find_cli(args.weightlift_bin))
        elif fam == "sharded":
            family_sharded(run, files.sharded, files.sharded_why, cold_why)
        elif fam == "host":
            family_host(run, files.disk)
        seconds[fam] = round(time.perf_counter() - t0, 1)


def bench(args: argparse.Namespace, families: list) -> dict:
    started = time.perf_counter()
    dev = args.device
    out: dict = {"script": "bench/shapes.py", "argv": sys.argv[1:], "device": dev, "host": host_info(),
                 "versions": versions()}
    import torch

    if dev.startswith("cuda") and not torch.cuda.is_available():
        out["skipped"] = "torch sees no CUDA device"
        return out
    out["cuda_context_s"] = cuda_context(dev)
    out["gpu"] = torch.cuda.get_device_name(dev) if dev.startswith("cuda") else None
    if args.make_upstream:
        make_upstream(args.make_upstream, parse_size(args.size), args.seed)
        if args.make_only:
            out["made"] = open_checkpoint(args.make_upstream).describe()
            return out
    if args.make_sharded:
        from wlbench.files import save_sized_llama

        index = save_sized_llama(args.make_sharded, parse_size(args.size), dev, args.shard_size)
        if args.make_only:
            out["made"] = open_checkpoint(index).describe()
            return out
        args.file = args.file or index
    path = args.file or args.make_upstream
    if not path:
        raise SystemExit("give --file, --make-upstream or --make-sharded")
    ckpt = open_checkpoint(os.path.abspath(path))
    files = prepare_files(args, families, ckpt)
    out["files"] = {"upstream": ckpt.describe(), "pt": files.disk.pt,
                    "tmpfs": files.tmpfs.ckpt.describe() if files.tmpfs else files.tmpfs_why,
                    "sharded": files.sharded.ckpt.describe() if files.sharded else files.sharded_why}
    check_dev = dev if dev.startswith("cuda") else "cpu"
    try:
        t0 = time.perf_counter()
        ref = reference(ckpt, check_dev)
        log(f"reference checksums of {len(ref.sums)} tensors in {time.perf_counter() - t0:.1f} s")
        ref_file = os.path.join(args.shm_dir if os.path.isdir(args.shm_dir) else os.path.dirname(ckpt.path),
                                f"reference-{os.getpid()}.json")
        with open(ref_file, "w") as f:
            json.dump(ref.to_json(), f)
        files.made.append(ref_file)
        run = Run(dev, check_dev, args.runs, Options(args.seed, args.kvikio_threads), args.cold,
                  method_filter=args.methods.split(",") if args.methods else None)
        for t in (files.disk, files.tmpfs, files.sharded):
            if t:
                run.refs[t.ckpt.path] = ref  # every copy must hold the upstream file's tensors
        limit = None if args.time_limit is None else args.time_limit - (time.perf_counter() - started)
        out["family_seconds"] = run_families(run, args, families, files, ref_file, limit)
    finally:
        for p in files.made:
            if os.path.exists(p):
                os.remove(p)
        if os.path.isdir(args.shm_dir) and not os.listdir(args.shm_dir):
            os.rmdir(args.shm_dir)
    best_peers(run.results)
    run_goals = goals(run.results, run.ceilings)
    log_goals(run_goals)
    out.update({
        "runs": args.runs, "cases": families, "cold_method": args.cold, "seed": args.seed,
        "kvikio_threads": args.kvikio_threads,
        "checks": "each load's tensors: dtype, shape and checksum of the bytes against a plain read of the upstream "
                  "file, after the clock stopped",
        "ceilings": run.ceilings, "results": run.results, "goals": run_goals, "skipped": run.skipped,
        "stopped": run.stopped,
        "elapsed_s": round(time.perf_counter() - started, 1),
    })
    return out
