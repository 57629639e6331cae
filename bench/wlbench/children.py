"""The fresh processes of the restart and first-load families: ``shapes.py --child SPEC`` makes its CUDA context,
loads (and for a first load loads again), checks what it loaded against the reference, and answers one JSON line on
stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from typing import Any, Optional

from wlbench.checkpoint import Reference, open_checkpoint, verify
from wlbench.methods import Method, Options, Target, method_named
from wlbench.timing import Run, release, report_figures, timed_load

SHAPES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shapes.py")


def child(spec: dict) -> dict:
    """Runs this script in a new Python process for one `spec` (see child_main) and returns its JSON answer."""
    p = subprocess.run([sys.executable, SHAPES, "--child", json.dumps(spec)],
                       capture_output=True, text=True, timeout=600)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"child process exited {p.returncode}: {p.stderr.strip()[-600:]}")
    answer = json.loads(lines[-1])
    if "error" in answer:
        raise RuntimeError(f"child process: {answer['error']}")
    return answer


def child_spec(run: Run, op: str, m: Method, t: Target, ref_file: str) -> dict:
    return {"op": op, "method": m.name, "path": t.ckpt.path, "pt": t.pt, "device": run.dev,
            "check_device": run.check_dev, "reference": ref_file, "seed": run.opts.seed,
            "kvikio_threads": run.opts.kvikio_threads}


def cuda_context(dev: str) -> Optional[float]:
    if not dev.startswith("cuda"):
        return None
    import torch

    t0 = time.perf_counter()
    torch.zeros(1, device=dev)
    torch.cuda.synchronize(dev)
    return time.perf_counter() - t0


def child_op(spec: dict) -> dict:
    dev, check_dev = spec["device"], spec["check_device"]
    ctx_s = cuda_context(dev)
    ckpt = open_checkpoint(spec["path"])
    t = Target("child", ckpt, spec.get("pt"))
    with open(spec["reference"]) as f:
        ref = Reference.from_json(json.load(f))
    m = method_named(spec["method"])
    opts = Options(seed=spec["seed"], kvikio_threads=spec["kvikio_threads"])
    t0 = time.perf_counter()
    why = m.needs(t, dev)  # imports the loader's module, outside the clock
    import_s = time.perf_counter() - t0
    if why:
        raise RuntimeError(why)
    m.setup(opts)
    is_wl = m.name.startswith("weightlift")
    dt, loaded = timed_load(m, t, dev, opts)
    first_report = report_figures() if is_wl else None
    verify(loaded, ref, ckpt, check_dev)
    del loaded
    if spec["op"] == "load":
        return {"seconds": dt, "cuda_context_s": ctx_s, "import_s": import_s, "report": first_report}
    release(dev)
    dt2, loaded = timed_load(m, t, dev, opts)
    second_report = report_figures() if is_wl else None
    verify(loaded, ref, ckpt, check_dev)
    return {"first_s": dt, "second_s": dt2, "cuda_context_s": ctx_s, "import_weightlift_s": import_s,
            "report_first": first_report, "report_second": second_report}


def child_main(spec_json: str, out: Any) -> int:
    try:
        answer = child_op(json.loads(spec_json))
    except Exception as e:
        answer = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=6)}
    out.write(json.dumps(answer) + "\n")
    out.flush()
    return 0

