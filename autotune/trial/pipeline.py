"""One trial's pipeline, the same for a study's trial and for ``autotune profile``: run a launch plan
under the probes (and on the live view), then judge what was observed — classify its end, gate its
health, summarise its timeline, place a failure — into one :class:`~autotune.records.TrialResult`.

Who calls it: :class:`autotune.trial.execute.Executor` (renders the backend's plan first; a trial that
cannot start is INVALID there) and :func:`autotune.app.profile.run_profile` (any command, its output
shown). What differs between the two is data, a :class:`TrialJob` and its :class:`Judging`, never a
branch on who asks. The pipeline runs in the calling thread; a :class:`~autotune.errors.LaunchError`
(the command cannot be started) propagates for the caller to turn into its own answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.backends import FailurePattern, PhaseFrame, StepParser
from autotune.probes.summary import GpuSummary, TimelineSummary
from autotune.records import (
    Hardware,
    LaunchPlan,
    SteadyEstimate,
    StepMetrics,
    TrialResult,
    TrialSpec,
    TrialStatus,
)
from autotune.secrets import SecretRule
from autotune.studydir import TrialDir
from autotune.trial.failure_phase import trial_failure_phase
from autotune.trial.hygiene import remove_stale_segments
from autotune.trial.live import LiveGpus, LiveRun
from autotune.trial.outcome import (
    Verdict,
    classify,
    health_check,
    host_oom_reason,
    live_health,
    ran_every_step,
)
from autotune.trial.run_record import RunRecord
from autotune.trial.runner import EarlyStopConfig, WatchdogConfig, run_trial
from autotune.trial.steady import steady_estimate

__all__ = ["HealthGate", "Judged", "Judging", "TrialJob", "TrialPipeline", "summarize_trial"]

#: statuses whose steady-state estimate a study counts (a failed run's speed ranks nothing)
_STEADY_COUNTS = (TrialStatus.COMPLETE, TrialStatus.PRUNED, TrialStatus.UNHEALTHY)
#: how a run stopped by us while it was making progress ended (its health counts)
_STOPPED_WELL = ("early_stop", "pruned", "max_steps")

#: the study's pruner: (step, throughput or None, optimistic throughput) → a reason to stop, or None
StepHook = Callable[[int, float | None, float], str | None]


@dataclass(frozen=True)
class HealthGate:
    """What a run's health is judged against (:func:`~autotune.trial.outcome.health_check`).

    Attributes:
        beta: the job's KL coefficient (kl must move when it is above 0), None when unknown.
        max_completion_length: the completion cap (fully clipped completions), None when unknown.
        baseline: the baseline trial's steps (degenerate rollouts), None for the baseline itself.
        stop_early: stop the run as soon as it shows it cannot learn
            (:func:`~autotune.trial.outcome.live_health`); off, the run goes on to its end.
    """

    beta: float | None = None
    max_completion_length: int | None = None
    baseline: tuple[StepMetrics, ...] | None = None
    stop_early: bool = False


@dataclass(frozen=True)
class Judging:
    """How a run's end is judged.

    Attributes:
        patterns: the framework's own failure text, on top of the common patterns.
        phase_frames: the framework's traceback frames that place a failure in a phase.
        steps_expected: the steps the run was asked for (finished, then died at exit), None: unknown.
        steps_required: a clean exit without a step record is a CRASH; off, a run profiled as a whole.
        health: the health gate.
        model_flops_per_step, peak_flops: for the timeline summary's utilisation, when known.
        timeout_is_interruption: the run's wall budget was what the study had left, so running out of
            it is an INTERRUPTED trial, not a TIMEOUT of its configuration.
        steady_of_failures: keep the steady-state estimate of a run that failed (a profile reports what
            it measured); off, only a COMPLETE, PRUNED or UNHEALTHY trial has one (a study ranks by it).
    """

    patterns: tuple[FailurePattern, ...] = ()
    phase_frames: tuple[PhaseFrame, ...] = ()
    steps_expected: int | None = None
    steps_required: bool = True
    health: HealthGate = field(default_factory=HealthGate)
    model_flops_per_step: float | None = None
    peak_flops: float | None = None
    timeout_is_interruption: bool = False
    steady_of_failures: bool = False


@dataclass(frozen=True)
class TrialJob:
    """One run to put through the pipeline.

    Attributes:
        spec: the trial's number and configuration (a profile's is number 0, no parameters).
        plan: what to start.
        parser: the run's fresh step parser.
        trial_dir: where the run's files go.
        label: the run's name on the live view.
        global_batch: completions per step; None: read from the steps' own sample counts.
        watchdog, early_stop: when the runner stops the run.
        judging: how its end is judged.
        on_step: the study's pruner, asked on every step (None: nothing prunes).
    """

    spec: TrialSpec
    plan: LaunchPlan
    parser: StepParser
    trial_dir: Path
    label: str
    global_batch: int | None
    watchdog: WatchdogConfig
    early_stop: EarlyStopConfig
    judging: Judging = field(default_factory=Judging)
    on_step: StepHook | None = None


@dataclass(frozen=True)
class Judged:
    """A run through the pipeline: its result, and what the runner observed (its steps, exit code)."""

    result: TrialResult
    record: RunRecord


@dataclass
class TrialPipeline:
    """Runs jobs on this machine's probes and live view; :meth:`run` is the whole pipeline.

    Args:
        hardware: the GPUs the runs hold (peak memory per GPU, GPU-seconds) and the host (its RAM).
        samplers: the probe factory (:func:`autotune.trial.execute.make_samplers`); None: no probes.
        live: the live view's board of running GPUs, or None.
        stop_event: set by another thread to end the running run as interrupted.
        secrets: the secret rule: no file holds a secret, and a result's reason and evidence have the
            run's secret values masked.
        runner: what runs a plan (:func:`~autotune.trial.runner.run_trial`; tests pass a fake).
    """

    hardware: Hardware
    samplers: Callable[[int], Sequence[Any]] | None = None
    live: LiveGpus | None = None
    stop_event: threading.Event | None = None
    secrets: SecretRule = field(default_factory=SecretRule)
    runner: Callable[..., RunRecord] = run_trial

    def run(self, job: TrialJob) -> Judged:
        """Run ``job`` and judge it.

        Raises:
            LaunchError: the command cannot be started (nothing ran).
        """
        began_wall_s = time.time()
        watch = _Watch(job)
        try:
            record = self._observe(job, watch)
        finally:  # what an engine of this run (or an earlier one) left in shared memory once it ended
            remove_stale_segments()
        return Judged(self._judge(job, record, watch.problems, began_wall_s), record)

    def _observe(self, job: TrialJob, watch: _Watch) -> RunRecord:
        """Run the plan under the probes, shown on the live view while it runs."""
        shown = self.live.open(job.label, job.parser.open_phase) if self.live is not None else None
        watch.shown = shown
        try:
            return self.runner(
                job.plan,
                job.parser,
                job.trial_dir,
                global_batch=job.global_batch or 1,
                watchdog=job.watchdog,
                early_stop=job.early_stop,
                observer=watch,
                samplers=shown.samplers(self.samplers) if shown is not None else self.samplers,
                stop_event=self.stop_event,
                patterns=job.judging.patterns,
                secrets=self.secrets,
            )
        finally:
            if shown is not None:
                shown.close()

    def _judge(
        self, job: TrialJob, record: RunRecord, live_problems: Sequence[str], began_wall_s: float
    ) -> TrialResult:
        """The result: status from the evidence and the health gate, then what was measured."""
        judging, spec = job.judging, job.spec
        steps = list(record.steps)
        health = _health(record, judging, live_problems)
        verdict = classify(
            record,
            patterns=judging.patterns,
            health=health,
            steps_required=judging.steps_required,
            steps_expected=judging.steps_expected,
        )
        status = _status(record, verdict, judging)
        failed_phase = trial_failure_phase(record, verdict.status, judging.phase_frames)
        summary = _timeline_summary(job, steps)
        mask = self.secrets.learning(job.plan.argv, job.plan.env)
        fw_mem = [s.values["memory_gib"] for s in steps if s.values.get("memory_gib") is not None]
        fw_alloc = [
            s.values["memory_allocated_gib"]
            for s in steps
            if s.values.get("memory_allocated_gib") is not None
        ]
        host_peak = summary.host.peak_rss_bytes if summary is not None else None
        return TrialResult.measured(
            spec.number,
            spec.params,
            derived=spec.derived,
            is_baseline=spec.is_baseline,
            status=status,
            reason=mask.mask(self._reason(status, verdict, summary)),
            evidence=mask.mask(verdict.evidence) if verdict.evidence is not None else None,
            exit_code=record.exit_code,
            signal=record.signal,
            steps=len(steps),
            steady=_steady(steps, job.global_batch)
            if judging.steady_of_failures or status in _STEADY_COUNTS
            else None,
            health=health,
            peak_mem_bytes=self._peaks(summary),
            framework_peak_mem_bytes=int(max(fw_mem) * 2**30) if fw_mem else None,
            framework_alloc_peak_bytes=int(max(fw_alloc) * 2**30) if fw_alloc else None,
            host_peak_rss_bytes=int(host_peak) if host_peak else None,
            timeline_summary=summary,
            started_wall_s=record.started_wall_s or began_wall_s,
            duration_s=record.duration_s,
            startup_s=record.startup_s,
            gpu_seconds=record.duration_s * max(1, len(self.hardware.gpus)),
            failed_phase=failed_phase,
            notes=[*record.notes, *([verdict.note] if verdict.note else [])],
        )

    def _peaks(self, summary: TimelineSummary | None) -> list[int | None]:
        """Each held GPU's peak memory from the timeline (None: that GPU was not sampled)."""
        if summary is None or not summary.gpus:
            return []
        return [_peak(summary.gpu(g.index)) for g in self.hardware.gpus]

    def _reason(self, status: TrialStatus, verdict: Verdict, summary: TimelineSummary | None) -> str:
        """The verdict's reason; a HOST_OOM's made consistent with the host's samples."""
        if status is not TrialStatus.HOST_OOM:  # the figures must not contradict the reason
            return verdict.reason
        return host_oom_reason(
            verdict.reason,
            _bytes(summary.host.min_available_bytes) if summary is not None else None,
            self.hardware.host.ram_total_bytes,
        )


