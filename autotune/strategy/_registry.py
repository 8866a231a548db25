"""The registry of search strategies: ``--search``'s choices and help are derived from it.

Adding a strategy: a module with its :class:`~autotune.strategy._base.BaseStrategy` subclass and its
settings dataclass, an entry here, and the conformance suite (``tests/strategy/conformance.py``) run
against it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from autotune.errors import UsageError

if TYPE_CHECKING:
    from autotune.space import SearchSpace
    from autotune.strategy._base import BaseStrategy, Collaborators, StrategySettings

__all__ = ["COMPARISON_KINDS", "SEARCH_KINDS", "STRATEGIES", "StrategyEntry", "build_strategy", "search_help"]


@dataclass(frozen=True)
class StrategyEntry:
    """One registered strategy.

    The class is named, not imported, so the CLI derives ``--search``'s help without loading numpy and
    Optuna.

    Attributes:
        target: its class, as ``module:Class``.
        summary: one line for ``--search``'s help.
        on_cli: offered by ``autotune search --search`` (else a peer on the benches only).
        by_name: a study can build it from its name alone (its settings have usable defaults).
    """

    target: str
    summary: str
    on_cli: bool = True
    by_name: bool = True

    def load(self) -> type[BaseStrategy]:
        """The strategy's class."""
        module, _, name = self.target.partition(":")
        return cast("type[BaseStrategy]", getattr(importlib.import_module(module), name))


STRATEGIES: dict[str, StrategyEntry] = {
    "auto": StrategyEntry(
        "autotune.strategy._auto:AutoStrategy", "the estimator's prior corrected by every trial (default)"
    ),
    "auto-v4": StrategyEntry(
        "autotune.strategy._auto_v4:AutoV4Strategy",
        "auto with its speed model chosen by leave-one-out error on the study's trials",
        on_cli=False,
    ),
    "random": StrategyEntry("autotune.strategy._random:RandomStrategy", "Optuna's random sampler"),
    "grid": StrategyEntry("autotune.strategy._grid:GridStrategy", "every configuration in order"),
    "tpe": StrategyEntry(
        "autotune.strategy._tpe:TPEStrategy", "Optuna's TPE with constraints, no estimator", on_cli=False
    ),
    "gp": StrategyEntry(
        "autotune.strategy._gp:GPStrategy", "Optuna's GPSampler with constraints, no estimator", on_cli=False
    ),
    "ds-sweep": StrategyEntry(
        "autotune.strategy._sweep:DeepSpeedSweep",
        "DeepSpeed's autotuner: ZeRO stage, then micro-batch",
        on_cli=False,
        by_name=False,
    ),
}

#: the strategies ``--search`` offers
SEARCH_KINDS: tuple[str, ...] = tuple(name for name, e in STRATEGIES.items() if e.on_cli)
#: the strategies a study builds by name for the benches only
COMPARISON_KINDS: tuple[str, ...] = tuple(
    name for name, e in STRATEGIES.items() if e.by_name and not e.on_cli
)


def search_help() -> str:
    """``--search``'s help, one clause per offered strategy."""
    return "; ".join(f"{name}: {STRATEGIES[name].summary}" for name in SEARCH_KINDS) + "."


def build_strategy(
    name: str,
    space: SearchSpace,
    collaborators: Collaborators | None = None,
    *,
    seed: int = 0,
    settings: StrategySettings | None = None,
) -> BaseStrategy:
    """The strategy registered as ``name``.

    Raises:
        UsageError: no strategy of that name can be built by name.
    """
    entry = STRATEGIES.get(name)
    if entry is None or not (entry.by_name or settings is not None):
        raise UsageError(
            f"unknown search {name!r}", hint=f"Use --search with one of: {', '.join(SEARCH_KINDS)}"
        )
    return entry.load()(space, collaborators, seed=seed, settings=settings)
