"""The exceptions weightlift raises. Every one derives from :class:`WeightliftError`; where Python users expect a
builtin (``FileNotFoundError`` for a missing file, ``MemoryError``, ``ValueError``, ``KeyError``), the weightlift
class derives from that builtin too, so either ``except`` clause catches it."""

from __future__ import annotations

from ._status import Status


class WeightliftError(Exception):
    """Base class of every weightlift error."""


class FormatError(WeightliftError, ValueError):
    """A checkpoint's header is malformed: the message names the file, the tensor and what is wrong."""


class IoError(WeightliftError, OSError):
    """Reading or writing a file failed: the message names the file and the offset."""


class WeightliftFileNotFoundError(IoError, FileNotFoundError):
    """A file does not exist, or an object (a URL) or its bucket does not."""


class WeightliftPermissionError(IoError, PermissionError):
    """A file cannot be opened with the access needed, or an object store refused the credentials."""


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


class GdsError(WeightliftError, RuntimeError):
    """A :mod:`weightlift.cuda_gds` call failed where ``torch.cuda.gds`` raises ``RuntimeError``; the message starts
    with the cuFile call torch names (``cuFileRead failed: ...``)."""


class cuFileError(WeightliftError):  # noqa: N801 - the name cuda.bindings.cufile gives it
    """A :mod:`weightlift.cufile` function failed: ``.status`` is the cuFile status code
    (:class:`weightlift.cufile.Status`), the message says what went wrong."""

    def __init__(self, status: int, message: str = ""):
        try:
            self.status = Status(status)
        except ValueError:
            self.status = status  # an errno from the operating system, as cuda.bindings passes it on
        self.message = message
        name = getattr(self.status, "name", f"errno {status}")
        super().__init__(f"{name} ({int(status)}): {message}" if message else f"{name} ({int(status)})")

    def __reduce__(self):
        return (type(self), (int(self.status), self.message))


class SharedTensorsError(InvalidArgumentError, RuntimeError):
    """Tensors to save share memory (tied weights): refused as ``safetensors.torch.save_file`` refuses them, with
    its ``RuntimeError``; ``save_model`` saves one of each group."""


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
    "SharedTensorsError",
    "GdsError",
    "cuFileError",
]