class _Watch:
    """The runner's observer for one job: shows each step on the live view, stops a run that cannot
    learn (when the health gate says so), then asks the study's pruner."""

    def __init__(self, job: TrialJob) -> None:
        self.gate = job.judging.health
        self.on_step_hook = job.on_step
        self.shown: LiveRun | None = None
        self.steps: list[StepMetrics] = []
        self.problems: list[str] = []  # what the live health check saw (counted when it stopped the run)

    def on_started(self, pid: int, pgid: int) -> None:
        pass

    def on_step(self, step: StepMetrics, estimate: SteadyEstimate | None) -> str | None:
        self.steps.append(step)
        if self.shown is not None:
            self.shown.stepped(step.step)
        if self.gate.stop_early:  # a run that cannot learn is stopped at once (classified UNHEALTHY)
            self.problems = live_health(self.steps, beta=self.gate.beta, baseline=self.gate.baseline)
            if self.problems:
                return f"stopped: {self.problems[0]}"
        if self.on_step_hook is None:
            return None
        if estimate is None:
            return self.on_step_hook(step.step, None, 0.0)
        return self.on_step_hook(
            step.step, estimate.throughput, estimate.throughput * (1 + estimate.rel_ci95)
        )


def _health(record: RunRecord, judging: Judging, live_problems: Sequence[str]) -> list[str]:
    """The health gate's problems, for a run that ended well (a run that died at exit after its last
    step finished its work: its health counts too); none for a run that failed."""
    steps = list(record.steps)
    ended_well = (
        record.stopped_by in _STOPPED_WELL
        or (record.stopped_by is None and record.exit_code == 0)
        or ran_every_step(record, judging.steps_expected)
    )
    if not (ended_well and steps):
        return []
    gate = judging.health
    health = health_check(
        steps, beta=gate.beta, max_completion_length=gate.max_completion_length, baseline=gate.baseline
    )
    if record.stopped_by == "pruned":  # stopped for its health: what the live check saw counts
        health += [p for p in live_problems if p not in health]
    return health


