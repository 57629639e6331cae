"""helperprobe.py: would a resident helper process (its lanes' staging already pinned) make a fresh process's first
load as fast as its second? The helper maps the client's device memory through CUDA IPC (torch's own reductions) and
reads the checkpoint's data section into it with weightlift's engine (read_into).

  helperprobe.py helper SOCKET READY_FILE            serve until killed
  helperprobe.py client FILE SOCKET ARM OUT.jsonl    one fresh process; ARM: helper | own
"""
import gc, json, os, pickle, struct, sys, time

T0 = time.perf_counter()
mode = sys.argv[1]


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return 8 + n, h


if mode == "helper":
    sock, ready = sys.argv[2:4]
    import torch, torch.multiprocessing  # noqa: F401  (registers torch's CUDA reductions)
    from multiprocessing.connection import Listener
    import weightlift
    from weightlift import _core

    torch.zeros(1, device="cuda:0")
    weightlift.prepare("cuda:0")
    eng = _core.shared_engine()
    lst = Listener(sock, family="AF_UNIX")
    open(ready, "w").write("ready\n")
    while True:
        conn = lst.accept()
        try:
            while True:
                try:
                    data = conn.recv_bytes()
                except EOFError:
                    break
                a = time.perf_counter()
                path, off, n, buf = pickle.loads(data)
                b = time.perf_counter()
                torch.cuda.current_stream().synchronize()
                done = eng.read_into(path, off, n, buf.data_ptr(), "cuda:0")
                c = time.perf_counter()
                del buf
                conn.send({"open_s": b - a, "read_s": c - b, "bytes": done})
        finally:
            conn.close()

f, sock, arm, out = sys.argv[2:6]
import torch, torch.multiprocessing  # noqa: F401
from multiprocessing.connection import Client
from multiprocessing.reduction import ForkingPickler

t = time.perf_counter(); torch.zeros(1, device="cuda:0"); torch.cuda.synchronize(); ctx = time.perf_counter() - t
t = time.perf_counter(); import weightlift; imp = time.perf_counter() - t
rec = {"arm": arm, "ctx_s": ctx, "import_s": imp}
DT = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "I64": torch.int64, "U8": torch.uint8}
if arm == "helper":
    t = time.perf_counter(); conn = Client(sock, family="AF_UNIX"); rec["connect_s"] = time.perf_counter() - t


def load_helper():
    s = {}
    t0 = time.perf_counter()
    start, h = header(f)
    n = max(v["data_offsets"][1] for v in h.values())
    s["header"] = time.perf_counter() - t0
    buf = torch.empty(n, dtype=torch.uint8, device="cuda:0"); s["alloc"] = time.perf_counter() - t0
    data = ForkingPickler.dumps((f, start, n, buf)); s["pickle"] = time.perf_counter() - t0
    conn.send_bytes(data)
    r = conn.recv(); s["helper"] = time.perf_counter() - t0
    ts = {}
    for k, v in h.items():
        a, b = v["data_offsets"]
        ts[k] = buf[a:b].view(DT[v["dtype"]]).view(v["shape"])
    s["views"] = time.perf_counter() - t0
    assert r["bytes"] == n, r
    return ts, buf, {"steps_s": {k: round(x, 5) for k, x in s.items()}, "helper": r}


def load_own():
    t0 = time.perf_counter()
    ts = weightlift.load_file(f, device="cuda:0")
    torch.cuda.synchronize()
    return ts, None, {"steps_s": {"load": round(time.perf_counter() - t0, 5)}, "report_s": weightlift.last_report()["seconds"]}


def verify(ts):
    # every byte against the file, read independently (numpy), compared on the GPU
    import numpy as np
    start, h = header(f)
    raw = torch.from_numpy(np.fromfile(f, dtype=np.uint8, offset=start)).to("cuda:0")
    ok = True
    for k, v in h.items():
        a, b = v["data_offsets"]
        ok &= bool(torch.equal(ts[k].contiguous().view(-1).view(torch.uint8), raw[a:b]))
    return ok


fn = load_helper if arm == "helper" else load_own
for i, name in enumerate(("first", "second")):
    t = time.perf_counter()
    ts, buf, r = fn()
    r["total_s"] = round(time.perf_counter() - t, 5)
    if i == 1:
        r["verified"] = verify(ts)
    rec[name] = r
    del ts, buf
    gc.collect(); torch.cuda.synchronize(); torch.cuda.empty_cache()
rec["ratio"] = rec["first"]["total_s"] / rec["second"]["total_s"]
rec["process_s"] = time.perf_counter() - T0
with open(out, "a") as o:
    o.write(json.dumps(rec) + "\n")
print(arm, "first", rec["first"]["total_s"], "second", rec["second"]["total_s"], "ratio", round(rec["ratio"], 3),
      "verified", rec["second"].get("verified"), rec["first"].get("steps_s"), rec["first"].get("helper"), flush=True)
