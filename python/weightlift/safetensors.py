"""safetensors-style API: ``load_file``, ``safe_open``, ``save_file``, with the names, arguments and results of the
``safetensors.torch`` functions they replace."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Iterator, Sequence, Union

from . import _core, _native
from ._errors import FormatError, InvalidArgumentError, TensorNotFoundError

if TYPE_CHECKING:
    import torch

PathLike = Union[str, "os.PathLike[str]"]


def _paths(path: Union[PathLike, Sequence[PathLike]]) -> list[str]:
    if isinstance(path, (str, os.PathLike)):
        return [os.fspath(path)]
    return [os.fspath(p) for p in path]


def _checkpoint(filename: Union[PathLike, Sequence[PathLike]]) -> "_native.Checkpoint":
    ckpt = _native.Checkpoint(_paths(filename))
    if ckpt.format != "safetensors" and not (ckpt.format == "wlpack" and ckpt.pack_source.startswith("safetensors")):
        raise FormatError(f"{filename}: not a safetensors checkpoint (it is {ckpt.format}); use load_gguf for GGUF")
    return ckpt


def load_file(
    filename: Union[PathLike, Sequence[PathLike]],
    device: Union[str, int, "torch.device"] = "cpu",
    *,
    backend: "str | None" = None,
    engine: "_native.NativeEngine | None" = None,
    verify: bool = False,
) -> dict[str, "torch.Tensor"]:
    """Loads every tensor of a safetensors checkpoint — one file, several shards, or a
    ``model.safetensors.index.json`` — onto ``device`` ("cpu", "cuda", "cuda:N"), as ``safetensors.torch.load_file``
    does. Tensors on a GPU are ready for work on the current stream when this returns. ``backend`` picks the data
    path for this call (one of the ``backend`` setting's values; default: ``WEIGHTLIFT_BACKEND`` or auto).
    ``verify=True`` (a weightlift extension) checks every loaded byte against each file's checksum manifest
    ``FILE.xxh3.json`` (write it with ``weightlift checksum FILE``) and raises ``ChecksumError`` naming the tensor
    and chunk that differ. Each tensor is hashed as soon as it has landed, overlapped with the rest of the load: GPU
    tensors on their GPU, host tensors on a CPU thread (the report's ``checks`` says what was hashed, where, and how
    long the hashing ran after the reads)."""
    dev = _core.normalize_device(device)
    if backend is not None and engine is None:
        engine = _core.new_engine(backend=backend)
    return _load_tensors(_checkpoint(filename), None, dev, engine, verify)


def _load_tensors(
    ckpt: "_native.Checkpoint", names: "Sequence[str] | None", device: str, engine, verify: bool = False, align: int = 0
) -> dict[str, "torch.Tensor"]:
    """``align``: on a device, every tensor starts at a multiple of it (0: small neighbours as the file lays them)."""
    _core.check_cuda(device)
    infos = ckpt.tensors if names is None else [ckpt.tensor(n) for n in names]
    engine = engine or _core.shared_engine()
    alloc, stream = _core.device_allocator(engine, device)
    buffers = ckpt.load(engine, device, None if names is None else list(names), verify, align, alloc, stream)
    return {i.name: t for i, t in zip(infos, _core.info_tensors(buffers, infos))}


class _Slice:
    """A tensor's lazy slice, as ``safe_open(...).get_slice(name)`` returns: shape and dtype without reading;
    indexing reads only the rows asked for when they are contiguous in the file."""

    def __init__(self, handle: "safe_open", info: "_native.TensorInfo"):
        self._handle = handle
        self._info = info

    def get_shape(self) -> list[int]:
        return list(self._info.shape)

    def get_dtype(self) -> str:
        return self._info.dtype

    def __len__(self) -> int:
        if not self._info.shape:
            raise TypeError("len() of a 0-d tensor")
        return self._info.shape[0]

    def __getitem__(self, index: Any) -> "torch.Tensor":
        info = self._info
        idx = index if isinstance(index, tuple) else (index,)
        first = idx[0] if idx else slice(None)
        rest = idx[1:]
        if info.shape and isinstance(first, slice) and first.step in (None, 1):
            start, stop, _ = first.indices(info.shape[0])
            stop = max(start, stop)
            h = self._handle
            _core.check_cuda(h._device)
            buf = h._ckpt.rows(h._engine, info.name, start, stop, h._device)
            t = _core.as_tensor(buf, info.dtype, [stop - start, *info.shape[1:]])
            return t[(slice(None), *rest)] if rest else t
        return self._handle.get_tensor(info.name)[index]


class safe_open:
    """``safetensors.safe_open``: opens a checkpoint's header; tensors are read when asked for.

    The first ``get_tensor`` starts streaming the checkpoint in file order through the engine's lanes, reading at
    most the ``prefetch_bytes`` setting ahead of the tensors taken (on a GPU, no more than its free memory holds:
    reading ahead pauses until the next ``get_tensor`` when it finds none); each ``get_tensor`` then waits only for
    its own tensor, so a loop over the keys runs as fast as a whole-file load. A tensor asked for before the stream
    reached it is read at once on its own; asking for one twice reads it again. Leaving the ``with`` block (or
    ``close()``) stops the read-ahead and frees what nobody took.

    >>> with safe_open("model.safetensors", framework="pt", device="cuda:0") as f:
    ...     w = f.get_tensor("lm_head.weight")
    """

    def __init__(self, filename: Union[PathLike, Sequence[PathLike]], framework: str = "pt", device: Union[str, int] = "cpu", *, engine=None):
        if framework not in ("pt", "torch", "pytorch"):
            raise InvalidArgumentError(f"framework {framework!r} is not supported (weightlift hands out PyTorch tensors)")
        self._device = _core.normalize_device(device)
        self._ckpt = _checkpoint(filename)
        self._infos = {i.name: i for i in self._ckpt.tensors}
        self._engine = engine or _core.shared_engine()
        self._stream: "_native.NativeStream | None" = None
        self._taken: set[str] = set()
        self._stats: "dict | None" = None

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stops the read-ahead; what was read ahead and not taken is freed (and counted in :meth:`stream_stats`)."""
        if self._stream is not None:
            self._stats = self._stream.close()
            self._stream = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown; nothing to report to
            pass

    def stream_stats(self) -> "dict | None":
        """What the stream read in file order, on demand, and ahead without being taken (after ``close``), and how
        often reading ahead paused for want of device memory (``memory_waits``)."""
        return self._stats

    def keys(self) -> list[str]:
        """Tensor names, sorted (as safetensors returns them)."""
        return sorted(self._infos)

    def offset_keys(self) -> list[str]:
        return [i.name for i in sorted(self._infos.values(), key=lambda i: (i.file, i.offset))]

    def metadata(self) -> "dict[str, str] | None":
        meta = self._ckpt.files[0]["metadata"]
        return dict(meta) if meta else None

    def get_tensor(self, name: str) -> "torch.Tensor":
        info = self._infos.get(name)
        if info is None:
            raise TensorNotFoundError(f"no tensor {name!r} in {', '.join(f['path'] for f in self._ckpt.files)}")
        if name in self._taken:
            return _load_tensors(self._ckpt, [name], self._device, self._engine)[name]
        if self._stream is None:
            _core.check_cuda(self._device)
            self._stream = self._ckpt.stream(self._engine, self._device)
        buf = self._stream.take(name)
        self._taken.add(name)
        return _core.info_tensor(buf, info)

    def get_tensors(self, names: Sequence[str]) -> dict[str, "torch.Tensor"]:
        """Several tensors through one plan (one submission)."""
        return _load_tensors(self._ckpt, list(names), self._device, self._engine)

    def get_slice(self, name: str) -> _Slice:
        info = self._infos.get(name)
        if info is None:
            raise TensorNotFoundError(f"no tensor {name!r} in {', '.join(f['path'] for f in self._ckpt.files)}")
        return _Slice(self, info)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __contains__(self, name: str) -> bool:
        return name in self._infos


def save_file(tensors: dict[str, "torch.Tensor"], filename: PathLike, metadata: "dict[str, str] | None" = None, *, align: int = 8) -> None:
    """Writes ``tensors`` as a safetensors file that ``safetensors`` reads, durably: a temporary file beside
    ``filename``, fsync, rename over it, fsync of the directory. ``align=4096`` starts every tensor on a 4 KiB
    boundary (so later reads can use O_DIRECT without bounce copies); upstream readers then also see small
    ``__weightlift_pad_*`` tensors that weightlift's reader hides."""
    t = _core.torch_module()
    if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise InvalidArgumentError("metadata must map strings to strings")
    keep = []
    entries = []
    # Upstream's order: larger elements first, then by name, so every tensor stays aligned to its element size.
    for name in sorted(tensors, key=lambda n: (-tensors[n].element_size(), n)):
        tensor = tensors[name]
        if not isinstance(tensor, t.Tensor):
            raise InvalidArgumentError(f"{name!r} is not a torch.Tensor")
        if tensor.layout != t.strided:
            raise InvalidArgumentError(f"{name!r}: only dense tensors can be saved")
        host = tensor.detach().to("cpu").contiguous()
        keep.append(host)
        entries.append((name, _core.dtype_name(host.dtype), list(host.shape), host.data_ptr(), host.numel() * host.element_size()))
    _native.save_safetensors(os.fspath(filename), entries, dict(metadata) if metadata else None, align)
    del keep


def save(tensors: dict[str, "torch.Tensor"], metadata: "dict[str, str] | None" = None) -> bytes:
    """The safetensors bytes of ``tensors`` (as ``safetensors.torch.save``)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "t.safetensors")
        save_file(tensors, p, metadata)
        with open(p, "rb") as f:
            return f.read()

