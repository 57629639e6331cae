#!/usr/bin/env python3
"""Times the shapes in which users load a checkpoint, weightlift and the loaders people use today in one run, and
prints one JSON object on stdout (`--out FILE` writes it there too; progress goes to stderr).

Case families (`--cases`, comma-separated; default: all):

- ``cold``, ``warm``, ``tmpfs``: the checkpoint from disk right after the page cache was dropped (``--cold
  drop_caches``: ``sync; echo 3 > /proc/sys/vm/drop_caches``, needs root; ``--cold fadvise``: only the files under
  test are evicted with ``posix_fadvise(DONTNEED)``), from disk with the file read once just before, and from a
  copy on tmpfs (``--shm-file``, or a copy this script makes under ``--shm-dir`` and removes at exit). Methods:
  weightlift ``load_file``; weightlift ``safe_open`` + ``get_tensor`` per key in file order and in a random order
  (fixed ``--seed``); and the peers where they apply: safetensors ``load_file`` and ``safe_open`` per key,
  ``torch.load(mmap=True)`` then ``.to(device)`` (on a ``.pt`` copy made here), KvikIO ``pread`` of the data
  region into one buffer, fastsafetensors (no GDS), Run:ai model streamer, InstantTensor, and ``np.fromfile``
  then ``.to(device)`` (raw bytes).
- ``restart``: a new process loads the file after the page cache was dropped; then another new process loads it
  again, and only that second load is the figure (how the first load left the page cache decides it; the share of
  the file left resident is reported). Methods: weightlift and safetensors ``load_file``, ``torch.load``, and on a
  GPU weightlift ``load_file`` through a load server (``weightlift.load_file (load server)``: a
  ``python -m weightlift serve`` started for the family and stopped after it; both processes' loads go through it).
- ``first-load``: a fresh process times CUDA context creation (``torch.zeros(1, device=...)``), then weightlift's
  first load and a second load of the warm file; both and their ratio. On a GPU, also through a load server, as for
  ``restart``. The processes without a server run with ``WEIGHTLIFT_SERVER=off``.
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
(the README's Performance section) by this run's figures alone: warm and tmpfs ``load_file`` ≥ 0.92 of the pinned
copy (each also given as a share of the host's own read rate of the page cache or of tmpfs), cold ≥ 0.97 of the
disk (best over best); ``safe_open`` per key ≥ 0.9 of ``load_file`` in file order and ≥ 0.8 in random order, warm
and cold; a restart ≥ 0.9 of the warm rate (median over median); a fresh process's first load ≤ 1.2× its second
(median of the processes' ratios), each of these two without and with a load server; host loads ≥ 1.0×
``np.fromfile`` (median of the pairs). A goal whose cases were not run says what it lacked.

``--make-upstream PATH --size 4GiB`` writes (or reuses, when its tensors already match) a llama-shaped checkpoint
of random bf16 tensors with ``safetensors.torch.save_file``: upstream layout, tensor offsets not 4 KiB aligned.
Without ``--file`` that file is the one measured.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import random
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import time
import traceback
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

FAMILIES = ("cold", "warm", "tmpfs", "restart", "first-load", "cli", "sharded", "host")
STORAGE_CASES = ("cold", "warm", "tmpfs")
HEADER_LIMIT = 100 << 20
# Checksum rows: 2^22 elements of 16 bits times weights up to 2^22 stay below 2^60 in an int64 row sum.
CHUNK = 1 << 22
ROWS = 16

torch: Any = None
np: Any = None


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# Checkpoint headers, read here with the standard library (independent of every loader under test)


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str
    shape: tuple
    file: int
    offset: int  # absolute, in its file
    nbytes: int


@dataclass
class Checkpoint:
    path: str  # what a loader is given: one .safetensors file or a model.safetensors.index.json
    files: list
    entries: list  # file order: by file, then offset
    data_start: list  # per file: offset of the first data byte

    @property
    def tensor_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    def names(self) -> list:
        return [e.name for e in self.entries]

    def describe(self) -> dict:
        return {
            "path": self.path,
            "files": len(self.files),
            "file_bytes": sum(os.path.getsize(f) for f in self.files),
            "tensors": len(self.entries),
            "tensor_bytes": self.tensor_bytes,
            "tensors_not_4k_aligned": sum(1 for e in self.entries if e.offset % 4096),
        }


def read_header(path: str) -> tuple:
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: shorter than a safetensors header")
        (n,) = struct.unpack("<Q", raw)
        if n > HEADER_LIMIT:
            raise ValueError(f"{path}: header of {n} bytes is over the {HEADER_LIMIT} byte limit")
        return 8 + n, json.loads(f.read(n))


def open_checkpoint(path: str) -> Checkpoint:
    if path.endswith(".json"):
        with open(path) as f:
            weight_map = json.load(f)["weight_map"]
        base = os.path.dirname(path)
        files = [os.path.join(base, s) for s in sorted(set(weight_map.values()))]
    else:
        files = [path]
    entries, starts = [], []
    for i, file in enumerate(files):
        start, header = read_header(file)
        starts.append(start)
        size = os.path.getsize(file)
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            lo, hi = meta["data_offsets"]
            if not 0 <= lo <= hi or start + hi > size:
                raise ValueError(f"{file}: tensor {name!r} lies outside the file")
            entries.append(Entry(name, meta["dtype"], tuple(meta["shape"]), i, start + lo, hi - lo))
    entries.sort(key=lambda e: (e.file, e.offset))
    return Checkpoint(path, files, entries, starts)


# ---------------------------------------------------------------------------------------------------------------
# Checksums. On a GPU, per tensor: its byte count and two sums over its 16-bit words w_i, sum(w_i) and
# sum(w_i * (i + 1)), exact (mod 2^64): checking 4 GiB takes a fraction of a second there. On the host: CRC-32.

_weights: dict = {}


def _sums(words: Any, start: int) -> tuple:
    """(sum w, sum w * (start + i + 1)) of a 1-D int64 tensor shorter than CHUNK * ROWS."""
    n = words.numel()
    key = str(words.device)
    if key not in _weights:
        _weights[key] = torch.arange(1, CHUNK + 1, dtype=torch.int64, device=words.device)
    w = _weights[key]
    full = n // CHUNK
    a_parts, b_parts, offsets = [], [], []
    if full:
        rows = words[: full * CHUNK].view(full, CHUNK)
        a_parts.append(rows.sum(1))
        b_parts.append((rows * w).sum(1))
        offsets.extend(start + r * CHUNK for r in range(full))
    if n % CHUNK:
        tail = words[full * CHUNK :]
        a_parts.append(tail.sum().reshape(1))
        b_parts.append((tail * w[: tail.numel()]).sum().reshape(1))
        offsets.append(start + full * CHUNK)
    a = torch.cat(a_parts).tolist()
    b = torch.cat(b_parts).tolist()
    return sum(a), sum(bi + off * ai for ai, bi, off in zip(a, b, offsets))


def checksum(flat: Any) -> str:
    """Checksum of a flat uint8 tensor's bytes: CRC-32 on the host, positional sums on a GPU. Loads are checked on
    the device their reference was computed on, so the two never meet."""
    if flat.device.type == "cpu":
        return f"{flat.numel()}:crc32:{zlib.crc32(flat.numpy()):08x}"
    return positional(flat)


def positional(flat: Any) -> str:
    """The positional sums of a flat uint8 tensor's 16-bit words (of its bytes when their count is odd)."""
    n = flat.numel()
    if n % 2 == 0 and flat.storage_offset() % 2:
        flat = flat.clone()  # a 16-bit view needs an even start
    words = flat.view(torch.int16) if n % 2 == 0 else flat
    mask = 0xFFFF if n % 2 == 0 else 0xFF
    total_a = total_b = 0
    block = CHUNK * ROWS
    for start in range(0, words.numel(), block):
        part = words[start : start + block].to(torch.int64) & mask
        a, b = _sums(part, start)
        total_a += a
        total_b += b
    m = (1 << 64) - 1
    return f"{n}:{total_a & m:016x}:{total_b & m:016x}"


