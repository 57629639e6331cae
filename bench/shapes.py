#!/usr/bin/env python3
"""Times the shapes in which users load a checkpoint, weightlift and the loaders people use today in one run, and
prints one JSON object on stdout (`--out FILE` writes it there too; progress goes to stderr).

Case families (`--cases`, comma-separated; default: all):

- ``cold``, ``warm``, ``tmpfs``: the checkpoint from disk right after the page cache was dropped (``--cold
  drop_caches``: ``sync; echo 3 > /proc/sys/vm/drop_caches``, needs root; ``--cold fadvise``: only the files under
  test are evicted with ``posix_fadvise(DONTNEED)``), from disk with the file read once just before, and from a
  copy on tmpfs (``--shm-file``, or a copy this script makes under ``--shm-dir`` and removes at exit). Methods:
  weightlift ``load_file``; weightlift ``safe_open`` + ``get_tensor`` per key in file order and in a random order
  (fixed ``--seed``); weightlift's offer of safetensors 0.9's ``prefetch`` (iterated; shard by shard); and the peers
  where they apply: safetensors ``load_file``, ``safe_open`` per key (a handle per shard when sharded) and 0.9's own
  ``prefetch`` (its defaults, and 16 threads with ``backend="pread"``),
  ``torch.load(mmap=True)`` then ``.to(device)`` (on a ``.pt`` copy made here), KvikIO ``pread`` of the data
  region into one buffer, fastsafetensors (no GDS), Run:ai model streamer, InstantTensor, and ``np.fromfile``
  then ``.to(device)`` (raw bytes).
- ``restart``: a new process loads the file after the page cache was dropped; then another new process loads it
  again, and only that second load is the figure (how the first load left the page cache decides it; the share of
  the file left resident is reported). Methods: weightlift and safetensors ``load_file``, ``torch.load``.
- ``first-load``: a fresh process times CUDA context creation (``torch.zeros(1, device=...)``), then weightlift's
  first load and a second load of the warm file; both and their ratio.
- ``cli``: ``weightlift load --json --no-ceiling --device D FILE`` as a subprocess (``--weightlift-bin``), warm:
  wall time and the fixed costs its report gives; one more untimed run with ``--verify`` checks its bytes.
- ``sharded``: the same tensors written by transformers' ``save_pretrained`` (shards + index): weightlift
  ``load_file`` of the index against safetensors ``load_file`` shard by shard, cold and warm.
- ``host``: weightlift ``load_file(device="cpu")`` against ``np.fromfile`` of the warm file into fresh host memory,
  interleaved pairs (one warm-up pair, then ``max(5, --runs)`` pairs, the order alternating).

Every result (``results``: method, case, peer, runs_gbps, best, median, runs_s, bytes, verified, and per family
more) gives GB/s (tensor bytes / seconds) of each of ``--runs`` runs, best and median; weightlift's results carry
key figures of ``weightlift.last_report()`` after the last run (for ``safe_open``: of its last ``get_tensor``), and
weightlift's ``safe_open`` results the stream statistics of each run (``stream_stats``: bytes read in file order and
on demand, reads on demand, bytes read ahead and never taken, the read-ahead window ``prefetch_bytes``).
Every load of every method is checked after its clock stopped: each tensor's dtype, shape and a checksum of its bytes
(positional sums on a GPU, CRC-32 on the host) are compared with those computed from a plain read of the upstream
file; every copy (tmpfs, ``.pt``, shards) must hold the same tensors. A method that is absent, does not apply, or
fails is listed under ``skipped`` with the reason. ``--methods`` keeps only methods whose name holds one of the
given substrings. Each weightlift result names the best peer of its case (``best_peer``: best over best, median
over median). A SIGTERM (from ``timeout``, say) or ``--time-limit SECONDS`` ends the measurements where they are:
the run still writes its JSON, with what it measured, the goals judged on that, ``stopped`` saying in which family
and why, and the families not finished under ``skipped``.

Before the loads, the run measures its ceilings (``ceilings``): on a GPU the pinned copy (one host→device copy of
the checkpoint's size from pinned memory, best and median of ``max(5, --runs)``); with a cold case the disk (16
parallel ``dd bs=16M iflag=direct`` over stripes of the file, and 16 threads reading it through the page cache
after the caches are dropped: the cold goal takes the faster); with a warm, restart or host case the page cache
(one ``dd bs=16M`` of the warm file; 16 threads reading stripes of it in 16 MiB ``preadv`` calls into buffers of
their own; with a tmpfs case, the same 16 threads on the tmpfs copy). ``goals`` then judges each goal of the bar
(docs/performance.md) by this run's figures alone: warm and tmpfs ``load_file`` ≥ 0.92 of the pinned copy (each
also given as a share of the host's own read rate of the page cache or of tmpfs), cold ≥ 0.97 of the disk (best
over best); ``safe_open`` per key ≥ 0.9 of ``load_file`` in file order and ≥ 0.8 in random order, warm
and cold; a restart ≥ 0.9 of the warm rate (median over median); a fresh process's first load ≤ 1.2× its second
(median of the processes' ratios); host loads ≥ 1.0×
``np.fromfile`` (median of the pairs). A goal whose cases were not run says what it lacked.

``--make-upstream PATH --size 4GiB`` writes (or reuses, when its tensors already match) a llama-shaped checkpoint
of random bf16 tensors with ``safetensors.torch.save_file``: upstream layout, tensor offsets not 4 KiB aligned.
Without ``--file`` that file is the one measured.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from wlbench.checkpoint import positional  # noqa: E402
from wlbench.children import child_main  # noqa: E402
from wlbench.run import FAMILIES, bench  # noqa: E402

__all__ = ["main", "parse_args", "positional"]  # positional: for scripts beside this one


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", help="safetensors checkpoint on disk (default: the --make-upstream file)")
    ap.add_argument("--shm-file", help="the same checkpoint on tmpfs (default: a copy under --shm-dir)")
    ap.add_argument("--shm-dir", default="/dev/shm/weightlift-shapes", help="where tmpfs copies are made and removed")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cases", default=",".join(FAMILIES), help=f"comma-separated, of: {', '.join(FAMILIES)}")
    ap.add_argument("--methods", help="comma-separated substrings: only methods whose name holds one")
    ap.add_argument("--cold", choices=("drop_caches", "fadvise"), default="drop_caches",
                    help="how cold runs empty the page cache")
    ap.add_argument("--make-upstream", metavar="PATH", help="write (or reuse) a llama-shaped bf16 checkpoint here")
    ap.add_argument("--size", default="4GiB", help="with --make-upstream: at least this many tensor bytes")
    ap.add_argument("--make-only", action="store_true",
                    help="with --make-upstream or --make-sharded: write the checkpoint and stop")
    ap.add_argument("--make-sharded", metavar="DIR",
                    help="write (or reuse) in DIR a Llama of random bf16 weights of at least --size tensor bytes, in "
                         "shards of --shard-size, by transformers' save_pretrained (a multi-file checkpoint; on "
                         "--device where it is a GPU, else the CPU), and measure its index")
    ap.add_argument("--weightlift-bin", help="the weightlift binary for the cli case (default: found nearby/PATH)")
    ap.add_argument("--shard-size", default="1GB", help="save_pretrained max_shard_size for the sharded case")
    ap.add_argument("--seed", type=int, default=0, help="random data and random key order")
    ap.add_argument("--kvikio-threads", type=int, default=32)
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--time-limit", type=float, metavar="SECONDS",
                    help="stop measuring this long after the start (as on SIGTERM) and report what was measured")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.device == "cuda":
        args.device = "cuda:0"
    return args


def main(argv: Optional[list] = None) -> int:
    # Loaders print to stdout (C++ logs too): keep fd 1 for the JSON alone and send everything else to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    args = parse_args(argv)
    try:
        for module in ("numpy", "torch"):  # every part imports them where it needs them: say it early
            importlib.import_module(module)
    except ImportError as e:
        out.write(json.dumps({"skipped": f"needs torch and numpy: {e}"}) + "\n")
        return 0
    if args.child:
        return child_main(args.child, out)
    families = [c for c in args.cases.split(",") if c]
    unknown = [c for c in families if c not in FAMILIES]
    if unknown:
        raise SystemExit(f"unknown case families {unknown}; known: {', '.join(FAMILIES)}")
    result = bench(args, families)
    text = json.dumps(result)
    out.write(text + "\n")
    out.flush()
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
