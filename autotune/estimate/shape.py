"""One trial as the estimator sees it: what its configuration means, the model, and its GPUs.

The configuration comes from the backend's decoder (:meth:`autotune.backends.Backend.describe`), the
one place that knows a framework's knob names and defaults; this module only adds what depends on the
model and the GPUs (vLLM runs only on GPUs; its longest sequence defaults to the model's maximum).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.errors import UsageError
from autotune.estimate.catalog import ModelSpec
from autotune.jobconfig import JobConfig

__all__ = ["JobShape"]


@dataclass(frozen=True)
class JobShape:
    """A :class:`~autotune.jobconfig.JobConfig` on a model and a number of GPUs.

    Every field of the configuration reads through (``shape.zero_stage``); the properties below are
    the ones the model or the GPUs change.

    Attributes:
        config: what the trial's knobs mean.
        model: architecture facts.
        n_gpus: GPUs the trial runs on; 0 for a CPU-only trial.

    Raises:
        UsageError: the configuration names a DeepSpeed JSON of the user's own, whose stage and
            offload the estimator cannot know.
    """

    config: JobConfig
    model: ModelSpec
    n_gpus: int

    def __post_init__(self) -> None:
        if self.config.ds_config_path is not None:
            raise UsageError(
                f"{self.config.named('ds_config_path')} is a DeepSpeed config of its own: its ZeRO stage and "
                "offload cannot be estimated",
                hint="Tune one of the framework's DeepSpeed presets instead",
            )

    def __getattr__(self, name: str) -> Any:
        # Only reached for names that are not fields or properties of the shape itself.
        return getattr(self.config, name)

    @property
    def on_gpu(self) -> bool:
        return self.n_gpus > 0

    @property
    def use_vllm(self) -> bool:
        """vLLM generates (it needs GPUs: a CPU-only trial generates in the trainer)."""
        return self.config.use_vllm and self.on_gpu

    @property
    def vllm_mode(self) -> str:
        return self.config.vllm_mode or "colocate"

    @property
    def colocate(self) -> bool:
        """vLLM shares the training GPUs."""
        return self.use_vllm and self.vllm_mode == "colocate"

    @property
    def vllm_tp(self) -> int:
        return self.config.vllm_tp if self.use_vllm else 1

    @property
    def sleep_level(self) -> int:
        return self.config.sleep_level if self.colocate else 0

    @property
    def rollout_offload_model(self) -> bool:
        return self.config.rollout_offload_model and self.colocate

    @property
    def rollout_offload_optimizer(self) -> bool:
        return self.config.rollout_offload_optimizer and self.colocate

    @property
    def move_model_batches(self) -> int | None:
        return self.config.move_model_batches if self.config.zero_stage == 3 else None

    @property
    def vllm_max_model_len(self) -> int:
        return self.config.vllm_max_model_len or self.model.max_position

    @property
    def lora(self) -> bool:
        return self.config.lora_rank > 0

    @property
    def seq_len(self) -> int:
        """Prompt plus completion tokens of one sample."""
        return self.config.max_prompt_length + self.config.max_completion_length

    @property
    def micro_batch_tokens(self) -> int:
        """Tokens of one forward/backward micro-batch on one GPU: the token budget of a packed
        (dynamic-size) micro-batch, else ``per_device_batch`` whole sequences."""
        packed = self.config.micro_batch_tokens
        return packed if packed else self.config.per_device_batch * self.seq_len

    @property
    def has_reference(self) -> bool:
        """A separate reference model is held (beta > 0 and full fine-tuning; LoRA's base serves)."""
        return self.config.beta > 0 and not self.lora
