"""The case families of a run (``--cases``): a storage case (cold, warm, tmpfs) for every method, the sharded
checkpoint, a restart after a cold load, a fresh process's first load, the one-shot CLI, and host loads against
``np.fromfile`` in interleaved pairs. Each adds its results to the run, or says why a method was skipped."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import time
from typing import Optional

from wlbench.children import child, child_spec
from wlbench.methods import NP_FROMFILE, Method, Target, wl_load_file, method_named, methods
from wlbench.pagecache import drop_caches, resident_fraction, warm
from wlbench.timing import REPORT_KEYS, REPORT_WORDS, Run, measure, release, report_figures, summarize, timed_load

FIRST_LOAD = "first-load (fresh process, warm file)"
HOST = "host, fresh memory, warm file (interleaved pairs)"


def family_storage(run: Run, case: str, target: Optional[Target], why_not: Optional[str]) -> None:
    prepare = {"cold": lambda files: drop_caches(files, run.cold), "warm": warm, "tmpfs": lambda files: None}[case]
    for m in methods():
        if not run.wanted(m):
            continue
        if target is None:
            run.skip(m.name, case, why_not or "no file for this case")
            continue
        measure(run, m, target, prepare, case)


def family_sharded(run: Run, target: Optional[Target], why_not: Optional[str], cold_ok: Optional[str]) -> None:
    chosen = [m for m in methods() if m.name in ("weightlift.load_file", "safetensors.load_file") and run.wanted(m)]
    for case in ("cold", "warm"):
        for m in chosen:
            if target is None:
                run.skip(m.name, f"sharded {case}", why_not or "no sharded checkpoint")
            elif case == "cold" and cold_ok:
                run.skip(m.name, f"sharded {case}", cold_ok)
            else:
                prepare = (lambda files: drop_caches(files, run.cold)) if case == "cold" else warm
                measure(run, m, target, prepare, f"sharded {case}")



def family_restart(run: Run, t: Target, ref_file: str, cold_ok: Optional[str]) -> None:
    names = ("weightlift.load_file", "safetensors.load_file", "torch.load(mmap=True) .to(device)")
    for m in [m for m in methods() if m.name in names]:
        if not run.wanted(m):
            continue
        why = cold_ok or m.needs(t, run.dev)
        if why:
            run.skip(m.name, "restart", why)
            continue
        rates, secs, first, resident = [], [], [], []
        answer: dict = {}
        try:
            for _ in range(run.runs):
                drop_caches(m.files(t), run.cold)
                spec = child_spec(run, "load", m, t, ref_file)
                a = child(spec)
                resident.append(resident_fraction(m.files(t)))
                answer = child(spec)
                first.append(round(t.ckpt.tensor_bytes / a["seconds"] / 1e9, 4))
                rates.append(t.ckpt.tensor_bytes / answer["seconds"] / 1e9)
                secs.append(answer["seconds"])
        except Exception as e:
            run.skip(m.name, "restart", f"failed: {type(e).__name__}: {e}")
            continue
        extra = {"first_process_cold_gbps": first, "resident_after_first_process": resident,
                 "cuda_context_s": answer.get("cuda_context_s")}
        if answer.get("report") is not None:
            extra["report"] = answer["report"]
        run.add(m, "restart", rates, secs, t.ckpt.tensor_bytes, **extra)


def family_first_load(run: Run, t: Target, ref_file: str) -> None:
    m = method_named("weightlift.load_file")
    if run.wanted(m):
        first_load_of(run, t, ref_file, m)


def first_load_of(run: Run, t: Target, ref_file: str, m: Method) -> None:
    why = m.needs(t, run.dev)
    if why:
        run.skip(m.name, "first-load", why)
        return
    firsts, seconds, ctx, imports = [], [], [], []
    answer: dict = {}
    try:
        for _ in range(run.runs):
            warm(t.ckpt.files)
            answer = child(child_spec(run, "first-load", m, t, ref_file))
            firsts.append(answer["first_s"])
            seconds.append(answer["second_s"])
            ctx.append(answer["cuda_context_s"])
            imports.append(answer["import_weightlift_s"])
    except Exception as e:
        run.skip(m.name, "first-load", f"failed: {type(e).__name__}: {e}")
        return
    n = t.ckpt.tensor_bytes
    ratios = [a / b for a, b in zip(firsts, seconds)]
    run.add(m, FIRST_LOAD, [n / s / 1e9 for s in firsts], firsts, n,
            second_load=summarize([n / s / 1e9 for s in seconds]), second_load_s=seconds,
            first_to_second_time_ratio=[round(r, 4) for r in ratios],
            median_first_to_second_time_ratio=round(statistics.median(ratios), 4),
            cuda_context_s=ctx, import_weightlift_s=imports,
            report_first=answer.get("report_first"), report=answer.get("report_second"))


def find_cli(given: Optional[str]) -> Optional[str]:
    if given:
        return given
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # bench/
    for p in (os.path.join(here, "..", "bin", "weightlift"),
              os.path.join(here, "..", "target", "release", "weightlift")):
        if os.access(p, os.X_OK):
            return os.path.normpath(p)
    return shutil.which("weightlift")


def family_cli(run: Run, t: Target, binary: Optional[str]) -> None:
    name = "weightlift CLI load (one-shot process)"
    m = Method(name, False, wl_load_file)
    if not run.wanted(m):
        return
    if not binary:
        run.skip(name, "cli warm", "no weightlift binary (give --weightlift-bin)")
        return
    argv = [binary, "load", "--json", "--no-ceiling", "--device", run.dev, t.ckpt.path]
    walls, reports = [], []
    try:
        for _ in range(run.runs):
            warm(t.ckpt.files)
            t0 = time.perf_counter()
            p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
            walls.append(time.perf_counter() - t0)
            if p.returncode != 0:
                raise RuntimeError(f"exit {p.returncode}: {p.stderr.strip()[-600:]}")
            reports.append(json.loads(p.stdout.strip().splitlines()[-1]))
        p = subprocess.run(argv + ["--verify"], capture_output=True, text=True, timeout=600)
        checked = json.loads(p.stdout.strip().splitlines()[-1]).get("verified") if p.returncode == 0 else None
    except Exception as e:
        run.skip(name, "cli warm", f"failed: {type(e).__name__}: {e}")
        return
    n = t.ckpt.tensor_bytes
    last = reports[-1]
    run.add(m, "cli warm", [n / w / 1e9 for w in walls], walls, n, argv=argv, verified=checked is True,
            verified_how="one more run with --verify (the CLI compares every loaded byte with a second read)",
            report_seconds=[r.get("seconds") for r in reports],
            outside_load_s=[round(w - (r.get("seconds") or 0), 4) for w, r in zip(walls, reports)],
            report={k: v for k, v in last.items() if k in REPORT_KEYS or any(w in k for w in REPORT_WORDS)})


def family_host(run: Run, t: Target) -> None:
    """weightlift into fresh host memory against np.fromfile, interleaved: fresh-page cost swings from run to run
    on VMs, so only pairs taken side by side compare."""
    wl, ref_m = method_named("weightlift.load_file"), NP_FROMFILE
    for m in (wl, ref_m):
        why = m.needs(t, "cpu")
        if why:
            run.skip(m.name, "host", why)
            return
    pairs = max(5, run.runs)
    rates: dict = {wl.name: [], ref_m.name: []}
    secs: dict = {wl.name: [], ref_m.name: []}
    report = None
    try:
        for i in range(pairs + 1):
            for m in (wl, ref_m) if i % 2 == 0 else (ref_m, wl):
                release(run.dev)
                warm(t.ckpt.files)
                dt, loaded = timed_load(m, t, "cpu", run.opts)
                if m is wl:
                    report = report_figures()
                run.check(loaded, t)
                del loaded
                if i > 0:  # the first pair warms up
                    rates[m.name].append(t.ckpt.tensor_bytes / dt / 1e9)
                    secs[m.name].append(dt)
    except Exception as e:
        run.skip(wl.name, "host", f"failed: {type(e).__name__}: {e}")
        return
    ratios = [a / b for a, b in zip(rates[wl.name], rates[ref_m.name])]
    run.add(ref_m, HOST, rates[ref_m.name], secs[ref_m.name], t.ckpt.tensor_bytes)
    run.add(wl, HOST, rates[wl.name], secs[wl.name], t.ckpt.tensor_bytes, report=report,
            ratio_to_np_fromfile_per_pair=[round(r, 4) for r in ratios],
            median_ratio_to_np_fromfile=round(statistics.median(ratios), 4))


# ---------------------------------------------------------------------------------------------------------------
# Child processes (restart, first-load): `shapes.py --child SPEC`, one JSON line on stdout
