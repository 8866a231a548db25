"""When a running trial is stopped: the watchdog's limits (:class:`WatchdogConfig`), what the watch has
seen so far (:class:`LiveState`) and the rules that decide on it (:class:`StopRules`).

The trial runner (:class:`autotune.trial.runner.TrialRun`) owns one :class:`StopRules` per trial and
asks it from its watch loop, in the calling thread. A decision is written into the live state
(``stopped_by``, ``stop_reason``, ``hang_signal``, ``stop_evidence``); the runner then ends the trial.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from autotune.backends._base import StepParser
from autotune.errors import UsageError, WriteError
from autotune.records import StepMetrics
from autotune.trial.early import (
    EarlyCall,
    EarlyCallConfig,
    FatalLine,
    GpuSpinWatch,
    LiveGpuSamples,
    require_non_negative,
    spin_call,
    sync_call,
)
from autotune.trial.evidence import strip_rank_prefix
from autotune.trial.run_record import EVIDENCE_LINES, TAIL_LINES, OutputLine, RunObserver
from autotune.trial.steady import EarlyStopConfig, is_stable, steady_estimate

__all__ = [
    "LiveState",
    "StopRules",
    "WatchdogConfig",
    "default_startup_timeout_s",
    "default_trial_timeout_s",
]

_LIVE_GPU_READ_S = 0.5  # how often the early calls read the samplers' new GPU rows

_STOP_FLAGS = {
    "startup_timeout_s": "--startup-timeout",
    "hang_k": "--hang-k",
    "hang_floor_s": "--hang-floor",
    "trial_timeout_s": "--trial-timeout",
    "grace_s": "--grace",
    "poll_interval_s": "--poll-interval",
}


def default_startup_timeout_s(param_count: int | None) -> float:
    """Start-up budget (launch → first step) that grows with model size.

    600 s covers imports, a tiny or small model, DeepSpeed op builds and vLLM start-up; each billion
    parameters adds 60 s (loading and sharding weights, profiling the KV cache): 7B → 1020 s,
    72B → 4920 s. Unknown size → 600 s.
    """
    if not param_count or param_count <= 0:
        return 600.0
    return 600.0 + 60.0 * param_count / 1e9


def default_trial_timeout_s(
    startup_timeout_s: float, hang_k: float, hang_floor_s: float, max_steps: int
) -> float:
    """A trial's wall budget when ``--trial-timeout`` is not given: the start-up budget, then
    ``max_steps`` steps of ``hang_k × hang_floor_s`` each (a step five times the hang floor is far
    slower than any step the hang watchdog lets pass unremarked), so no trial runs unbounded."""
    return startup_timeout_s + max(1, max_steps) * max(1.0, hang_k) * max(1.0, hang_floor_s)


@dataclass(frozen=True)
class WatchdogConfig:
    """When a trial counts as hung or out of time, and how it is stopped.

    Attributes:
        startup_timeout_s: launch → first step budget (see :func:`default_startup_timeout_s`). Until
            a step duration is known (two steps, or a step reporting its own duration), the gap after
            the last step is also held to this budget.
        hang_k: after the first steps, no new step for ``max(hang_k × median step time,
            hang_floor_s)`` is a hang.
        hang_floor_s: the least time without a step that counts as a hang.
        trial_timeout_s: the trial's whole wall-clock budget (None: no limit).
        grace_s: SIGTERM → SIGKILL grace period.
        poll_interval_s: how often the parser's files are polled and the watchdog checks.
        early_calls: also end a trial as soon as its evidence is unambiguous
            (:mod:`autotune.trial.early`): a fatal line after a short grace, a hang from GPUs that spin
            at low power or from a weight sync the log shows never ending. Off: only the limits above.
        early: the thresholds and windows of those calls.
        max_steps: the steps a trial may make (``--max-steps``): a step past it ends the trial at once,
            cleanly, as done (``stopped_by == "max_steps"``), and is not recorded; a script that ignores
            ``AUTOTUNE_MAX_STEPS`` is bounded too. None: no bound.

    Raises:
        UsageError: a negative (or NaN) value, or a poll interval of 0.
    """

    startup_timeout_s: float = 600.0
    hang_k: float = 5.0
    hang_floor_s: float = 60.0
    trial_timeout_s: float | None = None
    grace_s: float = 5.0
    poll_interval_s: float = 0.1
    early_calls: bool = True
    early: EarlyCallConfig = field(default_factory=EarlyCallConfig)
    max_steps: int | None = None

    def __post_init__(self) -> None:
        for name, flag in _STOP_FLAGS.items():
            value = getattr(self, name)
            if value is None and name == "trial_timeout_s":
                continue
            require_non_negative(value, flag, flag)
        if self.poll_interval_s <= 0:
            raise UsageError(
                "--poll-interval must be above 0", hint="Give a poll interval such as 0.1 seconds"
            )


class LiveState:
    """What the watch has seen so far: steps, output tails, evidence, and whether we decided to stop."""

    def __init__(self) -> None:
        self.steps: list[StepMetrics] = []
        self.last_step_mono: float | None = None
        self.first_output_mono: float | None = None
        self.stdout_tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.stderr_tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.evidence: deque[OutputLine] = deque(maxlen=EVIDENCE_LINES)
        self.first_step_mono: float | None = None
        self.open_streams = {"stdout", "stderr"}
        self.median_step_s: float | None = None
        self.stopped_by: str | None = None
        self.stop_reason: str | None = None
        self.hang_signal: str | None = None
        self.stop_evidence: str | None = None
        self.fatal: FatalLine | None = None  # the first fatal line while no step followed it


class StopRules:
    """Whether and why to stop a running trial, decided on what the watch has seen.

    The runner asks :meth:`past_max_steps` and :meth:`decide` on every new step, and on every watchdog
    turn :meth:`check_limits`, then (when it set nothing) :meth:`check_progress`; :meth:`watch_gpus` once its samplers with live GPU rows started.

    Args:
        live: the watch's state, which the rules read and write their decision into.
        watchdog, early_stop, observer, global_batch, stop_event: as for
            :func:`autotune.trial.runner.run_trial`.
        parser: the trial's parser (the phase its log shows the trial inside).
    """

    def __init__(
        self,
        live: LiveState,
        *,
        watchdog: WatchdogConfig,
        early_stop: EarlyStopConfig,
        parser: StepParser,
        observer: RunObserver | None,
        global_batch: int,
        stop_event: threading.Event | None,
    ) -> None:
        self.live = live
        self.watchdog = watchdog
        self.early_stop = early_stop
        self.parser = parser
        self.observer = observer
        self.global_batch = global_batch
        self.stop_event = stop_event
        self.spin_watch: GpuSpinWatch | None = None  # set once samplers with live GPU rows started
        self._next_gpu_read_mono = 0.0

    def watch_gpus(self, samplers: Sequence[LiveGpuSamples]) -> None:
        """Read these samplers' live GPU rows for the spin rule (with ``watchdog.early_calls``)."""
        if samplers and self.watchdog.early_calls:
            self.spin_watch = GpuSpinWatch(list(samplers), self.watchdog.early)

    def past_max_steps(self, *, deciding: bool) -> bool:
        """Whether a new step is past ``--max-steps`` (it is dropped, and a live trial is ended)."""
        bound, live = self.watchdog.max_steps, self.live
        if bound is None or bound <= 0 or len(live.steps) < bound:
            return False
        if deciding and live.stopped_by is None:
            live.stopped_by = "max_steps"
            live.stop_reason = f"completed {bound} steps (--max-steps; the script went on, it was ended)"
        return True

    def decide(self, step: StepMetrics) -> None:
        """After a new step: prune when the observer says so, else stop early once the estimate is stable."""
        live, early_stop = self.live, self.early_stop
        est = steady_estimate(live.steps, self.global_batch, max_warmup=early_stop.max_warmup_steps)
        verdict = self.observer.on_step(step, est) if self.observer is not None else None
        if verdict:
            live.stopped_by, live.stop_reason = "pruned", " ".join(str(verdict).split())
        elif (
            early_stop.enabled
            and est is not None
            and len(live.steps) >= early_stop.min_steps
            and is_stable(est, early_stop)
        ):
            live.stopped_by = "early_stop"
            live.stop_reason = (
                f"steady after {len(live.steps)} steps: {est.step_time_s:.3g} s/step "
                f"± {est.rel_ci95:.1%} (95 % CI, {est.steady_steps} steady steps)"
            )

    def check_limits(self, now: float, *, launched_mono: float, write_failure: WriteError | None) -> bool:
        """Set a stop reason for a failed write, the user's interrupt, the wall budget or an early call
        from evidence (:mod:`autotune.trial.early`); True when one is set."""
        live, watchdog = self.live, self.watchdog
        if write_failure is not None:
            live.stopped_by, live.stop_reason = "write_error", write_failure.message
            return True
        if self.stop_event is not None and self.stop_event.is_set():
            live.stopped_by, live.stop_reason = "interrupt", "stopped by the user"
            return True
        elapsed = now - launched_mono
        if watchdog.trial_timeout_s is not None and elapsed >= watchdog.trial_timeout_s:
            live.stopped_by = "timeout"
            live.stop_reason = (
                f"trial wall budget of {watchdog.trial_timeout_s:g} s ran out after {len(live.steps)} steps"
            )
            return True
        return watchdog.early_calls and (
            self._fatal_output(now) or self._hang_from_evidence(now, launched_mono)
        )

    def check_progress(self, now: float, *, launched_mono: float) -> None:
        """Set a stop reason when no step came within the start-up budget, or for too long (a hang)."""
        live, watchdog = self.live, self.watchdog
        elapsed = now - launched_mono
        if live.last_step_mono is None:
            if elapsed >= watchdog.startup_timeout_s:
                live.stopped_by, live.hang_signal = "startup_timeout", "no_step"
                live.stop_reason = f"no step within the start-up budget of {watchdog.startup_timeout_s:g} s"
            return
        gap = now - live.last_step_mono
        if live.median_step_s is not None:
            allowed = max(watchdog.hang_k * live.median_step_s, watchdog.hang_floor_s)
            rule = (
                f"max({watchdog.hang_k:g} × median step {live.median_step_s:.3g} s, "
                f"floor {watchdog.hang_floor_s:g} s)"
            )
        else:
            allowed = watchdog.startup_timeout_s
            rule = "the start-up budget, no step duration known yet"
        if gap >= allowed:
            live.stopped_by, live.hang_signal = "hang", "no_step"
            live.stop_reason = (
                f"no step for {gap:.1f} s after step {live.steps[-1].step} (limit {allowed:.3g} s = {rule})"
            )

    def _fatal_output(self, now: float) -> bool:
        """Stop a trial that printed a fatal line ``fatal_grace_s`` ago and still runs; True if stopped.

        A step made after the line was read cancels it: the framework recovered. (A step's own time,
        not when the runner handled it: a step printed before the line may be handled after it.)
        """
        live = self.live
        fatal = live.fatal
        if fatal is None:
            return False
        if live.steps and live.steps[-1].t_mono_s > fatal.t_mono_s:
            live.fatal = None
            return False
        waited = now - fatal.t_mono_s
        if waited < self.watchdog.early.fatal_grace_s:
            return False
        live.stopped_by = "fatal_output"
        live.stop_reason = (
            f"still running {waited:.1f} s after a fatal line ({fatal.pattern.status}: "
            f"{fatal.pattern.reason}): {strip_rank_prefix(fatal.line)}"
        )
        return True

    def _hang_from_evidence(self, now: float, launched_mono: float) -> bool:
        """Call a hang when the GPUs spin at low power, or the log shows a weight sync never ending,
        for longer than the windows of :class:`EarlyCallConfig`; True if called."""
        live, watchdog = self.live, self.watchdog
        last_progress = live.last_step_mono if live.last_step_mono is not None else launched_mono
        after = f" after step {live.steps[-1].step}" if live.steps else " before the first step"
        call: EarlyCall | None = None
        if self.spin_watch is not None and now >= self._next_gpu_read_mono:
            self._next_gpu_read_mono = now + _LIVE_GPU_READ_S
            self.spin_watch.update()
            spin = self.spin_watch.spin(now)
            if spin is not None:
                window, rule = watchdog.early.spin_window_s(live.median_step_s, watchdog.startup_timeout_s)
                call = spin_call(
                    spin,
                    now_mono_s=now,
                    last_progress_mono_s=last_progress,
                    after=after,
                    window_s=window,
                    rule=rule,
                    config=watchdog.early,
                )
        if call is None:
            phase = self.parser.open_phase()
            if phase is not None:
                window, rule = watchdog.early.sync_window_s(live.median_step_s, watchdog.startup_timeout_s)
                call = sync_call(
                    phase,
                    now_mono_s=now,
                    last_progress_mono_s=last_progress,
                    after=after,
                    window_s=window,
                    rule=rule,
                )
        if call is None:
            return False
        live.stopped_by, live.hang_signal = "hang", call.signal
        live.stop_reason, live.stop_evidence = call.reason, call.evidence
        return True
