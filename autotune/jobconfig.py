"""What one configuration of a GRPO job means, in one framework-neutral vocabulary.

Frameworks name the same things differently (TRL's ``zero_stage: 3`` + ``offload_param`` is ms-swift's
``deepspeed: zero3_offload``; TRL's ``vllm_enable_sleep_mode`` is ms-swift's ``sleep_level 2``). Each
backend is the only place that knows its own names and defaults: its
:meth:`~autotune.backends.Backend.describe` decodes a trial's knobs and the study's fixed arguments into
one :class:`JobConfig`. The estimator, ``plan``, the search's inference, the diagnosis rules, the live
view and every exporter read that, never a framework's knob names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["OFFLOAD_FIELDS", "JobConfig", "WeightSync", "knob_text"]

#: How weights reach a colocated vLLM at the sync: one parameter at a time, the whole model at once,
#: or in ``move_model_batches`` batches of layers.
WeightSync = Literal["parameter", "model", "batches"]


#: the fields whose knobs keep model or optimizer state in host memory.
OFFLOAD_FIELDS: tuple[str, ...] = (
    "ds_offload_optimizer",
    "ds_offload_param",
    "rollout_offload_optimizer",
    "rollout_offload_model",
)


def knob_text(name: str, value: object) -> str:
    """``name=value`` as a user would write it (``true``/``false`` for booleans, floats short)."""
    if isinstance(value, bool):
        return f"{name}={'true' if value else 'false'}"
    if isinstance(value, float):
        return f"{name}={value:.10g}"
    return f"{name}={value}"


@dataclass(frozen=True)
class JobConfig:
    """One trial's configuration as the estimator, the search and the exporters understand it.

    Batch shape (fixed for a study, derived per trial):
        world_size: training processes (GPUs, or processes on a CPU-only study).
        global_batch: completions per optimizer step.
        num_generations: completions per prompt (G).
        per_device_batch: completions per forward/backward micro-batch on one process.
        grad_accum: micro-batches per optimizer step (keeps the global batch).
        max_prompt_length, max_completion_length: tokens per sample (upper bounds).

    Training:
        gradient_checkpointing: activations recomputed in the backward pass.
        dataloader_num_workers: data-loading worker processes per rank.
        deepspeed: DeepSpeed is in use (False: plain DDP with a torch optimizer).
        zero_stage: ZeRO stage 0–3 (0 without DeepSpeed).
        ds_offload_optimizer: DeepSpeed keeps optimizer states on the CPU.
        ds_offload_param: DeepSpeed ZeRO-3 keeps parameters on the CPU.
        ds_config_path: a DeepSpeed JSON of the user's own (then stage and offload are unknown).
        fsdp: FSDP shards the policy instead of DeepSpeed (``zero_stage`` 3: FULL_SHARD, 2:
            SHARD_GRAD_OP); ``deepspeed`` stays False. The estimator uses the ZeRO terms of that stage.
        micro_batch_tokens: tokens of one forward/backward micro-batch on one process when micro-batches
            are packed by a token budget (dynamic batch size); None: ``per_device_batch`` sequences.
        lora_rank: LoRA rank; 0 for full fine-tuning.
        beta: KL coefficient; a reference model exists only when > 0.
        reference_offload: the reference model's parameters live in host memory and reach the GPU one
            shard unit at a time (a forward-only model under FSDP CPU offload).

    Rollout:
        use_vllm: rollouts by vLLM (else by ``model.generate`` in the trainer).
        vllm_mode: ``colocate`` or ``server``; None when the framework requires it and none was given.
        vllm_util: share of each GPU's total memory vLLM reserves.
        vllm_tp: GPUs one vLLM engine spans.
        sleep_level: 0 awake, 1 weights to CPU + KV cache freed between rollouts, 2 both freed.
        rollout_offload_model / rollout_offload_optimizer: weights / optimizer states moved to the
            CPU while vLLM generates (ms-swift's ``offload_model`` / ``offload_optimizer``).
        move_model_batches: ZeRO-3 weights gathered for the sync in this many batches.
        vllm_max_model_len: the longest sequence vLLM must hold (None: the model's maximum).
        vllm_max_num_seqs: sequences one vLLM engine decodes at once at most.
        vllm_max_num_batched_tokens: tokens per vLLM forward (None: vLLM's own default).
        vllm_chunked_prefill: vLLM splits long prefills; False: one forward holds a whole
            ``vllm_max_model_len`` prompt, so its token budget is at least that.

    How the framework's code behaves (facts of its source, not knobs):
        weight_sync: how weights reach a colocated vLLM (see :data:`WeightSync`).
        loads_before_vllm: the trainer puts policy and reference on the GPU before vLLM starts (so
            vLLM's start-up check sees them).
        ds_bucket_elements: DeepSpeed's reduce / all-gather bucket size in the framework's configs.

    Attributes:
        origin: field name → (the framework's knob or argument name, its value) for every field a
            knob or fixed argument set, so a message can name what the user wrote.
    """

    world_size: int
    global_batch: int
    num_generations: int
    per_device_batch: int
    grad_accum: int
    max_prompt_length: int = 512
    max_completion_length: int = 1024
    gradient_checkpointing: bool = True
    dataloader_num_workers: int = 0
    deepspeed: bool = False
    zero_stage: int = 0
    ds_offload_optimizer: bool = False
    ds_offload_param: bool = False
    ds_config_path: str | None = None
    fsdp: bool = False
    micro_batch_tokens: int | None = None
    lora_rank: int = 0
    beta: float = 0.0
    reference_offload: bool = False
    use_vllm: bool = False
    vllm_mode: str | None = "colocate"
    vllm_util: float = 0.9
    vllm_tp: int = 1
    sleep_level: int = 0
    rollout_offload_model: bool = False
    rollout_offload_optimizer: bool = False
    move_model_batches: int | None = None
    vllm_max_model_len: int | None = None
    vllm_max_num_seqs: int = 1
    vllm_max_num_batched_tokens: int | None = None
    vllm_chunked_prefill: bool = True
    weight_sync: WeightSync = "model"
    loads_before_vllm: bool = False
    ds_bucket_elements: int = 500_000_000
    origin: Mapping[str, tuple[str, Any]] = field(default_factory=dict, compare=False)

    @property
    def lora(self) -> bool:
        return self.lora_rank > 0

    @property
    def sharding_stage(self) -> int | None:
        """The ZeRO stage when DeepSpeed shards anything (1–3); None without DeepSpeed or at stage 0."""
        return self.zero_stage if self.deepspeed and self.zero_stage > 0 else None

    @property
    def states_sharding(self) -> int | None:
        """The ZeRO stage whose sharding the policy's states get, from DeepSpeed or FSDP (1–3); None
        when every process holds them whole. What the estimator reads; exporters of DeepSpeed
        configs read :attr:`sharding_stage`."""
        return self.zero_stage if (self.deepspeed or self.fsdp) and self.zero_stage > 0 else None

    @property
    def colocate(self) -> bool:
        """vLLM shares the training GPUs."""
        return self.use_vllm and self.vllm_mode != "server"

    def setting(self, name: str) -> str | None:
        """The knob or argument behind field ``name`` as the user wrote it (``"deepspeed=zero2"``), if any."""
        source = self.origin.get(name)
        return knob_text(*source) if source is not None else None

    def named(self, name: str) -> str:
        """How the study named the setting behind field ``name``: ``"knob deepspeed=zero2"``."""
        return f"knob {self.setting(name) or name}"

    def knob(self, name: str) -> str | None:
        """The framework's name of the knob or argument behind field ``name``, when one set it."""
        source = self.origin.get(name)
        return source[0] if source is not None else None
