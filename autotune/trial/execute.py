"""Running one launched trial: render → run under the probes → classify → health gate → result.

This is the one place that isolates trial failures: whatever the trial does, a
:class:`~autotune.records.TrialResult` comes back. Errors of autotune itself propagate.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autotune.backends import Backend, TrialContext
from autotune.errors import LaunchError
from autotune.plaintext import plain
from autotune.probes.summary import GpuSummary, TimelineSummary
from autotune.records import Hardware, LaunchPlan, StepMetrics, TrialResult, TrialSpec, TrialStatus
from autotune.secrets import SecretRule
from autotune.studydir import TrialDir
from autotune.trackers import Trackers, TrialPlace
from autotune.trial.failure_phase import trial_failure_phase
from autotune.trial.live import LiveGpus, run_label
from autotune.trial.outcome import classify, health_check, host_oom_reason, live_health, ran_every_step
from autotune.trial.runner import (
    EarlyStopConfig,
    RunRecord,
    WatchdogConfig,
    default_trial_timeout_s,
    run_trial,
)
from autotune.trial.steady import steady_estimate

__all__ = [
    "Executor",
    "ProbeSettings",
    "make_samplers",
    "missing_executable",
    "not_launched",
    "summarize_trial",
]


@dataclass(frozen=True)
class ProbeSettings:
    """How the probes sample during a trial."""

    gpu_interval_s: float = 0.1
    host_interval_s: float = 0.25
    enabled: bool = True


def make_samplers(hardware: Hardware, settings: ProbeSettings) -> Callable[[int], Sequence[Any]]:
    """A factory the runner calls with the trial's pid: host sampler, plus NVML when GPUs are visible."""

    def factory(pid: int) -> Sequence[Any]:
        if not settings.enabled:
            return []
        from autotune.probes.host import HostSampler

        host = HostSampler(pid, interval_s=settings.host_interval_s)
        samplers: list[Any] = [host]
        if hardware.visible:
            from autotune.probes.nvml import NvmlSampler

            # The host sampler already walks the trial's process tree: reuse its pids for attribution.
            samplers.append(
                NvmlSampler(
                    [g.index for g in hardware.gpus], interval_s=settings.gpu_interval_s, pids=host.pids
                )
            )
        return samplers

    return factory


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


