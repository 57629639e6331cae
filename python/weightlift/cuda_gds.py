"""Drop-in for ``torch.cuda.gds``: ``gds_register_buffer``, ``gds_deregister_buffer`` and ``GdsFile(filename, flags)``
with the same names, arguments, defaults, attributes (``fd``, ``handle``, ``filename``, ``flags``) and behaviour:

- ``GdsFile`` opens ``filename`` with ``os.open(filename, flags | os.O_DIRECT)`` (so a filesystem refusing
  O_DIRECT raises the same ``OSError``) and registers the descriptor; the file is closed when the object goes.
- ``register_handle`` on a registered file, ``deregister_handle``, ``load_storage`` or ``save_storage`` on an
  unregistered one raise ``AssertionError``, as torch's asserts do.
- ``load_storage(storage, offset=0)`` reads ``storage.nbytes()`` bytes at ``offset``; like torch's ``cuFileRead``
  call it does not fail on a short read (bytes past the end of the file are left as they were).
- ``save_storage(storage, offset=0)`` writes every byte of the storage at ``offset``, without ``fsync`` (torch does
  not sync either; :class:`weightlift.File`'s ``save_storage`` does).
- Failures of the calls torch makes into cuFile raise ``RuntimeError`` (:class:`weightlift.GdsError`) whose
  message starts as torch's (``cuFileRead failed: ...``); reading through a write-only descriptor or writing
  through a read-only one fails that way too.

The data path: through NVIDIA's cuFile when it runs peer-to-peer on this machine (nvidia-fs or P2PDMA), otherwise
through weightlift's engine (io_uring reads and writes with pinned staging, O_DIRECT where the filesystem takes
it). ``weightlift.last_report()`` after a call says which (``"path": "cufile"`` or ``"engine"``) and why. On
machines where cuFile exists only in compatibility mode (no nvidia-fs: the machines weightlift is tested on), the
engine serves every call. The engine reaches the file through ``/proc/self/fd/<fd>``, so it reads and writes the
very file the descriptor names, even if it was renamed or unlinked since.

Differences from torch, each an addition: storages in host memory are accepted (torch asks for CUDA storages),
the functions work without a PyTorch built with cuFile, and ``is_available()`` (of newer torch releases; the
reference lists the other three names) is always true. Buffer registration on the engine path is bookkeeping
(double registration and deregistration of an unknown buffer fail as torch's do); the engine needs no pinning.
Code that calls ``torch.cuda.gds.GdsFile(...)`` by its qualified name runs on weightlift after
``weightlift.cuda_gds.install()``, which makes ``torch.cuda.gds`` this module.

File handles and buffers are registered in a native session (``_native.NativeSession``, whose registry
:mod:`weightlift.cufile` uses too; this module keeps none of its own); an offset out of range (negative, 2^64 or more) raises a ``RuntimeError`` that is also a
``ValueError`` (:class:`weightlift.InvalidArgumentError`).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Optional

from . import _args, _core, _native
from ._errors import GdsError, InvalidArgumentError, WeightliftError

__all__: list[str] = ["is_available", "gds_register_buffer", "gds_deregister_buffer", "GdsFile", "install"]

Storage = Any  # torch.UntypedStorage or torch.TypedStorage (a contiguous tensor is accepted too)

_lock = threading.Lock()
_session: "Any | None" = None


def _route() -> tuple[str, str]:
    """(``"cufile"`` or ``"engine"``, why), decided once per process."""
    return _core.cufile_route()


def _cufile_session():
    """The native session whose registry holds this module's file handles and buffers; it serves through cuFile
    where cuFile runs peer-to-peer here, through weightlift's engine otherwise."""
    global _session
    with _lock:
        if _session is None:
            _session = _native.NativeSession(_native.cufile_route().path == _native.CufilePath.Cufile)
        return _session


def _memory(s: Storage) -> tuple[int, int, str]:
    """(address, bytes, engine device string) of a storage or contiguous tensor."""
    t = _core.torch_module()
    if isinstance(s, t.Tensor):
        if not s.is_contiguous():
            raise GdsError("the tensor must be contiguous")
        return s.data_ptr(), s.numel() * s.element_size(), _core.normalize_device(s.device)
    if hasattr(s, "_untyped_storage"):  # TypedStorage
        s = s._untyped_storage
    return s.data_ptr(), s.nbytes(), _core.normalize_device(s.device)


class _GdsValueError(GdsError, InvalidArgumentError):
    """A value out of range: the ``RuntimeError`` torch raises, and a ``ValueError`` as every weightlift error about
    a value."""


def _fail(call: str, e: Exception) -> GdsError:
    err = GdsError(f"{call} failed: {e}")
    err.__cause__ = e
    return err


def is_available() -> bool:
    """Whether these functions work here: always (newer torch's ``is_available`` says whether torch was built with
    cuFile; weightlift needs no such build)."""
    return True