def flat_bytes(t: Any) -> Any:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


ST_DTYPES = {
    "BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64", "I8": "int8", "U8": "uint8",
    "I16": "int16", "I32": "int32", "I64": "int64", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2", "U16": "uint16", "U32": "uint32", "U64": "uint64",
}


@dataclass
class Reference:
    """Each tensor's dtype, shape and checksum, from a plain read of the checkpoint's files."""

    sums: dict  # name -> (dtype, shape, checksum)

    def to_json(self) -> dict:
        return {k: [d, list(s), c] for k, (d, s, c) in self.sums.items()}

    @staticmethod
    def from_json(d: dict) -> "Reference":
        return Reference({k: (v[0], tuple(v[1]), v[2]) for k, v in d.items()})


def reference(ckpt: Checkpoint, check_device: str) -> Reference:
    sums = {}
    handles = [open(f, "rb", buffering=0) for f in ckpt.files]
    try:
        for e in ckpt.entries:
            buf = bytearray(e.nbytes)
            view = memoryview(buf)
            done = 0
            while done < e.nbytes:
                got = os.preadv(handles[e.file].fileno(), [view[done:]], e.offset + done)
                if got <= 0:
                    raise ValueError(f"{ckpt.files[e.file]}: end of file inside tensor {e.name!r}")
                done += got
            flat = torch.frombuffer(buf, dtype=torch.uint8) if e.nbytes else torch.empty(0, dtype=torch.uint8)
            sums[e.name] = (e.dtype, e.shape, checksum(flat.to(check_device)))
    finally:
        for h in handles:
            h.close()
    return Reference(sums)


@dataclass
class RawBytes:
    """A loader's result that is raw bytes of the files (KvikIO, np.fromfile): `data` holds file `file`'s bytes
    from `base` on."""

    data: Any
    base: int
    file: int = 0


def verify(loaded: Union[dict, RawBytes], ref: Reference, ckpt: Checkpoint, check_device: str) -> None:
    """Raises ValueError naming the first tensor that differs from the reference."""
    if isinstance(loaded, RawBytes):
        for e in ckpt.entries:
            if e.file != loaded.file:
                continue
            lo = e.offset - loaded.base
            got = checksum(loaded.data[lo : lo + e.nbytes].to(check_device))
            if got != ref.sums[e.name][2]:
                raise ValueError(f"bytes of {e.name!r} differ from the file (checksum {got} != {ref.sums[e.name][2]})")
        return
    if set(loaded) != set(ref.sums):
        missing = sorted(set(ref.sums) - set(loaded))[:3]
        extra = sorted(set(loaded) - set(ref.sums))[:3]
        raise ValueError(f"tensor names differ from the file: missing {missing}, unexpected {extra}")
    for name, t in loaded.items():
        dtype, shape, want = ref.sums[name]
        if str(t.dtype) != f"torch.{ST_DTYPES.get(dtype, dtype)}" or tuple(t.shape) != shape:
            raise ValueError(f"{name!r}: {t.dtype} {tuple(t.shape)} loaded, {dtype} {shape} in the file")
        got = checksum(flat_bytes(t).to(check_device))
        if got != want:
            raise ValueError(f"bytes of {name!r} differ from the file (checksum {got} != {want})")


# ---------------------------------------------------------------------------------------------------------------
# Page cache: dropping, warming, and how much of a file is resident (mincore)


def drop_caches(files: list, how: str) -> None:
    if how == "drop_caches":
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        return
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cold_unavailable(how: str) -> Optional[str]:
    if how == "fadvise":
        return None if hasattr(os, "posix_fadvise") else "posix_fadvise is not available"
    if not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        return "cannot write /proc/sys/vm/drop_caches (needs root; try --cold fadvise)"
    return None


