"""allocprobe.py FILE: where a warm load's allocation time goes with device_memory=torch. Each torch.empty the
load asks for is timed (monkeypatched allocator); loads after torch.cuda.empty_cache() and without it; the same
sizes allocated alone, with nothing else running; one allocation of the whole size; device_memory=pool beside."""
import gc, json, sys, time
import torch
torch.zeros(1, device="cuda:0")
import weightlift
from weightlift import _core
f = sys.argv[1]
calls = []
orig = _core.device_allocator
def timed_allocator(engine, device):
    alloc, stream = orig(engine, device)
    if alloc is None:
        return alloc, stream
    def wrapped(n):
        t0 = time.perf_counter(); t = alloc(n); t1 = time.perf_counter()
        calls.append((n, t0, t1)); return t
    return wrapped, stream
_core.device_allocator = timed_allocator
import weightlift.safetensors as wst
wst._core.device_allocator = timed_allocator
def load(empty):
    gc.collect()
    if empty:
        torch.cuda.empty_cache()
    torch.cuda.synchronize()
    calls.clear()
    t0 = time.perf_counter(); d = weightlift.load_file(f, device="cuda:0"); torch.cuda.synchronize(); dt = time.perf_counter() - t0
    rep = weightlift.last_report()
    out = {"empty_cache_before": empty, "device_memory": rep["device_memory"], "seconds": round(dt, 4), "alloc_secs": round(rep["times"]["alloc"], 4),
           "calls": len(calls), "in_callbacks_s": round(sum(c[2] - c[1] for c in calls), 4),
           "first_call_after_s": round(calls[0][1] - t0, 4) if calls else None, "last_call_end_s": round(calls[-1][2] - t0, 4) if calls else None,
           "slowest_calls_ms": sorted([round((c[2] - c[1]) * 1e3, 2) for c in calls])[-5:]}
    sizes = [c[0] for c in calls]
    del d
    return out, sizes
res = []
load(True)
for i in range(3):
    for empty in (True, False):
        o, sizes = load(empty); res.append(o); print(json.dumps(o), flush=True)
# the same sizes alone, nothing else running
for i in range(3):
    gc.collect(); torch.cuda.empty_cache(); torch.cuda.synchronize()
    t0 = time.perf_counter(); ts = [torch.empty(n, dtype=torch.uint8, device="cuda:0") for n in sizes]; torch.cuda.synchronize()
    print(json.dumps({"alone": len(sizes), "seconds": round(time.perf_counter() - t0, 4)}), flush=True); del ts
    gc.collect(); torch.cuda.empty_cache(); torch.cuda.synchronize()
    t0 = time.perf_counter(); one = torch.empty(sum(sizes), dtype=torch.uint8, device="cuda:0"); torch.cuda.synchronize()
    print(json.dumps({"one allocation": sum(sizes), "seconds": round(time.perf_counter() - t0, 4)}), flush=True); del one
pool = _core.new_engine(device_memory="pool")
for i in range(3):
    gc.collect(); torch.cuda.empty_cache(); torch.cuda.synchronize()
    t0 = time.perf_counter(); d = weightlift.load_file(f, device="cuda:0", engine=pool); torch.cuda.synchronize(); dt = time.perf_counter() - t0
    rep = weightlift.last_report()
    print(json.dumps({"device_memory": rep["device_memory"], "seconds": round(dt, 4), "alloc_secs": round(rep["times"]["alloc"], 4)}), flush=True)
    del d
