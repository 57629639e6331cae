"""firstprobe.py FILE ARM OUT.jsonl LOG: one fresh process. Times every step of the first and second
weightlift.load_file onto cuda:0 (torch makes the context first, not counted), each torch.empty the load asks for,
and logs weightlift's debug events (ms since process start) to LOG. ARM: default | prepare (weightlift.prepare first) |
ext (the side stream is a stream made with cuStreamCreate, wrapped by torch.cuda.ExternalStream, instead of
torch.cuda.Stream) | streamfirst (torch.cuda.Stream made before the clock, timed alone)."""
import gc, json, logging, sys, time
f, arm, out, log = sys.argv[1:5]
logging.basicConfig(level=logging.DEBUG, filename=log, filemode="w", format="%(relativeCreated)10.3f %(name)s %(message)s")
L = logging.getLogger("probe")
T0 = time.perf_counter()
import torch
t = time.perf_counter(); torch.zeros(1, device="cuda:0"); torch.cuda.synchronize(); ctx = time.perf_counter() - t
t = time.perf_counter(); import weightlift; from weightlift import _core; import weightlift.safetensors as wst; imp = time.perf_counter() - t
rec = {"arm": arm, "ctx_s": ctx, "import_s": imp}
if arm == "streamfirst":
    t = time.perf_counter(); _s = torch.cuda.Stream(device="cuda:0"); rec["torch_stream_s"] = time.perf_counter() - t
    t = time.perf_counter(); _s2 = torch.cuda.Stream(device="cuda:0"); rec["torch_stream2_s"] = time.perf_counter() - t
if arm == "ext":
    import ctypes
    cu = ctypes.CDLL("libcuda.so.1")
    def ext_allocator(engine, device):
        t_ = torch
        dev = t_.device(device)
        consumer = t_.cuda.current_stream(dev)
        side = _core._side_streams.get(dev.index)
        if side is None:
            h = ctypes.c_void_p()
            assert cu.cuStreamCreate(ctypes.byref(h), 1) == 0
            side = _core._side_streams[dev.index] = t_.cuda.ExternalStream(h.value, device=dev)
        def alloc(nbytes):
            with t_.cuda.stream(side):
                block = t_.empty(nbytes, dtype=t_.uint8, device=dev)
            block.record_stream(consumer)
            return block
        return alloc, side.cuda_stream
    _core.device_allocator = ext_allocator
if arm in ("prepare", "both", "preparesample"):
    t = time.perf_counter(); p = weightlift.prepare("cuda:0"); rec["prepare_s"] = time.perf_counter() - t; rec["prepare"] = p
if arm.startswith("idle"):
    time.sleep(0.2)
    rec["slept_s"] = 0.2
if arm == "idleprepare":
    t = time.perf_counter(); p = weightlift.prepare("cuda:0"); rec["prepare_s"] = time.perf_counter() - t; rec["prepare"] = p
    time.sleep(0.2)
import os, threading
samples = []
def sampler(stop):
    pid = os.getpid(); last = {}
    t0s = time.perf_counter()
    while not stop.is_set():
        now = (time.perf_counter() - t0s) * 1e3
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            tids = []
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                    st = fh.read()
                comm = st[st.index("(") + 1:st.rindex(")")]
                state = st[st.rindex(")") + 2]
                with open(f"/proc/{pid}/task/{tid}/wchan") as fh:
                    wchan = fh.read().strip()
                stack = ""
                if state in "DS" and wchan not in ("futex_wait_queue", "do_epoll_wait", "hrtimer_nanosleep"):
                    try:
                        with open(f"/proc/{pid}/task/{tid}/stack") as fh:
                            stack = " < ".join(l.split()[1].split("+")[0] for l in fh.read().splitlines()[:6])
                    except OSError as e:
                        stack = f"({e.errno})"
                key = (state, wchan, stack)
                if last.get(tid) != key:
                    last[tid] = key
                    samples.append((round(now, 2), int(tid), comm, state, wchan, stack))
            except (OSError, ValueError):
                pass
        time.sleep(0.0003)
calls = []
def load(i):
    L.info("load %d starts", i)
    calls.clear()
    s = {}
    t0 = time.perf_counter()
    eng = _core.shared_engine(); s["engine"] = time.perf_counter() - t0
    alloc, stream = _core.device_allocator(eng, "cuda:0"); s["allocator"] = time.perf_counter() - t0
    def wrapped(n, alloc=alloc):
        a = time.perf_counter(); L.debug("alloc %d starts", n); b = alloc(n); calls.append((n, a - t0, time.perf_counter() - t0)); L.debug("alloc ends"); return b
    ckpt = wst._checkpoint(f); s["checkpoint"] = time.perf_counter() - t0
    L.info("ckpt.load starts")
    stop = threading.Event(); th = None
    if i == 0 and arm.endswith("sample"):
        th = threading.Thread(target=sampler, args=(stop,), daemon=True); th.start()
        L.info("sampler started")
    bufs = ckpt.load(eng, "cuda:0", None, False, 0, wrapped if alloc else None, stream); s["load"] = time.perf_counter() - t0
    if th is not None:
        stop.set(); th.join()
    ts = _core.info_tensors(bufs, ckpt.tensors); s["tensors"] = time.perf_counter() - t0
    torch.cuda.synchronize(); s["sync"] = time.perf_counter() - t0
    L.info("load %d done", i)
    rep = weightlift.last_report()
    r = {"steps_s": {k: round(v, 5) for k, v in s.items()}, "report_s": rep["seconds"], "times": rep["times"],
         "device_memory": rep.get("device_memory"), "allocs": len(calls),
         "alloc_in_calls_s": round(sum(c[2] - c[1] for c in calls), 5),
         "alloc_first_start_s": round(calls[0][1], 5) if calls else None, "alloc_last_end_s": round(calls[-1][2], 5) if calls else None}
    # a spot check of the bytes: the first and last tensors against the safetensors package
    from safetensors import safe_open
    names = [ti.name for ti in ckpt.tensors]
    with safe_open(f, "pt") as h:
        for n, tt in zip(names, ts):
            if n in (names[0], names[-1]):
                r.setdefault("checked", []).append(bool(torch.equal(h.get_tensor(n), tt.cpu())))
    del ts, bufs
    gc.collect(); torch.cuda.synchronize(); torch.cuda.empty_cache()
    return r
rec["first"] = load(0)
rec["second"] = load(1)
rec["process_s"] = time.perf_counter() - T0
if samples:
    rec["samples"] = samples
with open(out, "a") as o:
    o.write(json.dumps(rec) + "\n")
fs, ss = rec["first"]["steps_s"]["sync"], rec["second"]["steps_s"]["sync"]
print(f"{arm:8s} first {fs:.4f} second {ss:.4f} ratio {fs/ss:.2f} steps1 {rec['first']['steps_s']} rep1 {rec['first']['report_s']:.4f} alloc1 {rec['first']['alloc_in_calls_s']} last_alloc_end {rec['first']['alloc_last_end_s']}", flush=True)
