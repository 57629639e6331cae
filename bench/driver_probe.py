#!/usr/bin/env python3
"""Driver-level facts behind two open performance questions, measured with the CUDA driver alone (ctypes, no torch):

1. A first load pays for device memory that a second load finds in the pool. Do host->device copies slow down while
   another thread allocates (a lock in the driver), or do the two overlap?
2. A first load also sets up each lane's staging: map, fault in, pin. What does that cost with 16 lanes at once,
   and with device memory being allocated meanwhile?
3. Warm loads copy the file out of the page cache into pinned staging (one CPU copy per byte). Can the copy engine
   read the page cache itself: a read-only mapping of the file registered with cuMemHostRegister(READ_ONLY), then
   copied from? At what rate do registration and the copies run?

Usage: driver_probe.py OUT.json [--dir DIR] [--gib N] [--staging-only [--case NAME ...]]. Prints one line per figure and writes them all as JSON.
"""

import argparse
import ctypes
import json
import os
import threading
import time

MIB = 1 << 20
cuda = ctypes.CDLL("libcuda.so.1")
libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
U64 = ctypes.c_uint64


def ck(name, *args):
    r = getattr(cuda, name)(*args)
    if r != 0:
        raise RuntimeError(f"{name} failed with CUDA error {r}")


class Ctx:
    def __init__(self):
        ck("cuInit", 0)
        self.dev = ctypes.c_int()
        ck("cuDeviceGet", ctypes.byref(self.dev), 0)
        self.ctx = ctypes.c_void_p()
        ck("cuDevicePrimaryCtxRetain", ctypes.byref(self.ctx), self.dev)
        self.bind()

    def bind(self):
        ck("cuCtxSetCurrent", self.ctx)

    def stream(self):
        s = ctypes.c_void_p()
        ck("cuStreamCreate", ctypes.byref(s), 1)  # non-blocking
        return s

    def pool_trim(self):
        pool = ctypes.c_void_p()
        ck("cuDeviceGetDefaultMemPool", ctypes.byref(pool), self.dev)
        ck("cuCtxSynchronize")
        ck("cuMemPoolTrimTo", pool, ctypes.c_size_t(0))


def pinned(n):
    p = ctypes.c_void_p()
    ck("cuMemAllocHost_v2", ctypes.byref(p), ctypes.c_size_t(n))
    ctypes.memset(p, 0x5A, n)
    return p


def dev_alloc(n):
    p = U64()
    ck("cuMemAlloc_v2", ctypes.byref(p), ctypes.c_size_t(n))
    return p


def copy_rate(ctx, src, dst, chunk, total, stream):
    """Copies `total` bytes host->device in `chunk`-sized async copies from src (cycling) on one stream."""
    t = time.perf_counter()
    off = 0
    while off < total:
        ck("cuMemcpyHtoDAsync_v2", U64(dst.value), ctypes.c_void_p(src + off % (256 * MIB)), ctypes.c_size_t(chunk),
           stream)
        off += chunk
    ck("cuStreamSynchronize", stream)
    return total / (time.perf_counter() - t) / 1e9


