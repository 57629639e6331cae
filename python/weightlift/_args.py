"""The one place the Python fronts check the numbers they are given (element counts, sizes, offsets, LBAs) before
any of them reaches the native module or moves a byte.

A value of the right kind but out of range (negative, 2^64 or more, a fraction) raises an error naming the
argument, by default :class:`InvalidArgumentError` (a :class:`WeightliftError` and a ``ValueError``); a front
whose original raises another class passes its own. A value of the wrong type (a string, None) raises
``TypeError``, Python's convention."""

from __future__ import annotations

import numbers
import operator
from typing import Any, Callable

from ._errors import InvalidArgumentError

_U64 = 1 << 64

Error = Callable[[str], Exception]


def integer(name: str, value: Any, error: Error = InvalidArgumentError) -> int:
    """``value`` as an int: ints and integer-like objects (numpy integers, ``__index__``) pass; a fraction or a
    complex number raises ``error``; anything else (bools included) ``TypeError``."""
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected an integer, not a bool")
    if isinstance(value, numbers.Number) and not isinstance(value, numbers.Integral):
        raise error(f"{name} {value!r}: expected a whole number")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, not {type(value).__name__}") from None


def unsigned(name: str, value: Any, error: Error = InvalidArgumentError) -> int:
    """``value`` as an int from 0 to 2^64 - 1 (a count, size, offset or LBA)."""
    v = integer(name, value, error)
    if v < 0:
        raise error(f"{name} {v} is negative")
    if v >= _U64:
        raise error(f"{name} {v} is too large (at most 2^64 - 1)")
    return v


def span(name: str, offset: int, size: int, extent: int, error: Error = InvalidArgumentError) -> None:
    """Raises ``error`` unless ``size`` bytes from ``offset`` fit in a buffer of ``extent`` bytes."""
    if offset + size > extent:
        raise error(f"{name}: {size} bytes at offset {offset} run past the end of the {extent}-byte buffer")
