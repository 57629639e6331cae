"""safetensors-style API: the functions of ``safetensors.torch`` — ``load_file``, ``load``, ``save_file``, ``save``,
``save_model``, ``load_model`` — and ``safe_open``, with their names, arguments, results and refusals.

Where upstream refuses (a value that is not a tensor, a sparse, shared or non-contiguous tensor), weightlift refuses
with upstream's message, as a :class:`weightlift.WeightliftError` that is also the builtin upstream raises
(``ValueError``; ``RuntimeError`` for shared tensors). Where upstream raises ``safetensors.SafetensorError`` (a
malformed header, a tensor not in the file) and the ``safetensors`` package is installed, the error is also a
``SafetensorError``, so ``except SafetensorError`` catches it. ``backend="mmap"`` (upstream's default) is accepted
and means weightlift's own default path; ``framework="np"`` hands out numpy arrays."""

from __future__ import annotations

import functools
import operator
import os
from typing import TYPE_CHECKING, Any, Iterator, Sequence, Union

from . import _core, _native
from ._errors import FormatError, InvalidArgumentError, SharedTensorsError, TensorNotFoundError

if TYPE_CHECKING:
    import torch

PathLike = Union[str, "os.PathLike[str]"]


def _paths(path: Union[PathLike, Sequence[PathLike]]) -> list[str]:
    if isinstance(path, (str, os.PathLike)):
        return [os.fspath(path)]
    return [os.fspath(p) for p in path]


_upstream_classes: dict[type, type] = {}


def _as_upstream(e: Exception) -> Exception:
    """``e`` as an instance of a class deriving from its own and from ``safetensors.SafetensorError``, where the
    ``safetensors`` package is installed (imported only when an error is raised)."""
    try:
        from safetensors import SafetensorError
    except ImportError:
        return e
    cls = _upstream_classes.get(type(e))
    if cls is None:
        cls = _upstream_classes[type(e)] = type(type(e).__name__, (type(e), SafetensorError), {"__module__": __name__})
    out = cls(*e.args)
    out.__cause__, out.__traceback__ = e.__cause__, e.__traceback__
    return out


