"""Run one trial as a child process in its own session; watch it; stop it; clean up after it.

Who calls what:

- The study calls :func:`run_trial` once per trial, from one thread; it runs a :class:`TrialRun`, whose
  methods are the stages in order. The trial starts in a new session (its own process group,
  ``pgid == pid``), with the plan's environment on top of ours, its stdout and stderr streamed to
  ``stdout.log`` / ``stderr.log`` by two reader threads. The calling thread runs the watch loop: it
  feeds every output segment to the backend's parser, polls the parser's metric files, writes
  ``metrics.jsonl``, asks the observer whether to prune, stops at steady state, and stops hangs.
- Stopping only ever touches the trial's own process group and the descendants seen during the run:
  SIGTERM, a grace period, SIGKILL, then a check that nothing survived (:func:`terminate_group`);
  then what carries the trial's marker, and what is left in the trial's cgroup
  (:mod:`autotune.trial.confine`: a process that cleared its environment and left the group).
  Nothing is ever matched by name.
- :func:`reap_orphan` ends a trial group left behind when autotune itself was killed with SIGKILL;
  the study calls it on resume. It relies on ``proc.json`` (pid, pgid, create time) in the trial dir.

The runner decides *when* to stop; :mod:`autotune.trial.outcome` decides what the trial's end means.
"""

from __future__ import annotations

import json
import os
import queue
import re
import socket
import statistics
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, Protocol, runtime_checkable

from autotune.affinity import parse_cores, pin
from autotune.backends._base import FailurePattern, StepParser
from autotune.errors import LaunchError, UsageError, WriteError
from autotune.records import LaunchPlan, SteadyEstimate, StepMetrics
from autotune.secrets import SecretRule
from autotune.studydir import TrialDir, create_file, write_json_atomic, write_text_atomic
from autotune.tail import OutputQueue, Segment, pump_pipe
from autotune.trial.confine import Confinement
from autotune.trial.early import (
    EarlyCall,
    EarlyCallConfig,
    FatalLine,
    FatalLines,
    GpuSpinWatch,
    LiveGpuSamples,
    require_non_negative,
    spin_call,
    sync_call,
)
from autotune.trial.evidence import COMMON_PATTERNS, strip_rank_prefix
from autotune.trial.processes import (
    MARKER_ENV,
    alive_pids,
    create_time_of,
    descendants_of,
    end_marked,
    new_marker,
    outside_group,
    reap_orphan,
    terminate_group,
)
from autotune.trial.steady import EarlyStopConfig, is_stable, steady_estimate, step_durations

__all__ = [
    "EarlyCallConfig",
    "EarlyStopConfig",
    "OutputLine",
    "RunObserver",
    "RunRecord",
    "Sampler",
    "TrialRun",
    "WatchdogConfig",
    "alive_pids",
    "default_startup_timeout_s",
    "reap_orphan",
    "run_trial",
    "terminate_group",
]

_FORCED_GRACE_S = 0.5  # SIGTERM → SIGKILL when the user forces a stop
TAIL_LINES = 400  # lines of each stream kept in memory for classification
EVIDENCE_LINES = 200  # failure-pattern lines kept in memory (the logs keep everything)
MAX_LINE_CHARS = 4000  # longer lines are cut in memory (not in the logs)
#: a pause of autotune's own loop this long is noted on the trial (its measurement waited meanwhile)
_PAUSE_NOTE_S = 5.0
_DESCENDANT_SCAN_S = 1.0  # how often the process tree is walked (psutil, a few ms each)
_READER_JOIN_S = 5.0
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


@runtime_checkable
class Sampler(Protocol):
    """A probe that samples beside the trial (``probes.host.HostSampler``, ``probes.nvml.NvmlSampler``)."""

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def rows(self) -> list[dict[str, Any]]: ...


class RunObserver(Protocol):
    """Hooks the study passes to :func:`run_trial`; all are called from the calling thread.

    ``on_output(stream, line)`` is optional: the runner calls it for every output segment when the
    observer has it.
    """

    def on_started(self, pid: int, pgid: int) -> None:
        """The trial process exists (called once, right after launch)."""

    def on_step(self, step: StepMetrics, estimate: SteadyEstimate | None) -> str | None:
        """A new step arrived. Return a one-line reason to stop the trial as PRUNED, else None."""


class OutputLine(NamedTuple):
    """One output segment: ``stream`` is "stdout" or "stderr"."""

    stream: str
    text: str


