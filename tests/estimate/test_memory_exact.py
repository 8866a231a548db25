"""Exact bytes of every memory term, computed by hand (no optional package needed).

The direction tests of ``test_memory.py`` say *more* or *less*; these say *how much*. Each expected
number below is worked out in the comment above it from the model the estimator documents
(``autotune/estimate/memory.py``) and from DeepSpeed's own estimators
(``2P + 18P/N`` for ZeRO-2, ``4·largest_layer + 18P/N`` for ZeRO-3, the "18" being 2 B bf16
weights + 4 B fp32 gradients + 4 B fp32 master + 8 B Adam moments). ``test_deepspeed_parity.py``
checks the model states against DeepSpeed itself where it is installed: a second, independent check.

The two models (architecture from their ``config.json``):

- Qwen2.5-0.5B: 24 layers, hidden h = 896, 14 heads × 64, 2 KV heads, intermediate I = 4864,
  vocabulary V = 151,936, tied embeddings.
- Qwen2-7B: 28 layers, h = 3584, 28 heads × 128, 4 KV heads, I = 18,944, V = 152,064, untied.

The two GPUs: A10 (NVML total 23,028 MiB = 24,146,608,128 B) and A100-80G (81,920 MiB =
85,899,345,920 B).
"""

from __future__ import annotations

from typing import Any

import pytest

from autotune.estimate import (
    GIB,
    JobShape,
    MemoryEstimate,
    ModelSpec,
    estimate_memory,
    find_gpu,
    find_model,
    generic_gpu,
    lora_params,
    model_states,
)
from autotune.jobconfig import JobConfig

# Parameter counts, by hand from the configs (Qwen2 has q/k/v biases; norms are one vector of h):
# Qwen2.5-0.5B, one layer: q 896·896+896 = 803,712; k and v 896·128+128 = 114,816 each;
#   o 896·896 = 802,816; MLP 3·896·4864 = 13,074,432; two norms 1,792 → 14,912,384.
#   24 layers = 357,897,216; embedding 151,936·896 = 136,134,656 (tied); final norm 896
#   → P = 494,032,768. Largest module: the embedding, 136,134,656.
P_SMALL, LARGEST_SMALL = 494_032_768, 136_134_656
# Qwen2-7B, one layer: q 3584·3584+3584 = 12,848,640; k and v 3584·512+512 = 1,835,520 each;
#   o 3584·3584 = 12,845,056; MLP 3·3584·18,944 = 203,685,888; norms 7,168 → 233,057,792.
#   28 layers = 6,525,618,176; embedding and LM head 2 · 152,064·3584 = 2 · 544,997,376;
#   final norm 3,584 → P = 7,615,616,512. Largest module: the embedding, 544,997,376.
P_7B, LARGEST_7B = 7_615_616_512, 544_997_376

A10_BYTES = 24_146_608_128
A100_BYTES = 85_899_345_920
CUDA_CONTEXT = GIB // 2  # 536,870,912
NCCL = GIB // 4  # 268,435,456


def _model(name: str) -> ModelSpec:
    spec = find_model(name)
    assert spec is not None
    return spec


def _estimate(model: str, gpu: str, n: int, **config: Any) -> MemoryEstimate:
    base: dict[str, Any] = {"world_size": n, "global_batch": 64, "num_generations": 8, "grad_accum": 1}
    shape = JobShape(JobConfig(**{**base, **config}), _model(model), n)
    return estimate_memory(shape, find_gpu(gpu))


def test_the_catalog_holds_the_hand_counted_models_and_gpus() -> None:
    small, big = _model("Qwen2.5-0.5B"), _model("Qwen2-7B")
    assert (small.params, small.largest_layer_params) == (P_SMALL, LARGEST_SMALL)
    assert (big.params, big.largest_layer_params) == (P_7B, LARGEST_7B)
    a10, a100 = find_gpu("A10"), find_gpu("A100-80G")
    assert a10 is not None and a100 is not None
    assert (a10.memory_bytes, a100.memory_bytes) == (A10_BYTES, A100_BYTES)


