"""Numbers as people read them in a report. Missing values render as an em dash, never as an error."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

__all__ = [
    "DASH",
    "gib",
    "gb",
    "pct",
    "share",
    "seconds",
    "rate",
    "bytes_s",
    "knob_value",
    "knobs_text",
    "is_num",
]

DASH = "—"
GIB = 2**30


def is_num(value: object) -> bool:
    """True for a finite int or float (bools excluded)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def gib(value_bytes: Any, digits: int = 1) -> str:
    """Bytes as GiB (``15.1 GiB``)."""
    return f"{value_bytes / GIB:.{digits}f} GiB" if is_num(value_bytes) else DASH


def gb(value_bytes: Any, digits: int = 1) -> str:
    """Bytes as GB, for PCIe volumes (``9.3 GB``)."""
    return f"{value_bytes / 1e9:.{digits}f} GB" if is_num(value_bytes) else DASH


def pct(value_pct: object, digits: int = 0) -> str:
    """A value already in percent (``71 %``)."""
    return f"{value_pct:.{digits}f} %" if is_num(value_pct) else DASH


def share(value_frac: Any, digits: int = 0) -> str:
    """A fraction 0..1 as percent."""
    return f"{100 * value_frac:.{digits}f} %" if is_num(value_frac) else DASH


def seconds(value_s: Any) -> str:
    """A duration: ``41 s``, ``12.5 min``, ``3.2 h``."""
    if not is_num(value_s):
        return DASH
    if value_s < 10:
        return f"{value_s:.1f} s"
    if value_s < 120:
        return f"{value_s:.0f} s"
    if value_s < 7200:
        return f"{value_s / 60:.1f} min"
    return f"{value_s / 3600:.1f} h"


def rate(value: Any, unit: str = "/s") -> str:
    """A throughput with three significant digits (whole numbers from 1000 up)."""
    if not is_num(value):
        return DASH
    return f"{value:,.0f}{unit}" if abs(value) >= 1000 else f"{value:.3g}{unit}"


def bytes_s(value: Any) -> str:
    """A transfer rate in GB/s."""
    return f"{value / 1e9:.1f} GB/s" if is_num(value) else DASH


def knob_value(value: object) -> str:
    """A knob value as the framework spells it on a command line."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def knobs_text(params: dict[str, Any], keys: Iterable[str] | None = None) -> str:
    """``name=value`` pairs, in the given key order (or the dict's)."""
    keys = list(keys) if keys is not None else list(params)
    return ", ".join(f"{k}={knob_value(params[k])}" for k in keys if k in params)
