"""Shared machinery of the Python front: the engines, device strings, dtypes, and turning loaded byte buffers into
typed, shaped torch tensors without copying."""

from __future__ import annotations

import math
import os
import threading
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from . import _native
from ._errors import CudaError, InvalidArgumentError

if TYPE_CHECKING:
    import torch

_torch = None


def torch_module():
    """torch, imported on first use (weightlift itself does not need it to import)."""
    global _torch
    if _torch is None:
        try:
            import torch as t
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise InvalidArgumentError("weightlift's tensor APIs need PyTorch (pip install torch)") from e
        _torch = t
    return _torch


def torch_installed() -> bool:
    """Whether PyTorch can be imported (imported now if so)."""
    try:
        torch_module()
    except InvalidArgumentError:
        return False
    return True


def torch_dtypes() -> dict[str, "torch.dtype"]:
    """weightlift / safetensors dtype names → torch dtypes available in this torch."""
    t = torch_module()
    table = {
        "F64": t.float64,
        "F32": t.float32,
        "F16": t.float16,
        "BF16": t.bfloat16,
        "I64": t.int64,
        "I32": t.int32,
        "I16": t.int16,
        "I8": t.int8,
        "U8": t.uint8,
        "BOOL": t.bool,
        "C64": t.complex64,
    }
    for name, attr in [
        ("F8_E4M3", "float8_e4m3fn"),
        ("F8_E5M2", "float8_e5m2"),
        ("F8_E4M3FNUZ", "float8_e4m3fnuz"),
        ("F8_E5M2FNUZ", "float8_e5m2fnuz"),
        ("F8_E8M0", "float8_e8m0fnu"),
        # Two F4 values per torch element: a tensor's torch shape has its last dimension halved (storage_shape).
        ("F4", "float4_e2m1fn_x2"),
        ("U16", "uint16"),
        ("U32", "uint32"),
        ("U64", "uint64"),
    ]:
        if hasattr(t, attr):
            table[name] = getattr(t, attr)
    return table


def dtype_name(dtype: "torch.dtype") -> str:
    for name, d in torch_dtypes().items():
        if d == dtype:
            return name
    raise InvalidArgumentError(f"dtype {dtype}: safetensors has no such dtype")


def normalize_device(device: Any) -> str:
    """None (cpu), an int (a CUDA ordinal), a ``torch.device`` or a device string → the engine's device string.
    Plain ``cuda`` means PyTorch's current device; every other string is parsed by the engine."""
    if device is None:
        return "cpu"
    if isinstance(device, int):
        return f"cuda:{device}"
    s = str(device).strip().lower()
    if s in ("cuda", "gpu"):
        t = torch_module()
        index = t.cuda.current_device() if t.cuda.is_available() else 0
        return f"cuda:{index}"
    return _native.parse_device_string(s)


def new_engine(**settings: Any) -> "_native.NativeEngine":
    """An engine with ``settings`` (names of :data:`weightlift.SETTINGS`) over the environment and defaults."""
    return _native.NativeEngine(**settings)


_shared_lock = threading.Lock()
_shared: "_native.NativeEngine | None" = None
_shared_env: tuple | None = None


def shared_engine() -> "_native.NativeEngine":
    """The process-wide engine behind the module-level functions (re-created if WEIGHTLIFT_* variables change)."""
    global _shared, _shared_env
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("WEIGHTLIFT_")))
    with _shared_lock:
        if _shared is None or env != _shared_env:
            _shared = _native.NativeEngine()
            _shared_env = env
        return _shared


def cufile_route() -> tuple[str, str]:
    """(``"cufile"`` or ``"engine"``, why): the data path of the drop-in cuFile fronts, decided once per process by
    the native module (its :class:`_native.CufilePath` named as reports name it)."""
    route = _native.cufile_route()
    return str(route.path), route.why


def check_cuda(device: str) -> None:
    if device.startswith("cuda"):
        ok, why = _native.cuda_status()
        if not ok:
            raise CudaError(f"{device} requested but CUDA is unavailable: {why}")


