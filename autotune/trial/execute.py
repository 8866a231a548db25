"""A study's trials: render the backend's plan → the trial pipeline (:mod:`autotune.trial.pipeline`:
run under the probes → classify → health gate → result).

This is the one place that isolates trial failures: whatever the trial does, a
:class:`~autotune.records.TrialResult` comes back (INVALID when its command cannot be rendered or
started). Errors of autotune itself propagate.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from autotune.backends import Backend, TrialContext
from autotune.errors import LaunchError
from autotune.plaintext import plain
from autotune.records import Hardware, LaunchPlan, StepMetrics, TrialResult, TrialSpec, TrialStatus
from autotune.secrets import SecretRule
from autotune.trackers import Trackers, TrialPlace
from autotune.trial.live import LiveGpus, run_label
from autotune.trial.pipeline import HealthGate, Judging, TrialJob, TrialPipeline
from autotune.trial.runner import (
    EarlyStopConfig,
    RunRecord,
    WatchdogConfig,
    default_trial_timeout_s,
    run_trial,
)

__all__ = [
    "Executor",
    "ProbeSettings",
    "make_samplers",
    "missing_executable",
    "not_launched",
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
        """Run one trial through the pipeline (:mod:`autotune.trial.pipeline`) and return its result;
        a trial that cannot be rendered or started is INVALID (:func:`not_launched`)."""
        rendered = self._render(spec, ctx)
        if isinstance(rendered, str):
            return not_launched(spec, rendered)
        plan, ctx = rendered
        watchdog = self._watchdog(ctx, time_left_s)
        job = TrialJob(
            spec=spec,
            plan=plan,
            parser=self.backend.parser(spec, ctx),
            trial_dir=ctx.trial_dir,
            label=run_label(ctx.trial_dir.name),
            global_batch=ctx.global_batch,
            watchdog=watchdog,
            early_stop=self.early_stop,
            judging=self._judging(spec, ctx, self._study_budget_cut(time_left_s, watchdog)),
            on_step=on_step,
        )
        try:
            judged = self.pipeline().run(job)
        except LaunchError as exc:
            return not_launched(spec, self.secrets.learning(plan.argv, plan.env).mask(exc.message))
        if spec.is_baseline and judged.result.status is TrialStatus.COMPLETE:
            self.baseline_steps = list(judged.record.steps)
        return judged.result

    def pipeline(self) -> TrialPipeline:
        """The trial pipeline on this executor's hardware, probes, live view and secret rule."""
        return TrialPipeline(
            hardware=self.hardware,
            samplers=self.samplers,
            live=self.live,
            stop_event=self.stop_event,
            secrets=self.secrets,
            runner=self._run,
        )

    def _watchdog(self, ctx: TrialContext, time_left_s: float | None) -> WatchdogConfig:
        """The trial's limits: bounded to its steps and, without a timeout, to a default wall budget;
        never past what the study has left."""
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
        return watchdog

    def _judging(self, spec: TrialSpec, ctx: TrialContext, budget_cut: bool) -> Judging:
        """How a study's trial is judged: the backend's failure text and frames, every step expected,
        the health gate against the baseline (stopping a run that cannot learn at once)."""
        baseline = None if spec.is_baseline or self.baseline_steps is None else tuple(self.baseline_steps)
        return Judging(
            patterns=tuple(self.backend.failure_patterns()),
            phase_frames=tuple(self.backend.phase_frames()),
            steps_expected=ctx.max_steps,
            health=HealthGate(
                beta=self.beta,
                max_completion_length=ctx.max_completion_length,
                baseline=baseline,
                stop_early=True,
            ),
            model_flops_per_step=self.model_flops_per_step(spec) if self.model_flops_per_step else None,
            peak_flops=self.peak_flops,
            timeout_is_interruption=budget_cut,
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
    return TrialResult.not_launched(
        spec.number,
        spec.params,
        derived=spec.derived,
        is_baseline=spec.is_baseline,
        status=TrialStatus.INVALID,
        reason=(text[:300] + "…") if len(text) > 300 else text,
    )
