"""Checkpoint headers, read here with the standard library (independent of every loader under test), and the checks
every load passes after its clock stopped: each tensor's dtype, shape and a checksum of its bytes against a plain
read of the file. On a GPU the checksum is, per tensor, its byte count and two sums over its 16-bit words w_i,
sum(w_i) and sum(w_i * (i + 1)), exact (mod 2^64): checking 4 GiB takes a fraction of a second there. On the host:
CRC-32."""

from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass
from typing import Any, Union

HEADER_LIMIT = 100 << 20
# Checksum rows: 2^22 elements of 16 bits times weights up to 2^22 stay below 2^60 in an int64 row sum.
CHUNK = 1 << 22
ROWS = 16


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str
    shape: tuple
    file: int
    offset: int  # absolute, in its file
    nbytes: int


@dataclass
class Checkpoint:
    path: str  # what a loader is given: one .safetensors file or a model.safetensors.index.json
    files: list
    entries: list  # file order: by file, then offset
    data_start: list  # per file: offset of the first data byte

    @property
    def tensor_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    def names(self) -> list:
        return [e.name for e in self.entries]

    def describe(self) -> dict:
        return {
            "path": self.path,
            "files": len(self.files),
            "file_bytes": sum(os.path.getsize(f) for f in self.files),
            "tensors": len(self.entries),
            "tensor_bytes": self.tensor_bytes,
            "tensors_not_4k_aligned": sum(1 for e in self.entries if e.offset % 4096),
        }


def read_header(path: str) -> tuple:
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: shorter than a safetensors header")
        (n,) = struct.unpack("<Q", raw)
        if n > HEADER_LIMIT:
            raise ValueError(f"{path}: header of {n} bytes is over the {HEADER_LIMIT} byte limit")
        return 8 + n, json.loads(f.read(n))


def open_checkpoint(path: str) -> Checkpoint:
    if path.endswith(".json"):
        with open(path) as f:
            weight_map = json.load(f)["weight_map"]
        base = os.path.dirname(path)
        files = [os.path.join(base, s) for s in sorted(set(weight_map.values()))]
    else:
        files = [path]
    entries, starts = [], []
    for i, file in enumerate(files):
        start, header = read_header(file)
        starts.append(start)
        size = os.path.getsize(file)
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            lo, hi = meta["data_offsets"]
            if not 0 <= lo <= hi or start + hi > size:
                raise ValueError(f"{file}: tensor {name!r} lies outside the file")
            entries.append(Entry(name, meta["dtype"], tuple(meta["shape"]), i, start + lo, hi - lo))
    entries.sort(key=lambda e: (e.file, e.offset))
    return Checkpoint(path, files, entries, starts)


_weights: dict = {}  # device -> 1..CHUNK as int64, the positional weights


def _sums(words: Any, start: int) -> tuple:
    """(sum w, sum w * (start + i + 1)) of a 1-D int64 tensor shorter than CHUNK * ROWS."""
    import torch

    n = words.numel()
    key = str(words.device)
    if key not in _weights:
        _weights[key] = torch.arange(1, CHUNK + 1, dtype=torch.int64, device=words.device)
    w = _weights[key]
    full = n // CHUNK
    a_parts, b_parts, offsets = [], [], []
    if full:
        rows = words[: full * CHUNK].view(full, CHUNK)
        a_parts.append(rows.sum(1))
        b_parts.append((rows * w).sum(1))
        offsets.extend(start + r * CHUNK for r in range(full))
    if n % CHUNK:
        tail = words[full * CHUNK :]
        a_parts.append(tail.sum().reshape(1))
        b_parts.append((tail * w[: tail.numel()]).sum().reshape(1))
        offsets.append(start + full * CHUNK)
    a = torch.cat(a_parts).tolist()
    b = torch.cat(b_parts).tolist()
    return sum(a), sum(bi + off * ai for ai, bi, off in zip(a, b, offsets))


def checksum(flat: Any) -> str:
    """Checksum of a flat uint8 tensor's bytes: CRC-32 on the host, positional sums on a GPU. Loads are checked on
    the device their reference was computed on, so the two never meet."""
    if flat.device.type == "cpu":
        return f"{flat.numel()}:crc32:{zlib.crc32(flat.numpy()):08x}"
    return positional(flat)


