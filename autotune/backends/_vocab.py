"""The argument vocabulary ms-swift and TRL share: both extend transformers' ``TrainingArguments``."""

from __future__ import annotations

__all__ = ["SHARED_ARGS"]

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
