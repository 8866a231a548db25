from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autotune.backends import backend_class
from autotune.estimate import candidate_rules, find_gpu, find_model, plan_space
from autotune.estimate.plan import _table
from autotune.space import Platform, load_space

DATA = Path(__file__).parent / "data"
JOB = {"global_batch": 64, "num_generations": 8, "max_prompt_length": 512, "max_completion_length": 1024}


def space(name: str):  # noqa: ANN201
    return load_space(DATA / f"{name}_small.yaml").restrict(Platform.machine(gpu_present=True))


@pytest.mark.parametrize("name", ["trl", "swift"])
def test_plan_table_enumerates_the_space_grid(name: str) -> None:
    """The plan's candidates (groups × pass-through knobs) are the space's grid, in its order."""
    s = space(name)
    describe = backend_class(name).describe
    table = _table(s, lambda p: describe(p, {"world_size": 4}, JOB, 4))
    assert [table.params(r) for r in range(len(table.index))] == list(s.grid())


def test_plan_orders_fitting_fastest_first_then_closest_misses() -> None:
    model, gpu = find_model("Qwen2-7B"), find_gpu("A10")
    assert model is not None and gpu is not None
    result = plan_space(
        space("trl"),
        backend="trl",
        describe=backend_class("trl").describe,
        model=model,
        gpu=gpu,
        n_gpus=4,
        fixed={**JOB, "vllm_max_model_length": 1536},
    )
    cands = result.candidates
    assert 0 < result.n_fit < len(cands)
    fit = [c for c in cands if c.fits]
    assert cands[: len(fit)] == fit  # fitting candidates first
    speeds = [float(f"{c.time.throughput:.3g}") for c in fit]
    assert speeds == sorted(speeds, reverse=True)
    assert fit[0].relative_speed == pytest.approx(1.0)
    assert all(c.relative_speed is not None and c.relative_speed <= 1.0 + 1e-9 for c in fit)
    misses = [c.memory.overflow()[1] / c.memory.capacity_bytes for c in cands[len(fit) :]]  # type: ignore[index]
    assert misses == sorted(misses)
    # 7B full fine-tuning on 4 × 24 GB only fits with the optimizer offloaded (DeepSpeed: 2P + 18P/N)
    assert all(c.params["zero_stage"] in (2, 3) and c.params["offload_optimizer"] for c in fit)


def test_plan_counts_invalid_candidates_by_rule() -> None:
    model, gpu = find_model("Qwen2-7B"), find_gpu("A10")
    assert model is not None and gpu is not None
    result = plan_space(
        space("trl"),
        backend="trl",
        describe=backend_class("trl").describe,
        model=model,
        gpu=gpu,
        n_gpus=4,
        fixed=JOB,
    )
    # TP 8 on 4 GPUs; pdbs 16 × 4 GPUs does not split 64 ... (none here: 64 % 64 == 0)
    assert result.invalid.get("vllm_tp_divides_world", 0) > 0
    assert result.to_dict()["counts"]["invalid"] == sum(result.invalid.values())
    d = result.to_dict(top=3)
    assert len(d["candidates"]) == 3 and d["counts"]["candidates"] == len(result.candidates)


def _rules(backend: str, params: dict, fixed: dict, model: Any, n_gpus: int) -> str | None:
    """The rules as plan applies them: on what the backend's decoder says the candidate means."""
    config = backend_class(backend).describe(params, {"world_size": n_gpus}, fixed, n_gpus)
    return candidate_rules(config, model, n_gpus)


