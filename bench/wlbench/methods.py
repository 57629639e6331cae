"""The methods a run times: each loads every tensor of a target onto a device and returns {name: tensor}, or
RawBytes where it reads the file's bytes only (KvikIO, np.fromfile). weightlift's own (``load_file``, ``safe_open``
per key in file and in random order, safetensors 0.9's ``prefetch`` as weightlift offers it) and the peers'
(safetensors, its 0.9 ``prefetch`` at its defaults and at its best setting, ``torch.load``, KvikIO,
fastsafetensors, the Run:ai model streamer, InstantTensor, ``np.fromfile``); each says why it does not apply where
it does not (``needs``).

The peers that bypass the page cache by default (fastsafetensors, the Run:ai streamer, InstantTensor) have a second,
"tuned" row that runs them as their authors advise for reads the page cache serves (warm and tmpfs): each switch and
where each library reads it was found in its 0.5.0 / 0.17.0 / 0.2.2 sources. For cold reads their default is their
advice, so the tuned rows skip the cold case. Every peer row records what the peer chose at run time (``chose``)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from wlbench.checkpoint import Checkpoint, RawBytes


@dataclass
class Target:
    case: str
    ckpt: Checkpoint
    pt: Optional[str] = None  # torch.save copy, for torch.load


@dataclass
class Method:
    name: str
    peer: bool
    load: Callable[[Target, str, "Options"], Any]
    needs: Callable[[Target, str], Optional[str]] = lambda t, d: None  # reason it does not apply, or None
    files: Callable[[Target], list] = lambda t: t.ckpt.files  # what it reads (for warming and dropping)
    note: str = ""
    setup: Callable[["Options"], None] = lambda o: None  # once, before its first timed load
    cases: Optional[tuple] = None  # the storage cases it runs in (None: all), with the reason for the others
    cases_why: str = ""


@dataclass
class Options:
    seed: int = 0
    kvikio_threads: int = 32


def wl_load_file(t: Target, dev: str, o: Options) -> dict:
    import weightlift

    return weightlift.load_file(t.ckpt.path, device=dev)


last_stream: dict = {}  # the stream statistics of the last weightlift safe_open load (known once it is closed)
last_choice: dict = {}  # what the last peer load chose at run time (strategy, backend, threads, buffers)


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    """The environment with `values` set for the duration, then as it was."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _wl_safe_open(order: str) -> Callable:
    def load(t: Target, dev: str, o: Options) -> dict:
        import weightlift

        names = key_order(t.ckpt, order, o.seed)
        with weightlift.safe_open(t.ckpt.path, framework="pt", device=dev) as f:
            out = {k: f.get_tensor(k) for k in names}
        last_stream["stats"] = f.stream_stats()
        return out

    return load


def key_order(ckpt: Checkpoint, order: str, seed: int) -> list:
    names = ckpt.names()
    if order == "random":
        random.Random(seed).shuffle(names)
    return names


def _st_load_file(t: Target, dev: str, o: Options) -> dict:
    from safetensors.torch import load_file

    out: dict = {}
    for f in t.ckpt.files:
        out.update(load_file(f, device=dev))
    return out


def _st_safe_open(order: str) -> Callable:
    """safetensors' safe_open, every key taken with get_tensor in the given order; a sharded checkpoint opens every
    shard first (as a loader that follows the index does) and takes each key from its own shard."""

    def load(t: Target, dev: str, o: Options) -> dict:
        from safetensors import safe_open

        names = key_order(t.ckpt, order, o.seed)
        shard_of = {e.name: e.file for e in t.ckpt.entries}
        with contextlib.ExitStack() as stack:
            handles = [stack.enter_context(safe_open(f, framework="pt", device=dev)) for f in t.ckpt.files]
            return {k: handles[shard_of[k]].get_tensor(k) for k in names}

    return load


