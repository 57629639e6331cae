"""The methods a run times: each loads every tensor of a target onto a device and returns {name: tensor}, or
RawBytes where it reads the file's bytes only (KvikIO, np.fromfile). weightlift's own (``load_file``, ``safe_open``
per key in file and in random order) and the peers' (safetensors, ``torch.load``, KvikIO,
fastsafetensors, the Run:ai model streamer, InstantTensor, ``np.fromfile``); each says why it does not apply where
it does not (``needs``)."""

from __future__ import annotations

import ctypes
import os
import random
from dataclasses import dataclass
from typing import Any, Callable, Optional

from wlbench.checkpoint import Checkpoint, RawBytes


@dataclass
class Target:
    case: str
    ckpt: Checkpoint
    pt: Optional[str] = None  # torch.save copy, for torch.load


@dataclass
class Method:
    name: str
    peer: bool
    load: Callable[[Target, str, "Options"], Any]
    needs: Callable[[Target, str], Optional[str]] = lambda t, d: None  # reason it does not apply, or None
    files: Callable[[Target], list] = lambda t: t.ckpt.files  # what it reads (for warming and dropping)
    note: str = ""
    setup: Callable[["Options"], None] = lambda o: None  # once, before its first timed load


@dataclass
class Options:
    seed: int = 0
    kvikio_threads: int = 32


def wl_load_file(t: Target, dev: str, o: Options) -> dict:
    import weightlift

    return weightlift.load_file(t.ckpt.path, device=dev)


last_stream: dict = {}  # the stream statistics of the last weightlift safe_open load (known once it is closed)


def _wl_safe_open(order: str) -> Callable:
    def load(t: Target, dev: str, o: Options) -> dict:
        import weightlift

        names = key_order(t.ckpt, order, o.seed)
        with weightlift.safe_open(t.ckpt.path, framework="pt", device=dev) as f:
            out = {k: f.get_tensor(k) for k in names}
        last_stream["stats"] = f.stream_stats()
        return out

    return load


def key_order(ckpt: Checkpoint, order: str, seed: int) -> list:
    names = ckpt.names()
    if order == "random":
        random.Random(seed).shuffle(names)
    return names


def _st_load_file(t: Target, dev: str, o: Options) -> dict:
    from safetensors.torch import load_file

    out: dict = {}
    for f in t.ckpt.files:
        out.update(load_file(f, device=dev))
    return out


def _st_safe_open(order: str) -> Callable:
    def load(t: Target, dev: str, o: Options) -> dict:
        from safetensors import safe_open

        names = key_order(t.ckpt, order, o.seed)
        with safe_open(t.ckpt.files[0], framework="pt", device=dev) as f:
            return {k: f.get_tensor(k) for k in names}

    return load


def _torch_load(t: Target, dev: str, o: Options) -> dict:
    import torch

    sd = torch.load(t.pt, mmap=True, weights_only=True)
    # copy=True: on "cpu" a plain .to() would hand back the lazily mapped file.
    return {k: v.to(dev, copy=True) for k, v in sd.items()}


def _kvikio_threads(o: Options) -> None:
    import kvikio.defaults  # a submodule: `import kvikio` alone does not bind it

    kvikio.defaults.set("num_threads", o.kvikio_threads)


def _kvikio(t: Target, dev: str, o: Options) -> RawBytes:
    import kvikio
    import torch

    start = t.ckpt.data_start[0]
    n = os.path.getsize(t.ckpt.files[0]) - start
    buf = torch.empty(n, dtype=torch.uint8, device=dev)
    with kvikio.CuFile(t.ckpt.files[0], "r") as f:
        got = f.pread(buf if dev != "cpu" else buf.numpy(), n, start).get()
    if got != n:
        raise ValueError(f"KvikIO read {got} of {n} bytes")
    return RawBytes(buf, start)


def _fastsafetensors(t: Target, dev: str, o: Options) -> dict:
    from fastsafetensors import fastsafe_open

    with fastsafe_open(list(t.ckpt.files), framework="pt", device=dev, nogds=True) as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _runai(t: Target, dev: str, o: Options) -> dict:
    from runai_model_streamer import SafetensorsStreamer

    with SafetensorsStreamer() as s:
        s.stream_files(list(t.ckpt.files), device=dev)
        return {name: tensor.to(dev) for name, tensor in s.get_tensors()}


