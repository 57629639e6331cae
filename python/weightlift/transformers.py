"""Models ready in one call: Hugging Face transformers (and sentence-transformers) models whose weights weightlift
reads, straight onto the device.

>>> model = weightlift.transformers.from_pretrained(AutoModelForCausalLM, "/models/llama", device="cuda:0")
>>> with weightlift.transformers.patch():          # for code you cannot change
...     model = AutoModelForCausalLM.from_pretrained("/models/llama", device_map="cuda:0")
>>> st = weightlift.transformers.sentence_transformer("/models/all-MiniLM-L6-v2", device="cuda:0")

How: transformers' own ``from_pretrained`` runs as usual — config, the model built on the meta device, key renames
and conversions, dtype rules (``_keep_in_fp32_modules`` included), the loading report of missing and unexpected keys,
non-persistent buffers (rotary ``inv_freq``, ``position_ids``) computed by the model's own ``_init_weights``, tied
weights, ``generation_config``, ``eval()`` — except at one point: where transformers would open the safetensors
files, weightlift reads every tensor of every shard in one plan onto the target device, and transformers gets those
tensors as its ``state_dict``. Parameters keep weightlift's memory (no second copy); a ``dtype=`` that differs from
the checkpoint's converts on the device. Tensors start where torch's allocator would start them (256-byte
multiples on a GPU: weightlift's small tensors share a device block only where that holds; a pack's tensors have
allocations of their own); host tensors of a file laid out off 64 bytes are copied to an aligned allocation first.
One more difference, invisible in the result: while the model is built on the meta device, torch's init functions
return at once for its meta tensors (they have no values to fill; see ``_meta_init_skipped``).

That point is an internal function of transformers (``PreTrainedModel._load_pretrained_model``), so this module
checks at run time, whatever the version number, that what it hooks is there with the shape it expects (the
function's parameters, ``LoadStateDictConfig``'s fields, ``from_pretrained`` a classmethod,
``caching_allocator_warmup``) and, after each load, that transformers did hand the loading to it. Where either check
fails (a transformers release that changed its loading), transformers reads the checkpoint itself, as it would
without weightlift, with a ``RuntimeWarning`` saying why: a new release works by default, at transformers' own
speed. :data:`TESTED_TRANSFORMERS` names the releases tested. transformers is imported only when a function here
is called: ``import weightlift`` never imports it.

What weightlift cannot do, :func:`from_pretrained` refuses with :class:`UnsupportedError` naming it (inside
:func:`patch`, transformers then reads the checkpoint itself, with a warning): weights that are not safetensors
(``pytorch_model.bin``, GGUF), quantized checkpoints and on-the-fly quantization, a ``device_map`` over several
devices or disk offload, tensor parallelism, DeepSpeed ZeRO-3, devices other than CPU and CUDA, and Hub names (it
loads local folders; :func:`from_pretrained` also model folders kept as objects: ``s3://``, ``gs://``, ``az://``,
``http(s)://``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import importlib.util
import functools
import inspect
import itertools
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import warnings
from typing import TYPE_CHECKING, Any, Optional, Union

from . import _core, _native
from ._errors import InvalidArgumentError, WeightliftError, WeightliftFileNotFoundError
from .safetensors import _checkpoint, _load_tensors, load_file

if TYPE_CHECKING:
    import torch

PathLike = Union[str, "os.PathLike[str]"]

#: transformers versions (major, minor) this module was tested with, inclusive; others are served while the hooks
#: check out (see the module's documentation).
TESTED_TRANSFORMERS: tuple[tuple[int, int], tuple[int, int]] = ((5, 17), (5, 24))

# Shape of the internal function this module wraps; any other shape is refused, whatever the version says.
_HOOK_PARAMS = ["model", "state_dict", "checkpoint_files", "load_config"]
_LOAD_CONFIG_FIELDS = {"device_map", "hf_quantizer", "device_mesh", "disk_offload_folder", "pretrained_model_name_or_path"}

# from_pretrained keywords that would take the load off weightlift's path; each is refused by name.
_REFUSED_KWARGS = {
    "device_map": "use device= (weightlift loads onto one device)",
    "state_dict": "weights given as a state_dict are not read from files",
    "gguf_file": "weightlift.transformers reads safetensors checkpoints, not GGUF",
    "quantization_config": "quantized loading is not supported",
    "tp_plan": "tensor parallelism is not supported",
    "tp_size": "tensor parallelism is not supported",
    "distributed_config": "distributed loading is not supported",
    "device_mesh": "tensor parallelism is not supported",
    "offload_folder": "disk offload is not supported",
    "max_memory": "weightlift loads onto one device",
}

# The alignment torch's own allocators give (kernels pick vectorised paths from it): 256 B on CUDA, 64 B on the host.
_ALIGN = {"cuda": 256, "cpu": 64}


class UnsupportedError(WeightliftError, NotImplementedError):
    """weightlift cannot load this model or checkpoint this way; the message says what and why."""


class _Target:
    """A weightlift load requested on this thread: the device, and whether refusing is an error."""

    def __init__(self, device: str, strict: bool):
        self.device = device
        self.strict = strict
        self.served = False  # whether a loading step was handed to weightlift


_local = threading.local()
_lock = threading.Lock()
_installed = 0  # hook installations alive (patch() handles plus calls in flight)
_patched = 0  # patch() handles alive: while > 0 every thread's from_pretrained goes through weightlift
_original: dict[str, Any] = {}


def _transformers() -> Any:
    try:
        import transformers  # noqa: F401 - its absence is the error
        from transformers import modeling_utils
    except ImportError as e:
        raise UnsupportedError("weightlift.transformers needs transformers: pip install 'weightlift[transformers]'") from e
    return modeling_utils


def _hooks() -> "tuple[Any, Optional[str]]":
    """``(modeling_utils, None)`` where transformers has what this module hooks, with the shape it expects;
    ``(None, why)`` otherwise."""
    import transformers

    modeling_utils = _transformers()
    fn = getattr(modeling_utils.PreTrainedModel, "_load_pretrained_model", None)
    entry = modeling_utils.PreTrainedModel.__dict__.get("from_pretrained")
    config_cls = getattr(modeling_utils, "LoadStateDictConfig", None)
    params = list(inspect.signature(fn).parameters)[:4] if callable(fn) else []
    fields = {f.name for f in dataclasses.fields(config_cls)} if dataclasses.is_dataclass(config_cls) else set()
    if params != _HOOK_PARAMS:
        why = f"PreTrainedModel._load_pretrained_model takes ({', '.join(params)}), not ({', '.join(_HOOK_PARAMS)})"
    elif not _LOAD_CONFIG_FIELDS <= fields:
        why = f"LoadStateDictConfig lacks {', '.join(sorted(_LOAD_CONFIG_FIELDS - fields))}"
    elif not isinstance(entry, classmethod):
        why = "PreTrainedModel.from_pretrained is not a classmethod"
    elif not hasattr(modeling_utils, "caching_allocator_warmup"):
        why = "modeling_utils.caching_allocator_warmup is gone"
    else:
        return modeling_utils, None
    return None, f"transformers {transformers.__version__} loads checkpoints differently from the releases weightlift knows ({why})"


def _fall_back(why: str) -> None:
    warnings.warn(f"weightlift.transformers: {why}; transformers reads the checkpoint itself", RuntimeWarning, stacklevel=3)


def _install(modeling_utils: Any) -> None:
    global _installed
    with _lock:
        if _installed == 0:
            cls = modeling_utils.PreTrainedModel
            _original["load"] = cls.__dict__["_load_pretrained_model"]
            _original["from_pretrained"] = cls.__dict__["from_pretrained"]
            _original["warmup"] = modeling_utils.caching_allocator_warmup
            cls._load_pretrained_model = staticmethod(_load_pretrained_model)
            cls.from_pretrained = _wrap_from_pretrained(_original["from_pretrained"].__func__)
            init_context = cls.__dict__.get("get_init_context")
            if isinstance(init_context, classmethod):  # the place to add _meta_init_skipped (optional)
                _original["init_context"] = init_context
                cls.get_init_context = _wrap_get_init_context(init_context.__func__)
                _wrap_init_functions()
            modeling_utils.caching_allocator_warmup = _caching_allocator_warmup
            loading = _core_model_loading()
            if loading is not None:
                _original["env"] = loading.is_env_variable_true
                loading.is_env_variable_true = _is_env_variable_true
        _installed += 1


def _uninstall(modeling_utils: Any) -> None:
    global _installed
    with _lock:
        _installed -= 1
        if _installed == 0:
            modeling_utils.PreTrainedModel._load_pretrained_model = _original.pop("load")
            modeling_utils.PreTrainedModel.from_pretrained = _original.pop("from_pretrained")
            modeling_utils.caching_allocator_warmup = _original.pop("warmup")
            if "init_context" in _original:
                modeling_utils.PreTrainedModel.get_init_context = _original.pop("init_context")
                _unwrap_init_functions()
            if "env" in _original:
                _core_model_loading().is_env_variable_true = _original.pop("env")


def _core_model_loading() -> Any:
    """transformers' module that moves a state dict into the model, where it has the switch this module uses."""
    try:
        from transformers import core_model_loading
    except ImportError:  # pragma: no cover - every tested version has it
        return None
    return core_model_loading if callable(getattr(core_model_loading, "is_env_variable_true", None)) else None


