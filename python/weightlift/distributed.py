"""Loading on ``torch.distributed``: every byte of a checkpoint read from storage once, whatever the number of ranks.

:func:`load_file` is called by every rank of a process group (NCCL for GPU tensors, gloo for CPU tensors):

- Replicated tensors (the default): the ranks split the reading by bytes. The tensors are laid out in one buffer
  per rank, in file order; the buffer is cut into steps of ``world × block_bytes`` and in each step every rank
  reads its own block (whole tensors, or byte ranges of tensors larger than a block) from storage straight into
  its device through the engine, then the blocks reach the other ranks by one in-place all-gather (or one
  broadcast per rank, ``collective="broadcast"``). Each rank reads its blocks of every step one after another on
  a thread of its own, so storage never waits for a status exchange or a collective; the calling thread launches
  step *k*'s collective once every rank has read step *k* (at most one collective in flight), all in the output
  buffer itself (no extra memory). The returned tensors are views into that one buffer (its memory returns when
  the last of them is dropped). :func:`last_report` breaks each rank's time down (reading, waiting for its
  reader, status exchanges, collectives) and gives a per-step timeline.
- Sharded tensors (``shard``): each rank gets only its slice, ``torch.tensor_split(full, world, dim)[rank]``,
  and no rank materialises a whole tensor. A slice along dim 0 (or along a dim before which every dim is 1) is one
  contiguous range, read directly from storage. A slice along dim *d* > 0 is ``prod(shape[:d])``
  row segments; how it is read depends on the specs:

  - when every rank of the group slices the same tensors along the same dims with ``world`` = the group's size
    and ``rank`` = its rank in the group (tensor parallelism over the whole group), each rank reads a contiguous
    share of the tensor's rows (``1/world`` of its bytes) and one all-to-all per tensor gives every rank its
    columns of every share: each byte is read from storage once in all, and ``(world - 1) / world`` of each slice
    crosses the group. Memory besides the slices: the rank's row shares of these tensors (``1/world`` of their
    bytes) and the all-to-alls' send buffers (at most 1 GiB in flight). This runs over the whole group whatever
    ``split`` says;
  - otherwise each rank reads its row segments itself, through one plan: the bytes asked for equal the slice's
    bytes, but the engine merges reads less than 64 KiB apart (it reads the bytes between them and drops them),
    so a slice of a tensor whose rows are shorter than that reads up to the whole tensor's span from storage,
    through bounded staging memory; and segments far apart are one read each, IOPS-bound on slow storage, and one
    host-to-device copy each.

Several hosts: the same code. Each rank opens ``paths`` on its own host, which may be a shared file system or a
host-local copy (same bytes; every rank's headers are compared before any data moves). ``split="global"`` (the
default) splits the reading across all ranks of the group, so each byte is read once in all, and the blocks cross
hosts over the group's network (the right choice when the interconnect is faster than each host's storage, as
with InfiniBand or NVLink networks, and for shared file systems, which then serve each byte once).
``split="host"`` splits the reading among the ranks of each host: each host reads the whole checkpoint once from
its own storage, and the collectives stay inside the host (for hosts joined by a network slower than their disks).

Failures: before any data collective, the ranks exchange their status; a rank whose read fails (or whose header,
shard spec or device is wrong) stops reading, and every rank raises :class:`DistributedError` naming the rank and
its error. Every collective is waited for with a deadline (``timeout``), so a rank that crashed or hangs makes the
others raise instead of waiting forever.

Without an initialised process group, :func:`load_file` is the single-process load (shard specs still apply).
"""

from __future__ import annotations

import bisect
import ctypes
import hashlib
import json
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, Union

from . import _core, _native
from ._errors import FormatError, InvalidArgumentError, TensorNotFoundError, WeightliftError
from .safetensors import safe_open

if TYPE_CHECKING:
    import torch

PathLike = Union[str, "os.PathLike[str]"]
#: ``(dim, world, rank)``: this rank's slice is ``torch.tensor_split(full, world, dim)[rank]``.
ShardSpec = tuple[int, int, int]
Shard = Union[Mapping[str, Optional[ShardSpec]], Callable[[str, tuple[int, ...]], Optional[ShardSpec]], None]

#: Bytes each rank reads per step of a replicated load when ``block_bytes`` is not given (fewer when its share is
#: smaller: one step). On two H200s over NVLink (bench/results/2026-11-24-h200x2, the run at d445aff) fewer,
#: larger steps were faster at two of three sizes and level at the third: a 1.08 GB sharded checkpoint 37.1 GB/s
#: with 256 MiB against 29.0 with eight steps of 67 MiB, a 0.27 GB file 4.49 against 3.64 with eight of 16 MiB, a
#: 4.17 GB file 47.4 against 46.4; 64 MiB steps lost at 4.17 GB (33.8). Each step costs a status exchange and a
#: read call.
DEFAULT_BLOCK_BYTES = 256 << 20
#: Seconds any one collective may take before the load is declared stuck.
DEFAULT_TIMEOUT_S = 300.0
#: Steps and runs start on multiples of this, so that block boundaries fall on O_DIRECT blocks of the files.
_ALIGN = 4096
#: Alignment of each sharded tensor in a rank's buffer.
_TENSOR_ALIGN = 256
#: Send buffers of all-to-alls (slices along dims > 0) in flight at once.
_EXCHANGE_INFLIGHT_BYTES = 1 << 30
#: Status of a rank at the end of a load.
_OK, _FAILED, _STOPPED = 0, 1, 2
#: How a replicated load reads; measured alternatives (bench/distributed_bench.py times each), not a user setting.
#: ``_READ_AHEAD``: each rank reads its blocks of every step one after another on a thread of its own, while the
#: calling thread exchanges statuses and runs the collectives (False: read, exchange, collective in lockstep).
#: ``_READERS``: "all" (every rank reads a block per step) or "one" (the group's first rank reads everything and
#: broadcasts it: one reader per host, the fan-out over NVLink).
#: ``_READ_DEPTH``: with read-ahead, how many steps each rank reads at once (1: one after another).
#: ``_SPAN``: "interleaved" (step k's blocks of the ranks are adjacent: one all-gather per step) or "contiguous"
#: (each rank reads one contiguous share of the files, a block per step; one broadcast from each rank per step).
_READ_AHEAD = True
_READERS = "all"
_READ_DEPTH = 2
_SPAN = "interleaved"

