"""Weights straight into a ``torch.nn.Module`` — what ``model.load_state_dict(load_file(path), assign=True)`` does,
reading only the tensors the model has and reporting missing and unexpected keys as torch does."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence, Union

from . import _core
from .safetensors import _checkpoint, _load_tensors

if TYPE_CHECKING:
    import torch

PathLike = Union[str, "os.PathLike[str]"]


def load_into(
    model: "torch.nn.Module",
    path: Union[PathLike, Sequence[PathLike]],
    strict: bool = True,
    device: Union[str, int, "torch.device", None] = None,
    *,
    engine=None,
    progress: Any = False,
):
    """Loads the checkpoint's tensors into ``model``'s parameters and buffers (assigning the loaded tensors, so no
    second copy is made). ``device`` defaults to where the model's parameters are (CPU for a model on the meta
    device). Returns torch's ``_IncompatibleKeys(missing_keys, unexpected_keys)``; with ``strict`` a mismatch raises
    the ``RuntimeError`` torch would, before anything is read. ``progress``: as for :func:`weightlift.load_file`."""
    t = _core.torch_module()
    ckpt = _checkpoint(path)
    expected = list(model.state_dict(keep_vars=True).keys())
    in_file = {i.name for i in ckpt.tensors}
    missing = [k for k in expected if k not in in_file]
    present = set(expected)
    unexpected = sorted(k for k in in_file if k not in present)
    if strict and (missing or unexpected):
        msgs = []
        if missing:
            msgs.append("Missing key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in missing)))
        if unexpected:
            msgs.append("Unexpected key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in unexpected)))
        raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(model.__class__.__name__, "\n\t".join(msgs)))
    if device is None:
        first = next(iter(model.parameters()), None)
        device = "cpu" if first is None or first.device.type == "meta" else first.device
    names = [k for k in expected if k in in_file]
    tensors = _load_tensors(ckpt, names, _core.normalize_device(device), engine, progress=progress)
    model.load_state_dict(tensors, strict=False, assign=True)
    return t.nn.modules.module._IncompatibleKeys(missing, unexpected)