def _is_env_variable_true(name: str) -> bool:
    # transformers hands each checkpoint tensor to a pool of 4 threads that reads it from its file and moves it to
    # its device. The tensors weightlift hands over are already read and on their device, so for them transformers'
    # own sequential path (its HF_DEACTIVATE_ASYNC_LOAD switch), on this thread only, does the same work without
    # starting threads: 6 ms less of 50 for a MiniLM-sized encoder on an H100 (bench/model_stages.py).
    if name == "HF_DEACTIVATE_ASYNC_LOAD" and getattr(_local, "tensors_in_hand", False):
        return True
    original = _original.get("env")
    if original is None:  # uninstalled by another thread while this call was on its way here
        from transformers.utils import is_env_variable_true as original
    return original(name)


def _wrap_get_init_context(original: Any) -> classmethod:
    @functools.wraps(original)
    def get_init_context(cls: Any, *args: Any, **kwargs: Any) -> Any:
        contexts = original(cls, *args, **kwargs)
        ours = getattr(_local, "target", None) is not None or _patched > 0 or getattr(_local, "tensors_in_hand", False)
        if ours and isinstance(contexts, list) and any(getattr(c, "type", None) == "meta" for c in contexts):
            contexts = [*contexts, _meta_init_skipped()]
        return contexts

    return classmethod(get_init_context)


_init_originals: dict[tuple[str, str], Any] = {}  # torch's init functions wrapped while the hooks are installed