_side_streams: dict = {}


def device_allocator(engine, device: str) -> "tuple[Any, int]":
    """``(alloc, stream)`` for a load onto ``device`` whose tensors come from PyTorch's caching allocator (the
    engine's ``device_memory`` setting is ``torch``), ``(None, 0)`` for host loads and for the device's pool.
    ``alloc(nbytes)`` makes a uint8 tensor on a side stream of weightlift's own, whose handle is ``stream``, and
    marks it used by the caller's current stream (``record_stream``): torch reuses the memory once that stream's
    work queued before the tensors are freed has finished, and the load waits for nothing the caller queued."""
    if not device.startswith("cuda") or engine.device_memory != "torch":
        return None, 0
    t = torch_module()
    dev = t.device(device)
    consumer = t.cuda.current_stream(dev)
    with _shared_lock:
        side = _side_streams.get(dev.index)
        if side is None:
            # A stream weightlift keeps for the process, not `torch.cuda.Stream()`: torch would first make its pool
            # of streams, 3-5 ms of a fresh process's first load (bench/results/2026-11-25-h100-zc at b3a4ec8).
            side = _side_streams[dev.index] = t.cuda.ExternalStream(_native.process_stream(dev.index), device=dev)

    def alloc(nbytes: int) -> "torch.Tensor":
        # Called on one of the engine's threads, whose current stream is neither, or by prepare() on the caller's.
        # The device first: on a thread whose current device is another (a fresh thread's is 0), the stream alone
        # would set that device back on leaving, and setting a device makes its context (hundreds of MB on a GPU
        # the rank never uses); leaving `device` sets the old one back only where it has a context already.
        with t.cuda.device(dev), t.cuda.stream(side):
            block = t.empty(nbytes, dtype=t.uint8, device=dev)
        block.record_stream(consumer)
        return block

    return alloc, side.cuda_stream


def load_ranges(engine, paths: Sequence[str], ranges: Sequence[tuple[int, int, int]], device: str):
    check_cuda(device)
    return engine.load_ranges([os.fspath(p) for p in paths], list(ranges), device)


def info_tensor(buffer, info: "_native.TensorInfo", stream: "int | None" = None) -> "torch.Tensor":
    """A loaded tensor's buffer as the tensor its :class:`TensorInfo` describes (block-quantized types as uint8)."""
    return as_tensor(buffer, "U8" if info.quantized else info.dtype, info.storage_shape, stream)


def info_tensors(buffers: Sequence[Any], infos: Sequence["_native.TensorInfo"]) -> list["torch.Tensor"]:
    """:func:`info_tensor` of each buffer of one load (all on one device), asking for the consumer stream once."""
    stream = consumer_stream(buffers[0]) if buffers else None
    return [info_tensor(b, i, stream) for b, i in zip(buffers, infos)]


def consumer_stream(buffer) -> int:
    """What ``torch.from_dlpack`` would pass as ``stream`` to ``buffer.__dlpack__``: the current stream of a CUDA
    buffer's device (1 for the legacy default stream), 0 for host memory."""
    kind, index = buffer.__dlpack_device__()
    if kind != 2:  # kDLCUDA
        return 0
    s = torch_module().cuda.current_stream(index).cuda_stream
    return 1 if s == 0 else s


