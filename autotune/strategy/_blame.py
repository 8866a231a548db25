"""Which knobs a failure can blame, from where it happened.

A GRPO step has phases — rollout (vLLM or ``generate``), weight sync (trainer → vLLM) and training
(forward, backward, optimizer) — and each phase is governed by a few settings only: a hang inside the
weight sync is about the ZeRO stage, ``move_model_batches``, sleep mode or vLLM's tensor parallelism,
never about the data-loader workers. So before any statistical blame
(:class:`~autotune.strategy._surrogate.FailureModel`), a failure whose phase is known
(``TrialResult.failed_phase``, set from the trial's evidence: the innermost framework frame of the
traceback, or the signal that called a hang) blames only the knobs that govern that phase. A memory
failure also blames what the trainer keeps on the GPU during that phase (ZeRO stage, offload, LoRA).

Phases are named in the framework-neutral :class:`~autotune.jobconfig.JobConfig` fields; the space's
roles (:meth:`~autotune.space.SearchSpace.knob_for`) turn them into the backend's knob names, so no
framework's vocabulary is written here. A failure at start-up, or of unknown phase, blames every knob.
"""

from __future__ import annotations

from collections.abc import Mapping

from autotune.records import TrialResult, TrialStatus
from autotune.space import SearchSpace

__all__ = ["PHASE_FIELDS", "HELD_FIELDS", "blamed_knobs"]

# JobConfig fields that govern each phase of a step.
PHASE_FIELDS: Mapping[str, tuple[str, ...]] = {
    "rollout": (
        "use_vllm",
        "vllm_mode",
        "vllm_util",
        "vllm_tp",
        "vllm_max_num_seqs",
        "vllm_max_num_batched_tokens",
        "vllm_max_model_len",
        "sleep_level",
        "rollout_offload_model",
        "per_device_batch",  # generation batch when rollouts run in the trainer
        "world_size",
    ),
    "train": (
        "per_device_batch",
        "micro_batch_tokens",  # a token-packed micro-batch's budget (dynamic batch size)
        "grad_accum",
        "gradient_checkpointing",
        "deepspeed",
        "zero_stage",
        "ds_offload_optimizer",
        "ds_offload_param",
        "lora_rank",
        "rollout_offload_optimizer",
        "dataloader_num_workers",
        "world_size",
    ),
    "weight_sync": (
        "deepspeed",
        "zero_stage",
        "ds_offload_param",
        "move_model_batches",
        "sleep_level",
        "vllm_tp",
        "rollout_offload_model",
        "lora_rank",
        "world_size",
    ),
}

# What the trainer keeps on the GPU whatever the phase: a memory failure in any phase blames these too.
HELD_FIELDS: tuple[str, ...] = (
    "deepspeed",
    "zero_stage",
    "ds_offload_optimizer",
    "ds_offload_param",
    "rollout_offload_model",
    "rollout_offload_optimizer",
    "lora_rank",
)

_MEMORY = (TrialStatus.OOM, TrialStatus.VLLM_INIT)


def blamed_knobs(space: SearchSpace, result: TrialResult) -> frozenset[str] | None:
    """The knobs ``result``'s failure can blame, or None when its phase does not narrow them.

    None for a trial that did not fail, whose phase is unknown or ``startup``, or whose phase names no
    knob of this space (a space without roles).
    """
    if not result.status.is_failure:
        return None
    fields = PHASE_FIELDS.get(result.failed_phase or "")
    if fields is None:
        return None
    if result.status in _MEMORY:
        fields = (*fields, *HELD_FIELDS)
    knobs = {space.knob_for(f) for f in fields}
    knobs.discard(None)
    named = frozenset(k for k in knobs if k is not None)
    return named or None