def alloc_async_chunks(ctx, total, chunk, stream):
    ptrs = []
    t = time.perf_counter()
    for _ in range(total // chunk):
        p = U64()
        ck("cuMemAllocAsync", ctypes.byref(p), ctypes.c_size_t(chunk), stream)
        ptrs.append(p)
    ck("cuStreamSynchronize", stream)
    secs = time.perf_counter() - t
    return secs, ptrs


def free_async(ptrs, stream):
    for p in ptrs:
        ck("cuMemFreeAsync", U64(p.value), stream)
    ck("cuStreamSynchronize", stream)


def alloc_vs_copies(ctx, gib, out):
    stream_c, stream_a = ctx.stream(), ctx.stream()
    src = pinned(256 * MIB)
    dst = dev_alloc(256 * MIB)
    copy_bytes = 8 << 30
    copy_rate(ctx, src.value, dst, 4 * MIB, 1 << 30, stream_c)  # warm-up
    alone = copy_rate(ctx, src.value, dst, 4 * MIB, copy_bytes, stream_c)
    out["copy_alone_gbps"] = alone
    for chunk_mib in (64, 1024):
        ctx.pool_trim()
        secs, ptrs = alloc_async_chunks(ctx, gib << 30, chunk_mib * MIB, stream_a)
        out[f"alloc_async_fresh_{chunk_mib}MiB_secs"] = secs
        free_async(ptrs, stream_a)
        secs2, ptrs = alloc_async_chunks(ctx, gib << 30, chunk_mib * MIB, stream_a)
        out[f"alloc_async_pooled_{chunk_mib}MiB_secs"] = secs2
        free_async(ptrs, stream_a)
        ctx.pool_trim()
        # Fresh allocation on one thread while another copies.
        res = {}

        def copier():
            ctx.bind()
            res["rate"] = copy_rate(ctx, src.value, dst, 4 * MIB, copy_bytes, stream_c)

        th = threading.Thread(target=copier)
        th.start()
        time.sleep(0.01)
        t = time.perf_counter()
        secs3, ptrs = alloc_async_chunks(ctx, gib << 30, chunk_mib * MIB, stream_a)
        th.join()
        res["alloc_secs"] = secs3
        res["wall"] = time.perf_counter() - t
        free_async(ptrs, stream_a)
        ctx.pool_trim()
        out[f"concurrent_{chunk_mib}MiB"] = {
            "copy_gbps_with_alloc": res["rate"],
            "alloc_secs_with_copies": res["alloc_secs"],
        }
    t = time.perf_counter()
    p = dev_alloc(gib << 30)
    out["cuMemAlloc_fresh_secs"] = time.perf_counter() - t
    ck("cuMemFree_v2", U64(p.value))
    for k, v in out.items():
        print(k, v, flush=True)


def staging_setup(ctx, lanes, each, populate=True, hugepage=False, alloc_gib=0, serial=False):
    """`lanes` threads at once each map `each` bytes of anonymous memory, fault it in and pin it (what a lane does
    for its staging slots on a first load), or one thread after another (`serial`); optionally while another thread
    allocates `alloc_gib` of device memory in 64 MiB pieces. Returns the wall time, the slowest thread's split, and
    the allocation's time."""
    res = {"threads": [], "alloc_secs": None}
    maps = []
    lock = threading.Lock()
    one_at_a_time = threading.Lock()

    def lane():
        if serial:
            with one_at_a_time:
                set_up()
        else:
            set_up()

    def set_up():
        ctx.bind()
        t0 = time.perf_counter()
        addr = libc.mmap(None, each, 3, 0x22, -1, 0)  # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS
        if hugepage:
            libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(each), 14)  # MADV_HUGEPAGE
        if populate and libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(each), 23) != 0:  # MADV_POPULATE_WRITE
            ctypes.memset(addr, 0, each)
        t1 = time.perf_counter()
        ck("cuMemHostRegister_v2", ctypes.c_void_p(addr), ctypes.c_size_t(each), 0x01)  # PORTABLE
        t2 = time.perf_counter()
        with lock:
            maps.append(addr)
            res["threads"].append((t1 - t0, t2 - t1))

    def allocator():
        ctx.bind()
        s = ctx.stream()
        secs, ptrs = alloc_async_chunks(ctx, alloc_gib << 30, 64 * MIB, s)
        res["alloc_secs"] = secs
        free_async(ptrs, s)

    ctx.pool_trim()
    ths = [threading.Thread(target=lane) for _ in range(lanes)]
    if alloc_gib:
        ths.append(threading.Thread(target=allocator))
    t = time.perf_counter()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    res["wall_secs"] = time.perf_counter() - t
    res["max_populate_secs"] = max(p for p, _ in res["threads"])
    res["max_register_secs"] = max(r for _, r in res["threads"])
    del res["threads"]
    for a in maps:
        ck("cuMemHostUnregister", ctypes.c_void_p(a))
        libc.munmap(ctypes.c_void_p(a), each)
    ctx.pool_trim()
    return res


