"""Reading knob and argument values the way the frameworks' own parsers read them.

A value may arrive typed (from a space file, a trial's params) or as text (from ``--`` flags or a
fixed-arguments file): ``"true"``, ``"8"``, ``"none"``. Every backend's decoder reads them here, and so do
the exports (a floor below the backends, so the rule lives in the core).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, SupportsFloat, SupportsIndex

from autotune.errors import UsageError

__all__ = [
    "as_bool",
    "as_float",
    "as_int",
    "as_number",
    "none_like",
    "pick",
    "typed",
    "whole_number",
]


def none_like(value: object) -> bool:
    """None, empty text, ``"none"`` or ``"null"``: a setting left unset."""
    return value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null"))


def pick(params: Mapping[str, object], *names: str, default: object = None) -> Any:
    """The value of the first of ``names`` that is set in ``params`` (not None), else ``default``."""
    for name in names:
        if params.get(name) is not None:
            return params[name]
    return default


def as_bool(value: object, default: bool = False) -> bool:
    """``True``/``"true"``/``"1"``/``"yes"``/``"on"`` → True; None → ``default``; other text → False."""
    if value is None:
        return default
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes", "on")
    return bool(value)


def as_int(value: object) -> int | None:
    """An int from an int or its text; None for unset values, booleans and anything else."""
    if none_like(value) or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def whole_number(value: object, name: str) -> int:
    """``value`` as an int, for a setting that must be one.

    Raises:
        UsageError: text or a number that is not a whole number, naming the setting.
    """
    out = as_int(value)
    if out is None:
        raise UsageError(f"{name} is {value!r}, not a whole number", hint=f"Give {name} as an integer")
    return out


def as_float(value: object) -> float | None:
    """A float from a number or its text; None for unset values, booleans and anything else."""
    if none_like(value) or isinstance(value, bool):
        return None
    if not isinstance(value, str | bytes | SupportsFloat | SupportsIndex):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def as_number(value: object) -> float | None:
    """A log value as a float: numbers and numeric text ('6e-08'); None for booleans and anything else."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def typed(value: object) -> object:
    """A value as the frameworks' parsers read text: ``"1e-5"`` → 1e-05, ``"32"`` → 32, ``"true"`` → True.

    Lists are typed item by item; other text stays text.
    """
    if isinstance(value, list | tuple):
        return [typed(v) for v in value]
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            continue
    return value


def required_int(params: Mapping[str, object], name: str, default: int) -> int:
    """``params[name]`` as an int (``default`` when unset); a value that is no int raises UsageError."""
    value = params.get(name)
    if none_like(value):
        return default
    out = as_int(value)
    if out is None:
        raise UsageError(f"{name}={value!r} is not a whole number", hint=f"Give {name} as an integer")
    return out


def required_float(params: Mapping[str, object], name: str, default: float) -> float:
    """``params[name]`` as a float (``default`` when unset); a value that is no number raises UsageError."""
    value = params.get(name)
    if none_like(value):
        return default
    out = as_float(value)
    if out is None:
        raise UsageError(f"{name}={value!r} is not a number", hint=f"Give {name} as a number")
    return out
