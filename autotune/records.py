"""Typed records that cross module boundaries and land on disk.

Only ``params``, ``derived``, ``fixed`` and ``values``/``metrics`` are plain dicts: they are the
framework's own vocabulary. Everything else is typed. Records are pydantic models so they serialize to
the JSON files of a study directory (``launch.json``, ``result.json``, ``study.json``) and back.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
)

from autotune.plaintext import comment_line, shell_name
from autotune.probes.summary import TimelineSummary
from autotune.secrets import SecretRule

__all__ = [
    "ModelRef",
    "TrialStatus",
    "StepMetrics",
    "GpuInfo",
    "HostInfo",
    "Hardware",
    "TrialSpec",
    "LaunchPlan",
    "SteadyEstimate",
    "TrialCeiling",
    "TrialResult",
    "SpeedupInterval",
    "ConfirmRun",
    "Confirmation",
    "Recommendation",
    "INFEASIBLE_STATUSES",
]


class TrialStatus(str, Enum):
    """How a trial ended. Decided from evidence by :mod:`autotune.trial.outcome`."""

    COMPLETE = "COMPLETE"
    UNHEALTHY = "UNHEALTHY"  # ran, but does not learn (health gate)
    OOM = "OOM"  # CUDA out of memory on any rank
    VLLM_INIT = "VLLM_INIT"  # vLLM refused to start (memory budget / KV cache)
    HOST_OOM = "HOST_OOM"  # killed by SIGKILL, not by us
    HANG = "HANG"  # watchdog: no step for too long
    TIMEOUT = "TIMEOUT"  # trial wall budget ran out while still making steps
    INVALID = "INVALID"  # the framework rejected the arguments at start-up
    CRASH = "CRASH"  # any other non-zero exit
    PRUNED = "PRUNED"  # never launched (pre-screen) or stopped early as clearly slower
    INTERRUPTED = "INTERRUPTED"  # the user stopped the study; says nothing about the configuration
    RUNNING = "RUNNING"

    @property
    def is_failure(self) -> bool:
        """A status that says the configuration itself does not work."""
        return self in INFEASIBLE_STATUSES


INFEASIBLE_STATUSES = frozenset(
    {
        TrialStatus.UNHEALTHY,
        TrialStatus.OOM,
        TrialStatus.VLLM_INIT,
        TrialStatus.HOST_OOM,
        TrialStatus.HANG,
        TrialStatus.TIMEOUT,
        TrialStatus.INVALID,
        TrialStatus.CRASH,
    }
)


@dataclass(frozen=True)
class ModelRef:
    """The model a study trains.

    Attributes:
        name: what the user typed (``tiny-qwen2``, ``Qwen2-7B``, a path).
        path_or_id: what the framework receives (a local directory or a hub id).
        local: True when ``path_or_id`` is a local directory autotune built or the user named.
        facts: architecture facts when known (layers, hidden size, heads, ...), else empty.
    """

    name: str
    path_or_id: str
    local: bool = False
    facts: dict[str, Any] = field(default_factory=dict)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class StepMetrics(_Frozen):
    """One optimizer step as the framework reported it.

    Attributes:
        step: global step number (1-based, as frameworks log it).
        t_mono_s: ``time.monotonic()`` when the step was recorded. CLOCK_MONOTONIC is system-wide on
            Linux, so it lines up with the probes' timeline even when written by another process.
        t_wall_s: ``time.time()`` at the same moment.
        duration_s: the framework's own step duration when it reports one, else None.
        samples: completions processed in this step (the global batch), when known.
        tokens: completion tokens processed in this step, when known.
        values: every numeric metric of the record (loss, grad_norm, kl, reward_std, ...).
    """

    step: int
    t_mono_s: float
    t_wall_s: float
    duration_s: float | None = None
    samples: int | None = None
    tokens: float | None = None
    values: dict[str, float] = Field(default_factory=dict)


class GpuInfo(_Frozen):
    """One GPU, detected through NVML or declared by the user."""

    index: int
    name: str
    memory_total_bytes: int
    uuid: str | None = None
    compute_capability: str | None = None
    declared: bool = False  # True when the user declared it (--gpu-type/--gpu-memory-gib)


class HostInfo(_Frozen):
    """The host the trials run on."""

    hostname: str
    cpu_cores_logical: int
    cpu_cores_physical: int | None
    ram_total_bytes: int
    platform: str


class Hardware(_Frozen):
    """What a study runs on: selected GPUs (empty on a CPU-only run) and the host."""

    gpus: tuple[GpuInfo, ...] = ()
    host: HostInfo
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    nvml_note: str | None = None  # why NVML is unavailable, when it is

    @property
    def cpu_only(self) -> bool:
        return not self.gpus

    @property
    def visible(self) -> bool:
        """True when the GPUs can be sampled here (not merely declared)."""
        return bool(self.gpus) and not any(g.declared for g in self.gpus)


class TrialSpec(_Frozen):
    """One assignment of knobs, before it is rendered for a framework.

    Attributes:
        number: the Optuna trial number.
        params: active knobs only (knobs whose condition does not hold are absent).
        derived: values autotune computes to keep training semantics fixed
            (``world_size``, ``gradient_accumulation_steps``).
        is_baseline: trial 0, the framework defaults (or the user's own flags).
    """

    number: int
    params: dict[str, Any]
    derived: dict[str, Any] = Field(default_factory=dict)
    is_baseline: bool = False


class LaunchPlan(_Frozen):
    """What the runner starts: an argv (never a shell string), extra environment and a directory.

    Attributes:
        argv: the command; argv[0] is an executable path or name on PATH.
        env: only the variables autotune sets on top of the inherited environment.
        cwd: working directory of the trial.
        metrics_paths: files the backend's parser tails for step records.
        world_size: processes the trial starts (for attribution and reporting).
        unset_env: variables removed from the inherited environment.
    """

    argv: tuple[str, ...]
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str
    metrics_paths: tuple[str, ...] = ()
    world_size: int = 1
    unset_env: tuple[str, ...] = ()

    def redacted(self, secrets: SecretRule | None = None) -> LaunchPlan:
        """The plan as written to ``launch.json``: secrets in argv and env masked (:mod:`autotune.secrets`)."""
        rule = secrets or SecretRule()
        return self.model_copy(update={"argv": rule.redact_argv(self.argv), "env": rule.redact_env(self.env)})

    def to_shell(self, secrets: SecretRule | None = None) -> str:
        """A ``command.sh`` body that re-runs the trial by hand (quoted, never executed by us).

        Secrets are never written: a secret argument is read from an environment variable
        (``--hf_token "${HF_TOKEN}"``), a secret variable is left for the user to export, and a comment
        names what to export (:mod:`autotune.secrets`).
        """
        rule = secrets or SecretRule()
        words, needed = rule.script_words(self.argv)
        lines = [
            "#!/usr/bin/env bash",
            "# Re-runs this trial by hand. Written by autotune.",
        ]
        exports = []
        for key, value in sorted(self.env.items()):
            shell_name(key)
            if rule.is_secret_name(key) or rule.looks_secret(value):
                needed.append(key)
            else:
                exports.append(f"export {key}={shlex.quote(value)}")
        if needed:
            lines.append(
                f"# Secrets are not written here: export {' '.join(map(comment_line, needed))} before running "
                "(autotune never stores them)."
            )
        lines.append("set -euo pipefail")
        lines.append(f"cd {shlex.quote(self.cwd)}")
        for key in self.unset_env:
            lines.append(f"unset {shell_name(key)}")
        lines += exports
        lines.append(" \\\n  ".join(words))
        return "\n".join(lines) + "\n"


class SteadyEstimate(_Frozen):
    """Step time at steady state and the throughput it implies.

    Attributes:
        step_time_s: mean duration of the steady steps.
        rel_ci95: half-width of the 95 % interval of the mean, relative to the mean.
        steady_steps: number of steps used for the estimate.
        warmup_steps: steps dropped as warm-up.
        throughput: completions per second (global batch / step time).
        tokens_per_s: completion tokens per second, when tokens are known.
    """

    step_time_s: float
    rel_ci95: float
    steady_steps: int
    warmup_steps: int
    throughput: float
    tokens_per_s: float | None = None


class TrialCeiling(_Frozen):
    """How far a trial's step was from its physical ceiling (:mod:`autotune.estimate.ceiling`).

    Attributes:
        basis: the peak rates used, in words (catalog or measured, which device).
        basis_source: ``catalog`` or ``measured``.
        work: the tokens the ceiling counted, in words.
        phase_ceiling_s: the ceiling's seconds of each of its phases (``rollout_prefill``,
            ``rollout_decode``, ``rollout``, ``reference``, ``train``, ``weight_sync``, ``offload``).
        step_ceiling_s: the least seconds the step could take.
        step_measured_s: the measured steady step time, when there is one.
        step_fraction: ceiling ÷ measured step time (1: at the physical limit).
        phase_measured_s: measured seconds per step of the timeline phases the ceiling bounds
            (``rollout``, ``train``, ``weight_sync``), where the framework or markers split the step.
        phase_fraction: ceiling ÷ measured, per timeline phase (where both are positive).
    """

    basis: str
    basis_source: str
    work: str
    phase_ceiling_s: dict[str, float]
    step_ceiling_s: float
    step_measured_s: float | None = None
    step_fraction: float | None = None
    phase_measured_s: dict[str, float] = Field(default_factory=dict)
    phase_fraction: dict[str, float] = Field(default_factory=dict)

    @property
    def beats_ceiling(self) -> bool:
        """A measured time below its ceiling: a measurement or model error, never a real speed."""
        fractions = [self.step_fraction, *self.phase_fraction.values()]
        return any(f is not None and f > 1.0 for f in fractions)


def _timeline_summary(raw: object) -> TimelineSummary:
    return raw if isinstance(raw, TimelineSummary) else TimelineSummary.from_json(raw)


#: ``result.json``'s ``timeline_summary``: read and written by the record's one reader and writer
SummaryField = Annotated[
    TimelineSummary,
    PlainValidator(_timeline_summary),
    PlainSerializer(lambda s: s.to_json(), return_type=dict[str, object]),
]


class TrialResult(BaseModel):
    """Everything known about one finished (or never launched) trial. Written as ``result.json``."""

    model_config = ConfigDict(extra="allow")

    number: int
    params: dict[str, Any]
    derived: dict[str, Any] = Field(default_factory=dict)
    is_baseline: bool = False
    status: TrialStatus
    reason: str
    evidence: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    steps: int = 0
    steady: SteadyEstimate | None = None
    health: list[str] = Field(default_factory=list)
    peak_mem_bytes: list[int | None] = Field(default_factory=list)  # NVML, per selected GPU
    framework_peak_mem_bytes: int | None = None  # e.g. ms-swift memory(GiB): rank 0 torch reserve
    # rank 0's torch peak of memory held by tensors (max_memory_allocated); with the reserve above it
    # tells the caching allocator's free cache apart from memory the job needs (None: not reported)
    framework_alloc_peak_bytes: int | None = None
    host_peak_rss_bytes: int | None = None
    timeline_summary: SummaryField | None = None
    estimate: dict[str, Any] | None = None  # predicted memory breakdown (bytes per component)
    started_wall_s: float | None = None
    duration_s: float = 0.0
    startup_s: float | None = None  # launch to first step record
    gpu_seconds: float = 0.0  # duration × GPUs held (× 1 on CPU-only runs)
    # where a failure happened, from its evidence: "startup", "rollout", "train", "weight_sync"
    # (the timeline's phase names, plus start-up before the first step); None when unknown or no failure
    failed_phase: str | None = None
    # why the search chose this configuration (predicted throughput, risk, move from the incumbent)
    choice: dict[str, Any] | None = None
    # what the runner noticed besides the outcome: processes that escaped the trial's group and were
    # ended (or survived), a sampler that failed, a metrics-file clash
    notes: list[str] = Field(default_factory=list)
    # the step's physical ceiling and how near the measured step came to it (None: not computed)
    ceiling: TrialCeiling | None = None

    # -- The one way a result is made: every TrialResult of the package comes from one of these named
    # constructors, or is read back by from_json / from_dict (tests/test_architecture.py refuses a direct
    # ``TrialResult(...)`` or ``model_validate`` anywhere else). Each says which trials it is for and
    # keeps what must hold for them.

    @classmethod
    def running(
        cls,
        number: int,
        params: Mapping[str, object],
        *,
        derived: Mapping[str, Any] | None = None,
        is_baseline: bool = False,
        reason: str = "running",
    ) -> TrialResult:
        """The placeholder of a trial that runs now, written as its ``result.json`` until it ends."""
        return cls._unmeasured(number, params, TrialStatus.RUNNING, reason, derived, is_baseline)

    @classmethod
    def interrupted(
        cls,
        number: int,
        params: Mapping[str, object],
        *,
        reason: str,
        derived: Mapping[str, Any] | None = None,
        is_baseline: bool = False,
    ) -> TrialResult:
        """A trial stopped before it said anything about its configuration (it may run again)."""
        return cls._unmeasured(number, params, TrialStatus.INTERRUPTED, reason, derived, is_baseline)

    @classmethod
    def not_launched(
        cls,
        number: int,
        params: Mapping[str, object],
        *,
        status: TrialStatus,
        reason: str,
        derived: Mapping[str, Any] | None = None,
        is_baseline: bool = False,
        estimate: dict[str, Any] | None = None,
    ) -> TrialResult:
        """A trial the study refused to start (PRUNED: a rule, an inference, the memory gate, whose
        predicted ``estimate`` it keeps) or that cannot be started (INVALID).

        Raises:
            ValueError: any other status (a trial that never ran has no other end).
        """
        if status not in (TrialStatus.PRUNED, TrialStatus.INVALID):
            raise ValueError(f"a trial that was not launched is PRUNED or INVALID, not {status.value}")
        result = cls._unmeasured(number, params, status, reason, derived, is_baseline)
        return result if estimate is None else result.model_copy(update={"estimate": estimate})

    @classmethod
    def outline(
        cls, number: int, params: Mapping[str, object], *, status: TrialStatus, reason: str
    ) -> TrialResult:
        """A result known only by its status and reason: a run supposed to end so (a strategy's
        look-ahead), or one whose result file is lost (a profile directory without ``result.json``)."""
        return cls._unmeasured(number, params, status, reason, None, False)

    @classmethod
    def measured(
        cls,
        number: int,
        params: Mapping[str, object],
        *,
        status: TrialStatus,
        reason: str,
        derived: Mapping[str, Any] | None = None,
        is_baseline: bool = False,
        evidence: str | None = None,
        exit_code: int | None = None,
        signal: int | None = None,
        steps: int = 0,
        steady: SteadyEstimate | None = None,
        health: Sequence[str] = (),
        peak_mem_bytes: Sequence[int | None] = (),
        framework_peak_mem_bytes: int | None = None,
        framework_alloc_peak_bytes: int | None = None,
        host_peak_rss_bytes: int | None = None,
        timeline_summary: TimelineSummary | None = None,
        started_wall_s: float | None = None,
        duration_s: float = 0.0,
        startup_s: float | None = None,
        gpu_seconds: float = 0.0,
        failed_phase: str | None = None,
        notes: Sequence[str] = (),
    ) -> TrialResult:
        """A trial that ran: how it ended and what was measured (the trial pipeline's result,
        :mod:`autotune.trial.pipeline`).

        Raises:
            ValueError: a RUNNING status (a measured trial has ended), a negative count of steps or
                seconds, or a steady-state estimate without a step.
        """
        if status is TrialStatus.RUNNING:
            raise ValueError("a measured trial has ended: its status cannot be RUNNING")
        if steps < 0 or duration_s < 0 or gpu_seconds < 0:
            raise ValueError(f"negative steps or seconds: {steps} steps, {duration_s} s, {gpu_seconds} GPU·s")
        if steady is not None and steps == 0:
            raise ValueError("a steady-state estimate needs steps")
        return cls(
            number=number,
            params=dict(params),
            derived=dict(derived or {}),
            is_baseline=is_baseline,
            status=status,
            reason=reason,
            evidence=evidence,
            exit_code=exit_code,
            signal=signal,
            steps=steps,
            steady=steady,
            health=list(health),
            peak_mem_bytes=list(peak_mem_bytes),
            framework_peak_mem_bytes=framework_peak_mem_bytes,
            framework_alloc_peak_bytes=framework_alloc_peak_bytes,
            host_peak_rss_bytes=host_peak_rss_bytes,
            timeline_summary=timeline_summary,
            started_wall_s=started_wall_s,
            duration_s=duration_s,
            startup_s=startup_s,
            gpu_seconds=gpu_seconds,
            failed_phase=failed_phase,
            notes=list(notes),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> TrialResult:
        """A result as it was written, from its JSON text (a storage's attribute).

        Raises:
            pydantic.ValidationError: not a trial result (a ``ValueError``).
        """
        return cls.model_validate_json(text)

    @classmethod
    def from_dict(cls, data: object) -> TrialResult:
        """A result as it was written, from its parsed JSON (``result.json`` read by a guarded reader).

        Raises:
            pydantic.ValidationError: not a trial result (a ``ValueError``).
        """
        return cls.model_validate(data)

    @classmethod
    def _unmeasured(
        cls,
        number: int,
        params: Mapping[str, object],
        status: TrialStatus,
        reason: str,
        derived: Mapping[str, Any] | None,
        is_baseline: bool,
    ) -> TrialResult:
        """A result without a measurement: no exit code, no step, no time spent."""
        return cls(
            number=number,
            params=dict(params),
            derived=dict(derived or {}),
            is_baseline=is_baseline,
            status=status,
            reason=reason,
        )

    @property
    def throughput(self) -> float | None:
        return self.steady.throughput if self.steady else None


class SpeedupInterval(_Frozen):
    """How much faster one configuration is than another, with a 95 % interval.

    Attributes:
        estimate: the ratio of throughputs (numerator ÷ denominator), from the geometric means of
            the runs' steady step times.
        low: lower end of the 95 % interval.
        high: upper end of the 95 % interval.
        runs: runs of the numerator and of the denominator the interval was computed from.
        df: degrees of freedom of the Student t quantile used (runs − configurations re-measured).
    """

    estimate: float
    low: float
    high: float
    runs: tuple[int, int]
    df: float

    @property
    def includes_one(self) -> bool:
        """True when the interval cannot tell the two apart (no measurable difference)."""
        return self.low <= 1.0 <= self.high

    def text(self) -> str:
        """``1.08× [0.91, 1.27]``."""
        return f"{self.estimate:.2f}× [{self.low:.2f}, {self.high:.2f}]"


class ConfirmRun(_Frozen):
    """One re-measurement run of a configuration after the search (``trials/confirm-<trial>-<round>/``).

    Attributes:
        trial: the search trial whose configuration this run repeats.
        round: the round of the interleaved schedule (1-based).
        order: the run's position in the whole schedule (1-based).
        role: ``winner``, ``baseline`` or ``runner_up``.
        status: how the run ended.
        step_time_s: mean steady step time, when the run reached steady state.
        rel_ci95: the within-run relative 95 % half-width of that mean.
        steady_steps: steps the mean is taken over.
        throughput: completions per second at steady state.
        duration_s: wall time of the run.
        gpu_seconds: duration × GPUs held (× 1 on CPU-only runs).
        other_busy_cores: mean CPU cores busy outside the run (other processes) in its steady window.
        host_loaded: True when that load was high enough to distort the measurement.
    """

    trial: int
    round: int
    order: int
    role: str
    status: TrialStatus
    step_time_s: float | None = None
    rel_ci95: float | None = None
    steady_steps: int = 0
    throughput: float | None = None
    duration_s: float = 0.0
    gpu_seconds: float = 0.0
    other_busy_cores: float | None = None
    host_loaded: bool = False


class Confirmation(_Frozen):
    """The interleaved re-measurement of the winner, the baseline and close runners-up.

    Attributes:
        rounds: rounds asked for (each runs every compared configuration once).
        runs: every run, in the order they ran.
        speedup: the winner ÷ the baseline from these runs (None when too few runs completed).
        versus_winner: each other compared trial ÷ the winner, by trial number.
        duration_s: wall time of all the runs.
        gpu_seconds: GPU time of all the runs.
        method: how the interval was computed, in one sentence.
        note: why the re-measurement is incomplete, when it is.
    """

    rounds: int
    runs: list[ConfirmRun] = Field(default_factory=list)
    speedup: SpeedupInterval | None = None
    versus_winner: dict[int, SpeedupInterval] = Field(default_factory=dict)
    duration_s: float = 0.0
    gpu_seconds: float = 0.0
    method: str = ""
    note: str | None = None


class Recommendation(_Frozen):
    """The recommended trial and how it compares with the baseline. Decided once, when the study ends,
    and stored in ``study.json``; reports and exports read it from there.

    Attributes:
        trial: trial number of the winner.
        throughput: its completions per second at steady state.
        baseline_trial: the baseline's trial number, when there is one.
        baseline_throughput: the baseline's throughput, when it completed.
        speedup: winner ÷ baseline throughput, when both are known.
        headroom_bytes: memory left at the measured peak, per selected GPU (None where unmeasured).
        why: one sentence.
        skipped: trials faster than the winner that were passed over, with why.
        speedup_low: lower end of the speedup's 95 % interval, when the study re-measured it.
        speedup_high: upper end of that interval.
        measurable: True when the interval lies above 1, False when it includes 1 (or lies below),
            None when the speedup was not re-measured.
        search_speedup: the ratio the search's single runs gave (before the re-measurement).
        verdict: one plain sentence on the speedup, as the report and the CLI headline show it.
        equivalent: trials indistinguishable from the winner on re-measurement.
        host_load: a note when another process loaded the host during a compared run, else None.
        host_noise: why the speedup is not measurable on this host (the host's noise, not the
            configurations, decides the interval), else None; no speedup number is shown then.
        confirmation: the re-measurement itself (runs, intervals, cost), when the study made one.

    Studies written before the re-measurement existed lack the fields after ``skipped``; they read
    as not re-measured.
    """

    trial: int
    throughput: float
    baseline_trial: int | None
    baseline_throughput: float | None
    speedup: float | None
    headroom_bytes: list[int | None]
    why: str
    skipped: list[tuple[int, str]] = Field(default_factory=list)
    speedup_low: float | None = None
    speedup_high: float | None = None
    measurable: bool | None = None
    search_speedup: float | None = None
    verdict: str | None = None
    equivalent: list[int] = Field(default_factory=list)
    host_load: str | None = None
    host_noise: str | None = None
    confirmation: Confirmation | None = None