def _skips_meta(fn: Any) -> Any:
    @functools.wraps(fn)
    def init(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(_local, "meta_skip", 0) and getattr(tensor, "is_meta", False):
            return tensor
        return fn(tensor, *args, **kwargs)

    init._weightlift_original = fn  # type: ignore[attr-defined]
    return init


def _wrap_init_functions() -> None:
    """Wraps torch's init functions in the modules transformers' own ``no_init_weights`` patches (its lists), so
    that a model construction inside :func:`_meta_init_skipped`, on that thread only, skips them for meta tensors.
    Called with ``_lock`` held, when the hooks go in."""
    try:
        from transformers import initialization
    except ImportError:  # pragma: no cover - every tested version has it
        return
    for module_name in getattr(initialization, "TORCH_MODULES_TO_PATCH", ()):
        module = sys.modules.get(module_name)
        for name in getattr(initialization, "TORCH_INIT_FUNCTIONS", {}):
            fn = getattr(module, name, None) if module is not None else None
            # A wrapper of ours left in place (see _unwrap_init_functions) already does the job.
            if callable(fn) and not hasattr(fn, "_weightlift_original"):
                _init_originals[(module_name, name)] = fn
                setattr(module, name, _skips_meta(fn))


def _unwrap_init_functions() -> None:
    for (module_name, name), fn in _init_originals.items():
        module = sys.modules[module_name]
        # Put back only what is still ours: a context of transformers' (no_init_weights, guard_torch_init_functions)
        # running on another thread may hold it now, and put our wrapper back when it ends; the wrapper then stays,
        # passing every call through outside weightlift's constructions.
        if getattr(getattr(module, name, None), "_weightlift_original", None) is fn:
            setattr(module, name, fn)
    _init_originals.clear()


@contextlib.contextmanager
def _meta_init_skipped() -> Any:
    """transformers builds the model on the meta device and loads every weight afterwards, but the modules'
    constructors still run torch's init functions (``nn.Linear.reset_parameters``: ``kaiming_uniform_``) on their
    meta tensors, each through the meta device's function mode: about half of a MiniLM encoder's construction (7.1
    against 3.4 ms on a 2-vCPU host). Inside this context, on this thread, those functions return their meta tensor
    at once: a meta tensor has no values to fill and draws no random numbers, so the model is the same. Tensors that
    are not meta, and other threads, go to torch's functions as before."""
    _local.meta_skip = getattr(_local, "meta_skip", 0) + 1
    try:
        yield
    finally:
        _local.meta_skip -= 1


def _caching_allocator_warmup(*args: Any, **kwargs: Any) -> None:
    # transformers reserves the model's size in torch's allocator before copying weights in; weightlift's tensors
    # live in weightlift's own device memory, so that reservation would only double the memory held.
    if getattr(_local, "skip_warmup", False):
        return None
    return _original["warmup"](*args, **kwargs)


def _single_device(device_map: Optional[dict]) -> tuple[Optional[str], Optional[str]]:
    """The one device a transformers device_map places everything on (None for no map), or why there is none."""
    if not device_map:
        return None, None
    torch = _core.torch_module()
    devices = set()
    for d in device_map.values():
        if isinstance(d, int):
            devices.add(f"cuda:{d}")
        elif str(d) in ("disk", "meta"):
            return None, f"device_map places weights on {d!s}"
        else:
            dev = torch.device(d)
            if dev.type not in ("cpu", "cuda"):
                return None, f"weightlift loads onto CPU or CUDA devices, not {dev}"
            devices.add(_core.normalize_device(dev))
    if len(devices) > 1:
        return None, f"device_map spreads the model over {', '.join(sorted(devices))}"
    return devices.pop(), None


def _why_not(checkpoint_files: Optional[list], load_config: Any) -> Optional[str]:
    if not checkpoint_files:
        return "no checkpoint files to read"
    other = [f for f in checkpoint_files if not str(f).endswith(".safetensors")]
    if other:
        return f"{os.path.basename(other[0])} is not a safetensors file (weightlift reads safetensors checkpoints)"
    quantizer = load_config.hf_quantizer
    if quantizer is not None:
        method = getattr(getattr(quantizer, "quantization_config", None), "quant_method", "?")
        return f"quantized loading ({getattr(method, 'value', method)}) is not supported"
    if load_config.device_mesh is not None:
        return "tensor-parallel loading (device_mesh) is not supported"
    try:
        from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled
    except ImportError:  # pragma: no cover - every tested version has it
        return None
    if is_deepspeed_zero3_enabled():
        return "DeepSpeed ZeRO-3 loading is not supported"
    return None


def _checkpoint_files(path: Any, kwargs: dict) -> Optional[list[str]]:
    """The safetensors files transformers will resolve for a local ``path`` (its rule: ``model.safetensors``, else
    the shards of ``model.safetensors.index.json``), or None where that cannot be told beforehand."""
    if not isinstance(path, (str, os.PathLike)) or kwargs.get("gguf_file") or kwargs.get("use_safetensors") is False:
        return None
    if kwargs.get("quantization_config") is not None or getattr(kwargs.get("config"), "quantization_config", None):
        return None
    folder = os.path.join(os.fspath(path), kwargs.get("subfolder") or "")
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        if "quantization_config" in config or "transformers_weights" in config:
            return None
        variant = kwargs.get("variant")
        name = f"model.{variant}.safetensors" if variant else "model.safetensors"
        if os.path.isfile(os.path.join(folder, name)):
            return [os.path.realpath(os.path.join(folder, name))]
        with open(os.path.join(folder, name[: -len("safetensors")] + "safetensors.index.json"), encoding="utf-8") as f:
            shards = set(json.load(f)["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return sorted(os.path.realpath(os.path.join(folder, s)) for s in shards)


class _Prefetch:
    """A checkpoint read started when from_pretrained is called, so that the reading (which releases the GIL)
    overlaps transformers building the model; the loading step takes its tensors if they are the ones it needs."""

    def __init__(self, files: list[str], device: str):
        self.files = files
        self.device = device
        self._tensors: Optional[dict] = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="weightlift-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._tensors = _load_aligned(self.files, self.device)
        except BaseException as e:  # handed to the thread that takes the tensors
            self._error = e

    def take(self) -> dict:
        self._thread.join()
        if self._error is not None:
            raise self._error
        tensors, self._tensors = self._tensors, None
        return tensors

    def drop(self) -> None:
        self._thread.join()
        self._tensors = None


def _prefetch_device(kwargs: dict, target: Optional[_Target]) -> Optional[str]:
    if target is not None:
        return target.device
    device_map = kwargs.get("device_map")
    if isinstance(device_map, str) and device_map in ("auto", "balanced", "balanced_low_0", "sequential"):
        return None
    try:
        device, why = _single_device(device_map if isinstance(device_map, dict) or device_map is None else {"": device_map})
    except (RuntimeError, ValueError, TypeError):
        return None
    return None if why else (device or "cpu")


def _wrap_from_pretrained(original: Any) -> classmethod:
    @functools.wraps(original)
    def from_pretrained(cls: Any, pretrained_model_name_or_path: Any, *args: Any, **kwargs: Any) -> Any:
        return _from_pretrained(original, cls, pretrained_model_name_or_path, *args, **kwargs)

    return classmethod(from_pretrained)


def _from_pretrained(original: Any, cls: Any, pretrained_model_name_or_path: Any, *args: Any, **kwargs: Any) -> Any:
    """Stands in for ``PreTrainedModel.from_pretrained``: starts reading the checkpoint, then runs transformers'
    own from_pretrained, whose loading step takes the tensors read."""
    target: Optional[_Target] = getattr(_local, "target", None)
    files = None
    if (target is not None or _patched > 0) and kwargs.get("state_dict") is None:
        files = _checkpoint_files(pretrained_model_name_or_path, kwargs)
        if files is None and _may_be_packed(pretrained_model_name_or_path, kwargs):
            pack = _packed_weights(os.fspath(pretrained_model_name_or_path), kwargs)
            if pack is not None:  # transformers cannot read a pack: weightlift gives it the tensors
                return _patched_pack(cls, os.fspath(pretrained_model_name_or_path), pack, target, args, kwargs)
    device = _prefetch_device(kwargs, target) if files else None
    stack = _local.__dict__.setdefault("prefetch", [])
    if device is None or (stack and stack[-1].device == device and stack[-1].files == files):
        # Nothing to read ahead, or its read already started (a load from objects, _from_url).
        return original(cls, pretrained_model_name_or_path, *args, **kwargs)
    pending = _Prefetch(files, device)
    stack.append(pending)
    try:
        return original(cls, pretrained_model_name_or_path, *args, **kwargs)
    finally:
        stack.remove(pending)
        pending.drop()


# Weights transformers reads itself, found before a pack would be looked at.
_OTHER_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.gguf", "tf_model.h5", "flax_model.msgpack")


def _may_be_packed(path: Any, kwargs: dict) -> bool:
    """Whether transformers, asked for ``path`` with ``kwargs``, would look for safetensors weights and find none of
    its own kind: only then does a ``model.wlpack`` stand in for them."""
    if not isinstance(path, (str, os.PathLike)) or kwargs.get("gguf_file") or kwargs.get("use_safetensors") is False:
        return False
    if kwargs.get("quantization_config") is not None:
        return False
    folder = os.path.join(os.fspath(path), kwargs.get("subfolder") or "")
    return not any(os.path.exists(os.path.join(folder, w)) for w in _OTHER_WEIGHTS)


def _patched_pack(cls: Any, folder: str, pack: str, target: Optional[_Target], args: tuple, kwargs: dict) -> Any:
    """transformers' from_pretrained of a packed folder, inside :func:`patch` or :func:`sentence_transformer`: the
    device the call asks for (its one-device ``device_map``, else host memory), the rest as :func:`from_pretrained`
    does it. What weightlift cannot do is refused: transformers could not read the pack either."""
    kw = dict(kwargs)
    device_map = kw.pop("device_map", None)
    refused = sorted(k for k, v in kw.items() if k in _REFUSED_KWARGS and v is not None)
    if refused:
        raise UnsupportedError(f"{folder} holds a pack: from_pretrained({refused[0]}=...): {_REFUSED_KWARGS[refused[0]]}")
    for k in [k for k in kw if k in _REFUSED_KWARGS]:  # given as None: nothing asked
        del kw[k]
    mapped = _prefetch_device({"device_map": device_map}, None)
    if mapped is None:
        raise UnsupportedError(f"{folder} holds a pack, which weightlift loads onto one device: device_map={device_map!r} names none")
    if target is not None and device_map is not None and mapped != target.device:
        raise UnsupportedError(f"{folder}: device_map puts the model on {mapped}, not on {target.device}")
    device = target.device if target is not None else mapped
    result = _from_pack(cls, folder, pack, device, kw, args)
    if target is not None:
        target.served = True  # weightlift read the pack
    return result


def _read(files: list, device: str) -> dict:
    """The checkpoint's tensors on ``device``: those a prefetch already read, if it read these files there."""
    paths = [os.fspath(f) for f in files]
    stack = getattr(_local, "prefetch", None)
    if stack and stack[-1].device == device and stack[-1].files == sorted(os.path.realpath(p) for p in paths):
        return stack[-1].take()
    return _load_aligned(paths, device)


def _load_aligned(files: list, device: str) -> dict:
    """``load_file(files, device)`` with every tensor at an address torch's allocator would give it (on a GPU: small
    tensors share device blocks only at 256-byte multiples), so that :func:`_aligned` finds nothing to copy."""
    dev = _core.normalize_device(device)
    paths = _remote_paths(files)
    return _load_tensors(_checkpoint(paths), None, dev, None, align=_ALIGN["cpu" if dev.startswith("cpu") else "cuda"])


def _aligned(tensors: dict[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
    # What is still misaligned (host tensors of a file laid out off 64 bytes) is copied.
    return {k: (t.clone() if t.data_ptr() % _ALIGN[t.device.type] else t) for k, t in tensors.items()}


def _load_pretrained_model(model: Any, state_dict: Any, checkpoint_files: Any, load_config: Any, *args: Any, **kwargs: Any) -> Any:
    """Stands in for ``PreTrainedModel._load_pretrained_model``: reads the checkpoint files with weightlift onto the
    target device and hands transformers the tensors as its state_dict."""
    original = _original["load"].__func__
    target: Optional[_Target] = getattr(_local, "target", None)
    if state_dict is not None or (target is None and _patched == 0):
        return original(model, state_dict, checkpoint_files, load_config, *args, **kwargs)
    mapped, why = _single_device(load_config.device_map)
    why = why or _why_not(checkpoint_files, load_config)
    if target is not None and mapped is not None and mapped != target.device:
        why = why or f"device_map puts the model on {mapped}, not on {target.device}"
    if why is not None:
        if target is not None and target.strict:
            raise UnsupportedError(f"{type(model).__name__} from {load_config.pretrained_model_name_or_path}: {why}")
        warnings.warn(f"weightlift.transformers: {why}; transformers reads the checkpoint itself", RuntimeWarning, stacklevel=2)
        return original(model, state_dict, checkpoint_files, load_config, *args, **kwargs)
    device = mapped or (target.device if target is not None else "cpu")
    tensors = _aligned(_read(checkpoint_files, device))
    if target is not None:
        target.served = True
    if load_config.device_map is None and not device.startswith("cpu"):
        # Without a map transformers would move the weights to host memory. Buffers and missing keys, placed after
        # this call from the caller's own config, stay on the host until the caller moves the model (.to(device)).
        torch = _core.torch_module()
        load_config = dataclasses.replace(load_config, device_map={"": torch.device(device)})
    _local.skip_warmup = _local.tensors_in_hand = True
    try:
        return original(model, tensors, None, load_config, *args, **kwargs)
    finally:
        _local.skip_warmup = _local.tensors_in_hand = False


class _Loading:
    """Routes this thread's transformers loads through weightlift onto ``device`` for the duration of a with block."""

    def __init__(self, device: str, strict: bool):
        self._modeling_utils, why = _hooks()
        if why is not None:
            _fall_back(why)
        self._target = _Target(device, strict)

    def __enter__(self) -> "_Loading":
        if self._modeling_utils is not None:
            _install(self._modeling_utils)
        self._saved = getattr(_local, "target", None)
        _local.target = self._target
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        _local.target = self._saved
        if self._modeling_utils is None:
            return
        _uninstall(self._modeling_utils)
        if exc_type is None and not self._target.served:
            import transformers

            _fall_back(f"transformers {transformers.__version__} did not hand its loading step to weightlift")


def _local_folder(path: PathLike, subfolder: str) -> str:
    folder = os.path.join(os.fspath(path), subfolder) if subfolder else os.fspath(path)
    if not os.path.isdir(folder):
        if os.path.exists(folder):
            raise InvalidArgumentError(f"{folder} is a file; pass the folder that holds config.json and the weights")
        raise WeightliftFileNotFoundError(
            f"no folder {folder} (weightlift.transformers loads local folders; for a Hub model, download it first, "
            "e.g. huggingface_hub.snapshot_download(repo_id), and pass that folder)"
        )
    return os.fspath(path)


def from_pretrained(
    cls_or_auto: Any,
    path: PathLike,
    *,
    device: Union[str, int, "torch.device"] = "cuda:0",
    dtype: Union[str, "torch.dtype", None] = None,
    check_version: bool = True,
    **kwargs: Any,
) -> Any:
    """``cls_or_auto.from_pretrained(path, **kwargs)`` for a local folder (``config.json`` and ``model.safetensors``
    or shards with ``model.safetensors.index.json``), with the weights read by weightlift straight onto ``device``
    ("cuda:0", "cuda", an ordinal, "cpu"). ``cls_or_auto`` is a model class (``LlamaForCausalLM``) or an auto class
    (``AutoModelForCausalLM``). ``dtype`` follows transformers: ``None`` or ``"auto"`` keeps the checkpoint's dtype,
    a torch dtype converts on ``device``. Other keyword arguments go to transformers (``attn_implementation``,
    ``output_loading_info``, ``trust_remote_code``, ...), except those that take the load off weightlift's path
    (``device_map``, ``state_dict``, ``gguf_file``, ``quantization_config``, tensor parallelism, offload), which raise
    :class:`UnsupportedError`, as does a checkpoint weightlift cannot read (see the module's documentation).

    ``path`` may be the URL of a folder kept as objects (``s3://bucket/llama/``, also ``gs://``, ``az://``,
    ``http(s)://``; ``subfolder=`` is joined with ``/``): ``config.json`` (required), ``generation_config.json`` and a
    shard index are fetched into a temporary folder, removed when the call returns; the weights
    (``model.safetensors``, the shards, or ``model.wlpack``) are read from their objects straight onto ``device``.

    A ``dtype`` conversion holds the checkpoint's tensors and the converted ones on ``device`` together until the
    load returns. Returns what transformers returns: the model, in eval mode, on ``device``. On a transformers
    release whose loading differs from what weightlift hooks, transformers reads the weights itself (a
    ``RuntimeWarning`` says why). ``check_version`` is accepted for callers written for earlier releases of
    weightlift, which refused untested versions."""
    refused = sorted(k for k in kwargs if k in _REFUSED_KWARGS)
    if kwargs.get("use_safetensors") is False:
        refused.append("use_safetensors")
    if refused:
        k = refused[0]
        raise UnsupportedError(f"from_pretrained({k}=...): {_REFUSED_KWARGS.get(k, 'weightlift reads safetensors checkpoints')}")
    if _is_url(path):
        if dtype is not None:
            kwargs["dtype"] = dtype
        return _from_url(cls_or_auto, os.fspath(path), _core.normalize_device(device), kwargs)
    folder = _local_folder(path, kwargs.get("subfolder", ""))
    kwargs.setdefault("local_files_only", True)
    if dtype is not None:
        kwargs["dtype"] = dtype
    dev = _core.normalize_device(device)
    pack = _packed_weights(folder, kwargs)
    if pack is not None:
        return _from_pack(cls_or_auto, folder, pack, dev, kwargs)
    with _Loading(dev, strict=True):
        result = cls_or_auto.from_pretrained(folder, **kwargs)
    model = result[0] if isinstance(result, tuple) else result
    # The non-persistent buffers (and any missing keys), computed on the host as transformers computes them.
    _to_device(model, dev)
    return result


# The small files from_pretrained reads from a model's folder besides config.json and the weights (a local load of
# a transformers 5 model opens these and no others); each is fetched where the bucket has it.
_REMOTE_EXTRAS = ("generation_config.json",)

# Weight files of the temporary folders of loads from objects in flight: the real path of each file transformers is
# shown, to the URL of the object weightlift reads in its place (see _from_url). Keys are paths inside folders made
# by tempfile.mkdtemp for one call each, so no other load can name them.
_remote_files: dict[str, str] = {}


def _is_url(path: Any) -> bool:
    return isinstance(path, (str, os.PathLike)) and _native.is_url(os.fspath(path))


def _url_join(base: str, *names: str) -> str:
    return "/".join([base.rstrip("/"), *(n.strip("/") for n in names if n)])


def _remote_paths(files: list) -> list[str]:
    """``files`` with each weight file of a load from objects replaced by its object's URL."""
    paths = [os.fspath(f) for f in files]
    if not _remote_files:
        return paths
    with _lock:
        return [_remote_files.get(os.path.realpath(p), p) for p in paths]


def _object(url: str, required: bool = False) -> Optional[_native.Checkpoint]:
    """The object at ``url`` opened as one raw byte tensor (nothing read yet), or None where there is no such
    object or bucket, which the engine raises as :class:`WeightliftFileNotFoundError` (raised as it is where
    ``required``); other failures (credentials, a bad URL) raise weightlift's one-line error."""
    try:
        return _native.Checkpoint([url], raw_dtype="U8")
    except WeightliftFileNotFoundError:
        if required:
            raise
        return None


# The most a small object fetched whole (a config, a shard index: kilobytes to a few megabytes) may have.
_SMALL_OBJECT_LIMIT = 64 << 20


def _fetch(url: str, required: bool = False) -> Optional[bytes]:
    """The bytes of the small object at ``url``, or None where there is no such object or bucket (raised as
    :class:`WeightliftFileNotFoundError` where ``required``); other failures raise weightlift's one-line error.
    One GET where the object fits the engine's opening GET (256 KiB): an open then a read were two round trips."""
    try:
        return _native.fetch_object(url, _SMALL_OBJECT_LIMIT)
    except WeightliftFileNotFoundError:
        if required:
            raise
        return None


def _auto_dtype(url: str) -> "torch.dtype":
    """The dtype transformers' ``dtype="auto"`` takes from a checkpoint file when the config names none (its
    ``get_state_dict_dtype`` over the file's tensors in ``safe_open``'s order, sorted by name): the first floating
    dtype other than float8/float4, else the first tensor's. Read from the object's header here, since transformers
    would open the file for it."""
    torch = _core.torch_module()
    dtypes = _core.torch_dtypes()
    infos = sorted(_checkpoint([url]).tensors, key=lambda i: i.name)
    found = [dtypes[i.dtype] for i in infos if i.dtype in dtypes]
    for d in found:
        if d.is_floating_point and "float8_" not in str(d) and "float4_" not in str(d):
            return d
    return found[0] if found else torch.float32


def _from_url(cls_or_auto: Any, url: str, dev: str, kwargs: dict) -> Any:
    """A model folder kept as objects (``s3://bucket/llama/``): ``config.json`` and the small files of
    ``_REMOTE_EXTRAS`` (and a shard index) are fetched into a temporary folder, which transformers loads as a local
    one; the weight files it resolves there are read by weightlift from their objects, straight onto ``dev`` (the
    bytes never land in a local file). The temporary folder goes when the load returns or fails."""
    modeling_utils, why = _hooks()
    if why is not None:  # transformers cannot read objects: there is nothing to fall back to
        raise UnsupportedError(f"{url}: {why}")
    kw = dict(kwargs)
    kw["local_files_only"] = True
    base = _url_join(url, kw.pop("subfolder", "") or "")
    variant = kw.get("variant")
    stem = f"model.{variant}" if variant else "model"
    config_url = _url_join(base, "config.json")
    single, index_name = f"{stem}.safetensors", f"{stem}.safetensors.index.json"
    # The small objects a load may need are asked for at once, each a round trip (20-80 ms to a cloud bucket):
    # one after another they were 0.3-0.5 s of a 1.1 GB model's 1.8 s at 30 ms. The shard index is fetched even
    # where the single file is there (one wasted GET, answered 404 or never read).
    with concurrent.futures.ThreadPoolExecutor(max_workers=3 + len(_REMOTE_EXTRAS)) as pool:
        config_job = pool.submit(_fetch, config_url, kw.get("config") is None)
        extra_jobs = [(name, pool.submit(_fetch, _url_join(base, name))) for name in _REMOTE_EXTRAS]
        single_job = pool.submit(_object, _url_join(base, single))
        index_job = pool.submit(_fetch, _url_join(base, index_name))
    try:
        config_bytes = config_job.result()
    except WeightliftFileNotFoundError as e:
        raise WeightliftFileNotFoundError(f"{e} (the model's config.json is needed)") from None
    try:
        config = json.loads(config_bytes) if config_bytes is not None else {}
    except ValueError as e:
        raise InvalidArgumentError(f"{config_url}: not JSON ({e})") from None
    if not isinstance(config, dict):
        raise InvalidArgumentError(f"{config_url}: not a JSON object")
    if "quantization_config" in config or getattr(kw.get("config"), "quantization_config", None) is not None:
        raise UnsupportedError(f"{base}: quantized loading is not supported")
    if kw.get("trust_remote_code") and (config.get("auto_map") or getattr(kw.get("config"), "auto_map", None)):
        raise UnsupportedError(f"{base}: a model with remote code from a bucket (its Python files are not fetched)")
    folder = tempfile.mkdtemp(prefix="weightlift-model-")
    registered: dict[str, str] = {}
    try:
        if config_bytes is not None:
            with open(os.path.join(folder, "config.json"), "wb") as f:
                f.write(config_bytes)
        for name, job in extra_jobs:
            data = job.result()
            if data is not None:
                with open(os.path.join(folder, name), "wb") as f:
                    f.write(data)
        weights: list[str] = []  # the weight objects, in the order transformers resolves their files
        index = None
        if single_job.result() is not None:
            # transformers checks that model.safetensors is a file (os.path.isfile) before it resolves it, so it
            # finds an empty one here. Nothing reads it: the loading step transformers would open it in is
            # weightlift's (_load_pretrained_model, strict: a load it cannot do raises rather than falling back
            # to transformers' reading), weightlift reads the URL registered for it, and the one other place
            # transformers opens a weight file, dtype="auto" without a dtype in the config, gets the dtype from
            # the object's header below instead.
            open(os.path.join(folder, single), "xb").close()
            weights = [single]
        else:
            index_url = _url_join(base, index_name)
            index_bytes = index_job.result()
            if index_bytes is not None:
                # The index is read locally; its shards are not checked for there (transformers joins their names to
                # the folder), so they need no local files.
                with open(os.path.join(folder, index_name), "wb") as f:
                    f.write(index_bytes)
                try:
                    index = json.loads(index_bytes)
                    weights = sorted(set(index["weight_map"].values()))
                except (ValueError, KeyError, TypeError, AttributeError):
                    raise InvalidArgumentError(f"{index_url}: not a shard index (no weight_map)") from None
                for shard in weights:
                    parts = shard.split("/") if isinstance(shard, str) else [""]
                    if not shard.endswith(".safetensors") or any(p in ("", ".", "..") for p in parts):
                        raise InvalidArgumentError(f"{index_url}: shard {shard!r} is not a file name beside it")
            elif _object(_url_join(base, f"{stem}.wlpack")) is not None:
                result = _from_pack(cls_or_auto, folder, _url_join(base, f"{stem}.wlpack"), dev, kw)
                model = result[0] if isinstance(result, tuple) else result
                model.config._name_or_path = url
                return result
            else:
                raise WeightliftFileNotFoundError(
                    f"{base}: no {single}, {index_name} or {stem}.wlpack there (weightlift.transformers reads "
                    "safetensors weights or a pack from a bucket)"
                )
        if kw.get("dtype", kw.get("torch_dtype")) in (None, "auto"):
            named = getattr(kw.get("config"), "dtype", None) if kw.get("config") is not None else (
                config.get("dtype") or config.get("torch_dtype"))
            in_index = isinstance(index, dict) and "dtype" in (index.get("metadata") or {})
            if named is None and not in_index:
                kw.pop("torch_dtype", None)
                kw["dtype"] = _auto_dtype(_url_join(base, weights[0]))
        with _lock:
            for name in weights:
                registered[os.path.realpath(os.path.join(folder, name))] = _url_join(base, name)
            _remote_files.update(registered)
        # The weights are asked for now, while transformers reads the config and builds the model (its
        # from_pretrained would start the same read only after AutoConfig: 20 ms of Python on the 2-core VM); its
        # loading step takes them (_read), and the wrapper sees the read already started (_from_pretrained).
        pending = _Prefetch(sorted(registered), dev)
        stack = _local.__dict__.setdefault("prefetch", [])
        stack.append(pending)
        try:
            with _Loading(dev, strict=True):
                result = cls_or_auto.from_pretrained(folder, **kw)
        finally:
            stack.remove(pending)
            pending.drop()
        model = result[0] if isinstance(result, tuple) else result
        _to_device(model, dev)
        model.config._name_or_path = url  # what transformers records: the path it was given
        return result
    finally:
        with _lock:
            for key in registered:
                _remote_files.pop(key, None)
        shutil.rmtree(folder, ignore_errors=True)


def _to_device(model: Any, dev: str) -> None:
    """``model.to(dev)``, done where needed: with every parameter on ``dev`` (the usual case: transformers placed
    the weights by the device map), only the buffers elsewhere are moved, as ``Module.to`` moves them (BERT's
    ``position_ids`` and ``token_type_ids`` are left on the host: bench/results/2026-11-24-h100-zz at b3a4ec8). ``Module.to``
    walks every module and tensor: 1.9 ms of a MiniLM encoder's 35 on the H100 host (bench/model_stages.py)."""
    torch = _core.torch_module()
    target = torch.device("cpu" if dev.startswith("cpu") else dev)
    if any(p.device != target for p in model.parameters()):
        model.to(target)
        return
    # Set in place as Module._apply sets buffers (a module overriding _apply itself would not see this; none of
    # transformers' models does).
    for module in model.modules():
        for name, buf in module._buffers.items():
            if buf is not None and buf.device != target:
                module._buffers[name] = buf.to(target)


def _packed_weights(folder: str, kwargs: dict) -> Optional[str]:
    """``model.wlpack`` (``model.VARIANT.wlpack``) of a folder that has no safetensors weights, else None."""
    base = os.path.join(folder, kwargs.get("subfolder") or "")
    variant = kwargs.get("variant")
    stem = f"model.{variant}" if variant else "model"
    pack = os.path.join(base, stem + ".wlpack")
    plain = [os.path.join(base, stem + ".safetensors"), os.path.join(base, stem + ".safetensors.index.json")]
    return pack if os.path.isfile(pack) and not any(os.path.isfile(p) for p in plain) else None


def _from_pack(cls_or_auto: Any, folder: str, pack: str, dev: str, kwargs: dict, model_args: tuple = ()) -> Any:
    """A folder whose weights are a pack (``weightlift pack model.safetensors model.wlpack``): transformers builds
    the model from ``config.json`` and is handed the decoded tensors as its ``state_dict`` (transformers' own
    loading path for a state dict: the same renames, dtype rules, tied weights and missing-key report), with the
    folder's ``generation_config.json``."""
    modeling_utils, why = _hooks()
    if why is not None:  # transformers cannot read a pack: there is nothing to fall back to
        raise UnsupportedError(f"{folder} holds a pack: {why}")
    from transformers import AutoConfig, GenerationConfig

    kw = dict(kwargs)
    sub = kw.pop("subfolder", "") or ""
    config = kw.pop("config", None)
    if config is None:
        config = AutoConfig.from_pretrained(
            folder, subfolder=sub, trust_remote_code=kw.get("trust_remote_code"), local_files_only=True
        )
    kw.pop("local_files_only", None)
    kw.pop("variant", None)
    if kw.pop("trust_remote_code", None) or getattr(config, "auto_map", None):
        raise UnsupportedError(f"{folder}: a packed folder of a model with remote code (unpack it: weightlift unpack)")
    cls = cls_or_auto
    if hasattr(cls_or_auto, "_model_mapping"):  # an auto class: the model class its mapping gives for this config
        from transformers.models.auto.auto_factory import _get_model_class

        cls = _get_model_class(config, cls_or_auto._model_mapping)
    tensors = load_file(pack, device=dev)
    torch = _core.torch_module()
    if not dev.startswith("cpu") and importlib.util.find_spec("accelerate") is not None:
        # transformers needs accelerate for a device_map; without one the model is moved to the device below.
        kw["device_map"] = {"": torch.device(dev)}
    _install(modeling_utils)  # transformers' sequential path for tensors already in hand (_is_env_variable_true)
    _local.tensors_in_hand = True
    try:
        result = cls.from_pretrained(None, *model_args, config=config, state_dict=tensors, **kw)
    finally:
        _local.tensors_in_hand = False
        _uninstall(modeling_utils)
    del tensors  # the model holds what it uses; the rest (a dtype conversion's sources) goes now
    model = result[0] if isinstance(result, tuple) else result
    model.config._name_or_path = folder  # what transformers records for a model loaded from a folder
    gen = os.path.join(folder, sub, "generation_config.json")
    if os.path.isfile(gen) and getattr(model, "can_generate", lambda: False)():
        model.generation_config = GenerationConfig.from_pretrained(os.path.join(folder, sub))
    _to_device(model, dev)
    model.eval()
    return result


class patch:
    """Makes transformers' own ``from_pretrained`` read safetensors checkpoints through weightlift, in every thread,
    until undone: as a context manager (``with weightlift.transformers.patch(): ...``) or as a call whose result
    is undone later (``p = weightlift.transformers.patch(); ...; p.undo()``). Weights go where transformers would
    put them: the device of a one-device ``device_map``, else host memory. Loads weightlift cannot do (see the
    module's documentation) fall back to transformers' own reading with a ``RuntimeWarning``. A folder whose
    weights are a pack (``model.wlpack``, no safetensors) loads as :func:`from_pretrained` loads it; there,
    what weightlift cannot do raises :class:`UnsupportedError` (transformers cannot read a pack).

    On a transformers release whose loading differs from what this module hooks, it patches nothing, with a
    ``RuntimeWarning``: transformers then reads checkpoints itself. ``check_version`` is accepted for callers
    written for earlier releases of weightlift, which refused untested versions."""

    def __init__(self, *, check_version: bool = True):
        global _patched
        self._modeling_utils, why = _hooks()
        self._active = self._modeling_utils is not None
        if why is not None:
            _fall_back(why)
            return
        _install(self._modeling_utils)
        with _lock:
            _patched += 1

    def undo(self) -> None:
        """Restores transformers' own loading (once every other patch() handle is undone too)."""
        global _patched
        if not self._active:
            return
        self._active = False
        with _lock:
            _patched -= 1
        _uninstall(self._modeling_utils)

    def __enter__(self) -> "patch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.undo()


def is_patched() -> bool:
    """Whether a :func:`patch` is in force."""
    return _patched > 0


def sentence_transformer(path: PathLike, device: Union[str, int, "torch.device"] = "cuda:0", *, check_version: bool = True, **kwargs: Any) -> Any:
    """``sentence_transformers.SentenceTransformer(path, device=device, **kwargs)`` with every transformers model
    in it loaded by weightlift straight onto ``device``. ``path`` is a local folder (as saved by
    ``SentenceTransformer.save``, or a sentence-transformers model downloaded from the Hub)."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as e:
        raise UnsupportedError("sentence_transformer() needs sentence-transformers: pip install sentence-transformers") from e
    folder = _local_folder(path, "")
    dev = _core.normalize_device(device)
    kwargs.setdefault("local_files_only", True)
    with _Loading(dev, strict=True):
        return SentenceTransformer(folder, device="cpu" if dev.startswith("cpu") else dev, **kwargs)


__all__ = ["from_pretrained", "patch", "is_patched", "sentence_transformer", "UnsupportedError", "TESTED_TRANSFORMERS"]
