"""cuFile (NVIDIA GPUDirect Storage) from Python, in two forms, served on every machine.

**The functions of ``cuda.bindings.cufile``**, with their names, positional arguments and results: code written for
``from cuda.bindings import cufile`` runs after changing only the import to ``from weightlift import cufile``.
Pointers are integers (device pointers on a GPU, host addresses such as a numpy array's ``ctypes.data`` anywhere);
torch tensors, numpy arrays (``__array_interface__`` or ``__cuda_array_interface__``) and ctypes objects are
accepted as a convenience. Wherever a buffer's extent is known — such an object, or a registered buffer that holds
the address — every size and offset is checked against it before any byte moves (``CU_FILE_INVALID_VALUE``
otherwise). A bare integer address keeps cuFile's contract: the caller vouches that the bytes asked for are there.
File handles come from an fd:

>>> cufile.driver_open()
>>> fd = os.open("weights.bin", os.O_RDONLY | os.O_DIRECT)
>>> fh = cufile.handle_register(fd)
>>> cufile.buf_register(ptr, nbytes, cufile.CU_FILE_BUF_REGISTER_FLAGS_NONE)
>>> cufile.read(fh, ptr, nbytes, 0, 0)

- driver: ``driver_open``, ``driver_close`` (counted: the session ends with the last close), ``use_count``,
  ``get_version`` (the cuFile library's, where one is installed; ``cuFileError`` otherwise)
- handles: ``handle_register(descr)`` with ``descr`` an fd (as the weightlift reference shows it) or the address
  of a ``CUfileDescr_t`` such as ``Descr().ptr`` (as upstream builds it); ``handle_deregister(fh)``
- buffers: ``buf_register(devPtr_base, size, flags)``, ``buf_deregister(devPtr_base)``; ``read``/``write``/
  ``pread``/``pwrite`` also take memory that was never registered, as cuFile does
- I/O: ``read``/``write``/``pread``/``pwrite(fh, buf_ptr_base, size, file_offset, buf_ptr_offset)`` → bytes done
  (fewer at the end of the file); ``read_async``/``write_async(fh, buf_ptr_base, size, file_offset,
  buf_ptr_offset, bytes_read_ptr | bytes_written_ptr, stream)``; ``readv``/``writev(fh, iov, iovcnt, file_offset,
  bytes_ptr)`` over :class:`IOVec` entries, each with its own file offset (added to ``file_offset``) and buffer
  offset; batches ``batch_io_set_up(nr)``, ``batch_io_submit(batch, nr, iocbp, flags)``,
  ``batch_io_get_status(batch, min_nr, nr, iocbp, timeout)``, ``batch_io_cancel``, ``batch_io_destroy`` over
  :class:`IOParams` / :class:`IOEvents` (the ``CUfileIOParams_t`` / ``CUfileIOEvents_t`` layouts)
- ``get_file_properties(fh)`` → dict, ``set_file_properties(fh, props)``
- :class:`Status`, :class:`OpError`, :class:`FeatureFlags`, :class:`FileHandleType`, :class:`Opcode`,
  :class:`BatchMode`, :class:`BatchStatus`, ``CU_FILE_BUF_REGISTER_FLAGS_*``, :class:`cuFileError` (``.status``)

How it is served: through NVIDIA's cuFile (``NativeSession(use_cufile=True)``) when cuFile runs peer-to-peer here,
through weightlift's engine otherwise; :func:`weightlift.last_report` after a call says which (``path``) and why.
On the machines weightlift is tested on, cuFile exists only in compatibility mode (no nvidia-fs), so the engine
serves every call there. What differs from cuFile, and why:

- An fd is reached through ``/proc/self/fd/<fd>``: the session opens that link, so it reads and writes the file the
  descriptor names (even renamed or unlinked) with the descriptor's access mode (a read through a write-only fd
  fails with ``CU_FILE_PERMISSION_DENIED``); the fd must stay open while its handle is registered, as cuFile asks.
  An fd opened without ``O_DIRECT`` is served as cuFile serves it in compatibility mode; with or without it, offsets
  and sizes need no alignment (the engine chooses O_DIRECT or buffered reads itself).
- ``read_async``/``write_async`` first synchronise ``stream`` (the work queued before them is done), then run, store
  the byte count at ``bytes_read_ptr``/``bytes_written_ptr`` (host or device memory) and return: ordered on the
  stream as cuFile orders them, but not overlapping with the caller. Batches run on a background thread, entry
  after entry; ``batch_io_cancel`` cancels the entries not yet started and waits for the running one. Even where
  cuFile is active, batches and async calls go through cuFile's synchronous ``cuFileRead``/``cuFileWrite``:
  weightlift's cuFile binding does not load ``cuFileBatchIO*``, ``cuFileReadAsync`` or ``cuFileWriteAsync`` yet
  (native work in ``weightlift-cuda``).
- ``read``/``write`` return the bytes done as ``cuda.bindings`` does (the reference lists ``None``; code ignoring the
  result is unaffected). ``readv``/``writev`` and ``batch_io_get_status`` also return the count they store.
- Status codes are cufile.h's (``CU_FILE_INVALID_VALUE`` = 5022, ...); the reference's names that cufile.h lacks
  are aliases of the nearest code (``CU_FILE_INVALID_HANDLE`` = ``CU_FILE_HANDLE_NOT_REGISTERED``,
  ``CU_FILE_CUDA_MEMORY_TYPE_NOT_SUPPORTED`` = ``CU_FILE_CUDA_MEMORY_TYPE_INVALID``,
  ``CU_FILE_FILE_SYSTEM_NOT_SUPPORTED`` = ``CU_FILE_INVALID_FILE_TYPE``). ``OpError``, ``FeatureFlags`` and the
  ``CU_FILE_BUF_REGISTER_FLAGS_*`` constants have the reference's names with values chosen here (cufile.h has no
  such names). A failed engine read or write raises ``CU_FILE_IO_ERROR`` where cuda.bindings passes on the errno.
- Batch statuses (cufile.h's ``CUfileStatus_t``) are :class:`BatchStatus`: upstream calls that enumeration
  ``Status``, the name the reference gives to the error codes.

**A convenience class**, :class:`Session`, taking tensors and paths: a session, registered file handles and
buffers, ``read``/``write`` with buffer offsets, ``pread``/``pwrite``, asynchronous variants ordered on a CUDA
stream, batches with a status per entry, and vectored I/O into scattered buffers. Served by weightlift's engine
unless ``use_cufile=True`` routes device I/O through NVIDIA's cuFile, which fails if cuFile is missing.
``weightlift.probe()["cufile"]`` says whether cuFile runs peer-to-peer here or in compat mode.

>>> with Session() as s:
...     fh = s.register_handle("weights.bin", "r")
...     s.register_buffer(t)
...     n = s.read(fh, t, size=t.nbytes, file_offset=0, buf_offset=0)
"""

