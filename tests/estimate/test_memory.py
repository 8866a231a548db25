from __future__ import annotations

import json
from typing import Any

import pytest

from autotune.backends import job_shape
from autotune.estimate import (
    COMPONENTS,
    GIB,
    MemoryEstimate,
    estimate_memory,
    find_gpu,
    find_model,
    generic_gpu,
    lora_params,
    should_prune,
)

JOB = {"global_batch": 64, "num_generations": 8, "max_prompt_length": 512, "max_completion_length": 1024}


def est(
    backend: str,
    params: dict[str, Any],
    *,
    model: str = "Qwen2-7B",
    gpu: str = "A100-80G",
    n: int = 8,
    **fixed: Any,
) -> MemoryEstimate:
    spec = find_model(model)
    assert spec is not None
    g = find_gpu(gpu) if gpu != "70G" else generic_gpu("70 GB card", 70 * GIB)
    shape = job_shape(backend, params, {}, {**JOB, **fixed}, spec, n)
    return estimate_memory(shape, g)


# --- the classic failures are judged infeasible


@pytest.mark.parametrize("n", [4, 8])
@pytest.mark.parametrize("backend,params", [("trl", {"zero_stage": 2}), ("swift", {"deepspeed": "zero2"})])
def test_7b_full_zero2_on_24gb_cards_does_not_fit(backend: str, params: dict[str, Any], n: int) -> None:
    e = est(backend, {**params, "per_device_train_batch_size": 1}, gpu="A10", n=n)
    assert not e.fits()
    assert should_prune(e)
    over = e.overflow()
    assert over is not None and over[0] in ("policy_weights", "optimizer_states") and over[1] > 5 * GIB
    # model states alone (DeepSpeed: 2P + 18P/N) exceed the card
    states = (
        e.components_bytes["policy_weights"]
        + e.components_bytes["gradients"]
        + e.components_bytes["optimizer_states"]
    )
    assert states > e.capacity_bytes


def test_vllm_utilization_leaving_too_little_free_memory_fails_startup() -> None:
    # ms-swift default utilization 0.9 beside a 7B policy and reference model on 80 GB.
    e = est(
        "swift",
        {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.9},
        model="Qwen2.5-7B-Instruct",
    )
    assert not e.vllm_startup_ok
    assert e.vllm_startup_deficit_bytes > 15 * GIB
    over = e.overflow()
    assert over is not None and over[0] == "vllm_reserved" and over[1] >= e.vllm_startup_deficit_bytes
    assert should_prune(e)
    assert "start-up check fails" in e.reason()


def test_offload_model_lets_vllm_start_beside_the_trainer() -> None:
    # ms-swift creates the engine inside its offload context: the policy is on the CPU then.
    base = {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.85, "sleep_level": 1}
    held = est("swift", {**base, "deepspeed": "zero2"}, beta=0.0)
    freed = est("swift", {**base, "deepspeed": "zero2", "offload_model": True}, beta=0.0)
    assert not held.vllm_startup_ok
    assert freed.vllm_startup_ok


def test_trl_small_utilization_default_starts() -> None:
    e = est("trl", {"use_vllm": True}, vllm_max_model_length=2048)
    assert e.vllm_startup_ok and e.kv_ok
    assert e.components_bytes["vllm_reserved"] == pytest.approx(0.3 * e.capacity_bytes, abs=1)


def test_weights_larger_than_the_vllm_budget_leave_no_kv() -> None:
    # 7B at TP 1 needs 15 GB of weights; 0.3 × 22.5 GiB cannot hold them.
    e = est(
        "trl",
        {"use_vllm": True, "vllm_gpu_memory_utilization": 0.3, "zero_stage": 3},
        gpu="A10",
        n=4,
        vllm_max_model_length=2048,
    )
    assert not e.kv_ok and e.kv_tokens == 0 and e.kv_bytes < 0
    assert should_prune(e)
    assert "KV cache" in e.reason()


def test_max_model_len_default_is_the_model_max_position() -> None:
    # Without vllm_max_model_len the frameworks let vLLM use max_position_embeddings (131072 for Qwen2-7B).
    params = {
        "use_vllm": True,
        "vllm_gpu_memory_utilization": 0.45,
        "vllm_tensor_parallel_size": 2,
        "zero_stage": 3,
        "offload_optimizer": True,
    }
    long = est("trl", params, gpu="A10", n=4)
    short = est("trl", params, gpu="A10", n=4, vllm_max_model_length=1536)
    assert not long.kv_ok and short.kv_ok
    assert long.kv_tokens == short.kv_tokens


