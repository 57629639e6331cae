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


def load_file(
    filename: Union[PathLike, Sequence[PathLike]],
    device: Union[str, int, "torch.device"] = "cpu",
    *,
    backend: "str | None" = None,
    engine: "_native.NativeEngine | None" = None,
) -> dict[str, "torch.Tensor"]:
    """Loads every tensor of a safetensors checkpoint — one file, several shards, or a
    ``model.safetensors.index.json`` — onto ``device`` ("cpu", "cuda", "cuda:N"), as ``safetensors.torch.load_file``
    does. Tensors on a GPU are ready for work on the current stream when this returns. ``backend`` picks the read
    engine for this call ("auto", "uring", "pread", "gds", "nvme-sim"; default: ``WEIGHTLIFT_IO`` or auto)."""
    dev = _core.normalize_device(device)
    if backend is not None and engine is None:
        engine = _core.new_engine(io=backend)
    info = _native.inspect(_paths(filename))
    if info["format"] not in ("safetensors",):
        raise FormatError(f"{filename}: not a safetensors checkpoint (it is {info['format']}); use load_gguf for GGUF")
    return _load_tensors(info, None, dev, engine)


def _load_tensors(info: dict, names: "Sequence[str] | None", device: str, engine) -> dict[str, "torch.Tensor"]:
    tensors = info["tensors"]
    if names is not None:
        by_name = {t[0]: t for t in tensors}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise TensorNotFoundError(f"no tensor {missing[0]!r} in {', '.join(f['path'] for f in info['files'])}")
        tensors = [by_name[n] for n in names]
    paths = [f["path"] for f in info["files"]]
    ranges = [(file, offset, nbytes) for (_, _, _, file, offset, nbytes) in tensors]
    buffers = _core.load_ranges(engine or _core.shared_engine(), paths, ranges, device)
    return {name: _core.as_tensor(buf, dtype, shape) for (name, dtype, shape, *_), buf in zip(tensors, buffers)}


class _Slice:
    """A tensor's lazy slice, as ``safe_open(...).get_slice(name)`` returns: shape and dtype without reading;
    indexing reads only the rows asked for when they are contiguous in the file."""

    def __init__(self, handle: "safe_open", entry: tuple):
        self._handle = handle
        self._entry = entry

    def get_shape(self) -> list[int]:
        return list(self._entry[2])

    def get_dtype(self) -> str:
        return self._entry[1]

    def __len__(self) -> int:
        shape = self._entry[2]
        if not shape:
            raise TypeError("len() of a 0-d tensor")
        return shape[0]

    def __getitem__(self, index: Any) -> "torch.Tensor":
        name, dtype, shape, file, offset, nbytes = self._entry
        idx = index if isinstance(index, tuple) else (index,)
        first = idx[0] if idx else slice(None)
        rest = idx[1:]
        if shape and isinstance(first, slice) and first.step in (None, 1):
            start, stop, _ = first.indices(shape[0])
            stop = max(start, stop)
            row = nbytes // shape[0] if shape[0] else 0
            rows = [stop - start, *shape[1:]]
            [buf] = _core.load_ranges(self._handle._engine, [self._handle._paths[file]], [(0, offset + start * row, (stop - start) * row)], self._handle._device)
            t = _core.as_tensor(buf, dtype, rows)
            return t[(slice(None), *rest)] if rest else t
        return self._handle.get_tensor(name)[index]


class safe_open:
    """``safetensors.safe_open``: opens a checkpoint's header; tensors are read one by one, only when asked for.

    >>> with safe_open("model.safetensors", framework="pt", device="cuda:0") as f:
    ...     w = f.get_tensor("lm_head.weight")
    """

    def __init__(self, filename: Union[PathLike, Sequence[PathLike]], framework: str = "pt", device: Union[str, int] = "cpu", *, engine=None):
        if framework not in ("pt", "torch", "pytorch"):
            raise InvalidArgumentError(f"framework {framework!r} is not supported (weightlift hands out PyTorch tensors)")
        self._device = _core.normalize_device(device)
        self._info = _native.inspect(_paths(filename))
        if self._info["format"] != "safetensors":
            raise FormatError(f"{filename}: not a safetensors checkpoint")
        self._paths = [f["path"] for f in self._info["files"]]
        self._by_name = {t[0]: t for t in self._info["tensors"]}
        self._engine = engine or _core.shared_engine()

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def keys(self) -> list[str]:
        """Tensor names in file order (safetensors sorts them; so does this)."""
        return sorted(self._by_name)

    def offset_keys(self) -> list[str]:
        return [t[0] for t in sorted(self._info["tensors"], key=lambda t: (t[3], t[4]))]

    def metadata(self) -> "dict[str, str] | None":
        meta = self._info["files"][0]["metadata"]
        return dict(meta) if meta else None

    def get_tensor(self, name: str) -> "torch.Tensor":
        return _load_tensors(self._info, [name], self._device, self._engine)[name]

    def get_tensors(self, names: Sequence[str]) -> dict[str, "torch.Tensor"]:
        """Several tensors through one plan (one submission)."""
        return _load_tensors(self._info, list(names), self._device, self._engine)

    def get_slice(self, name: str) -> _Slice:
        if name not in self._by_name:
            raise TensorNotFoundError(f"no tensor {name!r} in {', '.join(self._paths)}")
        return _Slice(self, self._by_name[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __contains__(self, name: str) -> bool:
        return name in self._by_name


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

