"""The ask side of the study loop: the baseline first, then the strategy's next configuration through
its contract (:class:`~autotune.strategy.BaseStrategy`), the stopping rules before each trial, and what
a configuration drawn twice becomes."""

from __future__ import annotations

import random
import time
from typing import Any

import optuna

from autotune.records import TrialStatus
from autotune.space import canonical_key
from autotune.strategy import EXHAUSTED, Exhausted, Pending
from autotune.study.finish import Finisher
from autotune.study.prescreen import Prescreen
from autotune.study.state import LoopState, Stop, StudyPart, StudyState
from autotune.study.tell import baseline_done_or, tell

__all__ = ["Asker"]


class Asker(StudyPart):
    """Decides what the study runs next, and whether it stops first.

    Args:
        state: the study's shared state (settings, backend, space, strategy, results so far).
        screen: the study's pre-screen (the baseline's context).
        finisher: the study's finish (the time the re-measurement needs is kept from the budget).
    """

    def __init__(self, state: StudyState, screen: Prescreen, finisher: Finisher) -> None:
        super().__init__(state)
        self.screen = screen
        self.finisher = finisher

    def baseline_params(self) -> dict[str, Any]:
        """The baseline: the user's configuration, else the backend's defaults."""
        if self.cfg.user_baseline is not None:
            params = self.space.active(dict(self.cfg.user_baseline))
            self.space.validate_params(params)
            return params
        return self.space.active(
            self.backend.baseline(self.space.defaults(), self.screen.context(self.dir.trials_dir))
        )

    def baseline_first(self, pending: list[tuple[dict[str, Any], bool]]) -> list[tuple[dict[str, Any], bool]]:
        """``pending`` with the baseline at its head (and not again further down)."""
        baseline = self.baseline_params()
        pending = [(p, b) for p, b in pending if canonical_key(p) != canonical_key(baseline)]
        pending.insert(0, (baseline, True))
        return pending

    def stopping_rule(self, loop: LoopState) -> Stop | None:
        """Why the study stops before its next trial: the user, the trial budget or the time budget."""
        if self.interrupted():
            return Stop("interrupted", "stopped by the user")
        if loop.launched_total >= self.cfg.n_trials:
            return Stop("budget", f"trial budget of {self.cfg.n_trials} reached")
        elapsed = self.clock() - loop.start_s
        budget = self.cfg.time_budget_s
        if budget is not None:
            reserve = self.finisher.confirm_reserve_s()
            # with a re-measurement, room for the next trial and the rounds it would add to it should it
            # come out on top or near it (else a runner-up found last has its rounds cut by the budget)
            durations = sorted(r.duration_s for r in self._results.values() if r.duration_s > 0)
            rounds = self.cfg.confirm_runs
            next_s = durations[len(durations) // 2] * (1 + rounds) if durations and rounds > 0 else 0.0
            if elapsed + reserve + next_s > budget:
                kept = f" ({reserve:.0f}s kept for the re-measurement)" if reserve else ""
                return Stop("budget", f"time budget of {budget:.0f}s reached{kept}")
        return None

    def plan(self, loop: LoopState) -> Stop | None:
        """Queue the strategy's next configuration once nothing is pending and the baseline has run.

        Stops the study when the strategy says it has converged, or that it has nothing left.
        """
        if loop.pending or loop.queued or not baseline_done_or(self._results):
            return None
        history = list(self._results.values())
        pending = Pending(
            visited=frozenset(loop.visited),
            running=frozenset(loop.running.values()),
            trials_left=self.cfg.n_trials - loop.launched_total,
        )
        reason = self.strategy.converged(history, pending)
        if reason:
            used = f"used {loop.launched_total} of {self.cfg.n_trials} trials"
            return Stop("converged", f"{reason}; {used}")
        proposal = self.strategy.propose(history, pending)
        if isinstance(proposal, Exhausted):
            return Stop("exhausted", proposal.detail)
        if proposal is not None:
            loop.pending.append((dict(proposal.params), False))
            loop.choices[canonical_key(proposal.params)] = proposal.choice()
        return None

    def default_choice(self, is_baseline: bool, queued: bool) -> dict[str, Any]:
        """Why a configuration the strategy did not explain was run."""
        if is_baseline:
            return {"mode": "baseline"}
        # queued without a strategy's reason: a trial re-run after an interruption, or the next
        # unvisited configuration after duplicates; otherwise the Optuna sampler chose it
        return self.strategy.unexplained_choice(queued)

    def refused(self, loop: LoopState) -> Stop | None:
        """Count a configuration the pre-screen refused (never launched; no trial of the budget).

        A strategy with nothing to propose leaves Optuna's sampler drawing, and where most of the space
        is predicted not to fit nearly every draw is refused, each after a whole decision: a study could
        go on for hours without launching anything. So for a strategy that says so
        (:attr:`~autotune.strategy.BaseStrategy.requeue_after_refusals`) the next unvisited configuration
        that passes the pre-check is queued after that many refusals in a row (as after duplicates), none
        left stops the study, and ``max_refused_in_a_row`` refusals in a row stop it too. A strategy that
        learns from its refusals (Optuna's samplers) or records each one (the grid) is left alone.
        """
        every = self.strategy.requeue_after_refusals
        if every is None:
            return None
        loop.refused += 1
        if loop.refused >= self.cfg.max_refused_in_a_row:
            return Stop(
                "exhausted",
                f"{loop.refused} configurations in a row were refused before launch (predicted not to "
                "fit, or breaking a rule): none of what is left is worth a trial",
            )
        if loop.refused % every == 0 and not loop.pending:
            nxt = self.strategy.next_unvisited(loop.visited)
            if nxt is None:
                return Stop("exhausted", EXHAUSTED)
            loop.pending.append((nxt, False))
        return None

    def duplicate(
        self, loop: LoopState, trial: optuna.Trial, key: str, elsewhere: int | None = None
    ) -> Stop | None:
        """Tell a configuration already tried with its twin's result instead of running it again.

        After two duplicates in a row the next unvisited configuration is queued; none left stops the
        study. A twin that another worker is still running (``elsewhere``) leaves this trial FAIL.
        """
        twin = next((r for r in self._results.values() if canonical_key(r.params) == key), None)
        if twin is None and elsewhere is not None:
            trial.set_user_attr("duplicate_of", elsewhere)
            loop.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            time.sleep(random.uniform(0.0, 0.5))  # two workers that drew alike draw again apart
            return None
        trial.set_user_attr("duplicate_of", twin.number if twin else -1)
        if twin is not None and twin.status is not TrialStatus.INTERRUPTED:
            tell(loop.study, trial, twin, self.dir)  # a twin never reported: nothing of its own to keep
        else:
            loop.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        loop.duplicates += 1
        if loop.duplicates >= 2:
            nxt = self.strategy.next_unvisited(loop.visited)
            if nxt is None:
                return Stop("exhausted", EXHAUSTED)
            loop.pending.append((nxt, False))
            loop.duplicates = 0
        return None
