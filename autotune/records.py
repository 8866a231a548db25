"""Typed records that cross module boundaries and land on disk.

Only ``params``, ``derived``, ``fixed`` and ``values``/``metrics`` are plain dicts: they are the
framework's own vocabulary. Everything else is typed. Records are pydantic models so they serialize to
the JSON files of a study directory (``launch.json``, ``result.json``, ``study.json``) and back.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    PrivateAttr,
    ValidationError,
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
    "StudyBudget",
    "StudyModel",
    "StudySettings",
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


class StudyModel(BaseModel):
    """``study.json``'s ``model``: what the study trains (:class:`ModelRef` as written)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    name: str | None = None
    path_or_id: str | None = None
    local: bool | str | None = None  # true: path_or_id is a local folder
    facts: dict[str, Any] = Field(default_factory=dict)  # params, layers, hidden, vocab, ...

    @property
    def loaded(self) -> str:
        """What the framework loads: the path or hub id, else the name the user typed ("" if neither)."""
        return self.path_or_id or self.name or ""

    def ref(self) -> ModelRef:
        """The study's :class:`ModelRef` as written."""
        return ModelRef(
            name=self.name or self.path_or_id or "",
            path_or_id=self.loaded,
            local=bool(self.local),
            facts=dict(self.facts),
        )


class StudyBudget(BaseModel):
    """``study.json``'s ``budget``: the trials and seconds the search may spend (None: no limit)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    trials: int | None = None
    time_s: float | int | None = None


class StudySettings(BaseModel):
    """``study.json``: what a study is (its backend, model, job, space, budget) and how it ended.

    Read only through :meth:`autotune.studydir.StudyDir.read_settings` (the guarded reader) and
    :meth:`from_json`; written by :meth:`to_json` in the shape it was read. Every field is optional: a
    file of an older version lacks the later ones, and a key left out stays out when written back
    (``model_fields_set``); a key this version does not know is kept (extra). A value of the wrong type
    reads as missing (the readers before this record skipped it too) and is written back as it was.

    The nested documents that have their own reader stay JSON here: ``hardware``
    (:meth:`~autotune.studydir.StudyDir.hardware`), ``recommendation``
    (:meth:`~autotune.studydir.StudyDir.recommendation`), ``identity``
    (:func:`autotune.study.identity.identity_differences`), ``outcome``, ``space``, ``calibration``.
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    name: str | None = None
    uid: str | None = None
    created_wall_s: float | int | None = None
    finished_wall_s: float | int | None = None
    backend: str | None = None
    backend_version: str | None = None
    command: str | list[str] | None = None
    model: StudyModel = Field(default_factory=StudyModel)
    hardware: dict[str, object] | None = None
    global_batch: int | None = None
    num_generations: int | None = None
    max_steps: int | None = None
    max_completion_length: int | None = None
    semantics: dict[str, object] | None = None
    fixed: dict[str, object] = Field(default_factory=dict)
    dataset: str | None = None
    seed: int | None = None
    confirm_runs: int | None = None
    space: list[object] | dict[str, object] | None = None
    space_source: str | None = None
    dropped_knobs: dict[str, object] | None = None
    versions: dict[str, object] = Field(default_factory=dict)
    search: str | None = None
    budget: StudyBudget = Field(default_factory=StudyBudget)
    storage: str | None = None
    secret_args: list[str] = Field(default_factory=list)
    identity: dict[str, object] = Field(default_factory=dict)
    outcome: dict[str, object] | None = None
    recommendation: object = None  # any JSON: its reader says in one line when it is not one
    calibration: dict[str, object] | None = None

    #: entries of the wrong type, kept aside to be written back as they were
    _damaged: dict[str, object] = PrivateAttr(default_factory=dict)
    #: the keys in the order the file held them (written back in that order)
    _order: tuple[str, ...] = PrivateAttr(default=())

    @classmethod
    def from_json(cls, raw: Mapping[str, object]) -> StudySettings:
        """The settings from ``study.json``'s object; an entry of the wrong type reads as missing."""
        data = {str(k): v for k, v in raw.items()}
        damaged: dict[str, object] = {}
        while True:
            try:
                settings = cls.model_validate(data)
                break
            except ValidationError as exc:
                bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"] and str(e["loc"][0]) in data}
                if not bad:  # pragma: no cover - every error of a top-level model names its key
                    raise
                damaged.update({k: data.pop(k) for k in bad})
        settings._damaged = damaged
        settings._order = tuple(str(k) for k in raw)
        return settings

    def to_json(self) -> dict[str, object]:
        """``study.json``'s object: the keys read, and only those (an entry of the wrong type as it was)."""
        out = {**self.model_dump(mode="json", exclude_unset=True), **self._damaged}
        return {**{k: out.pop(k) for k in self._order if k in out}, **out}

    @property
    def job_sizes(self) -> dict[str, int]:
        """The job's sizes the study recorded: ``global_batch``, ``num_generations``,
        ``max_completion_length`` (each when recorded), in the words a backend's ``describe`` reads."""
        sizes = {
            "global_batch": self.global_batch,
            "num_generations": self.num_generations,
            "max_completion_length": self.max_completion_length,
        }
        return {k: v for k, v in sizes.items() if v is not None}

    @property
    def knobs(self) -> list[dict[str, Any]]:
        """The search space as recorded, one mapping per knob (``name``, ``values``, ``default``,
        ``pinned``, ``memory``, ...); empty when the study recorded none."""
        return [k for k in self.space if isinstance(k, dict)] if isinstance(self.space, list) else []

    @property
    def stored_recommendation(self) -> bool:
        """The study ended and stored its recommendation (null when there was none to make)."""
        return "recommendation" in self.model_fields_set
