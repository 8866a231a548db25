"""The re-measurement after the search: the winner, the baseline and close runners-up, run again,
interleaved, so the speedup the study reports survives a second look.

A search keeps the fastest of many noisy single runs, so its winner's number is biased upwards (the
winner's curse) and its baseline's was measured at another moment, under another load. The
re-measurement runs every compared configuration once per round, the order reversed every other round
(B W R, R W B, ...: each configuration runs as often early as late, so a load that rises or falls through
the re-measurement biases none of them), with the same executor as a trial. Only these runs enter the
interval (:mod:`autotune.study.verdict`): the search's runs of the same configurations are selected or
were measured apart.

The runs are not trials: no Optuna trial, no trial slot. Each is stored in its own directory,
``trials/confirm-<trial>-<round>/`` (:meth:`autotune.studydir.StudyDir.confirm_dir`), with a RUNNING
record while it runs, so a resumed study keeps what finished and runs again what was interrupted.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.records import ConfirmRun, Recommendation, TrialResult, TrialStatus
from autotune.space import canonical_key
from autotune.studydir import StudyDir
from autotune.trial.hostload import host_load

__all__ = [
    "NOISE_FLOOR",
    "MAX_RUNNERS_UP",
    "ConfirmTask",
    "runners_up",
    "schedule",
    "Confirmer",
    "to_run",
    "runs_cost",
]

#: A runner-up is re-measured when its throughput is within this share of the winner's, or within the
#: two trials' own 95 % intervals when those are wider.
NOISE_FLOOR = 0.05
#: At most this many runners-up are re-measured (each costs a run per round).
MAX_RUNNERS_UP = 2


@dataclass(frozen=True)
class ConfirmTask:
    """One run of the re-measurement schedule.

    Attributes:
        trial: the search trial whose configuration runs again.
        round: the round (1-based).
        order: position in the whole schedule (1-based).
        role: ``baseline``, ``winner`` or ``runner_up``.
        params: the configuration.
        is_baseline: True for the baseline's runs (the executor's health gate reads it).
        expected_s: how long the configuration's search run took (a run is not started with less
            time left in the study's budget: it would be cut short).
    """

    trial: int
    round: int
    order: int
    role: str
    params: dict[str, Any] = field(hash=False)
    is_baseline: bool = False
    expected_s: float = 0.0


def runners_up(
    results: Sequence[TrialResult],
    rec: Recommendation,
    usable: Callable[[TrialResult], bool],
    *,
    limit: int = MAX_RUNNERS_UP,
) -> list[TrialResult]:
    """Usable trials (not the winner, not the baseline) whose throughput is within the noise of the
    winner's, closest first, at most ``limit``."""
    by_number = {r.number: r for r in results}
    winner = by_number.get(rec.trial)
    if winner is None or not winner.throughput or winner.steady is None:
        return []
    close = []
    for r in results:
        if r.number in (rec.trial, rec.baseline_trial) or not usable(r) or r.steady is None:
            continue
        noise = max(NOISE_FLOOR, winner.steady.rel_ci95 + r.steady.rel_ci95)
        if (r.throughput or 0.0) >= winner.throughput * (1 - noise):
            close.append(r)
    close.sort(key=lambda r: -(r.throughput or 0.0))
    return close[:limit]


def schedule(
    baseline: TrialResult, winner: TrialResult, others: Sequence[TrialResult], rounds: int
) -> list[ConfirmTask]:
    """The interleaved runs: baseline, winner, runners-up; the order reversed every other round."""
    configs = [(baseline, "baseline"), (winner, "winner"), *((r, "runner_up") for r in others)]
    tasks: list[ConfirmTask] = []
    for k in range(1, rounds + 1):
        for r, role in configs if k % 2 else reversed(configs):
            tasks.append(
                ConfirmTask(
                    trial=r.number,
                    round=k,
                    order=len(tasks) + 1,
                    role=role,
                    params=dict(r.params),
                    is_baseline=role == "baseline",
                    expected_s=r.duration_s,
                )
            )
    return tasks