def _prefetch(lib: str, threads: int = 8, backend: Optional[str] = None) -> Callable:
    """safetensors 0.9's prefetch style: a handle's ``prefetch(device=...)`` loader for every tensor, iterated in the
    order the bytes land; shard by shard for a sharded checkpoint. ``lib``: "weightlift" (its offer of the same API)
    or "safetensors" (upstream, with ``threads`` and ``backend``)."""

    def load(t: Target, dev: str, o: Options) -> dict:
        if lib == "weightlift":
            import weightlift

            def opener(f: str) -> Any:
                return weightlift.safe_open(f, framework="pt")
        else:
            from safetensors import safe_open

            def opener(f: str) -> Any:
                return safe_open(f, framework="pt", **({"backend": backend} if backend else {}))

        out: dict = {}
        for f in t.ckpt.files:
            with opener(f) as h, h.prefetch(device=dev, threads=threads) as loader:
                out.update(loader)
        return out

    return load


def _upstream_prefetch(t: Target, dev: str) -> Optional[str]:
    try:
        from safetensors import PrefetchLoader  # noqa: F401 - present from safetensors 0.9 on
    except ImportError as e:
        return f"this safetensors has no prefetch: {e}"
    return None


def _torch_load(t: Target, dev: str, o: Options) -> dict:
    import torch

    sd = torch.load(t.pt, mmap=True, weights_only=True)
    # copy=True: on "cpu" a plain .to() would hand back the lazily mapped file.
    return {k: v.to(dev, copy=True) for k, v in sd.items()}


def _kvikio_threads(o: Options) -> None:
    import kvikio.defaults  # a submodule: `import kvikio` alone does not bind it

    kvikio.defaults.set("num_threads", o.kvikio_threads)


def _kvikio(t: Target, dev: str, o: Options) -> RawBytes:
    import kvikio
    import torch

    start = t.ckpt.data_start[0]
    n = os.path.getsize(t.ckpt.files[0]) - start
    buf = torch.empty(n, dtype=torch.uint8, device=dev)
    with kvikio.CuFile(t.ckpt.files[0], "r") as f:
        got = f.pread(buf if dev != "cpu" else buf.numpy(), n, start).get()
    if got != n:
        raise ValueError(f"KvikIO read {got} of {n} bytes")
    return RawBytes(buf, start)


def _fastsafetensors(buffered: bool) -> Callable:
    """fastsafetensors without GDS. 0.5.0 reads with O_DIRECT on a local filesystem unless FASTSAFETENSORS_ODIRECT
    is "0" (`common.is_odirect_enabled`, asked per file as each copier is built: setting it after import works)."""

    def load(t: Target, dev: str, o: Options) -> dict:
        from fastsafetensors import fastsafe_open
        from fastsafetensors.common import is_odirect_enabled

        with _env(**({"FASTSAFETENSORS_ODIRECT": "0"} if buffered else {})):
            odirect = is_odirect_enabled(t.ckpt.files[0], buffered_ram_fs=True)
            with fastsafe_open(list(t.ckpt.files), framework="pt", device=dev, nogds=True) as f:
                out = {k: f.get_tensor(k) for k in f.keys()}
                copier = getattr(getattr(f, "loader", None), "copier_class", None)
        last_choice.update({"o_direct": odirect, "copier": getattr(copier, "__name__", None),
                            "FASTSAFETENSORS_ODIRECT": "0" if buffered else os.environ.get("FASTSAFETENSORS_ODIRECT"),
                            "threads": 16, "bounce_buffer_kib": 16 * 1024})
        return out

    return load


# The Run:ai streamer 0.17.0 reads its file strategy when a streamer is entered (`runai_file_streamer_start`) and its
# memory limit at each `stream_files`; its default strategy list is "io_uring_direct,libaio_direct,sync_buffered".
RUNAI_DEFAULT_FS_STRATEGY = "io_uring_direct,libaio_direct,sync_buffered"
RUNAI_BUFFERED = {"RUNAI_STREAMER_FS_STRATEGY": "io_uring_buffered,sync_buffered", "RUNAI_STREAMER_MEMORY_LIMIT": "-1"}


