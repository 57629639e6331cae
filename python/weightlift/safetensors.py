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
from ._errors import FormatError, InvalidArgumentError, SharedTensorsError, TensorNotFoundError, WeightliftError

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
        # Tensors a keeper served (taken out as they are asked for); False where it served none.
        self._kept: "dict | bool | None" = None
        self._taken: set[str] = set()
        self._stats: "dict | None" = None

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stops the read-ahead; what was read ahead and not taken is freed (and counted in :meth:`stream_stats`)."""
        self._kept = False  # what a keeper served and was not taken goes with the handle; later takes stream
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
        if not self._kept and self._stream is None:
            _core.check_cuda(self._device)
            if self._kept is None:
                self._kept = self._from_keeper()
            if not self._kept:
                self._stream = self._ckpt.stream(self._engine, self._device)
        if self._kept:
            tensor = self._kept.pop(name)
        else:
            tensor = _core.info_tensor(self._stream.take(name), info)
        self._taken.add(name)
        return self._out(tensor)

    def _from_keeper(self) -> "dict | bool":
        """Every tensor from a keeper (`weightlift keep`), where one keeps the checkpoint's files and the checkpoint
        fits the read-ahead a stream would allow itself (``prefetch_bytes``); False otherwise (then it streams)."""
        engine = self._engine or _core.shared_engine()
        limit = int(engine.settings()["prefetch_bytes"]["value"])
        if sum(i.nbytes for i in self._infos.values()) > limit:
            return False
        alloc, stream = _core.device_allocator(engine, self._device)
        buffers = self._ckpt.load_kept(engine, self._device, alloc, stream)
        if buffers is None:
            return False
        ordered = self._ckpt.tensors
        return {i.name: t for i, t in zip(ordered, _core.info_tensors(buffers, ordered))}

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

    @_upstream_errors
    def get_tensor_meta(self, name: str) -> "TensorMeta":
        """A tensor's header entry (safetensors 0.9): dtype, shape and its byte range in the data section."""
        info = self._infos.get(name)
        if info is None:
            raise TensorNotFoundError(f"File does not contain tensor {name}")
        start = info.offset - self._ckpt.files[info.file]["data_start"]
        return TensorMeta(info.dtype, list(info.shape), (start, start + info.nbytes))

    def prefetch(
        self, plan: "PrefetchPlan | None" = None, *, device: "str | int | None" = None, threads: int = 8
    ) -> "PrefetchLoader":
        """safetensors 0.9's ``prefetch``: starts loading the tensors of ``plan`` (every tensor when None; a name
        maps to None for the whole tensor or a step-1 ``slice`` of its rows, the first dimension) onto a CUDA device
        (``device``, else the handle's) in the background, and returns the :class:`PrefetchLoader` that hands each
        out once. Only the planned bytes are read. Several loaders may run from one handle, whose other calls keep
        working. Refused, with upstream's messages: a cpu device, a framework other than pt, names not in the
        file, slices with a step other than 1 or out of range, rows of a 0-d tensor or of fewer than whole bytes,
        F6 tensors, and a plan that selects nothing.

        ``threads`` is checked as upstream checks it; the reads are the engine's I/O lanes' (its ``threads``
        setting), which every loader shares, so it does not change how many read."""
        return _prefetch(self, plan, device, threads)


class TensorMeta:
    """A tensor's header entry, as ``safe_open.get_tensor_meta`` gives it (safetensors 0.9): ``dtype`` (its
    safetensors name), ``shape``, and ``data_offsets``, its bytes within the data section after the header."""

    __slots__ = ("dtype", "shape", "data_offsets")

    def __init__(self, dtype: str, shape: list, data_offsets: tuple):
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "data_offsets", data_offsets)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"TensorMeta is read-only: cannot set {name}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorMeta):
            return NotImplemented
        return (self.dtype, self.shape, self.data_offsets) == (other.dtype, other.shape, other.data_offsets)

    def __repr__(self) -> str:
        shape = ", ".join(map(str, self.shape))
        return (f'TensorMeta {{ dtype: "{self.dtype}", shape: [{shape}], '
                f"data_offsets: ({self.data_offsets[0]}, {self.data_offsets[1]}) }}")


