"""The bar (docs/performance.md), judged by one run's own figures: each goal with its figure, its basis and whether
it holds; and, for each of weightlift's results, the best peer of its case."""

from __future__ import annotations

from typing import Callable, Optional

from wlbench import log
from wlbench.families import FIRST_LOAD, HOST


def result_of(results: list, case: str, method: str) -> Optional[dict]:
    return next((r for r in results if r["case"] == case and r["method"] == method), None)


def best_peers(results: list) -> None:
    """Adds to each weightlift result the best peer of the same case (by its best run) and the ratios: best over
    that peer's best, median over the highest median of the case's peers (``median_method``)."""
    for r in results:
        if r["peer"]:
            continue
        peers = [p for p in results if p["peer"] and p["case"] == r["case"]]
        if not peers:
            continue
        top = max(peers, key=lambda p: p["best"])
        steady = max(peers, key=lambda p: p["median"])  # the peer of the best median may be another
        r["best_peer"] = {"method": top["method"], "best": top["best"], "median": top["median"],
                          "ratio_best": round(r["best"] / top["best"], 4),
                          "median_method": steady["method"],
                          "ratio_median": round(r["median"] / steady["median"], 4)}


def goals(results: list, ceilings: dict) -> list:
    """Each goal of the benchmark's bar (docs/performance.md) with this run's figure, its basis, and whether it
    holds; a goal this run did not measure says what it lacked."""
    wl = "weightlift.load_file"
    out = []

    def goal(name: str, bar: str, figure: Optional[float], basis: str, holds: Callable[[float], bool],
             lacking: str) -> None:
        g: dict = {"goal": name, "bar": bar, "basis": basis}
        if figure is None:
            g["not_measured"] = lacking
        else:
            g["figure"] = round(figure, 4)
            g["met"] = bool(holds(figure))
            if "ceiling" in name and figure > 1.0:
                g["above_ceiling"] = "the load beat its ceiling: the ceiling understates what the machine gives"
        out.append(g)

    def stat(case: str, method: str, key: str = "median") -> Optional[float]:
        r = result_of(results, case, method)
        return None if r is None else r[key]

    def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
        return None if a is None or b is None or not b else a / b

    pinned = ceilings.get("pinned_copy")
    pinned_best = pinned["best"] if isinstance(pinned, dict) else None
    for case, host_key in (("warm", "page_cache_read16"), ("tmpfs", "tmpfs_read16")):
        goal(f"{case}: load_file / pinned copy ceiling", ">= 0.92", ratio(stat(case, wl, "best"), pinned_best),
             "best over the ceiling's best", lambda x: x >= 0.92, f"a {case} load_file and a pinned copy ceiling")
        host = ceilings.get(host_key)
        of_host = ratio(stat(case, wl, "best"), host["best"] if isinstance(host, dict) else None)
        if of_host is not None:  # where the host's own copying is slower than the link, it sets the pace
            out[-1]["of_host_read_rate"] = {"ceiling": host_key, "host_best": host["best"], "ratio": round(of_host, 4)}
    disks = [c["best"] for c in (ceilings.get("disk_direct_dd16"), ceilings.get("disk_buffered_read16"))
             if isinstance(c, dict)]
    goal("cold: load_file / disk ceiling (the faster of 16 x dd iflag=direct and 16 buffered readers)", ">= 0.97",
         ratio(stat("cold", wl, "best"), max(disks) if disks else None),
         "best over the ceiling's best", lambda x: x >= 0.97, "a cold load_file and the disk ceiling")
    for case in ("warm", "cold"):
        for order, bar in (("file", 0.9), ("random", 0.8)):
            goal(f"{case}: safe_open get_tensor per key, {order} order / load_file", f">= {bar}",
                 ratio(stat(case, f"weightlift.safe_open get_tensor {order}-order"), stat(case, wl)),
                 "median over median", lambda x, b=bar: x >= b, f"{case} safe_open and load_file")
    goal("restart after a cold load / warm load_file", ">= 0.9", ratio(stat("restart", wl), stat("warm", wl)),
         "median over median", lambda x: x >= 0.9, "a restart and a warm load_file")
    r = result_of(results, FIRST_LOAD, wl)
    goal("first load of a fresh process / its second load", "<= 1.2",
         None if r is None else r["median_first_to_second_time_ratio"], "median of the processes' time ratios",
         lambda x: x <= 1.2, "a first-load case")
    r = result_of(results, HOST, wl)
    goal("host: load_file into fresh memory / np.fromfile", ">= 1.0",
         None if r is None else r.get("median_ratio_to_np_fromfile"), "median of interleaved pairs' rate ratios",
         lambda x: x >= 1.0, "the host case")
    return out


def log_goals(gs: list) -> None:
    for g in gs:
        if "figure" in g:
            verdict = "met    " if g["met"] else "NOT met"
            suspect = " (above its ceiling: the ceiling understates)" if "above_ceiling" in g else ""
            host = g.get("of_host_read_rate")
            if host:
                suspect += f" ({host['ratio']:.3f} of the host's own read rate, {host['host_best']:.2f} GB/s)"
            log(f"goal {verdict} {g['figure']:8.3f} (bar {g['bar']}, {g['basis']}): {g['goal']}{suspect}")
        else:
            log(f"goal not measured (needs {g['not_measured']}): {g['goal']}")
