"""The screening phase of ``auto`` as the strategy runs it (a mixin of
:class:`~autotune.strategy._auto.AutoStrategy`): the plan over its candidate pool, the next screening or
combination run, and whether stopping may trust the prior yet. The design itself is
:mod:`autotune.strategy._screening`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from autotune.records import TrialResult
from autotune.strategy._inference import infer_infeasible
from autotune.strategy._screening import ScreenPlan

if TYPE_CHECKING:
    from autotune.space import SearchSpace
    from autotune.strategy._base import Collaborators
    from autotune.strategy._pool import CandidatePool
    from autotune.strategy._screening import Screening

__all__ = ["ScreeningPhase"]


class ScreeningPhase:
    """What ``auto`` adds for its screening phase (the strategy provides the attributes below)."""

    space: SearchSpace
    pool: CandidatePool
    collab: Collaborators
    screening: Screening | None

    def scored(self, **fields: object) -> Any:
        """The strategy's own proposal type, built from ``fields``."""
        raise NotImplementedError

    def _screen_plan(self) -> ScreenPlan | None:
        """The screening plan over the valid pool (the estimator's knob spreads rank the knobs)."""
        if self.screening is None:
            return None
        base = self.pool.base()
        spreads = None
        if self.collab.rank is not None and len(base.prior) and np.isfinite(base.prior).any():
            spreads = self.pool.encoder().knob_spreads(base.codes, np.log(base.prior))
        return self.screening.plan([c.params for c in base.cands], spreads)

    def _screened(self, runs: Sequence[TrialResult]) -> bool:
        """Whether every screened level was measured healthy (or given up): stopping needs it."""
        plan = self._screen_plan()
        return (
            plan is None
            or self.screening is None
            or self.screening.complete(plan, self.screening.state(plan, runs))
        )

    def _screen_note(self) -> str:
        """What a stop owes to the screening phase (empty without one)."""
        plan = self._screen_plan()
        if plan is None or not plan.knobs:
            return ""
        return f" (every level of {', '.join(plan.knobs)} was measured healthy or failed twice: the prior was checked)"

    def _screen(
        self,
        runs: Sequence[TrialResult],
        history: Sequence[TrialResult],
        visited: set[str],
        budget_left: int | None,
        score: Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
        best: float | None,
    ) -> tuple[Any, str] | None:
        """The screening design's next run, or the combination of the best screened levels, while the
        screening phase lasts (:class:`~autotune.strategy._screening.Screening`); None after it."""
        plan = self._screen_plan()
        if plan is None or self.screening is None:
            return None
        base = self.pool.base()
        block = base.select([c.key not in visited for c in base.cands])
        if not block.cands:
            return None
        choice, gain_ok, mean_log, p_ok = score(block, self.pool.first_load(block.cands))

        def check(params: Mapping[str, object]) -> bool:
            return infer_infeasible(self.space, params, history) is None and self.collab.feasible(params)

        def probe_load(params: Mapping[str, object]) -> float | None:
            """The predicted memory load of a candidate only the memory gate refuses (None otherwise)."""
            if self.collab.memory_load is None or infer_infeasible(self.space, params, history) is not None:
                return None
            return self.collab.memory_load(params) if self.collab.valid(params) else None

        pick = self.screening.next_run(
            plan, runs, [c.params for c in block.cands], p_ok, choice, check, budget_left, probe_load
        )
        if pick is None:
            return None
        i = pick.index
        proposal = self.scored(
            params=dict(block.cands[i].params),
            predicted_throughput=float(math.exp(mean_log[i])),
            expected_gain_frac=float(gain_ok[i]) if best is not None else None,
            failure_risk=float(1.0 - p_ok[i]),
            covers=pick.covers,
            memory_probe=pick.memory_probe,
        )
        return proposal, pick.mode
