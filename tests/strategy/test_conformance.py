"""Every registered strategy passes the conformance suite (``conformance.py``); a careless strategy
and a forgetful one fail it, so the suite can fail."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from autotune.records import TrialResult
from autotune.space import SearchSpace, canonical_key
from autotune.strategy import (
    STRATEGIES,
    BaseStrategy,
    Collaborators,
    Exhausted,
    Pending,
    Proposal,
    StrategySettings,
    SweepSettings,
    build_strategy,
)
from tests.strategy.conformance import CHECKS, Factory, make_space, run_check

#: settings of the strategies a study cannot build by name alone
SETTINGS: dict[str, StrategySettings] = {
    "ds-sweep": SweepSettings(base={}, stage_knob="zero", stages=(0, 2, 3), batch_knob="batch"),
}


def factory(name: str) -> Factory:
    def make(space: SearchSpace, collab: Collaborators, seed: int) -> BaseStrategy:
        return build_strategy(name, space, collab, seed=seed, settings=SETTINGS.get(name))

    return make


@pytest.fixture
def space(tmp_path: Path) -> SearchSpace:
    return make_space(tmp_path)


def test_every_registered_strategy_can_be_built_for_the_suite() -> None:
    assert {"auto", "random", "grid", "tpe", "ds-sweep"} <= set(STRATEGIES)
    assert all(e.by_name or name in SETTINGS for name, e in STRATEGIES.items())


@pytest.mark.parametrize("check", sorted(CHECKS))
@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_strategy_conforms(name: str, check: str, space: SearchSpace) -> None:
    run_check(check, factory(name), space)


class Careless(BaseStrategy):
    """Proposes the grid's points in order, whatever was tried or refused."""

    def propose(self, history: Sequence[TrialResult], pending: Pending) -> Proposal | Exhausted | None:
        return Proposal(self.grid()[len(history) % len(self.grid())], mode="careless")


class Forgetful(BaseStrategy):
    """Proposes from a count of its own calls, not from the history: a resumed copy answers otherwise."""

    calls = 0

    def propose(self, history: Sequence[TrialResult], pending: Pending) -> Proposal | Exhausted | None:
        self.calls += 1
        free = [p for p in self.grid() if canonical_key(p) not in pending.visited]
        return Proposal(free[(7 * self.calls) % len(free)], mode="forgetful")


@pytest.mark.parametrize(
    ("cls", "check"),
    [
        (Careless, "never_repeats"),
        (Careless, "never_known_infeasible"),
        (Careless, "respects_pending"),
        (Forgetful, "resumes"),
    ],
)
def test_the_suite_can_fail(cls: type[BaseStrategy], check: str, space: SearchSpace) -> None:
    def make(space: SearchSpace, collab: Collaborators, seed: int) -> BaseStrategy:
        return cls(space, collab, seed=seed)

    with pytest.raises(AssertionError):
        run_check(check, make, space)
