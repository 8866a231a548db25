"""A rough step-time model, used only to order candidates (never reported as a prediction of speed).

One GRPO optimizer step = rollout (generate ``global_batch`` completions) + weight sync into vLLM +
training (forward/backward over every micro-batch) + offload transfers. Generation is memory-bound
decode: every decode step reads the weights once and the KV cache of the running sequences. Training
is FLOPs at a realistic MFU that grows with the micro-batch, plus ZeRO communication.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from autotune.estimate.catalog import GpuSpec
from autotune.estimate.memory import MemoryEstimate, estimate_memory, lora_params
from autotune.estimate.shape import JobShape

__all__ = ["TimeEstimate", "estimate_step_time"]

HBM_EFFICIENCY = 0.7  # achieved / nominal HBM bandwidth in decode
DECODE_MFU = 0.5  # compute efficiency of a decode step once it is compute-bound
PREFILL_MFU = 0.5
TRAIN_MFU_MAX = 0.45  # large micro-batches, bf16, flash attention
TRAIN_MFU_TOKENS = 8192  # micro-batch tokens at which TRAIN_MFU_MAX is reached
LINK_EFFICIENCY = 0.6  # achieved / nominal bandwidth of NVLink or PCIe collectives
CPU_ADAM_PARAMS_S = 1.0e9  # DeepSpeed CPU Adam, parameters per second for the whole node
HF_GENERATE_SLOWDOWN = 3.0  # model.generate vs vLLM at the same batch (python loop, no paging)
STEP_OVERHEAD_S = 0.05  # per decode step: scheduler, sampling, kernel launches
TP_ALLREDUCE_S = 20e-6  # one all-reduce latency per layer half at TP > 1
SYNC_BATCH_OVERHEAD_S = 0.05  # one gather + load round of move_model_batches


@dataclass(frozen=True)
class TimeEstimate:
    """Rough seconds per optimizer step, by phase.

    Attributes:
        rollout_s: generating ``global_batch`` completions.
        train_s: forward/backward of every micro-batch + optimizer (ZeRO communication included).
        sync_s: pushing weights into vLLM (gathers included).
        offload_s: host transfers and CPU optimizer work (DeepSpeed offload, ms-swift offload, sleep 1).
        total_s: the sum.
        throughput: completions per second (``global_batch / total_s``).
    """

    rollout_s: float
    train_s: float
    sync_s: float
    offload_s: float
    total_s: float
    throughput: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _link_bytes_s(gpu: GpuSpec) -> float:
    return gpu.peer_bytes_s * LINK_EFFICIENCY


def _rollout_s(s: JobShape, gpu: GpuSpec, mem: MemoryEstimate) -> float:
    m = s.model
    weight_bytes = 2 * m.params
    kv_per_token = 2 * m.layers * m.kv_heads * m.head_dim * 2
    if s.use_vllm:
        tp = s.vllm_tp
        instances = max(1, s.world_size // tp) if s.vllm_mode == "colocate" else 1
        seqs = math.ceil(s.global_batch / instances)
        conc = mem.rollout_concurrency if s.vllm_mode == "colocate" else min(seqs, s.vllm_max_num_seqs)
        conc = max(1, min(conc, seqs))
        slowdown = 1.0
    else:
        tp = 1
        seqs = max(1, s.per_device_batch * s.grad_accum)
        conc = seqs
        slowdown = HF_GENERATE_SLOWDOWN
        if s.states_sharding == 3:
            slowdown *= 1.2
    waves = math.ceil(seqs / conc)
    avg_ctx = s.max_prompt_length + s.max_completion_length / 2
    read = weight_bytes / tp + conc * avg_ctx * kv_per_token / tp
    mem_s = read / (gpu.hbm_bytes_s * HBM_EFFICIENCY)
    flop_s = 2 * m.params * conc / tp / (gpu.bf16_flops * DECODE_MFU)
    tp_s = 2 * m.layers * TP_ALLREDUCE_S if tp > 1 else 0.0
    decode_step = max(mem_s, flop_s) + tp_s + STEP_OVERHEAD_S / 10
    prefill = 2 * m.params * seqs * s.max_prompt_length / tp / (gpu.bf16_flops * PREFILL_MFU)
    return slowdown * (waves * s.max_completion_length * decode_step + prefill)


def _train_s(s: JobShape, gpu: GpuSpec) -> float:
    m = s.model
    n = max(1, s.world_size)
    micro_tokens = s.micro_batch_tokens
    tokens_gpu = s.global_batch * s.seq_len / n
    per_token = (4.0 if s.lora else 6.0) * m.params
    if s.gradient_checkpointing:
        per_token += 2.0 * m.params
    if s.beta > 0:
        per_token += 2.0 * m.params  # reference forward (adapter disabled with LoRA)
    mfu = TRAIN_MFU_MAX * min(1.0, micro_tokens / TRAIN_MFU_TOKENS) ** 0.3
    compute = tokens_gpu * per_token / (gpu.bf16_flops * mfu)

    comm = 0.0
    if n > 1:
        ring = (n - 1) / n
        full = 2 * m.params * ring / _link_bytes_s(gpu)
        grads = 2 * (lora_params(m, s.lora_rank) if s.lora else m.params) * ring / _link_bytes_s(gpu)
        if s.states_sharding == 3:
            gathers = 3 if s.gradient_checkpointing else 2  # forward, (recompute), backward
            comm = s.grad_accum * (gathers * full + grads)
        elif s.states_sharding == 2:
            comm = s.grad_accum * grads + full
        elif s.states_sharding == 1:
            comm = 2 * grads + full
        else:
            comm = 2 * grads
        if s.states_sharding != 3:
            comm *= 0.5  # bucketed reduction overlaps with the backward pass
    return compute + comm


def _sync_s(s: JobShape, gpu: GpuSpec) -> float:
    if not s.use_vllm:
        return 0.0
    m = s.model
    weight_bytes = 2 * m.params
    t = 2 * weight_bytes / max(1, s.vllm_tp) / (gpu.hbm_bytes_s * HBM_EFFICIENCY)  # load into vLLM
    if s.vllm_mode == "server":
        t += weight_bytes / (gpu.pcie_bytes_s * LINK_EFFICIENCY)  # NCCL broadcast to the server
    n = max(1, s.world_size)
    if s.states_sharding == 3 and n > 1:
        t += weight_bytes * (n - 1) / n / _link_bytes_s(gpu)
        if s.move_model_batches:
            t += (s.move_model_batches + 1) * SYNC_BATCH_OVERHEAD_S
    return t


def _offload_s(s: JobShape, gpu: GpuSpec) -> float:
    m = s.model
    n = max(1, s.world_size)
    pcie = gpu.pcie_bytes_s * LINK_EFFICIENCY
    trainable = lora_params(m, s.lora_rank) if s.lora else m.params
    t = 0.0
    if s.ds_offload_optimizer:
        # gradients down (fp32 on the CPU side, sent as bf16), updated bf16 weights up, CPU Adam
        t += 2 * (2 * trainable / n) / pcie + trainable / CPU_ADAM_PARAMS_S
    if s.ds_offload_param:
        passes = 3 if s.gradient_checkpointing else 2
        t += s.grad_accum * passes * 2 * m.params / n / pcie
    if s.colocate and s.rollout_offload_model:
        held = 2 * m.params / n if s.zero_stage == 3 else 2 * m.params
        t += 2 * held / pcie
    if s.colocate and s.rollout_offload_optimizer and not s.ds_offload_optimizer:
        opt_bytes = 12 * trainable / (n if s.states_sharding is not None else 1)
        t += 2 * opt_bytes / pcie
    if s.colocate and s.sleep_level == 1:
        t += 2 * (2 * m.params / max(1, s.vllm_tp)) / pcie  # weights to the host and back
    return t


def estimate_step_time(
    shape: JobShape, gpu: GpuSpec | None, memory: MemoryEstimate | None = None
) -> TimeEstimate:
    """Rough seconds per optimizer step, for ordering candidates only.

    Args:
        shape: the trial.
        gpu: the GPU; None for a CPU-only trial (then the numbers compare CPU candidates only roughly,
            as if on a slow GPU).
        memory: the trial's memory estimate when already computed (for vLLM concurrency).
    """
    from autotune.estimate.catalog import generic_gpu

    gpu = gpu or generic_gpu("cpu", 0)
    mem = memory or estimate_memory(shape, gpu)
    rollout = _rollout_s(shape, gpu, mem)
    train = _train_s(shape, gpu)
    sync = _sync_s(shape, gpu)
    offload = _offload_s(shape, gpu)
    total = rollout + train + sync + offload
    return TimeEstimate(
        rollout_s=rollout,
        train_s=train,
        sync_s=sync,
        offload_s=offload,
        total_s=total,
        throughput=shape.global_batch / total if total > 0 else 0.0,
    )
