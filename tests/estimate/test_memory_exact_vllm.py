"""More exact bytes, computed by hand: vLLM's start-up check per framework, its rollout concurrency and
exact boundaries, a VL model's vision tower in the sync gather, and the terms no other exact test
reaches (see ``test_memory_exact.py`` for the models, the cards and the conventions).

The start-up check: vLLM starts only if the free memory ≥ ``utilization × total``; free memory is the
card less the CUDA context (0.5 GiB = 536,870,912) and what the trainer already holds (policy and
reference, by framework). Qwen2-7B on 8 × A100-80G (81,920 MiB = 85,899,345,920 B):
2P = 15,231,233,024; 2P/8 = 1,903,904,128; 4P/8 = 3,807,808,256.
Budgets: 0.9 · total = 77,309,411,328; 0.99 · total = 85,040,352,460.8 → 85,040,352,460; 1.0 · total.
"""

from __future__ import annotations

from typing import Any

import pytest

from autotune.estimate import (
    GIB,
    GpuSpec,
    JobShape,
    MemoryEstimate,
    estimate_memory,
    find_gpu,
    find_model,
    generic_gpu,
)
from autotune.estimate.memory import MemoryTerms, memory_terms
from autotune.jobconfig import JobConfig


def _shape(model: str, n: int, **config: Any) -> JobShape:
    base: dict[str, Any] = {
        "world_size": n,
        "global_batch": 64,
        "num_generations": 8,
        "grad_accum": 1,
        "per_device_batch": 1,
        "use_vllm": True,
    }
    spec = find_model(model)
    assert spec is not None
    return JobShape(JobConfig(**{**base, **config}), spec, n)


def _card(gpu: str | GpuSpec) -> GpuSpec:
    card = find_gpu(gpu) if isinstance(gpu, str) else gpu
    assert card is not None
    return card


def _estimate(model: str, gpu: str | GpuSpec, n: int, **config: Any) -> MemoryEstimate:
    return estimate_memory(_shape(model, n, **config), _card(gpu))


def _terms(model: str, gpu: str | GpuSpec, n: int, **config: Any) -> MemoryTerms:
    return memory_terms(_shape(model, n, **config), _card(gpu).memory_bytes)


STARTUP_CASES = [
    # ms-swift without DeepSpeed, loaded first, offload_model: the policy moved away, the reference (2P)
    #   stays: free = 85,899,345,920 − 536,870,912 − 15,231,233,024 = 70,131,241,984;
    #   deficit = 77,309,411,328 − 70,131,241,984 = 7,178,169,344
    pytest.param(
        {"loads_before_vllm": True, "rollout_offload_model": True, "beta": 0.04, "vllm_util": 0.9},
        7_178_169_344,
        id="loads-first-offload-model",
    ),
    # vLLM first, no DeepSpeed: the policy is on the GPU at load (2P), the reference not yet (0):
    #   the same free memory and deficit as above
    pytest.param({"beta": 0.04, "vllm_util": 0.9}, 7_178_169_344, id="vllm-first-no-deepspeed"),
    # vLLM first under ZeRO-2: DeepSpeed has placed nothing yet, policy and reference 0:
    #   free = 85,899,345,920 − 536,870,912 = 85,362,475,008; deficit 85,899,345,920 − that = 536,870,912
    pytest.param(
        {"deepspeed": True, "zero_stage": 2, "beta": 0.04, "vllm_util": 1.0},
        536_870_912,
        id="vllm-first-zero2",
    ),
    # ZeRO-3 partitions both at load (zero.Init): policy 2P/8 + reference 2P/8 = 3,807,808,256;
    #   free = 85,362,475,008 − 3,807,808,256 = 81,554,666,752; deficit 85,040,352,460 − that
    #   = 3,485,685,708
    pytest.param(
        {"deepspeed": True, "zero_stage": 3, "beta": 0.04, "vllm_util": 0.99}, 3_485_685_708, id="zero3"
    ),
    # ZeRO-3 with parameter offload: both partitions on the host, nothing held: deficit 536,870,912
    pytest.param(
        {"deepspeed": True, "zero_stage": 3, "beta": 0.04, "ds_offload_param": True, "vllm_util": 1.0},
        536_870_912,
        id="zero3-offload-param",
    ),
    # FSDP full shard builds fp32 shards first: 4P/8 = 3,807,808,256 held (no reference, beta 0):
    #   the same free memory as ZeRO-3 above → deficit 3,485,685,708
    pytest.param({"fsdp": True, "zero_stage": 3, "vllm_util": 0.99}, 3_485_685_708, id="fsdp"),
    # FSDP with parameter offload (offload_model): nothing held → deficit 536,870,912
    pytest.param(
        {"fsdp": True, "zero_stage": 3, "rollout_offload_model": True, "vllm_util": 1.0},
        536_870_912,
        id="fsdp-offload",
    ),
]