def positional(flat: Any) -> str:
    """The positional sums of a flat uint8 tensor's 16-bit words (of its bytes when their count is odd)."""
    import torch

    n = flat.numel()
    if n % 2 == 0 and flat.storage_offset() % 2:
        flat = flat.clone()  # a 16-bit view needs an even start
    words = flat.view(torch.int16) if n % 2 == 0 else flat
    mask = 0xFFFF if n % 2 == 0 else 0xFF
    total_a = total_b = 0
    block = CHUNK * ROWS
    for start in range(0, words.numel(), block):
        part = words[start : start + block].to(torch.int64) & mask
        a, b = _sums(part, start)
        total_a += a
        total_b += b
    m = (1 << 64) - 1
    return f"{n}:{total_a & m:016x}:{total_b & m:016x}"


def flat_bytes(t: Any) -> Any:
    import torch

    return t.detach().contiguous().reshape(-1).view(torch.uint8)


ST_DTYPES = {
    "BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64", "I8": "int8", "U8": "uint8",
    "I16": "int16", "I32": "int32", "I64": "int64", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2", "U16": "uint16", "U32": "uint32", "U64": "uint64",
}


@dataclass
class Reference:
    """Each tensor's dtype, shape and checksum, from a plain read of the checkpoint's files."""

    sums: dict  # name -> (dtype, shape, checksum)

    def to_json(self) -> dict:
        return {k: [d, list(s), c] for k, (d, s, c) in self.sums.items()}

    @staticmethod
    def from_json(d: dict) -> "Reference":
        return Reference({k: (v[0], tuple(v[1]), v[2]) for k, v in d.items()})


def reference(ckpt: Checkpoint, check_device: str) -> Reference:
    import torch

    sums = {}
    handles = [open(f, "rb", buffering=0) for f in ckpt.files]
    try:
        for e in ckpt.entries:
            buf = bytearray(e.nbytes)
            view = memoryview(buf)
            done = 0
            while done < e.nbytes:
                got = os.preadv(handles[e.file].fileno(), [view[done:]], e.offset + done)
                if got <= 0:
                    raise ValueError(f"{ckpt.files[e.file]}: end of file inside tensor {e.name!r}")
                done += got
            flat = torch.frombuffer(buf, dtype=torch.uint8) if e.nbytes else torch.empty(0, dtype=torch.uint8)
            sums[e.name] = (e.dtype, e.shape, checksum(flat.to(check_device)))
    finally:
        for h in handles:
            h.close()
    return Reference(sums)


@dataclass
class RawBytes:
    """A loader's result that is raw bytes of the files (KvikIO, np.fromfile): `data` holds file `file`'s bytes
    from `base` on."""

    data: Any
    base: int
    file: int = 0


def verify(loaded: Union[dict, RawBytes], ref: Reference, ckpt: Checkpoint, check_device: str) -> None:
    """Raises ValueError naming the first tensor that differs from the reference."""
    if isinstance(loaded, RawBytes):
        for e in ckpt.entries:
            if e.file != loaded.file:
                continue
            lo = e.offset - loaded.base
            got = checksum(loaded.data[lo : lo + e.nbytes].to(check_device))
            if got != ref.sums[e.name][2]:
                raise ValueError(f"bytes of {e.name!r} differ from the file (checksum {got} != {ref.sums[e.name][2]})")
        return
    if set(loaded) != set(ref.sums):
        missing = sorted(set(ref.sums) - set(loaded))[:3]
        extra = sorted(set(loaded) - set(ref.sums))[:3]
        raise ValueError(f"tensor names differ from the file: missing {missing}, unexpected {extra}")
    for name, t in loaded.items():
        dtype, shape, want = ref.sums[name]
        if str(t.dtype) != f"torch.{ST_DTYPES.get(dtype, dtype)}" or tuple(t.shape) != shape:
            raise ValueError(f"{name!r}: {t.dtype} {tuple(t.shape)} loaded, {dtype} {shape} in the file")
        got = checksum(flat_bytes(t).to(check_device))
        if got != want:
            raise ValueError(f"bytes of {name!r} differ from the file (checksum {got} != {want})")