def _upstream_errors(fn):
    """Raises the errors upstream raises as ``SafetensorError`` (format errors, unknown tensors) as such too."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (FormatError, TensorNotFoundError) as e:
            raise _as_upstream(e) from None

    return wrapper


def _checkpoint(filename: Union[PathLike, Sequence[PathLike]]) -> "_native.Checkpoint":
    ckpt = _native.Checkpoint(_paths(filename))
    if ckpt.format != "safetensors" and not (ckpt.format == "wlpack" and ckpt.pack_source.startswith("safetensors")):
        raise FormatError(f"{filename}: not a safetensors checkpoint (it is {ckpt.format}); use load_gguf for GGUF")
    return ckpt


# Upstream's `backend` values that are not the engine's: "mmap", upstream's default, is weightlift's default path.
_UPSTREAM_BACKENDS: dict[str, "str | None"] = {"mmap": None}


def _call_engine(engine, backend: "str | None", cache_dir: "PathLike | None"):
    """The engine of one call: ``engine``, or one with this call's ``backend`` and ``cache_dir`` (the engine's
    ``remote_cache_dir`` setting) where either is given; None (the shared engine) otherwise."""
    backend = _UPSTREAM_BACKENDS.get(backend, backend) if isinstance(backend, str) else backend
    settings = {"backend": backend, "remote_cache_dir": None if cache_dir is None else os.fspath(cache_dir)}
    if engine is not None:
        if cache_dir is not None:
            raise InvalidArgumentError("cache_dir= and engine= both given: set remote_cache_dir on the engine")
        return engine
    if all(v is None for v in settings.values()):
        return None
    return _core.new_engine(**settings)


@_upstream_errors
def load_file(
    filename: Union[PathLike, Sequence[PathLike]],
    device: Union[str, int, "torch.device"] = "cpu",
    *,
    backend: "str | None" = None,
    engine: "_native.NativeEngine | None" = None,
    verify: bool = False,
    progress: Any = False,
    cache_dir: "PathLike | None" = None,
) -> dict[str, "torch.Tensor"]:
    """Loads every tensor of a safetensors checkpoint — one file, several shards, or a
    ``model.safetensors.index.json`` — onto ``device`` ("cpu", "cuda", "cuda:N"), as ``safetensors.torch.load_file``
    does. Tensors on a GPU are ready for work on the current stream when this returns. ``backend`` picks the data
    path for this call (one of the ``backend`` setting's values; default: ``WEIGHTLIFT_BACKEND`` or auto).
    ``verify=True`` (a weightlift extension) checks every loaded byte against each file's checksum manifest
    ``FILE.xxh3.json`` (write it with ``weightlift checksum FILE``) and raises ``ChecksumError`` naming the tensor
    and chunk that differ. Each tensor is hashed as soon as it has landed, overlapped with the rest of the load: GPU
    tensors on their GPU, host tensors on a CPU thread (the report's ``checks`` says what was hashed, where, and how
    long the hashing ran after the reads).

    ``progress=True`` shows the load's progress (a ``tqdm`` bar where tqdm is installed, else a line on stderr
    rewritten as it goes) once it has taken more than a second; a callable gets ``progress(bytes_done,
    bytes_total)`` every 50 ms instead (an exception it raises cancels the load). ``backend="mmap"``, upstream's
    default, means weightlift's default path.

    ``cache_dir`` (objects: ``s3://``, ``gs://``, ``az://``, ``http(s)://``): a folder of local copies for this call
    (the ``remote_cache_dir`` setting; ``WEIGHTLIFT_REMOTE_CACHE_DIR`` sets it for every call). The load writes the
    object's copy there as its bytes arrive, and a later load reads the copy while the object's ETag is unchanged
    (docs/object-storage.md)."""
    dev = _core.normalize_device(device)
    engine = _call_engine(engine, backend, cache_dir)
    return _load_tensors(_checkpoint(filename), None, dev, engine, verify, progress=progress)


def _load_tensors(
    ckpt: "_native.Checkpoint",
    names: "Sequence[str] | None",
    device: str,
    engine,
    verify: bool = False,
    align: int = 0,
    progress: Any = False,
) -> dict[str, "torch.Tensor"]:
    """``align``: on a device, every tensor starts at a multiple of it (0: small neighbours as the file lays them)."""
    _core.check_cuda(device)
    infos = ckpt.tensors if names is None else [ckpt.tensor(n) for n in names]
    engine = engine or _core.shared_engine()
    alloc, stream = _core.device_allocator(engine, device)
    with _core.progress_hook(progress, sum(i.nbytes for i in infos), "loading") as hook:
        buffers = ckpt.load(engine, device, None if names is None else list(names), verify, align, alloc, stream, hook)
    return {i.name: t for i, t in zip(infos, _core.info_tensors(buffers, infos))}


class _Slice:
    """A tensor's lazy slice, as ``safe_open(...).get_slice(name)`` returns: shape and dtype without reading;
    indexing reads only the rows of the first dimension it spans."""

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
        """Basic indexing (integers, slices with positive steps, ``...``, ``None`` after the first index) reads only
        the rows of the first dimension it spans; other indexings read the tensor."""
        info = self._info
        idx = index if isinstance(index, tuple) else (index,)
        span = self._rows(idx[0] if idx else slice(None))
        if span is None:
            return self._handle._out(self._handle.get_tensor(info.name)[index])
        start, stop, first = span
        h = self._handle
        _core.check_cuda(h._device)
        buf = h._ckpt.rows(h._engine, info.name, start, stop, h._device)
        t = _core.as_tensor(buf, info.dtype, [stop - start, *info.shape[1:]])
        return h._out(t[(first, *idx[1:])])

    def _rows(self, first: Any) -> "tuple[int, int, Any] | None":
        """``(start, stop, index)``: the rows of the first dimension ``first`` needs, and the index that picks them
        out of those rows; None when the whole tensor is read instead."""
        shape = self._info.shape
        if not shape:
            return None
        n = shape[0]
        if isinstance(first, slice):
            start, stop, step = first.indices(n)
            if step < 0:
                return None  # torch has no negative steps: its own error
            count = len(range(start, stop, step))
            return start, start + (count - 1) * step + 1 if count else start, slice(None, None, step)
        if isinstance(first, bool) or not hasattr(first, "__index__") or hasattr(first, "shape"):
            return None  # a mask, a tensor or an array index, ..., None
        i = operator.index(first)
        if not -n <= i < n:
            raise IndexError(f"index {i} is out of bounds for dimension 0 with size {n}")
        i %= n
        return i, i + 1, 0


class safe_open:
    """``safetensors.safe_open``: opens a checkpoint's header; tensors are read when asked for.

    The first ``get_tensor`` starts streaming the checkpoint in file order through the engine's lanes, reading at
    most the ``prefetch_bytes`` setting ahead of the tensors taken (on a GPU, no more than its free memory holds:
    reading ahead pauses until the next ``get_tensor`` when it finds none); each ``get_tensor`` then waits only for
    its own tensor, so a loop over the keys runs as fast as a whole-file load. A tensor asked for before the stream
    reached it is read at once on its own; asking for one twice reads it again. Leaving the ``with`` block (or
    ``close()``) stops the read-ahead and frees what nobody took.

    ``cache_dir`` (objects): a folder of local copies, as :func:`load_file`'s: tensors are read from the object's
    valid copy there, and ``get_tensors()`` of every key writes one (``get_tensor``'s stream and slices do not).

    >>> with safe_open("model.safetensors", framework="pt", device="cuda:0") as f:
    ...     w = f.get_tensor("lm_head.weight")
    """

    @_upstream_errors
    def __init__(
        self,
        filename: Union[PathLike, Sequence[PathLike]],
        framework: str = "pt",
        device: Union[str, int] = "cpu",
        *,
        backend: "str | None" = None,
        engine=None,
        cache_dir: "PathLike | None" = None,
    ):
        if framework not in _FRAMEWORKS:
            raise InvalidArgumentError(f"framework {framework!r} is not supported: expected one of {', '.join(_FRAMEWORKS)}")
        self._numpy = _FRAMEWORKS[framework]
        self._device = _core.normalize_device(device)
        if self._numpy and self._device != "cpu":
            raise InvalidArgumentError(f"framework {framework!r} hands out numpy arrays, which live on the cpu, not {self._device}")
        engine = _call_engine(engine, backend, cache_dir)
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

    def _out(self, tensor: "torch.Tensor") -> Any:
        """A tensor as this handle's framework hands it out."""
        return _numpy_array(tensor) if self._numpy else tensor

    def _info(self, name: str) -> "_native.TensorInfo":
        info = self._infos.get(name)
        if info is None:
            raise TensorNotFoundError(f"no tensor {name!r} in {', '.join(f['path'] for f in self._ckpt.files)}")
        return info

    @_upstream_errors
    def get_tensor(self, name: str) -> "torch.Tensor":
        info = self._info(name)
        if name in self._taken:
            return self._out(_load_tensors(self._ckpt, [name], self._device, self._engine)[name])
        if self._stream is None:
            _core.check_cuda(self._device)
            self._stream = self._ckpt.stream(self._engine, self._device)
        buf = self._stream.take(name)
        self._taken.add(name)
        return self._out(_core.info_tensor(buf, info))

    @_upstream_errors
    def get_tensors(self, names: "Sequence[str] | None" = None) -> dict[str, "torch.Tensor"]:
        """Several tensors (all of them by default, as upstream's ``get_tensors()``) through one plan."""
        names = self.keys() if names is None else list(names)
        for name in names:
            self._info(name)
        return {k: self._out(v) for k, v in _load_tensors(self._ckpt, names, self._device, self._engine).items()}

    @_upstream_errors
    def get_slice(self, name: str) -> _Slice:
        return _Slice(self, self._info(name))

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __contains__(self, name: str) -> bool:
        return name in self._infos


def _refuse_unsaveable(tensors: Any) -> None:
    """Upstream's refusals, with its messages: a non-dict, a value that is not a tensor, sparse tensors, tensors
    sharing memory, non-contiguous tensors; and a meta tensor, which has no bytes to save."""
    t = _core.torch_module()
    if not isinstance(tensors, dict):
        raise InvalidArgumentError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    sparse = []
    for k, v in tensors.items():
        if not isinstance(v, t.Tensor):
            raise InvalidArgumentError(f"Key `{k}` is invalid, expected torch.Tensor but received {type(v)}")
        if v.layout != t.strided:
            sparse.append(k)
    if sparse:
        raise InvalidArgumentError(
            f"You are trying to save a sparse tensors: `{sparse}` which this library does not support."
            " You can make it a dense tensor before saving with `.to_dense()` but be aware this might"
            " make a much larger file than needed."
        )
    failing = [names for names in _shared_tensors(tensors) if len(names) > 1]
    if failing:
        raise SharedTensorsError(
            f"Some tensors share memory, this will lead to duplicate memory on disk and potential differences when"
            f" loading them again: {failing}. A potential way to correctly save your model is to use `save_model`."
            " More information at https://huggingface.co/docs/safetensors/torch_shared_tensors"
        )
    for k, v in tensors.items():
        if v.is_meta:
            raise InvalidArgumentError(f"Key `{k}` is a meta tensor: it has no data to save")
        if not v.is_contiguous():
            raise InvalidArgumentError(
                f"You are trying to save a non contiguous tensor: `{k}` which is not allowed. It either means you"
                " are trying to save tensors which are reference of each other in which case it's recommended to save"
                " only the full tensors, and reslice at load time, or simply call `.contiguous()` on your tensor to"
                " pack it before saving."
            )


def _storage_key(v: "torch.Tensor") -> "tuple | None":
    """(device, storage address, storage bytes) of a tensor with memory of its own, None for meta or empty ones."""
    if v.is_meta:
        return None
    storage = v.untyped_storage()
    if storage.data_ptr() == 0 or storage.nbytes() == 0:
        return None
    return (v.device, storage.data_ptr(), storage.nbytes())


def _shared_tensors(tensors: dict[str, "torch.Tensor"]) -> list[set[str]]:
    """Groups of names whose tensors overlap in memory (upstream's ``_find_shared_tensors``: views of one storage
    that do not overlap are not shared)."""
    by_storage: dict[tuple, set[str]] = {}
    for k, v in tensors.items():
        key = _storage_key(v)
        if key is not None:
            by_storage.setdefault(key, set()).add(k)
    groups: list[set[str]] = []
    for names in sorted(by_storage.values(), key=sorted):
        if len(names) < 2:
            groups.append(names)
            continue
        areas = sorted((tensors[n].data_ptr(), _end(tensors[n]), n) for n in names)
        _, last_stop, first = areas[0]
        groups.append({first})
        for start, stop, name in areas[1:]:
            if start >= last_stop:
                groups.append({name})
            else:
                groups[-1].add(name)
            last_stop = stop
    return groups


def _end(v: "torch.Tensor") -> int:
    if v.nelement():
        return v.reshape(-1)[-1].data_ptr() + v.element_size()
    return v.data_ptr()


def save_file(tensors: dict[str, "torch.Tensor"], filename: PathLike, metadata: "dict[str, str] | None" = None, *, align: int = 8) -> None:
    """Writes ``tensors`` as a safetensors file that ``safetensors`` reads, durably: a temporary file beside
    ``filename``, fsync, rename over it, fsync of the directory. Refuses what upstream refuses, with its messages
    (see the module's documentation). ``align=4096`` starts every tensor on a 4 KiB boundary (so later reads can use
    O_DIRECT without bounce copies); upstream readers then also see small ``__weightlift_pad_*`` tensors that
    weightlift's reader hides."""
    _refuse_unsaveable(tensors)
    if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise InvalidArgumentError("metadata must map strings to strings")
    keep = []
    entries = []
    # Upstream's order: larger elements first, then by name, so every tensor stays aligned to its element size.
    for name in sorted(tensors, key=lambda n: (-tensors[n].element_size(), n)):
        host = tensors[name].detach().to("cpu")
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


@_upstream_errors
def load(data: bytes) -> dict[str, "torch.Tensor"]:
    """The tensors of safetensors bytes, on the cpu (as ``safetensors.torch.load``); the bytes are read from an
    anonymous in-memory file."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected bytes, not {type(data).__name__}")
    fd = os.memfd_create("weightlift-load")
    try:
        with os.fdopen(os.dup(fd), "wb") as f:
            f.write(data)
        return _load_tensors(_checkpoint(f"/proc/self/fd/{fd}"), None, "cpu", None)
    finally:
        os.close(fd)


def _kept_and_dropped(state_dict: dict[str, "torch.Tensor"], preferred: "set[str]" = frozenset()) -> dict[str, list[str]]:
    """For each group of tensors sharing memory, the name kept (one covering its whole storage; a preferred name
    first, then the first in order) → the names dropped (upstream's ``_remove_duplicate_names``)."""
    out: dict[str, list[str]] = {}
    for shared in _shared_tensors(state_dict):
        complete = {n for n in shared if _is_complete(state_dict[n])}
        if not complete:
            raise SharedTensorsError(
                "Error while trying to find names to remove to save state dict, but found no suitable name to keep"
                f" for saving amongst: {shared}. None is covering the entire storage.Refusing to save/load the model"
                " since you could be storing much more memory than needed. Please refer to"
                " https://huggingface.co/docs/safetensors/torch_shared_tensors for more information. Or open an"
                " issue."
            )
        keep = sorted(preferred & complete or complete)[0]
        dropped = sorted(n for n in shared if n != keep)
        if dropped:
            out[keep] = dropped
    return out


def _is_complete(v: "torch.Tensor") -> bool:
    storage = v.untyped_storage()
    return v.data_ptr() == storage.data_ptr() and v.nelement() * v.element_size() == storage.nbytes()


def save_model(model: "torch.nn.Module", filename: PathLike, metadata: "dict[str, str] | None" = None, force_contiguous: bool = True) -> None:
    """Saves ``model.state_dict()`` as ``safetensors.torch.save_model`` does: of tensors sharing memory (tied
    weights) one is saved, and the metadata maps each dropped name to the kept one."""
    state_dict = model.state_dict()
    for kept, dropped in _kept_and_dropped(state_dict).items():
        for name in dropped:
            metadata = {} if metadata is None else metadata
            metadata.setdefault(name, kept)
            del state_dict[name]
    if force_contiguous:
        state_dict = {k: v.contiguous() for k, v in state_dict.items()}
    try:
        save_file(state_dict, filename, metadata=metadata)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"{e} Or use save_model(..., force_contiguous=True), read the docs for potential caveats.") from e


def load_model(
    model: "torch.nn.Module",
    filename: PathLike,
    strict: bool = True,
    device: Union[str, int, "torch.device"] = "cpu",
    *,
    backend: "str | None" = None,
) -> tuple[list[str], list[str]]:
    """Loads a file written by :func:`save_model` (or any safetensors file) into ``model``, as
    ``safetensors.torch.load_model`` does; returns ``(missing, unexpected)`` names, and raises ``RuntimeError`` with
    torch's wording when ``strict`` and either is not empty."""
    state_dict = load_file(filename, device=device, backend=backend)
    dropped = _kept_and_dropped(model.state_dict(), set(state_dict))
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = set(missing)
    for names in dropped.values():
        for name in names:
            if name in missing:
                missing.remove(name)
            else:
                unexpected.append(name)
    if strict and (missing or unexpected):
        error = f"Error(s) in loading state_dict for {model.__class__.__name__}:"
        if missing:
            error += "\n    Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(missing))
        if unexpected:
            error += "\n    Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(unexpected))
        raise RuntimeError(error)
    return list(missing), unexpected


_FRAMEWORKS = {"pt": False, "torch": False, "pytorch": False, "np": True, "numpy": True}


def _numpy_array(tensor: "torch.Tensor") -> Any:
    """A cpu tensor as the numpy array sharing its memory (numpy lacks bfloat16 and the float8 types)."""
    try:
        return tensor.numpy()
    except TypeError as e:
        raise InvalidArgumentError(f"numpy has no dtype for {tensor.dtype}: open with framework='pt'") from e