@dataclass
class RunRecord:
    """What the runner observed of one trial (the input of :func:`autotune.trial.outcome.classify`).

    Attributes:
        exit_code: the process's return code (negative: killed by that signal); None if never started.
        signal: the signal that ended the process, when one did.
        stopped_by: None when the process ended on its own, else who stopped it: "hang",
            "startup_timeout", "timeout", "fatal_output" (it printed a fatal line and kept running),
            "early_stop", "pruned", "interrupt" or "write_error" (a file of the trial could not be written).
        stop_reason: one line saying why we stopped it.
        steps: every step record, in arrival order.
        stdout_tail, stderr_tail: the last :data:`TAIL_LINES` segments of each stream.
        evidence: segments matching a failure pattern, from anywhere in the output (bounded).
        duration_s: launch → process end.
        startup_s: launch → first step record.
        started_wall_s: launch time (``time.time()``).
        pid, pgid: the trial's process and process group.
        survivors: pids that were still alive after SIGTERM and its grace (SIGKILLed), or found in the
            group after the trial's own process ended.
        timeline_rows: rows the samplers produced (written to ``timeline.parquet``).
        estimate: the steady-state estimate over all steps, when there is one.
        pids_seen: the trial's pid and every descendant seen during the run (for GPU hygiene checks).
        first_output_s: launch → first output segment.
        cleanup_s: process end → run_trial returning (tuner overhead).
        notes: things the lead may want to report (a sampler that failed, a metrics-file clash).
        hang_signal: which rule called a hang: "gpu_spin" or "weight_sync_log"
            (:mod:`autotune.trial.early`), "no_step" (the watchdog's limits); None when none did.
        stop_evidence: what an early call rests on, prefixed by its signal's name (None otherwise).
        open_phase: the phase the framework's log showed the trial inside when it ended
            (:meth:`~autotune.backends.StepParser.open_phase`), when it shows one.
    """

    exit_code: int | None
    signal: int | None
    stopped_by: str | None
    stop_reason: str | None
    steps: list[StepMetrics]
    stdout_tail: list[str]
    stderr_tail: list[str]
    evidence: list[OutputLine]
    duration_s: float
    startup_s: float | None
    started_wall_s: float
    pid: int
    pgid: int
    survivors: list[int] = field(default_factory=list)
    timeline_rows: int = 0
    estimate: SteadyEstimate | None = None
    pids_seen: list[int] = field(default_factory=list)
    first_output_s: float | None = None
    cleanup_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    hang_signal: str | None = None
    stop_evidence: str | None = None
    open_phase: str | None = None


# ---------------------------------------------------------------------------------------------------
# Output pumping


def _close_quietly(fh: Any) -> None:
    """Close a file whose writes already failed (closing may flush and fail again)."""
    try:
        fh.close()
    except OSError:
        pass


