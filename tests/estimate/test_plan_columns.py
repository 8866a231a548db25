"""The plan's column path against the per-candidate path it replaced (decode, JobShape, estimates).

The per-candidate path is kept here as the oracle: every candidate decoded by the backend, checked by
``candidate_rules``, estimated by ``estimate_memory`` / ``estimate_step_time`` and sorted by the plan's
key. Small spaces are compared whole (candidates, order, invalid counts); the packaged spaces on a
sample, since the oracle takes minutes on them.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from autotune.backends import backend_class
from autotune.estimate import (
    JobShape,
    candidate_rules,
    estimate_memory,
    estimate_step_time,
    find_gpu,
    find_model,
    plan_space,
    should_prune,
)
from autotune.estimate.plan import PlanResult, speed_key
from autotune.space import Platform, load_space

DATA = Path(__file__).parent / "data"
PACKAGED = Path(__file__).parents[2] / "search_spaces"
JOB = {"global_batch": 64, "num_generations": 8, "max_prompt_length": 512, "max_completion_length": 1024}


def _plan(backend: str, path: Path, gpu: str, n: int, fixed: dict[str, Any]) -> tuple[Any, PlanResult]:
    space = (
        load_space(path)
        .restrict(Platform.machine(gpu_present=True))
        .with_roles(backend_class(backend).knob_roles())
    )
    model, g = find_model("Qwen2-7B"), find_gpu(gpu)
    assert model is not None and g is not None
    result = plan_space(
        space,
        backend=backend,
        describe=backend_class(backend).describe,
        model=model,
        gpu=g,
        n_gpus=n,
        fixed=fixed,
    )
    return space, result


def _scalar(backend: str, params: dict[str, Any], result: PlanResult) -> tuple[Any, ...]:
    """One candidate the per-candidate way: (rule, derived, memory, time, config)."""
    n = result.n_gpus
    config = backend_class(backend).describe(params, {"world_size": n}, result.fixed, n)
    rule = candidate_rules(config, result.model, n)
    if rule is not None:
        return (rule, None, None, None, config)
    shape = JobShape(config, result.model, n)
    mem = estimate_memory(shape, result.gpu)
    derived = {"world_size": config.world_size, "gradient_accumulation_steps": config.grad_accum}
    return (None, derived, mem, estimate_step_time(shape, result.gpu, mem), config)


def _key(mem: Any, t: Any) -> tuple[int, float, int]:
    if mem.fits():
        return (0, -speed_key(t.throughput), mem.peak_bytes)
    over = mem.overflow()
    return (1, (over[1] if over else 0) / max(1, mem.capacity_bytes), mem.peak_bytes)


CASES = [
    ("trl", DATA / "trl_small.yaml", "A10", 4, {**JOB, "vllm_max_model_length": 1536}),
    ("swift", DATA / "swift_small.yaml", "A100-80G", 4, dict(JOB)),
    ("swift", DATA / "swift_small.yaml", "A10", 2, {**JOB, "tuner_type": "lora", "lora_rank": 16}),
]


@pytest.mark.parametrize(("backend", "path", "gpu", "n", "fixed"), CASES)
def test_the_whole_plan_equals_the_per_candidate_path(
    backend: str, path: Path, gpu: str, n: int, fixed: dict[str, Any]
) -> None:
    space, result = _plan(backend, path, gpu, n, fixed)
    rows, invalid = [], Counter()
    for params in space.grid():
        rule, derived, mem, t, _ = _scalar(backend, params, result)
        if rule is not None:
            invalid[rule] += 1
        else:
            rows.append((params, derived, mem, t))
    rows.sort(key=lambda r: _key(r[2], r[3]))  # stable: grid order breaks ties, as the plan's sort
    assert dict(invalid) == result.invalid
    assert len(rows) == len(result.candidates)
    best = max((t.throughput for _, _, m, t in rows if m.fits()), default=None)
    for (params, derived, mem, t), c in zip(rows, result.candidates, strict=True):
        assert (c.params, c.derived, c.memory, c.time) == (params, derived, mem, t)
        assert c.pruned == should_prune(mem, result.margin)
        assert c.relative_speed == ((t.throughput / best) if best else None)
    assert result.n_fit == sum(1 for _, _, m, _ in rows if m.fits())


@pytest.mark.parametrize(("backend", "n"), [("swift", 4), ("trl", 4), ("swift", 8)])
def test_the_packaged_spaces_agree_on_a_sample(backend: str, n: int) -> None:
    _, result = _plan(backend, PACKAGED / f"{backend}.yaml", "A100-80G", n, dict(JOB))
    rng = random.Random(n)
    cands = result.candidates
    sample = sorted(rng.sample(range(len(cands)), 60)) + [0, len(cands) - 1]
    keys = []
    for i in sample:
        c = cands[i]
        assert c.params == cands.params(i)
        rule, derived, mem, t, config = _scalar(backend, c.params, result)
        assert rule is None
        assert (c.derived, c.memory, c.time) == (derived, mem, t)
        assert c.shape.config == config
        assert c.fits == bool(cands.fits[i]) and c.pruned == should_prune(mem, result.margin)
        keys.append(_key(mem, t))
    assert keys[:-2] == sorted(keys[:-2])