# The staging set-up cases, each (label, staging_setup's keywords); lanes=0: the device allocation alone.
STAGING_CASES = (
    ("16x8MiB", dict(lanes=16, each=8 * MIB)),
    ("16x8MiB_again", dict(lanes=16, each=8 * MIB)),
    ("1x128MiB", dict(lanes=1, each=128 * MIB)),
    ("16x8MiB_hugepage", dict(lanes=16, each=8 * MIB, hugepage=True)),
    ("16x8MiB_no_populate", dict(lanes=16, each=8 * MIB, populate=False)),
    ("alloc_4GiB_alone", dict(lanes=0, each=MIB, alloc_gib=4)),
    ("16x8MiB_with_alloc_4GiB", dict(lanes=16, each=8 * MIB, alloc_gib=4)),
    ("1x128MiB_with_alloc_4GiB", dict(lanes=1, each=128 * MIB, alloc_gib=4)),
    # what a first load does now (one lane after another, huge pages) against one region for all lanes
    ("16x8MiB_hugepage_serial", dict(lanes=16, each=8 * MIB, hugepage=True, serial=True)),
    ("1x128MiB_hugepage", dict(lanes=1, each=128 * MIB, hugepage=True)),
    ("16x8MiB_hugepage_serial_with_alloc_4GiB", dict(lanes=16, each=8 * MIB, hugepage=True, serial=True,
                                                      alloc_gib=4)),
    ("1x128MiB_hugepage_with_alloc_4GiB", dict(lanes=1, each=128 * MIB, hugepage=True, alloc_gib=4)),
)


def staging_cases(ctx, out, only=()):
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    cases = {}
    unknown = set(only) - {label for label, _ in STAGING_CASES}
    if unknown:
        raise SystemExit(f"unknown staging case(s): {sorted(unknown)}; known: {[label for label, _ in STAGING_CASES]}")
    for label, kw in STAGING_CASES:
        if only and label not in only:
            continue
        try:
            if kw["lanes"] == 0:
                s = ctx.stream()
                ctx.pool_trim()
                secs, ptrs = alloc_async_chunks(ctx, 4 << 30, 64 * MIB, s)
                free_async(ptrs, s)
                cases[label] = {"alloc_secs": secs}
            else:
                cases[label] = staging_setup(ctx, **kw)
        except Exception as e:
            cases[label] = {"error": repr(e)}
        print("staging", label, cases[label], flush=True)
    out["staging_setup"] = cases


def make_file(path, gib):
    block = os.urandom(64 * MIB)
    with open(path, "wb") as f:
        for _ in range(gib * 16):
            f.write(block)
    with open(path, "rb") as f:  # warm: everything read once
        while f.read(64 * MIB):
            pass


