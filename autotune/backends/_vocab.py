"""The argument vocabulary ms-swift and TRL share (both extend transformers' ``TrainingArguments``), and
how one's names read in the other's: what the frameworks' exports translate between, kept here so that
no backend imports another's modules."""

from __future__ import annotations

from typing import Any

__all__ = ["LIST_ARGS", "SHARED_ARGS", "SWIFT_KNOBS", "TRL_NAMES", "list_value"]

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


def list_value(name: str, value: Any) -> Any:
    """Flags that are lists in one framework and may be a single text in the other."""
    if name in LIST_ARGS and isinstance(value, str):
        return value.split() if " " in value.strip() else [value]
    return value
