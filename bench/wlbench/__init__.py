"""The parts of bench/shapes.py, the benchmark of the shapes in which users load a checkpoint (its docstring says
what it measures). From the bottom up: ``checkpoint`` (headers read with the standard library, the checks of every
load), ``pagecache`` (dropping, warming, residency), ``methods`` (weightlift and the peers' loaders), ``timing``
(timed loads and where results go), ``children`` (the fresh processes), ``families`` (the case
families), ``files`` (the checkpoints a run writes), ``ceilings`` (the machine's own rates), ``goals`` (the bar,
judged by a run's figures) and ``run`` (a whole run). torch and numpy are imported where they are used, so that
the script can say it lacks them instead of failing at import."""

import sys
import time


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