from __future__ import annotations

import ctypes
import enum
import fcntl
import os
import stat
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

from . import _args, _core, _native
from ._errors import (
    CudaError,
    InvalidArgumentError,
    IoError,
    NotARegularFileError,
    OutOfMemoryError,
    WeightliftError,
    WeightliftPermissionError,
    cuFileError,
)
from ._status import Status

if TYPE_CHECKING:
    import torch

PathLike = Union[str, "os.PathLike[str]"]


def _mem(tensor: "torch.Tensor") -> tuple[int, int, str]:
    if not tensor.is_contiguous():
        raise InvalidArgumentError("buffers must be contiguous tensors")
    return tensor.data_ptr(), tensor.numel() * tensor.element_size(), _core.normalize_device(tensor.device)


def _request(tensor: "torch.Tensor", size: "int | None", file_offset: int, buf_offset: int) -> tuple[int, int, int, int]:
    """(address, size, file offset, buffer offset) of a :class:`Session` request, each number checked and the
    request checked against the tensor's bytes before any byte moves; ``size`` None: the rest of the tensor."""
    base, nbytes, _ = _mem(tensor)
    buf_offset = _args.unsigned("buf_offset", buf_offset)
    size = max(nbytes - buf_offset, 0) if size is None else _args.unsigned("size", size)
    _args.span("the request", buf_offset, size, nbytes)
    return base, size, _args.unsigned("file_offset", file_offset), buf_offset


class AsyncIO:
    """An asynchronous read or write. With a stream, ``bytes_done`` is final once the stream is synchronised."""

    def __init__(self, native, keep: Any):
        self._native = native
        self._keep = keep
        self._result: "int | None" = None

    def done(self) -> bool:
        return self._result is not None or self._native.done()

    def wait(self) -> int:
        if self._result is None:
            self._result = self._native.wait()
            self._keep = None
        return self._result

    @property
    def bytes_done(self) -> int:
        """The bytes transferred (waits for the operation if it has not finished)."""
        return self.wait()


class Session:
    """``cuFileDriverOpen`` … ``cuFileDriverClose``: registrations live until deregistered or the session closes."""

    def __init__(self, use_cufile: bool = False):
        self._s = _native.NativeSession(use_cufile)
        self._buffers: dict[int, "torch.Tensor"] = {}

    @property
    def backend(self) -> str:
        return self._s.backend()

    def close(self) -> None:
        self._s.close()
        self._buffers.clear()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- registration ---------------------------------------------------------------------------------------
    def register_handle(self, path: PathLike, mode: str = "r") -> int:
        """``cuFileHandleRegister``: mode ``r``, ``w``, ``r+`` or ``w+``, with a trailing ``d`` for O_DIRECT
        semantics (requests must then be block-aligned)."""
        return self._s.handle_register(os.fspath(path), mode)

    def deregister_handle(self, fh: int) -> None:
        self._s.handle_deregister(fh)

    def register_buffer(self, tensor: "torch.Tensor") -> None:
        """``cuFileBufRegister`` for a contiguous host or GPU tensor (kept referenced until deregistered)."""
        base, nbytes, device = _mem(tensor)
        self._s.buf_register(base, nbytes, device)
        self._buffers[base] = tensor

    def deregister_buffer(self, tensor: "torch.Tensor") -> None:
        base = tensor.data_ptr()
        self._s.buf_deregister(base)
        self._buffers.pop(base, None)

    # -- synchronous I/O ------------------------------------------------------------------------------------
    def read(self, fh: int, tensor: "torch.Tensor", size: "int | None" = None, file_offset: int = 0, buf_offset: int = 0) -> int:
        """``cuFileRead`` into a registered buffer; returns the bytes read (fewer at the end of the file)."""
        base, size, file_offset, buf_offset = _request(tensor, size, file_offset, buf_offset)
        self._sync(tensor)
        return self._s.io("read", fh, base, size, file_offset, buf_offset)

    def write(self, fh: int, tensor: "torch.Tensor", size: "int | None" = None, file_offset: int = 0, buf_offset: int = 0) -> int:
        """``cuFileWrite`` from a registered buffer; returns the bytes written."""
        base, size, file_offset, buf_offset = _request(tensor, size, file_offset, buf_offset)
        self._sync(tensor)
        return self._s.io("write", fh, base, size, file_offset, buf_offset)

    def pread(self, fh: int, tensor: "torch.Tensor", file_offset: int = 0) -> int:
        """Reads into any contiguous tensor (registered or not); returns the bytes read."""
        base, nbytes, device = _mem(tensor)
        self._sync(tensor)
        return self._s.pio("read", fh, base, nbytes, _args.unsigned("file_offset", file_offset), device)

    def pwrite(self, fh: int, tensor: "torch.Tensor", file_offset: int = 0) -> int:
        """Writes any contiguous tensor (registered or not); returns the bytes written."""
        base, nbytes, device = _mem(tensor)
        self._sync(tensor)
        return self._s.pio("write", fh, base, nbytes, _args.unsigned("file_offset", file_offset), device)

    def readv(self, fh: int, tensors: Sequence["torch.Tensor"], file_offset: int = 0) -> int:
        """Consecutive file bytes into registered buffers, in order; returns the bytes read."""
        for t in tensors:
            self._sync(t)
        return self._s.vectored("read", fh, _args.unsigned("file_offset", file_offset), [_mem(t)[:2] for t in tensors])

    def writev(self, fh: int, tensors: Sequence["torch.Tensor"], file_offset: int = 0) -> int:
        """Registered buffers written one after another from ``file_offset``; returns the bytes written."""
        for t in tensors:
            self._sync(t)
        return self._s.vectored("write", fh, _args.unsigned("file_offset", file_offset), [_mem(t)[:2] for t in tensors])

    def batch(self, entries: Sequence[tuple]) -> list["int | WeightliftError"]:
        """``cuFileBatchIOSubmit``: entries ``(op, fh, tensor, size, file_offset, buf_offset)`` with op ``"read"``
        or ``"write"``; returns, per entry, its byte count or the exception it met."""
        raw = []
        for op, fh, tensor, size, file_offset, buf_offset in entries:
            self._sync(tensor)
            # Each entry is checked natively against its buffer's registration, and fails alone.
            raw.append((op, fh, tensor.data_ptr(), size, file_offset, buf_offset))
        return self._s.batch(raw)

    # -- asynchronous I/O -----------------------------------------------------------------------------------
    def read_async(self, fh: int, tensor: "torch.Tensor", size: int, file_offset: int = 0, buf_offset: int = 0, stream: Any = None) -> AsyncIO:
        """``cuFileReadAsync``: on ``stream`` (a ``torch.cuda.Stream`` of the tensor's device), the read starts after
        the work already queued there and later work on the stream sees its bytes."""
        return self._async("read", fh, tensor, size, file_offset, buf_offset, stream)

    def write_async(self, fh: int, tensor: "torch.Tensor", size: int, file_offset: int = 0, buf_offset: int = 0, stream: Any = None) -> AsyncIO:
        """``cuFileWriteAsync``: on ``stream``, the write starts after the work queued there (so it writes what the
        stream's kernels produced) and later work waits for it."""
        return self._async("write", fh, tensor, size, file_offset, buf_offset, stream)

    def _async(self, op, fh, tensor, size, file_offset, buf_offset, stream) -> AsyncIO:
        handle = None
        if stream is not None:
            handle = int(getattr(stream, "cuda_stream", stream))
        base, size, file_offset, buf_offset = _request(tensor, size, file_offset, buf_offset)
        native = self._s.submit_async(op, fh, base, size, file_offset, buf_offset, handle)
        return AsyncIO(native, tensor)

    def _sync(self, tensor: "torch.Tensor") -> None:
        # Work queued on the current stream may still use this memory.
        if tensor.is_cuda:
            _core.torch_module().cuda.current_stream(tensor.device).synchronize()


