"""Reads by logical block address: a block device (``/dev/nvme0n1``, a loop device) or a regular file standing for
one (a disk image), read by LBA and block count into GPU or host memory through weightlift's engine (io_uring,
O_DIRECT where the device allows it, the pinned ring, asynchronous copies).

Two styles, as GPU-storage tutorials write them::

    dev = weightlift.nvme.Device("/dev/nvme0n1")          # PyCUDA style (also named NVMeGPU)
    dev.read(lba=0, count=1024, gpu_ptr=buf)              # buf: an int address, a pycuda allocation, a tensor
    data = dev.read_to_gpu(lba=0, size_mb=100)            # a new uint8 tensor; data.nbytes == 100 MiB

    weightlift.nvme.init("/dev/nvme0n1")                  # PyTorch style, module-level device (optional:
    weightlift.nvme.read_into_tensor(tensor, lba=0)       # /dev/nvme0n1 without it); fills the whole tensor

and named regions: ``regions = dev.regions(); regions["weights"] = (0, 8192); regions.read("weights", index,
length, gpu_ptr)``. Block size: the device's logical block size, or 512 bytes for a file, unless given. Opening a
block device needs read permission on it (usually root or the ``disk`` group); FIFOs, sockets and character
devices are refused. Nothing here drives NVMe queues itself: the kernel's block layer does the I/O.
"""

from __future__ import annotations

import os
import threading
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any, Iterator, Optional, Union

from . import _args, _core, _native
from ._errors import InvalidArgumentError

if TYPE_CHECKING:
    import torch

PathLike = Union[str, "os.PathLike[str]"]


def _memory(target: Any, device: Any, need: int) -> tuple[int, int, str]:
    """(address, bytes, device) of a destination: a contiguous tensor, an object with ``__cuda_array_interface__``
    or ``__array_interface__``, or an integer address (``int()`` of a pycuda ``DeviceAllocation`` too), which is
    taken to be memory of ``device`` (the current CUDA device by default) holding the ``need`` bytes asked for."""
    t = _core.torch_module()
    if isinstance(target, t.Tensor):
        if not target.is_contiguous():
            raise InvalidArgumentError("the destination tensor must be contiguous")
        return target.data_ptr(), target.numel() * target.element_size(), _core.normalize_device(target.device)
    cai = getattr(target, "__cuda_array_interface__", None)
    if cai is not None:
        ptr = int(cai["data"][0])
        nbytes = _interface_bytes(cai)
        return ptr, nbytes, _core.normalize_device("cuda" if device is None else device)
    ai = getattr(target, "__array_interface__", None)
    if ai is not None:
        return int(ai["data"][0]), _interface_bytes(ai), "cpu"
    try:
        ptr = int(target)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"cannot read into a {type(target).__name__}: pass a tensor or an address") from None
    if ptr == 0:
        raise InvalidArgumentError("the destination address is 0")
    return ptr, need, _core.normalize_device("cuda" if device is None else device)


def _interface_bytes(iface: dict) -> int:
    if iface.get("strides") is not None:
        raise InvalidArgumentError("the destination array must be contiguous")
    n = 1
    for d in iface["shape"]:
        n *= int(d)
    import numpy as np  # the array interface's typestr is numpy's

    return n * np.dtype(iface["typestr"]).itemsize