@pytest.mark.parametrize(("config", "deficit"), STARTUP_CASES)
def test_startup_deficit_per_framework_is_the_hand_computed_bytes(
    config: dict[str, Any], deficit: int
) -> None:
    est = _estimate("Qwen2-7B", "A100-80G", 8, **config)
    assert (est.vllm_startup_ok, est.vllm_startup_deficit_bytes) == (False, deficit)


def test_startup_check_passes_with_free_memory_equal_to_the_budget() -> None:
    # Qwen2.5-0.5B on one 64 GiB card, ZeRO-2, vLLM first: free = 64 GiB − 0.5 GiB = 63.5 GiB;
    # utilization 127/128 (exact in binary) reserves 64 GiB · 127/128 = 63.5 GiB: exactly the free memory
    card = generic_gpu("64 GiB card", 64 * GIB)
    est = _estimate("Qwen2.5-0.5B", card, 1, deepspeed=True, zero_stage=2, vllm_util=127 / 128)
    assert (est.vllm_startup_ok, est.vllm_startup_deficit_bytes) == (True, 0)


def test_kv_check_passes_with_a_cache_of_exactly_one_sequence() -> None:
    # Qwen2.5-0.5B, TP 1, utilization 0.5, 64 sequences, max_model_len 2,048: one sequence needs
    #   2,048 · 12,288 = 25,165,824 B. vLLM's own share: weights 2P = 988,065,536, profiled peak
    #   8,192 · 36,352 + 64 · 151,936 · 8 = 375,586,816, 0.5 GiB = 536,870,912 → 1,900,523,264.
    #   A card of 2 · (1,900,523,264 + 25,165,824) = 3,851,378,176 B leaves exactly 25,165,824 for KV.
    card = generic_gpu("small card", 3_851_378_176)
    est = _estimate("Qwen2.5-0.5B", card, 1, vllm_util=0.5, vllm_max_num_seqs=64, vllm_max_model_len=2048)
    assert (est.kv_bytes, est.kv_tokens) == (25_165_824, 2048)
    assert (est.kv_ok, est.kv_deficit_bytes) == (True, 0)


VLLM_SMALL = {"vllm_util": 0.5, "vllm_max_num_seqs": 64, "vllm_max_model_len": 2048}


def test_rollout_concurrency_bound_by_sequences_per_instance() -> None:
    # Qwen2.5-0.5B on 1 × A100-80G: 3,316,353 KV tokens (test_memory_exact's VLLM_CASES), 1,536 tokens a
    # sequence → 2,159 fit; 64 seqs allowed; the batch of 32 on one instance → ceil(32 / 1) = 32
    terms = _terms("Qwen2.5-0.5B", "A100-80G", 1, global_batch=32, **VLLM_SMALL)
    assert (terms.vllm.kv_tokens, terms.vllm.concurrency) == (3_316_353, 32)
    # a batch of 128 on one instance: 64 sequences at most (vllm_max_num_seqs)
    terms = _terms("Qwen2.5-0.5B", "A100-80G", 1, global_batch=128, **VLLM_SMALL)
    assert terms.vllm.concurrency == 64
    # 8 GPUs, TP 1 (8 instances), a batch of 8: one sequence each, ceil(8 / 8) = 1
    est = _estimate("Qwen2.5-0.5B", "A10", 8, global_batch=8, **VLLM_SMALL)
    assert est.rollout_concurrency == 1


def test_rollout_concurrency_bound_by_the_kv_cache_is_a_whole_number() -> None:
    # Qwen2.5-0.5B on 1 × A10: KV 10,172,780,800 B // 12,288 = 827,863 tokens (VLLM_CASES); a
    # sequence of 512 + 16,384 = 16,896 tokens → 827,863 // 16,896 = 48 (48 · 16,896 = 811,008), under
    # the 64 sequences allowed and the 64 of the batch
    terms = _terms("Qwen2.5-0.5B", "A10", 1, max_completion_length=16384, **VLLM_SMALL)
    assert (terms.vllm.kv_tokens, terms.vllm.concurrency) == (827_863, 48)


def test_vllm_batched_tokens_of_one_is_kept() -> None:
    # max_num_batched_tokens 1: the profiled peak is 1 · 36,352 + 64 · 151,936 · 8 = 77,827,584;
    # KV on an A10 at 0.5 = 12,073,304,064 − 988,065,536 − 77,827,584 − 536,870,912 = 10,470,540,032
    est = _estimate("Qwen2.5-0.5B", "A10", 1, vllm_max_num_batched_tokens=1, **VLLM_SMALL)
    assert est.kv_bytes == 10_470_540_032


