"""What ms-swift's knobs and flags mean (ms-swift 4.6 ``RLHFArguments``; 3.x where it differs).

- ``deepspeed`` presets (ms-swift's ``swift/config/*.json``): ``zero0`` stage 0, ``zero1`` stage 1,
  ``zero2`` stage 2, ``zero2_offload`` stage 2 + optimizer states on the CPU, ``zero3`` stage 3,
  ``zero3_offload`` stage 3 + optimizer states and parameters on the CPU. Any other value is the path
  of a DeepSpeed JSON of the user's own.
- ``offload_optimizer`` / ``offload_model`` move optimizer states / weights to the CPU *while vLLM
  generates* (colocate mode); they are not DeepSpeed offload.
- ``sleep_level`` 1: vLLM's KV cache freed and weights moved to the CPU between rollouts; 2: both freed.
  Forced to 0 in server mode and without vLLM.
- ``move_model_batches``: ZeRO-3 weights gathered for the vLLM sync in N batches.
- ``tuner_type`` (3.x ``train_type``) ``lora`` + ``lora_rank``: LoRA. ``vllm_mode`` has no default:
  ms-swift raises when ``use_vllm`` is set without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.backends._vocab import batch_shape
from autotune.errors import UsageError
from autotune.jobconfig import JobConfig, WeightSync
from autotune.values import (
    as_bool,
    as_int,
    none_like,
    pick,
    required_float,
    required_int,
)

__all__ = [
    "PRESETS",
    "SWIFT_FACTS",
    "canonical_args",
    "describe_swift",
    "preset_for",
]

#: ``--deepspeed`` preset → (ZeRO stage, optimizer offload, parameter offload).
PRESETS: dict[str, tuple[int, bool, bool]] = {
    "zero0": (0, False, False),
    "zero1": (1, False, False),
    "zero2": (2, False, False),
    "zero2_offload": (2, True, False),
    "zero3": (3, False, False),
    "zero3_offload": (3, True, True),
}

#: ms-swift's defaults for what is not a knob of its space (ms-swift 4.6 sources).
SWIFT_FACTS: dict[str, Any] = {
    "beta": 0.04,
    "lora_rank": 8,
    "ds_bucket_elements": int(2e8),  # reduce_bucket_size / allgather_bucket_size of swift/config/zero*.json
}


#: JobConfig field → the ms-swift flag that sets it.
KNOB_FIELDS: dict[str, tuple[str, ...]] = {
    "per_device_batch": ("per_device_train_batch_size",),
    "gradient_checkpointing": ("gradient_checkpointing",),
    "dataloader_num_workers": ("dataloader_num_workers",),
    "deepspeed": ("deepspeed",),
    "zero_stage": ("deepspeed",),
    "ds_offload_optimizer": ("deepspeed",),
    "ds_offload_param": ("deepspeed",),
    "ds_config_path": ("deepspeed",),
    "lora_rank": ("lora_rank",),
    "beta": ("beta",),
    "use_vllm": ("use_vllm",),
    "vllm_mode": ("vllm_mode",),
    "vllm_util": ("vllm_gpu_memory_utilization",),
    "vllm_tp": ("vllm_tensor_parallel_size",),
    "sleep_level": ("sleep_level",),
    "rollout_offload_optimizer": ("offload_optimizer",),
    "rollout_offload_model": ("offload_model",),
    "move_model_batches": ("move_model_batches",),
    "vllm_max_model_len": ("vllm_max_model_len",),
    "vllm_max_num_seqs": ("vllm_max_num_seqs",),
    "world_size": ("num_processes",),
}


def canonical_args(args: Mapping[str, object]) -> dict[str, Any]:
    """ms-swift flags with one spelling of each: 3.x's ``train_type`` is 4.x's ``tuner_type``."""
    return {("tuner_type" if k == "train_type" else k): v for k, v in args.items()}


def preset_for(stage: int, offload_optimizer: bool, offload_param: bool) -> str | None:
    """The preset with this ZeRO stage and offload, or None when ms-swift has no such preset."""
    for name, spec in PRESETS.items():
        if spec == (stage, offload_optimizer, offload_param):
            return name
    return None


def describe_swift(
    params: Mapping[str, Any],
    derived: Mapping[str, Any],
    fixed: Mapping[str, Any],
    n_gpus: int,
    defaults: Mapping[str, Any],
) -> JobConfig:
    """ms-swift's knobs (over the study's fixed flags) as a :class:`JobConfig`.

    Args:
        params: the trial's knobs.
        derived: ``world_size`` / ``gradient_accumulation_steps`` when derived.
        fixed: the study's fixed flags and job facts (``global_batch``, ``num_generations``, ...).
        n_gpus: GPUs of the trial (0 on a CPU-only study).
        defaults: the knobs' defaults (the ms-swift space's).
    """
    given = canonical_args({**fixed, **params})
    p: dict[str, Any] = {**defaults, **given}
    origin: dict[str, tuple[str, Any]] = {}
    for field, (name,) in KNOB_FIELDS.items():
        if name in given:
            origin[field] = (name, given[name])

    shape: dict[str, Any] = batch_shape(p, derived, n_gpus, int(defaults["per_device_train_batch_size"]))
    preset = p.get("deepspeed")
    custom: str | None = None
    if none_like(preset):
        deepspeed, (stage, off_opt, off_param) = False, (0, False, False)
    elif str(preset) in PRESETS:
        deepspeed, (stage, off_opt, off_param) = True, PRESETS[str(preset)]
    elif str(preset).endswith(".json") or "/" in str(preset):  # a DeepSpeed config file of the user's
        deepspeed, custom, (stage, off_opt, off_param) = True, str(preset), (0, False, False)
    else:
        raise UsageError(
            f"deepspeed {preset!r} is not an ms-swift preset",
            hint=f"Use one of {', '.join(PRESETS)} (or none), or the path of a DeepSpeed JSON",
        )
    use_vllm = as_bool(p.get("use_vllm"))
    mode = given.get("vllm_mode") if use_vllm else None  # no default: ms-swift raises without one
    colocate = use_vllm and mode != "server"
    tp = required_int(p, "vllm_tensor_parallel_size", 1) if use_vllm else 1
    tuner = str(pick(p, "tuner_type", default="full")).lower()
    lora_rank = (
        required_int(p, "lora_rank", SWIFT_FACTS["lora_rank"])
        if tuner in ("lora", "longlora", "qlora")
        else 0
    )
    move_batches = as_int(p.get("move_model_batches")) if use_vllm else None
    steps_per_generation = as_int(p.get("steps_per_generation")) or shape["grad_accum"]
    sync: WeightSync
    if not colocate:
        sync = "model"
    elif stage == 3 and move_batches is not None:
        sync = "batches"
    else:
        sync = "model"  # ms-swift gathers the whole model for the sync
    return JobConfig(
        **shape,
        gradient_checkpointing=as_bool(p.get("gradient_checkpointing"), default=True),
        dataloader_num_workers=required_int(p, "dataloader_num_workers", defaults["dataloader_num_workers"]),
        deepspeed=deepspeed,
        zero_stage=stage,
        ds_offload_optimizer=off_opt,
        ds_offload_param=off_param,
        ds_config_path=custom,
        lora_rank=lora_rank,
        beta=required_float(p, "beta", SWIFT_FACTS["beta"]),
        use_vllm=use_vllm,
        vllm_mode=str(mode) if mode is not None else None,
        vllm_util=required_float(p, "vllm_gpu_memory_utilization", defaults["vllm_gpu_memory_utilization"]),
        vllm_tp=max(1, tp),
        sleep_level=required_int(p, "sleep_level", 0) if colocate else 0,
        rollout_offload_model=colocate and as_bool(p.get("offload_model")),
        rollout_offload_optimizer=colocate and as_bool(p.get("offload_optimizer")),
        move_model_batches=move_batches,
        vllm_max_model_len=as_int(p.get("vllm_max_model_len")),
        vllm_max_num_seqs=max(
            1,
            as_int(p.get("vllm_max_num_seqs"))
            or shape["per_device_batch"] * max(1, tp) * steps_per_generation,
        ),
        vllm_max_num_batched_tokens=as_int(p.get("vllm_max_num_batched_tokens")),
        weight_sync=sync,
        # ms-swift loads policy and reference onto the GPU before it starts vLLM (and offloads the
        # policy first under offload_model).
        loads_before_vllm=True,
        ds_bucket_elements=SWIFT_FACTS["ds_bucket_elements"],
        origin=origin,
    )
