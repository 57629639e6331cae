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
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Optional

from . import _core, _native
from ._errors import GdsError, WeightliftError

__all__: list[str] = ["is_available", "gds_register_buffer", "gds_deregister_buffer", "GdsFile"]

Storage = Any  # torch.UntypedStorage or torch.TypedStorage (a contiguous tensor is accepted too)

_lock = threading.Lock()
_buffers: set[int] = set()
_handles: dict[int, "_Handle"] = {}
_next_handle = 1
_route_cache: "tuple[str, str] | None" = None
_session: "Any | None" = None


class _Handle:
    def __init__(self, fd: int, access: int, session_fh: Optional[int]):
        self.fd = fd
        self.path = f"/proc/self/fd/{fd}"
        self.readable = access in (os.O_RDONLY, os.O_RDWR)
        self.writable = access in (os.O_WRONLY, os.O_RDWR)
        self.session_fh = session_fh


def _route() -> tuple[str, str]:
    """(``"cufile"`` or ``"engine"``, why), decided once per process."""
    global _route_cache
    if _route_cache is None:
        info = _native.probe(None).get("cufile", {})
        mode = str(info.get("mode", ""))
        if not info.get("found"):
            _route_cache = ("engine", "cuFile not found")
        elif not _native.cuda_status()[0]:
            _route_cache = ("engine", "CUDA unavailable")
        elif mode.startswith("peer-to-peer"):
            _route_cache = ("cufile", f"cuFile runs {mode}")
        else:
            _route_cache = ("engine", f"cuFile not peer-to-peer here ({mode})")
    return _route_cache


def _cufile_session():
    global _session
    with _lock:
        if _session is None:
            _session = _native.NativeSession(True)
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
    with _lock:
        if ptr in _buffers:
            raise GdsError("cuFileBufRegister failed: memory already registered")
    if _route()[0] == "cufile" and device.startswith("cuda"):
        try:
            _cufile_session().buf_register(ptr, nbytes, device)
        except WeightliftError as e:
            raise _fail("cuFileBufRegister", e) from e
    with _lock:
        _buffers.add(ptr)


def gds_deregister_buffer(s: Storage) -> None:
    """Deregisters storage ``s``, registered by :func:`gds_register_buffer` (``cuFileBufDeregister``)."""
    ptr, _, device = _memory(s)
    with _lock:
        if ptr not in _buffers:
            raise GdsError("cuFileBufDeregister failed: memory not registered")
        _buffers.discard(ptr)
    if _route()[0] == "cufile" and device.startswith("cuda"):
        try:
            _cufile_session().buf_deregister(ptr)
        except WeightliftError as e:
            raise _fail("cuFileBufDeregister", e) from e


def _register_handle(fd: int) -> int:
    global _next_handle
    try:
        access = _fd_access(fd)
        session_fh = None
        if _route()[0] == "cufile":
            mode = {os.O_RDONLY: "r"}.get(access, "r+")
            session_fh = _cufile_session().handle_register(f"/proc/self/fd/{fd}", mode)
    except (OSError, WeightliftError) as e:
        raise _fail("cuFileHandleRegister", e) from e
    with _lock:
        handle, _next_handle = _next_handle, _next_handle + 1
        _handles[handle] = _Handle(fd, access, session_fh)
    return handle


def _fd_access(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE


def _deregister_handle(handle: int) -> None:
    with _lock:
        h = _handles.pop(handle, None)
    if h is not None and h.session_fh is not None:
        _cufile_session().handle_deregister(h.session_fh)


def _transfer(handle: int, storage: Storage, offset: int, write: bool) -> None:
    call = "cuFileWrite" if write else "cuFileRead"
    with _lock:
        h = _handles.get(handle)
    if h is None:
        raise GdsError(f"{call} failed: file handle not registered")
    if not (h.writable if write else h.readable):
        raise GdsError(f"{call} failed: Bad file descriptor")
    if offset < 0:
        raise GdsError(f"{call} failed: invalid value (offset {offset} is negative)")
    ptr, nbytes, device = _memory(storage)
    if device.startswith("cuda"):
        # Work queued on the current stream may still be producing (or using) this memory.
        t = _core.torch_module()
        t.cuda.current_stream(t.device(device)).synchronize()
    path, why = _route()
    if path == "cufile" and not device.startswith("cuda"):
        path, why = "engine", "host memory: cuFile serves device memory only here"
    try:
        if h.session_fh is not None and path == "cufile":
            session = _cufile_session()
            n = session.pio("write" if write else "read", h.session_fh, ptr, nbytes, offset, device)
            report = {"backend": session.backend(), "bytes": n}
        elif write:
            n = _core.shared_engine().write_from(h.path, offset, nbytes, ptr, device, False)
            report = {"backend": "weightlift engine", "bytes": n}
        else:
            _core.check_cuda(device)
            _core.shared_engine().read_into(h.path, offset, nbytes, ptr, device)
            report = _native.last_report() or {}
    except WeightliftError as e:
        raise _fail(call, e) from e
    _core.note_report({**report, "api": "torch.cuda.gds", "call": call, "path": path, "path_why": why, "file": h.path, "offset": offset})


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