def test_vllm_activation_peak_divides_whole_bytes_by_tp() -> None:
    # Qwen2.5-0.5B on 7 × A10, TP 7 (14 heads split 7 ways; 2 KV heads replicated: ceil(2/7) = 1):
    #   weights int(988,065,536 / 7) = 141,152,219; MLP bytes per token (6 · 4,864 + 8 · 896) // 7
    #   = 36,352 // 7 = 5,193 → 8,192 · 5,193 = 42,541,056, + sampler 77,791,232 = 120,332,288;
    #   overhead 0.5 GiB + 0.25 GiB (TP > 1) = 805,306,368;
    #   KV = 12,073,304,064 − 141,152,219 − 120,332,288 − 805,306,368 = 11,006,513,189
    #   → // (2 · 24 · 1 · 64 · 2 = 6,144) = 1,791,424 tokens
    terms = _terms("Qwen2.5-0.5B", "A10", 7, global_batch=56, vllm_tp=7, **VLLM_SMALL)
    assert (terms.vllm.kv_bytes, terms.vllm.kv_tokens) == (11_006_513_189, 1_791_424)


# Qwen2-VL-2B-Instruct (tied): P = 2,208,985,600 of which the vision tower and merger V = 665,271,296
# (the catalog's count from the vision config); 28 layers, h = 1,536, vocabulary 151,936.
#   embeddings 151,936 · 1,536 + 1,536 = 233,375,232; a decoder layer (P − V − embeddings) / 28
#   = 1,310,339,072 / 28 = 46,797,824.
VL_SYNC_CASES = [
    # one layer per batch: the vision tower (665,271,296) is the largest unit gathered → × 2 B
    pytest.param(28, 1_330_542_592, id="28-batches-vision-largest"),
    # one batch of all 28 layers: 1,310,339,072 (the language part only) → × 2 B
    pytest.param(1, 2_620_678_144, id="1-batch-language-layers"),
]


@pytest.mark.parametrize(("batches", "expected"), VL_SYNC_CASES)
def test_zero3_sync_gather_of_a_vl_model_counts_the_vision_tower_apart(batches: int, expected: int) -> None:
    model = find_model("Qwen2-VL-2B-Instruct")
    assert model is not None
    assert (model.params, model.vision_params, model.layers, model.hidden) == (
        2_208_985_600,
        665_271_296,
        28,
        1536,
    )
    est = _estimate(
        "Qwen2-VL-2B-Instruct",
        "A100-80G",
        4,
        deepspeed=True,
        zero_stage=3,
        vllm_util=0.3,
        sleep_level=1,
        weight_sync="batches",
        move_model_batches=batches,
        vllm_max_model_len=2048,
    )
    assert est.phases["sync"]["zero3_gather"] == expected


def test_generation_in_the_trainer_outside_zero3_gathers_nothing() -> None:
    # Qwen2.5-0.5B on 2 × A10, ZeRO-2, no vLLM: the rollout phase holds the states whole, nothing gathered
    est = _estimate("Qwen2.5-0.5B", "A10", 2, deepspeed=True, zero_stage=2, use_vllm=False)
    assert est.phases["rollout"]["zero3_gather"] == 0


def test_no_gpu_known_means_no_colocated_rollout_phase() -> None:
    # vLLM asked for on 1 GPU whose card is unknown: capacity 0, nothing colocated, no rollout phase
    shape = _shape("Qwen2.5-0.5B", 1, **VLLM_SMALL)
    est = estimate_memory(shape, None)
    assert set(est.phases) == {"train"} and not est.on_gpu


def test_lora_rank_one_trains_an_adapter() -> None:
    # Qwen2.5-0.5B, rank 1 (q = 896, kv = 128, I = 4,864): (1,792 + 2 · 1,024 + 1,792 + 2 · 5,760 + 5,760)
    #   = 22,912 per layer · 24 = A = 549,888; on 2 GPUs without DeepSpeed: weights 2P + 4A
    #   = 988,065,536 + 2,199,552 = 990,265,088; fp32 gradients 4A = 2,199,552; Adam 8A = 4,399,104
    est = _estimate("Qwen2.5-0.5B", "A10", 2, lora_rank=1, use_vllm=False)
    train = est.phases["train"]
    assert (train["policy_weights"], train["gradients"], train["optimizer_states"]) == (
        990_265_088,
        2_199_552,
        4_399_104,
    )
