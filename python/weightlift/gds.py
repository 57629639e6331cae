"""torch.cuda.gds-style API: ``File(path, mode)`` with ``load_storage``/``save_storage`` into and out of existing
storages (host or GPU), and ``pread``/``pwrite`` returning the bytes done."""

from __future__ import annotations

import errno
import os
import stat
from typing import TYPE_CHECKING, Any, Union

from . import _args, _core, _native
from ._errors import InvalidArgumentError, IoError, NotARegularFileError

if TYPE_CHECKING:
    import torch

PathLike = Union[str, "os.PathLike[str]"]

def _mode(mode: Union[str, int]) -> tuple[bool, bool, bool]:
    """(readable, writable, truncate) for a mode string (parsed by the engine) or os.O_* flags (torch's GdsFile
    takes flags)."""
    if isinstance(mode, int):
        acc = mode & os.O_ACCMODE
        return acc in (os.O_RDONLY, os.O_RDWR), acc in (os.O_WRONLY, os.O_RDWR), bool(mode & os.O_TRUNC)
    if not isinstance(mode, str):
        raise InvalidArgumentError(f"mode {mode!r}: expected a mode string (r, w, r+, w+) or os.O_* flags")
    readable, writable, _create, truncate, _direct = _native.parse_file_mode(mode)
    return readable, writable, truncate


def _refuse_non_regular(path: str, mode: int) -> None:
    """Raises NotARegularFileError for a FIFO, socket or device (the engine refuses them on every read)."""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):  # directories: the open's own error says it
        return
    kinds = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    kind = next((name for test, name in kinds if test(mode)), "not a regular file")
    raise NotARegularFileError(f"{path}: is {kind}, not a regular file")


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
            if os.path.exists(self.path):
                _refuse_non_regular(self.path, os.stat(self.path).st_mode)
            # O_NONBLOCK: if the path became a FIFO meanwhile, the open fails at once (ENXIO) instead of waiting.
            flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | (os.O_TRUNC if truncate else 0)
            try:
                fd = os.open(self.path, flags, 0o644)
            except OSError as e:
                from ._errors import WeightliftFileNotFoundError, WeightliftIsADirectoryError, WeightliftPermissionError

                if e.errno == errno.ENXIO:
                    _refuse_non_regular(self.path, os.stat(self.path).st_mode)
                cls = {errno.ENOENT: WeightliftFileNotFoundError, errno.EACCES: WeightliftPermissionError, errno.EISDIR: WeightliftIsADirectoryError}.get(e.errno, IoError)
                raise cls(f"{self.path}: cannot open for writing: {e.strerror}") from e
            try:
                _refuse_non_regular(self.path, os.fstat(fd).st_mode)
            finally:
                os.close(fd)
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
        offset = _args.unsigned("offset", offset)
        ptr, nbytes, device = _memory(tensor)
        # Work queued on the current stream may still use this memory: let it finish before the copies start.
        self._sync(device)
        return self._engine.read_into(self.path, offset, nbytes, ptr, _core.normalize_device(device))

    def pwrite(self, tensor: Any, offset: int = 0) -> int:
        """Writes a contiguous tensor (or storage) at ``offset``; returns the bytes written."""
        if not self.writable:
            raise InvalidArgumentError(f"{self.path}: opened read-only")
        offset = _args.unsigned("offset", offset)
        ptr, nbytes, device = _memory(tensor)
        self._sync(device)
        return self._engine.write_from(self.path, offset, nbytes, ptr, _core.normalize_device(device), False)

    def load_storage(self, storage: Any, offset: int = 0) -> None:
        """Fills ``storage`` from the file at ``offset``; the file must hold all of it."""
        offset = _args.unsigned("offset", offset)
        _, nbytes, _ = _memory(storage)
        done = self.pread(storage, offset)
        if done != nbytes:
            raise IoError(f"{self.path}: only {done} of {nbytes} bytes exist from offset {offset}")

    def save_storage(self, storage: Any, offset: int = 0) -> None:
        """Writes ``storage`` into the file at ``offset``, durably (fsync)."""
        if not self.writable:
            raise InvalidArgumentError(f"{self.path}: opened read-only")
        offset = _args.unsigned("offset", offset)
        ptr, nbytes, device = _memory(storage)
        self._sync(device)
        self._engine.write_from(self.path, offset, nbytes, ptr, _core.normalize_device(device), True)

    def __enter__(self) -> "File":
        return self

    def __exit__(self, *exc) -> None:
        return None


GdsFile = File