def to_run(task: ConfirmTask, result: TrialResult) -> ConfirmRun:
    """The record of one finished run."""
    load = host_load(result.timeline_summary)
    steady = result.steady
    return ConfirmRun(
        trial=task.trial,
        round=task.round,
        order=task.order,
        role=task.role,
        status=result.status,
        step_time_s=steady.step_time_s if steady else None,
        rel_ci95=steady.rel_ci95 if steady else None,
        steady_steps=steady.steady_steps if steady else 0,
        throughput=steady.throughput if steady else None,
        duration_s=result.duration_s,
        gpu_seconds=result.gpu_seconds,
        other_busy_cores=load.other_busy_cores if load else None,
        host_loaded=bool(load and load.loaded),
    )


#: Runs a task in a directory with the time left (None: no budget) and returns its result.
Launch = Callable[[ConfirmTask, Path, float | None], TrialResult]


@dataclass
class Confirmer:
    """Runs a re-measurement schedule, keeping the runs a study directory already holds.

    Args:
        study_dir: the study directory (each run's record goes to its ``confirm-<trial>-<round>/``).
        launch: starts one run and returns its result (the study's executor, never pruning).
        time_left: seconds left of the study's time budget, or None without one.
        interrupted: True once the user asked the study to stop.
        reaper: ends a run's process group left by a killed autotune (given the run's directory).
        notice: one line for the live view.
        ran: called once per run that ended or was found finished on disk (the live view's ETA).
    """

    study_dir: StudyDir
    launch: Launch
    time_left: Callable[[], float | None] = lambda: None
    interrupted: Callable[[], bool] = lambda: False
    reaper: Callable[[Path], str | None] | None = None
    notice: Callable[[str], None] = lambda text: None
    ran: Callable[[], None] = lambda: None

    def run(self, tasks: Sequence[ConfirmTask]) -> tuple[list[ConfirmRun], str | None, bool]:
        """Run (or take from disk) every task in order.

        Returns:
            (the runs that ended, in schedule order; why the schedule is incomplete or None; whether the
            user interrupted it).
        """
        runs: list[ConfirmRun] = []
        for task in tasks:
            done = self._stored(task)
            if done is not None:
                runs.append(to_run(task, done))
                self.ran()
                continue
            if self.interrupted():
                return runs, "stopped by the user", True
            left = self.time_left()
            if left is not None and (left <= 0 or left < task.expected_s):
                return runs, "the time budget ran out", False
            result = self._run(task, left)
            runs.append(to_run(task, result))
            self.ran()
            if result.status is TrialStatus.INTERRUPTED:
                if self.interrupted():
                    return runs, "stopped by the user", True
                return runs, "the time budget ran out", False  # the executor's cut at the study's budget
        return runs, None, False

    def _stored(self, task: ConfirmTask) -> TrialResult | None:
        """The task's finished run on disk (same configuration), else None."""
        stored = self.study_dir.read_confirm_result(task.trial, task.round)
        if stored is None or stored.status in (TrialStatus.RUNNING, TrialStatus.INTERRUPTED):
            return None
        return stored if canonical_key(stored.params) == canonical_key(task.params) else None

    def _run(self, task: ConfirmTask, left: float | None) -> TrialResult:
        directory = self.study_dir.confirm_dir(task.trial, task.round)
        if directory.is_symlink():
            directory.unlink()  # never ours: the link goes, its target is untouched
        elif directory.exists():
            # an interrupted run (or another configuration's, before a resumed search changed the
            # winner): end what may be left of it, then start from an empty directory
            if self.reaper is not None:
                note = self.reaper(directory)
                if note:
                    self.notice(f"re-measurement run {directory.name}: {note}")
            shutil.rmtree(directory)
        self.study_dir.own_dir(directory)
        self.study_dir.write_confirm_result(
            TrialResult.running(task.trial, task.params, is_baseline=task.is_baseline, reason="re-measuring"),
            task.round,
        )
        self.notice(f"re-measuring trial {task.trial} ({task.role.replace('_', '-')}), round {task.round}")
        result = self.launch(task, directory, left)
        self.study_dir.write_confirm_result(result, task.round)
        tp = f"{result.throughput:.3g} completions/s" if result.throughput else result.status.value
        self.notice(f"re-measured trial {task.trial}, round {task.round}: {tp} ({result.duration_s:.1f}s)")
        return result


def runs_cost(runs: Sequence[ConfirmRun]) -> tuple[float, float]:
    """(wall seconds, GPU seconds) of the runs."""
    return sum(r.duration_s for r in runs), sum(r.gpu_seconds for r in runs)
