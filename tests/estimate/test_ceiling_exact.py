"""Exact ceilings of a toy model on made-up peak rates, each worked out by hand in the comments.

``test_ceiling.py`` checks two real models on two real GPUs; these pin every branch of
``autotune/estimate/ceiling.py`` (trainer or vLLM rollout, colocated or server, the sequence cap, LoRA,
checkpointing, the ZeRO-3 gathers, each offload transfer) with numbers small enough to add up by hand,
and the peak basis's own logic (which peaks, which fallback, what its text says).

The toy model: 2 layers, hidden 8, 2 heads and 1 KV head of 4, MLP 16, vocabulary 10, untied, 1,000
parameters in all. So the LM head is 10·8 = 80 parameters, the body (the matmuls besides embedding and
head) 1,000 − 2·80 = 840, body + head = 920, the bf16 weights 2·1,000 = 2,000 bytes, and one token's KV
2 (K, V) · 2 layers · 1 head · 4 · 2 bytes = 32 bytes. LoRA rank 2 on every linear layer
(q 8→8, k and v 8→4, o 8→8, gate and up 8→16, down 16→8): 2 · ((8+8) + 2·(8+4) + (8+8) + 2·(8+16) +
(16+8)) = 2 · 128 = 256 per layer, 512 in all.

The peaks are chosen apart so that dividing by the wrong one shows: 100 FLOP/s, memory 10 B/s, peer
link 4 B/s, host link 2 B/s (``RATES``); a compute-bound basis (1 FLOP/s, memory 1,000 B/s) makes the
other side of each ``max`` the larger one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from autotune.estimate import (
    CPU_DEVICE,
    GpuSpec,
    JobShape,
    MeasuredPeaks,
    ModelSpec,
    PeakBasis,
    StepCeiling,
    StepWork,
    find_gpu,
    generic_gpu,
    step_ceiling,
)
from autotune.estimate.ceiling import ceiling_terms
from autotune.estimate.columns import CONFIG_COLUMNS, ShapeColumns, column
from autotune.jobconfig import JobConfig

TOY = ModelSpec(
    name="toy",
    hub_id="toy",
    params=1000,
    layers=2,
    hidden=8,
    heads=2,
    kv_heads=1,
    head_dim=4,
    intermediate=16,
    vocab=10,
    tie_embeddings=False,
    max_position=64,
    largest_layer_params=100,
)

RATES = PeakBasis("measured", "toy", 100.0, 10.0, 4.0, 2.0)
COMPUTE_BOUND = PeakBasis("measured", "toy", 1.0, 1000.0, 4.0, 2.0)


def _ceiling(basis: PeakBasis = RATES, n_gpus: int | None = None, **fields: Any) -> StepCeiling:
    """The toy's ceiling for a config of 8 completions from 2 prompts of 3 tokens, 5 completion tokens."""
    base: dict[str, Any] = dict(
        world_size=2,
        global_batch=8,
        num_generations=4,
        per_device_batch=2,
        grad_accum=2,
        max_prompt_length=3,
        max_completion_length=5,
        gradient_checkpointing=False,
    )
    config = JobConfig(**{**base, **fields})
    return step_ceiling(JobShape(config, TOY, config.world_size if n_gpus is None else n_gpus), basis)


# ------------------------------------------------------------------------------------------ rollout


@pytest.mark.parametrize(
    "model",
    [
        TOY,
        # tied embeddings: the LM head is the embedding, counted once: 840 + 80
        replace(TOY, name="tied", params=920, tie_embeddings=True),
        # a vision tower of 200 parameters besides the 1,000 of the language model
        replace(TOY, name="vl", params=1200, vision_params=200, is_vl=True),
    ],
    ids=lambda m: m.name,
)
def test_the_body_leaves_out_embedding_head_and_vision_tower(model: ModelSpec) -> None:
    config = JobConfig(world_size=1, global_batch=2, num_generations=2, per_device_batch=2, grad_accum=1)
    c = step_ceiling(JobShape(config, model, 1), RATES, StepWork(3, 0))
    # 1 prompt of 3 tokens: 2·840 · 3 = 5,040 FLOPs at 100 FLOP/s
    assert c.rollout_prefill_s == pytest.approx(50.4)


