"""The time model only orders candidates: these tests check orderings, never absolute seconds."""

from __future__ import annotations

from typing import Any

import pytest

from autotune.backends import job_shape
from autotune.estimate import estimate_step_time, find_gpu, find_model

JOB = {"global_batch": 64, "num_generations": 8, "max_completion_length": 1024, "vllm_max_model_length": 2048}


def t(
    params: dict[str, Any],
    *,
    gpu: str = "H100",
    n: int = 8,
    model: str = "Qwen2-7B",
    backend: str = "trl",
    **fixed: Any,
):  # noqa: ANN201
    spec = find_model(model)
    assert spec is not None
    return estimate_step_time(job_shape(backend, params, {}, {**JOB, **fixed}, spec, n), find_gpu(gpu))


def test_total_is_the_sum_and_throughput_follows() -> None:
    e = t({"use_vllm": True, "zero_stage": 2})
    assert e.total_s == pytest.approx(e.rollout_s + e.train_s + e.sync_s + e.offload_s)
    assert e.throughput == pytest.approx(64 / e.total_s)
    assert set(e.to_dict()) == {"rollout_s", "train_s", "sync_s", "offload_s", "total_s", "throughput"}


def test_vllm_rollouts_beat_model_generate() -> None:
    assert t({"use_vllm": True}).rollout_s < t({"use_vllm": False}).rollout_s


def test_offload_costs_time() -> None:
    plain = t({"zero_stage": 3})
    off = t({"zero_stage": 3, "offload_optimizer": True})
    both = t({"zero_stage": 3, "offload_optimizer": True, "offload_param": True})
    assert plain.offload_s == 0 < off.offload_s < both.offload_s
    assert plain.total_s < off.total_s < both.total_s


def test_checkpointing_costs_compute() -> None:
    assert t({"gradient_checkpointing": True}).train_s > t({"gradient_checkpointing": False}).train_s


def test_larger_micro_batches_train_faster() -> None:
    times = [t({"per_device_train_batch_size": b}).train_s for b in (1, 2, 4, 8)]
    assert times == sorted(times, reverse=True)


def test_zero3_communicates_more_than_zero2_on_pcie() -> None:
    assert t({"zero_stage": 3}, gpu="A10").train_s > t({"zero_stage": 2}, gpu="A10").train_s


def test_faster_gpu_is_faster() -> None:
    assert (
        t({"zero_stage": 3, "use_vllm": True}, gpu="H100").total_s
        < t({"zero_stage": 3, "use_vllm": True}, gpu="A100-80G").total_s
    )


def test_sleep_level_one_adds_host_copies() -> None:
    base = {"use_vllm": True, "vllm_mode": "colocate", "deepspeed": "zero3"}
    assert (
        t({**base, "sleep_level": 1}, backend="swift").offload_s
        > t({**base, "sleep_level": 0}, backend="swift").offload_s
    )


def test_move_model_batches_slows_the_sync() -> None:
    base = {"use_vllm": True, "vllm_mode": "colocate", "deepspeed": "zero3"}
    assert t({**base, "move_model_batches": 16}, backend="swift").sync_s > t(base, backend="swift").sync_s


def test_cpu_only_shape_still_gets_a_number() -> None:
    spec = find_model("Qwen2-7B")
    assert spec is not None
    e = estimate_step_time(job_shape("trl", {}, {}, JOB, spec, 0), None)
    assert e.total_s > 0 and e.throughput > 0