# --- model states: (weights, gradients, optimizer states, host) per GPU
#
# Qwen2-7B: 2P = 15,231,233,024; 4P = 30,462,466,048; 6P = 45,693,699,072; 12P = 91,387,398,144.
#   N = 8: 2P/N = 1,903,904,128; 4P/N = 3,807,808,256; 6P/N = 5,711,712,384; 12P/N = 11,423,424,768.
#   4 · largest = 2,179,989,504.
# Qwen2.5-0.5B: 2P = 988,065,536; 4P = 1,976,131,072; 6P = 2,964,196,608; 12P = 5,928,393,216.
#   N = 2: 2P/N = 494,032,768; 4P/N = 988,065,536; 6P/N = 1,482,098,304; 12P/N = 2,964,196,608.
#   4 · largest = 544,538,624.
STATES_7B_ON_8 = {
    # plain DDP, torch AdamW on bf16 weights: 2 + 2 + 4 bytes per parameter, nothing partitioned
    "ddp": ((False, 0, False, False), (15_231_233_024, 15_231_233_024, 30_462_466_048, 0)),
    # ZeRO-0 (DeepSpeed's bf16 optimizer, unpartitioned): 2P + 6P (bf16 + fp32 grads) + 12P = 20P
    "zero0": ((True, 0, False, False), (15_231_233_024, 45_693_699_072, 91_387_398_144, 0)),
    # ZeRO-1: fp32 work partitioned, bf16 gradients whole: 2P + (2P + 4P/N) + 12P/N
    #   gradients 15,231,233,024 + 3,807,808,256 = 19,039,041,280
    "zero1": ((True, 1, False, False), (15_231_233_024, 19_039_041_280, 11_423_424_768, 0)),
    # ZeRO-2: 2P + 18P/N, the 18P/N being 6P/N gradients (bf16 + fp32) and 12P/N optimizer
    "zero2": ((True, 2, False, False), (15_231_233_024, 5_711_712_384, 11_423_424_768, 0)),
    # ZeRO-2 + optimizer offload: GPU 2P; CPU P · max(4N, 16) · 1.5 = 48P = 365,549,592,576
    "zero2_offload": ((True, 2, True, False), (15_231_233_024, 0, 0, 365_549_592_576)),
    # ZeRO-3: 4·largest + 18P/N: weights 4·largest + 2P/N = 2,179,989,504 + 1,903,904,128 =
    #   4,083,893,632; gradients 4P/N (fp32); optimizer 12P/N
    "zero3": ((True, 3, False, False), (4_083_893_632, 3_807_808_256, 11_423_424_768, 0)),
    # ZeRO-3 + optimizer offload: GPU 4·largest + 2P/N; CPU P · 16 · 1.5 = 24P = 182,774,796,288
    "zero3_offload_opt": ((True, 3, True, False), (4_083_893_632, 0, 0, 182_774_796_288)),
    # ZeRO-3 + optimizer and parameter offload: GPU 4·largest; CPU 18P · 1.5 = 27P = 205,621,645,824
    "zero3_offload_all": ((True, 3, True, True), (2_179_989_504, 0, 0, 205_621_645_824)),
    # ZeRO-3 + parameter offload alone: the bf16 partition leaves the GPU (host 2P · 1.5 = 3P =
    #   22,846,849,536); gradients 4P/N and optimizer 12P/N stay
    "zero3_offload_param": (
        (True, 3, False, True),
        (2_179_989_504, 3_807_808_256, 11_423_424_768, 22_846_849_536),
    ),
}
STATES_SMALL_ON_2 = {
    "ddp": ((False, 0, False, False), (988_065_536, 988_065_536, 1_976_131_072, 0)),
    "zero0": ((True, 0, False, False), (988_065_536, 2_964_196_608, 5_928_393_216, 0)),
    # ZeRO-1 gradients: 2P + 4P/N = 988,065,536 + 988,065,536 = 1,976,131,072
    "zero1": ((True, 1, False, False), (988_065_536, 1_976_131_072, 2_964_196_608, 0)),
    "zero2": ((True, 2, False, False), (988_065_536, 1_482_098_304, 2_964_196_608, 0)),
    # ZeRO-2 offload on 2 GPUs: max(4·2, 16) = 16 → P · 16 · 1.5 = 24P = 11,856,786,432
    "zero2_offload": ((True, 2, True, False), (988_065_536, 0, 0, 11_856_786_432)),
    # ZeRO-3 weights: 544,538,624 + 494,032,768 = 1,038,571,392
    "zero3": ((True, 3, False, False), (1_038_571_392, 988_065_536, 2_964_196_608, 0)),
    "zero3_offload_opt": ((True, 3, True, False), (1_038_571_392, 0, 0, 11_856_786_432)),
    # 27P = 13,338,884,736
    "zero3_offload_all": ((True, 3, True, True), (544_538_624, 0, 0, 13_338_884_736)),
    # 3P = 1,482,098,304
    "zero3_offload_param": ((True, 3, False, True), (544_538_624, 988_065_536, 2_964_196_608, 1_482_098_304)),
}
STATES_CASES = [
    pytest.param(P_7B, LARGEST_7B, 8, *case, id=f"7b-on-8-{name}") for name, case in STATES_7B_ON_8.items()
] + [
    pytest.param(P_SMALL, LARGEST_SMALL, 2, *case, id=f"0.5b-on-2-{name}")
    for name, case in STATES_SMALL_ON_2.items()
]


@pytest.mark.parametrize(("params", "largest", "n", "setup", "expected"), STATES_CASES)
def test_model_states_are_the_hand_computed_bytes(
    params: int, largest: int, n: int, setup: tuple[bool, int, bool, bool], expected: tuple[int, ...]
) -> None:
    deepspeed, stage, off_opt, off_param = setup
    got = model_states(
        params=params,
        largest_layer_params=largest,
        n_gpus=n,
        zero_stage=stage,
        deepspeed=deepspeed,
        offload_optimizer=off_opt,
        offload_param=off_param,
    )
    assert (got.weights_bytes, got.gradients_bytes, got.optimizer_bytes, got.host_bytes) == expected


@pytest.mark.parametrize("stage", [2, 3])
def test_fsdp_shards_the_states_as_the_zero_stage_of_its_strategy(stage: int) -> None:
    # FSDP FULL_SHARD (3) / SHARD_GRAD_OP (2) on Qwen2-7B × 8: the ZeRO-3 / ZeRO-2 rows above.
    est = _estimate("Qwen2-7B", "A100-80G", 8, fsdp=True, zero_stage=stage, per_device_batch=1)
    train = est.phases["train"]
    key = "zero3" if stage == 3 else "zero2"
    weights, grads, opt, _ = STATES_7B_ON_8[key][1]
    assert (train["policy_weights"], train["gradients"], train["optimizer_states"]) == (weights, grads, opt)


def test_lora_states_are_the_frozen_base_and_fp32_adapter() -> None:
    # LoRA rank 8 on every linear layer of Qwen2.5-0.5B (q = 14·64 = 896, kv = 2·64 = 128):
    #   r · ((h+q) + 2(h+kv) + (q+h) + 2(h+I) + (I+h))
    #   = 8 · (1,792 + 2·1,024 + 1,792 + 2·5,760 + 5,760) = 8 · 22,912 = 183,296 per layer;
    #   24 layers → A = 4,399,104 (what PEFT prints as trainable parameters).
    adapter = 4_399_104
    assert lora_params(_model("Qwen2.5-0.5B"), 8) == adapter
    # ZeRO-2 on 2 GPUs: frozen bf16 base 2P + fp32 adapter 4A = 988,065,536 + 17,596,416 = 1,005,661,952;
    #   fp32 gradients partitioned 4A/N = 8,798,208; Adam moments 8A/N = 17,596,416.
    got = model_states(
        params=P_SMALL,
        largest_layer_params=LARGEST_SMALL,
        n_gpus=2,
        zero_stage=2,
        deepspeed=True,
        offload_optimizer=False,
        offload_param=False,
        trainable_params=adapter,
    )
    assert (got.weights_bytes, got.gradients_bytes, got.optimizer_bytes, got.host_bytes) == (
        1_005_661_952,
        8_798_208,
        17_596_416,
        0,
    )