def test_a_body_is_never_negative() -> None:
    """A model whose parameter count is all embedding and head (a declared count below 2·80) has no body
    FLOPs, not negative ones."""
    c = step_ceiling(
        JobShape(
            JobConfig(world_size=1, global_batch=2, num_generations=2, per_device_batch=2, grad_accum=1),
            replace(TOY, params=100),
            1,
        ),
        RATES,
        StepWork(3, 0),
    )
    assert c.rollout_prefill_s == 0


def test_rollout_in_the_trainer() -> None:
    """No vLLM on 2 GPUs: each trainer generates 8/2 = 4 sequences of 1 distinct prompt; vLLM's cap on
    running sequences does not apply (1 iteration per token, not 4·5/1 = 20)."""
    c = _ceiling(vllm_max_num_seqs=1)
    # prefill: 2·840 FLOPs × 1 prompt × 3 tokens = 5,040 → 50.4 s at 100 FLOP/s
    assert c.rollout_prefill_s == pytest.approx(50.4)
    # decode memory: 5 iterations × 2·920 weight bytes = 9,200, KV 4 seqs · 5 · (5−1)/2 · 32 = 1,280
    # → 10,480 B at 10 B/s = 1,048 s; compute 2·920 · 4 · 5 = 36,800 FLOPs = 368 s
    assert c.rollout_decode_s == pytest.approx(1048.0)
    assert c.rollout_s == pytest.approx(1048.0)
    slow = _ceiling(COMPUTE_BOUND, vllm_max_num_seqs=1)
    # at 1 FLOP/s: prefill 5,040 s, decode compute 36,800 s (memory 10.48 s); the rollout adds them
    assert (slow.rollout_prefill_s, slow.rollout_decode_s) == pytest.approx((5040.0, 36800.0))
    assert slow.rollout_s == pytest.approx(5040.0 + 36800.0)


def test_one_trainer_generates_every_sequence() -> None:
    """1 GPU: 8 sequences of 2 distinct prompts in one process."""
    c = _ceiling(COMPUTE_BOUND, world_size=1)
    # prefill 2·840 · 2 prompts · 3 = 10,080; decode 2·920 · 8 · 5 = 73,600
    assert (c.rollout_prefill_s, c.rollout_decode_s) == pytest.approx((10080.0, 73600.0))


def test_colocated_vllm_under_the_sequence_cap() -> None:
    """vLLM colocated on 4 GPUs at TP 2: 2 engines of 12/2 = 6 sequences from 6/3 = 2 prompts each, at
    most 3 running: max(5, 6·5/3) = 10 iterations, each reading half the weights on each GPU."""
    fields = dict(
        world_size=4,
        global_batch=12,
        num_generations=3,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_tp=2,
        vllm_max_num_seqs=3,
    )
    c = _ceiling(**fields)
    # prefill 2·840 · 2 · 3 / 2 GPUs = 5,040 → 50.4 s
    assert c.rollout_prefill_s == pytest.approx(50.4)
    # memory: (10 · 2·920 + 6 · 5 · 4/2 · 32) / 2 = (18,400 + 1,920) / 2 = 10,160 B → 1,016 s
    assert c.rollout_decode_s == c.rollout_s == pytest.approx(1016.0)
    slow = _ceiling(COMPUTE_BOUND, **fields)
    # compute: 2·920 · 6 · 5 / 2 = 27,600 FLOPs per GPU; prefill 5,040
    assert slow.rollout_decode_s == pytest.approx(27600.0)
    assert slow.rollout_s == pytest.approx(27600.0 + 5040.0)


def test_colocated_vllm_on_fewer_gpus_than_its_tp() -> None:
    """1 GPU under TP 2 (a config the decoder may let through): still one engine, never half of one."""
    c = _ceiling(COMPUTE_BOUND, world_size=1, global_batch=4, use_vllm=True, vllm_tp=2, vllm_max_num_seqs=4)
    # one engine: 4 sequences of 1 prompt; prefill 2·840 · 1 · 3 / 2 = 2,520; decode 2·920 · 4 · 5 / 2
    assert (c.rollout_prefill_s, c.rollout_decode_s) == pytest.approx((2520.0, 18400.0))


