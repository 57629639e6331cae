"""How cuMemHostRegister's cost scales with size, and how pinning delays copies issued beside it (ctypes on libcuda)."""
import ctypes, ctypes.util, json, mmap, os, sys, threading, time, random

cu = ctypes.CDLL("libcuda.so.1")
def ck(r, what):
    if r != 0:
        raise RuntimeError(f"{what} -> {r}")
MiB = 1 << 20
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
cu.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
cu.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
cu.cuMemHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
cu.cuMemFreeHost.argtypes = [ctypes.c_void_p]
cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
cu.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
cu.cuStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
cu.cuStreamSynchronize.argtypes = [ctypes.c_void_p]

def amap(n, touch=True):
    p = libc.mmap(None, n + 2 * MiB, 3, 0x22, -1, 0)
    p = (p + 2 * MiB - 1) & ~(2 * MiB - 1)
    libc.madvise(p, n, 14)  # MADV_HUGEPAGE
    if touch:
        for off in range(0, n, 4096):
            ctypes.c_char.from_address(p + off).value = b"\1"
    return p

def reg(p, n):
    t = time.perf_counter(); ck(cu.cuMemHostRegister_v2(p, n, 1), "register"); return time.perf_counter() - t

def unreg(p):
    t = time.perf_counter(); ck(cu.cuMemHostUnregister(p), "unregister"); return time.perf_counter() - t

def init():
    t = time.perf_counter()
    ck(cu.cuInit(0), "init"); dev = ctypes.c_int(); ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "dev")
    ctx = ctypes.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
    ck(cu.cuCtxSetCurrent(ctx), "set"); ck(cu.cuCtxSynchronize(), "sync")
    return ctx, time.perf_counter() - t

mode = sys.argv[1]
ctx, ctx_s = init()
out = {"mode": mode, "ctx_s": ctx_s}
if mode == "sizes":
    p = amap(8 * MiB); out["first_reg_8MiB_s"] = reg(p, 8 * MiB); out["first_unreg_s"] = unreg(p)
    rows = []
    sizes = [2, 8, 32, 128] * 3
    random.shuffle(sizes)
    for s in sizes:
        n = s * MiB
        t = time.perf_counter(); p = amap(n); m = time.perf_counter() - t
        rows.append({"mib": s, "map_touch_s": m, "reg_s": reg(p, n), "unreg_s": unreg(p)})
    out["rows"] = rows
    # 16 separate 8 MiB regions pinned one after another vs one 128 MiB region pinned once
    ps = [amap(8 * MiB) for _ in range(16)]
    t = time.perf_counter(); per = [reg(q, 8 * MiB) for q in ps]; out["16x8_total_s"] = time.perf_counter() - t; out["16x8_each_s"] = per
    for q in ps: unreg(q)
    q = amap(128 * MiB); out["1x128_s"] = reg(q, 128 * MiB); unreg(q)
    # one 128 MiB region, registered as 16 slices
    q = amap(128 * MiB); t = time.perf_counter(); per = [reg(q + i * 8 * MiB, 8 * MiB) for i in range(16)]
    out["16slices_total_s"] = time.perf_counter() - t
elif mode == "unfaulted":
    for s in [8, 128, 8, 128]:
        p = amap(s * MiB, touch=False); out.setdefault("rows", []).append({"mib": s, "reg_s": reg(p, s * MiB)}); unreg(p)
elif mode == "hostalloc":
    for s in [8, 128, 8, 128]:
        p = ctypes.c_void_p(); t = time.perf_counter(); ck(cu.cuMemHostAlloc(ctypes.byref(p), s * MiB, 1), "hostalloc")
        out.setdefault("rows", []).append({"mib": s, "alloc_s": time.perf_counter() - t})
elif mode.startswith("contend"):
    # A copier thread issues 4 MiB copies from pinned memory while the main thread pins: issue latency per copy.
    src = amap(4 * MiB); reg(src, 4 * MiB)
    d = ctypes.c_uint64(); ck(cu.cuMemAlloc_v2(ctypes.byref(d), 64 * MiB), "alloc")
    st = ctypes.c_void_p(); ck(cu.cuStreamCreate(ctypes.byref(st), 1), "stream")
    what = mode.split("-")[1]
    regions = [amap(8 * MiB) for _ in range(16)] if what == "16x8" else [amap(128 * MiB)] if what == "1x128" else []
    stop = False; lat = []
    def copier():
        i = 0
        while not stop:
            t = time.perf_counter(); ck(cu.cuMemcpyHtoDAsync_v2(d.value + (i % 16) * 4 * MiB, src, 4 * MiB, st), "copy")
            lat.append(time.perf_counter() - t); i += 1
            if i % 8 == 0: cu.cuStreamSynchronize(st)
        cu.cuStreamSynchronize(st)
    th = threading.Thread(target=copier); th.start(); time.sleep(0.01)
    n0 = len(lat); t = time.perf_counter()
    for r in regions: reg(r, 128 * MiB if what == "1x128" else 8 * MiB)
    if what == "none": time.sleep(0.015)
    pin_s = time.perf_counter() - t; n1 = len(lat); stop = True; th.join()
    during = sorted(lat[n0:n1])
    out.update({"pin_total_s": pin_s, "copies_during": len(during),
                "issue_ms_p50": during[len(during)//2] * 1e3 if during else None,
                "issue_ms_max": during[-1] * 1e3 if during else None,
                "issue_ms_sum": sum(during) * 1e3})
print(json.dumps(out))