# --- activations, logits: per GPU, one micro-batch
#
# Bytes one decoder layer keeps per token without checkpointing: 32h + 8·kv + 8I
#   Qwen2.5-0.5B: 32·896 + 8·128 + 8·4,864 = 28,672 + 1,024 + 38,912 = 68,608
#   Qwen2-7B: 32·3,584 + 8·512 + 8·18,944 = 114,688 + 4,096 + 151,552 = 270,336
# With checkpointing: every layer keeps its bf16 input (2h per token) and one layer is recomputed
# in full during backward: L·T·2h + T·(per-layer bytes).
# A micro-batch of b sequences of 512 + 1024 tokens holds T = 1,536·b tokens.
ACTIVATION_CASES = [
    # Qwen2.5-0.5B, b = 4, T = 6,144: with checkpointing 24·6,144·1,792 + 6,144·68,608
    #   = 264,241,152 + 421,527,552 = 685,768,704; without 24·6,144·68,608 = 10,116,661,248
    pytest.param("Qwen2.5-0.5B", "A10", 4, True, 685_768_704, id="0.5b-a10-checkpointed"),
    pytest.param("Qwen2.5-0.5B", "A10", 4, False, 10_116_661_248, id="0.5b-a10-full"),
    # Qwen2-7B, b = 2, T = 3,072: with checkpointing 28·3,072·7,168 + 3,072·270,336
    #   = 616,562,688 + 830,472,192 = 1,447,034,880; without 28·3,072·270,336 = 23,253,221,376
    pytest.param("Qwen2-7B", "A100-80G", 2, True, 1_447_034_880, id="7b-a100-checkpointed"),
    pytest.param("Qwen2-7B", "A100-80G", 2, False, 23_253_221_376, id="7b-a100-full"),
]


@pytest.mark.parametrize(("model", "gpu", "batch", "checkpointing", "expected"), ACTIVATION_CASES)
def test_activations_are_the_hand_computed_bytes(
    model: str, gpu: str, batch: int, checkpointing: bool, expected: int
) -> None:
    est = _estimate(model, gpu, 1, per_device_batch=batch, gradient_checkpointing=checkpointing)
    assert est.phases["train"]["activations"] == expected


@pytest.mark.parametrize(
    ("model", "batch", "expected"),
    [
        # logits for completion tokens only: T · 1,024 / 1,536 tokens × V × 6 B
        # (bf16 logits + a bf16 scaled copy + a bf16 gradient)
        # Qwen2.5-0.5B, b = 4: 6,144 · 1,024 / 1,536 = 4,096 tokens; 4,096 · 151,936 · 6 = 3,733,979,136
        pytest.param("Qwen2.5-0.5B", 4, 3_733_979_136, id="0.5b"),
        # Qwen2-7B, b = 2: 2,048 tokens; 2,048 · 152,064 · 6 = 1,868,562,432
        pytest.param("Qwen2-7B", 2, 1_868_562_432, id="7b"),
    ],
)
def test_logits_are_the_hand_computed_bytes(model: str, batch: int, expected: int) -> None:
    est = _estimate(model, "A100-80G", 1, per_device_batch=batch)
    assert est.phases["train"]["logits"] == expected


def test_a_packed_micro_batch_counts_its_token_budget() -> None:
    # micro_batch_tokens 4,096 on Qwen2.5-0.5B: activations 24·4,096·1,792 + 4,096·68,608
    #   = 176,160,768 + 281,018,368 = 457,179,136; logits 4,096·1,024 // 1,536 = 2,730 tokens
    #   → 2,730 · 151,936 · 6 = 2,488,711,680
    est = _estimate("Qwen2.5-0.5B", "A10", 1, per_device_batch=8, micro_batch_tokens=4096)
    assert (est.phases["train"]["activations"], est.phases["train"]["logits"]) == (457_179_136, 2_488_711_680)


# --- colocated vLLM: KV bytes per token, budget, KV cache, start-up check
#
# KV bytes per token per GPU: 2 (K and V) × layers × ceil(kv_heads / TP) × head_dim × 2 B
#   Qwen2.5-0.5B: 2·24·2·64·2 = 12,288 (TP 1); 2·24·1·64·2 = 6,144 (TP 2)
#   Qwen2-7B: 2·28·4·128·2 = 57,344 (TP 1); 2·28·2·128·2 = 28,672 (TP 2)
# Budget: utilization × total. KV cache = budget − 2P/TP − vLLM's profiled activation peak −
# 0.5 GiB (CUDA graphs, non-torch; + 0.25 GiB at TP > 1). The activation peak is
# batched tokens × (6I + 8h)/TP + min(max_num_seqs, 1024) × V × 4 B × 2, batched tokens being vLLM's
# default 8,192 on cards under 70 GiB and on A100s (vLLM's exception), 16,384 on other larger ones.
# Every case: utilization 0.5, TP 1, max_num_seqs 64, max_model_len 2,048, no sleep.
#   budgets: A10 12,073,304,064; A100-80G 42,949,672,960
#   sampler: 64 · V · 8 = 77,791,232 (V = 151,936) or 77,856,768 (V = 152,064)
VLLM_CASES = [
    # Qwen2.5-0.5B on A10: peak 8,192 · (29,184 + 7,168) + 77,791,232 = 297,795,584 + 77,791,232
    #   = 375,586,816; KV 12,073,304,064 − 988,065,536 − 375,586,816 − 536,870,912 = 10,172,780,800
    #   → 10,172,780,800 // 12,288 = 827,863 tokens
    pytest.param("Qwen2.5-0.5B", "A10", 12_288, 12_073_304_064, 10_172_780_800, 827_863, id="0.5b-a10"),
    # Qwen2.5-0.5B on A100-80G (8,192 tokens: vLLM's A100 exception): peak 8,192 · 36,352 + 77,791,232
    #   = 375,586,816; KV 42,949,672,960 − 988,065,536 − 375,586,816 − 536,870,912 = 41,049,149,696
    #   → 3,340,588 tokens
    pytest.param(
        "Qwen2.5-0.5B", "A100-80G", 12_288, 42_949_672_960, 41_049_149_696, 3_340_588, id="0.5b-a100"
    ),
    # Qwen2-7B on A10: peak 8,192 · (113,664 + 28,672) + 77,856,768 = 1,166,016,512 + 77,856,768
    #   = 1,243,873,280; KV 12,073,304,064 − 15,231,233,024 − 1,243,873,280 − 536,870,912
    #   = −4,938,673,152: no KV cache at all
    pytest.param("Qwen2-7B", "A10", 57_344, 12_073_304_064, -4_938_673_152, 0, id="7b-a10"),
    # Qwen2-7B on A100-80G (8,192 tokens): peak 8,192 · 142,336 + 77,856,768 = 1,243,873,280;
    #   KV 42,949,672,960 − 15,231,233,024 − 1,243,873,280 − 536,870,912 = 25,937,695,744
    #   → 25,937,695,744 // 57,344 = 452,317 tokens
    pytest.param("Qwen2-7B", "A100-80G", 57_344, 42_949_672_960, 25_937_695_744, 452_317, id="7b-a100"),
]