def test_uneven_colocated_engines_round_down() -> None:
    """3 GPUs at TP 2 hold one engine (3 // 2), which then generates all 6 sequences."""
    c = _ceiling(
        COMPUTE_BOUND,
        world_size=3,
        global_batch=6,
        num_generations=3,
        use_vllm=True,
        vllm_tp=2,
        vllm_max_num_seqs=6,
    )
    # 6 sequences, 2 prompts: prefill 2·840 · 2 · 3 / 2 = 5,040; decode 2·920 · 6 · 5 / 2 = 27,600
    assert (c.rollout_prefill_s, c.rollout_decode_s) == pytest.approx((5040.0, 27600.0))


def test_a_vllm_server_is_one_engine_and_zero_means_no_cap() -> None:
    """A server at TP 2 beside 3 trainer GPUs: one engine for all 6 sequences (2 prompts);
    ``vllm_max_num_seqs`` 0 puts no cap on running sequences (5 iterations, not 6·5)."""
    fields = dict(
        world_size=3,
        global_batch=6,
        num_generations=3,
        use_vllm=True,
        vllm_mode="server",
        vllm_tp=2,
        vllm_max_num_seqs=0,
    )
    c = _ceiling(**fields)
    # memory: (5 · 2·920 + 6 · 5 · 2 · 32) / 2 = (9,200 + 1,920) / 2 = 5,560 B → 556 s
    assert c.rollout_decode_s == c.rollout_s == pytest.approx(556.0)
    slow = _ceiling(COMPUTE_BOUND, **fields)
    # prefill 2·840 · 2 · 3 / 2 = 5,040; decode 2·920 · 6 · 5 / 2 = 27,600
    assert (slow.rollout_prefill_s, slow.rollout_decode_s) == pytest.approx((5040.0, 27600.0))


def test_a_cap_above_the_sequences_changes_nothing() -> None:
    """A server with 6 sequences and room for 2 of them at once: 6·5/2 = 15 iterations; room for 12:
    still 5 (a sequence's tokens come one after another)."""
    fields = dict(world_size=3, global_batch=6, num_generations=3, use_vllm=True, vllm_mode="server")
    capped = _ceiling(**fields, vllm_max_num_seqs=2)
    # (15 · 2·920 + 1,920) / 10 B/s = (27,600 + 1,920) / 10
    assert capped.rollout_decode_s == pytest.approx(2952.0)
    roomy = _ceiling(**fields, vllm_max_num_seqs=12)
    # (5 · 1,840 + 1,920) / 10
    assert roomy.rollout_decode_s == pytest.approx(1112.0)
    one_at_a_time = _ceiling(**fields, vllm_max_num_seqs=1)
    # 6 · 5 = 30 iterations: (30 · 1,840 + 1,920) / 10
    assert one_at_a_time.rollout_decode_s == pytest.approx(5712.0)


def test_a_zero_count_counts_as_one() -> None:
    """0 GPUs per engine, 0 processes or 0 generations per prompt (unset counts in a plan's columns)
    never divide by zero: each counts as 1."""
    fields = dict(
        world_size=1, global_batch=4, num_generations=1, use_vllm=True, vllm_max_num_seqs=4, sleep_level=1
    )
    one = _ceiling(COMPUTE_BOUND, **fields)
    # 4 sequences of 4 prompts: prefill 2·840 · 4 · 3 = 20,160; decode 2·920 · 4 · 5 = 36,800
    assert (one.rollout_prefill_s, one.rollout_decode_s) == pytest.approx((20160.0, 36800.0))
    assert _ceiling(COMPUTE_BOUND, **{**fields, "vllm_tp": 0}).phase_s() == one.phase_s()
    assert _ceiling(COMPUTE_BOUND, **{**fields, "num_generations": 0}).phase_s() == one.phase_s()
    trainer = dict(fields, use_vllm=False)
    assert _ceiling(COMPUTE_BOUND, n_gpus=1, **{**trainer, "world_size": 0}).phase_s() == pytest.approx(
        _ceiling(COMPUTE_BOUND, **trainer).phase_s()
    )