def register_mapping(ctx, path, gib, out, label):
    n = gib << 30
    fd = os.open(path, os.O_RDONLY)
    addr = libc.mmap(None, n, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap failed")
    stream = ctx.stream()
    dst = dev_alloc(n)
    res = {}
    # Whole file at once.
    t = time.perf_counter()
    r = cuda.cuMemHostRegister_v2(ctypes.c_void_p(addr), ctypes.c_size_t(n), 0x08)  # READ_ONLY
    res["register_whole_secs"] = time.perf_counter() - t
    if r != 0:
        res["register_error"] = r
        print(label, res, flush=True)
        out[label] = res
        os.close(fd)
        return
    t = time.perf_counter()
    ck("cuMemcpyHtoDAsync_v2", U64(dst.value), ctypes.c_void_p(addr), ctypes.c_size_t(n), stream)
    ck("cuStreamSynchronize", stream)
    res["copy_registered_gbps"] = n / (time.perf_counter() - t) / 1e9
    t = time.perf_counter()
    for off in range(0, n, 4 * MIB):
        ck("cuMemcpyHtoDAsync_v2", U64(dst.value + off), ctypes.c_void_p(addr + off), ctypes.c_size_t(4 * MIB), stream)
    ck("cuStreamSynchronize", stream)
    res["copy_registered_4MiB_gbps"] = n / (time.perf_counter() - t) / 1e9
    t = time.perf_counter()
    ck("cuMemHostUnregister", ctypes.c_void_p(addr))
    res["unregister_whole_secs"] = time.perf_counter() - t
    # Pipelined windows: each of `lanes` threads registers a window, copies it, unregisters it.
    for lanes, window_mib in ((4, 64), (8, 64), (16, 64), (8, 256)):
        window = window_mib * MIB
        jobs = list(range(0, n, window))
        lock = threading.Lock()
        errors = []

        def lane():
            ctx.bind()
            s = ctx.stream()
            while True:
                with lock:
                    if not jobs:
                        return
                    off = jobs.pop(0)
                try:
                    ck("cuMemHostRegister_v2", ctypes.c_void_p(addr + off), ctypes.c_size_t(window), 0x08)
                    ck("cuMemcpyHtoDAsync_v2", U64(dst.value + off), ctypes.c_void_p(addr + off),
                       ctypes.c_size_t(window), s)
                    ck("cuStreamSynchronize", s)
                    ck("cuMemHostUnregister", ctypes.c_void_p(addr + off))
                except RuntimeError as e:
                    errors.append(str(e))
                    return

        t = time.perf_counter()
        ths = [threading.Thread(target=lane) for _ in range(lanes)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        res[f"windows_{lanes}x{window_mib}MiB_gbps"] = n / (time.perf_counter() - t) / 1e9
        if errors:
            res[f"windows_{lanes}x{window_mib}MiB_error"] = errors[0]
    # Check the bytes of one window against the file.
    back = (ctypes.c_char * (4 * MIB))()
    ck("cuMemcpyDtoH_v2", back, U64(dst.value + n - 4 * MIB), ctypes.c_size_t(4 * MIB))
    with open(path, "rb") as f:
        f.seek(n - 4 * MIB)
        res["bytes_equal"] = bytes(back) == f.read(4 * MIB)
    # The same file read into pinned staging by 16 threads (what the lanes do now), for comparison.
    res["pread_16_threads_gbps"] = pread_rate(fd, n, 16)
    ck("cuMemFree_v2", U64(dst.value))
    libc.munmap(ctypes.c_void_p(addr), n)
    os.close(fd)
    out[label] = res
    print(label, res, flush=True)


def pread_rate(fd, n, threads):
    chunk = 4 * MIB
    bufs = [pinned(chunk) for _ in range(threads)]
    offs = list(range(0, n, chunk))
    lock = threading.Lock()

    def lane(i):
        view = (ctypes.c_char * chunk).from_address(bufs[i].value)
        mv = memoryview(view).cast("B")
        while True:
            with lock:
                if not offs:
                    return
                off = offs.pop()
            os.preadv(fd, [mv], off)

    t = time.perf_counter()
    ths = [threading.Thread(target=lane, args=(i,)) for i in range(threads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    rate = n / (time.perf_counter() - t) / 1e9
    for b in bufs:
        ck("cuMemFreeHost", b)
    return rate


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dir", default=".")
    ap.add_argument("--gib", type=int, default=4)
    ap.add_argument("--staging-only", action="store_true", help="only the staging set-up cases")
    ap.add_argument("--case", action="append", default=[], help="only this staging case (repeatable)")
    a = ap.parse_args()
    out = {"gib": a.gib}
    t = time.perf_counter()
    ctx = Ctx()
    out["context_secs"] = time.perf_counter() - t
    try:
        staging_cases(ctx, out, a.case)
    except Exception as e:
        out["staging_error"] = repr(e)
    if a.staging_only:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
        return
    try:
        alloc_vs_copies(ctx, a.gib, out)
    except Exception as e:  # a probe: record and go on to the next question
        out["alloc_error"] = repr(e)
    for label, d in (("page_cache", a.dir), ("tmpfs", "/dev/shm")):
        path = os.path.join(d, "driver-probe.bin")
        try:
            make_file(path, a.gib)
            register_mapping(ctx, path, a.gib, out, label)
        except Exception as e:
            out[f"{label}_error"] = repr(e)
            print(label, "error", e, flush=True)
        finally:
            if os.path.exists(path):
                os.unlink(path)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
