"""``weightlift.keep``: keep checkpoints on a GPU for the loads of other processes.

A keeper holds checkpoint files in GPU memory (or, with ``device="cpu"``, in shared host memory for host loads) and
serves the loads of other processes of the same user from it: a restarted server's ``load_file(path,
device="cuda:0")`` then copies device to device instead of reading storage and crossing PCIe. Loads find a keeper
by the ``keeper`` setting (``auto``: the one at the device's default socket; ``WEIGHTLIFT_KEEPER`` or ``keeper=``
on an engine), and say in their report whether it served them, or why not (``weightlift.last_report()["keeper"]``).
A file that changed since it was kept is never served from it. ``weightlift keep`` runs one from the command line;
docs/keeper.md says how it works."""

from __future__ import annotations

import os
from typing import Any, Iterable, Union

from . import _native

PathLike = Union[str, "os.PathLike[str]"]


class Keeper:
    """A keeper running in this process, on threads of its own (see :func:`keep`). Stops on :meth:`stop`, at the
    end of a ``with`` block, or when the process exits."""

    def __init__(self, native: "_native.NativeKeeper"):
        self._native = native

    @property
    def socket(self) -> str:
        """The socket loads reach it by."""
        return os.fspath(self._native.socket)

    @property
    def running(self) -> bool:
        return self._native.running

    def keep(self, paths: Iterable[PathLike], wait: bool = True) -> None:
        """Keeps the files or objects (URLs) ``paths`` too (``wait=False``: returns while they load)."""
        self._native.keep([os.fspath(p) for p in paths])
        if wait:
            self._native.wait()

    def wait(self) -> None:
        """Waits until no load of the keeper is in progress."""
        self._native.wait()

    def status(self) -> dict[str, Any]:
        """What it holds: ``device``, ``budget``, ``used``, ``entries`` (``path``, ``len``, ``bytes``, ``state``,
        ``leases``), ``served``, ``failed``."""
        return self._native.status()

    def stop(self) -> None:
        """Stops it and frees its memory (memory a client maps stays until that client frees it)."""
        self._native.stop()

    def __enter__(self) -> "Keeper":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Keeper(socket={self.socket!r}, running={self.running})"


def _files(paths: Iterable[PathLike]) -> list[str]:
    out: list[str] = []
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            found = sorted(
                os.path.join(p, f) for f in os.listdir(p) if f.endswith((".safetensors", ".gguf", ".wlpack"))
            )
            if not found:
                from ._errors import InvalidArgumentError

                raise InvalidArgumentError(f"{p}: no .safetensors, .gguf or .wlpack file in this folder")
            out.extend(found)
        else:
            out.append(p)
    return out


def keep(
    paths: Iterable[PathLike] = (),
    *,
    device: str = "cuda:0",
    budget: "int | str | None" = None,
    socket: "PathLike | None" = None,
    wait: bool = True,
) -> Keeper:
    """Starts a keeper on ``device`` (``cuda:N``, or ``cpu``) in this process and keeps ``paths`` (files, folders
    of ``.safetensors``/``.gguf`` files, or objects' URLs, kept at the ETag they have now) on it; later loads by other processes of files they ask for are
    kept too. ``budget`` (bytes, or text such as ``"40GiB"``) bounds its memory, least recently used files going
    first (default: 80 % of the device's free memory; ``cpu``: half of the available memory). ``socket``: where it
    listens (default: the device's, which loads with ``keeper="auto"`` look at). ``wait=True`` returns once
    ``paths`` are kept."""
    native = _native.NativeKeeper(
        str(device), None if socket is None else os.fspath(socket), None if budget is None else str(budget)
    )
    k = Keeper(native)
    files = _files(paths)
    if files:
        k.keep(files, wait=wait)
    return k


def keeper_status(socket: "PathLike | None" = None, device: str = "cuda:0") -> dict[str, Any]:
    """What the keeper at ``socket`` (default: ``device``'s default socket) holds."""
    path = os.fspath(socket) if socket is not None else os.fspath(_native.keeper_socket(str(device)))
    return _native.keeper_status(path)


__all__ = ["Keeper", "keep", "keeper_status"]
