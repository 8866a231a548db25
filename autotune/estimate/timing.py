"""A rough step-time model, used only to order candidates (never reported as a prediction of speed).

One GRPO optimizer step = rollout (generate ``global_batch`` completions) + weight sync into vLLM +
training (forward/backward over every micro-batch) + offload transfers. Generation is memory-bound
decode: every decode step reads the weights once and the KV cache of the running sequences. Training
is FLOPs at a realistic MFU that grows with the micro-batch, plus ZeRO communication.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from autotune.estimate import _vec as v
from autotune.estimate.catalog import GpuSpec
from autotune.estimate.memory import MemoryEstimate, estimate_memory
from autotune.estimate.shape import JobShape
from autotune.estimate.states import lora_params
from autotune.jsontypes import JsonObject

__all__ = ["TimeEstimate", "estimate_step_time", "step_time_terms"]

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

    def to_dict(self) -> JsonObject:
        return asdict(self)


def _link_bytes_s(gpu: GpuSpec) -> float:
    return gpu.peer_bytes_s * LINK_EFFICIENCY


# The functions below take ``s``: one trial (a JobShape: Python numbers) or every candidate of a plan
# (ShapeColumns: numpy columns of the same names). They are written once, with autotune.estimate._vec.


def _rollout_s(s: Any, gpu: GpuSpec, concurrency: Any) -> Any:
    m = s.model
    weight_bytes = 2 * m.params
    kv_per_token = 2 * m.layers * m.kv_heads * m.head_dim * 2
    colocate_mode = s.vllm_mode == "colocate"
    # vLLM: one instance per TP group when colocated; model.generate: the local generation batch
    instances = v.where(colocate_mode, v.lmax(1, s.world_size // s.vllm_tp), 1)
    vllm_seqs = v.ceil(s.global_batch / instances)
    # what the instance may run at once, never more than it has nor fewer than one
    vllm_conc = v.lmax(1, v.lmin(v.where(colocate_mode, concurrency, s.vllm_max_num_seqs), vllm_seqs))
    local = v.lmax(1, s.per_device_batch * s.grad_accum)
    tp = v.where(s.use_vllm, s.vllm_tp, 1)
    seqs = v.where(s.use_vllm, vllm_seqs, local)
    conc = v.where(s.use_vllm, vllm_conc, local)
    slowdown = v.where(
        s.use_vllm,
        1.0,
        v.where(v.num(s.states_sharding) == 3, HF_GENERATE_SLOWDOWN * 1.2, HF_GENERATE_SLOWDOWN),
    )
    waves = v.ceil(seqs / conc)
    avg_ctx = s.max_prompt_length + s.max_completion_length / 2
    read = weight_bytes / tp + conc * avg_ctx * kv_per_token / tp
    mem_s = read / (gpu.hbm_bytes_s * HBM_EFFICIENCY)
    flop_s = 2 * m.params * conc / tp / (gpu.bf16_flops * DECODE_MFU)
    tp_s = v.where(tp > 1, 2 * m.layers * TP_ALLREDUCE_S, 0.0)
    decode_step = v.lmax(mem_s, flop_s) + tp_s + STEP_OVERHEAD_S / 10
    prefill = 2 * m.params * seqs * s.max_prompt_length / tp / (gpu.bf16_flops * PREFILL_MFU)
    return slowdown * (waves * s.max_completion_length * decode_step + prefill)


def _mfu(micro_tokens: object) -> Any:
    """Training MFU of a micro-batch (a power: computed per distinct size, as Python computes it)."""
    return v.per_value(
        lambda tokens: TRAIN_MFU_MAX * min(1.0, tokens / TRAIN_MFU_TOKENS) ** 0.3, micro_tokens
    )


def _train_s(s: Any, gpu: GpuSpec) -> Any:
    m = s.model
    n = v.lmax(1, s.world_size)
    micro_tokens = s.micro_batch_tokens
    tokens_gpu = s.global_batch * s.seq_len / n
    per_token = v.where(s.lora, 4.0, 6.0) * m.params
    per_token = per_token + v.where(s.gradient_checkpointing, 2.0 * m.params, 0.0)
    per_token = per_token + v.where(s.beta > 0, 2.0 * m.params, 0.0)  # reference forward
    compute = tokens_gpu * per_token / (gpu.bf16_flops * _mfu(micro_tokens))

    ring = (n - 1) / n
    full = 2 * m.params * ring / _link_bytes_s(gpu)
    trainable = v.where(s.lora, _lora_params_of(s), m.params)
    grads = 2 * trainable * ring / _link_bytes_s(gpu)
    shard = v.num(s.states_sharding)  # ZeRO stage of DeepSpeed or FSDP; 0: unsharded
    zero3 = shard == 3
    gathers = v.where(s.gradient_checkpointing, 3, 2)  # forward, (recompute), backward
    comm = v.where(
        zero3,
        s.grad_accum * (gathers * full + grads),
        v.where(
            shard == 2,
            s.grad_accum * grads + full,
            v.where(shard == 1, 2 * grads + full, 2 * grads),
        ),
    )
    comm = v.where(zero3, comm, comm * 0.5)  # bucketed reduction overlaps with the backward pass
    return compute + comm  # one process: the ring factor (n - 1) / n leaves nothing to communicate


def _lora_params_of(s: Any) -> Any:
    """:func:`lora_params` of the trial's rank (per distinct rank on columns)."""
    return v.per_value(lambda rank: lora_params(s.model, rank), s.lora_rank)


