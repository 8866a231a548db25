"""Parsing human durations such as ``90s``, ``30m``, ``1h30m`` or ``2.5h``.

Kept rather than a library (pytimeparse, humanfriendly): twenty lines against a new dependency, and the
refusal must be autotune's one-line UsageError naming the flag.
"""

from __future__ import annotations

import re

from autotune.errors import UsageError

__all__ = ["parse_duration_s", "format_duration"]

_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|h|m|s)?", re.IGNORECASE)
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, None: 1.0}


def parse_duration_s(text: str, *, flag: str = "--time-budget") -> float:
    """Seconds in ``text``; a bare number is seconds. Raises a one-line :class:`UsageError`."""
    s = text.strip().lower().replace(" ", "")
    pos, total, parts = 0, 0.0, 0
    while pos < len(s):
        m = _PART.match(s, pos)
        if not m or m.end() == pos:
            break
        unit = m.group(2)
        if unit is None and m.end() != len(s):
            break
        total += float(m.group(1)) * _UNIT_S[unit]
        pos, parts = m.end(), parts + 1
    if parts == 0 or pos != len(s) or total <= 0:
        raise UsageError(
            f"{flag} {text!r} is not a duration",
            hint=f"Write it like 90s, 30m, 1h30m or 2h (e.g. {flag} 30m)",
        )
    return total


def format_duration(seconds: float) -> str:
    """``3725`` → ``1h 2m 5s``; short and readable."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h {m}m {s}s" if h else f"{m}m {s}s"