CuFileSession = Session


# ---------------------------------------------------------------------------------------------------------------
# The functions of cuda.bindings.cufile
# ---------------------------------------------------------------------------------------------------------------


class OpError(enum.IntEnum):
    """The reference's per-operation outcome codes (names as the reference gives them; values are weightlift's)."""

    CU_FILE_OP_SUCCESS = 0
    CU_FILE_OP_FAILED = 1
    CU_FILE_OP_INVALID_ARG = 2
    CU_FILE_OP_IO_FAILED = 3
    CU_FILE_OP_MEMORY_INVALID = 4
    CU_FILE_OP_PARTIAL_COMPLETION = 5


class FeatureFlags(enum.IntFlag):
    """What the session offers (``get_file_properties(fh)["features"]``)."""

    CU_FILE_FEATURE_GDS_SUPPORTED = 1
    CU_FILE_FEATURE_BATCH_IO_SUPPORTED = 2
    CU_FILE_FEATURE_ASYNC_IO_SUPPORTED = 4
    CU_FILE_FEATURE_VECTOR_IO_SUPPORTED = 8


class FileHandleType(enum.IntEnum):
    """``CUfileDescr_t.type`` (cufile.h's values)."""

    CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1
    CU_FILE_HANDLE_TYPE_OPAQUE_WIN32 = 2
    CU_FILE_HANDLE_TYPE_USERSPACE_FS = 3


class Opcode(enum.IntEnum):
    """``CUfileIOParams_t.opcode``."""

    READ = 0
    WRITE = 1


class BatchMode(enum.IntEnum):
    """``CUfileIOParams_t.mode``."""

    BATCH = 1


class BatchStatus(enum.IntEnum):
    """``CUfileIOEvents_t.status`` (cufile.h's ``CUfileStatus_t``)."""

    WAITING = 0x1
    PENDING = 0x2
    INVALID = 0x4
    CANCELED = 0x8
    COMPLETE = 0x10
    TIMEOUT = 0x20
    FAILED = 0x40


CU_FILE_BUF_REGISTER_FLAGS_NONE = 0
CU_FILE_BUF_REGISTER_FLAGS_READ_ONLY = 4
CU_FILE_BUF_REGISTER_FLAGS_WRITE_ONLY = 8
# cufile.h's own buffer flags (CU_FILE_RDMA_REGISTER, CU_FILE_RDMA_RELAXED_ORDERING) are accepted too.
_KNOWN_BUF_FLAGS = 1 | 2 | CU_FILE_BUF_REGISTER_FLAGS_READ_ONLY | CU_FILE_BUF_REGISTER_FLAGS_WRITE_ONLY
_MAX_BATCH = 128  # cuFile's default properties.io_batchsize


class IOVec:
    """One entry of :func:`readv` / :func:`writev`: ``size`` bytes between memory ``ptr + buf_offset`` and the file at
    ``file_offset`` (added to the call's ``file_offset``)."""

    def __init__(self, ptr: Any = 0, size: int = 0, file_offset: int = 0, buf_offset: int = 0):
        self.ptr = ptr
        self.size = size
        self.file_offset = file_offset
        self.buf_offset = buf_offset

    def __repr__(self) -> str:
        return f"IOVec(ptr={self.ptr!r}, size={self.size}, file_offset={self.file_offset}, buf_offset={self.buf_offset})"


# -- the C layouts, so that addresses of upstream-built structures work too --------------------------------------
class _CBatch(ctypes.Structure):
    _fields_ = [("devPtr_base", ctypes.c_void_p), ("file_offset", ctypes.c_int64), ("devPtr_offset", ctypes.c_int64), ("size", ctypes.c_size_t)]


class _CUnion(ctypes.Union):
    _fields_ = [("batch", _CBatch)]


class _CIOParams(ctypes.Structure):
    _fields_ = [("mode", ctypes.c_int), ("u", _CUnion), ("fh", ctypes.c_void_p), ("opcode", ctypes.c_int), ("cookie", ctypes.c_void_p)]


class _CIOEvents(ctypes.Structure):
    _fields_ = [("cookie", ctypes.c_void_p), ("status", ctypes.c_int), ("ret", ctypes.c_size_t)]


class _CHandle(ctypes.Union):
    _fields_ = [("fd", ctypes.c_int), ("handle", ctypes.c_void_p)]


class _CDescr(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("handle", _CHandle), ("fs_ops", ctypes.c_void_p)]


class _CTimespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _prop(field: str) -> property:
    """A Python attribute over field ``field`` of the ctypes structure ``self._c`` (pointers read as ints)."""

    def get(self):
        v = getattr(self._c, field)
        return 0 if v is None else v

    def set(self, value):
        setattr(self._c, field, int(value))

    return property(get, set)


class _Fields:
    __slots__ = ("_c", "_owner")

    def __init__(self, c, owner):
        self._c = c
        self._owner = owner  # keeps the memory alive


