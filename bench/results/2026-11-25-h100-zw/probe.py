"""Probe: where a fresh process's load through the load server spends its time, against the same process's own
loads (server off), from the engine's DEBUG records (dated when they happened) and the reports."""
import json, os, subprocess, sys, time

def child(path, out):
    t0 = time.perf_counter()
    import torch
    torch.zeros(1, device="cuda:0"); torch.cuda.synchronize()
    ctx = time.perf_counter() - t0
    import logging
    recs = []
    class H(logging.Handler):
        def emit(self, r):
            recs.append((r.created, r.getMessage()[:160]))
    lg = logging.getLogger("weightlift"); lg.setLevel(logging.DEBUG); lg.addHandler(H())
    import weightlift
    from safetensors.torch import load_file as st_load
    res = []
    for i in range(3):
        recs.clear()
        torch.cuda.synchronize()
        ta = time.time(); t = time.perf_counter()
        d = weightlift.load_file(path, device="cuda:0")
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        rep = weightlift.last_report()
        srv = rep.get("server") or {}
        sr = srv.get("report") or {}
        res.append({"load": i, "wall_s": dt, "seconds": rep["seconds"], "io": rep["times"]["io"], "alloc": rep["times"]["alloc"],
                    "backend": rep["backend"], "server_used": srv.get("used"), "server_secs": srv.get("secs"),
                    "served_secs": sr.get("served_secs"), "server_read_s": sr.get("seconds"),
                    "records_ms": [(round((c - ta) * 1000, 3), m) for c, m in recs]})
        if i == 2:
            ref = st_load(path, device="cuda:0")
            bad = [k for k in ref if not torch.equal(ref[k], d[k])]
            res[-1]["mismatched_tensors"] = bad
            del ref
        del d
        torch.cuda.empty_cache()
    json.dump({"cuda_context_s": ctx, "loads": res}, open(out, "w"))

if __name__ == "__main__":
    if sys.argv[1] == "child":
        child(sys.argv[2], sys.argv[3]); sys.exit(0)
    path, outdir = sys.argv[1], sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    sock = os.path.join(outdir, "probe.sock")
    srv = subprocess.Popen([sys.executable, "-m", "weightlift", "serve", "--socket", sock, "--prepare", "cuda:0"], stderr=subprocess.PIPE, text=True)
    for line in srv.stderr:
        if "listening" in line: break
    try:
        for i in range(5):
            for mode in ("server", "off"):
                env = dict(os.environ, WEIGHTLIFT_SERVER=sock if mode == "server" else "off")
                out = os.path.join(outdir, f"probe-{mode}-{i}.json")
                subprocess.run([sys.executable, __file__, "child", path, out], env=env, check=True, timeout=120)
                d = json.load(open(out))
                print(mode, i, "ctx %.3f" % d["cuda_context_s"], " | ".join(
                    "wall %.4f sec %.4f io %.4f alloc %.4f srv %s served %s read %s" % (l["wall_s"], l["seconds"], l["io"], l["alloc"],
                    l["server_secs"] and round(l["server_secs"], 4), l["served_secs"] and round(l["served_secs"], 4),
                    l["server_read_s"] and round(l["server_read_s"], 4)) for l in d["loads"]), "bad", d["loads"][2].get("mismatched_tensors"), flush=True)
    finally:
        srv.terminate(); srv.wait(timeout=30)
