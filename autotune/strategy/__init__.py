"""Search strategies: which configuration to try next, what can be skipped, when to stop.

One class per strategy behind one contract (:class:`BaseStrategy`), registered in ``STRATEGIES``.
The registry is light (``--search``'s help reads it without loading numpy or Optuna); the classes and
the rest load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from autotune.strategy._registry import (
    COMPARISON_KINDS,
    SEARCH_KINDS,
    STRATEGIES,
    StrategyEntry,
    build_strategy,
    search_help,
)

if TYPE_CHECKING:
    from autotune.strategy._auto import AutoSettings, AutoStrategy
    from autotune.strategy._auto_v4 import AutoV4Settings, AutoV4Strategy
    from autotune.strategy._base import (
        EXHAUSTED,
        BaseStrategy,
        Collaborators,
        Exhausted,
        Pending,
        Proposal,
        StrategySettings,
        launched,
        usable_complete,
    )
    from autotune.strategy._grid import GridStrategy
    from autotune.strategy._inference import Inference, infer_infeasible, oom_dominated
    from autotune.strategy._pool import observed_phases
    from autotune.strategy._proposal import ScoredProposal, move_from
    from autotune.strategy._random import RandomStrategy
    from autotune.strategy._sweep import DeepSpeedSweep, SweepSettings
    from autotune.strategy._tpe import TPESettings, TPEStrategy

_LAZY = {
    "autotune.strategy._auto": ("AutoSettings", "AutoStrategy"),
    "autotune.strategy._auto_v4": ("AutoV4Settings", "AutoV4Strategy"),
    "autotune.strategy._proposal": ("ScoredProposal", "move_from"),
    "autotune.strategy._base": (
        "EXHAUSTED",
        "BaseStrategy",
        "Collaborators",
        "Exhausted",
        "Pending",
        "Proposal",
        "StrategySettings",
        "launched",
        "usable_complete",
    ),
    "autotune.strategy._grid": ("GridStrategy",),
    "autotune.strategy._inference": ("Inference", "infer_infeasible", "oom_dominated"),
    "autotune.strategy._pool": ("observed_phases",),
    "autotune.strategy._random": ("RandomStrategy",),
    "autotune.strategy._sweep": ("DeepSpeedSweep", "SweepSettings"),
    "autotune.strategy._tpe": ("TPESettings", "TPEStrategy"),
}
_WHERE = {name: module for module, names in _LAZY.items() for name in names}

__all__ = [
    "COMPARISON_KINDS",
    "EXHAUSTED",
    "SEARCH_KINDS",
    "STRATEGIES",
    "AutoSettings",
    "AutoStrategy",
    "AutoV4Settings",
    "AutoV4Strategy",
    "BaseStrategy",
    "Collaborators",
    "DeepSpeedSweep",
    "Exhausted",
    "GridStrategy",
    "Inference",
    "Pending",
    "Proposal",
    "RandomStrategy",
    "ScoredProposal",
    "StrategyEntry",
    "StrategySettings",
    "SweepSettings",
    "TPESettings",
    "TPEStrategy",
    "build_strategy",
    "infer_infeasible",
    "launched",
    "move_from",
    "observed_phases",
    "oom_dominated",
    "search_help",
    "usable_complete",
]


def __getattr__(name: str) -> Any:
    """The strategies and their helpers, imported on first use."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
