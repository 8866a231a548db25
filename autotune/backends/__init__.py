"""Backends: one module per framework. ``get_backend(name)`` imports lazily."""

from __future__ import annotations

from importlib import import_module

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
    "get_backend",
]

# name -> "module:Class"; modules import their framework lazily, so listing them here is cheap.
BACKENDS: dict[str, str] = {
    "trl": "autotune.backends.trl:TrlBackend",
    "swift": "autotune.backends.swift:SwiftBackend",
    "command": "autotune.backends.command:CommandBackend",
}


def get_backend(name: str, **options: object) -> Backend:
    """Build the backend called ``name``; unknown names raise a one-line :class:`UsageError`."""
    target = BACKENDS.get(name)
    if target is None:
        raise UsageError(
            f"unknown backend {name!r}",
            hint=f"Use --backend with one of: {', '.join(sorted(BACKENDS))}",
        )
    module_name, cls_name = target.split(":")
    cls = getattr(import_module(module_name), cls_name)
    return cls(**options)