def test_a_measured_mean_under_one_token_reads_no_kv() -> None:
    """Half a completion token on average: no token attends to an earlier one of its own completion (the
    KV term is clamped at 0, never negative)."""
    shape = JobShape(
        JobConfig(
            world_size=2,
            global_batch=8,
            num_generations=4,
            per_device_batch=2,
            grad_accum=2,
            gradient_checkpointing=False,
        ),
        TOY,
        2,
    )
    c = step_ceiling(shape, RATES, StepWork(prompt_tokens_per_sample=0, completion_tokens_per_sample=0.5))
    # 0.5 iterations × 1,840 bytes of weights, no KV: 920 B → 92 s
    assert c.rollout_decode_s == pytest.approx(92.0)
    assert c.rollout_prefill_s == 0


# ------------------------------------------------------------------------------------ reference, train


def test_the_reference_pass() -> None:
    """beta > 0: a forward over every token on all training GPUs."""
    # 8 · (2·840 · (3 + 5) + 2·80 · 5) = 8 · 14,240 = 113,920 FLOPs over 2 GPUs at 100 FLOP/s
    assert _ceiling(beta=0.04).reference_s == pytest.approx(569.6)
    assert _ceiling(beta=0.0).reference_s == 0
    # on 1 GPU it does all of it: 113,920 FLOPs at 100 FLOP/s
    assert _ceiling(beta=0.04, world_size=1).reference_s == pytest.approx(1139.2)
    # LoRA's base is the reference: the same forward pass
    assert _ceiling(beta=0.04, lora_rank=2).reference_s == pytest.approx(569.6)


def test_full_training_on_two_gpus() -> None:
    """6 FLOPs per parameter and token, the gradients' ring exchange over the peer link."""
    c = _ceiling(COMPUTE_BOUND)
    # 8 · (6·840 · 8 + 6·80 · 5) = 8 · 42,720 = 341,760 FLOPs over 2 GPUs at 1 FLOP/s
    assert c.train_s == pytest.approx(170880.0)
    fast = _ceiling(PeakBasis("measured", "toy", 1e9, 10.0, 4.0, 2.0))
    # the gradients: 2 · 1,000 bytes · (2−1)/2 = 1,000 B at 4 B/s
    assert fast.train_s == pytest.approx(250.0)


def test_checkpointing_recomputes_the_forward() -> None:
    # 8 · ((6 + 2)·840 · 8 + 6·80 · 5) = 8 · 56,160 = 449,280 FLOPs / 2 GPUs
    assert _ceiling(COMPUTE_BOUND, gradient_checkpointing=True).train_s == pytest.approx(224640.0)


def test_lora_training_has_no_weight_gradients() -> None:
    """LoRA: 4 FLOPs per parameter and token; only the adapters' 512 gradients cross the link."""
    c = _ceiling(COMPUTE_BOUND, lora_rank=2)
    # 8 · (4·840 · 8 + 4·80 · 5) = 8 · 28,480 = 227,840 FLOPs / 2
    assert c.train_s == pytest.approx(113920.0)
    fast = _ceiling(PeakBasis("measured", "toy", 1e9, 10.0, 4.0, 2.0), lora_rank=2, world_size=4)
    # 2 bytes · 512 · 3/4 = 768 B at 4 B/s
    assert fast.train_s == pytest.approx(192.0)


def test_full_sharding_gathers_the_weights_each_micro_batch() -> None:
    """ZeRO-3 on 4 GPUs with 3 micro-batches: the gradients, and 3 gathers of the bf16 weights."""
    fast = PeakBasis("measured", "toy", 1e9, 10.0, 4.0, 2.0)
    c = _ceiling(fast, world_size=4, grad_accum=3, deepspeed=True, zero_stage=3)
    # grads 2 · 1,000 · 3/4 = 1,500 B; gathers 3 · 2 · 1,000 · 3/4 = 4,500 B; 6,000 B at 4 B/s
    assert c.train_s == pytest.approx(1500.0)
    # FSDP full sharding: the same; ZeRO-2 or a stage without DeepSpeed/FSDP: the gradients only
    assert _ceiling(fast, world_size=4, grad_accum=3, fsdp=True, zero_stage=3).train_s == pytest.approx(
        1500.0
    )
    assert _ceiling(fast, world_size=4, grad_accum=3, deepspeed=True, zero_stage=2).train_s == pytest.approx(
        375.0
    )
    assert _ceiling(fast, world_size=4, grad_accum=3, zero_stage=3).train_s == pytest.approx(375.0)


