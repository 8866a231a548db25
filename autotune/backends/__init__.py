"""Backends: one home per framework (ms-swift, TRL, verl, any command) for everything autotune knows
about it: knob names and defaults, start-up rules, what a knob means (:meth:`Backend.describe`), its log
and failure text, and how to write its configuration files (its export format).

``get_backend(name)`` and ``exporter(fmt)`` import lazily, so naming the frameworks here costs nothing.
"""

from __future__ import annotations

from autotune.backends._base import (
    Backend,
    BackendInfo,
    FailurePattern,
    ModelRef,
    OpenPhase,
    PhaseFrame,
    PhaseMark,
    RuleViolation,
    StepParser,
    TrialContext,
)
from autotune.backends._registry import (
    BACKENDS,
    EXPORTERS,
    backend_class,
    exporter,
    get_backend,
    job_shape,
    planned_backends,
)
from autotune.backends.vllm_cpu_sync import RUN_SEGMENT as VLLM_CPU_SEGMENT

__all__ = [
    "BACKENDS",
    "Backend",
    "BackendInfo",
    "FailurePattern",
    "PhaseFrame",
    "ModelRef",
    "OpenPhase",
    "PhaseMark",
    "RuleViolation",
    "StepParser",
    "TrialContext",
    "VLLM_CPU_SEGMENT",
    "EXPORTERS",
    "backend_class",
    "exporter",
    "get_backend",
    "job_shape",
    "planned_backends",
]