@dataclass
class Executor:
    """Runs trials for a study.

    Args:
        backend: the framework backend.
        hardware: selected GPUs and host.
        watchdog: hang / start-up / timeout limits.
        early_stop: when a trial's estimate is stable enough to stop.
        samplers: probe factory (see :func:`make_samplers`); None runs without probes.
        stop_event: set by the CLI on Ctrl-C; the running trial ends as INTERRUPTED.
        beta: the KL coefficient of the job (health gate: kl must move when beta > 0).
        baseline_steps: step records of the baseline (health gate: degenerate rollouts).
        secrets: the secret rule (:mod:`autotune.secrets`): no file of a trial holds a secret, and a
            result's reason and evidence (a log line) have the trial's secret values masked.
        live: the live view's board of running GPUs (:mod:`autotune.trial.live`), or None.
        trackers: the experiment trackers each trial's framework reports to (``--report-to``), or None.
    """

    backend: Backend
    hardware: Hardware
    watchdog: WatchdogConfig
    early_stop: EarlyStopConfig
    samplers: Callable[[int], Sequence[Any]] | None = None
    stop_event: threading.Event | None = None
    beta: float | None = None
    baseline_steps: list[StepMetrics] | None = None
    model_flops_per_step: Callable[[TrialSpec], float | None] | None = None
    peak_flops: float | None = None
    secrets: SecretRule = field(default_factory=SecretRule)
    live: LiveGpus | None = None
    trackers: Trackers | None = None
    _run: Callable[..., RunRecord] = field(default=run_trial, repr=False)

    def execute(
        self,
        spec: TrialSpec,
        ctx: TrialContext,
        *,
        on_step: Callable[[int, float | None, float], str | None],
        time_left_s: float | None,
    ) -> TrialResult:
        rendered = self._render(spec, ctx)
        if isinstance(rendered, str):
            return not_launched(spec, rendered)
        plan, ctx = rendered
        parser = self.backend.parser(spec, ctx)
        watchdog = replace(self.watchdog, max_steps=ctx.max_steps)  # bounded even if the script ignores it
        if watchdog.trial_timeout_s is None:  # no trial runs unbounded
            watchdog = replace(
                watchdog,
                trial_timeout_s=default_trial_timeout_s(
                    watchdog.startup_timeout_s, watchdog.hang_k, watchdog.hang_floor_s, ctx.max_steps
                ),
            )
        if time_left_s is not None and (
            watchdog.trial_timeout_s is None or time_left_s < watchdog.trial_timeout_s
        ):
            watchdog = replace(watchdog, trial_timeout_s=time_left_s)

        beta = self.beta
        baseline = None if spec.is_baseline else self.baseline_steps
        shown = self.live.open(run_label(ctx.trial_dir.name), parser.open_phase) if self.live else None

        class _Observer:
            def __init__(self) -> None:
                self.steps: list[StepMetrics] = []
                self.problems: list[str] = []

            def on_started(self, pid: int, pgid: int) -> None:
                pass

            def on_step(self, step: StepMetrics, estimate: Any) -> str | None:
                # a run that cannot learn is stopped at once (classified UNHEALTHY below)
                self.steps.append(step)
                if shown is not None:
                    shown.stepped(step.step)
                self.problems = live_health(self.steps, beta=beta, baseline=baseline)
                if self.problems:
                    return f"stopped: {self.problems[0]}"
                if estimate is None:
                    return on_step(step.step, None, 0.0)
                return on_step(step.step, estimate.throughput, estimate.throughput * (1 + estimate.rel_ci95))

        t0 = time.time()
        patterns = self.backend.failure_patterns()
        try:
            record = self._run(
                plan,
                parser,
                ctx.trial_dir,
                global_batch=ctx.global_batch,
                watchdog=watchdog,
                early_stop=self.early_stop,
                observer=(observer := _Observer()),
                samplers=shown.samplers(self.samplers) if shown is not None else self.samplers,
                stop_event=self.stop_event,
                patterns=patterns,
                secrets=self.secrets,
            )
        except LaunchError as exc:
            return not_launched(spec, self.secrets.learning(plan.argv, plan.env).mask(exc.message))
        finally:
            if shown is not None:
                shown.close()
        steps = list(record.steps)
        steady = steady_estimate(steps, ctx.global_batch)
        health: list[str] = []
        # a run that died at exit after its last step finished its work: its health counts too
        ended_well = (
            record.stopped_by in ("early_stop", "pruned", "max_steps")
            or (record.stopped_by is None and record.exit_code == 0)
            or ran_every_step(record, ctx.max_steps)
        )
        if ended_well and steps:
            health = health_check(
                steps,
                beta=self.beta,
                max_completion_length=ctx.max_completion_length,
                baseline=None if spec.is_baseline else self.baseline_steps,
            )
            if record.stopped_by == "pruned":  # stopped for its health: what the live check saw counts
                health += [p for p in observer.problems if p not in health]
        verdict = classify(record, patterns=patterns, health=health, steps_expected=ctx.max_steps)
        mask = self.secrets.learning(plan.argv, plan.env)
        status = verdict.status
        failed_phase = trial_failure_phase(record, status, self.backend.phase_frames())
        if (
            status is TrialStatus.TIMEOUT
            and record.stopped_by == "timeout"
            and self._study_budget_cut(time_left_s, watchdog)
        ):
            status = TrialStatus.INTERRUPTED
        flops = self.model_flops_per_step(spec) if self.model_flops_per_step else None
        summary = None
        try:
            summary = summarize_trial(
                ctx.trial_dir, steps, model_flops_per_step=flops, peak_flops=self.peak_flops
            )
        except (OSError, ValueError) as exc:  # a broken timeline must not lose the trial's result
            summary = TimelineSummary.unreadable(f"timeline unreadable: {exc}")
        peaks: list[int | None] = []
        if summary is not None and summary.gpus:
            peaks = [_peak(summary.gpu(g.index)) for g in self.hardware.gpus]
        host_peak = summary.host.peak_rss_bytes if summary is not None else None
        reason = verdict.reason
        if status is TrialStatus.HOST_OOM:  # the figures must not contradict the reason
            reason = host_oom_reason(
                reason,
                _bytes(summary.host.min_available_bytes) if summary is not None else None,
                self.hardware.host.ram_total_bytes,
            )
        fw_mem = [s.values["memory_gib"] for s in steps if s.values.get("memory_gib") is not None]
        fw_alloc = [
            s.values["memory_allocated_gib"]
            for s in steps
            if s.values.get("memory_allocated_gib") is not None
        ]
        n_gpus = max(1, len(self.hardware.gpus))
        if spec.is_baseline and status is TrialStatus.COMPLETE:
            self.baseline_steps = steps
        return TrialResult(
            number=spec.number,
            params=spec.params,
            derived=spec.derived,
            is_baseline=spec.is_baseline,
            status=status,
            reason=mask.mask(reason),
            evidence=mask.mask(verdict.evidence) if verdict.evidence is not None else None,
            exit_code=record.exit_code,
            signal=record.signal,
            steps=len(steps),
            steady=steady
            if status in (TrialStatus.COMPLETE, TrialStatus.PRUNED, TrialStatus.UNHEALTHY)
            else None,
            health=health,
            peak_mem_bytes=peaks,
            framework_peak_mem_bytes=int(max(fw_mem) * 2**30) if fw_mem else None,
            framework_alloc_peak_bytes=int(max(fw_alloc) * 2**30) if fw_alloc else None,
            host_peak_rss_bytes=int(host_peak) if host_peak else None,
            timeline_summary=summary,
            started_wall_s=record.started_wall_s or t0,
            duration_s=record.duration_s,
            startup_s=record.startup_s,
            gpu_seconds=record.duration_s * n_gpus,
            failed_phase=failed_phase,
            notes=[*record.notes, *([verdict.note] if verdict.note else [])],
        )

    def launch_refusal(self, spec: TrialSpec, ctx: TrialContext) -> str | None:
        """Why this trial's command cannot be launched (one line), or None when it can.

        The study asks before it records the trial RUNNING: a command that cannot be rendered (a format
        its value refuses), that the kernel would refuse (``E2BIG``) or whose executable is missing makes
        the trial INVALID (:func:`not_launched`) without a RUNNING placeholder ever written. Nothing is
        written here.
        """
        rendered = self._render(spec, ctx)
        return rendered if isinstance(rendered, str) else None

    def _render(self, spec: TrialSpec, ctx: TrialContext) -> tuple[LaunchPlan, TrialContext] | str:
        """The trial's launch plan (with the trackers' variables) and context, or why it cannot launch."""
        tracker_env: dict[str, str] = {}
        if self.trackers is not None:
            ctx, tracker_env = _tracked(ctx, self.trackers)
        try:
            plan = self.backend.render(spec, ctx)
        except (ValueError, TypeError, OverflowError, MemoryError) as exc:  # a format the value refuses
            return f"its command cannot be rendered: {exc.__class__.__name__}: {exc}"
        if tracker_env:
            plan = plan.model_copy(update={"env": {**tracker_env, **plan.env}})
        refusal = argv_too_long(plan.argv, plan.env) or missing_executable(plan)
        return refusal if refusal else (plan, ctx)

    @staticmethod
    def _study_budget_cut(time_left_s: float | None, watchdog: WatchdogConfig) -> bool:
        return (
            time_left_s is not None
            and watchdog.trial_timeout_s is not None
            and abs(watchdog.trial_timeout_s - time_left_s) < 1e-6
        )


