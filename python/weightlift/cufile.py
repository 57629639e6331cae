"""cuFile-style API (NVIDIA GPUDirect Storage's shape) on every machine: a session, registered file handles and
buffers, ``read``/``write`` with buffer offsets, ``pread``/``pwrite``, asynchronous variants ordered on a CUDA
stream, batches with a status per entry, and vectored I/O into scattered buffers.

Served by weightlift's engine (io_uring, pinned ring) unless ``use_cufile=True`` routes device I/O through
NVIDIA's cuFile, which fails if cuFile is missing. ``weightlift.probe()["cufile"]`` says whether cuFile runs
peer-to-peer here or in compat mode.

>>> with Session() as s:
...     fh = s.register_handle("weights.bin", "r")
...     s.register_buffer(t)
...     n = s.read(fh, t, size=t.nbytes, file_offset=0, buf_offset=0)
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence, Union

from . import _core, _native
from ._errors import InvalidArgumentError, WeightliftError

if TYPE_CHECKING:
    import torch

PathLike = Union[str, "os.PathLike[str]"]


def _mem(tensor: "torch.Tensor") -> tuple[int, int, str]:
    if not tensor.is_contiguous():
        raise InvalidArgumentError("buffers must be contiguous tensors")
    return tensor.data_ptr(), tensor.numel() * tensor.element_size(), _core.normalize_device(tensor.device)


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
        base, nbytes, _ = _mem(tensor)
        size = nbytes - buf_offset if size is None else size
        self._sync(tensor)
        return self._s.io("read", fh, base, size, file_offset, buf_offset)

    def write(self, fh: int, tensor: "torch.Tensor", size: "int | None" = None, file_offset: int = 0, buf_offset: int = 0) -> int:
        """``cuFileWrite`` from a registered buffer; returns the bytes written."""
        base, nbytes, _ = _mem(tensor)
        size = nbytes - buf_offset if size is None else size
        self._sync(tensor)
        return self._s.io("write", fh, base, size, file_offset, buf_offset)

    def pread(self, fh: int, tensor: "torch.Tensor", file_offset: int = 0) -> int:
        """Reads into any contiguous tensor (registered or not); returns the bytes read."""
        base, nbytes, device = _mem(tensor)
        self._sync(tensor)
        return self._s.pio("read", fh, base, nbytes, file_offset, device)

    def pwrite(self, fh: int, tensor: "torch.Tensor", file_offset: int = 0) -> int:
        """Writes any contiguous tensor (registered or not); returns the bytes written."""
        base, nbytes, device = _mem(tensor)
        self._sync(tensor)
        return self._s.pio("write", fh, base, nbytes, file_offset, device)

    def readv(self, fh: int, tensors: Sequence["torch.Tensor"], file_offset: int = 0) -> int:
        """Consecutive file bytes into registered buffers, in order; returns the bytes read."""
        for t in tensors:
            self._sync(t)
        return self._s.vectored("read", fh, file_offset, [_mem(t)[:2] for t in tensors])

    def writev(self, fh: int, tensors: Sequence["torch.Tensor"], file_offset: int = 0) -> int:
        """Registered buffers written one after another from ``file_offset``; returns the bytes written."""
        for t in tensors:
            self._sync(t)
        return self._s.vectored("write", fh, file_offset, [_mem(t)[:2] for t in tensors])

    def batch(self, entries: Sequence[tuple]) -> list["int | WeightliftError"]:
        """``cuFileBatchIOSubmit``: entries ``(op, fh, tensor, size, file_offset, buf_offset)`` with op ``"read"``
        or ``"write"``; returns, per entry, its byte count or the exception it met."""
        raw = []
        for op, fh, tensor, size, file_offset, buf_offset in entries:
            self._sync(tensor)
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
        native = self._s.submit_async(op, fh, tensor.data_ptr(), size, file_offset, buf_offset, handle)
        return AsyncIO(native, tensor)

    def _sync(self, tensor: "torch.Tensor") -> None:
        # Work queued on the current stream may still use this memory.
        if tensor.is_cuda:
            _core.torch_module().cuda.current_stream(tensor.device).synchronize()


CuFileSession = Session