def _sync_s(s: Any, gpu: GpuSpec) -> Any:
    m = s.model
    weight_bytes = 2 * m.params
    t = 2 * weight_bytes / s.vllm_tp / (gpu.hbm_bytes_s * HBM_EFFICIENCY)  # load into vLLM
    # NCCL broadcast to the server
    t = t + v.where(s.vllm_mode == "server", weight_bytes / (gpu.pcie_bytes_s * LINK_EFFICIENCY), 0.0)
    n = v.lmax(1, s.world_size)
    batches = v.num(s.move_model_batches)
    gathered = (v.num(s.states_sharding) == 3) & (n > 1)
    t = t + v.where(gathered, weight_bytes * (n - 1) / n / _link_bytes_s(gpu), 0.0)
    t = t + v.where(gathered & (batches > 0), (batches + 1) * SYNC_BATCH_OVERHEAD_S, 0.0)
    return v.where(s.use_vllm, t, 0.0)


def _offload_s(s: Any, gpu: GpuSpec) -> Any:
    m = s.model
    n = v.lmax(1, s.world_size)
    pcie = gpu.pcie_bytes_s * LINK_EFFICIENCY
    trainable = v.where(s.lora, _lora_params_of(s), m.params)
    t = 0.0
    # gradients down (fp32 on the CPU side, sent as bf16), updated bf16 weights up, CPU Adam
    t = t + v.where(
        s.ds_offload_optimizer, 2 * (2 * trainable / n) / pcie + trainable / CPU_ADAM_PARAMS_S, 0.0
    )
    passes = v.where(s.gradient_checkpointing, 3, 2)
    t = t + v.where(s.ds_offload_param, s.grad_accum * passes * 2 * m.params / n / pcie, 0.0)
    held = v.where(s.zero_stage == 3, 2 * m.params / n, 2 * m.params)
    # (the rollout offloads and sleep levels are the shape's: set only when vLLM is colocated)
    t = t + v.where(s.rollout_offload_model, 2 * held / pcie, 0.0)
    opt_bytes = 12 * trainable / v.where(v.num(s.states_sharding) >= 1, n, 1)
    t = t + v.where(s.rollout_offload_optimizer & v.neg(s.ds_offload_optimizer), 2 * opt_bytes / pcie, 0.0)
    # weights to the host and back
    return t + v.where(s.sleep_level == 1, 2 * (2 * m.params / s.vllm_tp) / pcie, 0.0)


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
    rollout, train, sync, offload, total, throughput = step_time_terms(shape, gpu, mem.rollout_concurrency)
    return TimeEstimate(
        rollout_s=float(rollout),
        train_s=float(train),
        sync_s=float(sync),
        offload_s=float(offload),
        total_s=float(total),
        throughput=float(throughput),
    )


def step_time_terms(s: Any, gpu: GpuSpec, concurrency: Any) -> tuple[Any, Any, Any, Any, Any, Any]:
    """Rollout, training, sync and offload seconds, their total and the throughput, of ``s`` (one
    JobShape, or ShapeColumns) with ``concurrency`` rollouts in flight per colocated vLLM instance."""
    rollout = _rollout_s(s, gpu, concurrency)
    train = _train_s(s, gpu)
    sync = _sync_s(s, gpu)
    offload = _offload_s(s, gpu)
    total = rollout + train + sync + offload
    throughput = v.where(total > 0, s.global_batch / v.where(total > 0, total, 1.0), 0.0)
    return rollout, train, sync, offload, total, throughput