def warm(files: list) -> None:
    """Reads the files unless every page of them is in the page cache already."""
    if resident_fraction(files) == 1.0:
        return
    buf = bytearray(16 << 20)
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def resident_fraction(files: list) -> Optional[float]:
    """The fraction of the files' pages in the page cache, from mincore(2); None where it cannot be asked."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = os.sysconf("SC_PAGE_SIZE")
    resident = total = 0
    for path in files:
        size = os.path.getsize(path)
        if size == 0:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        finally:
            os.close(fd)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            return None
        pages = (size + page - 1) // page
        vec = (ctypes.c_ubyte * pages)()
        rc = libc.mincore(addr, size, vec)
        libc.munmap(addr, size)
        if rc != 0:
            return None
        resident += int((np.frombuffer(vec, dtype=np.uint8) & 1).sum())
        total += pages
    return resident / total if total else None


# ---------------------------------------------------------------------------------------------------------------
# The methods: each loads every tensor of a target onto a device and returns {name: tensor} or RawBytes


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


@dataclass
class Options:
    seed: int = 0
    kvikio_threads: int = 32


def _wl_load_file(t: Target, dev: str, o: Options) -> dict:
    import weightlift

    return weightlift.load_file(t.ckpt.path, device=dev)


_last_stream: dict = {}  # the stream statistics of the last weightlift safe_open load (known once it is closed)


def _wl_safe_open(order: str) -> Callable:
    def load(t: Target, dev: str, o: Options) -> dict:
        import weightlift

        names = key_order(t.ckpt, order, o.seed)
        with weightlift.safe_open(t.ckpt.path, framework="pt", device=dev) as f:
            out = {k: f.get_tensor(k) for k in names}
        _last_stream["stats"] = f.stream_stats()
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
    def load(t: Target, dev: str, o: Options) -> dict:
        from safetensors import safe_open

        names = key_order(t.ckpt, order, o.seed)
        with safe_open(t.ckpt.files[0], framework="pt", device=dev) as f:
            return {k: f.get_tensor(k) for k in names}

    return load


def _torch_load(t: Target, dev: str, o: Options) -> dict:
    sd = torch.load(t.pt, mmap=True, weights_only=True)
    # copy=True: on "cpu" a plain .to() would hand back the lazily mapped file.
    return {k: v.to(dev, copy=True) for k, v in sd.items()}


def _kvikio_threads(o: Options) -> None:
    import kvikio.defaults  # a submodule: `import kvikio` alone does not bind it

    kvikio.defaults.set("num_threads", o.kvikio_threads)


def _kvikio(t: Target, dev: str, o: Options) -> RawBytes:
    import kvikio

    start = t.ckpt.data_start[0]
    n = os.path.getsize(t.ckpt.files[0]) - start
    buf = torch.empty(n, dtype=torch.uint8, device=dev)
    with kvikio.CuFile(t.ckpt.files[0], "r") as f:
        got = f.pread(buf if dev != "cpu" else buf.numpy(), n, start).get()
    if got != n:
        raise ValueError(f"KvikIO read {got} of {n} bytes")
    return RawBytes(buf, start)


def _fastsafetensors(t: Target, dev: str, o: Options) -> dict:
    from fastsafetensors import fastsafe_open

    with fastsafe_open(list(t.ckpt.files), framework="pt", device=dev, nogds=True) as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _runai(t: Target, dev: str, o: Options) -> dict:
    from runai_model_streamer import SafetensorsStreamer

    with SafetensorsStreamer() as s:
        s.stream_files(list(t.ckpt.files), device=dev)
        return {name: tensor.to(dev) for name, tensor in s.get_tensors()}


def _instanttensor(t: Target, dev: str, o: Options) -> dict:
    from instanttensor import safe_open

    with safe_open(list(t.ckpt.files), framework="pt", device=dev) as f:
        return dict(f.tensors())


def _np_fromfile(t: Target, dev: str, o: Options) -> RawBytes:
    return RawBytes(torch.from_numpy(np.fromfile(t.ckpt.files[0], dtype=np.uint8)), 0)


def _np_fromfile_to(t: Target, dev: str, o: Options) -> RawBytes:
    return RawBytes(torch.from_numpy(np.fromfile(t.ckpt.files[0], dtype=np.uint8)).to(dev), 0)


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


def methods() -> list:
    wl = _importable("weightlift")
    return [
        Method("weightlift.load_file", False, _wl_load_file, wl),
        Method("weightlift.safe_open get_tensor file-order", False, _wl_safe_open("file"), wl),
        Method("weightlift.safe_open get_tensor random-order", False, _wl_safe_open("random"), wl),
        Method("safetensors.load_file", True, _st_load_file, _importable("safetensors"),
               note="one call per shard when sharded"),
        Method("safetensors.safe_open get_tensor file-order", True, _st_safe_open("file"),
               _all(_importable("safetensors"), _one_file)),
        Method("safetensors.safe_open get_tensor random-order", True, _st_safe_open("random"),
               _all(_importable("safetensors"), _one_file)),
        Method("torch.load(mmap=True) .to(device)", True, _torch_load, _has_pt, files=lambda t: [t.pt],
               note="reads a torch.save copy of the same tensors"),
        Method("kvikio pread", True, _kvikio, _all(_importable("kvikio"), _cuda_driver, _one_file),
               note="raw bytes of the data region into one buffer, no tensors", setup=_kvikio_threads),
        Method("fastsafetensors (nogds)", True, _fastsafetensors, _importable("fastsafetensors")),
        Method("runai-model-streamer", True, _runai, _importable("runai_model_streamer")),
        Method("instanttensor", True, _instanttensor, _all(_cuda_only, _importable("instanttensor"))),
        Method("np.fromfile .to(device)", True, _np_fromfile_to, _all(_cuda_only, _one_file),
               note="the whole file as raw bytes, then one pageable copy"),
    ]


NP_FROMFILE = Method("np.fromfile", True, _np_fromfile, _one_file, note="the whole file into fresh host memory")
WL_SERVER = Method("weightlift.load_file (load server)", False, _wl_load_file,
                   _all(_importable("weightlift"), _cuda_only),
                   note="read by a load server (python -m weightlift serve) into the process's memory")


def method_named(name: str) -> Method:
    for m in methods() + [NP_FROMFILE, WL_SERVER]:
        if m.name == name:
            return m
    raise KeyError(name)


# ---------------------------------------------------------------------------------------------------------------
# Timing


REPORT_KEYS = ("backend", "backend_reason", "direct_bytes", "buffered_bytes", "resident_bytes", "seconds", "gbps",
               "direct_policy", "lanes", "queue_depth", "peak_staging_bytes", "times",
               "device_memory", "server")
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
        torch.cuda.synchronize(dev)


def release(dev: str) -> None:
    gc.collect()
    if dev.startswith("cuda"):
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
    if why:
        run.skip(m.name, case, why)
        return
    rates, secs, resident, streams = [], [], [], []
    report = None
    try:
        m.setup(run.opts)
        for _ in range(run.runs):
            release(run.dev)
            prepare(m.files(t))
            if case.startswith("cold"):
                resident.append(resident_fraction(m.files(t)))
            _last_stream.clear()
            dt, loaded = timed_load(m, t, run.dev, run.opts)
            if m.name.startswith("weightlift"):
                report = report_figures()
            if "stats" in _last_stream:
                streams.append(_last_stream["stats"])
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
    run.add(m, case, rates, secs, t.ckpt.tensor_bytes, **extra)


# ---------------------------------------------------------------------------------------------------------------
# Case families


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


def child(spec: dict) -> dict:
    """Runs this script in a new Python process for one `spec` (see child_main) and returns its JSON answer. Its
    weightlift uses the load server at ``spec["server"]``, or none."""
    env = dict(os.environ, WEIGHTLIFT_SERVER=spec.get("server") or "off")
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                       capture_output=True, text=True, timeout=600, env=env)
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


class LoadServer:
    """``python -m weightlift serve`` on a socket of its own, for the processes of one family."""

    def __init__(self, dev: str):
        import socket as so
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="wl-serve-")
        self.path = os.path.join(self.dir, "server.sock")
        self.log = open(os.path.join(self.dir, "server.log"), "w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "weightlift", "serve", "--socket", self.path,
                                      "--prepare", dev], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"the load server exited {self.proc.returncode}: {self.log.read()[-600:]}")
            try:
                with so.socket(so.AF_UNIX) as c:
                    c.connect(self.path)
                self.log.seek(0)
                if "listening" in self.log.read():
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError("the load server did not start within 120 s")
            time.sleep(0.05)

    def close(self) -> None:
        import signal

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def server_for(m: Method, run: Run) -> Optional[LoadServer]:
    return LoadServer(run.dev) if m is WL_SERVER else None


def family_restart(run: Run, t: Target, ref_file: str, cold_ok: Optional[str]) -> None:
    names = ("weightlift.load_file", "safetensors.load_file", "torch.load(mmap=True) .to(device)")
    for m in [m for m in methods() if m.name in names] + [WL_SERVER]:
        if not run.wanted(m):
            continue
        why = cold_ok or m.needs(t, run.dev)
        if why:
            run.skip(m.name, "restart", why)
            continue
        rates, secs, first, resident = [], [], [], []
        answer: dict = {}
        server = None
        try:
            server = server_for(m, run)
            for _ in range(run.runs):
                drop_caches(m.files(t), run.cold)
                spec = dict(child_spec(run, "load", m, t, ref_file), server=server and server.path)
                a = child(spec)
                resident.append(resident_fraction(m.files(t)))
                answer = child(spec)
                first.append(round(t.ckpt.tensor_bytes / a["seconds"] / 1e9, 4))
                rates.append(t.ckpt.tensor_bytes / answer["seconds"] / 1e9)
                secs.append(answer["seconds"])
        except Exception as e:
            run.skip(m.name, "restart", f"failed: {type(e).__name__}: {e}")
            continue
        finally:
            if server is not None:
                server.close()
        extra = {"first_process_cold_gbps": first, "resident_after_first_process": resident,
                 "cuda_context_s": answer.get("cuda_context_s")}
        if answer.get("report") is not None:
            extra["report"] = answer["report"]
        run.add(m, "restart", rates, secs, t.ckpt.tensor_bytes, **extra)


def family_first_load(run: Run, t: Target, ref_file: str) -> None:
    for m in (method_named("weightlift.load_file"), WL_SERVER):
        if run.wanted(m):
            first_load_of(run, t, ref_file, m)


def first_load_of(run: Run, t: Target, ref_file: str, m: Method) -> None:
    why = m.needs(t, run.dev)
    if why:
        run.skip(m.name, "first-load", why)
        return
    firsts, seconds, ctx, imports = [], [], [], []
    answer: dict = {}
    server = None
    try:
        server = server_for(m, run)
        for _ in range(run.runs):
            warm(t.ckpt.files)
            answer = child(dict(child_spec(run, "first-load", m, t, ref_file), server=server and server.path))
            firsts.append(answer["first_s"])
            seconds.append(answer["second_s"])
            ctx.append(answer["cuda_context_s"])
            imports.append(answer["import_weightlift_s"])
    except Exception as e:
        run.skip(m.name, "first-load", f"failed: {type(e).__name__}: {e}")
        return
    finally:
        if server is not None:
            server.close()
    n = t.ckpt.tensor_bytes
    ratios = [a / b for a, b in zip(firsts, seconds)]
    run.add(m, "first-load (fresh process, warm file)", [n / s / 1e9 for s in firsts], firsts, n,
            second_load=summarize([n / s / 1e9 for s in seconds]), second_load_s=seconds,
            first_to_second_time_ratio=[round(r, 4) for r in ratios],
            median_first_to_second_time_ratio=round(statistics.median(ratios), 4),
            cuda_context_s=ctx, import_weightlift_s=imports,
            report_first=answer.get("report_first"), report=answer.get("report_second"))


def find_cli(given: Optional[str]) -> Optional[str]:
    if given:
        return given
    here = os.path.dirname(os.path.abspath(__file__))
    for p in (os.path.join(here, "..", "bin", "weightlift"),
              os.path.join(here, "..", "target", "release", "weightlift")):
        if os.access(p, os.X_OK):
            return os.path.normpath(p)
    return shutil.which("weightlift")


def family_cli(run: Run, t: Target, binary: Optional[str]) -> None:
    name = "weightlift CLI load (one-shot process)"
    m = Method(name, False, _wl_load_file)
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
    case = "host, fresh memory, warm file (interleaved pairs)"
    run.add(ref_m, case, rates[ref_m.name], secs[ref_m.name], t.ckpt.tensor_bytes)
    run.add(wl, case, rates[wl.name], secs[wl.name], t.ckpt.tensor_bytes, report=report,
            ratio_to_np_fromfile_per_pair=[round(r, 4) for r in ratios],
            median_ratio_to_np_fromfile=round(statistics.median(ratios), 4))


# ---------------------------------------------------------------------------------------------------------------
# Child processes (restart, first-load): `shapes.py --child SPEC`, one JSON line on stdout


def cuda_context(dev: str) -> Optional[float]:
    if not dev.startswith("cuda"):
        return None
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


# ---------------------------------------------------------------------------------------------------------------
# Files: the upstream checkpoint, its torch.save copy, tmpfs copies, the save_pretrained shards


def parse_size(s: str) -> int:
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10**3, "mb": 10**6, "gb": 10**9, "b": 1}
    low = s.strip().lower()
    for u, mult in units.items():
        if low.endswith(u):
            return int(float(low[: -len(u)]) * mult)
    return int(low)


def llama_tensors(h: int, layers: int) -> list:
    """The names and shapes of weightlift's synthetic llama layout (crates/weightlift-format synth), bf16."""
    step = 256 if h >= 256 else 32
    inter, kv, vocab = -(-(h * 11 // 4) // step) * step, max(h // 4, 32), min(h * 8, 32000)
    out = [("model.embed_tokens.weight", (vocab, h))]
    for i in range(layers):
        p = f"model.layers.{i}"
        out += [(f"{p}.input_layernorm.weight", (h,)), (f"{p}.self_attn.q_proj.weight", (h, h)),
                (f"{p}.self_attn.k_proj.weight", (kv, h)), (f"{p}.self_attn.v_proj.weight", (kv, h)),
                (f"{p}.self_attn.o_proj.weight", (h, h)), (f"{p}.post_attention_layernorm.weight", (h,)),
                (f"{p}.mlp.gate_proj.weight", (inter, h)), (f"{p}.mlp.up_proj.weight", (inter, h)),
                (f"{p}.mlp.down_proj.weight", (h, inter))]
    return out + [("model.norm.weight", (h,)), ("lm_head.weight", (vocab, h))]


def llama_plan(size: int) -> list:
    """The widest model of which one layer fits in `size`, then the fewest layers that reach `size`."""
    nbytes = lambda ts: 2 * sum(int(np.prod(s)) for _, s in ts)  # noqa: E731
    h = 4096
    while h > 64 and nbytes(llama_tensors(h, 1)) > size:
        h //= 2
    one = nbytes(llama_tensors(h, 1))
    per_layer = nbytes(llama_tensors(h, 2)) - one
    return llama_tensors(h, 1 + -(-max(0, size - one) // per_layer))


def make_upstream(path: str, size: int, seed: int) -> None:
    from safetensors.torch import save_file

    plan = llama_plan(size)
    if os.path.exists(path):
        try:
            have = open_checkpoint(path)
            if sorted((e.name, e.shape, e.dtype) for e in have.entries) == sorted((n, s, "BF16") for n, s in plan):
                log(f"reusing {path} ({have.tensor_bytes / 2**30:.2f} GiB, {len(have.entries)} tensors)")
                return
        except (ValueError, OSError, KeyError) as e:
            log(f"rewriting {path}: {e}")
    t0 = time.perf_counter()
    g = torch.Generator().manual_seed(seed)
    tensors = {n: torch.randn(s, generator=g).mul_(0.02).to(torch.bfloat16) for n, s in plan}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    save_file(tensors, path + ".partial", metadata={"format": "pt"})
    os.replace(path + ".partial", path)
    log(f"wrote {path} with safetensors.torch.save_file: {len(plan)} tensors, "
        f"{os.path.getsize(path) / 2**30:.2f} GiB in {time.perf_counter() - t0:.1f} s")


def fresh(copy: str, source: str) -> bool:
    return os.path.exists(copy) and os.path.getmtime(copy) >= os.path.getmtime(source)


def make_pt(source: str, pt: str) -> None:
    """A torch.save copy of the checkpoint's tensors, for torch.load(mmap=True)."""
    if fresh(pt, source):
        return
    from safetensors.torch import load_file

    t0 = time.perf_counter()
    torch.save(load_file(source), pt + ".partial")
    os.replace(pt + ".partial", pt)
    log(f"wrote {pt} with torch.save in {time.perf_counter() - t0:.1f} s")


def llama_config(ckpt: Checkpoint) -> Any:
    import transformers

    shapes = {e.name: e.shape for e in ckpt.entries}
    try:
        vocab, h = shapes["model.embed_tokens.weight"]
        kv = shapes["model.layers.0.self_attn.k_proj.weight"][0]
        inter = shapes["model.layers.0.mlp.gate_proj.weight"][0]
    except (KeyError, ValueError) as e:
        raise ValueError(f"not a llama-shaped checkpoint ({e})") from None
    layers = len({n.split(".")[2] for n in shapes if n.startswith("model.layers.")})
    head_dim = next(d for d in (128, 64, 32, 16, 8, 4, 2, 1) if h % d == 0 and kv % d == 0)
    return transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=h, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=h // head_dim, num_key_value_heads=kv // head_dim, head_dim=head_dim,
        tie_word_embeddings="lm_head.weight" not in shapes)


def make_sharded(source: Checkpoint, out_dir: str, shard_size: str) -> str:
    """The checkpoint's tensors written by transformers' save_pretrained (shards and index); reused while the
    source file is unchanged."""
    import transformers
    from safetensors.torch import load_file

    index = os.path.join(out_dir, "model.safetensors.index.json")
    stamp = f"{source.path}:{os.path.getsize(source.path)}:{os.path.getmtime(source.path)}:{shard_size}"
    stamp_file = os.path.join(out_dir, "source.txt")
    if os.path.exists(index) and os.path.exists(stamp_file) and open(stamp_file).read() == stamp:
        return index
    t0 = time.perf_counter()
    config = llama_config(source)
    shutil.rmtree(out_dir, ignore_errors=True)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    model.load_state_dict(load_file(source.path), strict=True, assign=True)
    model.save_pretrained(out_dir, max_shard_size=shard_size)
    del model
    if not os.path.exists(index):
        raise ValueError(f"save_pretrained wrote no index in {out_dir} (one shard?)")
    with open(stamp_file, "w") as f:
        f.write(stamp)
    log(f"wrote {out_dir} with transformers {transformers.__version__} save_pretrained in "
        f"{time.perf_counter() - t0:.1f} s")
    return index


def copy_to(src: str, directory: str, made: list) -> str:
    os.makedirs(directory, exist_ok=True)
    dst = os.path.join(directory, os.path.basename(src))
    if not (os.path.exists(dst) and os.path.getsize(dst) == os.path.getsize(src) and fresh(dst, src)):
        shutil.copyfile(src, dst)
    made.append(dst)
    return dst


# ---------------------------------------------------------------------------------------------------------------
# Main


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
    ap.add_argument("--make-only", action="store_true", help="with --make-upstream: write the file and stop")
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


def versions() -> dict:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in ("torch", "numpy", "safetensors", "weightlift", "transformers", "kvikio-cu13", "libkvikio-cu13",
                 "fastsafetensors", "runai-model-streamer", "instanttensor", "cupy-cuda13x"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def host_info() -> dict:
    mem = None
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return {"cpus": os.cpu_count(), "mem_bytes": mem, "kernel": platform.release()}


@dataclass
class Files:
    disk: Target
    tmpfs: Optional[Target] = None
    tmpfs_why: Optional[str] = None
    sharded: Optional[Target] = None
    sharded_why: Optional[str] = None
    made: list = field(default_factory=list)  # tmpfs copies to remove at exit


def prepare_files(args: argparse.Namespace, families: list, ckpt: Checkpoint) -> Files:
    pt = None
    torch_load = method_named("torch.load(mmap=True) .to(device)")
    filters = args.methods.split(",") if args.methods else [""]
    if any(w in torch_load.name for w in filters) and set(families) & {"cold", "warm", "tmpfs", "restart"}:
        pt = ckpt.path + ".pt"
        make_pt(ckpt.path, pt)
    files = Files(Target("disk", ckpt, pt))
    if "tmpfs" in families:
        shm_ok = os.path.isdir(os.path.dirname(args.shm_dir.rstrip("/")) or "/")
        if args.shm_file or shm_ok:
            shm = args.shm_file or copy_to(ckpt.path, args.shm_dir, files.made)
            shm_pt = copy_to(pt, args.shm_dir, files.made) if pt and shm_ok else None
            files.tmpfs = Target("tmpfs", open_checkpoint(shm), shm_pt)
        else:
            files.tmpfs_why = f"no tmpfs: {os.path.dirname(args.shm_dir)} is not a directory"
    if "sharded" in families:
        try:
            out_dir = os.path.splitext(ckpt.path)[0] + "-save_pretrained"
            files.sharded = Target("sharded", open_checkpoint(make_sharded(ckpt, out_dir, args.shard_size)))
        except Exception as e:
            files.sharded_why = f"{type(e).__name__}: {e}"
            log(f"sharded case skipped: {files.sharded_why}")
    return files


# ---------------------------------------------------------------------------------------------------------------
# Ceilings, measured in the same run, and the goals of the benchmark judged against them

DD_BLOCK = 16 << 20


def dd_rate(path: str, streams: int, direct: bool, runs: int) -> Optional[dict]:
    """GB/s of `streams` parallel `dd bs=16M` over stripes of `path` (the whole file, to /dev/null), `runs` times:
    with `direct`, `iflag=direct` (the disk, whatever the page cache holds); without, the page cache's read rate
    (the file warmed first). None when dd is absent or refuses (O_DIRECT on a filesystem without it)."""
    dd = shutil.which("dd")
    if dd is None:
        return None
    size = os.path.getsize(path)
    blocks = -(-size // DD_BLOCK)
    per = -(-blocks // streams)
    rates = []
    for _ in range(runs):
        if not direct:
            warm([path])
        t0 = time.perf_counter()
        procs = [subprocess.Popen([dd, f"if={path}", "of=/dev/null", f"bs={DD_BLOCK}", f"skip={k * per}",
                                   f"count={per}"] + (["iflag=direct"] if direct else []),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for k in range(streams) if k * per < blocks]
        errors = [p.communicate()[1] for p in procs]  # waits for each
        dt = time.perf_counter() - t0
        failed = [e for p, e in zip(procs, errors) if p.returncode != 0]
        if failed:
            log(f"  dd failed: {failed[0].decode(errors='replace').strip()}")
            return None
        rates.append(size / dt / 1e9)
    return {"streams": streams, "direct": direct, "bytes": size, **summarize(rates)}


def pinned_copy_rate(nbytes: int, dev: str, runs: int) -> dict:
    """GB/s of one host→device copy of `nbytes` from pinned memory into device memory (torch), after one warm-up
    copy: what the link gives a load that has its bytes in pinned memory already."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    rates = []
    try:
        for i in range(runs + 1):
            torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            dst.copy_(host, non_blocking=True)
            torch.cuda.synchronize(dev)
            if i:
                rates.append(nbytes / (time.perf_counter() - t0) / 1e9)
    finally:
        del host, dst
        release(dev)
    return {"bytes": nbytes, **summarize(rates)}


def parallel_read_rate(path: str, threads: int, runs: int, before: Optional[Callable[[], None]] = None) -> dict:
    """GB/s of `threads` threads reading the file in 16 MiB `preadv` calls, each its own stripe into its own buffer
    (allocated and touched before the clock), after `before()` (default: the file warmed): how fast this host's CPUs
    copy out of its page cache, the host side of a warm load (dd processes would time their own start-up at these
    sizes); with the caches dropped before, how fast the disk gives buffered reads. A thread's error is raised."""
    import threading

    size = os.path.getsize(path)
    stripe = -(-size // threads)
    bufs = [bytearray(min(DD_BLOCK, stripe)) for _ in range(threads)]
    for b in bufs:
        b[::4096] = b"\1" * len(b[::4096])
    fd = os.open(path, os.O_RDONLY)
    rates = []
    try:
        def read(k: int, errors: list) -> None:
            try:
                view = memoryview(bufs[k])
                off, end = k * stripe, min(size, (k + 1) * stripe)
                while off < end:
                    n = os.preadv(fd, [view[:min(len(view), end - off)]], off)
                    if n <= 0:
                        raise OSError(f"short read at {off} of {path}")
                    off += n
            except BaseException as e:  # handed to the timing thread
                errors.append(e)

        for _ in range(runs):
            (before or (lambda: warm([path])))()
            errors: list = []
            workers = [threading.Thread(target=read, args=(k, errors)) for k in range(threads)]
            t0 = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            if errors:
                raise errors[0]
            rates.append(size / (time.perf_counter() - t0) / 1e9)
    finally:
        os.close(fd)
    return {"threads": threads, "bytes": size, **summarize(rates)}


def measure_ceilings(run: Run, families: list, files: "Files", cold_why: Optional[str]) -> dict:
    """The ceilings the goals are judged against, measured in this run before the loads: the pinned copy (GPU runs
    with a warm or tmpfs case), the disk (with a cold case: 16 parallel `dd iflag=direct`, and 16 threads reading
    through the page cache after the caches are dropped) and the page cache (one `dd`, and 16 threads reading in
    parallel: how fast this host's CPUs copy out of its page cache; the same threads on the tmpfs copy)."""
    out: dict = {}
    runs = max(3, run.runs)
    path = files.disk.ckpt.path
    if run.dev.startswith("cuda") and set(families) & {"warm", "tmpfs"}:
        out["pinned_copy"] = pinned_copy_rate(files.disk.ckpt.tensor_bytes, run.dev, max(5, runs))
        pinned = out["pinned_copy"]
        log(f"ceiling pinned copy: best {pinned['best']:.2f} GB/s, median {pinned['median']:.2f}")
    if "cold" in families and not cold_why:
        out["disk_direct_dd16"] = dd_rate(path, 16, True, runs)
        out["disk_buffered_read16"] = parallel_read_rate(path, 16, runs, lambda: drop_caches([path], run.cold))
    if set(families) & {"warm", "restart", "host"}:
        out["page_cache_dd1"] = dd_rate(path, 1, False, runs)
        out["page_cache_read16"] = parallel_read_rate(path, 16, runs)
    if "tmpfs" in families and files.tmpfs is not None:
        out["tmpfs_read16"] = parallel_read_rate(files.tmpfs.ckpt.path, 16, runs)
    for k in ("disk_direct_dd16", "disk_buffered_read16", "page_cache_dd1", "page_cache_read16", "tmpfs_read16"):
        if k in out:
            if out[k] is None:
                out[k] = "dd absent or refused"
            else:
                log(f"ceiling {k}: best {out[k]['best']:.2f} GB/s, median {out[k]['median']:.2f}")
    return out


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


FIRST_LOAD = "first-load (fresh process, warm file)"
HOST = "host, fresh memory, warm file (interleaved pairs)"


def goals(results: list, ceilings: dict) -> list:
    """Each goal of the benchmark's bar (the README's Performance section) with this run's figure, its basis, and
    whether it holds; a goal this run did not measure says what it lacked."""
    wl, srv = "weightlift.load_file", WL_SERVER.name
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
    for method, label in ((wl, "own process"), (srv, "through a load server")):
        goal(f"restart after a cold load, {label} / warm load_file", ">= 0.9",
             ratio(stat("restart", method), stat("warm", wl)), "median over median", lambda x: x >= 0.9,
             "a restart and a warm load_file")
        r = result_of(results, FIRST_LOAD, method)
        goal(f"first load of a fresh process / its second load, {label}", "<= 1.2",
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


class OutOfTime(BaseException):
    """Raised in the main thread by SIGTERM (``timeout`` sends it) or by ``--time-limit``'s alarm. A BaseException,
    so that no family's ``except Exception`` takes it for a failed method: it ends the run, which still reports what
    it measured."""


def _out_of_time(signum: int, frame: Any) -> None:
    raise OutOfTime(signal.Signals(signum).name)


def run_families(run: Run, args: argparse.Namespace, families: list, files: Files, ref_file: str,
                 time_limit: Optional[float] = None) -> dict:
    """Each family in turn; ``seconds`` per family. A SIGTERM, or the end of ``time_limit`` seconds from now, ends
    the family it interrupts and the rest (:class:`OutOfTime`): ``run.stopped`` says where and why, and every family
    not finished is listed under ``skipped``."""
    seconds: dict = {}
    handlers = {sig: signal.signal(sig, _out_of_time) for sig in (signal.SIGTERM, signal.SIGALRM)}
    try:
        if time_limit is not None:
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, time_limit))
        _families(run, args, families, files, ref_file, seconds)
    except OutOfTime as e:
        fam = next((f for f in ["ceilings", *families] if f not in seconds), "ceilings")
        why = "SIGTERM" if str(e) == "SIGTERM" else f"--time-limit {args.time_limit:g} s"
        run.stopped = {"family": fam, "by": why, "families_not_finished": [f for f in families if f not in seconds]}
        log(f"stopped by {why} during {fam}: the families not finished are skipped; what was measured is reported")
        for f in run.stopped["families_not_finished"]:
            run.skip("*", f, f"not finished: the run was stopped by {why} during {fam}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, h in handlers.items():
            signal.signal(sig, h)
    return seconds


def _families(run: Run, args: argparse.Namespace, families: list, files: Files, ref_file: str, seconds: dict) -> None:
    cold_why = cold_unavailable(args.cold)
    t0 = time.perf_counter()
    log("== ceilings")
    run.ceilings = measure_ceilings(run, families, files, cold_why)
    seconds["ceilings"] = round(time.perf_counter() - t0, 1)
    for fam in families:
        t0 = time.perf_counter()
        log(f"== {fam}")
        if fam in STORAGE_CASES:
            target = files.tmpfs if fam == "tmpfs" else files.disk
            why = files.tmpfs_why if fam == "tmpfs" else (cold_why if fam == "cold" else None)
            family_storage(run, fam, None if why else target, why)
        elif fam == "restart":
            family_restart(run, files.disk, ref_file, cold_why)
        elif fam == "first-load":
            family_first_load(run, files.disk, ref_file)
        elif fam == "cli":
            family_cli(run, files.disk, find_cli(args.weightlift_bin))
        elif fam == "sharded":
            family_sharded(run, files.sharded, files.sharded_why, cold_why)
        elif fam == "host":
            family_host(run, files.disk)
        seconds[fam] = round(time.perf_counter() - t0, 1)


def bench(args: argparse.Namespace, families: list) -> dict:
    started = time.perf_counter()
    dev = args.device
    out: dict = {"script": "bench/shapes.py", "argv": sys.argv[1:], "device": dev, "host": host_info(),
                 "versions": versions()}
    if dev.startswith("cuda") and not torch.cuda.is_available():
        out["skipped"] = "torch sees no CUDA device"
        return out
    out["cuda_context_s"] = cuda_context(dev)
    out["gpu"] = torch.cuda.get_device_name(dev) if dev.startswith("cuda") else None
    if args.make_upstream:
        make_upstream(args.make_upstream, parse_size(args.size), args.seed)
        if args.make_only:
            out["made"] = open_checkpoint(args.make_upstream).describe()
            return out
    path = args.file or args.make_upstream
    if not path:
        raise SystemExit("give --file or --make-upstream")
    ckpt = open_checkpoint(os.path.abspath(path))
    files = prepare_files(args, families, ckpt)
    out["files"] = {"upstream": ckpt.describe(), "pt": files.disk.pt,
                    "tmpfs": files.tmpfs.ckpt.describe() if files.tmpfs else files.tmpfs_why,
                    "sharded": files.sharded.ckpt.describe() if files.sharded else files.sharded_why}
    check_dev = dev if dev.startswith("cuda") else "cpu"
    try:
        t0 = time.perf_counter()
        ref = reference(ckpt, check_dev)
        log(f"reference checksums of {len(ref.sums)} tensors in {time.perf_counter() - t0:.1f} s")
        ref_file = os.path.join(args.shm_dir if os.path.isdir(args.shm_dir) else os.path.dirname(ckpt.path),
                                f"reference-{os.getpid()}.json")
        with open(ref_file, "w") as f:
            json.dump(ref.to_json(), f)
        files.made.append(ref_file)
        run = Run(dev, check_dev, args.runs, Options(args.seed, args.kvikio_threads), args.cold,
                  method_filter=args.methods.split(",") if args.methods else None)
        for t in (files.disk, files.tmpfs, files.sharded):
            if t:
                run.refs[t.ckpt.path] = ref  # every copy must hold the upstream file's tensors
        limit = None if args.time_limit is None else args.time_limit - (time.perf_counter() - started)
        out["family_seconds"] = run_families(run, args, families, files, ref_file, limit)
    finally:
        for p in files.made:
            if os.path.exists(p):
                os.remove(p)
        if os.path.isdir(args.shm_dir) and not os.listdir(args.shm_dir):
            os.rmdir(args.shm_dir)
    best_peers(run.results)
    run_goals = goals(run.results, run.ceilings)
    log_goals(run_goals)
    out.update({
        "runs": args.runs, "cases": families, "cold_method": args.cold, "seed": args.seed,
        "kvikio_threads": args.kvikio_threads,
        "checks": "each load's tensors: dtype, shape and checksum of the bytes against a plain read of the upstream "
                  "file, after the clock stopped",
        "ceilings": run.ceilings, "results": run.results, "goals": run_goals, "skipped": run.skipped,
        "stopped": run.stopped,
        "elapsed_s": round(time.perf_counter() - started, 1),
    })
    return out


def main(argv: Optional[list] = None) -> int:
    # Loaders print to stdout (C++ logs too): keep fd 1 for the JSON alone and send everything else to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    args = parse_args(argv)
    global torch, np
    try:
        import numpy
        import torch as torch_module
    except ImportError as e:
        out.write(json.dumps({"skipped": f"needs torch and numpy: {e}"}) + "\n")
        return 0
    torch, np = torch_module, numpy
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
