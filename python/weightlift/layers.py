"""Layer streaming: a model larger than the memory it may use runs layer by layer, each layer's weights read into
one of a few fixed slots (two by default) while the previous layer computes.

>>> s = weightlift.LayerStreamer("model.safetensors", device="cuda:0")     # layers found by name: "layers.N."
>>> for i in range(len(s)):
...     w = s.load_layer(i)           # {name: tensor} views into a slot; the next layer is being read meanwhile
...     x = block(x, w)               # valid until the next load_layer
>>> s.stats()                          # loads, bytes, seconds reading, seconds waiting, ...

``load_layer(i)`` releases the layer handed back before: on a GPU, its slot is refilled only after the work queued
on PyTorch's current stream (at the time of the call) has finished, so kernels still reading it are safe.

:func:`stream_model` does this for a ``torch.nn.Module`` (a transformers model, say): its decoder layers' weights
are bound to slot views by forward pre-hooks, everything else moves to the device once.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

from . import _args, _core, _native
from ._errors import InvalidArgumentError

if TYPE_CHECKING:
    import torch

PathLike = Union[str, "os.PathLike[str]"]

#: Names of decoder blocks in common architectures: ``model.layers.3.``, ``transformer.h.3.``, ``blocks.3.``.
LAYER_PATTERN = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.")


def _group(names: Sequence[str], layers: Any) -> tuple[list[list[str]], list[str]]:
    """(names of each layer, names in no layer) for ``layers``: None (by :data:`LAYER_PATTERN`), a list of name
    lists, or a function name → layer number (None for no layer)."""
    if layers is not None and not callable(layers):
        groups = [list(g) for g in layers]
        placed = {n for g in groups for n in g}
        known = set(names)
        for n in placed:
            if n not in known:
                raise InvalidArgumentError(f"layers name tensor {n!r}, which the checkpoint does not hold")
        return groups, [n for n in names if n not in placed]
    key: Callable[[str], Optional[int]]
    if layers is None:
        def key(n: str) -> Optional[int]:
            m = LAYER_PATTERN.search(n)
            return int(m.group(1)) if m else None
    else:
        key = layers
    numbered: dict[int, list[str]] = {}
    rest = []
    for n in names:
        k = key(n)
        if k is None:
            rest.append(n)
        else:
            numbered.setdefault(int(k), []).append(n)
    if not numbered:
        raise InvalidArgumentError("no tensor name looks like a layer (e.g. 'model.layers.0.'); pass layers=")
    count = max(numbered) + 1
    return [numbered.get(i, []) for i in range(count)], rest


class LayerStreamer:
    """Streams the layers of a checkpoint (safetensors, a shard index, GGUF) through ``slots`` slots on ``device``.

    ``layers``: None to group tensors by :data:`LAYER_PATTERN` (the others are in :attr:`rest`, not streamed), a
    list of lists of tensor names, or a function from a name to its layer number (None for none)."""

    def __init__(
        self,
        path: Union[PathLike, Sequence[PathLike]],
        layers: Any = None,
        *,
        device: Union[str, int, "torch.device"] = "cuda",
        slots: int = 2,
        engine: Any = None,
        **settings: Any,
    ):
        t = _core.torch_module()
        paths = [os.fspath(p) for p in path] if isinstance(path, (list, tuple)) else [os.fspath(path)]
        self._ckpt = _native.Checkpoint(paths)
        infos = self._ckpt.tensors
        self._info = {i.name: i for i in infos}
        position = {i.name: k for k, i in enumerate(infos)}
        self.layers, self.rest = _group([i.name for i in infos], layers)
        slots = _args.integer("slots", slots)
        if slots < 1:
            raise InvalidArgumentError("a layer streamer needs at least one slot")
        self.device = _core.normalize_device(device)
        _core.check_cuda(self.device)
        groups = [[position[n] for n in g] for g in self.layers]
        plan, slot_bytes = _native.NativeLayerStreamer.plan(self._ckpt, groups)
        self._offsets = [offsets for _, offsets in plan]
        self.layer_bytes = [b for b, _ in plan]
        self.slot_bytes = max(int(slot_bytes), 1)
        # Owned by the native streamer too, which stops its reader before letting them go.
        self._slots = [t.empty(self.slot_bytes, dtype=t.uint8, device=self.device) for _ in range(slots)]
        engine = engine if engine is not None else (_core.new_engine(**settings) if settings else _core.shared_engine())
        self._native = _native.NativeLayerStreamer(
            engine, self._ckpt, groups, self.device, [s.data_ptr() for s in self._slots], self.slot_bytes, self._slots
        )
        self._dtypes = _core.torch_dtypes()

    def __len__(self) -> int:
        return len(self.layers)

    def load_layer(self, i: int) -> dict[str, "torch.Tensor"]:
        """Layer ``i`` as ``{name: tensor}`` views into its slot, valid until the next call (which may refill the
        slot); starts reading the next layers into the other slots."""
        i = _args.integer("i", i)
        if not 0 <= i < len(self.layers):
            raise InvalidArgumentError(f"layer {i} of a streamer over {len(self.layers)} layers")
        stream = None
        if self.device.startswith("cuda"):
            t = _core.torch_module()
            stream = t.cuda.current_stream(t.device(self.device)).cuda_stream
        slot = self._slots[self._native.load_layer(i, stream)]
        out = {}
        for name, off in zip(self.layers[i], self._offsets[i]):
            info = self._info[name]
            raw = slot[off : off + info.nbytes]
            out[name] = self._typed(raw, info)
        return out

    def _typed(self, raw: "torch.Tensor", info: Any) -> "torch.Tensor":
        shape = tuple(int(d) for d in info.storage_shape)
        if info.quantized or info.dtype == "U8":
            return raw.view(shape)
        if info.dtype not in self._dtypes:
            raise InvalidArgumentError(f"this torch has no dtype for {info.dtype} ({info.name})")
        if info.nbytes == 0:
            return raw.view(self._dtypes[info.dtype]).reshape(shape)
        return raw.view(self._dtypes[info.dtype]).view(shape)

    def stats(self) -> dict[str, float]:
        """Layers read (prefetches included), bytes, seconds spent reading in the background, seconds
        ``load_layer`` waited for bytes, requests, and requests whose layer was already in its slot."""
        loads, nbytes, load_s, wait_s, requests, hits = self._native.stats()
        return {"loads": loads, "bytes": nbytes, "load_seconds": load_s, "wait_seconds": wait_s, "requests": requests, "ready_hits": hits}

    def close(self) -> None:
        """Stops the background reader (waiting for a read in progress) and frees the slots."""
        native, self._native = getattr(self, "_native", None), None
        if native is not None:
            del native
        self._slots = []

    def __enter__(self) -> "LayerStreamer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _owner(root: "torch.nn.Module", name: str) -> tuple["torch.nn.Module", str]:
    *path, leaf = name.split(".")
    m = root
    for p in path:
        m = getattr(m, p)
    return m, leaf


class StreamedModel:
    """What :func:`stream_model` returns: the streamer and the hooks binding each layer's weights."""

    def __init__(self, model: "torch.nn.Module", streamer: LayerStreamer, prefix: str, hooks: list):
        self.model, self.streamer, self.prefix, self._hooks = model, streamer, prefix, hooks

    def stats(self) -> dict[str, float]:
        return self.streamer.stats()

    def close(self) -> None:
        """Removes the hooks and stops the streamer (the model's layers are left without weights)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.streamer.close()


def stream_model(
    model: "torch.nn.Module",
    path: Union[PathLike, Sequence[PathLike]],
    *,
    device: Union[str, int, "torch.device"] = "cuda",
    slots: int = 2,
    layers_module: Optional[str] = None,
    **settings: Any,
) -> StreamedModel:
    """Runs ``model`` with its decoder layers' weights streamed from ``path`` through ``slots`` slots on
    ``device``: everything outside the layers (embeddings, final norm, head, non-persistent buffers such as rotary
    ``inv_freq``) moves to ``device`` once; each layer's parameters and persistent buffers are bound to slot views
    just before the layer runs. ``model`` is a model on the CPU (e.g. from ``from_pretrained(..., device="cpu")``);
    its layers' weights are dropped (moved to the meta device) so that only the slots hold them. ``layers_module``:
    the dotted name of the ``ModuleList`` of layers (found from the checkpoint's names by default).

    The weights must match the checkpoint in dtype and shape (no conversion happens while streaming)."""
    t = _core.torch_module()
    dev = _core.normalize_device(device)
    paths = [os.fspath(p) for p in path] if isinstance(path, (list, tuple)) else [os.fspath(path)]
    names = [i.name for i in _native.Checkpoint(paths).tensors]
    if layers_module is None:
        best = (0, None)
        for mname, m in model.named_modules():
            if isinstance(m, t.nn.ModuleList) and len(m) > 0:
                n = sum(1 for k in names if k.startswith(f"{mname}.") and k[len(mname) + 1 :].split(".")[0].isdigit())
                if n > best[0]:
                    best = (n, mname)
        if best[1] is None:
            raise InvalidArgumentError(f"no ModuleList of {type(model).__name__} matches the checkpoint's names")
        layers_module = best[1]
    blocks = model.get_submodule(layers_module)
    prefix = f"{layers_module}."

    def layer_of(name: str) -> Optional[int]:
        if not name.startswith(prefix):
            return None
        head = name[len(prefix) :].split(".")[0]
        return int(head) if head.isdigit() else None

    streamer = LayerStreamer(paths, layer_of, device=dev, slots=slots, **settings)
    if len(streamer) != len(blocks):
        raise InvalidArgumentError(f"the checkpoint has {len(streamer)} layers under {layers_module}; the model {len(blocks)}")
    # Everything but the layers moves once; the layers' own non-persistent buffers too (they are small).
    parent, leaf = _owner(model, layers_module)
    setattr(parent, leaf, t.nn.ModuleList())
    try:
        model.to(dev)
    finally:
        setattr(parent, leaf, blocks)
    state = model.state_dict(keep_vars=True)
    hooks = []
    for i, block in enumerate(blocks):
        bound = []
        for name in streamer.layers[i]:
            if name not in state:
                raise InvalidArgumentError(f"the checkpoint's {name} is not a parameter or buffer of the model")
            info = streamer._info[name]
            have = state[name]
            want_dtype = streamer._dtypes.get(info.dtype)
            if tuple(have.shape) != tuple(int(d) for d in info.shape) or have.dtype != want_dtype:
                raise InvalidArgumentError(
                    f"{name}: the model has {tuple(have.shape)} {have.dtype}, the checkpoint {list(info.shape)} {info.dtype}"
                )
            owner, attr = _owner(model, name)
            is_param = attr in owner._parameters
            bound.append((name, owner, attr, is_param))
            # Drop the host copy: only the slots hold the layer's weights.
            meta = t.empty_like(have, device="meta")
            if is_param:
                owner._parameters[attr] = t.nn.Parameter(meta, requires_grad=False)
            else:
                owner._buffers[attr] = meta
        for mname, buf in block.named_buffers():
            full = f"{prefix}{i}.{mname}"
            if full not in state or full not in streamer.layers[i]:
                owner, attr = _owner(model, full)
                owner._buffers[attr] = buf.to(dev)

        def pre_hook(module: Any, args: Any, i: int = i, bound: list = bound) -> None:
            views = streamer.load_layer(i)
            for name, owner, attr, is_param in bound:
                if is_param:
                    owner._parameters[attr] = t.nn.Parameter(views[name], requires_grad=False)
                else:
                    owner._buffers[attr] = views[name]

        hooks.append(block.register_forward_pre_hook(pre_hook))
    return StreamedModel(model, streamer, layers_module, hooks)


__all__ = ["LayerStreamer", "LAYER_PATTERN", "stream_model", "StreamedModel"]
