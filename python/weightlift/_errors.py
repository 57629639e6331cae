"""The exceptions weightlift raises. Every one derives from :class:`WeightliftError`; where Python users expect a
builtin (``FileNotFoundError`` for a missing file, ``MemoryError``, ``ValueError``, ``KeyError``), the weightlift
class derives from that builtin too, so either ``except`` clause catches it."""

from __future__ import annotations


class WeightliftError(Exception):
    """Base class of every weightlift error."""


class FormatError(WeightliftError, ValueError):
    """A checkpoint's header is malformed: the message names the file, the tensor and what is wrong."""


class IoError(WeightliftError, OSError):
    """Reading or writing a file failed: the message names the file and the offset."""


class WeightliftFileNotFoundError(IoError, FileNotFoundError):
    """A file does not exist."""


class WeightliftPermissionError(IoError, PermissionError):
    """A file cannot be opened with the access needed."""


class WeightliftIsADirectoryError(IoError, IsADirectoryError):
    """A path names a directory where a file was expected."""


class NotARegularFileError(IoError):
    """A path names a FIFO, a socket or a device where a regular file was expected: refused at once, before any
    open or read that could block."""


class CudaError(WeightliftError, RuntimeError):
    """The CUDA driver is missing or refused an operation."""


class OutOfMemoryError(WeightliftError, MemoryError):
    """Host or device memory ran out; nothing allocated by the failed call is kept."""


class InvalidArgumentError(WeightliftError, ValueError):
    """An argument cannot be used (unknown dtype, bad device string, bad setting, wrong sizes)."""


class ChecksumError(WeightliftError, ValueError):
    """Loaded bytes differ from the checksum manifest (``verify=True``), or the manifest is missing or malformed."""


class TensorNotFoundError(InvalidArgumentError, KeyError):
    """A tensor name is not in the checkpoint."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


__all__ = [
    "WeightliftError",
    "ChecksumError",
    "FormatError",
    "IoError",
    "WeightliftFileNotFoundError",
    "WeightliftPermissionError",
    "WeightliftIsADirectoryError",
    "NotARegularFileError",
    "CudaError",
    "OutOfMemoryError",
    "InvalidArgumentError",
    "TensorNotFoundError",
]
