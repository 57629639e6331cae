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
    metadata: dict[str, Any] = field(default_factory=dict)
    version: int = 3


def load_gguf(path: PathLike, device: Union[str, int, "torch.device"] = "cpu", *, engine=None) -> GGUFCheckpoint:
    """Loads every tensor of a GGUF file onto ``device``."""
    dev = _core.normalize_device(device)
    info = _native.inspect([os.fspath(path)])
    if info["format"] != "gguf":
        raise FormatError(f"{path}: not a GGUF file (it is {info['format']})")
    ggml = _native.ggml_types()
    plain = set(_core.torch_dtypes())
    tensors = info["tensors"]
    buffers = _core.load_ranges(engine or _core.shared_engine(), [info["files"][0]["path"]], [(0, off, n) for (_, _, _, _, off, n) in tensors], dev)
    out = GGUFCheckpoint(metadata=info["files"][0]["metadata"] or {})
    for (name, dtype, shape, _, _, nbytes), buf in zip(tensors, buffers):
        out.types[name] = dtype
        out.shapes[name] = tuple(shape)
        if dtype in plain:
            out.tensors[name] = _core.as_tensor(buf, dtype, shape)
        else:
            _, block, size = ggml[dtype]
            rows = list(shape[:-1]) or []
            inner = shape[-1] if shape else 1
            out.tensors[name] = _core.as_tensor(buf, "U8", [*rows, inner // block * size])
    return out
