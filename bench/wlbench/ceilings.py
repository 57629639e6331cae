"""The ceilings a run's goals are judged against, measured in the same run before the loads: the pinned
host→device copy, the disk (parallel ``dd iflag=direct``, and buffered readers after the caches are dropped), and
the page cache and tmpfs (one ``dd``, and 16 threads reading into buffers of their own: how fast this host's CPUs
copy out of them)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Callable, Optional

from wlbench import log
from wlbench.files import Files
from wlbench.pagecache import drop_caches, warm
from wlbench.timing import Run, release, summarize

DD_BLOCK = 16 << 20


def _paths(path: "str | list") -> list:
    return [path] if isinstance(path, str) else list(path)


def dd_rate(path: "str | list", streams: int, direct: bool, runs: int) -> Optional[dict]:
    """GB/s of `streams` parallel `dd bs=16M` over stripes of `path` (the whole file, to /dev/null; a list of files,
    a checkpoint's shards: stripes of each, about `streams` in all, in proportion to their sizes), `runs` times:
    with `direct`, `iflag=direct` (the disk, whatever the page cache holds); without, the page cache's read rate
    (the files warmed first). None when dd is absent or refuses (O_DIRECT on a filesystem without it)."""
    dd = shutil.which("dd")
    if dd is None:
        return None
    paths = _paths(path)
    sizes = [os.path.getsize(p) for p in paths]
    size = sum(sizes)
    stripes = []  # (file, first block, blocks)
    for p, n in zip(paths, sizes):
        blocks = -(-n // DD_BLOCK)
        k = max(1, round(streams * n / max(size, 1)))
        per = -(-blocks // k)
        stripes += [(p, j * per, per) for j in range(k) if j * per < blocks]
    rates = []
    for _ in range(runs):
        if not direct:
            warm(paths)
        t0 = time.perf_counter()
        procs = [subprocess.Popen([dd, f"if={p}", "of=/dev/null", f"bs={DD_BLOCK}", f"skip={skip}",
                                   f"count={count}"] + (["iflag=direct"] if direct else []),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for p, skip, count in stripes]
        errors = [p.communicate()[1] for p in procs]  # waits for each
        dt = time.perf_counter() - t0
        failed = [e for p, e in zip(procs, errors) if p.returncode != 0]
        if failed:
            log(f"  dd failed: {failed[0].decode(errors='replace').strip()}")
            return None
        rates.append(size / dt / 1e9)
    return {"streams": streams, "direct": direct, "bytes": size, **summarize(rates)}


def pinned_copy_rate(nbytes: int, dev: str, runs: int) -> dict:
    """GB/s of one host→device copy of `nbytes` from pinned memory into device memory (torch), after one warm-up
    copy: what the link gives a load that has its bytes in pinned memory already."""
    import torch

    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    rates = []
    try:
        for i in range(runs + 1):
            torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            dst.copy_(host, non_blocking=True)
            torch.cuda.synchronize(dev)
            if i:
                rates.append(nbytes / (time.perf_counter() - t0) / 1e9)
    finally:
        del host, dst
        release(dev)
    return {"bytes": nbytes, **summarize(rates)}


def parallel_read_rate(path: "str | list", threads: int, runs: int,
                       before: Optional[Callable[[], None]] = None) -> dict:
    """GB/s of `threads` threads reading the file (or the files of a list, as one run of bytes: a checkpoint's
    shards) in 16 MiB `preadv` calls, each its own stripe into its own buffer (allocated and touched before the
    clock), after `before()` (default: the files warmed): how fast this host's CPUs copy out of its page cache, the
    host side of a warm load (dd processes would time their own start-up at these sizes); with the caches dropped
    before, how fast the disk gives buffered reads. A thread's error is raised."""
    import threading

    paths = _paths(path)
    sizes = [os.path.getsize(p) for p in paths]
    size = sum(sizes)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]  # each file's place in the run of bytes
    stripe = -(-size // threads)
    bufs = [bytearray(max(1, min(DD_BLOCK, stripe))) for _ in range(threads)]
    for b in bufs:
        b[::4096] = b"\1" * len(b[::4096])
    fds = [os.open(p, os.O_RDONLY) for p in paths]
    rates = []
    try:
        def read(k: int, errors: list) -> None:
            try:
                view = memoryview(bufs[k])
                pos, end = k * stripe, min(size, (k + 1) * stripe)
                while pos < end:
                    i = max(j for j in range(len(paths)) if starts[j] <= pos)
                    off = pos - starts[i]
                    want = min(len(view), end - pos, sizes[i] - off)
                    n = os.preadv(fds[i], [view[:want]], off)
                    if n <= 0:
                        raise OSError(f"short read at {off} of {paths[i]}")
                    pos += n
            except BaseException as e:  # handed to the timing thread
                errors.append(e)

        for _ in range(runs):
            (before or (lambda: warm(paths)))()
            errors: list = []
            workers = [threading.Thread(target=read, args=(k, errors)) for k in range(threads)]
            t0 = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            if errors:
                raise errors[0]
            rates.append(size / (time.perf_counter() - t0) / 1e9)
    finally:
        for fd in fds:
            os.close(fd)
    return {"threads": threads, "bytes": size, **summarize(rates)}


def measure_ceilings(run: Run, families: list, files: Files, cold_why: Optional[str]) -> dict:
    """The ceilings the goals are judged against, measured in this run before the loads: the pinned copy (GPU runs
    with a warm or tmpfs case), the disk (with a cold case: 16 parallel `dd iflag=direct`, and 16 threads reading
    through the page cache after the caches are dropped) and the page cache (one `dd`, and 16 threads reading in
    parallel: how fast this host's CPUs copy out of its page cache; the same threads on the tmpfs copy)."""
    out: dict = {}
    runs = max(3, run.runs)
    path = files.disk.ckpt.files  # the file, or every shard of a multi-file checkpoint (not its index)
    if run.dev.startswith("cuda") and set(families) & {"warm", "tmpfs"}:
        out["pinned_copy"] = pinned_copy_rate(files.disk.ckpt.tensor_bytes, run.dev, max(5, runs))
        pinned = out["pinned_copy"]
        log(f"ceiling pinned copy: best {pinned['best']:.2f} GB/s, median {pinned['median']:.2f}")
    if "cold" in families and not cold_why:
        out["disk_direct_dd16"] = dd_rate(path, 16, True, runs)
        out["disk_buffered_read16"] = parallel_read_rate(path, 16, runs, lambda: drop_caches(path, run.cold))
    if set(families) & {"warm", "restart", "host"}:
        out["page_cache_dd1"] = dd_rate(path, 1, False, runs)
        out["page_cache_read16"] = parallel_read_rate(path, 16, runs)
    if "tmpfs" in families and files.tmpfs is not None:
        out["tmpfs_read16"] = parallel_read_rate(files.tmpfs.ckpt.files, 16, runs)
    for k in ("disk_direct_dd16", "disk_buffered_read16", "page_cache_dd1", "page_cache_read16", "tmpfs_read16"):
        if k in out:
            if out[k] is None:
                out[k] = "dd absent or refused"
            else:
                log(f"ceiling {k}: best {out[k]['best']:.2f} GB/s, median {out[k]['median']:.2f}")
    return out