def test_candidate_rules() -> None:
    m = find_model("Qwen2-7B")  # 28 attention heads
    assert m is not None
    assert (
        _rules("trl", {"per_device_train_batch_size": 16}, {"global_batch": 64}, m, 8)
        == "global_batch_divisible"
    )
    assert (
        _rules("trl", {"per_device_train_batch_size": 1}, {"global_batch": 60, "num_generations": 8}, m, 4)
        == "generation_batch_num_generations"
    )
    assert _rules("trl", {"use_vllm": True, "vllm_tensor_parallel_size": 2}, JOB, m, 3) is not None
    assert (
        _rules(
            "trl",
            {"per_device_train_batch_size": 1, "use_vllm": True, "vllm_tensor_parallel_size": 4},
            JOB,
            m,
            8,
        )
        is None
    )
    assert (
        _rules(
            "trl",
            {"per_device_train_batch_size": 1, "use_vllm": True, "vllm_tensor_parallel_size": 8},
            JOB,
            m,
            8,
        )
        == "vllm_tp_divides_heads"
    )
    assert (
        _rules("swift", {"per_device_train_batch_size": 1, "use_vllm": True}, JOB, m, 8)
        == "vllm_mode_required"
    )


def test_swift_plan_on_h100() -> None:
    model, gpu = find_model("Qwen2-7B"), find_gpu("H100")
    assert model is not None and gpu is not None
    result = plan_space(
        space("swift"),
        backend="swift",
        describe=backend_class("swift").describe,
        model=model,
        gpu=gpu,
        n_gpus=8,
        fixed={**JOB, "vllm_max_model_len": 2048},
    )
    assert result.n_fit > 0
    best = result.candidates[0]
    assert best.fits and best.relative_speed == pytest.approx(1.0)
    # the ms-swift default (no DeepSpeed, utilization 0.9, sleep 0) cannot start vLLM beside the trainer
    default = [
        c
        for c in result.candidates
        if c.params.get("deepspeed") is None
        and c.params.get("vllm_gpu_memory_utilization") == 0.9
        and c.params.get("sleep_level") == 0
        and not c.params.get("offload_model")
    ]
    assert default and all(not c.fits and not c.memory.vllm_startup_ok for c in default)


def _swift_7b_on_4_a10() -> Any:
    """The packaged ms-swift space for Qwen2.5-7B on 4 x A10, narrowed to the configurations that fit best
    (batch 8, ZeRO-3 offload, vLLM TP 4): hundreds of candidates whose predictions tie or differ by
    less than 0.1 %."""
    from autotune.app.plan import run_plan

    result, _ = run_plan(
        model="Qwen2.5-7B", model_config=None, gpus=4, gpu_type="A10", gpu_memory_gib=None, backend="swift",
        space_path=None, global_batch=64, num_generations=8, max_completion_length=1024,
        max_prompt_length=512, beta=None, lora_rank=0, vllm_max_model_len=None,
        knobs=["per_device_train_batch_size=8", "deepspeed=zero3_offload", "vllm_tensor_parallel_size=4"],
        margin=0.15,
    )  # fmt: skip
    return result


def test_candidates_rank_by_their_exact_prediction_and_ties_are_true_ties() -> None:
    from autotune.estimate.plan import speed_key

    fit = [c for c in _swift_7b_on_4_a10().candidates if c.fits]
    assert len(fit) > 100
    keys = [speed_key(c.time.throughput) for c in fit]
    # fastest first by the prediction itself (3 significant digits used to put a slower one first)
    assert keys == sorted(keys, reverse=True)
    # equal rank = the same predicted step time; a new rank = a slower one
    for a, b in zip(fit, fit[1:], strict=False):
        assert a.speed_rank is not None and b.speed_rank is not None
        if a.speed_rank == b.speed_rank:
            assert a.time.throughput == pytest.approx(b.time.throughput, rel=1e-9)
            assert a.memory.peak_bytes <= b.memory.peak_bytes  # a tie: more headroom first
        else:
            assert b.speed_rank == a.speed_rank + 1 and b.time.throughput < a.time.throughput
    assert fit[0].speed_rank == 1 and fit[-1].speed_rank == len(set(keys))
    # the model really ties some (KV cache beyond what the rollout needs does not speed it up) ...
    assert len(set(keys)) < len(fit)
    # ... and really separates others by less than the two decimals the table used to print
    top = sorted(set(keys), reverse=True)[:10]
    assert len({f"{k / top[0]:.2f}" for k in top}) < len(top) == 10