def test_one_gpu_exchanges_nothing() -> None:
    """1 GPU under ZeRO-3: no gradient exchange, no gather; the compute alone."""
    fast = PeakBasis("measured", "toy", 1e9, 10.0, 4.0, 2.0)
    c = _ceiling(fast, world_size=1, deepspeed=True, zero_stage=3)
    # 341,760 FLOPs at 1e9 FLOP/s
    assert c.train_s == pytest.approx(341760 / 1e9)


# ------------------------------------------------------------------------------------- weight sync


def test_weight_sync() -> None:
    weights = 2000  # bf16 bytes
    assert _ceiling().weight_sync_s == 0  # no vLLM
    # colocated at TP 2: each GPU writes half: 1,000 B at 10 B/s
    assert _ceiling(world_size=4, use_vllm=True, vllm_tp=2).weight_sync_s == pytest.approx(100.0)
    # a server: the weights over the peer link, 2,000 B at 4 B/s (its own write: 2,000 / 10 = 200 s)
    server = _ceiling(world_size=4, use_vllm=True, vllm_mode="server")
    assert server.weight_sync_s == pytest.approx(weights / 4)
    # ZeRO-3 on 4 GPUs gathers 3/4 of them first: 1,500 B at 4 B/s beats the 100 s write
    zero3 = _ceiling(world_size=4, use_vllm=True, vllm_tp=2, deepspeed=True, zero_stage=3)
    assert zero3.weight_sync_s == pytest.approx(375.0)
    # ... but not on 1 GPU, nor without DeepSpeed/FSDP sharding: the write alone, 2,000 / 10
    alone = _ceiling(world_size=1, use_vllm=True, deepspeed=True, zero_stage=3)
    assert alone.weight_sync_s == pytest.approx(200.0)
    plain = _ceiling(world_size=4, use_vllm=True, vllm_tp=2, zero_stage=3)
    assert plain.weight_sync_s == pytest.approx(100.0)


# ---------------------------------------------------------------------------------------- offload


def test_deepspeed_offload_runs_beside_the_training() -> None:
    """Optimizer offload on 2 GPUs, full training: each GPU sends its half of the bf16 gradients down
    and gets the weights back; parameter offload moves the bf16 weights up for each micro-batch."""
    c = _ceiling(deepspeed=True, zero_stage=2, ds_offload_optimizer=True)
    # 2 · (2 · 1,000 / 2) = 2,000 B at 2 B/s
    assert c.offload_s == pytest.approx(1000.0)
    both = _ceiling(deepspeed=True, zero_stage=3, ds_offload_optimizer=True, ds_offload_param=True)
    # + 2 micro-batches · 2 · 2,000 / 2 GPUs = 4,000 B → 2,000 s more
    assert both.offload_s == pytest.approx(3000.0)
    # the train phase on RATES: 341,760 FLOPs / 200 = 1,708.8 s; comm (1,000 + 2 · 1,000) / 4 = 750 s
    assert both.train_s == pytest.approx(1708.8)
    # the step takes the larger of training and its offload: 1,708.8 < 3,000
    assert both.step_s == pytest.approx(both.rollout_s + 3000.0)
    assert c.step_s == pytest.approx(c.rollout_s + 1708.8)
    # on 1 GPU it moves all of them: 2 · 2,000 B at 2 B/s
    one = _ceiling(world_size=1, deepspeed=True, zero_stage=2, ds_offload_optimizer=True)
    assert one.offload_s == pytest.approx(2000.0)
    # with LoRA only the 512 adapter gradients: 2 · (2 · 512 / 2) = 1,024 B
    lora = _ceiling(deepspeed=True, zero_stage=2, ds_offload_optimizer=True, lora_rank=2)
    assert lora.offload_s == pytest.approx(512.0)


