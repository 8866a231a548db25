"""Run one trial as a child process in its own session; watch it; stop it; clean up after it.

Who calls what:

- The study calls :func:`run_trial` once per trial, from one thread; it runs a :class:`TrialRun`, whose
  methods are the stages in order. The trial starts in a new session (its own process group,
  ``pgid == pid``), with the plan's environment on top of ours, its stdout and stderr streamed to
  ``stdout.log`` / ``stderr.log`` by two reader threads. The calling thread runs the watch loop: it
  feeds every output segment to the backend's parser, polls the parser's metric files, writes
  ``metrics.jsonl``, asks the observer whether to prune, stops at steady state, and stops hangs.
- Stopping only ever touches the trial's own process group, the descendants seen during the run, what
  carries the trial's marker and what is left in its cgroup (:func:`~autotune.trial.processes.end_trial`).
  Nothing is ever matched by name.
- :func:`reap_orphan` ends a trial group left behind when autotune itself was killed with SIGKILL;
  the study calls it on resume. It relies on ``proc.json`` (pid, pgid, create time) in the trial dir.

Beside it: :mod:`~autotune.trial.launch` starts the process, :mod:`~autotune.tail` reads its pipes,
:mod:`~autotune.trial.watchdog` holds the stop rules, :mod:`~autotune.trial.run_record` what is observed.
The runner decides *when* to stop; :mod:`autotune.trial.outcome` decides what the trial's end means.
"""

from __future__ import annotations

import queue
import re
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from autotune.affinity import parse_cores, pin
from autotune.backends._base import FailurePattern, StepParser
from autotune.errors import LaunchError, WriteError
from autotune.records import LaunchPlan, StepMetrics
from autotune.secrets import SecretRule
from autotune.studydir import TrialDir, create_file, write_json_atomic, write_text_atomic
from autotune.tail import OutputQueue, Segment, close_quietly, pump_pipe
from autotune.trial.confine import Confinement
from autotune.trial.early import EarlyCallConfig, FatalLines, LiveGpuSamples
from autotune.trial.evidence import COMMON_PATTERNS, strip_rank_prefix
from autotune.trial.launch import effective_plan, proc_info, start_process
from autotune.trial.processes import (
    alive_pids,
    create_time_of,
    descendants_of,
    end_trial,
    new_marker,
    reap_orphan,
    terminate_group,
)
from autotune.trial.run_record import OutputLine, RunObserver, RunRecord, Sampler, step_json, write_timeline
from autotune.trial.steady import EarlyStopConfig, steady_estimate, step_durations
from autotune.trial.watchdog import (
    LiveState,
    StopRules,
    WatchdogConfig,
    default_startup_timeout_s,
    default_trial_timeout_s,
)

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
    "default_trial_timeout_s",
    "reap_orphan",
    "run_trial",
    "terminate_group",
]

_FORCED_GRACE_S = 0.5  # SIGTERM → SIGKILL when the user forces a stop
MAX_LINE_CHARS = 4000  # longer lines are cut in memory (not in the logs)
#: a pause of autotune's own loop this long is noted on the trial (its measurement waited meanwhile)
_PAUSE_NOTE_S = 5.0
_DESCENDANT_SCAN_S = 1.0  # how often the process tree is walked (psutil, a few ms each)
_READER_JOIN_S = 5.0


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
        self.plan = effective_plan(plan)
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
        self.live = LiveState()
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
        self.rules = StopRules(
            self.live,
            watchdog=watchdog,
            early_stop=early_stop,
            parser=parser,
            observer=observer,
            global_batch=global_batch,
            stop_event=stop_event,
        )

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
            self.proc = start_process(plan, marker=self.marker, confinement=confinement)
        except LaunchError:
            confinement.close()
            for log in self.logs.values():
                close_quietly(log)
            raise
        self.pid = self.pgid = self.proc.pid  # start_new_session: the child leads its session and group
        # a CPU-only trial's cores: pinned before the child has started anything (its children inherit)
        self.affinity_note = pin(self.pid, parse_cores(plan.env))
        confinement.launched(self.pid)
        self.known[self.pid] = create_time_of(self.pid)
        self.proc_info = proc_info(
            plan,
            self.pid,
            started_wall_s=self.started_wall_s,
            create_time=self.known[self.pid],
            marker=self.marker,
            confinement=confinement,
            affinity_note=self.affinity_note,
        )
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
        self.rules.watch_gpus([s for s in self.active_samplers if isinstance(s, LiveGpuSamples)])

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

    def _check_watchdog(self, now: float) -> None:
        """Ask the stop rules: the limits and early calls first, then whether steps still come."""
        if not self.rules.check_limits(
            now, launched_mono=self.launched_mono, write_failure=self.write_failure
        ):
            # "no step" is judged on the output read so far (not on autotune's own lag), and not while
            # the trial writes lines too long to read (a step may be among them: the bound is autotune's)
            self.rules.check_progress(self._read_up_to(now), launched_mono=self.launched_mono)

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
            if self.rules.past_max_steps(deciding=deciding):
                continue
            live.steps.append(step)
            live.last_step_mono = now
            if live.first_step_mono is None:
                live.first_step_mono = min(now, step.t_mono_s) if step.t_mono_s >= self.launched_mono else now
            if self.metrics_file is not None:
                try:
                    self.metrics_file.write((step_json(step) + "\n").encode("utf-8"))
                except OSError as exc:
                    close_quietly(self.metrics_file)
                    self.metrics_file = None
                    self._failed_writing(self.files.metrics_jsonl)(exc)
            if deciding and live.stopped_by is None:
                self.rules.decide(step)
        durations, _, _ = step_durations(live.steps)
        live.median_step_s = statistics.median(durations) if durations else None

    def _scan_descendants(self, now: float) -> None:
        """Add descendants not seen before to ``known`` and ``proc.json``; schedule the next scan."""
        fresh = {p: t for p, t in descendants_of(self.pid).items() if p not in self.known}
        # Walking /proc costs ~5 ms per 100 processes: keep it under 2 % of a core on busy hosts.
        self._next_scan_mono = now + max(_DESCENDANT_SCAN_S, 50 * (time.monotonic() - now))
        if fresh:
            self.known.update(fresh)
            self._write_proc()

    # -- 5-9: after the watch -----------------------------------------------------------------------

    def end_group(self, grace_s: float | None = None) -> list[int]:
        """Stop the trial if it still runs, reap it, end stragglers; return the pids SIGKILLed.

        Called by :meth:`run` after :meth:`watch`, and by :meth:`abort`; see
        :func:`~autotune.trial.processes.end_trial`.
        """
        grace_s = self.watchdog.grace_s if grace_s is None else grace_s
        end = end_trial(
            self.proc, self.known, marker=self.marker, confinement=self.confinement, grace_s=grace_s
        )
        self.notes.extend(end.notes)
        return end.killed_pids

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
                write_timeline(self.files.timeline_parquet, rows)
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
            close_quietly(self.metrics_file)
        if not self.readers:  # the readers close the logs; without readers they are closed here
            for log in self.logs.values():
                close_quietly(log)

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
