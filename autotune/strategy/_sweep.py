"""A DeepSpeed-autotuner-style sweep, for comparison in the search-efficiency bench.

DeepSpeed's autotuner (``deepspeed/autotuning``) tunes the ZeRO stage and the micro-batch size only:
stage by stage, it grows the micro-batch until the first run that fails, keeps the fastest, and stops
moving to the next stage once a stage is slower than the one before. Every other knob stays at the
baseline. It measures throughput only, so a run that does not learn (or leaves too little memory)
does not stop it — it is just never recommended. This module reproduces that procedure on top of the study loop; it is not offered by the CLI.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.records import TrialResult, TrialStatus
from autotune.space import SearchSpace, canonical_key
from autotune.strategy._base import (
    BaseStrategy,
    Collaborators,
    Exhausted,
    Pending,
    Proposal,
    StrategySettings,
)

__all__ = ["DeepSpeedSweep", "SweepSettings"]


@dataclass(frozen=True)
class SweepSettings(StrategySettings):
    """What the sweep varies.

    Attributes:
        base: the baseline configuration the sweep starts from.
        stage_knob: the knob that selects the ZeRO stage (``zero_stage``, ms-swift ``deepspeed``).
        stages: its values, in the order DeepSpeed tries them (stage 0 first).
        batch_knob: the micro-batch knob (default: the knob the space names for the
            ``per_device_batch`` role).
    """

    base: Mapping[str, Any] = field(default_factory=dict)
    stage_knob: str = "zero_stage"
    stages: tuple[Any, ...] = (0, 1, 2, 3)
    batch_knob: str | None = None


class DeepSpeedSweep(BaseStrategy):
    """ZeRO stage, then micro-batch size up to the first failure; other knobs at the baseline.

    The collaborators' ``feasible`` is the sweep's own pre-check (DeepSpeed prunes with model-state
    arithmetic only) and ``usable`` whether a result counts as a success; the seed only seeds the
    Optuna sampler, never consulted while the sweep has proposals. Settings: :class:`SweepSettings`.
    """

    Settings = SweepSettings
    settings: SweepSettings

    def __init__(
        self,
        space: SearchSpace,
        collaborators: Collaborators | None = None,
        *,
        seed: int = 0,
        settings: StrategySettings | None = None,
    ) -> None:
        super().__init__(space, collaborators, seed=seed, settings=settings)
        s = self.settings
        self.base = dict(s.base)
        self.stage_knob = s.stage_knob
        self.stages = tuple(s.stages)
        knob = s.batch_knob or space.knob_for("per_device_batch")
        if knob is None:
            raise ValueError(
                "the DeepSpeed-style sweep needs the space's micro-batch knob (its per_device_batch role)"
            )
        self.batch_knob = knob
        self.batches = tuple(sorted(space[knob].values()))

    def _plan(
        self, history: Sequence[TrialResult], running: frozenset[str] = frozenset()
    ) -> dict[str, Any] | None:
        """The sweep's next configuration; one another worker is running counts as not failed yet (the
        sweep goes on to the next micro-batch of the stage)."""
        by_key = {canonical_key(r.params): r for r in history if r.status is not TrialStatus.INTERRUPTED}
        previous_best: float | None = None
        for stage in self.stages:
            stage_best: float | None = None
            for batch in self.batches:
                params = self.space.active({**self.base, self.stage_knob: stage, self.batch_knob: batch})
                key = canonical_key(params)
                result = by_key.get(key)
                if result is None and key in running:
                    continue
                if result is None:
                    if not self.collab.feasible(params):
                        break  # predicted not to fit: the largest batch of this stage is reached
                    return params
                if result.status.is_failure and result.status is not TrialStatus.UNHEALTHY:
                    break  # the first run that failed (OOM, hang, ...): next stage
                if self.collab.usable(result):  # DeepSpeed sees no health or headroom: it goes on regardless
                    stage_best = max(stage_best or 0.0, result.throughput or 0.0)
            if stage_best is not None and previous_best is not None and stage_best < previous_best:
                return None  # DeepSpeed's early termination: this stage was slower than the last
            if stage_best is not None:
                previous_best = max(previous_best or 0.0, stage_best)
        return None

    def propose(self, history: Sequence[TrialResult], pending: Pending) -> Proposal | Exhausted | None:
        """The next configuration of the sweep (None once it is complete: :meth:`converged` stops the
        study before)."""
        params = self._plan(history, pending.running)
        return Proposal(params, mode="sweep") if params is not None else None

    def converged(self, history: Sequence[TrialResult], pending: Pending) -> str | None:
        """Stop once the sweep has nothing left to try."""
        if self._plan(history) is None:
            return "the DeepSpeed-style sweep (ZeRO stage × micro-batch) is complete"
        return None
