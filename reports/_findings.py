"""What every diagnosis rule shares: the thresholds (module constants, so a test and a reader see
exactly when a rule fires), the :class:`Finding` a rule returns, the :class:`Context` it reads and the
small helpers the rules use. The rules and :func:`~autotune.reports.diagnosis.diagnose` are in
:mod:`autotune.reports.diagnosis` (trial rules) and :mod:`autotune.reports._study_rules` (study rules)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from autotune.reports._load import StudyData, TrialData
from autotune.reports._signals import TrialSignals

from autotune.backends import Backend, backend_class
from autotune.errors import AutotuneError, UsageError
from autotune.jobconfig import OFFLOAD_FIELDS, JobConfig
from autotune.records import TrialStatus

GIB = 2**30

# rollout_idle: GPUs idle a meaningful share of the steady time, mostly during rollout, with memory free.
ROLLOUT_MIN_IDLE_SHARE = 0.15
ROLLOUT_MIN_IDLE_FRACTION = 0.5  # rollout's part of all idle GPU time
ROLLOUT_MIN_HEADROOM_FRAC = 0.15
UTIL_SAFETY_FRAC = 0.05  # memory left free when suggesting a higher vLLM utilization
# offload_bottleneck: host<->GPU traffic during training while the GPUs wait.
OFFLOAD_MIN_PCIE_BYTES_S = 2e9
OFFLOAD_MIN_TRAIN_IDLE_SHARE = 0.25
# host_cpu_stall: GPU-idle time spent with the host CPU saturated.
HOST_MIN_IDLE_SHARE = 0.15
HOST_MIN_BUSY_SHARE = 0.5
HOST_MIN_IDLE_S = 5.0
# micro_batch_headroom
BATCH_MIN_HEADROOM_FRAC = 0.25
BATCH_MIN_HEADROOM_BYTES = 4 * GIB
# zero3_gather_peak
GATHER_MIN_EXCESS_BYTES = 1 * GIB
GATHER_TIGHT_FRAC = 0.10
# hang_pattern
HANG_BUSY_UTIL_PCT = 80.0
HANG_LOW_POWER_FRAC = 0.6

MEMORY_FAILURES = frozenset({TrialStatus.OOM, TrialStatus.VLLM_INIT})
FITTED = frozenset(
    {TrialStatus.COMPLETE, TrialStatus.UNHEALTHY, TrialStatus.TIMEOUT, TrialStatus.HANG, TrialStatus.PRUNED}
)


class Severity(str, Enum):
    """How much a finding matters to the user's next action."""

    CRITICAL = "critical"  # a configuration that must not be used, or a result that cannot be trusted
    WARNING = "warning"  # time or memory being wasted, with a change to try
    INFO = "info"  # what the search learned


SEVERITY_ORDER = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}


@dataclass(frozen=True)
class Finding:
    """One piece of advice.

    Attributes:
        rule: the rule's name (stable; tests and the report key on it).
        severity: see :class:`Severity`.
        title: a few words.
        text: the advice with the numbers that justify it (plain text; the report escapes it).
        evidence: those numbers, machine-readable.
        trial: the trial it is about, or None for a finding about the whole study.
    """

    rule: str
    severity: Severity
    title: str
    text: str
    evidence: dict[str, Any] = field(default_factory=dict)
    trial: int | None = None


@dataclass(frozen=True)
class OffloadFit:
    """What the memory estimate says about a trial's knobs with offload turned off."""

    fits: bool
    peak_bytes: int
    capacity_bytes: int


OffloadEstimator = Callable[[StudyData, TrialData, dict[str, Any]], "OffloadFit | str"]


