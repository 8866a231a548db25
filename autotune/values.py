"""Reading knob and argument values the way the frameworks' own parsers read them.

A value may arrive typed (from a space file, a trial's params) or as text (from ``--`` flags or a
fixed-arguments file): ``"true"``, ``"8"``, ``"none"``. Every backend's decoder reads them here, and so do
the exports (a floor below the backends, so the rule lives in the core).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.errors import UsageError

__all__ = [
    "as_bool",
    "as_float",
    "as_int",
    "as_number",
    "batch_shape",
    "none_like",
    "pick",
    "typed",
    "whole_number",
]


def none_like(value: Any) -> bool:
    """None, empty text, ``"none"`` or ``"null"``: a setting left unset."""
    return value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null"))


def pick(params: Mapping[str, Any], *names: str, default: Any = None) -> Any:
    """The value of the first of ``names`` that is set in ``params`` (not None), else ``default``."""
    for name in names:
        if params.get(name) is not None:
            return params[name]
    return default


def as_bool(value: Any, default: bool = False) -> bool:
    """``True``/``"true"``/``"1"``/``"yes"``/``"on"`` → True; None → ``default``; other text → False."""
    if value is None:
        return default
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes", "on")
    return bool(value)


def as_int(value: Any) -> int | None:
    """An int from an int or its text; None for unset values, booleans and anything else."""
    if none_like(value) or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def whole_number(value: Any, name: str) -> int:
    """``value`` as an int, for a setting that must be one.

    Raises:
        UsageError: text or a number that is not a whole number, naming the setting.
    """
    out = as_int(value)
    if out is None:
        raise UsageError(f"{name} is {value!r}, not a whole number", hint=f"Give {name} as an integer")
    return out


def as_float(value: Any) -> float | None:
    """A float from a number or its text; None for unset values, booleans and anything else."""
    if none_like(value) or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def as_number(value: Any) -> float | None:
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


def typed(value: Any) -> Any:
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


def required_int(params: Mapping[str, Any], name: str, default: int) -> int:
    """``params[name]`` as an int (``default`` when unset); a value that is no int raises UsageError."""
    value = params.get(name)
    if none_like(value):
        return default
    out = as_int(value)
    if out is None:
        raise UsageError(f"{name}={value!r} is not a whole number", hint=f"Give {name} as an integer")
    return out


def required_float(params: Mapping[str, Any], name: str, default: float) -> float:
    """``params[name]`` as a float (``default`` when unset); a value that is no number raises UsageError."""
    value = params.get(name)
    if none_like(value):
        return default
    out = as_float(value)
    if out is None:
        raise UsageError(f"{name}={value!r} is not a number", hint=f"Give {name} as a number")
    return out


def batch_shape(
    params: Mapping[str, Any], derived: Mapping[str, Any], n_gpus: int, default_pdbs: int
) -> dict[str, int]:
    """The batch facts every GRPO framework shares: world size, global batch, micro-batch, accumulation.

    Args:
        params: the trial's knobs over the study's fixed arguments (``global_batch``,
            ``num_generations``, ``max_prompt_length``, ``max_completion_length`` among them).
        derived: ``world_size`` and ``gradient_accumulation_steps`` when the backend derived them.
        n_gpus: GPUs of the trial; 0 on a CPU-only study (then ``num_processes`` is the world size).
        default_pdbs: the framework's default ``per_device_train_batch_size``.
    """
    if derived.get("world_size"):
        world = int(derived["world_size"])
    elif n_gpus > 0:
        world = n_gpus
    else:
        world = int(pick(params, "num_processes", "world_size", default=1))
    global_batch = int(pick(params, "global_batch", "generation_batch_size", default=64))
    pdbs = required_int(params, "per_device_train_batch_size", default_pdbs)
    ga = as_int(derived.get("gradient_accumulation_steps")) or as_int(
        params.get("gradient_accumulation_steps")
    )
    return {
        "world_size": world,
        "global_batch": global_batch,
        "num_generations": int(pick(params, "num_generations", default=8)),
        "per_device_batch": pdbs,
        "grad_accum": ga if ga and ga > 0 else max(1, global_batch // max(1, pdbs * world)),
        "max_prompt_length": int(pick(params, "max_prompt_length", default=512)),
        "max_completion_length": int(pick(params, "max_completion_length", default=1024)),
    }
