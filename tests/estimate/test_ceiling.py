"""Each phase's ceiling against values computed by hand, for two models on two GPUs.

The arithmetic is written out from the models' and GPUs' published facts (not from the catalog's
helpers), so a change in a formula shows here as a number that no longer matches.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from autotune.estimate import (
    CPU_DEVICE,
    JobShape,
    MeasuredPeaks,
    PeakBasis,
    StepWork,
    find_gpu,
    find_model,
    step_ceiling,
    step_ceiling_s,
)
from autotune.jobconfig import JobConfig


@dataclass(frozen=True)
class Hand:
    """A GPU's data-sheet peaks, typed in from the vendor's numbers."""

    name: str
    flops: float  # dense bf16 FLOP/s
    hbm: float  # bytes/s
    peer: float  # NVLink per direction, bytes/s
    pcie: float  # bytes/s per direction


H100 = Hand("H100", 989e12, 3350e9, 450e9, 64e9)  # NVLink 4: 900 GB/s both directions
A100 = Hand("A100-80G", 312e12, 2039e9, 300e9, 32e9)  # NVLink 3: 600 GB/s both directions

# Qwen2.5-7B: 28 layers, hidden 3584, 28 heads, 4 KV heads of 128, MLP 18944, vocab 152064, untied,
# q/k/v biases.
Q_L, Q_H, Q_Q, Q_KV, Q_I, Q_V = 28, 3584, 28 * 128, 4 * 128, 18944, 152064
Q_LAYER = Q_H * Q_Q + 2 * Q_H * Q_KV + Q_Q * Q_H + (Q_Q + 2 * Q_KV) + 3 * Q_H * Q_I + 2 * Q_H
Q_PARAMS = Q_L * Q_LAYER + 2 * Q_V * Q_H + Q_H  # embedding and LM head, final norm
Q_BODY = Q_PARAMS - 2 * Q_V * Q_H  # the matmuls besides the LM head (and no embedding lookup)
Q_HEAD = Q_V * Q_H
Q_KV_TOKEN = 2 * Q_L * 4 * 128 * 2  # K and V, bf16, every layer

# Llama-3.1-8B: 32 layers, hidden 4096, 32 heads, 8 KV heads of 128, MLP 14336, vocab 128256, untied.
L_L, L_H, L_Q, L_KV, L_I, L_V = 32, 4096, 32 * 128, 8 * 128, 14336, 128256
L_LAYER = L_H * L_Q + 2 * L_H * L_KV + L_Q * L_H + 3 * L_H * L_I + 2 * L_H
L_PARAMS = L_L * L_LAYER + 2 * L_V * L_H + L_H
L_BODY = L_PARAMS - 2 * L_V * L_H
L_HEAD = L_V * L_H
L_KV_TOKEN = 2 * L_L * 8 * 128 * 2


def test_the_hand_counts_match_the_catalog() -> None:
    qwen, llama = find_model("Qwen2.5-7B"), find_model("Llama-3.1-8B")
    assert qwen is not None and llama is not None
    assert (qwen.params, qwen.kv_bytes_per_token) == (Q_PARAMS, Q_KV_TOKEN) == (7_615_616_512, 57_344)
    assert (llama.params, llama.kv_bytes_per_token) == (L_PARAMS, L_KV_TOKEN) == (8_030_261_248, 131_072)


def _basis(hand: Hand) -> PeakBasis:
    gpu = find_gpu(hand.name)
    assert gpu is not None
    basis = PeakBasis.from_gpu(gpu)
    assert (basis.flops_per_s, basis.memory_bytes_per_s) == (hand.flops, hand.hbm)
    assert (basis.peer_bytes_per_s, basis.host_link_bytes_per_s) == (hand.peer, hand.pcie)
    return basis


@pytest.mark.parametrize("hand", [H100, A100], ids=lambda h: h.name)
def test_qwen_colocated_vllm_zero2(hand: Hand) -> None:
    """8 GPUs, 64 completions of 1024 tokens from 8 prompts of 512, vLLM colocated at TP 1 (8 engines,
    64 running sequences at most), ZeRO-2, no checkpointing, no reference."""
    model = find_model("Qwen2.5-7B")
    assert model is not None
    config = JobConfig(
        world_size=8,
        global_batch=64,
        num_generations=8,
        per_device_batch=4,
        grad_accum=2,
        max_prompt_length=512,
        max_completion_length=1024,
        gradient_checkpointing=False,
        deepspeed=True,
        zero_stage=2,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_num_seqs=64,
    )
    c = step_ceiling(JobShape(config, model, 8), _basis(hand))
    F, BW = hand.flops, hand.hbm
    # each of 8 engines: 8 sequences, 1 distinct prompt
    prefill = 2 * Q_BODY * 1 * 512 / F
    iterations = max(1024, 8 * 1024 / 64)  # = 1024: a sequence's tokens come one after another
    kv_reads = 8 * 1024 * 1023 / 2 * Q_KV_TOKEN
    decode_memory = (iterations * 2 * (Q_BODY + Q_HEAD) + kv_reads) / BW
    decode_compute = 2 * (Q_BODY + Q_HEAD) * 8 * 1024 / F
    assert c.rollout_prefill_s == pytest.approx(prefill)
    assert c.rollout_decode_s == pytest.approx(max(decode_memory, decode_compute))
    assert c.rollout_s == pytest.approx(max(decode_memory, prefill + decode_compute))
    assert c.reference_s == 0
    # forward + backward: 6 FLOPs per parameter and token, the LM head over completion tokens only
    train_flops = 64 * (6 * Q_BODY * (512 + 1024) + 6 * Q_HEAD * 1024)
    grads = 2 * Q_PARAMS * 7 / 8 / hand.peer  # each GPU receives its share of the bf16 gradients
    assert c.train_s == pytest.approx(max(train_flops / (8 * F), grads))
    assert c.weight_sync_s == pytest.approx(2 * Q_PARAMS / BW)  # bf16 weights written into vLLM
    assert c.offload_s == 0
    assert c.step_s == pytest.approx(c.rollout_s + c.train_s + c.weight_sync_s)
    # on the H100, decode reads (weights + KV) dominate the rollout
    assert c.rollout_s == pytest.approx(decode_memory)


@pytest.mark.parametrize("hand", [H100, A100], ids=lambda h: h.name)
def test_llama_server_lora_zero3_offload(hand: Hand) -> None:
    """4 trainer GPUs, a vLLM server of TP 2 (one engine), 32 completions of 256 tokens from 4 prompts of
    128, LoRA rank 16 with checkpointing and a reference (beta 0.04), ZeRO-3 with optimizer offload."""
    model = find_model("Llama-3.1-8B")
    assert model is not None
    config = JobConfig(
        world_size=4,
        global_batch=32,
        num_generations=8,
        per_device_batch=2,
        grad_accum=4,
        max_prompt_length=128,
        max_completion_length=256,
        gradient_checkpointing=True,
        deepspeed=True,
        zero_stage=3,
        ds_offload_optimizer=True,
        lora_rank=16,
        beta=0.04,
        use_vllm=True,
        vllm_mode="server",
        vllm_tp=2,
        vllm_max_num_seqs=8,
    )
    c = step_ceiling(JobShape(config, model, 4), _basis(hand))
    F, BW, peer, pcie = hand.flops, hand.hbm, hand.peer, hand.pcie
    # one engine of 2 GPUs: 32 sequences, 4 distinct prompts, at most 8 running at once
    prefill = 2 * L_BODY * 4 * 128 / (2 * F)
    iterations = max(256, 32 * 256 / 8)  # = 1024: four waves of the 8-sequence cap
    kv_reads = 32 * 256 * 255 / 2 * L_KV_TOKEN
    decode_memory = (iterations * 2 * (L_BODY + L_HEAD) + kv_reads) / 2 / BW
    decode_compute = 2 * (L_BODY + L_HEAD) * 32 * 256 / (2 * F)
    assert c.rollout_prefill_s == pytest.approx(prefill)
    assert c.rollout_decode_s == pytest.approx(max(decode_memory, decode_compute))
    assert c.rollout_s == pytest.approx(max(decode_memory, prefill + decode_compute))
    # reference forward on the 4 trainer GPUs: every token through the body, completions through the head
    assert c.reference_s == pytest.approx(32 * (2 * L_BODY * 384 + 2 * L_HEAD * 256) / (4 * F))
    # LoRA: 4 FLOPs per parameter and token (no weight gradients of the base), +2 to recompute
    lora = 32 * 16 * ((4096 + 4096) + 2 * (4096 + 1024) + (4096 + 4096) + 2 * (4096 + 14336) + (14336 + 4096))
    train_flops = 32 * ((4 + 2) * L_BODY * 384 + 4 * L_HEAD * 256)
    comm = 2 * lora * 3 / 4 / peer + 4 * 2 * L_PARAMS * 3 / 4 / peer  # LoRA grads + a gather per micro-batch
    assert c.train_s == pytest.approx(max(train_flops / (4 * F), comm))
    # the server receives the bf16 weights over the fastest link; ZeRO-3 gathers them first
    assert c.weight_sync_s == pytest.approx(
        max(2 * L_PARAMS / 2 / BW, 2 * L_PARAMS / peer, 2 * L_PARAMS * 3 / 4 / peer)
    )
    # optimizer offload: each GPU sends its bf16 LoRA gradients down and gets the weights back
    offload = 2 * (2 * lora / 4) / pcie
    assert c.offload_s == pytest.approx(offload)
    assert c.step_s == pytest.approx(c.rollout_s + c.reference_s + c.weight_sync_s + max(c.train_s, offload))


def test_sleep_and_rollout_offload_are_host_link_transfers() -> None:
    model, gpu = find_model("Qwen2.5-7B"), find_gpu("H100")
    assert model is not None and gpu is not None
    base = dict(
        world_size=2, global_batch=16, num_generations=8, per_device_batch=8, grad_accum=1, use_vllm=True
    )
    plain = step_ceiling(JobShape(JobConfig(**base), model, 2), PeakBasis.from_gpu(gpu))
    slept = step_ceiling(
        JobShape(JobConfig(**base, sleep_level=1, rollout_offload_model=True), model, 2),
        PeakBasis.from_gpu(gpu),
    )
    weights = 2 * Q_PARAMS
    # sleep level 1: weights to the host and back; the trainer's (unsharded) weights out and back
    assert slept.offload_s == pytest.approx(2 * weights / 64e9 + 2 * weights / 64e9)
    assert slept.step_s == pytest.approx(plain.step_s + slept.offload_s)


def test_measured_tokens_and_the_cpu_basis() -> None:
    model = find_model("Qwen2.5-0.5B")
    assert model is not None
    peaks = MeasuredPeaks(CPU_DEVICE, 1e11, 2e10, None, None, 1, "host | cpu x2", "2026-01-01T00:00:00+00:00")
    basis = PeakBasis.resolve(None, peaks)
    assert basis is not None and basis.source == "measured"
    assert basis.peer_bytes_per_s == basis.host_link_bytes_per_s == 2e10  # no link on a CPU: RAM copies
    config = JobConfig(world_size=1, global_batch=4, num_generations=4, per_device_batch=4, grad_accum=1)
    shape = JobShape(config, model, 0)
    declared = step_ceiling(shape, basis)
    measured = step_ceiling(
        shape, basis, StepWork(prompt_tokens_per_sample=0, completion_tokens_per_sample=10)
    )
    body, head = model.params - model.vocab * model.hidden, model.vocab * model.hidden  # tied embeddings
    # model.generate in the trainer: 4 sequences, at least 10 iterations each reading the weights
    decode_memory = (10 * 2 * (body + head) + 4 * 10 * 9 / 2 * model.kv_bytes_per_token) / 2e10
    assert measured.rollout_prefill_s == 0
    assert measured.rollout_s == pytest.approx(max(decode_memory, 2 * (body + head) * 4 * 10 / 1e11))
    assert measured.train_s == pytest.approx(4 * (8 * body * 10 + 6 * head * 10) / 1e11)
    assert measured.step_s == step_ceiling_s(shape, basis, measured.work) < declared.step_s
    assert "measured peaks of cpu" in basis.text()


def test_peaks_of_another_device_fall_back_to_the_catalog() -> None:
    gpu = find_gpu("H100")
    assert gpu is not None
    a10 = MeasuredPeaks("NVIDIA A10", 1e14, 5e11, 2e10, None, 1, "m", "2026-01-01T00:00:00+00:00")
    h100 = MeasuredPeaks(
        "NVIDIA H100 80GB HBM3", 7e14, 2.9e12, 5e10, None, 1, "m", "2026-01-01T00:00:00+00:00"
    )
    assert PeakBasis.resolve(gpu, a10) == PeakBasis.from_gpu(gpu)
    measured = PeakBasis.resolve(gpu, h100)
    assert measured is not None and measured.source == "measured" and measured.flops_per_s == 7e14
    assert measured.host_link_bytes_per_s == 5e10 and measured.peer_bytes_per_s == gpu.nvlink_bytes_s / 2
    assert PeakBasis.resolve(None, None) is None