# --- published configurations are judged feasible (frameworks.md / gpu-and-memory.md)

PUBLISHED: dict[str, dict[str, Any]] = {
    "verl Qwen2.5-0.5B GRPO-LoRA 1xH100": dict(
        backend="trl",
        model="Qwen2.5-0.5B",
        gpu="H100",
        n=1,
        params={"use_vllm": True, "vllm_gpu_memory_utilization": 0.5, "per_device_train_batch_size": 16},
        fixed={"use_peft": True, "lora_r": 64, "vllm_max_model_length": 2048},
    ),
    "verl Qwen2.5-7B LoRA 1xH100": dict(
        backend="trl",
        model="Qwen2.5-7B",
        gpu="H100",
        n=1,
        params={"use_vllm": True, "vllm_gpu_memory_utilization": 0.5, "per_device_train_batch_size": 4},
        fixed={"use_peft": True, "lora_r": 64, "vllm_max_model_length": 2048},
    ),
    "verl Qwen2-7B full 2xH800": dict(
        backend="trl",
        model="Qwen2-7B",
        gpu="H800",
        n=2,
        params={
            "zero_stage": 3,
            "offload_optimizer": True,
            "offload_param": True,
            "use_vllm": True,
            "vllm_gpu_memory_utilization": 0.5,
            "per_device_train_batch_size": 4,
        },
        fixed={"beta": 0.001, "vllm_max_model_length": 2048},
    ),
    "verl Qwen2-14B full 4xH800": dict(
        backend="trl",
        model="Qwen2.5-14B",
        gpu="H800",
        n=4,
        params={
            "zero_stage": 3,
            "offload_optimizer": True,
            "offload_param": True,
            "use_vllm": True,
            "vllm_gpu_memory_utilization": 0.5,
            "vllm_tensor_parallel_size": 2,
            "per_device_train_batch_size": 2,
        },
        fixed={"beta": 0.001, "vllm_max_model_length": 2048},
    ),
    # verl syncs FSDP weights into vLLM layer by layer: modelled as ms-swift's layered sync
    # (move_model_batches); TRL's PEFT sync gathers the whole model (see the test below).
    "verl Qwen2.5-32B LoRA 4xH100": dict(
        backend="swift",
        model="Qwen2.5-32B",
        gpu="H100",
        n=4,
        params={
            "deepspeed": "zero3",
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": 0.5,
            "vllm_tensor_parallel_size": 4,
            "move_model_batches": 8,
            "per_device_train_batch_size": 2,
        },
        fixed={"tuner_type": "lora", "lora_rank": 32, "vllm_max_model_len": 2048},
    ),
    "verl Qwen2-32B full 8xH20": dict(
        backend="trl",
        model="Qwen2.5-32B",
        gpu="H20",
        n=8,
        params={
            "zero_stage": 3,
            "offload_optimizer": True,
            "use_vllm": True,
            "vllm_gpu_memory_utilization": 0.4,
            "vllm_tensor_parallel_size": 4,
            "vllm_enable_sleep_mode": True,
            "per_device_train_batch_size": 2,
        },
        fixed={"vllm_max_model_length": 2048},
    ),
    "verl Qwen2.5-72B LoRA 8xH100": dict(
        backend="swift",
        model="Qwen2.5-72B",
        gpu="H100",
        n=8,
        params={
            "deepspeed": "zero3",
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": 0.5,
            "vllm_tensor_parallel_size": 8,
            "move_model_batches": 16,
            "per_device_train_batch_size": 1,
        },
        fixed={"tuner_type": "lora", "lora_rank": 32, "vllm_max_model_len": 2048},
    ),
    "ms-swift Qwen2.5-72B LoRA colocate 4x80GB": dict(
        backend="swift",
        model="Qwen2.5-72B-Instruct",
        gpu="A100-80G",
        n=4,
        params={
            "deepspeed": "zero3_offload",
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": 0.55,
            "vllm_tensor_parallel_size": 4,
            "move_model_batches": 16,
            "offload_optimizer": True,
            "offload_model": True,
            "sleep_level": 1,
            "per_device_train_batch_size": 1,
        },
        fixed={
            "tuner_type": "lora",
            "lora_rank": 8,
            "num_generations": 4,
            "global_batch": 16,
            "vllm_max_model_len": 2048,
        },
    ),
    "ms-swift Qwen3-8B full 8x70GB": dict(
        backend="swift",
        model="Qwen3-8B",
        gpu="70G",
        n=8,
        params={
            "deepspeed": "zero3",
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": 0.4,
            "sleep_level": 1,
            "offload_optimizer": True,
            "offload_model": True,
            "per_device_train_batch_size": 2,
        },
        fixed={
            "num_generations": 16,
            "global_batch": 128,
            "max_completion_length": 4096,
            "vllm_max_model_len": 8192,
        },
    ),
}


