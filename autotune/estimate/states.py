"""The policy's model states per GPU (weights, gradients, optimizer states) and the host memory they
need, as DeepSpeed's own estimators count them (``estimate_zero2_model_states_mem_needs`` and
``estimate_zero3_model_states_mem_needs``); LoRA's adapter on a frozen base. :mod:`autotune.estimate.memory`
adds them to the rest of a trial's memory."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.estimate.catalog import ModelSpec

__all__ = ["DS_BUFFER_FACTOR", "ModelStates", "lora_params", "model_states"]

DS_BUFFER_FACTOR = 1.5  # DeepSpeed's additional_buffer_factor for host memory


@dataclass(frozen=True)
class ModelStates:
    """Policy model states per GPU, and host memory they need (whole node)."""

    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    host_bytes: int

    @property
    def gpu_bytes(self) -> int:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes


def lora_params(model: ModelSpec, rank: int) -> int:
    """Trainable LoRA parameters on every linear layer of the decoder (``target_modules all-linear``)."""
    if rank <= 0:
        return 0
    h, q, kv, i = (
        model.hidden,
        model.heads * model.head_dim,
        model.kv_heads * model.head_dim,
        model.intermediate,
    )
    per_layer = rank * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h))
    return model.layers * per_layer


def model_states(
    *,
    params: int,
    largest_layer_params: int,
    n_gpus: int,
    zero_stage: int,
    deepspeed: bool,
    offload_optimizer: bool,
    offload_param: bool,
    trainable_params: int | None = None,
) -> ModelStates:
    """Policy weights, gradients and optimizer states per GPU (mixed-precision Adam).

    Full fine-tuning under DeepSpeed matches DeepSpeed's estimators exactly: ZeRO-2 ``2P + 18P/N``
    (optimizer offload: ``2P``); ZeRO-3 ``4·largest_layer + 18P/N`` (optimizer offload:
    ``4·largest_layer + 2P/N``; parameter offload too: ``4·largest_layer``). ZeRO-0 is ZeRO-2 on one
    GPU; ZeRO-1 partitions only the fp32 work. Without DeepSpeed the torch optimizer runs on the bf16
    weights: 2 + 2 + 4 bytes per parameter. With LoRA (``trainable_params`` given) the base is frozen
    bf16 (partitioned under ZeRO-3) and only the adapter carries gradients and optimizer states.

    Args:
        params: total parameters P.
        largest_layer_params: the largest single module (ZeRO-3 working set).
        n_gpus: GPUs the states are partitioned over (N).
        zero_stage: 0–3.
        deepspeed: False for plain DDP with a torch optimizer.
        offload_optimizer: DeepSpeed ``offload_optimizer.device = cpu``.
        offload_param: DeepSpeed ``offload_param.device = cpu`` (ZeRO-3 only).
        trainable_params: adapter parameters for LoRA; None for full fine-tuning.
    """
    p, n, ll = params, max(1, n_gpus), largest_layer_params
    stage = zero_stage if deepspeed else 0
    offload_param = offload_param and stage == 3
    offload_optimizer = offload_optimizer and stage >= 2
    if trainable_params is not None:
        return _lora_states(p, n, ll, stage, deepspeed, offload_optimizer, offload_param, trainable_params)
    if not deepspeed:
        return ModelStates(2 * p, 2 * p, 4 * p, 0)
    if stage == 3:
        if offload_optimizer and offload_param:
            host = p * 18 * DS_BUFFER_FACTOR
            return ModelStates(4 * ll, 0, 0, int(host))
        if offload_optimizer:
            return ModelStates(4 * ll + int(2 * p / n), 0, 0, int(p * 16 * DS_BUFFER_FACTOR))
        weights = 4 * ll if offload_param else 4 * ll + int(2 * p / n)
        grads = int(18 * p / n) - int(2 * p / n) - int(12 * p / n)
        host = int(p * 2 * DS_BUFFER_FACTOR) if offload_param else 0
        return ModelStates(weights, grads, int(12 * p / n), host)
    if offload_optimizer:  # ZeRO-2 offload
        return ModelStates(2 * p, 0, 0, int(p * max(4 * n, 16) * DS_BUFFER_FACTOR))
    if stage == 2:
        return ModelStates(2 * p, int(18 * p / n) - int(12 * p / n), int(12 * p / n), 0)
    if stage == 1:
        return ModelStates(2 * p, 2 * p + int(4 * p / n), int(12 * p / n), 0)
    return ModelStates(2 * p, 6 * p, 12 * p, 0)  # ZeRO-0: DeepSpeed's bf16 optimizer, unpartitioned


def _lora_states(
    p: int, n: int, ll: int, stage: int, deepspeed: bool, off_opt: bool, off_param: bool, a: int
) -> ModelStates:
    # Frozen base in bf16; adapter in fp32 (PEFT upcasts) with fp32 grads and Adam moments: 16 B each.
    if stage == 3:
        base = 4 * ll + (0 if off_param else int(2 * p / n))
        host = int(2 * p) if off_param else 0
    else:
        base, host = 2 * p, 0
    shard = n if deepspeed and stage >= 1 else 1
    weights = base + 4 * a
    grads = 4 * a if not (deepspeed and stage >= 2) else int(4 * a / n)
    opt = 0 if off_opt else int(8 * a / shard)
    if off_opt:
        host += int(12 * a * DS_BUFFER_FACTOR)
    return ModelStates(weights, grads, opt, host)