def gds_register_buffer(s: Storage) -> None:
    """Registers storage ``s`` as a cuFile buffer (``cuFileBufRegister``)."""
    ptr, nbytes, device = _memory(s)
    try:
        session = _cufile_session()
        if session.buffer(ptr) is not None:
            raise GdsError("cuFileBufRegister failed: memory already registered")
        session.buf_register(ptr, nbytes, device)
    except GdsError:
        raise
    except WeightliftError as e:
        raise _fail("cuFileBufRegister", e) from e


def gds_deregister_buffer(s: Storage) -> None:
    """Deregisters storage ``s``, registered by :func:`gds_register_buffer` (``cuFileBufDeregister``)."""
    ptr = _memory(s)[0]
    session = _cufile_session()
    if session.buffer(ptr) is None:
        raise GdsError("cuFileBufDeregister failed: memory not registered")
    try:
        session.buf_deregister(ptr)
    except WeightliftError as e:
        raise _fail("cuFileBufDeregister", e) from e


def _register_handle(fd: int) -> int:
    import fcntl

    try:
        access = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
        return _cufile_session().handle_register_fd(fd, access != os.O_WRONLY, access != os.O_RDONLY)
    except (OSError, WeightliftError) as e:
        raise _fail("cuFileHandleRegister", e) from e


def _deregister_handle(handle: int) -> None:
    try:
        _cufile_session().handle_deregister(handle)
    except WeightliftError:
        pass  # not registered: torch's deregistration of an unknown handle does nothing either


def _transfer(handle: int, storage: Storage, offset: Any, write: bool) -> None:
    call = "cuFileWrite" if write else "cuFileRead"
    session = _cufile_session()
    try:
        path, readable, writable = session.handle_info(handle)
    except WeightliftError as e:
        raise GdsError(f"{call} failed: file handle not registered") from e
    if not (writable if write else readable):
        raise GdsError(f"{call} failed: Bad file descriptor")
    offset = _args.unsigned("offset", offset, lambda m: _GdsValueError(f"{call} failed: invalid value ({m})"))
    ptr, nbytes, device = _memory(storage)
    if device.startswith("cuda"):
        # Work queued on the current stream may still be producing (or using) this memory.
        t = _core.torch_module()
        t.cuda.current_stream(t.device(device)).synchronize()
    path_used, why = _route()
    if path_used == "cufile" and not device.startswith("cuda"):
        path_used, why = "engine", "host memory: cuFile serves device memory only here"
    try:
        _core.check_cuda(device)
        n = session.pio("write" if write else "read", handle, ptr, nbytes, offset, device)
    except WeightliftError as e:
        raise _fail(call, e) from e
    report = {"backend": session.backend(), "bytes": n, "api": "torch.cuda.gds", "call": call}
    _core.note_report({**report, "path": path_used, "path_why": why, "file": str(path), "offset": offset})


class GdsFile:
    """A file opened for cuFile-style loads into and saves out of storages (``torch.cuda.gds.GdsFile``).

    Args:
        filename (str): the file to open.
        flags (int): ``os.open`` flags; ``os.O_DIRECT`` is added.
    """

    def __init__(self, filename: str, flags: int):
        if sys.platform == "win32":
            raise RuntimeError("GdsFile is not supported on this platform.")
        self.filename = filename
        self.flags = flags
        self.fd = os.open(filename, flags | os.O_DIRECT)
        self.handle: Optional[int] = None
        self.register_handle()

    def __del__(self) -> None:
        if getattr(self, "handle", None) is not None:
            self.deregister_handle()
        if hasattr(self, "fd"):
            os.close(self.fd)

    def register_handle(self) -> None:
        """Registers the descriptor (``cuFileHandleRegister``); it must not be registered already."""
        if self.handle is not None:
            raise AssertionError("the handle is registered already")
        self.handle = _register_handle(self.fd)

    def deregister_handle(self) -> None:
        """Deregisters the descriptor (``cuFileHandleDeregister``); it must be registered."""
        if self.handle is None:
            raise AssertionError("no handle is registered to deregister")
        _deregister_handle(self.handle)
        self.handle = None

    def load_storage(self, storage: Storage, offset: int = 0) -> None:
        """Reads ``storage.nbytes()`` bytes of the file from ``offset`` into ``storage`` (``cuFileRead``)."""
        if self.handle is None:
            raise AssertionError("the file must be registered before loading from it")
        _transfer(self.handle, storage, offset, write=False)

    def save_storage(self, storage: Storage, offset: int = 0) -> None:
        """Writes all of ``storage`` into the file at ``offset`` (``cuFileWrite``)."""
        if self.handle is None:
            raise AssertionError("the file must be registered before saving to it")
        _transfer(self.handle, storage, offset, write=True)


def install() -> None:
    """Makes ``torch.cuda.gds`` this module, so that code calling ``torch.cuda.gds.GdsFile(...)`` (qualified call
    sites, which changing an import does not reach) runs on weightlift; ``import torch.cuda.gds`` then gives it too.
    The same as ``sys.modules["torch.cuda.gds"] = weightlift.cuda_gds`` plus the ``torch.cuda.gds`` attribute."""
    import torch.cuda

    module = sys.modules[__name__]
    sys.modules["torch.cuda.gds"] = module
    torch.cuda.gds = module