_lock = threading.Lock()
_last: "dict[str, Any] | None" = None
_subgroups: dict[tuple, Any] = {}


class DistributedError(WeightliftError, RuntimeError):
    """A distributed load failed; every rank raises it. ``failures`` maps each failed rank (in the group) to its
    error message; empty when a rank stopped answering (then the message says which collective timed out)."""

    def __init__(self, message: str, failures: "Mapping[int, str] | None" = None):
        super().__init__(message)
        self.failures: dict[int, str] = dict(failures or {})


def last_report() -> "dict[str, Any] | None":
    """The report of this process's last :func:`load_file`: this rank's figures (``rank``, ``bytes`` returned,
    ``storage_bytes`` read from storage with alignment, ``storage_requested_bytes`` asked of the engine,
    ``group_bytes_sent`` / ``group_bytes_received`` over the process group, ``seconds``, ``read_seconds`` (in the
    engine, summed over the reads: two steps read at once both count), ``read_depth`` (steps read at once), ``span``
    ("interleaved" or "contiguous": how the ranks' blocks lie in the files),
    ``read_wait_seconds`` (the calling thread waiting for this rank's reads), ``exchange_seconds`` (status
    exchanges), ``collective_wait_seconds``, ``wait_seconds`` (every wait on the group), ``timeline`` (per step:
    read start, read end, status exchange done, collective launched, in seconds since the start)), ``ranks`` (every
    rank's figures) and ``summary`` (totals and the slowest rank)."""
    with _lock:
        return None if _last is None else dict(_last)


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: int
    offset: int
    nbytes: int


@dataclass
class _Stats:
    rank: int
    world: int
    device: str
    split: str
    collective: str
    host: str = field(default_factory=lambda: _host_name())
    tensors: int = 0
    bytes: int = 0
    checkpoint_bytes: int = 0
    storage_requested_bytes: int = 0
    storage_bytes: int = 0
    header_bytes: int = 0
    group_bytes_sent: int = 0
    group_bytes_received: int = 0
    steps: int = 0
    sharded_tensors: int = 0
    shard_ranges: int = 0
    block_bytes: int = 0
    seconds: float = 0.0
    read_seconds: float = 0.0
    wait_seconds: float = 0.0
    exchange_seconds: float = 0.0
    collective_wait_seconds: float = 0.0
    read_wait_seconds: float = 0.0
    readers: str = ""
    read_ahead: bool = False
    read_depth: int = 1
    span: str = ""
    #: Per step of a replicated load, seconds since the load's start: ``[read start, read end, status exchange
    #: done, collective issued]`` (read times are this rank's; -1 where this rank read nothing).
    timeline: list = field(default_factory=list)
    backend: str = ""
    direct_policy: str = ""

    def add_read(self, report: dict) -> None:
        self.storage_requested_bytes += int(report.get("bytes", 0))
        self.storage_bytes += int(report.get("direct_bytes", 0)) + int(report.get("buffered_bytes", 0))
        self.read_seconds += float(report.get("seconds", 0.0))
        self.backend = str(report.get("backend", self.backend))
        self.direct_policy = str(report.get("direct_policy", self.direct_policy))