def _status(record: RunRecord, verdict: Verdict, judging: Judging) -> TrialStatus:
    """The verdict's status, except a timeout of the study's own budget: INTERRUPTED."""
    if (
        verdict.status is TrialStatus.TIMEOUT
        and record.stopped_by == "timeout"
        and judging.timeout_is_interruption
    ):
        return TrialStatus.INTERRUPTED
    return verdict.status


def _steady(steps: Sequence[StepMetrics], global_batch: int | None) -> SteadyEstimate | None:
    """The steady-state estimate, with the steps' own sample counts when the batch is not known."""
    batch = global_batch or next((s.samples for s in steps if s.samples), None)
    return steady_estimate(steps, batch) if batch else None


def _timeline_summary(job: TrialJob, steps: Sequence[StepMetrics]) -> TimelineSummary | None:
    """The run's timeline summary (None without a timeline; a broken one is said, never lost)."""
    judging = job.judging
    try:
        return summarize_trial(
            job.trial_dir,
            steps,
            model_flops_per_step=judging.model_flops_per_step,
            peak_flops=judging.peak_flops,
        )
    except (OSError, ValueError) as exc:  # a broken timeline must not lose the trial's result
        return TimelineSummary.unreadable(f"timeline unreadable: {exc}")


def summarize_trial(
    trial_dir: Path,
    steps: Sequence[StepMetrics],
    *,
    model_flops_per_step: float | None = None,
    peak_flops: float | None = None,
) -> TimelineSummary | None:
    """Timeline summary of a trial directory (None when it has no timeline)."""
    from autotune.probes.phases import read_phases
    from autotune.probes.timeline import read_timeline, summarize

    files = TrialDir(trial_dir)
    path = files.timeline_parquet
    if not path.exists():
        return None
    df = read_timeline(path)
    phases_path = files.phases_jsonl
    phases = read_phases(phases_path) if phases_path.exists() else []
    step_dicts = [
        {"step": s.step, "t_mono_s": s.t_mono_s, "duration_s": s.duration_s, "values": dict(s.values)}
        for s in steps
    ]
    return summarize(df, step_dicts, phases, model_flops_per_step=model_flops_per_step, peak_flops=peak_flops)


def _bytes(value: float | None) -> int | None:
    return int(value) if value is not None else None


def _peak(gpu: GpuSummary | None) -> int | None:
    """A GPU's peak memory from the summary (None: the timeline did not sample that GPU)."""
    return _bytes(gpu.peak_mem_bytes) if gpu is not None else None