@pytest.mark.parametrize(("model", "gpu", "kv_per_token", "budget", "kv_bytes", "kv_tokens"), VLLM_CASES)
def test_vllm_reservation_and_kv_cache_are_the_hand_computed_bytes(
    model: str, gpu: str, kv_per_token: int, budget: int, kv_bytes: int, kv_tokens: int
) -> None:
    assert _model(model).kv_bytes_per_token == kv_per_token
    est = _estimate(
        model,
        gpu,
        1,
        per_device_batch=1,
        use_vllm=True,
        vllm_util=0.5,
        vllm_max_num_seqs=64,
        vllm_max_model_len=2048,
    )
    assert est.phases["rollout"]["vllm_reserved"] == budget
    assert est.phases["train"]["vllm_reserved"] == budget  # awake (no sleep): held all along
    assert (est.kv_bytes, est.kv_tokens) == (kv_bytes, kv_tokens)
    # one sequence of 2,048 tokens needs 2,048 · kv_per_token
    need = 2048 * kv_per_token
    assert est.kv_ok == (kv_bytes >= need)
    assert est.kv_deficit_bytes == max(0, need - kv_bytes)


# --- whole estimates: every component of a phase
#
# "small": Qwen2.5-0.5B on 2 × A10, DeepSpeed ZeRO-2, 4 sequences per micro-batch, checkpointing,
# beta 0.04 (a reference model), vLLM colocated at utilization 0.3, TP 1, awake, 64 sequences.
SMALL_TRAIN = {
    "policy_weights": 988_065_536,  # 2P
    "gradients": 1_482_098_304,  # 6P/2
    "optimizer_states": 2_964_196_608,  # 12P/2
    "reference_model": 988_065_536,  # bf16, whole on every GPU outside ZeRO-3: 2P
    "activations": 685_768_704,  # see ACTIVATION_CASES
    "logits": 3_733_979_136,  # 4,096 completion tokens · 151,936 · 6
    "vllm_reserved": 7_243_982_438,  # 0.3 · 24,146,608,128 = 7,243,982,438.4, truncated; awake
    "zero3_gather": 0,
    "cuda_context": 536_870_912,
    # NCCL 0.25 GiB + ZeRO-2's reduce and all-gather buckets: 2 · 5e8 elements · 2 B
    #   = 268,435,456 + 2,000,000,000
    "nccl_buffers": 2_268_435_456,
}
# "big": Qwen2-7B on 8 × A100-80G, ZeRO-3, 2 sequences per micro-batch, checkpointing, beta 0.04,
# vLLM colocated at utilization 0.5, TP 2, sleep level 1, 256 sequences, max_model_len 4,096.
BIG_TRAIN = {
    "policy_weights": 4_083_893_632,  # 4·largest + 2P/8
    "gradients": 3_807_808_256,  # 4P/8
    "optimizer_states": 11_423_424_768,  # 12P/8
    "reference_model": 1_903_904_128,  # partitioned like the policy under ZeRO-3: 2P/8
    "activations": 1_447_034_880,  # see ACTIVATION_CASES
    "logits": 1_868_562_432,  # 2,048 · 152,064 · 6
    "vllm_reserved": 805_306_368,  # asleep: only 0.5 GiB + 0.25 GiB (TP 2) stay
    "zero3_gather": 0,
    "cuda_context": 536_870_912,
    "nccl_buffers": 268_435_456,  # no ZeRO-1/2 buckets under ZeRO-3
}


def test_small_case_every_train_component() -> None:
    est = _estimate(
        "Qwen2.5-0.5B",
        "A10",
        2,
        deepspeed=True,
        zero_stage=2,
        per_device_batch=4,
        grad_accum=8,
        beta=0.04,
        use_vllm=True,
        vllm_util=0.3,
        vllm_max_num_seqs=64,
        vllm_max_model_len=2048,
    )
    assert est.phases["train"] == SMALL_TRAIN
    # sum: 20,891,462,630 B, under the 24,146,608,128 B card; train is the peak phase
    assert (est.peak_phase, est.peak_bytes) == ("train", 20_891_462_630)
    assert est.fits()
    # KV: 7,243,982,438 − 988,065,536 − 375,586,816 (peak as in VLLM_CASES) − 536,870,912
    #   = 5,343,459,174 → // 12,288 = 434,851 tokens; concurrency min(64 seqs, 434,851 // 1,536 = 283,
    #   ceil(64 / 2 instances) = 32) = 32
    assert (est.kv_bytes, est.kv_tokens, est.rollout_concurrency) == (5_343_459_174, 434_851, 32)
    # start-up: DeepSpeed frameworks start vLLM before loading: free = 24,146,608,128 − 0.5 GiB
    #   = 23,609,737,216 ≥ 7,243,982,438
    assert (est.vllm_startup_ok, est.vllm_startup_deficit_bytes) == (True, 0)