def test_the_transfers_around_a_colocated_rollout() -> None:
    """Offloading the trainer's weights and optimizer states while vLLM generates, and vLLM's sleep."""
    colocated = dict(world_size=2, use_vllm=True, vllm_max_num_seqs=8)
    # the unsharded bf16 weights out and back: 2 · 2,000 B at 2 B/s
    assert _ceiling(**colocated, rollout_offload_model=True).offload_s == pytest.approx(2000.0)
    # under ZeRO-3 each GPU holds half: 2 · 1,000 B
    zero3 = _ceiling(**colocated, rollout_offload_model=True, deepspeed=True, zero_stage=3)
    assert zero3.offload_s == pytest.approx(1000.0)
    # optimizer states, 12 bytes per trainable parameter, whole: 2 · 12,000 B
    assert _ceiling(**colocated, rollout_offload_optimizer=True).offload_s == pytest.approx(12000.0)
    # ... sharded by ZeRO-1 over 2 GPUs: 2 · 6,000 B
    zero1 = _ceiling(**colocated, rollout_offload_optimizer=True, deepspeed=True, zero_stage=1)
    assert zero1.offload_s == pytest.approx(6000.0)
    # ... not moved again when DeepSpeed already keeps them on the host: only its own 1,000 s
    ds = _ceiling(
        **colocated, rollout_offload_optimizer=True, deepspeed=True, zero_stage=1, ds_offload_optimizer=True
    )
    assert ds.offload_s == pytest.approx(1000.0)
    # sleep level 1 at TP 2 on 2 GPUs: each GPU's half of the weights to the host and back, 2 · 1,000 B
    slept = _ceiling(**colocated, vllm_tp=2, sleep_level=1)
    assert slept.offload_s == pytest.approx(1000.0)
    assert _ceiling(**colocated, sleep_level=2).offload_s == 0
    # a server keeps its own weights: nothing moves around the rollout
    server = dict(colocated, vllm_mode="server")
    assert _ceiling(**server, rollout_offload_model=True, sleep_level=1).offload_s == 0


def test_the_step_adds_the_phases() -> None:
    """Rollout + reference + sync + max(train, DeepSpeed offload) + rollout transfers."""
    c = _ceiling(
        world_size=2,
        use_vllm=True,
        vllm_max_num_seqs=8,
        beta=0.04,
        rollout_offload_model=True,
        deepspeed=True,
        zero_stage=2,
        ds_offload_optimizer=True,
    )
    # colocated TP 1, 2 engines of 4 sequences: the trainer's rollout numbers, 1,048 s; reference 569.6 s;
    # sync 2,000 B / 10 = 200 s; train 1,708.8 s vs DeepSpeed offload 1,000 s; weights out and back 2,000 s
    assert (c.rollout_s, c.reference_s, c.weight_sync_s, c.train_s) == pytest.approx(
        (1048.0, 569.6, 200.0, 1708.8)
    )
    assert c.offload_s == pytest.approx(3000.0)
    assert c.step_s == pytest.approx(1048.0 + 569.6 + 200.0 + 1708.8 + 2000.0)


# ------------------------------------------------------------------------------ columns of a plan


def test_columns_count_each_rows_lora_rank() -> None:
    """Four candidates with LoRA ranks 2, 0, 4, 2 on 4 GPUs: their adapters' gradients (512, the full
    1,000, 1,024, 512 parameters) set the communication-bound train phase row by row."""
    configs = [
        JobConfig(
            world_size=4,
            global_batch=8,
            num_generations=4,
            per_device_batch=2,
            grad_accum=1,
            max_prompt_length=3,
            max_completion_length=5,
            lora_rank=rank,
        )
        for rank in (2, 0, 4, 2)
    ]
    cols = ShapeColumns(
        {name: column([getattr(c, name) for c in configs], dtype) for name, dtype in CONFIG_COLUMNS.items()},
        TOY,
        4,
    )
    fast = PeakBasis("measured", "toy", 1e9, 10.0, 4.0, 2.0)
    terms = ceiling_terms(cols, fast, cols.max_prompt_length, cols.max_completion_length)
    # 2 bytes · trainable · 3/4 at 4 B/s = 0.375 · trainable
    np.testing.assert_allclose(terms["train"], [192.0, 375.0, 384.0, 192.0])