@pytest.mark.parametrize("case", sorted(PUBLISHED))
def test_published_configurations_fit(case: str) -> None:
    c = PUBLISHED[case]
    e = est(c["backend"], c["params"], model=c["model"], gpu=c["gpu"], n=c["n"], **c["fixed"])
    assert e.fits(), e.reason()
    assert not should_prune(e)
    assert e.vllm_startup_ok and e.kv_ok
    assert e.rollout_concurrency >= 1


# --- components and phases


def test_components_are_stable_and_sum_to_the_peak() -> None:
    e = est(
        "swift",
        {
            "deepspeed": "zero3",
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": 0.4,
            "sleep_level": 1,
        },
        vllm_max_model_len=2048,
    )
    assert tuple(e.components_bytes) == COMPONENTS
    assert sum(e.components_bytes.values()) == e.peak_bytes
    assert set(e.phases) == {"train", "rollout", "sync"}
    assert e.phases_bytes[e.peak_phase] == e.peak_bytes == max(e.phases_bytes.values())


def test_logits_are_completion_tokens_times_vocabulary() -> None:
    e = est("trl", {"per_device_train_batch_size": 4}, max_completion_length=1024)
    assert e.phases["train"]["logits"] == 4 * 1024 * 152064 * 6


def test_gradient_checkpointing_cuts_activations() -> None:
    on = est("trl", {"per_device_train_batch_size": 8, "gradient_checkpointing": True})
    off = est("trl", {"per_device_train_batch_size": 8, "gradient_checkpointing": False})
    assert off.phases["train"]["activations"] > 10 * on.phases["train"]["activations"]


@pytest.mark.parametrize("backend,knob", [("trl", "zero_stage"), ("swift", "deepspeed")])
def test_peak_grows_with_micro_batch(backend: str, knob: str) -> None:
    stage = 3 if backend == "trl" else "zero3"
    ests = [est(backend, {knob: stage, "per_device_train_batch_size": b}) for b in (1, 2, 4, 8)]
    train = [e.phases_bytes["train"] for e in ests]
    assert train == sorted(train) and train[0] < train[-1]
    # the peak never shrinks; here it is the generation in the trainer (ZeRO-3 gathers the whole
    # model beside the kept gradient partitions), whose batch is the same at every micro-batch
    peaks = [e.peak_bytes for e in ests]
    assert peaks == sorted(peaks)


def test_zero_stages_and_offload_reduce_model_states() -> None:
    def states(params: dict[str, Any]) -> int:
        c = est("trl", params).phases["train"]
        return c["policy_weights"] + c["gradients"] + c["optimizer_states"]

    ddp, z2, z3 = states({"zero_stage": 0}), states({"zero_stage": 2}), states({"zero_stage": 3})
    z3_off = states({"zero_stage": 3, "offload_optimizer": True})
    z3_all = states({"zero_stage": 3, "offload_optimizer": True, "offload_param": True})
    assert ddp > z2 > z3 > z3_off > z3_all
    p = find_model("Qwen2-7B").params  # type: ignore[union-attr]
    assert ddp == 8 * p  # bf16 weights + bf16 grads + bf16 AdamW moments without DeepSpeed