def _tracked(ctx: TrialContext, trackers: Trackers) -> tuple[TrialContext, dict[str, str]]:
    """The context with the trackers' names and the run's name, and the trackers' variables for the run
    (a variable the user set is left to them: the trackers only fill the unset)."""
    place = TrialPlace(study=ctx.study_dir.name, study_dir=ctx.study_dir, trial_dir=ctx.trial_dir)
    tracked = replace(ctx, report_to=trackers.report_to, run_name=place.run_name, project=ctx.study_dir.name)
    return tracked, trackers.trial_env(place)


#: the longest single argument or variable Linux passes to a program (MAX_ARG_STRLEN: 32 pages)
MAX_ARG_BYTES = 32 * 4096


def _bytes(value: float | None) -> int | None:
    return int(value) if value is not None else None


def _peak(gpu: GpuSummary | None) -> int | None:
    """A GPU's peak memory from the summary (None: the timeline did not sample that GPU)."""
    return _bytes(gpu.peak_mem_bytes) if gpu is not None else None


def argv_too_long(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """Why the system would refuse to start ``argv`` with ``env`` on top of ours (``E2BIG``), or None.

    Checked before the trial's files are written: a 20 MB argument is not copied into ``launch.json``.
    """
    longest = max((len(a.encode("utf-8", "surrogateescape")) for a in argv), default=0)
    if longest >= MAX_ARG_BYTES:
        return (
            f"its command has an argument of {longest} bytes, more than the system passes to a program "
            f"({MAX_ARG_BYTES}, E2BIG)"
        )
    try:
        limit = os.sysconf("SC_ARG_MAX")
    except (OSError, ValueError):
        return None
    total = sum(len(a) + 1 for a in argv) + sum(len(k) + len(v) + 2 for k, v in {**os.environ, **env}.items())
    if limit > 0 and total >= limit:
        return f"its command and environment take {total} bytes, more than the system allows ({limit}, E2BIG)"
    return None


def missing_executable(plan: LaunchPlan) -> str | None:
    """Why the plan's first word is not a program the trial can start (one line), or None.

    Looked up the way the launch does: on the ``PATH`` of the trial's environment (the plan's on top of
    ours), or, for a word with a slash, relative to the plan's working directory.
    """
    exe = plan.argv[0] if plan.argv else ""
    if not exe:
        return "its command is empty"
    if os.sep in exe:
        found = os.path.join(plan.cwd, exe)
        return (
            None
            if os.access(found, os.X_OK) and not os.path.isdir(found)
            else (f"its executable {exe[:200]!r} is not an executable file (from {plan.cwd})")
        )
    path = plan.env.get("PATH", os.environ.get("PATH", os.defpath))
    if shutil.which(exe, path=path) is None:
        return f"its executable {exe[:200]!r} is not on PATH"
    return None


def not_launched(spec: TrialSpec, why: str) -> TrialResult:
    """The result of a trial whose command could not be rendered or started: INVALID, with one line
    (bounded: a 20 MB argument is not copied into the result)."""
    text = " ".join(plain(why).split())
    return TrialResult(
        number=spec.number,
        params=dict(spec.params),
        derived=dict(spec.derived),
        is_baseline=spec.is_baseline,
        status=TrialStatus.INVALID,
        reason=(text[:300] + "…") if len(text) > 300 else text,
    )
