"""The ceiling is a lower bound: the estimator (which runs at realistic efficiencies and counts every
term the ceiling counts) never predicts a step faster than it, for random valid configurations."""

from __future__ import annotations

import random

import numpy as np
import pytest

from autotune.estimate import (
    JobShape,
    PeakBasis,
    estimate_step_time,
    find_gpu,
    find_model,
    step_ceiling,
)
from autotune.estimate.ceiling import ceiling_terms
from autotune.estimate.columns import CONFIG_COLUMNS, ShapeColumns, column
from autotune.jobconfig import JobConfig

MODELS = ("Qwen2.5-0.5B", "Qwen2.5-7B", "Llama-3.1-8B", "Qwen3-14B", "Qwen2.5-VL-7B-Instruct")
GPUS = ("H100", "A100-80G", "A10", "L40S", "H20")


def _random_config(rng: random.Random, heads: int) -> tuple[JobConfig, int]:
    n_gpus = rng.choice((1, 2, 4, 8))
    num_generations = rng.choice((2, 4, 8, 16))
    per_device = rng.choice((1, 2, 4, 8))
    grad_accum = rng.choice((1, 2, 4, 8))
    global_batch = per_device * grad_accum * n_gpus
    global_batch -= global_batch % num_generations
    if global_batch == 0:
        num_generations, global_batch = per_device * grad_accum * n_gpus, per_device * grad_accum * n_gpus
    use_vllm = rng.random() < 0.7
    tp = rng.choice([t for t in (1, 2, 4, 8) if n_gpus % t == 0 and heads % t == 0])
    zero = rng.choice((0, 1, 2, 3))
    config = JobConfig(
        world_size=n_gpus,
        global_batch=global_batch,
        num_generations=num_generations,
        per_device_batch=per_device,
        grad_accum=grad_accum,
        max_prompt_length=rng.choice((64, 256, 512, 2048)),
        max_completion_length=rng.choice((1, 2, 128, 1024, 4096)),
        gradient_checkpointing=rng.random() < 0.5,
        deepspeed=zero > 0 and rng.random() < 0.8,
        zero_stage=zero,
        ds_offload_optimizer=zero > 0 and rng.random() < 0.3,
        ds_offload_param=zero == 3 and rng.random() < 0.3,
        fsdp=rng.random() < 0.1,
        lora_rank=rng.choice((0, 0, 8, 64)),
        beta=rng.choice((0.0, 0.04)),
        use_vllm=use_vllm,
        vllm_mode=rng.choice(("colocate", "server")),
        vllm_tp=tp if use_vllm else 1,
        sleep_level=rng.choice((0, 1, 2)),
        rollout_offload_model=rng.random() < 0.3,
        rollout_offload_optimizer=rng.random() < 0.3,
        move_model_batches=rng.choice((None, 4)),
        vllm_max_num_seqs=rng.choice((1, 8, 64, 256)),
    )
    return config, n_gpus


@pytest.mark.parametrize("seed", range(4))
def test_the_estimate_is_never_below_the_ceiling(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(150):
        model = find_model(rng.choice(MODELS))
        gpu = find_gpu(rng.choice(GPUS))
        assert model is not None and gpu is not None
        config, n_gpus = _random_config(rng, model.heads)
        shape = JobShape(config, model, n_gpus)
        ceiling = step_ceiling(shape, PeakBasis.from_gpu(gpu))
        estimate = estimate_step_time(shape, gpu)
        assert 0 < ceiling.step_s <= estimate.total_s, (config, ceiling, estimate)
        assert ceiling.rollout_s <= estimate.rollout_s
        assert ceiling.weight_sync_s <= estimate.sync_s + 1e-12
        assert max(ceiling.rollout_prefill_s, ceiling.rollout_decode_s) <= ceiling.rollout_s
        assert all(s >= 0 for s in ceiling.phase_s().values())


def test_columns_give_the_numbers_one_shape_gives() -> None:
    rng = random.Random(7)
    model, gpu = find_model("Qwen2.5-7B"), find_gpu("H100")
    assert model is not None and gpu is not None
    configs = [_random_config(rng, model.heads)[0] for _ in range(40)]
    configs = [c for c in configs if c.world_size == 8]
    basis = PeakBasis.from_gpu(gpu)
    cols = ShapeColumns(
        {name: column([getattr(c, name) for c in configs], dtype) for name, dtype in CONFIG_COLUMNS.items()},
        model,
        8,
    )
    terms = ceiling_terms(cols, basis, cols.max_prompt_length, cols.max_completion_length)
    for i, config in enumerate(configs):
        one = step_ceiling(JobShape(config, model, 8), basis)
        assert float(np.broadcast_to(terms["step"], (len(configs),))[i]) == pytest.approx(
            one.step_s, rel=1e-12
        )
        for phase, seconds in one.phase_s().items():
            assert float(np.broadcast_to(terms[phase], (len(configs),))[i]) == pytest.approx(
                seconds, rel=1e-12
            )