def as_tensor(buffer, dtype_name_: str, shape: Sequence[int], stream: "int | None" = None) -> "torch.Tensor":
    """A loaded byte buffer as a tensor of `dtype_name_` and `shape`, sharing memory. Through one DLPack capsule of
    the right dtype and shape where DLPack has the dtype (`stream`: the consumer stream, looked up when None), else
    through a byte tensor viewed as the dtype."""
    t = torch_module()
    shape = tuple(int(d) for d in shape)
    if buffer.nbytes:
        # `torch.from_dlpack` asks the buffer for its device and a capsule, and looks up the current stream, for
        # every tensor; a capsule made here costs a fraction of that (docs/performance.md).
        capsule = buffer.typed_capsule(dtype_name_, shape, consumer_stream(buffer) if stream is None else stream)
        if capsule is not None:
            return t.utils.dlpack.from_dlpack(capsule)
    raw = t.from_dlpack(buffer)
    if dtype_name_ == "U8":
        return raw.reshape(shape)
    table = torch_dtypes()
    if dtype_name_ not in table:
        raise InvalidArgumentError(f"this torch has no dtype for {dtype_name_}; load it as raw bytes instead")
    dtype = table[dtype_name_]
    if dtype_name_ == "F4" and math.prod(shape) != buffer.nbytes:
        # Its storage shape was not halved: an odd last dimension, which torch's pairs of values cannot hold.
        raise InvalidArgumentError(f"f4_x2 dtype requires that the last dim be divisible by 2 in torch: got {list(shape)}")
    if raw.numel() == 0:
        return t.empty(shape, dtype=dtype, device=raw.device)
    return raw.view(dtype).reshape(shape)


def bytes_view(tensor: "torch.Tensor") -> "torch.Tensor":
    """A contiguous tensor's bytes as a 1-D uint8 tensor (0-dim tensors included)."""
    t = torch_module()
    return tensor.reshape(-1).view(t.uint8)


def iter_ranges(items: Iterable[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    return [(int(f), int(o), int(n)) for f, o, n in items]


class _Progress:
    """What ``progress=True`` shows: a tqdm bar where tqdm is installed, else a line on stderr; from the second
    second of a load on, so short loads print nothing."""

    def __init__(self, total: int, what: str):
        import time

        self._clock = time.monotonic
        self._start = self._clock()
        self._total, self._what = total, what
        self._bar: Any = None
        self._line = False

    def __call__(self, done: int) -> None:
        if self._bar is None and not self._line and self._clock() - self._start < 1.0:
            return
        if self._bar is None and not self._line:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                self._line = True
            else:
                self._bar = tqdm(total=self._total, desc=self._what, unit="B", unit_scale=True, unit_divisor=1024)
        if self._bar is not None:
            self._bar.update(min(done, self._total) - self._bar.n)
        else:
            import sys

            seconds = max(self._clock() - self._start, 1e-9)
            share = done / self._total if self._total else 1.0
            sys.stderr.write(f"\r{self._what}: {share:6.1%} of {self._total / 2**30:.2f} GiB, {done / seconds / 1e9:.2f} GB/s")
            sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self._line:
            import sys

            sys.stderr.write("\n")


class progress_hook:  # noqa: N801 - used as a function in a `with` statement
    """The native load's ``progress(bytes_done)`` callable for a ``progress`` argument of the public API: False or
    None (none), True (:class:`_Progress`), or a callable taking ``(bytes_done, bytes_total)``."""

    def __init__(self, progress: Any, total: int, what: str):
        self._shown: "_Progress | None" = None
        if progress is None or progress is False:
            self.hook = None
        elif progress is True:
            self.hook = self._shown = _Progress(total, what)
        elif callable(progress):
            self.hook = lambda done: progress(done, total)
        else:
            raise InvalidArgumentError(f"progress {progress!r}: expected True, False or a callable (done, total)")

    def __enter__(self) -> Any:
        return self.hook

    def __exit__(self, *exc: Any) -> None:
        if self._shown is not None:
            self._shown.close()


# A report made in Python (a drop-in API saying which path served it) stands until the engine records a newer one:
# it is kept with the engine's report of the moment, and shown only while that is still the engine's latest.
_noted_lock = threading.Lock()
_noted: "tuple[Any, dict[str, Any]] | None" = None


def note_report(report: "dict[str, Any]") -> None:
    """Makes ``report`` what :func:`weightlift.last_report` returns until the engine reports a newer load."""
    global _noted
    snapshot = _native.last_report()
    with _noted_lock:
        _noted = (snapshot, dict(report))


def last_report() -> "dict[str, Any] | None":
    """The newest report: the engine's, or one noted by :func:`note_report` after it."""
    native = _native.last_report()
    with _noted_lock:
        if _noted is not None and _noted[0] == native:
            return dict(_noted[1])
    return native