def test_big_case_every_component_of_every_phase() -> None:
    est = _estimate(
        "Qwen2-7B",
        "A100-80G",
        8,
        deepspeed=True,
        zero_stage=3,
        per_device_batch=2,
        grad_accum=4,
        beta=0.04,
        use_vllm=True,
        vllm_util=0.5,
        vllm_tp=2,
        sleep_level=1,
        vllm_max_num_seqs=256,
        vllm_max_model_len=4096,
    )
    assert est.phases["train"] == BIG_TRAIN
    # rollout: no activations or logits; vLLM's whole budget 0.5 · 85,899,345,920 = 42,949,672,960;
    # ZeRO-3 keeps its gradient partitions
    assert est.phases["rollout"] == {
        **BIG_TRAIN,
        "activations": 0,
        "logits": 0,
        "vllm_reserved": 42_949_672_960,
    }
    # sync: vLLM woken with its weights 2P/2 = 7,615,616,512 + 805,306,368 = 8,420,922,880; ZeRO-3
    # gathers the whole model (2P = 15,231,233,024) to push it
    assert est.phases["sync"] == {
        **BIG_TRAIN,
        "activations": 0,
        "logits": 0,
        "vllm_reserved": 8_420_922_880,
        "zero3_gather": 15_231_233_024,
    }
    # rollout total: 4,083,893,632 + 3,807,808,256 + 11,423,424,768 + 1,903,904,128 + 42,949,672,960
    #   + 536,870,912 + 268,435,456 = 64,974,010,112
    assert (est.peak_phase, est.peak_bytes) == ("rollout", 64_974_010_112)
    # KV at TP 2: peak 8,192 (an A100) · (6·18,944 + 8·3,584)/2 + 256 · 152,064 · 8
    #   = 8,192 · 71,168 + 311,427,072 = 583,008,256 + 311,427,072 = 894,435,328;
    #   KV 42,949,672,960 − 7,615,616,512 − 894,435,328 − 805,306,368 = 33,634,314,752
    #   → // 28,672 = 1,173,071 tokens; concurrency min(256, 1,173,071 // 1,536 = 763,
    #   ceil(64 / (8/2) instances) = 16) = 16
    assert (est.kv_bytes, est.kv_tokens, est.rollout_concurrency) == (33_634_314_752, 1_173_071, 16)
    # start-up under ZeRO-3 (zero.Init): policy 2P/8 and reference 2P/8 already there:
    #   free = 85,899,345,920 − 536,870,912 − 2 · 1,903,904,128 = 81,554,666,752 ≥ 42,949,672,960
    assert (est.vllm_startup_ok, est.vllm_startup_deficit_bytes) == (True, 0)


def test_startup_deficit_when_the_trainer_loads_first() -> None:
    # Qwen2-7B on 8 × A100-80G without DeepSpeed, loaded before vLLM (ms-swift), beta 0.04,
    # utilization 0.75: held = 0.5 GiB + policy 2P + reference 2P = 536,870,912 + 30,462,466,048;
    #   free = 85,899,345,920 − 30,999,336,960 = 54,900,008,960;
    #   budget 0.75 · 85,899,345,920 = 64,424,509,440 → deficit 9,524,500,480
    est = _estimate(
        "Qwen2-7B",
        "A100-80G",
        8,
        per_device_batch=1,
        beta=0.04,
        use_vllm=True,
        vllm_util=0.75,
        loads_before_vllm=True,
        vllm_max_model_len=2048,
    )
    assert (est.vllm_startup_ok, est.vllm_startup_deficit_bytes) == (False, 9_524_500_480)


# --- LoRA: the frozen bf16 base (partitioned under ZeRO-3) and the fp32 adapter with fp32 gradients
# and Adam moments. Qwen2.5-0.5B on 2 GPUs, rank 8: A = 4,399,104 (above), 4A = 17,596,416,
# 8A = 35,192,832; offloaded optimizer on the host: 12A · 1.5 = 52,789,248 · 1.5 = 79,183,872.
LORA_CASES = {
    # no DeepSpeed: 2P + 4A = 1,005,661,952 weights; gradients 4A; Adam 8A, nothing sharded
    "ddp": ((False, 0, False, False), (1_005_661_952, 17_596_416, 35_192_832, 0)),
    # ZeRO-1 shards the optimizer (8A/2 = 17,596,416), not the gradients (4A)
    "zero1": ((True, 1, False, False), (1_005_661_952, 17_596_416, 17_596_416, 0)),
    # ZeRO-2 with the optimizer on the host: gradients 4A/2 = 8,798,208, no Adam on the GPU
    "zero2_offload": ((True, 2, True, False), (1_005_661_952, 8_798_208, 0, 79_183_872)),
    # ZeRO-3: base 4·largest + 2P/2 = 544,538,624 + 494,032,768, + 4A → 1,056,167,808
    "zero3": ((True, 3, False, False), (1_056_167_808, 8_798_208, 17_596_416, 0)),
    # ZeRO-3 with parameters and optimizer offloaded: 4·largest + 4A = 562,135,040 on the GPU; the
    # host holds the base 2P = 988,065,536 and the optimizer 79,183,872 → 1,067,249,408
    "zero3_offload_all": ((True, 3, True, True), (562_135_040, 8_798_208, 0, 1_067_249_408)),
}


@pytest.mark.parametrize(("setup", "expected"), LORA_CASES.values(), ids=LORA_CASES.keys())
def test_lora_states_are_the_hand_computed_bytes(
    setup: tuple[bool, int, bool, bool], expected: tuple[int, int, int, int]
) -> None:
    deepspeed, stage, off_opt, off_param = setup
    got = model_states(
        params=P_SMALL,
        largest_layer_params=LARGEST_SMALL,
        n_gpus=2,
        zero_stage=stage,
        deepspeed=deepspeed,
        offload_optimizer=off_opt,
        offload_param=off_param,
        trainable_params=4_399_104,
    )
    assert (got.weights_bytes, got.gradients_bytes, got.optimizer_bytes, got.host_bytes) == expected


