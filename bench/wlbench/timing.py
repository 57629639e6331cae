"""Timed loads and where a run's results go: the clock of one load, a method's runs of a case (each checked after
its clock stopped), and the key figures of weightlift's report kept beside them."""

from __future__ import annotations

import gc
import statistics
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from wlbench import log
from wlbench.checkpoint import verify
from wlbench.methods import Method, Options, Target, last_choice, last_stream
from wlbench.pagecache import resident_fraction


REPORT_KEYS = ("backend", "backend_reason", "direct_bytes", "buffered_bytes", "resident_bytes", "seconds", "gbps",
               "direct_policy", "lanes", "queue_depth", "peak_staging_bytes", "times",
               "device_memory")
REPORT_WORDS = ("cache", "prefetch", "read_ahead", "wasted", "fixed", "cufile", "startup", "setup", "decision",
                "populate")


def report_figures() -> Optional[dict]:
    """Key figures of weightlift's last report: named ones, and any whose name speaks of the cache, read-ahead,
    fixed costs or the backend decision (the report grows as the engine does)."""
    try:
        import weightlift

        rep = weightlift.last_report()
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}
    if not isinstance(rep, dict):
        return None
    return {k: v for k, v in rep.items() if k in REPORT_KEYS or any(w in k for w in REPORT_WORDS)}


def sync(dev: str) -> None:
    if dev.startswith("cuda"):
        import torch

        torch.cuda.synchronize(dev)


def release(dev: str) -> None:
    gc.collect()
    if dev.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def timed_load(m: Method, t: Target, dev: str, o: Options) -> tuple:
    """(seconds, loaded): the clock runs from the call until the device has finished."""
    t0 = time.perf_counter()
    loaded = m.load(t, dev, o)
    sync(dev)
    return time.perf_counter() - t0, loaded


def summarize(rates: list) -> dict:
    return {"runs_gbps": [round(r, 4) for r in rates], "best": round(max(rates), 4),
            "median": round(statistics.median(rates), 4)}


@dataclass
class Run:
    """What the families share: device, options, the reference checksums and where results go."""

    dev: str
    check_dev: str
    runs: int
    opts: Options
    cold: str
    refs: dict = field(default_factory=dict)  # checkpoint path -> Reference
    results: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    method_filter: Optional[list] = None
    ceilings: dict = field(default_factory=dict)
    stopped: Optional[dict] = None  # where a SIGTERM or --time-limit ended the run (run_families)

    def wanted(self, m: Method) -> bool:
        return not self.method_filter or any(w in m.name for w in self.method_filter)

    def skip(self, method: str, case: str, reason: str) -> None:
        self.skipped.append({"method": method, "case": case, "reason": reason})
        log(f"  skipped {method} / {case}: {reason}")

    def add(self, m: Method, case: str, rates: list, seconds: list, nbytes: int, **extra: Any) -> dict:
        r = {"method": m.name, "case": case, "peer": m.peer, **summarize(rates),
             "runs_s": [round(s, 4) for s in seconds], "bytes": nbytes, "verified": True}
        if m.note:
            r["note"] = m.note
        if self.dev == "cpu" and m.name.startswith("safetensors"):
            r["note_cpu"] = "on cpu, safetensors hands out tensors over a mapping of the file: its bytes are read " \
                            "on first touch (here: in the check, after the clock)"
        r.update(extra)
        self.results.append(r)
        log(f"  {m.name} / {case}: best {r['best']:.2f} GB/s, median {r['median']:.2f}")
        return r

    def check(self, loaded: Any, t: Target) -> None:
        verify(loaded, self.refs[t.ckpt.path], t.ckpt, self.check_dev)


def measure(run: Run, m: Method, t: Target, prepare: Callable[[list], None], case: str) -> None:
    """`run.runs` timed loads of `t` by `m`, each after `prepare(files)`, each checked after its clock stopped."""
    why = m.needs(t, run.dev)
    if not why and m.cases is not None and case not in m.cases:
        why = m.cases_why
    if why:
        run.skip(m.name, case, why)
        return
    rates, secs, resident, streams, chose = [], [], [], [], []
    report = None
    try:
        m.setup(run.opts)
        for _ in range(run.runs):
            release(run.dev)
            prepare(m.files(t))
            if case.startswith("cold"):
                resident.append(resident_fraction(m.files(t)))
            last_stream.clear()
            last_choice.clear()
            dt, loaded = timed_load(m, t, run.dev, run.opts)
            if last_choice:
                chose.append(dict(last_choice))
            if m.name.startswith("weightlift"):
                report = report_figures()
            if "stats" in last_stream:
                streams.append(last_stream["stats"])
            run.check(loaded, t)
            del loaded
            rates.append(t.ckpt.tensor_bytes / dt / 1e9)
            secs.append(dt)
    except Exception as e:
        run.skip(m.name, case, f"failed: {type(e).__name__}: {e}")
        log(traceback.format_exc(limit=4))
        release(run.dev)
        return
    release(run.dev)
    extra: dict = {}
    if resident:
        extra["resident_before"] = resident
    if report is not None:
        extra["report"] = report
    if streams:
        extra["stream_stats"] = streams
    if chose:
        extra["chose"] = chose[-1] if all(c == chose[0] for c in chose) else chose
    run.add(m, case, rates, secs, t.ckpt.tensor_bytes, **extra)