class Device:
    """A block device or a file, addressed in logical blocks of ``block_size`` bytes."""

    def __init__(self, path: PathLike, block_size: Optional[int] = None, *, engine: Any = None):
        self._engine = engine if engine is not None else _core.shared_engine()
        self._dev = _native.NativeBlockDevice(self._engine, os.fspath(path), block_size)

    @property
    def path(self) -> str:
        return str(self._dev.path)

    @property
    def block_size(self) -> int:
        return self._dev.block_size

    @property
    def blocks(self) -> int:
        """Addressable blocks (a file's trailing partial block is not addressable)."""
        return self._dev.blocks

    @property
    def is_block_device(self) -> bool:
        return self._dev.is_block_device

    def read(self, lba: int, count: int, gpu_ptr: Any, *, device: Any = None) -> int:
        """Reads ``count`` blocks from ``lba`` into ``gpu_ptr`` (see :func:`_memory` for what it may be; ``device``
        names the memory an integer address belongs to, ``"cpu"`` for host memory); returns the bytes read."""
        lba, count = _args.unsigned("lba", lba), _args.unsigned("count", count)
        need = count * self.block_size
        ptr, nbytes, dev = _memory(gpu_ptr, device, need)
        _core.check_cuda(dev)
        if dev.startswith("cuda"):
            t = _core.torch_module()
            # Work queued on the current stream may still use this memory: let it finish first.
            t.cuda.current_stream(t.device(dev)).synchronize()
        return self._dev.read(lba, count, ptr, nbytes, dev)

    def read_into_tensor(self, tensor: "torch.Tensor", lba: int = 0) -> int:
        """Fills all of ``tensor`` from ``lba`` (its size must be a whole number of blocks); returns the bytes."""
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes % self.block_size:
            raise InvalidArgumentError(f"the tensor's {nbytes} bytes are not a whole number of {self.block_size}-byte blocks")
        return self.read(lba, nbytes // self.block_size, tensor)

    def read_to_gpu(self, lba: int = 0, size_mb: float = 1, *, size: Optional[int] = None, device: Any = "cuda") -> "torch.Tensor":
        """A new uint8 tensor of ``size_mb`` MiB (or ``size`` bytes) on ``device`` read from ``lba``."""
        t = _core.torch_module()
        if size is not None:
            nbytes = _args.unsigned("size", size)
        elif isinstance(size_mb, (int, float)) and not isinstance(size_mb, bool) and 0 <= size_mb < 2**44:
            nbytes = int(size_mb * (1 << 20))
        else:
            raise InvalidArgumentError(f"size_mb {size_mb!r}: expected a number of MiB from 0")
        if nbytes % self.block_size:
            raise InvalidArgumentError(f"{nbytes} bytes are not a whole number of {self.block_size}-byte blocks")
        dev = _core.normalize_device(device)
        _core.check_cuda(dev)
        out = t.empty(nbytes, dtype=t.uint8, device=dev)
        self.read_into_tensor(out, lba)
        return out

    def regions(self) -> "Regions":
        """An empty region table over this device."""
        return Regions(self)

    def __repr__(self) -> str:
        kind = "block device" if self.is_block_device else "file"
        return f"weightlift.nvme.Device({self.path!r}, {kind}, {self.blocks} blocks of {self.block_size} B)"


NVMeGPU = Device


class Regions(MutableMapping):
    """Named LBA ranges of one device: ``regions[kind] = (start_lba, count)``; reads by kind, block index inside
    the range and block count (a read leaving the range is an error naming it)."""

    def __init__(self, device: Device):
        self.device = device
        self._native = _native.NativeRegions(device._dev)

    def __setitem__(self, kind: str, lba_range: tuple[int, int]) -> None:
        start, count = lba_range
        self._native.set(str(kind), _args.unsigned("start_lba", start), _args.unsigned("count", count))

    def __getitem__(self, kind: str) -> tuple[int, int]:
        for k, r in self._native.items():
            if k == kind:
                return r
        raise KeyError(kind)

    def __delitem__(self, kind: str) -> None:
        if self._native.remove(str(kind)) is None:
            raise KeyError(kind)

    def __iter__(self) -> Iterator[str]:
        return iter([k for k, _ in self._native.items()])

    def __len__(self) -> int:
        return len(self._native.items())

    def read(self, kind: str, index: int, length: int, gpu_ptr: Any, *, device: Any = None) -> int:
        """Reads ``length`` blocks from block ``index`` of ``kind`` into ``gpu_ptr``; returns the bytes read."""
        index, length = _args.unsigned("index", index), _args.unsigned("length", length)
        lba = self._native.resolve(str(kind), index, length)
        return self.device.read(lba, length, gpu_ptr, device=device)

    def read_into_tensor(self, kind: str, tensor: "torch.Tensor", index: int = 0) -> int:
        """Fills ``tensor`` from block ``index`` of ``kind``."""
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes % self.device.block_size:
            raise InvalidArgumentError(f"the tensor's {nbytes} bytes are not a whole number of blocks")
        return self.read(kind, index, nbytes // self.device.block_size, tensor)


_default: Optional[Device] = None
_default_lock = threading.Lock()


def init(path: PathLike, block_size: Optional[int] = None) -> Device:
    """Opens the module-level device used by :func:`read_into_tensor` (replacing any earlier one)."""
    global _default
    dev = Device(path, block_size)
    with _default_lock:
        _default = dev
    return dev


#: The device :func:`read_into_tensor` opens when :func:`init` was not called: the first NVMe namespace, as the
#: tutorial's ``torch_nvme.read_into_tensor`` reads.
DEFAULT_DEVICE = "/dev/nvme0n1"


def read_into_tensor(tensor: "torch.Tensor", lba: int = 0) -> int:
    """Fills ``tensor`` from ``lba`` of the device opened by :func:`init`, or of :data:`DEFAULT_DEVICE` (opened on
    first use) when :func:`init` was not called."""
    global _default
    with _default_lock:
        if _default is None:
            if not os.path.exists(DEFAULT_DEVICE):
                raise InvalidArgumentError(f"no device: {DEFAULT_DEVICE} does not exist; call weightlift.nvme.init(path) first")
            _default = Device(DEFAULT_DEVICE)
        dev = _default
    return dev.read_into_tensor(tensor, lba)


def cleanup() -> None:
    """Forgets the module-level device."""
    global _default
    with _default_lock:
        _default = None


__all__ = ["Device", "NVMeGPU", "Regions", "init", "read_into_tensor", "cleanup", "DEFAULT_DEVICE"]