def test_swift_presets_equal_trl_knobs() -> None:
    pairs = [
        ("zero2", {"zero_stage": 2}),
        ("zero3", {"zero_stage": 3}),
        ("zero2_offload", {"zero_stage": 2, "offload_optimizer": True}),
        ("zero3_offload", {"zero_stage": 3, "offload_optimizer": True, "offload_param": True}),
    ]
    for preset, trl in pairs:
        a = est("swift", {"deepspeed": preset, "per_device_train_batch_size": 4}, beta=0.0).phases["train"]
        b = est("trl", {**trl, "per_device_train_batch_size": 4}, beta=0.0).phases["train"]
        for c in ("policy_weights", "gradients", "optimizer_states", "activations", "logits"):
            assert a[c] == b[c], (preset, c)


def test_reference_model_only_with_beta_and_full_finetuning() -> None:
    full_kl = est("trl", {"zero_stage": 2}, beta=0.04)
    full_nokl = est("trl", {"zero_stage": 2}, beta=0.0)
    lora_kl = est("trl", {"zero_stage": 2}, beta=0.04, use_peft=True, lora_r=16)
    p = find_model("Qwen2-7B").params  # type: ignore[union-attr]
    assert full_kl.phases["train"]["reference_model"] == 2 * p
    assert full_nokl.phases["train"]["reference_model"] == 0
    assert lora_kl.phases["train"]["reference_model"] == 0  # the base model with the adapter disabled
    z3 = est("trl", {"zero_stage": 3}, beta=0.04)
    assert z3.phases["train"]["reference_model"] == 2 * p // 8


def test_swift_default_beta_brings_a_reference_model() -> None:
    assert est("swift", {}).phases["train"]["reference_model"] > 0
    assert est("trl", {}).phases["train"]["reference_model"] == 0


def test_lora_keeps_the_frozen_base_and_small_adapter_states() -> None:
    spec = find_model("Qwen2-7B")
    assert spec is not None
    a = lora_params(spec, 16)
    assert 30e6 < a < 60e6  # all-linear rank 16 on a 7B model ≈ 40M
    e = est("trl", {}, use_peft=True, lora_r=16).phases["train"]
    assert e["policy_weights"] == 2 * spec.params + 4 * a
    assert e["optimizer_states"] == 8 * a


def test_sleep_releases_vllm_memory_during_training() -> None:
    base = {
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_gpu_memory_utilization": 0.5,
        "deepspeed": "zero3",
    }
    awake = est("swift", {**base, "sleep_level": 0}, vllm_max_model_len=2048)
    l1 = est("swift", {**base, "sleep_level": 1}, vllm_max_model_len=2048)
    l2 = est("swift", {**base, "sleep_level": 2}, vllm_max_model_len=2048)
    assert awake.phases["train"]["vllm_reserved"] == awake.phases["rollout"]["vllm_reserved"]
    assert l1.phases["train"]["vllm_reserved"] < 1 * GIB
    assert l1.phases["train"]["vllm_reserved"] == l2.phases["train"]["vllm_reserved"]
    # level 1 keeps the weights in host RAM, level 2 drops them
    assert l1.host_bytes - l2.host_bytes == 8 * 2 * find_model("Qwen2-7B").params  # type: ignore[union-attr]


def test_move_model_batches_splits_the_zero3_gather() -> None:
    base = {
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_gpu_memory_utilization": 0.4,
        "deepspeed": "zero3",
        "sleep_level": 1,
    }
    whole = est("swift", base, vllm_max_model_len=2048).phases["sync"]["zero3_gather"]
    split = [
        est("swift", {**base, "move_model_batches": b}, vllm_max_model_len=2048).phases["sync"][
            "zero3_gather"
        ]
        for b in (2, 4, 8)
    ]
    p = find_model("Qwen2-7B").params  # type: ignore[union-attr]
    assert whole == 2 * p
    assert whole > split[0] > split[1] >= split[2] > 0
    zero2 = est("swift", {**base, "deepspeed": "zero2"}, vllm_max_model_len=2048)
    assert zero2.phases["sync"]["zero3_gather"] == 0