def _instanttensor(t: Target, dev: str, o: Options) -> dict:
    from instanttensor import safe_open

    with safe_open(list(t.ckpt.files), framework="pt", device=dev) as f:
        return dict(f.tensors())


def _np_fromfile(t: Target, dev: str, o: Options) -> RawBytes:
    import numpy as np
    import torch

    return RawBytes(torch.from_numpy(np.fromfile(t.ckpt.files[0], dtype=np.uint8)), 0)


def _np_fromfile_to(t: Target, dev: str, o: Options) -> RawBytes:
    return RawBytes(_np_fromfile(t, dev, o).data.to(dev), 0)


def _importable(module: str) -> Callable[[Target, str], Optional[str]]:
    def needs(t: Target, dev: str) -> Optional[str]:
        return import_error(module)

    return needs


_import_errors: dict = {}


def import_error(module: str) -> Optional[str]:
    if module not in _import_errors:
        try:
            __import__(module)
            _import_errors[module] = None
        except Exception as e:  # a peer's import can fail in many ways (missing CUDA libraries, ABI)
            _import_errors[module] = f"import {module} failed: {type(e).__name__}: {e}"
    return _import_errors[module]


def _all(*checks: Callable[[Target, str], Optional[str]]) -> Callable[[Target, str], Optional[str]]:
    def needs(t: Target, dev: str) -> Optional[str]:
        for c in checks:
            why = c(t, dev)
            if why:
                return why
        return None

    return needs


def _one_file(t: Target, dev: str) -> Optional[str]:
    return None if len(t.ckpt.files) == 1 else "reads one file"


def _cuda_only(t: Target, dev: str) -> Optional[str]:
    return None if dev.startswith("cuda") else "loads onto CUDA devices only"


def _cuda_driver(t: Target, dev: str) -> Optional[str]:
    """KvikIO opens the CUDA driver even for host buffers."""
    try:
        ctypes.CDLL("libcuda.so.1")
        return None
    except OSError as e:
        return f"needs the CUDA driver, even for host buffers ({e})"


def _has_pt(t: Target, dev: str) -> Optional[str]:
    return None if t.pt else "no .pt copy of this checkpoint"


def methods() -> list:
    wl = _importable("weightlift")
    return [
        Method("weightlift.load_file", False, wl_load_file, wl),
        Method("weightlift.safe_open get_tensor file-order", False, _wl_safe_open("file"), wl),
        Method("weightlift.safe_open get_tensor random-order", False, _wl_safe_open("random"), wl),
        Method("safetensors.load_file", True, _st_load_file, _importable("safetensors"),
               note="one call per shard when sharded"),
        Method("safetensors.safe_open get_tensor file-order", True, _st_safe_open("file"),
               _all(_importable("safetensors"), _one_file)),
        Method("safetensors.safe_open get_tensor random-order", True, _st_safe_open("random"),
               _all(_importable("safetensors"), _one_file)),
        Method("torch.load(mmap=True) .to(device)", True, _torch_load, _has_pt, files=lambda t: [t.pt],
               note="reads a torch.save copy of the same tensors"),
        Method("kvikio pread", True, _kvikio, _all(_importable("kvikio"), _cuda_driver, _one_file),
               note="raw bytes of the data region into one buffer, no tensors", setup=_kvikio_threads),
        Method("fastsafetensors (nogds)", True, _fastsafetensors, _importable("fastsafetensors")),
        Method("runai-model-streamer", True, _runai, _importable("runai_model_streamer")),
        Method("instanttensor", True, _instanttensor, _all(_cuda_only, _importable("instanttensor"))),
        Method("np.fromfile .to(device)", True, _np_fromfile_to, _all(_cuda_only, _one_file),
               note="the whole file as raw bytes, then one pageable copy"),
    ]


NP_FROMFILE = Method("np.fromfile", True, _np_fromfile, _one_file, note="the whole file into fresh host memory")


def method_named(name: str) -> Method:
    for m in methods() + [NP_FROMFILE]:
        if m.name == name:
            return m
    raise KeyError(name)
