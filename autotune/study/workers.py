"""The workers side of the study loop: a shared study's running trials, queue and finished results taken
in from the storage, and the trials of workers that stopped beating recovered."""

from __future__ import annotations

import contextlib
import datetime
import time
from collections.abc import Callable
from typing import Any

import optuna

from autotune.records import TrialResult, TrialStatus
from autotune.space import canonical_key
from autotune.study.state import LoopState, StudyPart, StudyState
from autotune.study.storage import fail_stale, grace_s, live_workers
from autotune.study.tell import counts_in_budget, interrupted_result, stored_result

__all__ = ["Workers"]


class Workers(StudyPart):
    """What this worker learns of the others through the storage, and what it recovers of dead ones.

    Args:
        state: the study's shared state (settings, space, view, reaper, clock, results so far).
        learn: called with every result taken in from the storage (the memory gate and the strategy
            learn from it).
    """

    def __init__(self, state: StudyState, learn: Callable[[TrialResult], None]) -> None:
        super().__init__(state)
        self.learn = learn
        self.stale: list[optuna.trial.FrozenTrial] = []  # trials whose worker died, to requeue

    def recover(self, study: optuna.Study) -> list[dict[str, Any]]:
        """Mark trials left RUNNING by a killed tuner as interrupted; return their params to re-run.

        A shared study's running trials may be other workers' live ones: only those whose worker
        stopped beating are recovered (:meth:`recover_stale`), and they are queued in the storage for
        any worker.
        """
        if self.cfg.shared:
            self.recover_stale(study)
            return []
        rerun: list[dict[str, Any]] = []
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            trial_dir = self.dir.trial_dir(t.number)
            note = self.reaper(trial_dir) if self.reaper else None
            params = self.space.active(t.params)
            reason = "autotune was stopped while this trial ran; it says nothing about the configuration"
            if note:
                reason += f" ({note})"
            existing = self.dir.read_result(t.number)
            if existing is None or existing.status is TrialStatus.RUNNING:
                result = interrupted_result(t, params, reason)
                self.dir.write_result(result)
                self._results[t.number] = result
            study.tell(t.number, state=optuna.trial.TrialState.FAIL)
            self.view.notice(
                f"trial {t.number} was left running by a stopped autotune: marked interrupted, will run again"
            )
            rerun.append(params)
        return rerun

    def recover_stale(self, study: optuna.Study) -> None:
        """Fail the trials of workers that stopped beating, mark them interrupted and queue them again."""
        fail_stale(study)
        # a running trial no worker claimed (left by an autotune before workers, or by a worker killed
        # between asking for it and naming itself) never beats: stale once its grace has passed
        cutoff = datetime.datetime.now() - datetime.timedelta(seconds=grace_s())
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            if "worker" not in t.user_attrs and t.datetime_start is not None and t.datetime_start < cutoff:
                with contextlib.suppress(
                    optuna.exceptions.UpdateFinishedTrialError, RuntimeError, ValueError
                ):
                    study.tell(t.number, state=optuna.trial.TrialState.FAIL)
                    self.stale.append(t)
        while self.stale:
            t = self.stale.pop(0)
            worker = (t.user_attrs.get("worker") or {}).get("name", "a worker")
            trial_dir = self.dir.trial_dir(t.number)
            note = self.reaper(trial_dir) if self.reaper and trial_dir.is_dir() else None
            params = self.space.active(t.params)
            reason = f"its worker ({worker}) stopped beating; it says nothing about the configuration"
            if note:
                reason += f" ({note})"
            result = interrupted_result(t, params, reason)
            if trial_dir.is_dir():
                existing = self.dir.read_result(t.number)
                if existing is None or existing.status is TrialStatus.RUNNING:
                    self.dir.write_result(result)
            self._results[t.number] = result
            if params:
                study.enqueue_trial(
                    params,
                    user_attrs={"is_baseline": result.is_baseline, "requeued_from": t.number},
                    skip_if_exists=False,
                )
            self.view.notice(
                f"trial {t.number} of worker {worker}, which stopped beating: marked interrupted, queued again"
            )

    def sync(self, loop: LoopState) -> None:
        """Take in what the other workers of a shared study did: their finished trials' results (from
        the storage), their running trials and the queue; recover the trials of dead workers.

        The budget counts the study's trials, the running ones included, and the time budget counts from
        the start of the oldest live worker.
        """
        if not self.cfg.shared:
            return
        self.recover_stale(loop.study)
        running: dict[int, str] = {}
        queued: set[str] = set()
        for t in loop.study.get_trials(deepcopy=False):
            if t.state is optuna.trial.TrialState.RUNNING:
                if t.params:
                    running[t.number] = canonical_key(self.space.active(t.params))
                continue
            if t.state is optuna.trial.TrialState.WAITING:  # enqueued: its configuration is a system attr
                fixed = t.system_attrs.get("fixed_params")
                if isinstance(fixed, dict) and fixed:
                    queued.add(canonical_key(self.space.active(fixed)))
                continue
            have = self._results.get(t.number)
            if "duplicate_of" in t.user_attrs or (
                have is not None and have.status is not TrialStatus.RUNNING
            ):
                continue
            result = stored_result(t)
            if result is None and t.state is optuna.trial.TrialState.FAIL and t.params:
                result = interrupted_result(
                    t,
                    self.space.active(t.params),
                    "its worker ended before recording it; it says nothing about the configuration",
                )
            if result is not None:
                self._results[t.number] = result
                self.learn(result)
        loop.running, loop.queued = running, queued
        loop.visited = {
            canonical_key(r.params) for r in self._results.values() if r.status is not TrialStatus.INTERRUPTED
        } | set(running.values())
        # a running trial is counted once (its RUNNING placeholder in a shared --out is not a second one)
        loop.launched_total = sum(
            1 for n, r in self._results.items() if counts_in_budget(r) and n not in running
        ) + len(running)
        started = [float(w.get("started_wall_s") or 0) for w in live_workers(loop.study)]
        if loop.heartbeat is not None:
            started.append(loop.heartbeat.started_wall_s)
        loop.start_s = self.clock() - max(0.0, time.time() - min(started))

    def twin_elsewhere(self, study: optuna.Study, number: int, key: str) -> int | None:
        """Another trial of a shared study that runs or ran this configuration, or None.

        Every worker writes its trial's configuration before it looks, so of two workers that drew the
        same configuration at once the later look sees the other's: at most one runs it.
        """
        if not self.cfg.shared:
            return None
        for t in study.get_trials(deepcopy=False):
            if t.number == number or not t.params or "duplicate_of" in t.user_attrs:
                continue
            if canonical_key(self.space.active(t.params)) != key:
                continue
            if t.state is optuna.trial.TrialState.RUNNING:
                return t.number
            done = self._results.get(t.number) or stored_result(t)
            if done is not None and done.status not in (TrialStatus.INTERRUPTED, TrialStatus.RUNNING):
                return t.number
        return None