@dataclass
class Context:
    """What the rules share: the study, every trial's signals, the winner, and optional collaborators.

    Attributes:
        estimator: predicts memory for changed knobs; returns an :class:`OffloadFit` or a sentence
            saying why no estimate can be given.
    """

    data: StudyData
    signals: dict[int, TrialSignals]
    winner: int | None = None
    estimator: OffloadEstimator | None = None
    clean: Callable[[str], str] = str

    def fixed(self) -> dict[str, Any]:
        return dict(self.data.settings.fixed)

    def backend(self) -> type[Backend] | None:
        """The class of the study's backend (None for a profiled run or a backend unknown here)."""
        name = self.data.settings.backend
        if name is None:
            return None
        try:
            return backend_class(name)
        except UsageError:
            return None

    def knob_name(self, role: str) -> str | None:
        """The study's backend's knob for ``role`` (a JobConfig field), or None."""
        backend = self.backend()
        return backend.knob_roles().get(role) if backend is not None else None

    def knob(self, trial: TrialData, role: str) -> tuple[str, Any] | None:
        """The knob (or fixed argument) that plays ``role`` for this trial — a JobConfig field, named by
        the study's backend — with its value, when the trial or the fixed arguments set it."""
        name = self.knob_name(role)
        if name is None:
            return None
        fixed = self.fixed()
        if name in trial.params:
            return name, trial.params[name]
        if name in fixed:
            return name, fixed[name]
        return None

    def config(self, params: Mapping[str, object]) -> JobConfig | None:
        """What ``params`` (over the study's fixed arguments) mean to the study's backend, if it can say."""
        backend = self.backend()
        if backend is None:
            return None
        job = {**self.data.settings.job_sizes, **self.fixed()}
        n_gpus = len(self.data.hardware.gpus) if self.data.hardware is not None else 0
        try:
            return backend.describe(params, {}, job, n_gpus)
        except (AutotuneError, TypeError, ValueError):
            return None

    def offload_knobs(self, params: Mapping[str, object]) -> dict[str, Any]:
        """The knobs (or fixed arguments) that keep model or optimizer state in host memory."""
        config = self.config(params)
        if config is None:
            return {}
        out: dict[str, Any] = {}
        for role in OFFLOAD_FIELDS:
            if getattr(config, role) and role in config.origin:
                name, value = config.origin[role]
                out[name] = value
        return out

    def without_offload(self, params: Mapping[str, object]) -> dict[str, Any]:
        """``params`` with every offload knob turned off, in the backend's own words."""
        backend = self.backend()
        return backend.without_offload(params) if backend is not None else dict(params)

    def memory_knobs(self) -> set[str] | None:
        """Knobs the search space marks as affecting memory (None when the space does not say)."""
        if not isinstance(self.data.settings.space, list):
            return None
        names = {k["name"] for k in self.data.settings.knobs if k.get("memory") and "name" in k}
        return names or None

    def space_values(self, name: str) -> list[Any] | None:
        if not isinstance(self.data.settings.space, list):
            return None
        for k in self.data.settings.knobs:
            if k.get("name") == name and isinstance(k.get("values"), list):
                return k["values"]
        return None


# ----------------------------------------------------------------------------------------- helpers


def num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def uses_vllm(ctx: Context, trial: TrialData) -> bool:
    hit = ctx.knob(trial, "use_vllm")
    if hit is not None:
        return bool(hit[1])
    return ctx.knob(trial, "vllm_util") is not None


def is_zero3(ctx: Context, trial: TrialData) -> bool:
    config = ctx.config(trial.params)
    return config is not None and config.deepspeed and config.zero_stage == 3


def same_memory_knobs(
    ctx: Context, a: Mapping[str, object], b: Mapping[str, object], ignore: Iterable[str] = ()
) -> bool:
    relevant = ctx.memory_knobs()
    names = (set(a) | set(b)) - set(ignore)
    if relevant is not None:
        names &= relevant
    return all(a.get(n) == b.get(n) for n in names)


def performance_trial(ctx: Context, trial: TrialData) -> bool:
    """Rules about speed read trials that ran at steady state (or the single profiled run)."""
    if ctx.data.kind == "profile":
        return len(trial.steps) >= 2
    return trial.status is TrialStatus.COMPLETE


def trials_text(numbers: Iterable[int]) -> str:
    nums = sorted(set(numbers))
    if not nums:
        return "no trial"
    return ("trial " if len(nums) == 1 else "trials ") + ", ".join(str(n) for n in nums)


def round_down(value: float, step: float) -> float:
    return math.floor(value / step + 1e-9) * step


def gpu_at(ctx: Context, position: int) -> str:
    return ctx.data.gpu_label(position)