def _write_timeline(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write sampler rows as parquet (through ``probes.timeline`` when it is there)."""
    try:
        from autotune.probes.timeline import write_timeline
    except ImportError:
        import pandas as pd

        pd.DataFrame(rows).to_parquet(path, index=False)
        return
    write_timeline(path, rows)


def _step_json(step: StepMetrics) -> str:
    # json.dumps keeps NaN/inf as NaN/Infinity tokens (Python and pydantic read them back); the health
    # gate needs them, and pydantic's own JSON would turn them into null.
    return json.dumps(step.model_dump(mode="python"), allow_nan=True)


class _Live:
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


def _effective_plan(plan: LaunchPlan) -> LaunchPlan:
    """The plan as launched: Python children unbuffered so step lines arrive live."""
    if "PYTHONUNBUFFERED" in plan.env or "PYTHONUNBUFFERED" in os.environ:
        return plan
    return plan.model_copy(update={"env": {**plan.env, "PYTHONUNBUFFERED": "1"}})


def _child_env(plan: LaunchPlan, marker: str) -> dict[str, str]:
    env = dict(os.environ)
    for key in plan.unset_env:
        env.pop(key, None)
    env.update(plan.env)
    env[MARKER_ENV] = marker  # every process of the trial inherits it (see autotune.trial.processes)
    return env


# ---------------------------------------------------------------------------------------------------
# One trial, stage by stage


class TrialRun:
    """One trial, from its files to its :class:`RunRecord`, in stages that :meth:`run` calls in order.

    :func:`run_trial` makes one and calls :meth:`run`; an object runs one trial, once. Every method
    runs in the calling thread: the two reader threads only copy the pipes to the logs and queue each
    segment (:func:`autotune.tail.pump_pipe`), and the samplers sample on their own.

    The stages, in order:

    1. :meth:`prepare_files`: the trial directory, ``launch.json``, ``command.sh``, empty logs.
    2. :meth:`launch`: the process in a new session (its own group), and ``proc.json``.
    3. :meth:`start_readers` and :meth:`open_metrics`; then, guarded, the observer's ``on_started``
       and :meth:`start_samplers`.
    4. :meth:`watch`, guarded: output to the parser, live decisions, the watchdog, until the process
       ends or we decide to stop it.
    5. :meth:`end_group`: the group stopped if it still runs, the process reaped, stragglers ended.
    6. :meth:`finish_output`: the rest of the output and the parser's last steps.
    7. :meth:`stop_samplers`: the samplers stopped and their rows collected.
    8. :meth:`write_records`: ``timeline.parquet`` and the final ``proc.json``.
    9. :meth:`record`: the :class:`RunRecord`.

    Whatever a guarded stage raises (an observer, the parser, KeyboardInterrupt) goes through
    :meth:`abort`, which stops the trial, before it propagates. :meth:`start_readers` and
    :meth:`open_metrics` are not guarded: if they raise, the trial is not stopped here, and
    :func:`reap_orphan` ends it when the study resumes (its ``proc.json`` is written by then).

    Args:
        plan, parser, trial_dir, global_batch, watchdog, early_stop, observer, samplers, stop_event,
            patterns: as for :func:`run_trial`.
    """

    # Set by prepare_files().
    write_metrics: bool
    evidence_rx: re.Pattern[str]
    # Set by launch().
    proc: subprocess.Popen[bytes]
    pid: int
    pgid: int
    started_wall_s: float
    launched_mono: float

    def __init__(
        self,
        plan: LaunchPlan,
        parser: StepParser,
        trial_dir: Path,
        *,
        global_batch: int,
        watchdog: WatchdogConfig,
        early_stop: EarlyStopConfig,
        observer: RunObserver | None = None,
        samplers: Callable[[int], Sequence[Sampler]] | None = None,
        stop_event: threading.Event | None = None,
        patterns: Sequence[FailurePattern] = (),
        secrets: SecretRule | None = None,
    ) -> None:
        self.plan = _effective_plan(plan)
        # the rule, knowing this trial's own secret values (masked wherever they would be written)
        self.secrets = (secrets or SecretRule()).learning(self.plan.argv, self.plan.env)
        self.write_failure: WriteError | None = None  # the first write that failed (the trial is ended)
        self.logs: dict[str, BinaryIO] = {}
        self.parser = parser
        self.files = TrialDir(Path(trial_dir))
        self.global_batch = global_batch
        self.watchdog = watchdog
        self.early_stop = early_stop
        self.observer = observer
        self.sampler_factory = samplers
        self.stop_event = stop_event
        self.patterns = tuple(patterns)
        self.on_output = getattr(observer, "on_output", None) if observer is not None else None
        self.notes: list[str] = []
        self.live = _Live()
        self.known: dict[int, float | None] = {}  # the trial's pid and every descendant seen → create time
        self.marker = new_marker()  # in every trial process's environment: found even outside the group
        self.confinement: Confinement | None = None  # its cgroup (or subreaper): found whatever it clears
        self.affinity_note: str | None = None  # why a CPU-only trial could not be pinned to its cores
        self.proc_info: dict[str, Any] = {}
        self.segments = OutputQueue()
        self.readers: list[threading.Thread] = []
        self.active_samplers: list[Sampler] = []
        self.metrics_file: BinaryIO | None = None
        self.exited_mono: float | None = None  # when the process was seen ending by itself
        self._next_scan_mono = 0.0
        self.fatal_lines = FatalLines((*self.patterns, *COMMON_PATTERNS))
        self.spin_watch: GpuSpinWatch | None = None  # set once samplers with live GPU rows started
        self._next_gpu_read_mono = 0.0

    def run(self) -> RunRecord:
        """Run the stages in order (see the class docstring) and return what was observed.

        Raises:
            LaunchError: the command cannot be started (not found, not executable, too long).
            WriteError: a file of the trial could not be written; raised once the trial is cleaned up.
        """
        self.prepare_files()
        self.launch()
        self.start_readers()
        self.open_metrics()
        try:
            if self.observer is not None:
                self.observer.on_started(self.pid, self.pgid)
            self.start_samplers()
            self.watch()
        except BaseException as exc:
            self.abort(forced=isinstance(exc, KeyboardInterrupt))
            raise
        try:
            survivors = self.end_group()
        except KeyboardInterrupt:  # forced while the group was being ended: end the rest at once
            self.abort(forced=True)
            raise
        exited_mono = self.exited_mono if self.exited_mono is not None else time.monotonic()
        self.finish_output()
        rows = self.stop_samplers()
        self.write_records(rows)
        if self.write_failure is not None:  # the trial is ended and cleaned up; the study stops
            raise self.write_failure
        return self.record(survivors=survivors, timeline_rows=len(rows), exited_mono=exited_mono)

    # -- 1-3: before and right after launch ---------------------------------------------------------

    def prepare_files(self) -> None:
        """Create the trial directory with ``launch.json``, ``command.sh`` and empty logs.

        Called by :meth:`run` first, before anything is started. Also settles what the watch keeps:
        whether the runner writes ``metrics.jsonl`` (not when the framework's own metrics file has that
        path) and the failure text kept as evidence (the backend's patterns, then the
        common ones).
        """
        files = self.files
        try:
            files.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WriteError.of(files.path, exc) from None
        # the files hold the plan with its secrets masked; the process gets the real values (launch)
        write_text_atomic(
            files.launch_json, self.plan.redacted(self.secrets).model_dump_json(indent=2) + "\n"
        )
        write_text_atomic(files.command_sh, self.plan.to_shell(self.secrets), mode=0o755)
        self.logs = {"stdout": create_file(files.stdout_log), "stderr": create_file(files.stderr_log)}
        own_metrics = {Path(self.plan.cwd, p).resolve() for p in self.plan.metrics_paths}
        # the framework's own metrics file at that path (TRL's worker writes it): the runner leaves it
        # alone; an ordinary case, so no note (notes are printed after every trial)
        self.write_metrics = files.metrics_jsonl.resolve() not in own_metrics
        self.evidence_rx = re.compile("|".join(f"(?:{p.regex})" for p in (*self.patterns, *COMMON_PATTERNS)))

    def launch(self) -> None:
        """Start the trial in a new session (its own process group, ``pgid == pid``); write ``proc.json``.

        Called by :meth:`run` after :meth:`prepare_files`. Afterwards ``proc``, ``pid``, ``pgid``,
        ``started_wall_s`` and ``launched_mono`` are set, and ``proc.json`` names the group, so
        :func:`reap_orphan` can end it if autotune dies from here on.

        Raises:
            LaunchError: the command cannot be started (not found, not executable, too long).
        """
        plan = self.plan
        self.confinement = confinement = Confinement.open()
        self.started_wall_s = time.time()
        self.launched_mono = time.monotonic()
        try:
            self.proc = subprocess.Popen(
                list(plan.argv),
                cwd=plan.cwd,
                env=_child_env(plan, self.marker),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                bufsize=0,
                preexec_fn=confinement.child_setup,
            )
        except (OSError, ValueError, subprocess.SubprocessError) as exc:  # not found, E2BIG, a NUL byte
            confinement.close()
            for log in self.logs.values():
                _close_quietly(log)
            cause = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            size = sum(len(a) + 1 for a in plan.argv)
            raise LaunchError(
                f"cannot start {plan.argv[0][:200]!r} in {plan.cwd}: {cause}"
                + (f" ({len(plan.argv)} arguments, {size} bytes)" if isinstance(exc, OSError) else ""),
                hint="Check the command (its first word must be an executable on PATH or a path, "
                "its arguments short enough for the system)",
            ) from None
        self.pid = self.pgid = self.proc.pid  # start_new_session: the child leads its session and group
        # a CPU-only trial's cores: pinned before the child has started anything (its children inherit)
        self.affinity_note = pin(self.pid, parse_cores(plan.env))
        confinement.launched(self.pid)
        self.known[self.pid] = create_time_of(self.pid)
        self.proc_info = {
            "pid": self.pid,
            "pgid": self.pgid,
            "create_time": self.known[self.pid],
            "started_wall_s": self.started_wall_s,
            "runner_pid": os.getpid(),
            "runner_create_time": create_time_of(os.getpid()),
            "host": socket.gethostname(),
            "marker": self.marker,
            "cgroup": confinement.cgroup_path,
            "cgroup_note": confinement.note,  # why not, when the trial has none
            "cpu_cores": list(parse_cores(plan.env)),
            "affinity_note": self.affinity_note,
            "argv0": plan.argv[0],
            "ended": False,
        }
        self._write_proc()

    def start_readers(self) -> None:
        """Start the two reader threads: each copies a pipe to its log and queues every segment.

        Called by :meth:`run` right after :meth:`launch`. A reader ends when its pipe closes, that is
        when every process holding it has ended; :meth:`finish_output` joins them.
        """
        streams = (
            ("stdout", self.proc.stdout, self.files.stdout_log),
            ("stderr", self.proc.stderr, self.files.stderr_log),
        )
        self.readers = [
            threading.Thread(
                target=pump_pipe,
                args=(stream.fileno(), name, self.logs[name], self.segments, self._failed_writing(path)),
                daemon=True,
            )
            for name, stream, path in streams
            if stream is not None
        ]
        for reader in self.readers:
            reader.start()

    def open_metrics(self) -> None:
        """Open ``metrics.jsonl`` for the steps to come, unless it is the framework's own file.

        Called by :meth:`run` after :meth:`start_readers`; :meth:`finish_output` or :meth:`abort`
        closes it.
        """
        if self.write_metrics:
            try:
                self.metrics_file = create_file(self.files.metrics_jsonl)
            except WriteError as exc:  # the trial runs already: the watch ends it
                self.write_failure = self.write_failure or exc

    def start_samplers(self) -> None:
        """Make the samplers for the trial's pid and start them; one that fails is a note, not a failure.

        Called by :meth:`run` inside the guard, after the observer's ``on_started``. Only the samplers
        that started are stopped later (:meth:`stop_samplers`).
        """
        if self.sampler_factory is None:
            return
        try:
            made = list(self.sampler_factory(self.pid))
        except Exception as exc:  # a probe must never take a trial down
            self.notes.append(f"samplers could not be made: {exc}")
            made = []
        for sampler in made:
            try:
                sampler.start()
                self.active_samplers.append(sampler)
            except Exception as exc:  # a probe must never take a trial down
                self.notes.append(f"sampler {type(sampler).__name__} did not start: {exc}")
        live_gpu = [s for s in self.active_samplers if isinstance(s, LiveGpuSamples)]
        if live_gpu and self.watchdog.early_calls:
            self.spin_watch = GpuSpinWatch(live_gpu, self.watchdog.early)

    # -- 4: the watch -------------------------------------------------------------------------------

    def watch(self) -> None:
        """Follow the trial until its process ends or a reason to stop it is set (``live.stopped_by``).

        Called by :meth:`run` inside the guard, once the samplers started. Each turn: handle the queued
        output (or, once both pipes closed, wait for the process), poll the parser's files every poll
        interval, record new descendants in ``proc.json``, then ask the watchdog. Sets ``exited_mono``
        when the process ended by itself. Returns as soon as a stop is decided, leaving the group
        running for :meth:`end_group` and the rest of the output for :meth:`finish_output`.
        """
        poll_s = self.watchdog.poll_interval_s
        last_poll = time.monotonic()
        self._next_scan_mono = last_poll + min(0.2, _DESCENDANT_SCAN_S)
        turn_mono = last_poll
        while True:
            turn_mono = self._note_pause(turn_mono)
            if self.live.open_streams:
                self._drain(deciding=True, wait_s=poll_s)
            else:  # both pipes closed: the process is ending, wait for it rather than for output
                try:
                    self.proc.wait(timeout=poll_s)
                except subprocess.TimeoutExpired:
                    pass
            now = time.monotonic()
            if self.live.stopped_by is None and now - last_poll >= poll_s:
                self._handle_steps(self.parser.poll(now, time.time()), deciding=True)
                last_poll = now
            if now >= self._next_scan_mono:
                self._scan_descendants(now)
            if self.proc.poll() is not None:
                self.exited_mono = time.monotonic()
                return
            if self.live.stopped_by is None:
                self._check_watchdog(now)
            if self.live.stopped_by is not None:
                return

    def _note_pause(self, since_mono: float) -> float:
        """Note when this process itself stood still between two turns (stopped, starved of CPU): the
        trial's output waited meanwhile, so its measured speed may be low. Returns the turn's start."""
        now = time.monotonic()
        gap_s = now - since_mono - self.watchdog.poll_interval_s
        if gap_s >= _PAUSE_NOTE_S:
            self.notes.append(
                f"autotune itself was paused {gap_s:.0f} s while this trial ran (stopped or starved of CPU): "
                "its measured speed may be low; run it again to be sure"
            )
        return now

    def _drain(self, *, deciding: bool, wait_s: float) -> None:
        """Handle queued output; wait up to ``wait_s`` for the first segment.

        While deciding, returns after a poll interval of handling even if more is queued, so a trial
        that prints faster than it can be read still gets its watchdog turn (and is stopped in time).
        """
        try:
            item = self.segments.get(timeout=wait_s) if wait_s > 0 else self.segments.get_nowait()
        except queue.Empty:
            return
        turn_ends = time.monotonic() + self.watchdog.poll_interval_s
        while True:
            self._handle_segment(item, deciding=deciding)
            if deciding and (self.live.stopped_by is not None or time.monotonic() >= turn_ends):
                return  # stop now (or let the watchdog look); the rest is handled later
            try:
                item = self.segments.get_nowait()
            except queue.Empty:
                return

    def _handle_segment(self, item: Segment, *, deciding: bool) -> None:
        """Keep one output segment (tail, evidence), show it to the observer, and feed it to the parser."""
        live = self.live
        stream, text, t_mono, t_wall = item
        if text is None:
            live.open_streams.discard(stream)
            return
        if live.first_output_mono is None:
            live.first_output_mono = t_mono
        short = text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS]
        (live.stdout_tail if stream == "stdout" else live.stderr_tail).append(short)
        if self.evidence_rx.search(text) or self.evidence_rx.search(strip_rank_prefix(text)):
            live.evidence.append(OutputLine(stream, short))
            if live.fatal is None and self.watchdog.early_calls:
                live.fatal = self.fatal_lines.match(text, t_mono, before_first_step=not live.steps)
        if self.on_output is not None:
            self.on_output(stream, text)
        self._handle_steps(self.parser.feed(stream, text, t_mono, t_wall), deciding=deciding)

    def _handle_steps(self, new: Sequence[StepMetrics], *, deciding: bool) -> None:
        """Record new steps (and write them to ``metrics.jsonl``); while ``deciding``, decide on each."""
        if not new:
            return
        live = self.live
        now = time.monotonic()
        for step in new:
            if self._past_max_steps(deciding=deciding):
                continue
            live.steps.append(step)
            live.last_step_mono = now
            if live.first_step_mono is None:
                live.first_step_mono = min(now, step.t_mono_s) if step.t_mono_s >= self.launched_mono else now
            if self.metrics_file is not None:
                try:
                    self.metrics_file.write((_step_json(step) + "\n").encode("utf-8"))
                except OSError as exc:
                    _close_quietly(self.metrics_file)
                    self.metrics_file = None
                    self._failed_writing(self.files.metrics_jsonl)(exc)
            if deciding and live.stopped_by is None:
                self._decide(step)
        durations, _, _ = step_durations(live.steps)
        live.median_step_s = statistics.median(durations) if durations else None

    def _past_max_steps(self, *, deciding: bool) -> bool:
        """Whether a new step is past ``--max-steps`` (it is dropped, and a live trial is ended)."""
        bound, live = self.watchdog.max_steps, self.live
        if bound is None or bound <= 0 or len(live.steps) < bound:
            return False
        if deciding and live.stopped_by is None:
            live.stopped_by = "max_steps"
            live.stop_reason = f"completed {bound} steps (--max-steps; the script went on, it was ended)"
        return True

    def _decide(self, step: StepMetrics) -> None:
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

    def _scan_descendants(self, now: float) -> None:
        """Add descendants not seen before to ``known`` and ``proc.json``; schedule the next scan."""
        fresh = {p: t for p, t in descendants_of(self.pid).items() if p not in self.known}
        # Walking /proc costs ~5 ms per 100 processes: keep it under 2 % of a core on busy hosts.
        self._next_scan_mono = now + max(_DESCENDANT_SCAN_S, 50 * (time.monotonic() - now))
        if fresh:
            self.known.update(fresh)
            self._write_proc()

    def _check_watchdog(self, now: float) -> None:
        """Set a stop reason for the user's interrupt, the wall budget, an early call from evidence
        (:mod:`autotune.trial.early`), the start-up budget or a hang."""
        live, watchdog = self.live, self.watchdog
        if self.write_failure is not None:
            live.stopped_by, live.stop_reason = "write_error", self.write_failure.message
            return
        if self.stop_event is not None and self.stop_event.is_set():
            live.stopped_by, live.stop_reason = "interrupt", "stopped by the user"
            return
        elapsed = now - self.launched_mono
        if watchdog.trial_timeout_s is not None and elapsed >= watchdog.trial_timeout_s:
            live.stopped_by = "timeout"
            live.stop_reason = (
                f"trial wall budget of {watchdog.trial_timeout_s:g} s ran out after {len(live.steps)} steps"
            )
            return
        if watchdog.early_calls and (self._fatal_output(now) or self._hang_from_evidence(now)):
            return
        # "no step" is judged on the output read so far (not on autotune's own lag), and not while the
        # trial writes lines too long to read (a step may be among them: the bound is autotune's)
        now = self._read_up_to(now)
        elapsed = now - self.launched_mono
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

    def _read_up_to(self, now: float) -> float:
        """The clock of the no-step rules: ``now``, moved back to when the oldest output still waiting
        was read (autotune's lag is not the trial's), and as if the last step came with the last line
        too long to read (:mod:`autotune.tail`; a step record may have been among them)."""
        waiting = self.segments.oldest_mono()
        seen = now if waiting is None else min(now, waiting)
        overlong = self.segments.overlong_mono
        if overlong is not None:
            last = self.live.last_step_mono if self.live.last_step_mono is not None else self.launched_mono
            seen = min(seen, now - (overlong - last)) if overlong > last else seen
        return seen

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

    def _hang_from_evidence(self, now: float) -> bool:
        """Call a hang when the GPUs spin at low power, or the log shows a weight sync never ending,
        for longer than the windows of :class:`EarlyCallConfig`; True if called."""
        live, watchdog = self.live, self.watchdog
        last_progress = live.last_step_mono if live.last_step_mono is not None else self.launched_mono
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

    # -- 5-9: after the watch -----------------------------------------------------------------------

    def end_group(self, grace_s: float | None = None) -> list[int]:
        """Stop the trial if it still runs, reap it, end stragglers; return the pids SIGKILLed.

        Called by :meth:`run` after :meth:`watch`, and by :meth:`abort`. Touches only the trial's own
        group and the descendants seen (:func:`terminate_group`), and is safe when the process already
        ended. Afterwards the process is reaped (``proc.returncode`` is set), unless the kernel could
        not deliver SIGKILL: a note says so.
        """
        grace_s = self.watchdog.grace_s if grace_s is None else grace_s
        killed: list[int] = []
        if self.proc.poll() is None:
            self.known.update({p: t for p, t in descendants_of(self.pid).items() if p not in self.known})
        left = outside_group(self.pgid, self.known)  # seen by a scan, but no longer in the trial's group
        if self.proc.poll() is None:
            killed = terminate_group(self.pgid, self.known, grace_s)
        try:
            self.proc.wait(timeout=grace_s + 5)
        except subprocess.TimeoutExpired:  # only if the kernel cannot deliver SIGKILL
            self.notes.append(f"trial process {self.pid} did not exit after SIGKILL")
        # Stragglers left in the group after the main process ended, and escaped descendants.
        killed += [p for p in terminate_group(self.pgid, self.known, grace_s) if p not in killed]
        # Processes that left the group unseen (setsid, double fork) still carry the trial's marker, and
        # stay in the trial's cgroup whatever they did to their environment.
        escaped, survivors = end_marked(self.marker, grace_s)
        escaped += [p for p in left if p not in escaped and p not in alive_pids(left)]
        if self.confinement is not None:
            jailed, stuck = self.confinement.end(grace_s)
            escaped += [p for p in jailed if p not in escaped and p not in killed]
            survivors += [p for p in stuck if p not in survivors]
        if escaped:
            self.notes.append(
                f"ended {len(escaped)} process(es) that had left the trial's process group: "
                + ", ".join(map(str, escaped))
            )
        if survivors:
            self.notes.append("processes of this trial survived SIGKILL: " + ", ".join(map(str, survivors)))
        return killed + [p for p in escaped if p not in killed]

    def finish_output(self) -> None:
        """Handle the output left once the group ended and the parser's last steps; close ``metrics.jsonl``.

        Called by :meth:`run` after :meth:`end_group`. Steps are only recorded now, no longer decided
        on. A reader still blocked after :data:`_READER_JOIN_S` (a process that left the group holds
        its pipe) is left running, and the pipes stay open for it.
        """
        for reader in self.readers:
            reader.join(timeout=_READER_JOIN_S)
        self._drain(deciding=False, wait_s=0)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None and not any(r.is_alive() for r in self.readers):
                stream.close()
        self._handle_steps(self.parser.finish(time.monotonic(), time.time()), deciding=False)
        self._close_metrics()
        self.notes.extend(self.segments.notes())

    def stop_samplers(self) -> list[dict[str, Any]]:
        """Stop the samplers that started and return their rows; one that fails is a note.

        Called by :meth:`run` after :meth:`finish_output`, and by :meth:`abort`.
        """
        rows: list[dict[str, Any]] = []
        for sampler in self.active_samplers:
            try:
                sampler.stop()
                rows.extend(sampler.rows())
            except Exception as exc:  # a probe must never take a trial down
                self.notes.append(f"sampler {type(sampler).__name__} failed: {exc}")
        return rows

    def write_records(self, rows: list[dict[str, Any]]) -> None:
        """Write the samplers' ``rows`` to ``timeline.parquet`` (if any) and the final ``proc.json``.

        Called by :meth:`run` after :meth:`stop_samplers`, once the process is reaped: ``proc.json`` then
        says the trial ended, with its exit code and every descendant seen.
        """
        if rows:
            try:
                _write_timeline(self.files.timeline_parquet, rows)
            except OSError as exc:
                self._failed_writing(self.files.timeline_parquet)(exc)
        self.proc_info.update({"ended": True, "exit_code": self.proc.returncode, "ended_wall_s": time.time()})
        self._write_proc()

    def record(self, *, survivors: list[int], timeline_rows: int, exited_mono: float) -> RunRecord:
        """What was observed, as a :class:`RunRecord`; its ``cleanup_s`` runs from ``exited_mono`` to now.

        Called by :meth:`run` last.

        Args:
            survivors: the pids :meth:`end_group` had to SIGKILL.
            timeline_rows: how many rows the samplers produced.
            exited_mono: when the process ended (by itself, or in :meth:`end_group`).
        """
        live = self.live
        returncode = self.proc.returncode
        launched = self.launched_mono
        startup = None if live.first_step_mono is None else max(0.0, live.first_step_mono - launched)
        open_phase = self.parser.open_phase()
        return RunRecord(
            exit_code=returncode,
            signal=-returncode if returncode is not None and returncode < 0 else None,
            stopped_by=live.stopped_by,
            stop_reason=live.stop_reason,
            steps=live.steps,
            stdout_tail=list(live.stdout_tail),
            stderr_tail=list(live.stderr_tail),
            evidence=list(live.evidence),
            duration_s=exited_mono - launched,
            startup_s=startup,
            started_wall_s=self.started_wall_s,
            pid=self.pid,
            pgid=self.pgid,
            survivors=survivors,
            timeline_rows=timeline_rows,
            estimate=steady_estimate(
                live.steps, self.global_batch, max_warmup=self.early_stop.max_warmup_steps
            ),
            pids_seen=sorted(self.known),
            first_output_s=None if live.first_output_mono is None else live.first_output_mono - launched,
            cleanup_s=time.monotonic() - exited_mono,
            notes=self.notes,
            hang_signal=live.hang_signal,
            stop_evidence=live.stop_evidence,
            open_phase=open_phase.phase if open_phase is not None else None,
        )

    def abort(self, *, forced: bool = False) -> None:
        """End the group, stop the samplers and close ``metrics.jsonl`` after a guarded stage raised.

        Called by :meth:`run`, which then re-raises. Nothing more is recorded: no timeline, and
        ``proc.json`` is left as the watch last wrote it. A ``forced`` stop (KeyboardInterrupt: a second
        Ctrl-C or stop signal) gives the processes only a short grace before SIGKILL, and a further
        interrupt does not cut the clean-up short: it goes on, then the first exception propagates.
        """
        grace_s = _FORCED_GRACE_S if forced else None
        while True:
            try:
                self.end_group(grace_s)
                break
            except KeyboardInterrupt:
                grace_s = _FORCED_GRACE_S
        self.stop_samplers()
        self._close_metrics()

    # -- helpers ------------------------------------------------------------------------------------

    def _close_metrics(self) -> None:
        if self.metrics_file is not None:
            _close_quietly(self.metrics_file)
        if not self.readers:  # the readers close the logs; without readers they are closed here
            for log in self.logs.values():
                _close_quietly(log)

    def _failed_writing(self, path: Path) -> Callable[[OSError], None]:
        """What a failed write of ``path`` calls: the first failure is kept, and the watch ends the trial
        on its next turn (:meth:`_check_watchdog`); :meth:`run` raises it once the trial is cleaned up."""

        def failed(exc: OSError) -> None:
            if self.write_failure is None:
                self.write_failure = WriteError.of(path, exc)

        return failed

    def _write_proc(self) -> None:
        """Write ``proc.json`` with every descendant known so far (what :func:`reap_orphan` reads)."""
        self.proc_info["descendants"] = {str(p): t for p, t in self.known.items() if p != self.pid}
        try:
            write_json_atomic(self.files.proc_json, self.proc_info)
        except WriteError as exc:  # the trial may run already: the watch ends it
            self.write_failure = self.write_failure or exc


def run_trial(
    plan: LaunchPlan,
    parser: StepParser,
    trial_dir: Path,
    *,
    global_batch: int,
    watchdog: WatchdogConfig,
    early_stop: EarlyStopConfig,
    observer: RunObserver | None = None,
    samplers: Callable[[int], Sequence[Sampler]] | None = None,
    stop_event: threading.Event | None = None,
    patterns: Sequence[FailurePattern] = (),
    secrets: SecretRule | None = None,
) -> RunRecord:
    """Run one trial to its end (or ours) and return what was observed.

    Writes into ``trial_dir``: ``launch.json`` and ``command.sh`` (re-run by hand), ``proc.json``
    (pid, pgid, create time, descendants; for :func:`reap_orphan`), ``stdout.log``, ``stderr.log``,
    ``metrics.jsonl`` (every step as a :class:`StepMetrics` JSON line; skipped when the plan's own
    metrics file already has that path) and ``timeline.parquet`` (when samplers produced rows).

    The trial stops on its own, or is stopped (its process group only, see :func:`terminate_group`)
    when: ``stop_event`` is set ("interrupt"); the wall budget runs out ("timeout"); no step arrives
    within the start-up budget ("startup_timeout") or for too long after the last one ("hang"); the
    observer returns a reason ("pruned"); or, with ``early_stop.enabled``, the steady-state estimate
    is stable ("early_stop"). With ``watchdog.early_calls`` (:mod:`autotune.trial.early`) it is also
    stopped a few seconds after a fatal line if it still runs ("fatal_output"), and called hung as soon
    as its GPUs spin at low power or its log shows a weight sync that never ends ("hang", with
    ``hang_signal`` and ``stop_evidence`` saying which). If the calling thread is interrupted (KeyboardInterrupt) or a parser or
    observer raises, the trial is stopped and cleaned up before the exception propagates.

    Args:
        plan: what to start (argv list, never a shell).
        parser: the backend's fresh parser for this trial.
        trial_dir: the trial's directory (created if missing).
        global_batch: completions per step, for throughput.
        watchdog: hang / timeout / kill settings.
        early_stop: steady-state stopping settings.
        observer: the study's hooks (pruning, live table).
        samplers: called with the trial's pid after launch; started, stopped at the end, rows written.
        stop_event: set by another thread to end the trial cleanly as interrupted.
        patterns: extra failure patterns to keep as evidence (the backend's), on top of the common ones;
            with ``watchdog.early_calls`` a line matching any of them is fatal.
        secrets: the secret rule (:mod:`autotune.secrets`): ``launch.json`` and ``command.sh`` never
            hold a secret (the process itself gets the real values).

    Raises:
        LaunchError: the command cannot be started (not found, not executable, too long).
        WriteError: a file of the trial could not be written (disk full, read-only, no permission):
            the trial is ended and cleaned up first (the pipes are drained meanwhile), then this is
            raised; the study stops.
    """
    return TrialRun(
        plan,
        parser,
        trial_dir,
        global_batch=global_batch,
        watchdog=watchdog,
        early_stop=early_stop,
        observer=observer,
        samplers=samplers,
        stop_event=stop_event,
        patterns=patterns,
        secrets=secrets,
    ).run()