class _BatchFields(_Fields):
    dev_ptr_base = _prop("devPtr_base")
    file_offset = _prop("file_offset")
    dev_ptr_offset = _prop("devPtr_offset")
    size_ = _prop("size")


class _UFields(_Fields):
    @property
    def batch(self) -> _BatchFields:
        return _BatchFields(self._c.batch, self._owner)


class _IOParam(_Fields):
    mode = _prop("mode")
    fh = _prop("fh")
    opcode = _prop("opcode")
    cookie = _prop("cookie")

    @property
    def u(self) -> _UFields:
        return _UFields(self._c.u, self._owner)


class _IOEvent(_Fields):
    cookie = _prop("cookie")
    status = _prop("status")
    ret = _prop("ret")


class _Array:
    """An array of C structures with upstream's interface: ``len``, indexing, ``.ptr``; a one-element array's
    fields read and write as attributes of the array itself."""

    _ctype: Any
    _view: Any

    def __init__(self, size: int = 1):
        self._data = (self._ctype * int(size))()

    @property
    def ptr(self) -> int:
        """The address of the first structure."""
        return ctypes.addressof(self._data)

    def __int__(self) -> int:
        return self.ptr

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, i: int):
        return self._view(self._data[i], self)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._view(self._data[0], self), name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._view(self._data[0], self), name, value)


class IOParams(_Array):
    """``CUfileIOParams_t`` × ``size``: ``mode``, ``u.batch.dev_ptr_base / file_offset / dev_ptr_offset / size_``,
    ``fh``, ``opcode``, ``cookie``; pass ``.ptr`` (or the object) to :func:`batch_io_submit`."""

    _ctype = _CIOParams
    _view = _IOParam


class IOEvents(_Array):
    """``CUfileIOEvents_t`` × ``size``: ``cookie``, ``status`` (:class:`BatchStatus`), ``ret`` (bytes done, or minus a
    :class:`Status` code for a failed entry, as an unsigned value)."""

    _ctype = _CIOEvents
    _view = _IOEvent


class _HandleFields(_Fields):
    fd = _prop("fd")
    handle = _prop("handle")


class Descr:
    """``CUfileDescr_t``: ``type_`` (:class:`FileHandleType`), ``handle.fd``, ``fs_ops``; pass ``.ptr`` (or the
    object) to :func:`handle_register`."""

    def __init__(self) -> None:
        self._c = _CDescr()

    @property
    def ptr(self) -> int:
        return ctypes.addressof(self._c)

    def __int__(self) -> int:
        return self.ptr

    type_ = _prop("type")
    fs_ops = _prop("fs_ops")

    @property
    def handle(self) -> _HandleFields:
        return _HandleFields(self._c.handle, self)


# -- memory: addresses and where they live ----------------------------------------------------------------------
_NULL_PAGE = 1 << 16  # no mapping lies below this address (vm.mmap_min_addr): a smaller integer is a value


def _address(obj: Any) -> tuple[int, Optional[str], Optional[int]]:
    """(address, device string or None when only the address is known, bytes from the address or None when only
    the address is known) of a pointer-like argument."""
    if isinstance(obj, bool):
        raise TypeError("a pointer is expected, not a bool")
    if isinstance(obj, int):
        return obj, None, None
    t = sys.modules.get("torch")  # a tensor can only come from an imported torch
    if t is not None and isinstance(obj, t.Tensor):
        if not obj.is_contiguous():
            raise _invalid_value("a buffer tensor must be contiguous")
        if obj.is_cuda:
            t.cuda.current_stream(obj.device).synchronize()
        return obj.data_ptr(), _core.normalize_device(obj.device), obj.numel() * obj.element_size()
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0]), None, _interface_bytes(cai)
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None:
        return int(ai["data"][0]), "cpu", _interface_bytes(ai)
    if isinstance(obj, (ctypes._SimpleCData, ctypes.Array, ctypes.Structure, ctypes.Union)):
        return ctypes.addressof(obj), "cpu", ctypes.sizeof(obj)
    if hasattr(obj, "ptr"):
        return int(obj.ptr), None, None
    return int(obj), None, None  # e.g. cuda-python's CUdeviceptr


def _interface_bytes(iface: dict) -> int:
    """The bytes of a contiguous array described by an array interface (numpy's or CUDA's)."""
    if iface.get("strides") is not None:
        raise _invalid_value("a buffer array must be C-contiguous")
    import numpy as np  # the typestr is numpy's notation

    n = np.dtype(iface["typestr"]).itemsize
    for d in iface["shape"]:
        n *= int(d)
    return n


_libcuda: "ctypes.CDLL | None | bool" = False


def _cuda() -> "ctypes.CDLL | None":
    """The CUDA driver library, if CUDA is usable here."""
    global _libcuda
    if _libcuda is False:
        _libcuda = None
        if _native.cuda_status()[0]:
            try:
                _libcuda = ctypes.CDLL("libcuda.so.1")
            except OSError:
                _libcuda = None
    return _libcuda  # type: ignore[return-value]


def _device_of(addr: int) -> str:
    """``cuda:N`` for device memory of GPU N, ``cpu`` for host memory (pinned or not)."""
    cuda = _cuda()
    if cuda is None:
        return "cpu"
    kind, ordinal = ctypes.c_uint(0), ctypes.c_int(0)
    # CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2, CU_MEMORYTYPE_DEVICE = 2, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
    if cuda.cuPointerGetAttribute(ctypes.byref(kind), 2, ctypes.c_uint64(addr)) != 0 or kind.value != 2:
        return "cpu"
    if cuda.cuPointerGetAttribute(ctypes.byref(ordinal), 9, ctypes.c_uint64(addr)) != 0:
        raise cuFileError(Status.CU_FILE_CUDA_POINTER_INVALID, f"cannot tell the device of {addr:#x}")
    return f"cuda:{ordinal.value}"


def _store_count(ptr: Any, n: int) -> None:
    """Writes ``n`` as a 64-bit integer at ``ptr`` (host or device memory); nothing for a null pointer."""
    if ptr is None:
        return
    addr, device, extent = _address(ptr)
    if addr == 0:
        return
    if extent is not None:
        _args.span("byte count", 0, 8, extent, _invalid_value)
    device = device or _device_of(addr)
    if device.startswith("cuda"):
        value = ctypes.c_int64(n)
        if _cuda().cuMemcpyHtoD_v2(ctypes.c_uint64(addr), ctypes.byref(value), ctypes.c_size_t(8)) != 0:
            raise cuFileError(Status.CU_FILE_CUDA_DRIVER_ERROR, f"cannot store the byte count at {addr:#x}")
    else:
        ctypes.c_int64.from_address(addr).value = n


