"""pin_probe.py CASE: in a fresh process (context made first), pins 128 MiB of 2 MiB-aligned, huge-page-advised,
touched host memory with cuMemHostRegister: `split` as 16 regions of 8 MiB one after another (what weightlift's 16
lanes do), `one` as one call, `split-after-one` as 16 calls after a first 8 MiB region pinned and unpinned. Prints
JSON with each call's time."""
import ctypes, json, mmap, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
libc = ctypes.CDLL("libc.so.6", use_errno=True)
def ck(name, *a):
    r = getattr(cuda, name)(*a)
    if r: raise RuntimeError(f"{name}: {r}")
ck("cuInit", 0); dev = ctypes.c_int(); ck("cuDeviceGet", ctypes.byref(dev), 0)
ctx = ctypes.c_void_p(); ck("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev); ck("cuCtxSetCurrent", ctx)
MiB = 1 << 20
case = sys.argv[1]
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
size = 130 * MiB
raw = libc.mmap(None, size, 3, 0x22, -1, 0)  # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS
base = (raw + 2 * MiB - 1) & ~(2 * MiB - 1)
libc.madvise(ctypes.c_void_p(base), ctypes.c_size_t(128 * MiB), 14)  # MADV_HUGEPAGE
buf = (ctypes.c_char * (128 * MiB)).from_address(base)
for off in range(0, 128 * MiB, 4096):
    buf[off] = b"\x01"
def pin(addr, n):
    t = time.perf_counter(); ck("cuMemHostRegister_v2", ctypes.c_void_p(addr), ctypes.c_size_t(n), 0); return time.perf_counter() - t
def unpin(addr):
    ck("cuMemHostUnregister", ctypes.c_void_p(addr))
out = {"case": case}
if case == "split-after-one":
    out["warm_up_8MiB_s"] = pin(base, 8 * MiB); unpin(base)
if case == "one":
    out["calls_s"] = [pin(base, 128 * MiB)]
else:
    out["calls_s"] = [pin(base + i * 8 * MiB, 8 * MiB) for i in range(16)]
out["total_s"] = sum(out["calls_s"])
out["calls_s"] = [round(x, 5) for x in out["calls_s"]]
print(json.dumps(out), flush=True)