def test_lora_rank_zero_has_no_adapter() -> None:
    assert lora_params(_model("Qwen2.5-0.5B"), 0) == 0
    # rank 1 on Qwen2-7B (q = 28·128 = 3,584, kv = 4·128 = 512, I = 18,944):
    #   (7,168 + 2·4,096 + 7,168 + 2·22,528 + 22,528) = 90,112 per layer; 28 layers → 2,523,136
    assert lora_params(_model("Qwen2-7B"), 1) == 2_523_136


# --- the ZeRO-3 weight sync into a colocated vLLM (Qwen2-7B on 8 GPUs): what is gathered at once
# Embeddings V·h·2 (untied) + the final norm h = 1,089,994,752 + 3,584 = 1,089,998,336; one decoder
# layer (P − embeddings)/28 = 6,525,618,176/28 = 233,057,792.
SYNC_CASES = [
    # the whole model at once: 2P
    pytest.param("model", None, 15_231_233_024, id="whole-model"),
    # one parameter at a time: the largest, 2 · 544,997,376
    pytest.param("parameter", None, 1_089_994_752, id="per-parameter"),
    # 4 batches: ceil(28/4) = 7 layers = 1,631,404,544 params (more than the embeddings) → × 2 B
    pytest.param("batches", 4, 3_262_809_088, id="4-batches"),
    # 16 batches: ceil(28/16) = 2 layers = 466,115,584 params, less than the embeddings: 2 · 1,089,998,336
    pytest.param("batches", 16, 2_179_996_672, id="16-batches"),
    # batches named but none given: the whole model
    pytest.param("batches", None, 15_231_233_024, id="batches-unset"),
    # the whole model at once even when batches are given (they only apply to a batched sync)
    pytest.param("model", 4, 15_231_233_024, id="whole-model-batches-ignored"),
    # one batch: all 28 layers = 6,525,618,176 params (more than the embeddings) → × 2 B
    pytest.param("batches", 1, 13_051_236_352, id="1-batch"),
]


def test_zero3_sync_gather_counts_tied_embeddings_once() -> None:
    # Qwen2.5-0.5B (tied) on 4 GPUs, 16 batches: embeddings V·h + h = 136,134,656 + 896 = 136,135,552;
    # a layer (494,032,768 − 136,135,552)/24 = 14,912,384; ceil(24/16) = 2 layers = 29,824,768, less
    # than the embeddings → 2 · 136,135,552
    est = _estimate(
        "Qwen2.5-0.5B",
        "A10",
        4,
        deepspeed=True,
        zero_stage=3,
        per_device_batch=1,
        use_vllm=True,
        vllm_util=0.3,
        sleep_level=1,
        weight_sync="batches",
        move_model_batches=16,
        vllm_max_model_len=2048,
    )
    assert est.phases["sync"]["zero3_gather"] == 272_271_104


@pytest.mark.parametrize(("sync", "batches", "expected"), SYNC_CASES)
def test_zero3_sync_gather_is_the_hand_computed_bytes(sync: str, batches: int | None, expected: int) -> None:
    est = _estimate(
        "Qwen2-7B",
        "A100-80G",
        8,
        deepspeed=True,
        zero_stage=3,
        per_device_batch=1,
        use_vllm=True,
        vllm_util=0.3,
        sleep_level=1,
        weight_sync=sync,
        move_model_batches=batches,
        vllm_max_model_len=2048,
    )
    assert est.phases["sync"]["zero3_gather"] == expected
    # outside ZeRO-3 nothing is gathered
    zero2 = _estimate(
        "Qwen2-7B",
        "A100-80G",
        8,
        deepspeed=True,
        zero_stage=2,
        per_device_batch=1,
        use_vllm=True,
        vllm_util=0.3,
        weight_sync=sync,
        vllm_max_model_len=2048,
    )
    assert zero2.phases["sync"]["zero3_gather"] == 0


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        # beta 0: no reference model
        pytest.param({"beta": 0.0}, 0, id="no-beta"),
        # whole on every GPU: 2P = 15,231,233,024
        pytest.param({"beta": 0.04}, 15_231_233_024, id="ddp"),
        # offloaded: one module gathered at a time, 2 · largest = 1,089,994,752
        pytest.param({"beta": 0.04, "reference_offload": True}, 1_089_994_752, id="offloaded"),
        # ZeRO-3 partitions it: 2P/8 = 1,903,904,128; with parameter offload it lives on the host: 0
        pytest.param({"beta": 0.04, "deepspeed": True, "zero_stage": 3}, 1_903_904_128, id="zero3"),
        pytest.param(
            {"beta": 0.04, "deepspeed": True, "zero_stage": 3, "ds_offload_param": True},
            0,
            id="zero3-offload",
        ),
        # LoRA: the base with the adapter off serves as reference
        pytest.param({"beta": 0.04, "lora_rank": 8}, 0, id="lora"),
    ],
)
def test_reference_model_bytes(config: dict[str, Any], expected: int) -> None:
    est = _estimate("Qwen2-7B", "A100-80G", 8, per_device_batch=1, **config)
    assert est.phases["train"]["reference_model"] == expected


@pytest.mark.parametrize(
    ("n", "config", "expected"),
    [
        # one process: no communicator
        pytest.param(1, {"deepspeed": True, "zero_stage": 2}, 0, id="single"),
        # ZeRO-1 keeps DeepSpeed's buckets too: 268,435,456 + 2 · 2e8 elements · 2 B = 1,068,435,456
        pytest.param(
            2, {"deepspeed": True, "zero_stage": 1, "ds_bucket_elements": 200_000_000}, 1_068_435_456, id="z1"
        ),
        # plain DDP: the communicator alone
        pytest.param(2, {}, 268_435_456, id="ddp"),
    ],
)
def test_nccl_buffers(n: int, config: dict[str, Any], expected: int) -> None:
    est = _estimate("Qwen2.5-0.5B", "A10", n, per_device_batch=1, **config)
    assert est.phases["train"]["nccl_buffers"] == expected


