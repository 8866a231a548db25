"""A demo reward for ms-swift GRPO trials, loaded with ``--external_plugins <this file>``.

``--reward_funcs autotune_demo`` then scores each completion with 1.0 when it contains the row's
``solution`` plus the share of digit characters in it. A random tiny model never answers right, but the
digit share differs between completions, so ``reward_std`` is not 0 and GRPO has an advantage to learn
from (the same score as :func:`autotune.workload.datasets.score_completion`).

This file runs inside ms-swift's interpreter, which may not have autotune installed: it imports only
ms-swift and the standard library. ms-swift 4.x keeps the registry in ``swift.rewards.orm``, 3.x in
``swift.plugin.orm``. The log shows the reward as ``rewards/AutotuneDemoReward/mean``.
"""

from __future__ import annotations

from typing import Any

try:  # ms-swift 4.x
    from swift.rewards.orm import ORM, orms
except ImportError:  # ms-swift 3.x
    from swift.plugin.orm import ORM, orms

REWARD_NAME = "autotune_demo"


def score(text: str, solution: str | None) -> float:
    """1.0 when ``solution`` occurs in ``text``, plus the share of digit characters of ``text``."""
    stripped = text.strip()
    digits = sum(ch.isdigit() for ch in stripped)
    share = digits / len(stripped) if stripped else 0.0
    hit = 1.0 if solution and solution in stripped else 0.0
    return hit + share


def _text(completion: object) -> str:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))  # conversational completions
    return str(completion)


class AutotuneDemoReward(ORM):
    """Exact answer plus digit share; see the module docstring."""

    def __call__(
        self, completions: list[Any], solution: list[str] | None = None, **kwargs: object
    ) -> list[float]:
        solutions = solution if solution is not None else [None] * len(completions)
        return [score(_text(c), s) for c, s in zip(completions, solutions, strict=False)]


orms[REWARD_NAME] = AutotuneDemoReward
