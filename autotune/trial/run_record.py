"""What the trial runner observed: its hooks (:class:`RunObserver`, :class:`Sampler`) and its record of
one trial (:class:`RunRecord`, the input of :func:`autotune.trial.outcome.classify`), and how its steps
and sampler rows are written to the trial's files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol, runtime_checkable

from autotune.records import SteadyEstimate, StepMetrics

__all__ = [
    "EVIDENCE_LINES",
    "TAIL_LINES",
    "OutputLine",
    "RunObserver",
    "RunRecord",
    "Sampler",
    "step_json",
    "write_timeline",
]

TAIL_LINES = 400  # lines of each stream kept in memory for classification
EVIDENCE_LINES = 200  # failure-pattern lines kept in memory (the logs keep everything)


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


def write_timeline(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write sampler rows as parquet (through ``probes.timeline`` when it is there)."""
    try:
        from autotune.probes.timeline import write_timeline as write
    except ImportError:
        import pandas as pd

        pd.DataFrame(rows).to_parquet(path, index=False)
        return
    write(path, rows)


def step_json(step: StepMetrics) -> str:
    """One step as a ``metrics.jsonl`` line (without its newline)."""
    # json.dumps keeps NaN/inf as NaN/Infinity tokens (Python and pydantic read them back); the health
    # gate needs them, and pydantic's own JSON would turn them into null.
    return json.dumps(step.model_dump(mode="python"), allow_nan=True)