def test_vllm_batched_tokens_given_or_by_card_size() -> None:
    # given 4,096 batched tokens on Qwen2.5-0.5B (A100-80G, utilization 0.5, 64 sequences):
    #   peak 4,096 · 36,352 + 77,791,232 = 148,897,792 + 77,791,232 = 226,689,024;
    #   KV 42,949,672,960 − 988,065,536 − 226,689,024 − 536,870,912 = 41,198,047,488
    common: dict[str, Any] = {
        "per_device_batch": 1,
        "use_vllm": True,
        "vllm_util": 0.5,
        "vllm_max_num_seqs": 64,
        "vllm_max_model_len": 2048,
    }
    given = _estimate("Qwen2.5-0.5B", "A100-80G", 1, vllm_max_num_batched_tokens=4096, **common)
    assert given.kv_bytes == 41_198_047_488
    # a card of exactly 70 GiB already counts as large (16,384 tokens): budget 0.5 · 70 GiB =
    #   37,580,963,840; KV 37,580,963,840 − 988,065,536 − 673,382,400 − 536,870,912 = 35,382,644,992
    spec = _model("Qwen2.5-0.5B")
    shape = JobShape(
        JobConfig(world_size=1, global_batch=64, num_generations=8, grad_accum=1, **common), spec, 1
    )
    assert estimate_memory(shape, generic_gpu("70 GiB card", 70 * GIB)).kv_bytes == 35_382_644_992


def test_kv_heads_fewer_than_tensor_parallel_ranks_are_replicated() -> None:
    # Qwen2-7B has 4 KV heads: at TP 8 every rank still holds one, 2·28·1·128·2 = 14,336 B per token.
    # KV at utilization 0.5 on A100-80G, 64 sequences: weights 2P/8 = 1,903,904,128; peak
    #   8,192 · (142,336 // 8 = 17,792) + 77,856,768 = 145,752,064 + 77,856,768 = 223,608,832;
    #   overhead 0.75 GiB = 805,306,368 → KV 42,949,672,960 − 1,903,904,128 − 223,608,832 − 805,306,368
    #   = 40,016,853,632 → // 14,336 = 2,791,354 tokens
    est = _estimate(
        "Qwen2-7B",
        "A100-80G",
        8,
        per_device_batch=1,
        use_vllm=True,
        vllm_util=0.5,
        vllm_tp=8,
        vllm_max_num_seqs=64,
        vllm_max_model_len=2048,
    )
    assert (est.kv_bytes, est.kv_tokens) == (40_016_853_632, 2_791_354)


HOST_CASES = [
    # Qwen2-7B on 8 GPUs, ZeRO-3 with parameters and optimizer offloaded, beta 0.04, 2 loader workers,
    # vLLM colocated at TP 2 asleep at level 1, offload_model and offload_optimizer for the rollout:
    #   states on the host 27P = 205,621,645,824; ranks 8 · (3 GiB + 2 · 0.5 GiB) = 34,359,738,368;
    #   the reference's partitions offloaded like the policy 2P = 15,231,233,024; vLLM's sleeping
    #   weights 8 · 2P/2 = 60,924,932,096; the rollout moves nothing more (the parameters and the
    #   optimizer live on the host already) → 316,137,549,312
    pytest.param(
        "Qwen2-7B",
        8,
        {
            "deepspeed": True,
            "zero_stage": 3,
            "ds_offload_optimizer": True,
            "ds_offload_param": True,
            "beta": 0.04,
            "dataloader_num_workers": 2,
            "vllm_tp": 2,
            "sleep_level": 1,
            "rollout_offload_model": True,
            "rollout_offload_optimizer": True,
        },
        316_137_549_312,
        id="7b-zero3-full-offload",
    ),
    # Qwen2.5-0.5B on 2 GPUs without DeepSpeed, an offloaded fp32 reference (4P = 1,976,131,072), the
    # rollout moving weights (2 · 2P = 1,976,131,072) and torch Adam states (2 · 4P = 3,952,262,144):
    #   2 · 3 GiB = 6,442,450,944 + 1,976,131,072 + 1,976,131,072 + 3,952,262,144 = 14,346,975,232
    pytest.param(
        "Qwen2.5-0.5B",
        2,
        {
            "beta": 0.04,
            "reference_offload": True,
            "rollout_offload_model": True,
            "rollout_offload_optimizer": True,
        },
        14_346_975_232,
        id="0.5b-ddp-offloads",
    ),
    # FSDP full shard on 2 GPUs moves each rank's weights and gradients with the model:
    #   2 · (1,038,571,392 + 988,065,536) = 4,053,273,856 + 2 · 3 GiB → 10,495,724,800
    pytest.param(
        "Qwen2.5-0.5B",
        2,
        {"fsdp": True, "zero_stage": 3, "rollout_offload_model": True},
        10_495_724_800,
        id="0.5b-fsdp-offload-model",
    ),
    # ZeRO-3 on 2 GPUs without parameter offload, the rollout moving the model: DeepSpeed moves the
    # whole model's bf16 weights once, 2P = 988,065,536 (not each rank's partition), + 2 · 3 GiB
    #   → 7,430,516,480
    pytest.param(
        "Qwen2.5-0.5B",
        2,
        {"deepspeed": True, "zero_stage": 3, "rollout_offload_model": True},
        7_430_516_480,
        id="0.5b-zero3-offload-model",
    ),
    # FSDP with its parameters offloaded still moves each rank's shard of weights and gradients:
    #   states' host buffers int(2P · 1.5) = 1,482,098,304; weights 4 · 136,134,656 = 544,538,624 and
    #   gradients int(18P/2) − int(2P/2) − int(12P/2) = 988,065,536 per rank, × 2 ranks = 3,065,208,320;
    #   + 2 · 3 GiB → 10,989,757,568
    pytest.param(
        "Qwen2.5-0.5B",
        2,
        {"fsdp": True, "zero_stage": 3, "ds_offload_param": True, "rollout_offload_model": True},
        10_989_757_568,
        id="0.5b-fsdp-param-offload-offload-model",
    ),
]