def _sync_stream(stream: Any) -> None:
    """Waits for the work queued on ``stream`` (a CUstream handle, 0 for the default stream, or a torch stream)."""
    if hasattr(stream, "synchronize"):
        stream.synchronize()
        return
    handle = 0 if stream is None else int(getattr(stream, "cuda_stream", stream))
    cuda = _cuda()
    if cuda is None:
        if handle != 0:
            raise cuFileError(Status.CU_FILE_INVALID_VALUE, f"stream {handle:#x} given but CUDA is unavailable here")
        return
    if cuda.cuStreamSynchronize(ctypes.c_void_p(handle)) != 0:
        raise cuFileError(Status.CU_FILE_CUDA_DRIVER_ERROR, f"cuStreamSynchronize({handle:#x}) failed")


# -- the driver's state -------------------------------------------------------------------------------------------
class _FileHandle:
    """A registered handle as the native session records it."""

    def __init__(self, fh: int, path: str, readable: bool, writable: bool):
        self.fh = fh
        self.fd = int(os.path.basename(path))  # registered as /proc/self/fd/<fd> by handle_register
        self.readable = readable
        self.writable = writable


class _Driver:
    """The open count and the batches; handles and buffers are the native session's (one registry)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.session: "Any | None" = None
        self.opens = 0
        self.batches: dict[int, "_Batch"] = {}
        self.next_id = 0x10000  # batch ids


_driver = _Driver()


def _route() -> tuple[str, str]:
    """(``"cufile"`` or ``"engine"``, why), decided once per process."""
    return _core.cufile_route()


def _status_of(e: WeightliftError) -> int:
    """The cuFile status standing for a weightlift error (cuFile's own where it raised one)."""
    code = getattr(e, "status", None)
    if isinstance(code, int) and code > 0:
        return code
    for cls, status in (
        (WeightliftPermissionError, Status.CU_FILE_PERMISSION_DENIED),
        (NotARegularFileError, Status.CU_FILE_INVALID_FILE_TYPE),
        (OutOfMemoryError, Status.CU_FILE_NOMEM_ERROR),
        (CudaError, Status.CU_FILE_CUDA_DRIVER_ERROR),
        (IoError, Status.CU_FILE_IO_ERROR),
        (InvalidArgumentError, Status.CU_FILE_INVALID_VALUE),
    ):
        if isinstance(e, cls):
            return status
    return Status.CU_FILE_INTERNAL_ERROR


def _session():
    """The driver's session, opening the driver implicitly on first use as cuFile does."""
    with _driver.lock:
        if _driver.session is None:
            path, why = _route()
            try:
                _driver.session = _native.NativeSession(path == "cufile")
            except WeightliftError as e:
                raise cuFileError(Status.CU_FILE_DRIVER_NOT_INITIALIZED, f"{e} ({why})") from e
        return _driver.session


def _new_id() -> int:
    with _driver.lock:
        _driver.next_id += 1
        return _driver.next_id


def driver_open() -> None:
    """Opens the driver (``cuFileDriverOpen``); calls are counted and the last :func:`driver_close` ends it."""
    with _driver.lock:
        _session()
        _driver.opens += 1


def driver_close() -> None:
    """Closes the driver (``cuFileDriverClose``): the last close deregisters every handle and buffer."""
    with _driver.lock:
        if _driver.session is None:
            raise cuFileError(Status.CU_FILE_DRIVER_NOT_INITIALIZED, "the driver is not open")
        _driver.opens = max(_driver.opens - 1, 0)
        if _driver.opens:
            return
        batches = list(_driver.batches.values())
        session, _driver.session = _driver.session, None
        _driver.batches.clear()
    for b in batches:
        b.cancel()
    session.close()


def use_count() -> int:
    """How many :func:`driver_open` calls are not closed yet (``cuFileUseCount``; an implicit open counts none)."""
    return _driver.opens


def get_version() -> int:
    """The cuFile library's version (``cuFileGetVersion``, e.g. 1150 for 1.15); raises :class:`cuFileError`
    ``CU_FILE_PLATFORM_NOT_SUPPORTED`` where no cuFile library is installed or its driver cannot open."""
    info = _native.probe(None).get("cufile", {})
    version = info.get("version")
    if not info.get("found") or version is None:
        raise cuFileError(Status.CU_FILE_PLATFORM_NOT_SUPPORTED, f"no cuFile library here ({info.get('error') or info.get('mode')})")
    return int(version)


# -- handles ------------------------------------------------------------------------------------------------------
def _fd_of(descr: Any) -> int:
    if isinstance(descr, Descr):
        c = descr._c
    elif isinstance(descr, int) and not isinstance(descr, bool) and descr >= _NULL_PAGE:
        c = _CDescr.from_address(descr)
    else:
        return int(descr)
    if c.type != FileHandleType.CU_FILE_HANDLE_TYPE_OPAQUE_FD:
        raise cuFileError(Status.CU_FILE_INVALID_VALUE, f"descriptor type {c.type}: only CU_FILE_HANDLE_TYPE_OPAQUE_FD is served")
    return c.handle.fd


def handle_register(descr: Any) -> int:
    """Registers a file (``cuFileHandleRegister``): ``descr`` is an fd, or a :class:`Descr` (or its ``.ptr``) holding
    one. Returns the handle for the I/O calls."""
    fd = _fd_of(descr)
    try:
        mode = os.fstat(fd).st_mode
        access = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
    except OSError as e:
        raise cuFileError(Status.CU_FILE_INVALID_VALUE, f"fd {fd}: {e.strerror}") from e
    if not stat.S_ISREG(mode):
        raise cuFileError(Status.CU_FILE_INVALID_FILE_TYPE, f"fd {fd} is not a regular file")
    session = _session()
    with _driver.lock:
        if session.handle_of_fd(fd) is not None:
            raise cuFileError(Status.CU_FILE_HANDLE_ALREADY_REGISTERED, f"fd {fd} is registered already")
        try:
            return session.handle_register_fd(fd, access != os.O_WRONLY, access != os.O_RDONLY)
        except WeightliftError as e:
            raise cuFileError(_status_of(e), str(e)) from e


def handle_deregister(fh: int) -> None:
    """Deregisters a handle (``cuFileHandleDeregister``; like it, an unknown handle is ignored)."""
    with _driver.lock:
        session = _driver.session
    if session is not None:
        try:
            session.handle_deregister(int(fh))
        except WeightliftError:
            pass


def _handle(fh: Any) -> _FileHandle:
    with _driver.lock:
        session = _driver.session
    try:
        if session is None:
            raise InvalidArgumentError("the driver is not open")
        path, readable, writable = session.handle_info(int(fh))
    except (WeightliftError, OverflowError) as e:
        raise cuFileError(Status.CU_FILE_INVALID_HANDLE, f"file handle {fh} is not registered") from e
    return _FileHandle(int(fh), path, readable, writable)


# -- buffers ------------------------------------------------------------------------------------------------------
def buf_register(devPtr_base: Any, size: int, flags: int) -> None:  # noqa: N803 - the reference's argument name
    """Registers ``size`` bytes at ``devPtr_base`` (device or host memory) for I/O (``cuFileBufRegister``)."""
    base, device, extent = _address(devPtr_base)
    size = _unsigned("size", size)
    if extent is not None:
        _args.span("buf_register", 0, size, extent, _invalid_value)
    if flags & ~_KNOWN_BUF_FLAGS:
        raise cuFileError(Status.CU_FILE_INVALID_VALUE, f"unknown buffer flags {flags:#x}")
    if base == 0 or size == 0:
        raise cuFileError(Status.CU_FILE_INVALID_VALUE, "a buffer needs an address and a size")
    device = device or _device_of(base)
    session = _session()
    with _driver.lock:
        b = session.buffer_overlapping(base, size)
        if b is not None:
            raise cuFileError(Status.CU_FILE_MEMORY_ALREADY_REGISTERED, f"{base:#x}+{size} overlaps the buffer at {b:#x}")
        try:
            session.buf_register(base, size, device)
        except WeightliftError as e:
            raise cuFileError(_status_of(e), str(e)) from e


def buf_deregister(devPtr_base: Any) -> None:  # noqa: N803
    """Deregisters a buffer registered by :func:`buf_register` (``cuFileBufDeregister``)."""
    base = _address(devPtr_base)[0]
    with _driver.lock:
        session = _driver.session
        if session is None or session.buffer(base) is None:
            raise cuFileError(Status.CU_FILE_MEMORY_NOT_REGISTERED, f"no buffer is registered at {base:#x}")
        session.buf_deregister(base)


# -- I/O ----------------------------------------------------------------------------------------------------------
class _ValueStatusError(cuFileError, InvalidArgumentError, OverflowError):
    """``CU_FILE_INVALID_VALUE`` for an argument out of range: a :class:`cuFileError`, a ``ValueError`` (as every
    weightlift error about a value), and the ``OverflowError`` cuda.bindings raises for a negative ``size_t``."""


def _invalid_value(message: str) -> cuFileError:
    return _ValueStatusError(Status.CU_FILE_INVALID_VALUE, message)


def _unsigned(name: str, value: Any) -> int:
    return _args.unsigned(name, value, _invalid_value)


def _bounds(base: int, extent: Optional[int], session: Any) -> Optional[int]:
    """The bytes known to lie from ``base``: those of a registered buffer holding it, else ``extent`` (the size of
    the tensor or array passed), else None (a bare address: the caller vouches for it, as cuFile's contract is)."""
    b = session.buffer_overlapping(base, 1)
    if b is not None:
        return b + session.buffer(b)[0] - base
    return extent


class _Request:
    """One checked read or write, ready to run."""

    __slots__ = ("op", "h", "base", "size", "file_offset", "buf_offset", "device", "registered")

    def __init__(self, op: str, fh: Any, buf_ptr_base: Any, size: Any, file_offset: Any, buf_ptr_offset: Any):
        self.op = op
        self.h = h = _handle(fh)
        self.size, self.file_offset = _unsigned("size", size), _unsigned("file_offset", file_offset)
        self.buf_offset = _unsigned("buf_ptr_offset", buf_ptr_offset)
        if not (h.readable if op == "read" else h.writable):
            raise cuFileError(Status.CU_FILE_PERMISSION_DENIED, f"fd {h.fd} is not open for {'reading' if op == 'read' else 'writing'}")
        self.base, device, extent = _address(buf_ptr_base)
        session = _session()
        registered = session.buffer(self.base)
        extent = _bounds(self.base, extent, session)
        if extent is not None:
            _args.span(self.call, self.buf_offset, self.size, extent, _invalid_value)
        self.registered = registered is not None
        self.device = registered[1] if registered is not None else device or _device_of(self.base)

    @property
    def call(self) -> str:
        return "cuFileRead" if self.op == "read" else "cuFileWrite"

    def run(self) -> int:
        session = _session()
        try:
            if self.registered:
                n = session.io(self.op, self.h.fh, self.base, self.size, self.file_offset, self.buf_offset)
            else:
                n = session.pio(self.op, self.h.fh, self.base + self.buf_offset, self.size, self.file_offset, self.device)
        except WeightliftError as e:
            raise cuFileError(_status_of(e), str(e)) from e
        path, why = _route()
        if path == "cufile" and not self.device.startswith("cuda"):
            path, why = "engine", "host memory: cuFile serves device memory only here"
        report = {"api": "cuda.bindings.cufile", "call": self.call, "path": path, "path_why": why, "backend": session.backend()}
        _core.note_report({**report, "bytes": n, "fd": self.h.fd, "offset": self.file_offset})
        return n


def _io(op: str, fh: Any, buf_ptr_base: Any, size: Any, file_offset: Any, buf_ptr_offset: Any) -> int:
    """The one place an I/O call is checked and served: every number, and every size and offset against the
    buffer wherever its extent is known (a registered buffer, a tensor, an array), before a byte moves."""
    return _Request(op, fh, buf_ptr_base, size, file_offset, buf_ptr_offset).run()


def read(fh: int, buf_ptr_base: Any, size: int, file_offset: int, buf_ptr_offset: int) -> int:
    """``cuFileRead``: up to ``size`` bytes at ``file_offset`` into ``buf_ptr_base + buf_ptr_offset``; returns the
    bytes read (fewer at the end of the file, 0 past it). ``buf_ptr_offset + size`` must fit in the buffer where
    its extent is known (a tensor, an array, a registered buffer); a bare address is taken on the caller's word."""
    return _io("read", fh, buf_ptr_base, size, file_offset, buf_ptr_offset)


def write(fh: int, buf_ptr_base: Any, size: int, file_offset: int, buf_ptr_offset: int) -> int:
    """``cuFileWrite``: ``size`` bytes of ``buf_ptr_base + buf_ptr_offset`` into the file at ``file_offset``; returns
    the bytes written."""
    return _io("write", fh, buf_ptr_base, size, file_offset, buf_ptr_offset)


def pread(fh: int, buf_ptr_base: Any, size: int, file_offset: int, buf_ptr_offset: int) -> int:
    """:func:`read`, returning the bytes read."""
    return _io("read", fh, buf_ptr_base, size, file_offset, buf_ptr_offset)


def pwrite(fh: int, buf_ptr_base: Any, size: int, file_offset: int, buf_ptr_offset: int) -> int:
    """:func:`write`, returning the bytes written."""
    return _io("write", fh, buf_ptr_base, size, file_offset, buf_ptr_offset)


def read_async(fh: int, buf_ptr_base: Any, size: int, file_offset: int, buf_ptr_offset: int, bytes_read_ptr: Any, stream: Any) -> None:
    """``cuFileReadAsync`` ordered on ``stream``: after the work queued there, reads as :func:`read` and stores the
    byte count (int64) at ``bytes_read_ptr`` (host or device memory; 0 for none). Done when it returns."""
    _sync_stream(stream)
    _store_count(bytes_read_ptr, _io("read", fh, buf_ptr_base, size, file_offset, buf_ptr_offset))


def write_async(fh: int, buf_ptr_base: Any, size: int, file_offset: int, buf_ptr_offset: int, bytes_written_ptr: Any, stream: Any) -> None:
    """``cuFileWriteAsync`` ordered on ``stream``: after the work queued there (so it writes what that work
    produced), writes as :func:`write` and stores the byte count at ``bytes_written_ptr``."""
    _sync_stream(stream)
    _store_count(bytes_written_ptr, _io("write", fh, buf_ptr_base, size, file_offset, buf_ptr_offset))


def _vectored(op: str, fh: int, iov: Sequence[IOVec], iovcnt: int, file_offset: int, bytes_ptr: Any) -> int:
    iovcnt, file_offset = _unsigned("iovcnt", iovcnt), _unsigned("file_offset", file_offset)
    if iovcnt > len(iov):
        raise _invalid_value(f"iovcnt {iovcnt} but {len(iov)} entries")
    # Every entry checked before the first moves a byte.
    requests = [_Request(op, fh, v.ptr, v.size, file_offset + _unsigned("file_offset", v.file_offset), v.buf_offset) for v in list(iov)[:iovcnt]]
    total = sum(r.run() for r in requests)
    _store_count(bytes_ptr, total)
    return total


def readv(fh: int, iov: Sequence[IOVec], iovcnt: int, file_offset: int, bytes_read_ptr: Any) -> int:
    """Reads the first ``iovcnt`` entries of ``iov`` (each at ``file_offset + entry.file_offset`` into
    ``entry.ptr + entry.buf_offset``); stores the total at ``bytes_read_ptr`` and returns it."""
    return _vectored("read", fh, iov, iovcnt, file_offset, bytes_read_ptr)


def writev(fh: int, iov: Sequence[IOVec], iovcnt: int, file_offset: int, bytes_written_ptr: Any) -> int:
    """Writes the first ``iovcnt`` entries of ``iov``; stores the total at ``bytes_written_ptr`` and returns it."""
    return _vectored("write", fh, iov, iovcnt, file_offset, bytes_written_ptr)


# -- properties ---------------------------------------------------------------------------------------------------
def get_file_properties(fh: int) -> dict:
    """What a handle offers: ``fd``, ``size``, ``readable``, ``writable``, ``direct_io`` (the fd has O_DIRECT),
    ``path`` (``engine`` or ``cufile``) and why, ``peer_to_peer``, ``features`` (:class:`FeatureFlags`)."""
    h = _handle(fh)
    path, why = _route()
    features = FeatureFlags.CU_FILE_FEATURE_BATCH_IO_SUPPORTED | FeatureFlags.CU_FILE_FEATURE_ASYNC_IO_SUPPORTED | FeatureFlags.CU_FILE_FEATURE_VECTOR_IO_SUPPORTED
    if path == "cufile":
        features |= FeatureFlags.CU_FILE_FEATURE_GDS_SUPPORTED
    return {
        "fd": h.fd,
        "size": os.fstat(h.fd).st_size,
        "readable": h.readable,
        "writable": h.writable,
        "direct_io": bool(fcntl.fcntl(h.fd, fcntl.F_GETFL) & os.O_DIRECT),
        "path": path,
        "path_why": why,
        "peer_to_peer": path == "cufile",
        "features": features,
    }


def set_file_properties(fh: int, props: dict) -> None:
    """Sets a handle's properties: ``direct_io`` (sets or clears O_DIRECT on the fd) is the one that can change;
    any other key raises :class:`cuFileError` ``CU_FILE_INVALID_VALUE``."""
    h = _handle(fh)
    for key, value in props.items():
        if key != "direct_io":
            raise cuFileError(Status.CU_FILE_INVALID_VALUE, f"property {key!r} cannot be set")
        flags = fcntl.fcntl(h.fd, fcntl.F_GETFL)
        try:
            fcntl.fcntl(h.fd, fcntl.F_SETFL, flags | os.O_DIRECT if value else flags & ~os.O_DIRECT)
        except OSError as e:
            raise cuFileError(Status.CU_FILE_INVALID_FILE_OPEN_FLAG, f"fd {h.fd}: O_DIRECT refused: {e.strerror}") from e


# -- batches ------------------------------------------------------------------------------------------------------
class _Batch:
    """Submitted entries run on a background thread, one after another; completions wait to be reaped, and hold
    their slot of the batch until then."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.cond = threading.Condition()
        self.in_flight = 0  # submitted, not completed
        self.unreaped = 0  # submitted, not reaped by get_status: what occupies the batch's slots
        self.done: list[tuple[int, int, int]] = []  # (cookie, BatchStatus, ret)
        self.cancelled = False
        self.workers: list[threading.Thread] = []

    def submit(self, entries: list[tuple]) -> None:
        with self.cond:
            if self.unreaped + len(entries) > self.capacity:
                raise cuFileError(Status.CU_FILE_BATCH_FULL, f"{self.unreaped} entries not reaped, {len(entries)} more exceed the batch's {self.capacity}")
            self.in_flight += len(entries)
            self.unreaped += len(entries)
        worker = threading.Thread(target=self._run, args=(entries,), name="weightlift-cufile-batch", daemon=True)
        self.workers.append(worker)
        worker.start()

    def _run(self, entries: list[tuple]) -> None:
        for opcode, fh, base, size, file_offset, buf_offset, cookie in entries:
            with self.cond:
                cancelled = self.cancelled
            if cancelled:
                event = (cookie, BatchStatus.CANCELED, 0)
            else:
                try:
                    op = "read" if opcode == Opcode.READ else "write"
                    event = (cookie, BatchStatus.COMPLETE, _io(op, fh, base, size, file_offset, buf_offset))
                except cuFileError as e:
                    event = (cookie, BatchStatus.FAILED, -int(e.status))
                except (WeightliftError, OverflowError) as e:
                    status = _status_of(e) if isinstance(e, WeightliftError) else Status.CU_FILE_INVALID_VALUE
                    event = (cookie, BatchStatus.FAILED, -int(status))
            with self.cond:
                self.in_flight -= 1
                self.done.append(event)
                self.cond.notify_all()

    def reap(self, min_nr: int, max_nr: int, deadline: Optional[float]) -> list[tuple[int, int, int]]:
        with self.cond:
            while len(self.done) < min(min_nr, len(self.done) + self.in_flight):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self.cond.wait(left)
            out, self.done = self.done[:max_nr], self.done[max_nr:]
            self.unreaped -= len(out)
            return out

    def cancel(self) -> None:
        with self.cond:
            self.cancelled = True
        for w in self.workers:
            w.join()


def _batch(batch_idp: int) -> _Batch:
    with _driver.lock:
        b = _driver.batches.get(int(batch_idp))
    if b is None:
        raise cuFileError(Status.CU_FILE_INVALID_VALUE, f"batch {batch_idp} is not set up")
    return b


def _count_arg(value: Any) -> tuple[int, Optional[Any]]:
    """(the count, where to store the result) of a ``nr`` argument: an ``unsigned*`` address, a ctypes or numpy
    holder of the count, or the count itself."""
    if isinstance(value, int) and value >= _NULL_PAGE:
        cell = ctypes.c_uint.from_address(value)
        return cell.value, cell
    if isinstance(value, ctypes._SimpleCData):
        return int(value.value), value
    if hasattr(value, "__array_interface__"):
        cell = ctypes.c_uint.from_address(int(value.__array_interface__["data"][0]))
        return cell.value, cell
    return int(value), None


def _deadline(timeout: Any) -> Optional[float]:
    """When to stop waiting: ``timeout`` is a ``timespec*`` address, an object with ``tv_sec``/``tv_nsec``, a
    number of seconds, or None / 0 (wait for ``min_nr`` completions)."""
    if timeout is None or (isinstance(timeout, int) and timeout == 0):
        return None
    if isinstance(timeout, int) and timeout >= _NULL_PAGE:
        timeout = _CTimespec.from_address(timeout)
    if hasattr(timeout, "tv_sec"):
        seconds = timeout.tv_sec + timeout.tv_nsec / 1e9
    else:
        seconds = float(timeout)
    return time.monotonic() + seconds


def batch_io_set_up(nr: int) -> int:
    """A batch of up to ``nr`` entries in flight (``cuFileBatchIOSetUp``; at most 128, cuFile's default
    ``io_batchsize``); returns its id."""
    nr = _unsigned("nr", nr)
    if not 0 < nr <= _MAX_BATCH:
        raise cuFileError(Status.CU_FILE_INVALID_VALUE, f"batch size {nr}: expected 1 to {_MAX_BATCH}")
    _session()
    batch_id = _new_id()
    with _driver.lock:
        _driver.batches[batch_id] = _Batch(nr)
    return batch_id


def batch_io_submit(batch_idp: int, nr: int, iocbp: Any, flags: int) -> None:
    """Submits the first ``nr`` entries of ``iocbp`` (an :class:`IOParams` or the address of ``CUfileIOParams_t``
    structures) to run in the background (``cuFileBatchIOSubmit``); the entries are copied, ``flags`` is unused."""
    b = _batch(batch_idp)
    nr = _unsigned("nr", nr)
    if isinstance(iocbp, IOParams):
        if nr > len(iocbp):
            raise cuFileError(Status.CU_FILE_INVALID_VALUE, f"nr {nr} but {len(iocbp)} entries")
        params = iocbp._data
    else:
        params = (_CIOParams * nr).from_address(_address(iocbp)[0])
    entries = []
    for i in range(nr):
        p = params[i]
        if p.mode != BatchMode.BATCH or p.opcode not in (Opcode.READ, Opcode.WRITE):
            raise cuFileError(Status.CU_FILE_INVALID_VALUE, f"entry {i}: mode {p.mode}, opcode {p.opcode}")
        fh = p.fh or 0
        _handle(fh)
        batch = p.u.batch
        entries.append((p.opcode, fh, batch.devPtr_base or 0, batch.size, batch.file_offset, batch.devPtr_offset, p.cookie or 0))
    b.submit(entries)


def batch_io_get_status(batch_idp: int, min_nr: int, nr: Any, iocbp: Any, timeout: Any) -> int:
    """Reaps completed entries (``cuFileBatchIOGetStatus``): waits for ``min_nr`` of them (until ``timeout``), then
    fills up to ``nr`` :class:`IOEvents` at ``iocbp`` and stores how many at ``nr`` (an ``unsigned*``); returns
    that count too."""
    b = _batch(batch_idp)
    max_nr, cell = _count_arg(nr)
    if min_nr > max_nr:
        raise cuFileError(Status.CU_FILE_INVALID_VALUE, f"min_nr {min_nr} > nr {max_nr}")
    if isinstance(iocbp, IOEvents):
        max_nr = min(max_nr, len(iocbp))
        events = iocbp._data
    else:
        events = (_CIOEvents * max_nr).from_address(_address(iocbp)[0])
    reaped = b.reap(min_nr, max_nr, _deadline(timeout))
    for i, (cookie, status, ret) in enumerate(reaped):
        events[i].cookie, events[i].status, events[i].ret = cookie, status, ret & 0xFFFF_FFFF_FFFF_FFFF
    if cell is not None:
        cell.value = len(reaped)
    return len(reaped)


def batch_io_cancel(batch_idp: int) -> None:
    """Cancels the entries not started yet (they complete as ``BatchStatus.CANCELED``) and waits for the running
    one (``cuFileBatchIOCancel``)."""
    _batch(batch_idp).cancel()


def batch_io_destroy(batch_idp: int) -> None:
    """Cancels what is left and forgets the batch (``cuFileBatchIODestroy``; an unknown id is ignored)."""
    with _driver.lock:
        b = _driver.batches.pop(int(batch_idp), None)
    if b is not None:
        b.cancel()