#: A prefetch plan: tensor name → None (the whole tensor) or a step-1 slice of its rows.
PrefetchPlan = dict


def _loader_error(message: str, cls: type = InvalidArgumentError) -> Exception:
    """An error of the prefetch API, with upstream's message; also a ``safetensors.SafetensorError`` where
    safetensors is installed."""
    return _as_upstream(cls(message))


def _prefetch_device(device: Any) -> str:
    """The device of a prefetch, parsed as upstream parses it: an int N or ``cuda[:N]`` ("cuda" is cuda:0)."""
    if isinstance(device, bool) or isinstance(device, int):
        if int(device) < 0:
            raise _loader_error(f"device {device} is invalid")
        return f"cuda:{int(device)}"
    if not isinstance(device, str):
        raise _loader_error(f"device {device!r} is invalid")
    kind, _, index = device.partition(":")
    known = ("cpu", "cuda", "musa", "mps", "npu", "xpu", "xla", "mlu", "hpu")
    if kind in known and index and device.count(":") == 1 and not index.isdigit():
        raise ValueError("invalid digit found in string")
    if kind not in known or device.count(":") > 1:
        raise _loader_error(f"device {device} is invalid")
    if kind != "cuda":
        raise _loader_error(f"prefetch loads to cuda devices, not {device}")
    return f"cuda:{int(index or 0)}"


def _plan_rows(name: str, value: Any, info: "_native.TensorInfo") -> "tuple[int, int] | None":
    """The rows a plan entry asks for (None: the whole tensor), refused with upstream's messages."""
    if value is None:
        return None
    if not isinstance(value, slice):
        raise _loader_error(f"prefetch plan values must be None or a slice, got {type(value)} for {name}")
    if not info.shape:
        raise _loader_error(f"cannot slice rows of the 0-d tensor {name}")
    n = int(info.shape[0])
    for bound in (value.start, value.stop, value.step):
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int)):
            raise _loader_error(f"prefetch plan slice bounds for {name} must be integers or None")
    if value.step == 0:
        raise _loader_error(f"invalid prefetch plan slice for {name}: ValueError: slice step cannot be zero")
    if value.step not in (None, 1):
        raise _loader_error(f"prefetch plan slices must have step 1, got {value.step} for {name}")
    for which, v in (("start", value.start), ("stop", value.stop)):
        if v is not None and (v > n or v < -n):
            raise _loader_error(f"prefetch plan slice {which} {v} for {name} is out of range for {n} rows")
    start, stop, _ = value.indices(n)
    stop = max(start, stop)
    if n and info.nbytes % n:
        raise _loader_error(f"cannot slice rows of {name}: a row is not a whole number of bytes")
    return start, stop


def _prefetch(handle: "safe_open", plan: Any, device: Any, threads: Any) -> "PrefetchLoader":
    # Checked in upstream's order: the arguments' types, the framework, the device, the plan (entry by entry), the
    # dtypes of what it selects (in file order), an empty selection, then CUDA.
    if plan is not None and not isinstance(plan, dict):
        raise TypeError(f"'{type(plan).__name__}' object is not an instance of 'dict'")
    if isinstance(threads, bool) or not isinstance(threads, int):
        raise TypeError(f"'{type(threads).__name__}' object cannot be interpreted as an integer")
    if threads < 0:
        raise OverflowError("can't convert negative int to unsigned")
    if threads >= 1 << 64:
        raise OverflowError("int too big to convert")
    if handle._numpy:
        raise _loader_error('prefetch is only compatible with framework="pt"')
    dev = _prefetch_device(handle._device if device is None else device)
    rows: dict[str, tuple[int, int]] = {}
    if plan is not None:
        for name, value in plan.items():
            if not isinstance(name, str):
                raise _loader_error("prefetch plan keys must be tensor names")
            info = handle._infos.get(name)
            if info is None:
                raise _loader_error(f"File does not contain tensor {name}", TensorNotFoundError)
            r = _plan_rows(name, value, info)
            if r is not None:
                rows[name] = r
    order = [n for n in handle.offset_keys() if plan is None or n in plan]
    for name in order:
        dtype = handle._infos[name].dtype
        if dtype.startswith("F6"):
            raise _loader_error(f"prefetch cannot hand out dtype {dtype}: torch has no matching dtype")
    if plan is not None and not order:
        raise _loader_error("prefetch plan selects no tensors")
    _core.check_cuda(dev)
    specs = {}
    planned = 0
    for name in order:
        info = handle._infos[name]
        shape, storage = list(info.shape), list(info.storage_shape)
        nbytes = info.nbytes
        if name in rows:
            start, stop = rows[name]
            shape[0] = storage[0] = stop - start
            nbytes = nbytes // int(info.shape[0]) * (stop - start) if info.shape[0] else 0
        specs[name] = ("U8" if info.quantized else info.dtype, shape, storage)
        planned += nbytes
    # The whole plan is read without waiting for takes (upstream holds what is not taken until close). A packed
    # checkpoint decodes whole tensors: their rows are cut after (views of the decoded tensor).
    cut = rows if handle._ckpt.pack_source is not None else {}
    stream = handle._ckpt.stream(handle._engine, dev, order, None if cut else rows or None, None, max(planned, 1))
    return PrefetchLoader(stream, order, specs, cut, {n: list(handle._infos[n].storage_shape) for n in cut})