@pytest.mark.parametrize(("model", "n", "config", "expected"), HOST_CASES)
def test_host_memory_is_the_hand_computed_bytes(
    model: str, n: int, config: dict[str, Any], expected: int
) -> None:
    est = _estimate(
        model,
        "A100-80G",
        n,
        per_device_batch=1,
        use_vllm=True,
        vllm_util=0.3,
        vllm_max_model_len=2048,
        **config,
    )
    assert est.host_bytes == expected


def test_one_gpu_zero2_is_zero0_and_lora_without_deepspeed_ignores_the_zero_stage() -> None:
    # ZeRO-2 on one GPU partitions over one rank: 2P weights, 18P − 12P = 6P gradients, 12P optimizer
    one = {"params": P_SMALL, "largest_layer_params": LARGEST_SMALL, "n_gpus": 1, "deepspeed": True}
    flags = {"offload_optimizer": False, "offload_param": False}
    expected = (2 * P_SMALL, 6 * P_SMALL, 12 * P_SMALL, 0)
    for stage in (0, 2):
        st = model_states(**one, **flags, zero_stage=stage)
        assert (st.weights_bytes, st.gradients_bytes, st.optimizer_bytes, st.host_bytes) == expected
    # LoRA under plain DDP: a ZeRO stage 3 and an optimizer offload in the config mean nothing; the
    # base stays whole in bf16 (2P) beside the fp32 adapter (4a), adapter gradients 4a, Adam 8a
    a = lora_params(_model("Qwen2.5-0.5B"), 8)
    st = model_states(
        params=P_SMALL,
        largest_layer_params=LARGEST_SMALL,
        n_gpus=4,
        zero_stage=3,
        deepspeed=False,
        offload_optimizer=True,
        offload_param=True,
        trainable_params=a,
    )
    assert (st.weights_bytes, st.gradients_bytes, st.optimizer_bytes, st.host_bytes) == (
        2 * P_SMALL + 4 * a,
        4 * a,
        8 * a,
        0,
    )


def test_vllms_sampler_is_profiled_for_at_most_1024_sequences() -> None:
    def kv(seqs: int) -> int:
        est = _estimate(
            "Qwen2-7B",
            "A100-80G",
            8,
            per_device_batch=1,
            use_vllm=True,
            vllm_util=0.5,
            vllm_max_num_seqs=seqs,
        )
        return est.kv_bytes

    # the sampler term is min(seqs, 1024) · V · 4 · 2: 1024 and 2048 sequences profile the same; 1023 less
    assert kv(1024) == kv(2048)
    assert kv(1023) - kv(1024) == 152_064 * 4 * 2


def test_generation_in_the_trainer_under_zero3_every_rollout_component() -> None:
    # Qwen2.5-0.5B on 2 GPUs, ZeRO-3, no vLLM, 2 per device × 2 accumulation steps = 4 sequences
    # generated at once, each 512 + 1024 = 1,536 tokens:
    #   HF KV cache 4 · 1,536 · (2 · 24 layers · 2 KV heads · 64 · 2 B = 12,288) = 75,497,472, plus the
    #   sampler's fp32 logits twice over the vocabulary 4 · 151,936 · 4 · 2 = 4,861,952 → 80,359,424;
    #   ZeRO-3 gathers the whole model for generation: 2P = 988,065,536;
    #   states: weights 4 · 136,134,656 + 2P/2 = 1,038,571,392, gradients kept between steps
    #   int(18P/2) − int(2P/2) − int(12P/2) = 988,065,536, optimizer int(12P/2) = 2,964,196,608
    est = _estimate(
        "Qwen2.5-0.5B",
        "A10",
        2,
        deepspeed=True,
        zero_stage=3,
        per_device_batch=2,
        grad_accum=2,
        use_vllm=False,
    )
    assert est.phases["rollout"] == {
        "policy_weights": 1_038_571_392,
        "gradients": 988_065_536,
        "optimizer_states": 2_964_196_608,
        "reference_model": 0,
        "activations": 80_359_424,
        "logits": 0,
        "vllm_reserved": 0,
        "zero3_gather": 988_065_536,
        "cuda_context": CUDA_CONTEXT,
        "nccl_buffers": NCCL,
    }
    assert "sync" not in est.phases  # no vLLM: nothing to sync


def test_calibration_scales_every_modelled_component_but_vllms_reservation() -> None:
    comps = {"policy_weights": 100, "vllm_reserved": 50}
    est = MemoryEstimate(
        components_bytes=comps,
        peak_bytes=150,
        peak_phase="train",
        phases={"train": comps, "rollout": {"policy_weights": 80, "vllm_reserved": 90}},
        capacity_bytes=1000,
        host_bytes=7,
        kv_tokens=0,
        kv_bytes=0,
        rollout_concurrency=0,
        vllm_startup_ok=True,
        vllm_startup_deficit_bytes=0,
        kv_ok=True,
        kv_deficit_bytes=0,
    )
    # × 1.5: train 150 + 50 = 200, rollout 120 + 90 = 210: the rollout becomes the peak
    up = est.scaled(1.5)
    assert up.phases == {
        "train": {"policy_weights": 150, "vllm_reserved": 50},
        "rollout": {"policy_weights": 120, "vllm_reserved": 90},
    }
    assert (up.peak_phase, up.peak_bytes, up.components_bytes) == (
        "rollout",
        210,
        {"policy_weights": 120, "vllm_reserved": 90},
    )
    assert up.calibration_factor == 1.5 and up.host_bytes == 7
    # then × 3 of the raw estimate (× 2 of this one): train 300 + 50 = 350, rollout 240 + 90 = 330
    again = up.scaled(3.0)
    assert (again.peak_phase, again.peak_bytes) == ("train", 350)
    assert again.phases["rollout"] == {"policy_weights": 240, "vllm_reserved": 90}
    assert est.scaled(1.0) is est
