"""weightlift: checkpoint tensors from storage to host or GPU memory at the hardware limit.

The APIs of the tools it replaces, with their names, arguments and results:

- safetensors (``safetensors.torch``'s functions): :func:`load_file`, :func:`load`, :class:`safe_open`,
  :func:`save_file`, :func:`save`, :func:`save_model`, :func:`load_model`
- dstorage-gpu: :class:`Loader` (``load_tensor``, ``load_tensors``, ``load_tensor_timed``), :func:`load_tensor`
- torch.cuda.gds: :class:`File` (``load_storage``, ``save_storage``, ``pread``, ``pwrite``)
- drop-in modules with the originals' exact signatures: :mod:`weightlift.dstorage_gpu` (``DirectStorageLoader``),
  :mod:`weightlift.cuda_gds` (``torch.cuda.gds``), :mod:`weightlift.cufile` (``cuda.bindings.cufile``'s functions)
- GGUF: :func:`load_gguf`
- cuFile (GPUDirect Storage): :mod:`weightlift.cufile` (``Session``: handles, buffers, read/write, async, batch,
  vectored I/O)
- :func:`load_into` (weights straight into a ``torch.nn.Module``), :func:`probe`, :func:`last_report`
- layer by layer through a few slots: :class:`LayerStreamer`, :func:`stream_model`; reads by LBA and named regions:
  :mod:`weightlift.nvme`
- several processes on ``torch.distributed``, each byte read once: :mod:`weightlift.distributed`

Settings (keyword arguments of :class:`Loader`, or environment variables) are listed in :data:`SETTINGS`.
The engine's ``tracing`` events (decisions, warnings) reach the ``logging`` logger ``weightlift``.
Errors derive from :class:`WeightliftError`.
"""

from __future__ import annotations

import os
import time
from typing import Any, Union

from . import _core, _errors, _native
from ._errors import (
    ChecksumError,
    CudaError,
    FormatError,
    GdsError,
    InvalidArgumentError,
    IoError,
    NotARegularFileError,
    OutOfMemoryError,
    SharedTensorsError,
    TensorNotFoundError,
    WeightliftError,
    WeightliftFileNotFoundError,
    WeightliftIsADirectoryError,
    WeightliftPermissionError,
    cuFileError,
)
from .dstorage import Loader, load_tensor
from .gds import File, GdsFile
from .gguf import GGUFCheckpoint, load_gguf
from .keep import Keeper, keep, keeper_status
from .layers import LayerStreamer, stream_model
from .nn import load_into
from .safetensors import (
    PrefetchLoader,
    TensorMeta,
    load,
    load_file,
    load_model,
    safe_open,
    save,
    save_file,
    save_model,
)

__version__: str = _native.__version__

#: Every engine setting, as the engine's settings table has it: ``.name`` (the keyword of :class:`Loader`,
#: ``load_file(backend=...)`` and friends), ``.env`` (its ``WEIGHTLIFT_*`` variable), ``.default``, ``.meaning``,
#: ``.values`` (accepted values, for enumerations).
SETTINGS: "list[_native.SettingInfo]" = list(_native.SETTINGS)


def probe(path: Union[str, "os.PathLike[str]", None] = None) -> dict[str, Any]:
    """What this machine offers: CUDA devices and PCIe links, io_uring, cuFile, O_DIRECT support and block size of
    ``path``'s filesystem and how much of ``path`` is in the page cache, and the settings weightlift would use."""
    return _native.probe(os.fspath(path) if path is not None else None)


def last_report() -> "dict[str, Any] | None":
    """The report of the last load in this process: backend and why, bytes, seconds, GB/s, bytes read with
    O_DIRECT and buffered, staging memory, timings. After a call of :mod:`weightlift.cuda_gds` or the functions of
    :mod:`weightlift.cufile`, the report of that call: ``api`` and ``path`` (``engine`` or ``cufile``) and why."""
    return _core.last_report()


