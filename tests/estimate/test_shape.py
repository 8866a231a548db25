from __future__ import annotations

from typing import Any

import pytest

from autotune.backends import job_shape
from autotune.errors import UsageError
from autotune.estimate import find_model

MODEL = find_model("Qwen2-7B")
JOB = {"global_batch": 64, "num_generations": 8, "max_completion_length": 1024}


def shape(
    backend: str,
    params: dict[str, Any],
    fixed: dict[str, Any] | None = None,
    n: int = 8,
    derived: dict[str, Any] | None = None,
):  # noqa: ANN201
    assert MODEL is not None
    return job_shape(backend, params, derived or {}, {**JOB, **(fixed or {})}, MODEL, n)


@pytest.mark.parametrize(
    ("preset", "trl"),
    [
        (None, {"zero_stage": 0}),
        ("zero2", {"zero_stage": 2}),
        ("zero3", {"zero_stage": 3}),
        ("zero2_offload", {"zero_stage": 2, "offload_optimizer": True}),
        ("zero3_offload", {"zero_stage": 3, "offload_optimizer": True, "offload_param": True}),
    ],
)
def test_both_vocabularies_give_the_same_deepspeed_facts(preset: str | None, trl: dict[str, Any]) -> None:
    a, b = shape("swift", {"deepspeed": preset}), shape("trl", trl)
    assert (a.deepspeed, a.zero_stage, a.ds_offload_optimizer, a.ds_offload_param) == (
        b.deepspeed,
        b.zero_stage,
        b.ds_offload_optimizer,
        b.ds_offload_param,
    )


def test_swift_zero0_is_deepspeed_but_none_is_not() -> None:
    assert shape("swift", {"deepspeed": "zero0"}).deepspeed
    assert not shape("swift", {"deepspeed": None}).deepspeed
    assert not shape("swift", {"deepspeed": "none"}).deepspeed


def test_trl_offload_flags_need_their_stage() -> None:
    s = shape("trl", {"zero_stage": 2, "offload_optimizer": True, "offload_param": True})
    assert s.ds_offload_optimizer and not s.ds_offload_param


def test_sleep_modes() -> None:
    assert shape("trl", {"use_vllm": True, "vllm_enable_sleep_mode": True}).sleep_level == 2
    assert shape("trl", {"use_vllm": True}).sleep_level == 0
    assert shape("swift", {"use_vllm": True, "vllm_mode": "colocate", "sleep_level": 1}).sleep_level == 1
    # ms-swift forces 0 in server mode and without vLLM
    assert shape("swift", {"use_vllm": True, "vllm_mode": "server", "sleep_level": 1}).sleep_level == 0
    assert shape("swift", {"use_vllm": False, "sleep_level": 1}).sleep_level == 0


def test_lora_in_both_vocabularies() -> None:
    assert shape("trl", {}, {"use_peft": True, "lora_r": 32}).lora_rank == 32
    assert shape("trl", {}, {"use_peft": True}).lora_rank == 16  # TRL's ModelConfig default
    assert shape("trl", {}, {"lora_r": 32}).lora_rank == 0  # without use_peft TRL trains everything
    assert shape("swift", {}, {"tuner_type": "lora", "lora_rank": 64}).lora_rank == 64
    assert shape("swift", {}, {"train_type": "lora"}).lora_rank == 8  # ms-swift v3 spelling and default
    assert shape("swift", {}, {"tuner_type": "full", "lora_rank": 64}).lora_rank == 0


def test_framework_defaults() -> None:
    trl, swift = shape("trl", {"use_vllm": True}), shape("swift", {"use_vllm": True, "vllm_mode": "colocate"})
    assert (trl.beta, swift.beta) == (0.0, 0.04)
    assert (trl.vllm_util, swift.vllm_util) == (0.3, 0.9)
    assert (trl.per_device_batch, swift.per_device_batch) == (8, 1)
    assert trl.gradient_checkpointing and swift.gradient_checkpointing
    assert trl.vllm_max_model_len == swift.vllm_max_model_len == 131072  # the model's max position


def test_max_model_len_spellings() -> None:
    assert shape("trl", {"use_vllm": True}, {"vllm_max_model_length": 2048}).vllm_max_model_len == 2048
    assert (
        shape(
            "swift", {"use_vllm": True, "vllm_mode": "colocate"}, {"vllm_max_model_len": 4096}
        ).vllm_max_model_len
        == 4096
    )


def test_values_from_a_fixed_file_may_be_strings() -> None:
    s = shape(
        "swift",
        {"use_vllm": "true", "vllm_mode": "colocate"},
        {"beta": "0.1", "tuner_type": "LoRA", "lora_rank": "16"},
    )
    assert s.use_vllm and s.beta == 0.1 and s.lora_rank == 16


def test_gradient_accumulation_derived_or_given() -> None:
    assert shape("trl", {"per_device_train_batch_size": 4}).grad_accum == 2
    assert (
        shape(
            "trl",
            {"per_device_train_batch_size": 4},
            derived={"world_size": 8, "gradient_accumulation_steps": 5},
        ).grad_accum
        == 5
    )


def test_vllm_needs_a_gpu() -> None:
    s = shape("trl", {"use_vllm": True, "vllm_tensor_parallel_size": 2, "num_processes": 2}, n=0)
    assert not s.use_vllm and s.vllm_tp == 1 and not s.on_gpu
    assert s.world_size == 2  # num_processes on a CPU-only run


def test_trl_vllm_max_num_seqs_follows_trl() -> None:
    # trl passes max_num_seqs = per_device_train_batch_size × tp × steps_per_generation
    s = shape("trl", {"use_vllm": True, "vllm_tensor_parallel_size": 2, "per_device_train_batch_size": 2})
    assert s.vllm_max_num_seqs == 2 * 2 * s.grad_accum


def test_unknown_deepspeed_preset_is_a_usage_error() -> None:
    with pytest.raises(UsageError) as info:
        shape("swift", {"deepspeed": "zero4"})
    assert "zero4" in str(info.value) and "zero3_offload" in str(info.value)


def test_unreadable_value_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        shape("trl", {"per_device_train_batch_size": "many"})


def test_move_model_batches_only_under_zero3_with_vllm() -> None:
    vllm = {"use_vllm": True, "vllm_mode": "colocate"}
    assert shape("swift", {"deepspeed": "zero3", "move_model_batches": 8, **vllm}).move_model_batches == 8
    assert shape("swift", {"deepspeed": "zero2", "move_model_batches": 8, **vllm}).move_model_batches is None
    # ms-swift splits only the weight sync into vLLM: without vLLM the flag does nothing
    assert shape("swift", {"deepspeed": "zero3", "move_model_batches": 8}).move_model_batches is None
