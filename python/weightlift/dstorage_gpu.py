"""Drop-in for the ``dstorage_gpu`` package: ``DirectStorageLoader`` and the module-level ``load_tensor`` with the
same names, keywords (``filepath``, ``num_elements``, ``dtype``, ``device``, ``file_specs``), defaults
(``dtype=torch.float32``, ``device="cuda"``) and results (1-D ``torch.Tensor`` on the GPU, a list of them,
``(tensor, elapsed_seconds)``). Code written for ``from dstorage_gpu import DirectStorageLoader`` runs after
changing only the import:

>>> from weightlift.dstorage_gpu import DirectStorageLoader
>>> loader = DirectStorageLoader()
>>> w = loader.load_tensor("weights.bin", num_elements=1 << 20)

dstorage-gpu is Windows-only (DirectStorage into a D3D12 buffer, then a device-to-device copy); here weightlift's
engine reads the files (io_uring, O_DIRECT where the filesystem takes it, pinned staging, copies overlapped with
the reads) straight into the tensor's memory. Differences, all additions that leave the original's calls unchanged:

- ``DirectStorageLoader(device=..., **settings)`` takes optional keywords: the device the loader's calls load onto
  when they do not name one (``"cuda"``, PyTorch's current GPU, as the original), and engine settings
  (:data:`weightlift.SETTINGS`). ``device="cpu"`` is accepted (the original requires ``"cuda"``), by the
  module-level ``load_tensor`` too (its ``device`` keyword is an addition), so code runs on a machine without a GPU.
- ``prepare(device="cuda")`` sets up now what the loader's first load would set up while it runs (the lanes'
  staging, pinned for a GPU, their streams, a first use of the device's memory pool): see
  :func:`weightlift.prepare`.
- Errors are weightlift's (:class:`weightlift.WeightliftError` subclasses that also derive from the builtin Python
  users expect): a missing file raises ``FileNotFoundError``, a file shorter than ``num_elements`` elements
  ``ValueError`` naming the file, a GPU load without a usable GPU ``RuntimeError`` (:class:`weightlift.CudaError`).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Sequence, Union

import torch

from . import _core
from .dstorage import Loader

PathLike = Union[str, "os.PathLike[str]"]


class _LoaderDevice(str):
    """The ``device`` default: equal to ``"cuda"``, and read as "the loader's device" (``"cuda"`` unless the loader
    was made for another)."""


_CUDA = _LoaderDevice("cuda")


class DirectStorageLoader:
    """Loads raw binary files into 1-D tensors. Create once and reuse: it keeps its engine (I/O lanes, pinned
    staging, open files) between calls. Safe to share between threads."""

    def __init__(self, *, device: Union[str, int, "torch.device"] = "cuda", **settings: Any):
        self._loader = Loader(device, **settings)

    def _device(self, device: Any) -> str:
        return self._loader.device if device is _CUDA else _core.normalize_device(device)

    def load_tensor(
        self,
        filepath: PathLike,
        num_elements: int,
        dtype: torch.dtype = torch.float32,
        device: str = _CUDA,
    ) -> torch.Tensor:
        """The first ``num_elements`` elements of ``filepath`` as a 1-D tensor of ``dtype`` on ``device``."""
        return self._loader.load_tensors([(filepath, num_elements)], dtype, self._device(device))[0]

    def load_tensors(self, file_specs: Sequence[tuple[PathLike, int]], dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
        """One tensor per ``(filepath, num_elements)`` of ``file_specs``, all files read through one plan."""
        specs = [(path, n) for path, n in file_specs]
        return self._loader.load_tensors(specs, dtype, self._loader.device)

    def prepare(self, device: str = _CUDA) -> dict:
        """A weightlift addition: sets up now, for loads onto ``device`` (the loader's device by default), what the
        first one would set up while it runs; returns what was done (:func:`weightlift.prepare`)."""
        return self._loader.prepare(self._device(device))

    def load_tensor_timed(self, filepath: PathLike, num_elements: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, float]:
        """``load_tensor`` and its duration in seconds (the tensor's bytes are in place when the clock stops)."""
        start = time.perf_counter()
        tensor = self.load_tensor(filepath, num_elements, dtype)
        return tensor, time.perf_counter() - start


_shared: "DirectStorageLoader | None" = None
_shared_lock = threading.Lock()


def _shared_loader() -> DirectStorageLoader:
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = DirectStorageLoader()
        return _shared


def load_tensor(filepath: PathLike, num_elements: int, dtype: torch.dtype = torch.float32, *, device: Union[str, int, "torch.device"] = _CUDA) -> torch.Tensor:
    """:meth:`DirectStorageLoader.load_tensor` on one loader shared by the process, onto ``device``: the current GPU
    as the original, or (a weightlift addition) another GPU or ``"cpu"`` on a machine without one."""
    return _shared_loader().load_tensor(filepath, num_elements, dtype, device)


__all__ = ["DirectStorageLoader", "load_tensor"]