def test_trl_peft_sync_under_zero3_gathers_the_whole_model() -> None:
    # trl/generation/vllm_generation.py::_iter_named_params gathers every parameter at once for PEFT:
    # 72B LoRA under ZeRO-3 with TRL cannot sync into vLLM on 80 GB cards.
    e = est(
        "trl",
        {
            "zero_stage": 3,
            "use_vllm": True,
            "vllm_gpu_memory_utilization": 0.5,
            "vllm_tensor_parallel_size": 8,
        },
        model="Qwen2.5-72B",
        gpu="H100",
        use_peft=True,
        lora_r=32,
        vllm_max_model_length=2048,
    )
    assert e.peak_phase == "sync" and not e.fits()
    over = e.overflow()
    assert over is not None and over[0] == "zero3_gather"


def test_trl_gathers_one_parameter_at_a_time_for_full_finetuning() -> None:
    spec = find_model("Qwen2-7B")
    assert spec is not None
    base = {"use_vllm": True, "vllm_gpu_memory_utilization": 0.4, "zero_stage": 3}
    full = est("trl", base, vllm_max_model_length=2048).phases["sync"]["zero3_gather"]
    lora = est("trl", base, vllm_max_model_length=2048, use_peft=True, lora_r=8).phases["sync"][
        "zero3_gather"
    ]
    assert full == 2 * spec.largest_layer_params
    assert lora == 2 * spec.params


def test_kv_capacity_grows_with_utilization_and_tensor_parallelism() -> None:
    def kv(util: float, tp: int) -> int:
        return est(
            "trl",
            {
                "use_vllm": True,
                "vllm_gpu_memory_utilization": util,
                "vllm_tensor_parallel_size": tp,
                "zero_stage": 3,
            },
            vllm_max_model_length=2048,
        ).kv_tokens

    assert kv(0.3, 1) < kv(0.5, 1) < kv(0.7, 1)
    assert kv(0.3, 1) < kv(0.3, 2) < kv(0.3, 4)


def test_kv_tokens_are_budget_over_bytes_per_token() -> None:
    e = est(
        "trl",
        {
            "use_vllm": True,
            "vllm_gpu_memory_utilization": 0.5,
            "vllm_tensor_parallel_size": 2,
            "zero_stage": 3,
        },
        vllm_max_model_length=2048,
    )
    per_token = 2 * 28 * 2 * 128 * 2  # 4 KV heads split over TP 2
    assert e.kv_tokens == e.kv_bytes // per_token
    assert e.rollout_concurrency == min(8 * 2 * 1, e.kv_tokens // 1536, 64 // 4)


def test_cpu_only_trial_is_never_judged() -> None:
    spec = find_model("Qwen2-7B")
    assert spec is not None
    shape = job_shape("trl", {"use_vllm": True, "zero_stage": 2}, {}, JOB, spec, 0)
    for gpu in (None, find_gpu("A10")):
        e = estimate_memory(shape, gpu)
        assert not e.on_gpu and e.fits() and not should_prune(e) and e.overflow() is None
        assert "CPU-only" in e.reason()


def test_margin_separates_tight_from_pruned() -> None:
    e = est("trl", {"zero_stage": 2, "per_device_train_batch_size": 1}, gpu="A10", n=8)
    over = e.peak_bytes / e.capacity_bytes - 1
    assert not should_prune(e, margin=over + 0.01)
    assert should_prune(e, margin=over - 0.01)
    fits = est(
        "trl", {"zero_stage": 3, "offload_optimizer": True, "per_device_train_batch_size": 1}, gpu="A10", n=8
    )
    assert fits.fits() and not fits.fits(margin=1 - fits.peak_bytes / fits.capacity_bytes + 0.01)


def test_dict_round_trip_and_one_line_reason() -> None:
    e = est(
        "swift",
        {"deepspeed": "zero2", "use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.9},
        gpu="A10",
        n=4,
    )
    d = json.loads(json.dumps(e.to_dict()))
    back = MemoryEstimate.from_dict(d)
    assert back == e
    assert d["fits"] is False and d["overflow"]["component"] in COMPONENTS
    line = e.reason()
    assert "\n" not in line and line.count("GiB") >= 3
    assert "of 22.5 GiB per GPU" in line


def test_host_memory_counts_offloaded_states() -> None:
    spec = find_model("Qwen2-7B")
    assert spec is not None
    plain = est("trl", {"zero_stage": 3})
    off = est("trl", {"zero_stage": 3, "offload_optimizer": True, "offload_param": True})
    assert off.host_bytes - plain.host_bytes >= int(spec.params * 18 * 1.5)
