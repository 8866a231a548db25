"""Arithmetic that reads the same on one configuration (Python numbers) and on many (numpy columns).

The memory and step-time formulas are written once with these helpers: ``estimate_memory`` passes a
:class:`~autotune.estimate.shape.JobShape` (Python ints, floats and bools, so one trial's numbers are
exact Python arithmetic as before), ``plan`` passes :class:`~autotune.estimate.columns.ShapeColumns`
(one numpy array per field, every candidate of a space at once). Each helper does on an array what the
Python builtin named after it does on a number.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["ceil", "either", "is_array", "lmax", "lmin", "neg", "num", "to_int", "where"]


_ARRAY = np.ndarray


def is_array(*values: object) -> bool:
    for x in values:
        if isinstance(x, _ARRAY):
            return True
    return False


def where(cond: Any, a: Any, b: Any) -> Any:
    """``a if cond else b``; elementwise on arrays (both sides are evaluated: keep them total)."""
    if isinstance(cond, _ARRAY) or isinstance(a, _ARRAY) or isinstance(b, _ARRAY):
        return np.where(cond, a, b)
    return a if cond else b


def either(a: Any, b: Any) -> Any:
    """``a or b`` for booleans."""
    if isinstance(a, _ARRAY) or isinstance(b, _ARRAY):
        return np.logical_or(a, b)
    return bool(a or b)


def lmax(*values: Any) -> Any:
    """``max(...)``: the first of the largest on numbers, elementwise on arrays."""
    if not is_array(*values):
        return max(values)
    out = values[0]
    for x in values[1:]:
        out = np.maximum(out, x)
    return out


def lmin(*values: Any) -> Any:
    """``min(...)``, elementwise on arrays."""
    if not is_array(*values):
        return min(values)
    out = values[0]
    for x in values[1:]:
        out = np.minimum(out, x)
    return out


def ceil(x: Any) -> Any:
    """``math.ceil`` (an int), elementwise on arrays."""
    return np.ceil(x).astype(np.int64) if isinstance(x, _ARRAY) else math.ceil(x)


def to_int(x: Any) -> Any:
    """``int(x)``: truncation toward zero, elementwise on arrays."""
    return x.astype(np.int64) if isinstance(x, _ARRAY) else int(x)


def neg(x: object) -> Any:
    """``not x``, elementwise on arrays."""
    return np.logical_not(x) if isinstance(x, _ARRAY) else not x


def num(x: object) -> Any:
    """``x or 0``: an optional count (None on one configuration, 0 in a column) as a number."""
    return x if isinstance(x, _ARRAY) else (x or 0)


def per_value(f: Callable[[int], Any], x: Any) -> Any:
    """``f(x)``; on a column, ``f`` of each distinct value put back in every row that holds it (so each
    row gets exactly the Python number ``f`` gives, and ``f`` runs once per distinct value)."""
    if not isinstance(x, _ARRAY):
        return f(x)
    distinct, inverse = np.unique(x, return_inverse=True)
    return np.array([f(int(d)) for d in distinct])[inverse]