def _runai(buffered: bool) -> Callable:
    def load(t: Target, dev: str, o: Options) -> dict:
        from runai_model_streamer import SafetensorsStreamer

        with _env(**(RUNAI_BUFFERED if buffered else {})):
            chose = {k: os.environ.get(k) for k in ("RUNAI_STREAMER_FS_STRATEGY", "RUNAI_STREAMER_MEMORY_LIMIT",
                                                     "RUNAI_STREAMER_CONCURRENCY", "RUNAI_STREAMER_FS_QUEUE_DEPTH")}
            with SafetensorsStreamer() as s:
                s.stream_files(list(t.ckpt.files), device=dev)
                out = {name: tensor.to(dev) for name, tensor in s.get_tensors()}
                ring = getattr(getattr(s, "file_streamer", None), "ring_info", None)
                chose["ring"] = str(ring()) if callable(ring) else None
        chose["RUNAI_STREAMER_FS_STRATEGY"] = chose["RUNAI_STREAMER_FS_STRATEGY"] or f"{RUNAI_DEFAULT_FS_STRATEGY} (default)"
        last_choice.update(chose)
        return out

    return load


def _instanttensor(buffered: bool) -> Callable:
    """InstantTensor 0.2.2: `backend=BackendPolicy.BUFFERED` tries io_uring through the page cache, then mmap (it
    falls back silently: the backend it took is recorded). INSTANTTENSOR_CACHE_BUFFER=1, the pinned staging kept
    between loads that its authors advise for repeated loads, is read once per process at the first loader's close:
    `setup` sets it before the first InstantTensor load of the run, so it holds for both rows."""

    def load(t: Target, dev: str, o: Options) -> dict:
        from instanttensor import safe_open

        kwargs: dict = {}
        if buffered:
            from instanttensor import BackendPolicy

            kwargs["backend"] = BackendPolicy.BUFFERED
        # safe_open sorts a list it is given in place: it gets a copy.
        with safe_open(list(t.ckpt.files), framework="pt", device=dev, **kwargs) as f:
            out = dict(f.tensors())
            last_choice.update({k: str(getattr(f, k, None)) for k in
                                ("backend", "chunk_size", "io_depth", "concurrency", "buffer_size")})
        last_choice["INSTANTTENSOR_CACHE_BUFFER"] = os.environ.get("INSTANTTENSOR_CACHE_BUFFER")
        return out

    return load


def _instanttensor_cache(o: Options) -> None:
    os.environ.setdefault("INSTANTTENSOR_CACHE_BUFFER", "1")


def _np_fromfile(t: Target, dev: str, o: Options) -> RawBytes:
    import numpy as np
    import torch

    return RawBytes(torch.from_numpy(np.fromfile(t.ckpt.files[0], dtype=np.uint8)), 0)


def _np_fromfile_to(t: Target, dev: str, o: Options) -> RawBytes:
    return RawBytes(_np_fromfile(t, dev, o).data.to(dev), 0)


def _importable(module: str) -> Callable[[Target, str], Optional[str]]:
    def needs(t: Target, dev: str) -> Optional[str]:
        return import_error(module)

    return needs


_import_errors: dict = {}


def import_error(module: str) -> Optional[str]:
    if module not in _import_errors:
        try:
            __import__(module)
            _import_errors[module] = None
        except Exception as e:  # a peer's import can fail in many ways (missing CUDA libraries, ABI)
            _import_errors[module] = f"import {module} failed: {type(e).__name__}: {e}"
    return _import_errors[module]


def _all(*checks: Callable[[Target, str], Optional[str]]) -> Callable[[Target, str], Optional[str]]:
    def needs(t: Target, dev: str) -> Optional[str]:
        for c in checks:
            why = c(t, dev)
            if why:
                return why
        return None

    return needs


def _one_file(t: Target, dev: str) -> Optional[str]:
    return None if len(t.ckpt.files) == 1 else "reads one file"


def _cuda_only(t: Target, dev: str) -> Optional[str]:
    return None if dev.startswith("cuda") else "loads onto CUDA devices only"


def _cuda_driver(t: Target, dev: str) -> Optional[str]:
    """KvikIO opens the CUDA driver even for host buffers."""
    try:
        ctypes.CDLL("libcuda.so.1")
        return None
    except OSError as e:
        return f"needs the CUDA driver, even for host buffers ({e})"