def prepare(device: Any, *, kernels: bool = False, engine: "_native.NativeEngine | None" = None) -> dict[str, Any]:
    """Sets the process-wide engine (or ``engine``) up for loads onto ``device`` now, so that a first load from the
    page cache pays for none of it: the I/O lanes' staging memory (mapped, faulted in, pinned for a GPU), and for a
    GPU its CUDA streams (each carrying a first small copy), the events its copies use and a first use of its memory
    pool. A process's first load otherwise does this while it
    runs: on the H100 machine the first 4 GiB ``load_file`` of a fresh process took 1.27-1.46x its second, and
    0.93-1.06x after ``prepare``.

    It moves that work (37-55 ms there), it does not make it cheaper: it saves time only when run beside other
    start-up work (the CUDA context's creation, building the model, reading a tokenizer), for instance on a
    thread::

        threading.Thread(target=weightlift.prepare, args=("cuda:0",)).start()

    Faulting the staging memory in (most of the set-up) needs no CUDA context and runs first; pinning it, the
    streams and the pool use the device's context, and wait for it when another thread is creating it. Name the
    device (``"cuda:0"``) on another thread: ``"cuda"`` means that thread's current device. A load that reads from
    disk sets up its own larger staging (milliseconds beside its seconds of reading).

    ``kernels=True`` also makes the GPU kernels of packed checkpoints (``.wlpack``) and of checked loads
    (``verify=True``) ready: compiled with NVRTC or read from the kernel cache, loaded into the device's context and
    run once on a small chunk (``kernels_secs`` in the result), which a process's first packed or checked load
    otherwise does.

    For a GPU whose tensors come from PyTorch's allocator (the ``device_memory`` setting's default), it also makes
    the side stream the loads allocate on and allocates one small tensor there (``torch_secs``; None where PyTorch
    is not installed or the setting is ``pool``): a first load otherwise creates that stream, its PyTorch handle and
    the allocator's state for it, about a millisecond.

    ``device`` as for :func:`load_file`. Returns what was done: ``staging`` (lanes, lanes set up now, bytes,
    seconds; None where the device's data path does not read through the lanes, such as cuFile peer-to-peer),
    for a GPU ``staging_host`` (the faulting in before the pinning),
    ``streams``, ``pool_secs``, ``torch_secs``, ``seconds``. The memory stays until :func:`release_memory` (or a
    load that needs other staging). Ctrl-C interrupts the wait for lanes busy with loads. Raises
    :class:`CudaError` when a GPU is asked for and CUDA is unavailable."""
    dev = _core.normalize_device(device)
    _core.check_cuda(dev)
    engine = engine or _core.shared_engine()
    done = engine.prepare(dev, bool(kernels))
    done["torch_secs"] = None
    if (dev.startswith("cuda") and engine.device_memory == "torch" and _core.torch_installed()
            and _core.torch_module().cuda.is_available()):
        t0 = time.perf_counter()
        alloc, _ = _core.device_allocator(engine, dev)
        alloc(1)  # freed at once: back to PyTorch's cache, on the side stream's account
        done["torch_secs"] = time.perf_counter() - t0
    done["seconds"] += done["torch_secs"] or 0.0
    return done


def release_memory() -> None:
    """Frees what the process-wide engine keeps between loads: its staging (pinned) memory, freed host buffers, GPU
    decoder scratch, the freed device memory the driver's pool keeps under ``device_cache_bytes``
    (``WEIGHTLIFT_DEVICE_CACHE_BYTES``), and cached files. Tensors already loaded are not touched. The memory of
    GPU tensors loaded with ``device_memory="torch"`` (the default) is PyTorch's: freed tensors go back to its
    cache, which ``torch.cuda.empty_cache()`` empties."""
    engine = _core._shared  # the engine that holds what there is to free (none yet: nothing to free)
    if engine is not None:
        engine.release_memory()


# Fronts that pull in much (ctypes layouts, torch.distributed, transformers) are imported on first use, so that
# `import weightlift` stays cheap: `weightlift.cufile` as an attribute imports it then, as `import weightlift.cufile`
# does.
_LAZY_MODULES = ("cufile", "cuda_gds", "distributed", "dstorage_gpu", "nvme", "transformers")


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY_MODULES})


def cuda_available() -> bool:
    """Whether weightlift can use a CUDA device here."""
    return bool(_native.cuda_status()[0])


__all__ = [
    "load_file",
    "safe_open",
    "PrefetchLoader",
    "TensorMeta",
    "save_file",
    "save",
    "load",
    "save_model",
    "load_model",
    "Loader",
    "load_tensor",
    "File",
    "GdsFile",
    "load_gguf",
    "cufile",
    "distributed",
    "nvme",
    "LayerStreamer",
    "stream_model",
    "GGUFCheckpoint",
    "load_into",
    "keep",
    "keeper_status",
    "Keeper",
    "probe",
    "last_report",
    "prepare",
    "release_memory",
    "cuda_available",
    "SETTINGS",
    *_errors.__all__,
]