# -------------------------------------------------------------------------------------- peak basis


def _gpu(name: str, interconnect: Any, nvlink: float, pcie: float, *, known: bool = True) -> GpuSpec:
    return GpuSpec(name, 8 << 30, 2e14, 1e12, interconnect, nvlink, pcie, (f"NVIDIA {name}",), known)


def test_catalog_peaks_take_the_faster_link_between_gpus() -> None:
    # NVLink of 20 GB/s both directions (10 per direction) is slower than its 64 GB/s PCIe
    slow_nvlink = _gpu("X1", "nvlink", 20e9, 64e9, known=False)
    assert PeakBasis.from_gpu(slow_nvlink) == PeakBasis("catalog", "X1", 2e14, 1e12, 64e9, 64e9, False, None)
    fast_nvlink = _gpu("X2", "nvlink", 400e9, 32e9)
    assert PeakBasis.from_gpu(fast_nvlink) == PeakBasis("catalog", "X2", 2e14, 1e12, 200e9, 32e9, True, None)


def test_measured_peaks_keep_the_links_they_measured() -> None:
    gpu = _gpu("X2", "nvlink", 400e9, 32e9)
    peaks = MeasuredPeaks("NVIDIA X2", 1e14, 8e11, 5e9, 7e9, 2, "m", "2026-01-02T03:04:05+00:00")
    assert PeakBasis.from_peaks(peaks, gpu) == PeakBasis(
        "measured", "NVIDIA X2", 1e14, 8e11, 7e9, 5e9, True, "2026-01-02T03:04:05+00:00"
    )
    unlinked = MeasuredPeaks("NVIDIA X2", 1e14, 8e11, None, None, 1, "m", "t")
    # the catalog's links: NVLink 400/2 per direction between GPUs, PCIe 32 GB/s to the host
    assert PeakBasis.from_peaks(unlinked, gpu) == PeakBasis(
        "measured", "NVIDIA X2", 1e14, 8e11, 200e9, 32e9, True, "t"
    )
    # no catalog GPU either: the memory bandwidth stands in for both links
    assert PeakBasis.from_peaks(unlinked) == PeakBasis(
        "measured", "NVIDIA X2", 1e14, 8e11, 8e11, 8e11, True, "t"
    )
    slow = _gpu("X1", "nvlink", 20e9, 64e9)
    assert PeakBasis.from_peaks(unlinked, slow).peer_bytes_per_s == 64e9


def test_which_peaks_a_ceiling_resolves_to() -> None:
    h100 = find_gpu("H100")
    assert h100 is not None
    cpu = MeasuredPeaks(CPU_DEVICE, 1e11, 2e10, None, None, 1, "m", "t")
    # CPU peaks on a GPU trial: the GPU's catalog peaks; GPU peaks without a GPU: nothing to bound
    assert PeakBasis.resolve(h100, cpu) == PeakBasis.from_gpu(h100)
    assert (
        PeakBasis.resolve(None, MeasuredPeaks("NVIDIA H100 80GB HBM3", 1, 1, None, None, 1, "m", "t")) is None
    )
    assert PeakBasis.resolve(None, cpu) == PeakBasis.from_peaks(cpu)
    # the GPU's peaks, by its catalog name, its NVML name, or a suffixed NVML name the catalog resolves
    for device in ("H100", "NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3 MIG 7g.80gb"):
        peaks = MeasuredPeaks(device, 7e14, 3e12, None, None, 1, "m", "t")
        assert PeakBasis.resolve(h100, peaks) == PeakBasis.from_peaks(peaks, h100), device
    other = MeasuredPeaks("NVIDIA H200", 7e14, 3e12, None, None, 1, "m", "t")
    assert PeakBasis.resolve(h100, other) == PeakBasis.from_gpu(h100)
    unknown = MeasuredPeaks("Mystery GPU", 7e14, 3e12, None, None, 1, "m", "t")
    assert PeakBasis.resolve(h100, unknown) == PeakBasis.from_gpu(h100)
    # a GPU the catalog does not know matches its own peaks by its name, or by an NVML name it lists
    mystery = generic_gpu("Mystery GPU", 8 << 30)
    assert PeakBasis.resolve(mystery, unknown) == PeakBasis.from_peaks(unknown, mystery)
    x2 = _gpu("X2", "nvlink", 400e9, 32e9)
    x2_peaks = MeasuredPeaks("NVIDIA X2", 7e14, 3e12, None, None, 1, "m", "t")
    assert PeakBasis.resolve(x2, x2_peaks) == PeakBasis.from_peaks(x2_peaks, x2)
    assert PeakBasis.resolve(x2, unknown) == PeakBasis.from_gpu(x2)


