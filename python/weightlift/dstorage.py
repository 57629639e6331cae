"""dstorage-gpu-style API: raw files straight into (GPU) tensors — ``Loader().load_tensor(path, num_elements,
dtype)``, several files in one submission with ``load_tensors``, timings with ``load_tensor_timed``."""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any, Sequence, Union

from . import _args, _core, _native

if TYPE_CHECKING:
    import torch

PathLike = Union[str, "os.PathLike[str]"]


class Loader:
    """Loads raw files as 1-D tensors. Settings (any name of :data:`weightlift.SETTINGS`, e.g. ``threads=8``)
    default to the ``WEIGHTLIFT_*`` environment variables. Safe to share between threads."""

    def __init__(self, device: Union[str, int, "torch.device"] = "cuda", **settings: Any):
        self.device = _core.normalize_device(device)
        self._engine = _core.new_engine(**settings)

    def settings(self) -> dict:
        """Every setting's value and where it came from (default, environment, caller)."""
        return self._engine.settings()

    def prepare(self, device: Union[str, int, "torch.device", None] = None) -> dict:
        """:func:`weightlift.prepare` for this loader's engine: sets up now what its first load onto ``device`` (the
        loader's device by default) would set up while it runs (the lanes' staging, for a GPU pinned, its streams
        and a first use of its memory pool). Returns what was done."""
        from . import prepare

        return prepare(self.device if device is None else device, engine=self._engine)

    def load_tensors(
        self,
        items: Sequence[tuple[PathLike, int]],
        dtype: "torch.dtype | None" = None,
        device: Union[str, int, "torch.device", None] = None,
    ) -> list["torch.Tensor"]:
        """Loads ``[(path, num_elements), ...]`` in one submission (one plan over all files)."""
        t = _core.torch_module()
        dtype = t.float32 if dtype is None else dtype
        name = _core.dtype_name(dtype)
        dev = self.device if device is None else _core.normalize_device(device)
        paths = [os.fspath(p) for p, _ in items]
        counts = [_args.unsigned("num_elements", n) for _, n in items]
        for p, n in zip(paths, counts):
            # Validates the element count against the file (a typed error naming the file if it is too short).
            _native.Checkpoint([p], name, n)
        size = t.empty((), dtype=dtype).element_size()
        ranges = [(i, 0, n * size) for i, n in enumerate(counts)]
        buffers = _core.load_ranges(self._engine, paths, ranges, dev)
        return [_core.as_tensor(b, name, [n]) for b, n in zip(buffers, counts)]

    def load_tensor(
        self,
        path: PathLike,
        num_elements: int,
        dtype: "torch.dtype | None" = None,
        device: Union[str, int, "torch.device", None] = None,
    ) -> "torch.Tensor":
        """The first ``num_elements`` elements of ``path`` as a 1-D tensor of ``dtype`` (float32 by default)."""
        return self.load_tensors([(path, num_elements)], dtype, device)[0]

    def load_tensor_timed(
        self,
        path: PathLike,
        num_elements: int,
        dtype: "torch.dtype | None" = None,
        device: Union[str, int, "torch.device", None] = None,
    ) -> tuple["torch.Tensor", float]:
        """``load_tensor`` and the seconds it took (the tensor is ready when the clock stops)."""
        start = time.perf_counter()
        tensor = self.load_tensor(path, num_elements, dtype, device)
        return tensor, time.perf_counter() - start


_shared: "Loader | None" = None
_lock = threading.Lock()


def load_tensor(
    path: PathLike,
    num_elements: int,
    dtype: "torch.dtype | None" = None,
    device: Union[str, int, "torch.device"] = "cuda",
) -> "torch.Tensor":
    """``Loader.load_tensor`` on a loader shared by the process."""
    global _shared
    with _lock:
        if _shared is None:
            _shared = Loader(device)
    return _shared.load_tensor(path, num_elements, dtype, device)
