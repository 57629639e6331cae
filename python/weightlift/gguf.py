"""GGUF checkpoints into torch tensors: plain types (F32, F16, BF16, F64, I8–I64) as typed tensors of their logical
shape, block-quantized types as uint8 tensors of their blocks (the layout the ``gguf`` package presents), each with
its ggml type and logical shape alongside, and the metadata."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

from . import _core, _native
from ._errors import FormatError

if TYPE_CHECKING:
    import torch

PathLike = Union[str, "os.PathLike[str]"]


@dataclass
class GGUFCheckpoint:
    """What ``load_gguf`` returns."""

    tensors: "dict[str, torch.Tensor]" = field(default_factory=dict)
    #: ggml type name of each tensor ("Q4_K", "F16", ...).
    types: dict[str, str] = field(default_factory=dict)
    #: Logical (dequantized) shape of each tensor, row-major.
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: The file's key/values in file order: scalars as ``int``, ``float``, ``bool``, ``str``; numeric arrays as
    #: ``array.array`` of their element type (an array costs about its size in the file); arrays of strings, bools
    #: and arrays as lists.
    metadata: dict[str, Any] = field(default_factory=dict)
    version: int = 3


def load_gguf(path: PathLike, device: Union[str, int, "torch.device"] = "cpu", *, engine=None) -> GGUFCheckpoint:
    """Loads every tensor of a GGUF file onto ``device``."""
    dev = _core.normalize_device(device)
    _core.check_cuda(dev)
    ckpt = _native.Checkpoint([os.fspath(path)])
    if ckpt.format != "gguf":
        raise FormatError(f"{path}: not a GGUF file (it is {ckpt.format})")
    infos = ckpt.tensors
    engine = engine or _core.shared_engine()
    alloc, stream = _core.device_allocator(engine, dev)
    buffers = ckpt.load(engine, dev, None, False, 0, alloc, stream)
    out = GGUFCheckpoint(metadata=ckpt.files[0]["metadata"] or {})
    for info, tensor in zip(infos, _core.info_tensors(buffers, infos)):
        out.types[info.name] = info.dtype
        out.shapes[info.name] = tuple(info.shape)
        out.tensors[info.name] = tensor
    return out
