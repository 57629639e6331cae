"""torch.cuda.gds-style API: ``File(path, mode)`` with ``load_storage``/``save_storage`` into and out of existing
storages (host or GPU), and ``pread``/``pwrite`` returning the bytes done."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Union

from . import _core
from ._errors import InvalidArgumentError, IoError

if TYPE_CHECKING:
    import torch

PathLike = Union[str, "os.PathLike[str]"]

_MODES = {"r": (True, False), "rb": (True, False), "w": (False, True), "wb": (False, True), "r+": (True, True), "rb+": (True, True), "w+": (True, True)}


def _mode(mode: Union[str, int]) -> tuple[bool, bool, bool]:
    """(readable, writable, truncate) for a mode string or os.O_* flags (torch's GdsFile takes flags)."""
    if isinstance(mode, int):
        acc = mode & os.O_ACCMODE
        return acc in (os.O_RDONLY, os.O_RDWR), acc in (os.O_WRONLY, os.O_RDWR), bool(mode & os.O_TRUNC)
    if mode not in _MODES:
        raise InvalidArgumentError(f"mode {mode!r}: expected r, w, r+ or w+ (or os.O_* flags)")
    r, w = _MODES[mode]
    return r, w, mode.startswith("w")


def _memory(obj: Any) -> tuple[int, int, str]:
    """(address, bytes, device) of a contiguous tensor or a storage."""
    t = _core.torch_module()
    if isinstance(obj, t.Tensor):
        if not obj.is_contiguous():
            raise InvalidArgumentError("the tensor must be contiguous")
        return obj.data_ptr(), obj.numel() * obj.element_size(), str(obj.device)
    storage = obj.untyped_storage() if hasattr(obj, "untyped_storage") else obj
    if hasattr(storage, "_untyped_storage"):
        storage = storage._untyped_storage
    return storage.data_ptr(), storage.nbytes(), str(storage.device)


class File:
    """A file for reading into and writing out of existing host or GPU memory.

    >>> f = File("weights.bin", "r")
    >>> f.load_storage(tensor.untyped_storage(), offset=0)
    """

    def __init__(self, filename: PathLike, mode: Union[str, int] = "r", *, engine=None):
        self.path = os.fspath(filename)
        self.readable, self.writable, truncate = _mode(mode)
        if self.writable:
            flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if truncate else 0)
            try:
                os.close(os.open(self.path, flags, 0o644))
            except OSError as e:
                from ._errors import WeightliftFileNotFoundError, WeightliftPermissionError

                cls = {2: WeightliftFileNotFoundError, 13: WeightliftPermissionError}.get(e.errno, IoError)
                raise cls(f"{self.path}: cannot open for writing: {e.strerror}") from e
        elif not os.path.exists(self.path):
            from ._errors import WeightliftFileNotFoundError

            raise WeightliftFileNotFoundError(f"{self.path}: cannot open: No such file or directory")
        self._engine = engine or _core.shared_engine()

    # torch.cuda.gds.GdsFile compatibility: registration is implicit here.
    def register_handle(self) -> None:
        return None

    def deregister_handle(self) -> None:
        return None

    def _sync(self, device: str) -> None:
        if device.startswith("cuda"):
            t = _core.torch_module()
            t.cuda.current_stream(t.device(device)).synchronize()

    def pread(self, tensor: Any, offset: int = 0) -> int:
        """Reads into a contiguous tensor (or storage) from ``offset``; returns the bytes read, fewer at the end of
        the file, as ``pread`` does."""
        if not self.readable:
            raise InvalidArgumentError(f"{self.path}: opened write-only")
        if offset < 0:
            raise InvalidArgumentError(f"offset {offset} is negative")
        ptr, nbytes, device = _memory(tensor)
        # Work queued on the current stream may still use this memory: let it finish before the copies start.
        self._sync(device)
        return self._engine.read_into(self.path, int(offset), nbytes, ptr, _core.normalize_device(device))

    def pwrite(self, tensor: Any, offset: int = 0) -> int:
        """Writes a contiguous tensor (or storage) at ``offset``; returns the bytes written."""
        if not self.writable:
            raise InvalidArgumentError(f"{self.path}: opened read-only")
        if offset < 0:
            raise InvalidArgumentError(f"offset {offset} is negative")
        ptr, nbytes, device = _memory(tensor)
        self._sync(device)
        return self._engine.write_from(self.path, int(offset), nbytes, ptr, _core.normalize_device(device), False)

    def load_storage(self, storage: Any, offset: int = 0) -> None:
        """Fills ``storage`` from the file at ``offset``; the file must hold all of it."""
        _, nbytes, _ = _memory(storage)
        done = self.pread(storage, offset)
        if done != nbytes:
            raise IoError(f"{self.path}: only {done} of {nbytes} bytes exist from offset {offset}")

    def save_storage(self, storage: Any, offset: int = 0) -> None:
        """Writes ``storage`` into the file at ``offset``, durably (fsync)."""
        if not self.writable:
            raise InvalidArgumentError(f"{self.path}: opened read-only")
        ptr, nbytes, device = _memory(storage)
        self._sync(device)
        self._engine.write_from(self.path, int(offset), nbytes, ptr, _core.normalize_device(device), True)

    def __enter__(self) -> "File":
        return self

    def __exit__(self, *exc) -> None:
        return None


GdsFile = File