def load_file(
    paths: Union[PathLike, Sequence[PathLike]],
    *,
    device: Union[str, int, "torch.device"],
    group: Any = None,
    shard: Shard = None,
    split: str = "global",
    collective: str = "auto",
    block_bytes: "int | None" = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    engine: "_native.NativeEngine | None" = None,
) -> dict[str, "torch.Tensor"]:
    """Loads a safetensors checkpoint (a file, shards, or a ``model.safetensors.index.json``) on every rank of
    ``group`` (default: the whole world), reading each byte from storage once; see the module's documentation.

    Every rank of the group must call it with the same checkpoint (headers are compared), ``split``,
    ``collective``, ``block_bytes`` and the same set of unsharded tensors. ``device`` is this rank's device
    (``f"cuda:{local_rank}"``; "cpu" needs a group with a CPU backend such as gloo). ``shard`` maps tensor names to
    ``(dim, world, rank)`` (this rank gets ``torch.tensor_split(full, world, dim)[rank]``), or is a callable
    ``(name, shape) -> (dim, world, rank) | None``; tensors without a spec are replicated. Slices along dims > 0
    are read as row shares and exchanged when every rank slices them with the group's size and its own rank, else
    read as row segments (see the module's documentation for the costs). ``split``: "global"
    (all ranks share the reading) or "host" (the ranks of each host share the reading of that host's copy).
    ``collective``: "all_gather", "broadcast", or "auto" (all-gather on GPUs, broadcast on CPUs).
    ``block_bytes``: what each rank reads per step (default :data:`DEFAULT_BLOCK_BYTES`, 256 MiB). ``timeout`` bounds
    each collective, in seconds. ``engine``: the engine (and its settings) to read with (default: the shared one). Tensors on a GPU are ready when this returns. Raises :class:`DistributedError` on every rank when any
    rank fails."""
    if split not in ("global", "host"):
        raise InvalidArgumentError(f"split={split!r}: expected 'global' or 'host'")
    if collective not in ("auto", "all_gather", "broadcast"):
        raise InvalidArgumentError(f"collective={collective!r}: expected 'auto', 'all_gather' or 'broadcast'")
    if block_bytes is not None and int(block_bytes) < _ALIGN:
        raise InvalidArgumentError(f"block_bytes={block_bytes}: at least {_ALIGN}")
    if not timeout > 0:
        raise InvalidArgumentError(f"timeout={timeout}: must be positive")
    torch = _core.torch_module()
    dev = _core.normalize_device(device)
    if collective == "auto":
        # NCCL: one in-place all-gather per step, one launch instead of one per rank (bench/distributed_bench.py
        # times both). gloo: its all-gather took 2-3 times as long as one broadcast per rank (2 ranks, one host).
        collective = "all_gather" if dev.startswith("cuda") else "broadcast"
    load = _Load(
        torch=torch,
        device=dev,
        engine=engine or _core.shared_engine(),
        split=split,
        collective=collective,
        block=None if block_bytes is None else int(block_bytes) // _ALIGN * _ALIGN,
    )
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        load.group = _Group(dist, group, load.device, float(timeout))
    return load.run(_as_paths(paths), shard)


def _as_paths(paths: Union[PathLike, Sequence[PathLike]]) -> list[str]:
    if isinstance(paths, (str, os.PathLike)):
        return [os.fspath(paths)]
    return [os.fspath(p) for p in paths]


def _host_name() -> str:
    """The key that says which ranks share a host (for ``split="host"``)."""
    return socket.gethostname()


