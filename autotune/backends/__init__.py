"""Backends: one home per framework (ms-swift, TRL, verl, any command) for everything autotune knows
about it: knob names and defaults, start-up rules, what a knob means (:meth:`Backend.describe`), its log
and failure text, and how to write its configuration files (its export format).

``get_backend(name)`` and ``exporter(fmt)`` import lazily, so naming the frameworks here costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any

from autotune.backends._base import (
    Backend,
    BackendInfo,
    FailurePattern,
    ModelRef,
    RuleViolation,
    StepParser,
    TrialContext,
)
from autotune.errors import UsageError

__all__ = [
    "BACKENDS",
    "Backend",
    "BackendInfo",
    "FailurePattern",
    "ModelRef",
    "RuleViolation",
    "StepParser",
    "TrialContext",
    "EXPORTERS",
    "backend_class",
    "exporter",
    "get_backend",
]

# name -> "module:Class"; modules import their framework lazily, so listing them here is cheap.
BACKENDS: dict[str, str] = {
    "trl": "autotune.backends.trl.backend:TrlBackend",
    "swift": "autotune.backends.swift.backend:SwiftBackend",
    "command": "autotune.backends.command:CommandBackend",
}


#: export format -> "module:function" writing a winner in that framework's own files; each framework's
#: format is its backend's (autotune.export adds the framework-neutral ones).
EXPORTERS: dict[str, str] = {
    "swift": "autotune.backends.swift.export:export_swift",
    "trl": "autotune.backends.trl.export:export_trl",
    "verl": "autotune.backends.verl.export:export_verl",
}


def _load(target: str) -> Any:
    module_name, attr = target.split(":")
    return getattr(import_module(module_name), attr)


def backend_class(name: str) -> type[Backend]:
    """The class of the backend called ``name`` (its facts, without building it).

    Raises:
        UsageError: an unknown name, as one line listing the known ones.
    """
    target = BACKENDS.get(name)
    if target is None:
        raise UsageError(
            f"unknown backend {name!r}",
            hint=f"Use --backend with one of: {', '.join(sorted(BACKENDS))}",
        )
    cls: type[Backend] = _load(target)
    return cls


def get_backend(name: str, **options: object) -> Backend:
    """Build the backend called ``name``; unknown names raise a one-line :class:`UsageError`."""
    return backend_class(name)(**options)


def exporter(fmt: str) -> Callable[..., Any] | None:
    """The function writing the winner in framework format ``fmt``, or None when no backend has it."""
    target = EXPORTERS.get(fmt)
    return None if target is None else _load(target)
