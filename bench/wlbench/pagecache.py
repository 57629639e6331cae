"""The page cache: dropping it (cold cases), warming a file (warm cases), and how much of a file is resident
(mincore)."""

from __future__ import annotations

import ctypes
import os
import subprocess
from typing import Optional


def drop_caches(files: list, how: str) -> None:
    if how == "drop_caches":
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        return
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cold_unavailable(how: str) -> Optional[str]:
    if how == "fadvise":
        return None if hasattr(os, "posix_fadvise") else "posix_fadvise is not available"
    if not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        return "cannot write /proc/sys/vm/drop_caches (needs root; try --cold fadvise)"
    return None


def warm(files: list) -> None:
    """Reads the files unless every page of them is in the page cache already."""
    if resident_fraction(files) == 1.0:
        return
    buf = bytearray(16 << 20)
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def resident_fraction(files: list) -> Optional[float]:
    """The fraction of the files' pages in the page cache, from mincore(2); None where it cannot be asked."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    import numpy as np

    page = os.sysconf("SC_PAGE_SIZE")
    resident = total = 0
    for path in files:
        size = os.path.getsize(path)
        if size == 0:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        finally:
            os.close(fd)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            return None
        pages = (size + page - 1) // page
        vec = (ctypes.c_ubyte * pages)()
        rc = libc.mincore(addr, size, vec)
        libc.munmap(addr, size)
        if rc != 0:
            return None
        resident += int((np.frombuffer(vec, dtype=np.uint8) & 1).sum())
        total += pages
    return resident / total if total else None