def _int64(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little", signed=True)


class _Group:
    """A process group as the loader uses it: this rank, the ranks, the device of its collectives, deadlines."""

    def __init__(self, dist: Any, group: Any, device: str, timeout: float):
        self.dist = dist
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        if self.rank < 0:
            raise InvalidArgumentError("this process is not a member of the process group it was given")
        self.world = dist.get_world_size(self.group)
        self.ranks = list(dist.get_process_group_ranks(self.group))
        self.timeout_s = timeout
        self.device = device if device.startswith("cuda") else "cpu"
        backend = str(dist.get_backend(self.group))
        if self.device == "cpu" and "gloo" not in backend and "mpi" not in backend:
            raise InvalidArgumentError(f"device {device}: the {backend} process group cannot move CPU tensors; use gloo")
        self.wait_seconds = 0.0

    def wait(self, works: list, what: str) -> None:
        """Waits for ``works`` until the deadline. Polls rather than ``Work.wait(timeout)``, whose CPU-side wait on
        NCCL sleeps in whole milliseconds (twice per step); ``wait()`` then orders the current stream after it."""
        start = time.perf_counter()
        deadline = time.monotonic() + self.timeout_s
        try:
            for w in works:
                delay = 0.0
                while not w.is_completed():
                    if time.monotonic() > deadline:
                        raise RuntimeError("timed out")
                    time.sleep(delay)
                    delay = min(1e-3, 2 * delay if delay else 1e-5)
                w.wait()
        except RuntimeError as e:
            raise DistributedError(
                f"rank {self.rank} of {self.world}: {what} failed or did not complete within {self.timeout_s:g} s "
                f"({e}); a peer rank stopped answering (it crashed, hangs, or did not call load_file with the same "
                "arguments); the process group may be unusable now"
            ) from e
        finally:
            self.wait_seconds += time.perf_counter() - start

    def gather_ints(self, values: list[int], what: str) -> list[list[int]]:
        """Every rank's ``values`` (same length on all ranks), by rank."""
        torch = _core.torch_module()
        mine = torch.tensor(values, dtype=torch.int64, device=self.device)
        out = [torch.empty_like(mine) for _ in range(self.world)]
        self.wait([self.dist.all_gather(out, mine, group=self.group, async_op=True)], what)
        return [t.tolist() for t in out]

    def any_failed(self, failed: bool, what: str) -> bool:
        torch = _core.torch_module()
        flag = torch.tensor([1 if failed else 0], dtype=torch.int32, device=self.device)
        work = self.dist.all_reduce(flag, op=self.dist.ReduceOp.MAX, group=self.group, async_op=True)
        self.wait([work], what)
        return bool(flag.item())

    def objects(self, obj: Any, what: str, ints: Sequence[int] = ()) -> tuple[list[list[int]], list]:
        """Every rank's ``obj`` (JSON: the ranks' reports and error messages), by rank, with every rank's ``ints``
        (same count on all ranks) gathered in the same collective as the texts' lengths: ``(ints by rank, objs by
        rank)``. Two all-gathers of tensors on the group's device (the lengths with ``ints``, then the texts padded
        to the longest), each waited for under the deadline (which ``all_gather_object`` has not), and no GPU kernel:
        a kernel's first launch in a process costs milliseconds, and this runs once per load."""
        torch = _core.torch_module()
        data = json.dumps(obj).encode()  # data only: the package never unpickles (SECURITY.md)
        rows = self.gather_ints([*ints, len(data)], what)
        sizes = [r[-1] for r in rows]
        width = max(sizes)
        mine = torch.zeros(width, dtype=torch.uint8)
        mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        mine = mine.to(self.device)
        out = [torch.empty(width, dtype=torch.uint8, device=self.device) for _ in range(self.world)]
        self.wait([self.dist.all_gather(out, mine, group=self.group, async_op=True)], what)
        # Copies back (no kernel), ordered after the collective on this stream (wait).
        host = [t.cpu() for t in out]
        return [r[:-1] for r in rows], [json.loads(ctypes.string_at(t.data_ptr(), n)) for t, n in zip(host, sizes)]

    def host_group(self, hosts: list[int]) -> "_Group":
        """The ranks of this rank's host, as a group (this group when all ranks share one host)."""
        mine = [self.ranks[i] for i, h in enumerate(hosts) if h == hosts[self.rank]]
        if len(mine) == self.world:
            return self
        key = (tuple(self.ranks), tuple(mine))
        if key not in _subgroups:
            backend = self.dist.get_backend(self.group)
            _subgroups[key] = self.dist.new_group(ranks=mine, backend=backend, use_local_synchronization=True)
        return _Group(self.dist, _subgroups[key], self.device, self.timeout_s)


@dataclass
class _Run:
    """Consecutive replicated tensors of one file, and where they start in the shared buffer."""

    file: int
    offset: int
    nbytes: int
    dest: int


class _Layout:
    """Where each replicated tensor lives in the buffer every rank fills, and which bytes each rank reads per step.

    Tensors keep their file order; each run of adjacent tensors starts at a buffer offset congruent to its file
    offset modulo 4 KiB, so tensors keep their alignment and step boundaries (multiples of 4 KiB) fall on block
    boundaries of the files: ranks do not read the same device block twice."""

    def __init__(self, entries: list[_Entry], world: int, block: "int | None", contiguous: bool = False):
        self.runs: list[_Run] = []
        self.dest: dict[str, int] = {}
        cursor = 0
        for e in sorted(entries, key=lambda e: (e.file, e.offset)):
            last = self.runs[-1] if self.runs else None
            if last is None or last.file != e.file or last.offset + last.nbytes != e.offset:
                last = _Run(e.file, e.offset, 0, _align_up(cursor, _ALIGN) + e.offset % _ALIGN)
                self.runs.append(last)
            self.dest[e.name] = last.dest + (e.offset - last.offset)
            last.nbytes = e.offset + e.nbytes - last.offset
            cursor = last.dest + last.nbytes
        self.used = cursor
        if block is None:
            block = DEFAULT_BLOCK_BYTES
        self.block = block
        self.share = 0
        if contiguous:
            # Rank r reads the r-th of `world` contiguous shares of the buffer (of the files), a block per step.
            self.share = _align_up(-(-cursor // world), _ALIGN)
            self.steps = [(lo, min(block, self.share - lo)) for lo in range(0, self.share, block)]
            self.size = world * self.share
        else:
            span = world * block
            full, rem = divmod(cursor, span)
            self.steps = [(k * span, block) for k in range(full)]
            if rem:
                last_block = _align_up(-(-rem // world), _ALIGN)
                self.steps.append((full * span, last_block))
            self.size = sum(world * b for _, b in self.steps)
        self._starts = [r.dest for r in self.runs]

    def ranges(self, lo: int, hi: int) -> list[tuple[int, int, int, int]]:
        """``(file, offset, nbytes, buffer offset)`` of the file bytes that land in ``[lo, hi)`` of the buffer."""
        out = []
        i = max(0, bisect.bisect_right(self._starts, lo) - 1)
        while i < len(self.runs) and self.runs[i].dest < hi:
            r = self.runs[i]
            a, b = max(lo, r.dest), min(hi, r.dest + r.nbytes)
            if b > a:
                out.append((r.file, r.offset + (a - r.dest), b - a, a))
            i += 1
        return out


def _align_up(n: int, a: int) -> int:
    return -(-n // a) * a


def _prod(xs: Sequence[int]) -> int:
    p = 1
    for x in xs:
        p *= int(x)
    return p


def _resolve_specs(shard: Shard, entries: list[_Entry]) -> dict[str, ShardSpec]:
    """Each sharded tensor's validated ``(dim, world, rank)``, with ``dim`` made non-negative."""
    if shard is None:
        return {}
    by_name = {e.name: e for e in entries}
    if callable(shard):
        raw = {e.name: shard(e.name, e.shape) for e in entries}
    elif isinstance(shard, Mapping):
        missing = [n for n in shard if n not in by_name]
        if missing:
            raise TensorNotFoundError(f"shard names tensor {missing[0]!r}, which the checkpoint does not have")
        raw = dict(shard)
    else:
        raise InvalidArgumentError("shard must be a mapping name -> (dim, world, rank) or a callable")
    specs = {}
    for name, spec in raw.items():
        if spec is None:
            continue
        shape = by_name[name].shape
        try:
            dim, world, rank = (int(x) for x in spec)
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(f"shard spec of {name!r}: {spec!r} is not (dim, world, rank)") from e
        if not shape:
            raise InvalidArgumentError(f"shard spec of {name!r}: a 0-d tensor cannot be sliced")
        if not -len(shape) <= dim < len(shape) or world < 1 or not 0 <= rank < world:
            raise InvalidArgumentError(f"shard spec of {name!r}: {spec!r} does not fit shape {list(shape)}")
        specs[name] = (dim % len(shape), world, rank)
    return specs


def _slice(e: _Entry, spec: ShardSpec, base: int) -> tuple[tuple[int, ...], list[tuple[int, int, int, int]]]:
    """The slice's shape and its ``(file, offset, nbytes, buffer offset)`` ranges, the slice starting at ``base``."""
    dim, world, rank = spec
    n = e.shape[dim]
    lo, hi = _split(n, world, rank)
    length = hi - lo
    shape = e.shape[:dim] + (length,) + e.shape[dim + 1 :]
    outer = _prod(e.shape[:dim])
    if outer * n == 0 or length == 0:
        return shape, []
    if e.nbytes % (outer * n):
        raise InvalidArgumentError(f"{e.name!r} ({e.dtype}) cannot be sliced along dim {dim}: its elements are smaller than a byte")
    inner = e.nbytes // (outer * n)
    seg, stride = length * inner, n * inner
    if outer == 1 or seg == stride:
        return shape, [(e.file, e.offset + lo * inner, outer * seg, base)]
    return shape, [(e.file, e.offset + i * stride + lo * inner, seg, base + i * seg) for i in range(outer)]


def _exchangeable(entries: list[_Entry], specs: dict[str, ShardSpec], g: "_Group | None") -> tuple[list[str], bool, int]:
    """Sharded tensors sliced along a dim > 0 (not one contiguous range), whether this rank's specs for them are
    ``(dim, group size, group rank)``, and a digest of ``(name, dim, world)`` for them to compare across ranks."""
    names = [e.name for e in entries if e.name in specs and _prod(e.shape[: specs[e.name][0]]) > 1]
    ok = g is not None and g.world > 1 and all(specs[n][1] == g.world and specs[n][2] == g.rank for n in names)
    return names, ok, _int64(repr(sorted((n, specs[n][0], specs[n][1]) for n in names)))


def _split(n: int, world: int, rank: int) -> tuple[int, int]:
    """``[start, stop)`` of part ``rank`` of ``n`` in ``world`` parts, as ``torch.tensor_split``."""
    q, m = divmod(n, world)
    start = rank * q + min(rank, m)
    return start, start + q + (1 if rank < m else 0)


def _typed(buf: "torch.Tensor", at: int, e: _Entry, shape: tuple[int, ...]) -> "torch.Tensor":
    """Bytes ``[at, at + size)`` of ``buf`` as a tensor of ``e``'s dtype and ``shape``, sharing memory when aligned."""
    torch = _core.torch_module()
    table = _core.torch_dtypes()
    if e.dtype not in table:
        raise InvalidArgumentError(f"this torch has no dtype for {e.dtype} ({e.name!r})")
    dtype = table[e.dtype]
    size = _prod(shape) * torch.empty((), dtype=dtype).element_size()
    if size == 0:
        return torch.empty(shape, dtype=dtype, device=buf.device)
    raw = buf[at : at + size]
    if dtype == torch.uint8:
        return raw.view(shape)
    if (buf.data_ptr() + at) % torch.empty((), dtype=dtype).element_size():
        raw = raw.clone()  # a file whose tensor is not aligned to its element size (safetensors writers align)
    return raw.view(dtype).view(shape)


class _Reader:
    """Reads a rank's blocks of every step, in step order, on threads of their own: the disk never waits for the
    status exchanges and collectives, which the calling thread runs as each step's block lands. ``depth`` steps are
    read at once (one thread each): the engine's lanes take the next step's reads as the current step's last reads
    run, instead of draining to one read in flight at each step's end. The blocks land in the load's own buffer (no
    extra memory); a failed read ends the reading and is reported at the next exchange, as in lockstep."""

    def __init__(self, load: "_Load", ranges: Callable[[int], list], steps: int, buf: "torch.Tensor | None", depth: int):
        self.load, self.ranges, self.steps, self.buf = load, ranges, steps, buf
        self.next = 0  # the next step a thread takes
        self.read = [False] * steps  # steps read (or given up on)
        self.done = 0  # steps 0..done-1 are all read
        self.cond = threading.Condition()
        self.stop = False
        self.threads = [
            threading.Thread(target=self._run, name=f"weightlift-distributed-reader-{i}", daemon=True)
            for i in range(max(1, min(depth, steps)))
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _run(self) -> None:
        while True:
            with self.cond:
                if self.next >= self.steps:
                    return
                k = self.next
                self.next += 1
                stop = self.stop or self.load.failure is not None
            if not stop:
                self.load._timed_read(k, self.ranges(k), self.buf)
            with self.cond:
                self.read[k] = True
                while self.done < self.steps and self.read[self.done]:
                    self.done += 1
                self.cond.notify_all()

    def wait_for(self, k: int) -> None:
        """Until steps ``0..=k`` are read; in short waits, so that Ctrl-C reaches the calling thread."""
        t = time.perf_counter()
        with self.cond:
            while self.done <= k:
                self.cond.wait(0.1)
        self.load.stats.read_wait_seconds += time.perf_counter() - t

    def finish(self) -> None:
        """Stops after the steps being read (on an error or interrupt of the calling thread) and joins."""
        with self.cond:
            self.stop = True
        for t in self.threads:
            if t.is_alive():
                t.join()


class _Load:
    """One call of :func:`load_file` on one rank."""

    def __init__(self, *, torch: Any, device: str, engine: Any, split: str, collective: str, block: "int | None"):
        self.torch, self.device, self.engine = torch, device, engine
        self.split, self.collective, self.block = split, collective, block
        self.group: "_Group | None" = None
        self.failure: "BaseException | None" = None
        self.stopped = False
        self.paths: list[str] = []
        self.checkpoint: "_native.Checkpoint | None" = None
        self.stats_lock = threading.Lock()
        self.start = time.perf_counter()

    def run(self, paths: list[str], shard: Shard) -> dict[str, "torch.Tensor"]:
        g = self.group
        rank, world = (g.rank, g.world) if g else (0, 1)
        self.stats = _Stats(rank, world, self.device, self.split if g else "single process", self.collective if g else "none")
        entries, specs, digest = self._prepare(paths, shard)
        coop, coop_ok, coop_digest = _exchangeable(entries, specs, g)
        hosts, exchange = self._start(digest, coop_ok, coop_digest)
        coop = set(coop) if exchange else set()
        out: dict[str, "torch.Tensor"] = {}
        if self.failure is None:
            out.update(self._shards([e for e in entries if e.name in specs and e.name not in coop], specs))
        if coop:
            out.update(self._exchange(g, [e for e in entries if e.name in coop], specs))
        replicated = [e for e in entries if e.name not in specs]
        if g is None:
            if self.failure is None:
                out.update(self._alone(replicated))
        elif replicated:
            pg = g.host_group(hosts) if self.split == "host" else g
            out.update(self._replicate(pg, replicated))
        return self._finish(out)

    def _prepare(self, paths: list[str], shard: Shard) -> tuple[list[_Entry], dict[str, ShardSpec], int]:
        try:
            # Kept for the reads: an object's bytes are read from the version its header was parsed from.
            checkpoint = _native.Checkpoint(paths)
            if checkpoint.format != "safetensors":
                raise FormatError(f"{', '.join(paths)}: not a safetensors checkpoint (it is {checkpoint.format})")
            files = checkpoint.files
            self.paths = [f["path"] for f in files]
            entries = [_Entry(t.name, t.dtype, tuple(int(x) for x in t.shape), t.file, t.offset, t.nbytes) for t in checkpoint.tensors]
            specs = _resolve_specs(shard, entries)
        except Exception as e:  # noqa: BLE001 - any rank's failure must reach the others before it is raised
            self.failure = e
            return [], {}, 0
        self.checkpoint = checkpoint
        self.stats.header_bytes = sum(int(f["data_start"]) for f in files)
        self.stats.checkpoint_bytes = sum(e.nbytes for e in entries)
        # Offsets too: the shared buffer's layout follows them, so ranks must agree on them, not only on names; and
        # the objects' ETags (None for local files): ranks reading a bucket must read one version of each object.
        table = [(e.name, e.dtype, e.shape, e.file, e.offset, e.nbytes) for e in entries]
        replicated = sorted(e.name for e in entries if e.name not in specs)
        versions = [f["etag"] for f in files]
        return entries, specs, _int64(repr((table, replicated, versions)))

    def _start(self, digest: int, coop_ok: bool, coop_digest: int) -> tuple[list[int], bool]:
        """Checks that every rank could read its headers and sees the same checkpoint; returns each rank's host key
        and whether the ranks slice the same tensors along dims > 0 with the group's size (then they exchange)."""
        if self.group is None:
            self._raise_alone()
            return [0], False
        mine = [_FAILED if self.failure else _OK, digest, _int64(_host_name()), int(coop_ok), coop_digest]
        rows = self.group.gather_ints(mine, "the start of the load")
        if any(r[0] for r in rows):
            self._raise_failures([r[0] for r in rows])
        if len({r[1] for r in rows}) > 1:
            odd = [i for i, r in enumerate(rows) if r[1] != rows[0][1]]
            raise DistributedError(
                f"ranks {odd} see other tensors (names, dtypes, shapes, offsets), other unsharded tensors or other "
                "versions of the objects (ETags) than rank 0: every rank must load the same checkpoint files with the "
                "same set of replicated tensors"
            )
        return [r[2] for r in rows], all(r[3] for r in rows) and len({r[4] for r in rows}) == 1

    def _read(self, ranges: list[tuple[int, int, int, int]], buf: "torch.Tensor") -> None:
        if self.failure is not None or not ranges:
            return
        try:
            report = self.checkpoint.read_ranges_into(self.engine, ranges, buf.data_ptr(), buf.numel(), self.device)
        except Exception as e:  # noqa: BLE001 - reported to every rank before it is raised
            self.failure = e
            return
        with self.stats_lock:  # the reader's threads add theirs at once
            self.stats.add_read(report)

    def _buffer(self, nbytes: int) -> "torch.Tensor":
        buf = self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device)
        if self.device.startswith("cuda"):
            # The engine writes from its own streams: work still queued on this memory's previous use must end.
            self.torch.cuda.current_stream(buf.device).synchronize()
        return buf

    def _shards(self, entries: list[_Entry], specs: dict[str, ShardSpec]) -> dict[str, "torch.Tensor"]:
        """Reads this rank's slice of each sharded tensor straight from storage, all through one plan."""
        try:
            placed, ranges, cursor = [], [], 0
            for e in entries:
                at = _align_up(cursor, _TENSOR_ALIGN)
                shape, rs = _slice(e, specs[e.name], at)
                placed.append((e, at, shape))
                ranges.extend(rs)
                cursor = at + sum(r[2] for r in rs)
            buf = self._buffer(cursor)
        except Exception as e:  # noqa: BLE001
            self.failure = e
            return {}
        self._read(ranges, buf)
        self.stats.sharded_tensors += len(entries)
        self.stats.shard_ranges += len(ranges)
        return {} if self.failure else {e.name: _typed(buf, at, e, shape) for e, at, shape in placed}

    def _exchange(self, g: _Group, entries: list[_Entry], specs: dict[str, ShardSpec]) -> dict[str, "torch.Tensor"]:
        """Slices along a dim > 0, each byte read once: every rank reads a contiguous share of each tensor's outer
        rows, and one all-to-all per tensor hands every rank its columns of every share."""
        torch, w, r = self.torch, g.world, g.rank
        parts, ranges, cursor = [], [], 0
        for e in entries:
            dim = specs[e.name][0]
            outer, n = _prod(e.shape[:dim]), e.shape[dim]
            if e.nbytes % (outer * n):
                self.failure = self.failure or InvalidArgumentError(f"{e.name!r} ({e.dtype}) cannot be sliced along dim {dim}: its elements are smaller than a byte")
                continue
            inner = e.nbytes // (outer * n)
            r0, r1 = _split(outer, w, r)
            at = _align_up(cursor, _TENSOR_ALIGN)
            if r1 > r0:
                ranges.append((e.file, e.offset + r0 * n * inner, (r1 - r0) * n * inner, at))
            parts.append((e, dim, outer, n, inner, r0, r1, at))
            cursor = at + (r1 - r0) * n * inner
        rows = None
        try:
            rows = self._buffer(cursor) if self.failure is None else None
        except Exception as ex:  # noqa: BLE001
            self.failure = ex
        self._read(ranges, rows)
        self.stats.shard_ranges += len(ranges)
        if g.any_failed(self.failure is not None, "the status exchange before the sliced tensors"):
            self.stopped = True
            return {}
        out, inflight = {}, []
        for e, dim, outer, n, inner, r0, r1, at in parts:
            cols = [_split(n, w, d) for d in range(w)]
            block = rows[at : at + (r1 - r0) * n * inner].view(r1 - r0, n, inner)
            send = torch.cat([block[:, a:b, :].reshape(-1) for a, b in cols])
            sizes_in = [(r1 - r0) * (b - a) * inner for a, b in cols]
            mine = cols[r][1] - cols[r][0]
            sizes_out = [(s1 - s0) * mine * inner for s0, s1 in (_split(outer, w, s) for s in range(w))]
            recv = torch.empty(sum(sizes_out), dtype=torch.uint8, device=self.device)
            work = g.dist.all_to_all_single(recv, send, sizes_out, sizes_in, group=g.group, async_op=True)
            inflight.append((work, send))
            self.stats.group_bytes_sent += sum(sizes_in) - sizes_in[r]
            self.stats.group_bytes_received += sum(sizes_out) - sizes_out[r]
            shape = e.shape[:dim] + (mine,) + e.shape[dim + 1 :]
            out[e.name] = _typed(recv, 0, e, shape)
            while sum(x[1].numel() for x in inflight) > _EXCHANGE_INFLIGHT_BYTES:
                g.wait([inflight.pop(0)[0]], f"the all-to-all of {e.name!r}")
        g.wait([x[0] for x in inflight], "the all-to-alls of the sliced tensors")
        self.stats.sharded_tensors += len(entries)
        return out

    def _alone(self, entries: list[_Entry]) -> dict[str, "torch.Tensor"]:
        """Without a process group: the single-process load."""
        if not entries:
            return {}
        out = safe_open(self.paths, framework="pt", device=self.device, engine=self.engine).get_tensors([e.name for e in entries])
        self.stats.add_read(_native.last_report() or {})
        return out

    def _replicate(self, pg: _Group, entries: list[_Entry]) -> dict[str, "torch.Tensor"]:
        """Every rank reads its blocks of each step; the blocks reach the other ranks while the next steps are read."""
        one = _READERS == "one"
        contiguous = _SPAN == "contiguous" and not one
        layout = _Layout(entries, 1 if one else pg.world, self.block, contiguous)
        self.stats.block_bytes = layout.block
        self.stats.readers, self.stats.read_ahead = ("one" if one else "all"), _READ_AHEAD
        self.stats.read_depth = _READ_DEPTH if _READ_AHEAD else 1
        self.stats.span = "contiguous" if contiguous else "interleaved"
        try:
            buf = self._buffer(layout.size)
        except Exception as e:  # noqa: BLE001
            self.failure = e
            buf = None

        def mine(k: int) -> list[tuple[int, int, int, int]]:
            lo, blk = layout.steps[k]
            if one:
                return layout.ranges(lo, lo + blk) if pg.rank == 0 else []
            at = pg.rank * layout.share + lo if contiguous else lo + pg.rank * blk
            return layout.ranges(at, at + blk)

        self.stats.timeline = [[-1.0, -1.0, -1.0, -1.0] for _ in layout.steps]
        reader = _Reader(self, mine, len(layout.steps), buf, _READ_DEPTH) if _READ_AHEAD else None
        pending: list = []
        try:
            if reader is not None:
                reader.start()
            for k, (lo, blk) in enumerate(layout.steps):
                if reader is not None:
                    reader.wait_for(k)
                else:
                    self._timed_read(k, mine(k), buf)
                t = time.perf_counter()
                failed = pg.any_failed(self.failure is not None, f"the status exchange before step {k}")
                self.stats.exchange_seconds += time.perf_counter() - t
                self.stats.timeline[k][2] = time.perf_counter() - self.start
                if failed:
                    self.stopped = True
                    break
                t = time.perf_counter()
                pg.wait(pending, f"the collective of step {k - 1}")
                self.stats.collective_wait_seconds += time.perf_counter() - t
                pending = self._share(pg, buf, lo, blk, one, layout.share)
                self.stats.timeline[k][3] = time.perf_counter() - self.start
                self.stats.steps += 1
            t = time.perf_counter()
            pg.wait(pending, "the last collective")
            self.stats.collective_wait_seconds += time.perf_counter() - t
        finally:
            if reader is not None:
                reader.finish()
            self.stats.wait_seconds += pg.wait_seconds if pg is not self.group else 0.0
        if self.failure is not None or self.stopped:
            return {}
        return {e.name: _typed(buf, layout.dest[e.name], e, e.shape) for e in entries}

    def _timed_read(self, k: int, ranges: list[tuple[int, int, int, int]], buf: "torch.Tensor | None") -> None:
        """Reads step ``k``'s ranges of this rank and notes when (``timeline``)."""
        if ranges and self.failure is None:
            self.stats.timeline[k][0] = time.perf_counter() - self.start
            self._read(ranges, buf)
            self.stats.timeline[k][1] = time.perf_counter() - self.start

    def _share(self, pg: _Group, buf: "torch.Tensor", lo: int, blk: int, one: bool = False, share: int = 0) -> list:
        """Launches step ``lo``'s collectives (``share``: the contiguous layout's share per rank, else 0)."""
        dist, w = pg.dist, pg.world
        if w == 1:
            return []
        if share:
            # Each rank's block lies in its own share: one broadcast from each.
            self.stats.group_bytes_sent += blk
            self.stats.group_bytes_received += (w - 1) * blk
            return [dist.broadcast(buf[i * share + lo : i * share + lo + blk], src=pg.ranks[i], group=pg.group, async_op=True) for i in range(w)]
        if one:
            self.stats.group_bytes_sent += blk if pg.rank == 0 else 0
            self.stats.group_bytes_received += 0 if pg.rank == 0 else blk
            return [dist.broadcast(buf[lo : lo + blk], src=pg.ranks[0], group=pg.group, async_op=True)]
        self.stats.group_bytes_sent += blk
        self.stats.group_bytes_received += (w - 1) * blk
        if self.collective == "all_gather":
            out = buf[lo : lo + w * blk]
            return [dist.all_gather_into_tensor(out, out[pg.rank * blk : (pg.rank + 1) * blk], group=pg.group, async_op=True)]
        return [dist.broadcast(buf[lo + i * blk : lo + (i + 1) * blk], src=pg.ranks[i], group=pg.group, async_op=True) for i in range(w)]

    def _finish(self, out: dict[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
        g = self.group
        if self.device.startswith("cuda") and self.failure is None:
            self.torch.cuda.current_stream(self.torch.device(self.device)).synchronize()
        self.stats.tensors = len(out)
        self.stats.bytes = sum(t.numel() * t.element_size() for t in out.values())
        self.stats.seconds = time.perf_counter() - self.start
        if g is None:
            self._raise_alone()
            ranks = [asdict(self.stats)]
        else:
            self.stats.wait_seconds += g.wait_seconds
            status = _FAILED if self.failure else (_STOPPED if self.stopped else _OK)
            # Each rank's status travels with its report's length: one collective fewer per load.
            rows, ranks = g.objects(asdict(self.stats), "the end of the load", [status])
            flags = [r[0] for r in rows]
            if any(f == _FAILED for f in flags):
                self._raise_failures(flags)
        _remember(self.stats, ranks)
        return out

    def _raise_alone(self) -> None:
        if self.failure is not None:
            raise self.failure

    def _raise_failures(self, flags: list[int]) -> None:
        """Every rank's error message, then the same DistributedError on every rank."""
        mine = f"{type(self.failure).__name__}: {self.failure}" if self.failure else None
        _, messages = self.group.objects(mine, "the gathering of the ranks' errors")
        failures = {i: m for i, m in enumerate(messages) if flags[i] == _FAILED and m}
        listed = "; ".join(f"rank {i}: {m}" for i, m in failures.items())
        raise DistributedError(f"distributed load failed on {len(failures)} of {self.group.world} ranks: {listed}", failures) from self.failure


def _remember(stats: _Stats, ranks: list[dict]) -> None:
    global _last
    total = ranks[0]["checkpoint_bytes"]
    seconds = max(r["seconds"] for r in ranks)
    summary = {
        "world": len(ranks),
        "hosts": len({r["host"] for r in ranks}),
        "split": stats.split,
        "collective": stats.collective,
        "checkpoint_bytes": total,
        "bytes": sum(r["bytes"] for r in ranks),
        "storage_requested_bytes": sum(r["storage_requested_bytes"] for r in ranks),
        "storage_bytes": sum(r["storage_bytes"] for r in ranks),
        "group_bytes_received": sum(r["group_bytes_received"] for r in ranks),
        "seconds": seconds,
        "slowest_rank": max(range(len(ranks)), key=lambda i: ranks[i]["seconds"]),
        "gbps": total / seconds / 1e9 if seconds > 0 else 0.0,
    }
    with _lock:
        _last = {**asdict(stats), "ranks": ranks, "summary": summary}


__all__ = ["load_file", "last_report", "DistributedError", "ShardSpec", "Shard", "DEFAULT_TIMEOUT_S", "DEFAULT_BLOCK_BYTES"]
