"""What TRL's knobs and ``GRPOConfig`` arguments mean (trl 1.16 ``GRPOConfig`` / ``TrainingArguments``).

``zero_stage`` 0 is DeepSpeed off, 1–3 the stage (through a ``ds_config.json``); ``offload_optimizer`` /
``offload_param`` are DeepSpeed CPU offload; ``vllm_enable_sleep_mode`` is vLLM sleep level 2 (TRL 1.x
calls ``llm.sleep(level=2)``); ``use_peft`` + ``lora_r`` is LoRA. The command backend reads its knobs
in this vocabulary too (Hugging Face ``TrainingArguments`` names).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.backends._vocab import batch_shape
from autotune.jobconfig import JobConfig
from autotune.values import as_bool, as_int, pick, required_float, required_int

__all__ = ["KNOB_FIELDS", "TRL_FACTS", "describe_trl"]

#: TRL's defaults for what is not a knob of its space (trl 1.16 sources).
TRL_FACTS: dict[str, Any] = {
    "beta": 0.0,
    "vllm_mode": "colocate",
    "max_num_batched_tokens": 4096,  # trl/generation/vllm_generation.py passes 4096
    "ds_bucket_elements": int(5e8),  # DeepSpeed's default reduce / all-gather bucket
    "lora_r": 16,
}


#: JobConfig field → TRL's knob or argument names that set it (the first is the knob's name).
KNOB_FIELDS: dict[str, tuple[str, ...]] = {
    "per_device_batch": ("per_device_train_batch_size",),
    "gradient_checkpointing": ("gradient_checkpointing", "activation_checkpointing"),
    "dataloader_num_workers": ("dataloader_num_workers",),
    "deepspeed": ("zero_stage",),
    "zero_stage": ("zero_stage",),
    "ds_offload_optimizer": ("offload_optimizer",),
    "ds_offload_param": ("offload_param",),
    "lora_rank": ("lora_r", "lora_rank"),
    "beta": ("beta",),
    "use_vllm": ("use_vllm",),
    "vllm_mode": ("vllm_mode",),
    "vllm_util": ("vllm_gpu_memory_utilization",),
    "vllm_tp": ("vllm_tensor_parallel_size",),
    "sleep_level": ("vllm_enable_sleep_mode",),
    "vllm_max_model_len": ("vllm_max_model_length", "vllm_max_model_len"),
    "world_size": ("num_processes",),
}


def describe_trl(
    params: Mapping[str, Any],
    derived: Mapping[str, Any],
    fixed: Mapping[str, Any],
    n_gpus: int,
    defaults: Mapping[str, Any],
) -> JobConfig:
    """TRL's knobs (over the study's fixed arguments) as a :class:`JobConfig`.

    Args:
        params: the trial's knobs.
        derived: ``world_size`` / ``gradient_accumulation_steps`` when derived.
        fixed: the study's fixed arguments and job facts (``global_batch``, ``num_generations``, ...).
        n_gpus: GPUs of the trial (0 on a CPU-only study).
        defaults: the knobs' defaults (the TRL space's).
    """
    p: dict[str, Any] = {**defaults, **fixed, **params}
    given = {**fixed, **params}
    origin: dict[str, tuple[str, Any]] = {}

    def note(field: str, *names: str) -> None:
        for name in names:
            if name in given:
                origin[field] = (name, given[name])
                return

    shape: dict[str, Any] = batch_shape(p, derived, n_gpus, int(defaults["per_device_train_batch_size"]))
    stage = required_int(p, "zero_stage", 0)
    deepspeed = stage > 0
    use_peft = as_bool(p.get("use_peft"))
    use_vllm = as_bool(p.get("use_vllm"))
    mode = str(pick(p, "vllm_mode", default=TRL_FACTS["vllm_mode"]))
    tp = required_int(p, "vllm_tensor_parallel_size", 1) if use_vllm else 1
    sleep = 2 if use_vllm and mode != "server" and as_bool(p.get("vllm_enable_sleep_mode")) else 0
    steps_per_generation = as_int(p.get("steps_per_generation")) or shape["grad_accum"]
    lora_rank = int(pick(p, "lora_r", "lora_rank", default=TRL_FACTS["lora_r"])) if use_peft else 0
    for field, names in KNOB_FIELDS.items():
        note(field, *names)
    return JobConfig(
        **shape,
        gradient_checkpointing=as_bool(
            pick(p, "gradient_checkpointing", "activation_checkpointing"), default=True
        ),
        dataloader_num_workers=required_int(p, "dataloader_num_workers", defaults["dataloader_num_workers"]),
        deepspeed=deepspeed,
        zero_stage=stage,
        ds_offload_optimizer=deepspeed and stage >= 2 and as_bool(p.get("offload_optimizer")),
        ds_offload_param=deepspeed and stage == 3 and as_bool(p.get("offload_param")),
        lora_rank=max(0, lora_rank),
        beta=required_float(p, "beta", TRL_FACTS["beta"]),
        use_vllm=use_vllm,
        vllm_mode=mode if use_vllm else None,
        vllm_util=required_float(p, "vllm_gpu_memory_utilization", defaults["vllm_gpu_memory_utilization"]),
        vllm_tp=max(1, tp),
        sleep_level=sleep,
        vllm_max_model_len=as_int(pick(p, "vllm_max_model_length", "vllm_max_model_len")),
        vllm_max_num_seqs=max(
            1,
            as_int(p.get("vllm_max_num_seqs"))
            or shape["per_device_batch"] * max(1, tp) * steps_per_generation,
        ),
        vllm_max_num_batched_tokens=as_int(p.get("vllm_max_num_batched_tokens"))
        or TRL_FACTS["max_num_batched_tokens"],
        # TRL gathers one parameter at a time into vLLM for full fine-tuning, the whole (merged)
        # model for PEFT; it starts vLLM before the reference model moves to the GPU and before
        # DeepSpeed (ZeRO-1/2) places the policy.
        weight_sync="model" if lora_rank > 0 else "parameter",
        loads_before_vllm=False,
        ds_bucket_elements=TRL_FACTS["ds_bucket_elements"],
        origin=origin,
    )
