"""The finish of the study loop: the recommendation decided, re-measured against the baseline (the
time it needs kept from the budget) and stored in ``study.json`` with the outcome."""

from __future__ import annotations

import time
from pathlib import Path

from autotune.recommend import Recommendation, headline, recommend
from autotune.records import Confirmation, TrialResult, TrialSpec, TrialStatus
from autotune.study.config import StudyOutcome, free_port
from autotune.study.confirm import Confirmer, ConfirmTask, runners_up, runs_cost, schedule
from autotune.study.optuna_view import MachineAttrs
from autotune.study.prescreen import Prescreen
from autotune.study.state import LoopState, Stop, StudyPart, StudyState
from autotune.study.verdict import METHOD, judge, not_remeasured
from autotune.studysettings import StudySettings

__all__ = ["Finisher"]


class Finisher(StudyPart):
    """Ends a study: decides, re-measures and stores the recommendation.

    Args:
        state: the study's shared state (settings, backend, executor, view, memory gate, hygiene, the
            user's interrupt, reaper, clock, results so far).
        screen: the study's pre-screen (a run's context, whether a result is usable).
    """

    def __init__(self, state: StudyState, screen: Prescreen) -> None:
        super().__init__(state)
        self.screen = screen

    def finish(self, loop: LoopState, stop: Stop) -> StudyOutcome:
        """Decide the recommendation, re-measure it (unless the user stopped the study) and store it in
        ``study.json`` with the outcome (the caller has taken in the other workers' trials)."""
        final = not loop.running
        results = sorted(self._results.values(), key=lambda r: r.number)
        rec = recommend(results, self.cfg.hardware, min_headroom_frac=self.cfg.min_headroom_frac)
        if rec is not None:
            if stop.stopped == "interrupted":
                rec = not_remeasured(rec, "the study was stopped before the re-measurement")
            elif not final:
                rec = not_remeasured(
                    rec, "other workers were still running trials: the last one to finish re-measures"
                )
            else:
                rec, interrupted = self._confirm(loop, rec, results)
                if interrupted:
                    stop = Stop("interrupted", "stopped by the user during the re-measurement")
        confirmation = rec.confirmation if rec is not None else None
        settings = loop.settings
        settings["finished_wall_s"] = time.time()
        settings["outcome"] = {
            "stopped": stop.stopped,
            "detail": stop.detail,
            "trials_run": loop.launched_total,
            "trials_run_now": loop.run_now,
            "gpu_seconds": sum(r.gpu_seconds for r in results)
            + (confirmation.gpu_seconds if confirmation else 0.0),
            "trial_seconds": sum(r.duration_s for r in results),
            "confirm_seconds": confirmation.duration_s if confirmation else 0.0,
            "confirm_gpu_seconds": confirmation.gpu_seconds if confirmation else 0.0,
            "recommended_trial": rec.trial if rec else None,
        }
        settings["recommendation"] = rec.model_dump(mode="json") if rec is not None else None
        if self.memory_gate is not None:
            settings["calibration"] = self.memory_gate.state()
        self.dir.write_settings(StudySettings.from_json(settings))
        if final:
            MachineAttrs(loop.study).set("settings", settings)
        return StudyOutcome(
            results=results,
            recommendation=rec,
            stopped=stop.stopped,
            detail=stop.detail,
            trials_run_now=loop.run_now,
            trials_run=loop.launched_total,
            budget_trials=self.cfg.n_trials,
            final=final,
        )

    def _confirm(
        self, loop: LoopState, rec: Recommendation, results: list[TrialResult]
    ) -> tuple[Recommendation, bool]:
        """Re-measure the winner against the baseline (and close runners-up), interleaved, and judge.

        Returns:
            (the recommendation with its verdict, whether the user stopped the re-measurement).
        """
        n = self.cfg.confirm_runs
        if n <= 0:
            return not_remeasured(rec, "re-measurement off (--confirm-runs 0)"), False
        tasks = self.confirm_tasks(rec, results)
        if isinstance(tasks, str):
            return not_remeasured(rec, tasks), False
        runner = Confirmer(
            self.dir,
            self._launch_confirm,
            time_left=lambda: self.budget_left_s(loop),
            interrupted=self.interrupted,
            reaper=self.reaper,
            notice=self.view.notice,
            ran=self.view.remeasure_ran,
        )
        self.view.remeasure_started(len(tasks))
        compared = ", ".join(f"trial {t.trial}" for t in tasks if t.round == 1)
        self.view.notice(f"re-measuring {compared}: {n} interleaved run(s) of each")
        runs, note, interrupted = runner.run(tasks)
        duration_s, gpu_s = runs_cost(runs)
        confirmation = Confirmation(
            rounds=n, runs=runs, duration_s=duration_s, gpu_seconds=gpu_s, method=METHOD, note=note
        )
        judged = judge(rec, confirmation, {r.number: r for r in results}, self.cfg.hardware)
        self.view.notice(headline(judged))
        return judged, interrupted

    def _launch_confirm(self, task: ConfirmTask, directory: Path, time_left_s: float | None) -> TrialResult:
        """One re-measurement run through the study's executor (never pruned: it is a measurement)."""
        ctx = self.screen.context(directory, master_port=free_port())
        derived = self.backend.derive(dict(task.params), ctx)
        spec = TrialSpec(number=task.trial, params=task.params, derived=derived, is_baseline=task.is_baseline)
        if self.hygiene is not None:
            self.hygiene()
        return self.executor.execute(
            spec, ctx, on_step=lambda step, throughput, optimistic: None, time_left_s=time_left_s
        )

    def confirm_reserve_s(self) -> float:
        """Time to keep for the re-measurement the results so far would need: its runs at the durations
        their search runs took (0 when it is off or there is nothing to re-measure yet)."""
        if self.cfg.confirm_runs <= 0:
            return 0.0
        results = sorted(self._results.values(), key=lambda r: r.number)
        rec = recommend(results, self.cfg.hardware, min_headroom_frac=self.cfg.min_headroom_frac)
        tasks = self.confirm_tasks(rec, results) if rec is not None else "nothing recommended yet"
        return 0.0 if isinstance(tasks, str) else sum(t.expected_s for t in tasks)

    def confirm_tasks(self, rec: Recommendation, results: list[TrialResult]) -> list[ConfirmTask] | str:
        """The re-measurement's runs, or why there is none."""
        by_number = {r.number: r for r in results}
        base = by_number.get(rec.baseline_trial) if rec.baseline_trial is not None else None
        if rec.trial == rec.baseline_trial:
            return "the baseline is the winner"
        if base is None or base.status is not TrialStatus.COMPLETE:
            return "the baseline did not complete"
        others = runners_up(results, rec, self.screen.usable)
        return schedule(base, by_number[rec.trial], others, self.cfg.confirm_runs)

    def budget_left_s(self, loop: LoopState) -> float | None:
        """What is left of the time budget (may be negative), or None without one."""
        if self.cfg.time_budget_s is None:
            return None
        return self.cfg.time_budget_s - (self.clock() - loop.start_s)
