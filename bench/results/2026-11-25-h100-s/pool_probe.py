"""pool_probe.py CASE: in a fresh process (context made first), times the first device allocations of one kind.
Cases: default (cuMemAllocAsync on the default pool: 256 MiB, then 20 x 50 MiB), small-first (2 MiB first, then the
same), own-pool (cuMemPoolCreate, then the same from it), plain (cuMemAlloc: 256 MiB then 20 x 50 MiB). Prints JSON."""
import ctypes, json, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
def ck(name, *a):
    r = getattr(cuda, name)(*a)
    if r: raise RuntimeError(f"{name}: {r}")
U64 = ctypes.c_uint64
t = time.perf_counter()
ck("cuInit", 0); dev = ctypes.c_int(); ck("cuDeviceGet", ctypes.byref(dev), 0)
ctx = ctypes.c_void_p(); ck("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev); ck("cuCtxSetCurrent", ctx)
out = {"case": sys.argv[1], "context_s": time.perf_counter() - t}
s = ctypes.c_void_p(); ck("cuStreamCreate", ctypes.byref(s), 1)
MiB = 1 << 20
case = sys.argv[1]
pool = None
if case == "own-pool":
    class Props(ctypes.Structure):
        _fields_ = [("allocType", ctypes.c_int), ("handleTypes", ctypes.c_int), ("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int),
                    ("win32", ctypes.c_void_p), ("maxSize", ctypes.c_size_t), ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 54)]
    p = Props(); p.allocType = 1; p.handleTypes = 0; p.loc_type = 1; p.loc_id = 0
    pool = ctypes.c_void_p()
    t = time.perf_counter(); ck("cuMemPoolCreate", ctypes.byref(pool), ctypes.byref(p)); out["pool_create_s"] = time.perf_counter() - t
def alloc(n):
    ptr = U64()
    t = time.perf_counter()
    if case == "plain":
        ck("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(n))
    elif pool is not None:
        ck("cuMemAllocFromPoolAsync", ctypes.byref(ptr), ctypes.c_size_t(n), pool, s)
    else:
        ck("cuMemAllocAsync", ctypes.byref(ptr), ctypes.c_size_t(n), s)
    return time.perf_counter() - t
if case == "small-first":
    out["first_2MiB_s"] = alloc(2 * MiB)
out["first_256MiB_s"] = alloc(256 * MiB)
out["next_20x50MiB_s"] = sum(alloc(50 * MiB) for _ in range(20))
t = time.perf_counter(); ck("cuStreamSynchronize", s); out["sync_s"] = time.perf_counter() - t
print(json.dumps(out))