class PrefetchLoader:
    """The tensors of one plan loading onto a CUDA device in the background, as safetensors 0.9's ``prefetch``
    returns them: each handed out once, by :meth:`take` or by iterating the loader, as a tensor sharing the
    loaded device memory (ready on any stream when handed out). What was not taken is freed by :meth:`close`
    (also on leaving a ``with`` block); tensors handed out keep their memory. Made by :meth:`safe_open.prefetch`."""

    def __init__(self, stream: "_native.NativeStream", order: list, specs: dict, cut: dict, whole: dict):
        self._stream: "_native.NativeStream | None" = stream
        self._order = order
        self._specs = specs
        # Rows cut from whole tensors here (a packed checkpoint's), with those tensors' whole storage shapes.
        self._cut, self._whole = cut, whole
        self._taken: set[str] = set()

    def names(self) -> list[str]:
        """The names this loader hands out, in file order."""
        return list(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def take(self, name: str) -> "torch.Tensor":
        """``name``'s tensor (its planned rows), waiting for its bytes if they have not landed yet. Each tensor is
        handed out once: asking again raises."""
        spec = self._specs.get(name)
        if spec is None:
            raise _loader_error(f"tensor {name} is not in the prefetch plan", TensorNotFoundError)
        if name in self._taken:
            raise _loader_error(
                f"{name}: tensor already delivered (prefetch hands each tensor out once, via take or iteration)"
            )
        if self._stream is None:
            raise _loader_error(f"{name}: prefetch loader closed")
        self._taken.add(name)
        try:
            buf = self._stream.take(name)
        except WeightliftError as e:
            raise _loader_error(f"{name}: {e}", type(e)) from e
        dtype, _, storage = spec
        if name in self._cut:
            start, stop = self._cut[name]
            return _core.as_tensor(buf, dtype, self._whole[name])[start:stop]
        return _core.as_tensor(buf, dtype, storage)

    def __iter__(self) -> Iterator[tuple[str, "torch.Tensor"]]:
        """``(name, tensor)`` of every tensor not taken yet, in file order (upstream leaves the order unspecified:
        readiness order)."""
        for name in self._order:
            if self._stream is None:
                raise _loader_error("prefetch loader closed")
            if name not in self._taken:
                yield name, self.take(name)

    def close(self) -> None:
        """Stops the loading and frees every tensor not taken; those handed out keep their memory."""
        if self._stream is not None:
            stream, self._stream = self._stream, None
            stream.close()

    def __enter__(self) -> "PrefetchLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown; nothing to report to
            pass


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
        shape = list(host.shape)
        dtype = _core.dtype_name(host.dtype)
        if dtype == "F4" and shape:
            shape[-1] *= 2  # two F4 values per torch element: the header counts values
        entries.append((name, dtype, shape, host.data_ptr(), host.numel() * host.element_size()))
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