def _has_pt(t: Target, dev: str) -> Optional[str]:
    return None if t.pt else "no .pt copy of this checkpoint"


BUFFERED_CASES = ("warm", "tmpfs")
BUFFERED_WHY = "a page-cache switch: its authors advise it where the page cache serves the reads (warm, tmpfs); " \
               "for cold reads its default row is its advice"


def methods() -> list:
    wl = _importable("weightlift")
    return [
        Method("weightlift.load_file", False, wl_load_file, wl),
        Method("weightlift.safe_open get_tensor file-order", False, _wl_safe_open("file"), wl),
        Method("weightlift.safe_open get_tensor random-order", False, _wl_safe_open("random"), wl),
        Method("safetensors.load_file", True, _st_load_file, _importable("safetensors"),
               note="one call per shard when sharded"),
        Method("safetensors.safe_open get_tensor file-order", True, _st_safe_open("file"),
               _importable("safetensors"), note="one handle per shard when sharded"),
        Method("safetensors.safe_open get_tensor random-order", True, _st_safe_open("random"),
               _importable("safetensors"), note="one handle per shard when sharded"),
        Method("weightlift.safe_open prefetch", False, _prefetch("weightlift"), _all(wl, _cuda_only),
               note="safetensors 0.9's prefetch API, offered by weightlift; shard by shard when sharded"),
        Method("safetensors.safe_open prefetch", True, _prefetch("safetensors"),
               _all(_cuda_only, _importable("safetensors"), _upstream_prefetch),
               note="safetensors 0.9's own prefetch at its defaults (8 threads); shard by shard when sharded"),
        Method("safetensors.safe_open prefetch (16 threads, pread)", True, _prefetch("safetensors", 16, "pread"),
               _all(_cuda_only, _importable("safetensors"), _upstream_prefetch),
               note="tuned: its best setting in 2026-12-07-h100-peers; shard by shard when sharded"),
        Method("torch.load(mmap=True) .to(device)", True, _torch_load, _has_pt, files=lambda t: [t.pt],
               note="reads a torch.save copy of the same tensors"),
        Method("kvikio pread", True, _kvikio, _all(_importable("kvikio"), _cuda_driver, _one_file),
               note="raw bytes of the data region into one buffer, no tensors", setup=_kvikio_threads),
        Method("fastsafetensors (nogds)", True, _fastsafetensors(False), _importable("fastsafetensors"),
               note="its default: O_DIRECT on a local filesystem"),
        Method("fastsafetensors (nogds, buffered)", True, _fastsafetensors(True), _importable("fastsafetensors"),
               note="tuned: FASTSAFETENSORS_ODIRECT=0", cases=BUFFERED_CASES, cases_why=BUFFERED_WHY),
        Method("runai-model-streamer", True, _runai(False), _importable("runai_model_streamer"),
               note="its default: O_DIRECT first"),
        Method("runai-model-streamer (buffered)", True, _runai(True), _importable("runai_model_streamer"),
               note="tuned: RUNAI_STREAMER_FS_STRATEGY=io_uring_buffered,sync_buffered, RUNAI_STREAMER_MEMORY_LIMIT=-1",
               cases=BUFFERED_CASES, cases_why=BUFFERED_WHY),
        Method("instanttensor", True, _instanttensor(False), _all(_cuda_only, _importable("instanttensor")),
               note="its default: O_DIRECT on disk, mmap on tmpfs", setup=_instanttensor_cache),
        Method("instanttensor (buffered)", True, _instanttensor(True), _all(_cuda_only, _importable("instanttensor")),
               note="tuned: backend=BackendPolicy.BUFFERED", setup=_instanttensor_cache, cases=BUFFERED_CASES,
               cases_why=BUFFERED_WHY),
        Method("np.fromfile .to(device)", True, _np_fromfile_to, _all(_cuda_only, _one_file),
               note="the whole file as raw bytes, then one pageable copy"),
    ]


NP_FROMFILE = Method("np.fromfile", True, _np_fromfile, _one_file, note="the whole file into fresh host memory")


def method_named(name: str) -> Method:
    for m in methods() + [NP_FROMFILE]:
        if m.name == name:
            return m
    raise KeyError(name)
