"""The argument vocabulary ms-swift and TRL share (both extend transformers' ``TrainingArguments``), and
how one's names read in the other's: what the frameworks' exports translate between, kept here so that
no backend imports another's modules."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.values import as_int, pick, required_int

__all__ = ["LIST_ARGS", "SHARED_ARGS", "SWIFT_KNOBS", "TRL_NAMES", "batch_shape", "list_value"]

#: arguments that mean the same in ms-swift's RLHFArguments and TRL's GRPOConfig (checked against both
#: installed frameworks by tests/backends/test_vocab.py).
SHARED_ARGS: frozenset[str] = frozenset(
    {
        "learning_rate",
        "num_train_epochs",
        "max_steps",
        "lr_scheduler_type",
        "warmup_steps",
        "weight_decay",
        "max_grad_norm",
        "adam_beta1",
        "adam_beta2",
        "adam_epsilon",
        "optim",
        "bf16",
        "fp16",
        "logging_steps",
        "save_strategy",
        "save_steps",
        "save_total_limit",
        "output_dir",
        "report_to",
        "seed",
        "beta",
        "temperature",
        "top_p",
        "top_k",
        "repetition_penalty",
        "epsilon",
        "epsilon_high",
        "num_iterations",
        "loss_type",
        "scale_rewards",
        "steps_per_generation",
        "generation_batch_size",
        "vllm_server_host",
        "vllm_server_port",
        "vllm_server_timeout",
        "log_completions",
    }
)

#: ms-swift name → TRL name, for arguments that mean the same under another name.
TRL_NAMES: dict[str, str] = {
    "vllm_max_model_len": "vllm_max_model_length",
    "lora_rank": "lora_r",
    "lora_alpha": "lora_alpha",
    "lora_dropout": "lora_dropout",
    "target_modules": "lora_target_modules",
    "torch_dtype": "dtype",
    "attn_impl": "attn_implementation",
}

#: flags ms-swift takes as ``--flag a b c`` and TRL/YAML as a list.
LIST_ARGS = frozenset(
    {"report_to", "target_modules", "lora_target_modules", "reward_funcs", "external_plugins"}
)

#: ms-swift's knob flags, in the order of search_spaces/swift.yaml; ``num_processes`` is not an ms-swift flag.
SWIFT_KNOBS: tuple[str, ...] = (
    "per_device_train_batch_size",
    "gradient_checkpointing",
    "dataloader_num_workers",
    "num_processes",
    "deepspeed",
    "use_vllm",
    "vllm_mode",
    "vllm_gpu_memory_utilization",
    "vllm_tensor_parallel_size",
    "vllm_max_num_seqs",
    "vllm_enforce_eager",
    "sleep_level",
    "offload_optimizer",
    "offload_model",
    "move_model_batches",
)


def list_value(name: str, value: object) -> Any:
    """Flags that are lists in one framework and may be a single text in the other."""
    if name in LIST_ARGS and isinstance(value, str):
        return value.split() if " " in value.strip() else [value]
    return value


def batch_shape(
    params: Mapping[str, Any], derived: Mapping[str, Any], n_gpus: int, default_pdbs: int
) -> dict[str, int]:
    """The batch facts every GRPO framework shares: world size, global batch, micro-batch, accumulation.

    Args:
        params: the trial's knobs over the study's fixed arguments (``global_batch``,
            ``num_generations``, ``max_prompt_length``, ``max_completion_length`` among them).
        derived: ``world_size`` and ``gradient_accumulation_steps`` when the backend derived them.
        n_gpus: GPUs of the trial; 0 on a CPU-only study (then ``num_processes`` is the world size).
        default_pdbs: the framework's default ``per_device_train_batch_size``.
    """
    if derived.get("world_size"):
        world = int(derived["world_size"])
    elif n_gpus > 0:
        world = n_gpus
    else:
        world = int(pick(params, "num_processes", "world_size", default=1))
    global_batch = int(pick(params, "global_batch", "generation_batch_size", default=64))
    pdbs = required_int(params, "per_device_train_batch_size", default_pdbs)
    ga = as_int(derived.get("gradient_accumulation_steps")) or as_int(
        params.get("gradient_accumulation_steps")
    )
    return {
        "world_size": world,
        "global_batch": global_batch,
        "num_generations": int(pick(params, "num_generations", default=8)),
        "per_device_batch": pdbs,
        "grad_accum": ga if ga and ga > 0 else max(1, global_batch // max(1, pdbs * world)),
        "max_prompt_length": int(pick(params, "max_prompt_length", default=512)),
        "max_completion_length": int(pick(params, "max_completion_length", default=1024)),
    }