def test_the_basis_in_words_and_as_a_dict() -> None:
    h100 = find_gpu("H100")
    assert h100 is not None
    # 989e12 / 1e12 = 989 TFLOP/s in 3 significant digits; 3,350e9 / 1e9 = 3,350 GB/s in whole GB/s
    assert PeakBasis.from_gpu(h100).text() == "catalog peaks of H100 (989 TFLOP/s, 3,350 GB/s)"
    guess = PeakBasis.from_gpu(_gpu("X1", "pcie", 0.0, 32e9, known=False))
    assert (
        guess.text()
        == "catalog peaks of X1 (200 TFLOP/s, 1,000 GB/s, an unknown GPU's guessed peaks: not a bound)"
    )
    measured = PeakBasis("measured", "cpu", 1.234e11, 2e10, 2e10, 2e10, True, "2026-01-01T00:00:00+00:00")
    assert (
        measured.text()
        == "measured peaks of cpu (0.123 TFLOP/s, 20 GB/s, measured 2026-01-01T00:00:00+00:00)"
    )
    # the units are exactly 1e12 FLOP/s and 1e9 B/s: 1.1250000000005 TFLOP/s rounds up to 1.13 (a hair
    # less, 1.125 exactly, would round to even: 1.12), 1,124.5000000005 GB/s up to 1,125 (a hair less
    # rounds to 1,124)
    edge = PeakBasis("measured", "cpu", 1.125e12 + 0.5, 1.1245e12 + 0.5, 1.0, 1.0)
    assert edge.text() == "measured peaks of cpu (1.13 TFLOP/s, 1,125 GB/s)"
    assert measured.to_dict() == {
        "source": "measured",
        "device": "cpu",
        "flops_per_s": 1.234e11,
        "memory_bytes_per_s": 2e10,
        "peer_bytes_per_s": 2e10,
        "host_link_bytes_per_s": 2e10,
        "known": True,
        "measured_at": "2026-01-01T00:00:00+00:00",
    }


# ----------------------------------------------------------------------------------- what it reports


def test_the_work_in_words() -> None:
    assert StepWork().text() == (
        "prompt tokens per sample: the declared maximum; completion tokens per sample: the declared maximum"
    )
    # 4 significant digits
    assert StepWork(0, 1234.56).text() == "prompt tokens per sample: 0; completion tokens per sample: 1235"


def test_the_ceiling_as_a_dict() -> None:
    c = _ceiling(beta=0.04, world_size=2, use_vllm=True, vllm_max_num_seqs=8)
    assert c.timeline_s() == {"rollout": c.rollout_s, "train": c.train_s, "weight_sync": c.weight_sync_s}
    assert c.to_dict() == {
        "rollout_prefill_s": c.rollout_prefill_s,
        "rollout_decode_s": c.rollout_decode_s,
        "rollout_s": c.rollout_s,
        "reference_s": c.reference_s,
        "train_s": c.train_s,
        "weight_sync_s": c.weight_sync_s,
        "offload_s": c.offload_s,
        "step_s": c.step_s,
        "basis": RATES.to_dict(),
        "work": {"prompt_tokens_per_sample": None, "completion_tokens_per_sample": None},
    }
    # the declared lengths were counted: 3 prompt and 5 completion tokens (the reference's 569.6 s)
    assert c.reference_s == pytest.approx(569.6)
