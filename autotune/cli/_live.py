"""The live view of a study: a table of trials, the running trials' GPUs and an overall progress bar
with an ETA that counts the re-measurement runs (rich)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from autotune.cli._gpus import GpuPanel
from autotune.plaintext import plain
from autotune.records import TrialResult, TrialStatus
from autotune.trial.live import LiveGpus

__all__ = ["RichView", "short_params"]

_STYLE = {
    TrialStatus.COMPLETE: "green",
    TrialStatus.RUNNING: "cyan",
    TrialStatus.PRUNED: "dim",
    TrialStatus.INTERRUPTED: "yellow",
}


def _rollout_share(result: TrialResult) -> float | None:
    """The share of the step the trial spent generating (its timeline's rollout phase), when measured."""
    if result.timeline_summary is None:
        return None
    share = result.timeline_summary.phases.share_fraction.get("rollout")
    return float(share) if share is not None else None


def short_params(params: Mapping[str, Any], limit: int = 6, labels: Mapping[str, str] | None = None) -> str:
    """Key knobs as ``label=value`` pairs (the space's short labels), shortened for a table cell."""
    abbrev = labels or {}
    parts = []
    for k, v in list(params.items())[:limit]:
        if isinstance(v, bool):
            v = "on" if v else "off"
        elif isinstance(v, float):
            v = f"{v:g}"
        parts.append(f"{abbrev.get(k, k)}={v}")
    if len(params) > limit:
        parts.append("…")
    return " ".join(parts)


class RichView:
    """Renders the study live on a terminal; prints one line per trial elsewhere (CI logs).

    Args:
        console: where it draws.
        gpu_lines_every_s: without a terminal, seconds between two lines of each running trial's GPUs.
    """

    def __init__(self, console: Console, gpu_lines_every_s: float = 30.0) -> None:
        self.console = console
        self.gpus = GpuPanel(console, LiveGpus(), every_s=gpu_lines_every_s)
        self.remeasure_runs = 0
        self.remeasuring: tuple[int, int] | None = None  # (runs done, runs in all) once it started
        self.rows: dict[int, dict[str, Any]] = {}
        self.live: Live | None = None
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
        )
        self.task = self.progress.add_task("trials", total=1)
        self.started = time.monotonic()
        self.labels: dict[str, str] = {}

    def use_labels(self, labels: Mapping[str, str]) -> None:
        """Short names of the knobs (from the search space), for the table and the trial lines."""
        self.labels = dict(labels)

    def gpu_board(self) -> LiveGpus:
        """The board the executors put their running trials' GPUs on."""
        return self.gpus.board

    # StudyView protocol ---------------------------------------------------------------------
    def study_started(self, cfg: Any, done: int, budget: int) -> None:
        # the winner and the baseline are re-measured (--confirm-runs) after the trials: the ETA
        # counts those runs from the start (runners-up, when there are any, once they are known)
        self.remeasure_runs = 2 * max(0, int(getattr(cfg, "confirm_runs", 0) or 0))
        self._retotal(max(budget, done), done)
        if self.console.is_terminal and self.live is None:  # workers of one process share one view
            self.live = Live(
                console=self.console, refresh_per_second=4, transient=False, get_renderable=self._render
            )
            self.live.start()
        elif self.live is None:
            self.gpus.start()
            if self.remeasure_runs:
                self.console.print(
                    f"the ETA counts {self.remeasure_runs} re-measurement runs after the trials (--confirm-runs)",
                    markup=False,
                    highlight=False,
                )

    def remeasure_started(self, runs: int) -> None:
        done = int(next(t.completed for t in self.progress.tasks if t.id == self.task))
        self.remeasure_runs = runs
        self.remeasuring = (0, runs)
        self._retotal(done, done)
        if self.live is None:
            self.console.print(self._remeasure_text(), markup=False, highlight=False)
        self._refresh()

    def remeasure_ran(self) -> None:
        self.progress.advance(self.task)
        if self.remeasuring is not None:
            self.remeasuring = (self.remeasuring[0] + 1, self.remeasuring[1])
            if self.live is None:
                self.console.print(self._remeasure_text(), markup=False, highlight=False)
        self._refresh()

    def _remeasure_text(self) -> str:
        """What the study is doing after its trials, in one line."""
        done, runs = self.remeasuring or (0, 0)
        return (
            "re-measuring: the winner and the baseline run again, interleaved, to judge the speedup:"
            f" {done} of {runs} runs done (counted in the ETA)"
        )

    def _retotal(self, trials: int, done: int) -> None:
        extra = f" + {self.remeasure_runs} re-measurement runs" if self.remeasure_runs else ""
        self.progress.update(
            self.task, description=f"trials{extra}", total=trials + self.remeasure_runs, completed=done
        )

    def trial_started(self, number: int, params: Mapping[str, Any], is_baseline: bool) -> None:
        self.rows[number] = {
            "params": dict(params),
            "status": TrialStatus.RUNNING,
            "tp": None,
            "mem": None,
            "step": 0,
            "baseline": is_baseline,
        }
        if self.live is None:
            tag = " (baseline)" if is_baseline else ""
            self.console.print(
                f"trial {number}{tag}: {short_params(params, 12, self.labels)}", markup=False, highlight=False
            )
        self._refresh()

    def trial_step(self, number: int, step: int, throughput: float | None) -> None:
        row = self.rows.get(number)
        if row is not None:
            row["step"] = step
            row["tp"] = throughput
            self._refresh()

    def trial_finished(self, result: TrialResult) -> None:
        peak = max((p for p in result.peak_mem_bytes if p is not None), default=None)
        if peak is None:
            peak = result.host_peak_rss_bytes
        self.rows[result.number] = {
            "params": result.params,
            "status": result.status,
            "tp": result.throughput,
            "mem": peak,
            "step": result.steps,
            "baseline": result.is_baseline,
            "reason": result.reason,
            "counted": result.steps > 0 or result.status is not TrialStatus.PRUNED,
            "rollout": _rollout_share(result),
        }
        if self.rows[result.number]["counted"]:
            self.progress.advance(self.task)
        if self.live is None:
            tp = f"{result.throughput:.3g} completions/s" if result.throughput else "—"
            share = self.rows[result.number]["rollout"]
            gen = f", generation {share:.0%} of the step" if share is not None else ""
            self.console.print(
                f"trial {result.number}: {result.status.value} {tp} ({result.steps} steps, {result.duration_s:.1f}s{gen}): {plain(result.reason)}",
                markup=False,
                highlight=False,
            )
        self._refresh()

    def notice(self, text: str) -> None:
        self.console.print(f"note: {plain(text)}", markup=False, highlight=False, style="yellow")

    def close(self) -> None:
        self.gpus.stop()
        if self.live is not None:
            self.live.refresh()
            self.live.stop()
            self.live = None

    # rendering -------------------------------------------------------------------------------
    def _refresh(self) -> None:
        if self.live is not None:
            self.live.refresh()

    def _render(self) -> Group:
        table = Table(
            "#", "knobs", "status", "steps", "completions/s", "generation", "peak mem", expand=False
        )
        rows = dict(self.rows)  # worker threads add rows while this draws
        for n in sorted(rows)[-20:]:
            row = rows[n]
            status: TrialStatus = row["status"]
            tp = f"{row['tp']:.3g}" if row["tp"] else "—"
            mem = f"{row['mem'] / 2**30:.2f} GiB" if row["mem"] else "—"
            label = f"{n}*" if row["baseline"] else str(n)
            table.add_row(
                label,
                Text(short_params(row["params"], labels=self.labels)),
                Text(status.value, style=_STYLE.get(status, "red")),
                str(row["step"]),
                tp,
                f"{row['rollout']:.0%}" if row.get("rollout") is not None else "—",
                mem,
            )
        parts: list[Any] = [table]
        gpus = self.gpus.table()
        if gpus is not None:
            parts.append(gpus)
        if self.remeasuring is not None:
            parts.append(Text(self._remeasure_text(), style="cyan"))
        return Group(*parts, self.progress)
