"""autotune's demo reward for verl (``reward.custom_reward_function``). Written by autotune export.

1.0 when the completion contains the row's ground truth, plus the share of digit characters in it — the
score autotune's CPU demo trials used. Replace it with your own reward.
"""

from __future__ import annotations

from typing import Any


def compute_score(
    data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any
) -> float:
    """verl's custom reward signature: one completion, one score."""
    text = str(solution_str).strip()
    digits = sum(ch.isdigit() for ch in text)
    share = digits / len(text) if text else 0.0
    hit = 1.0 if ground_truth is not None and str(ground_truth) and str(ground_truth) in text else 0.0
    return hit + share
