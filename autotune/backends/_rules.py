"""Start-up rules every framework shares, read from what a trial means (its :class:`JobConfig`).

A backend's :meth:`~autotune.backends.Backend.check_rules` holds the rules of its own framework; the ones
here hold for every framework that runs the same engine, so they live once and
:meth:`~autotune.backends.Backend.rules` applies them to every backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from autotune.jobconfig import JobConfig

__all__ = ["SHARED_RULES", "vllm_tp_divides_heads"]


def vllm_tp_divides_heads(job: JobConfig, facts: Mapping[str, object]) -> tuple[str, str] | None:
    """vLLM refuses a tensor-parallel size that does not divide the attention heads
    (``ModelConfig.verify_with_parallel_config``), after a whole start-up."""
    heads = facts.get("heads")
    tp = job.vllm_tp
    if not job.use_vllm or not isinstance(heads, int) or tp < 1 or heads % tp == 0:
        return None
    return (
        "vllm_tp_divides_heads",
        f"vLLM's tensor-parallel size {tp} does not divide the model's {heads} attention heads",
    )


#: (the trial's meaning, the model's facts) → (rule, message) when the rule is broken, else None
SHARED_RULES: tuple[Callable[[JobConfig, Mapping[str, Any]], tuple[str, str] | None], ...] = (
    vllm_tp_divides_heads,
)
