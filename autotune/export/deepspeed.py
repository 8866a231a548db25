"""``--format deepspeed``: the DeepSpeed config (``ds_config.json``) of the winner's ZeRO stage and offload.

Every value is concrete (no ``"auto"``), so DeepSpeed's own ``DeepSpeedConfig`` accepts the file as it
is, and the transformers integration (TRL, ms-swift) finds it consistent with the training arguments
the other exports write: ``train_micro_batch_size_per_gpu`` = per-device batch, ``gradient_accumulation_steps``
= the derived accumulation, ``train_batch_size`` = their product × world size, ``gradient_clipping`` =
``max_grad_norm`` (1.0 unless fixed), ``bf16``/``fp16`` as the job runs.

Stage and offload come from what the knobs mean (:class:`~autotune.jobconfig.JobConfig`): ms-swift's presets
(``zero2_offload`` = stage 2 + optimizer states on the CPU; ``zero3_offload`` = stage 3 + optimizer
states and parameters on the CPU) or TRL's ``zero_stage`` + ``offload_optimizer`` / ``offload_param``.
The ZeRO settings follow ms-swift's presets (what a swift trial ran); the values the presets leave
``"auto"`` are filled as transformers fills them, from the model's hidden size when it is known
(``reduce_bucket_size`` = hidden², ``stage3_prefetch_bucket_size`` = 0.9 × hidden²,
``stage3_param_persistence_threshold`` = 10 × hidden), and left to DeepSpeed's defaults otherwise.
A winner without DeepSpeed has no config to export and is refused.
"""

from __future__ import annotations

from typing import Any

from autotune.errors import UsageError
from autotune.export._common import MARKER, Export, json_text, refuse
from autotune.export._job import precision
from autotune.export._winner import Winner
from autotune.jobconfig import JobConfig
from autotune.values import as_float

__all__ = ["DS_CONFIG", "ds_config", "export_deepspeed"]

DS_CONFIG = "ds_config.json"


def ds_config(
    k: JobConfig,
    *,
    bf16: bool,
    fp16: bool,
    max_grad_norm: float = 1.0,
    hidden_size: int | None = None,
    cpu_only: bool = False,
    comment: str | None = None,
) -> dict[str, Any]:
    """A concrete DeepSpeed config for the knobs' stage and offload.

    Args:
        k: the winner's knobs; ``k.sharding_stage`` must be set.
        bf16: bf16 mixed precision on.
        fp16: fp16 mixed precision on.
        max_grad_norm: gradient clipping (transformers' ``max_grad_norm``).
        hidden_size: the model's hidden size, for the bucket sizes transformers derives from it.
        cpu_only: no GPU: offloaded memory is not pinned.
        comment: a ``_comment`` key first in the file (DeepSpeed ignores unknown top-level keys).

    Raises:
        UsageError: the knobs have no ZeRO stage.
    """
    if k.sharding_stage is None:
        raise UsageError("the trial runs without DeepSpeed", hint="Export another format")
    stage = k.sharding_stage
    pin = not cpu_only
    zero: dict[str, Any] = {"stage": stage}
    if stage >= 1 and k.ds_offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
    if stage == 3 and k.ds_offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin}
    if cpu_only:
        # DeepSpeed's CPU accelerator has no side streams; on GPUs overlap_comm keeps DeepSpeed's default
        # (on for ZeRO-3), as the trials ran it
        zero["overlap_comm"] = False
    zero["contiguous_gradients"] = True
    if stage == 2:
        zero.update(
            allgather_partitions=True,
            allgather_bucket_size=200_000_000,
            reduce_scatter=True,
            reduce_bucket_size=200_000_000,
        )
    if stage == 3:
        zero["sub_group_size"] = 1_000_000_000
        if hidden_size:
            zero["reduce_bucket_size"] = hidden_size * hidden_size
            zero["stage3_prefetch_bucket_size"] = int(0.9 * hidden_size * hidden_size)
            zero["stage3_param_persistence_threshold"] = 10 * hidden_size
        zero["stage3_max_live_parameters"] = 1_000_000_000
        zero["stage3_max_reuse_distance"] = 1_000_000_000
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    config: dict[str, Any] = {}
    if comment:
        config["_comment"] = comment
    config.update(
        train_batch_size=k.per_device_batch * k.grad_accum * k.world_size,
        train_micro_batch_size_per_gpu=k.per_device_batch,
        gradient_accumulation_steps=k.grad_accum,
        gradient_clipping=max_grad_norm,
        zero_allow_untested_optimizer=True,
        bf16={"enabled": bf16},
        fp16={"enabled": fp16},
        zero_optimization=zero,
        steps_per_print=2000,
        wall_clock_breakdown=False,
    )
    return config


def config_for(w: Winner, fmt: str, *, instead: str | None) -> dict[str, Any]:
    """The winner's DeepSpeed config, for ``fmt`` (used by the trl export too).

    Raises:
        UsageError: the winner runs without DeepSpeed, or with a DeepSpeed JSON of the user's own.
    """
    k = w.config
    if k.ds_config_path is not None:
        raise refuse(f"{k.named('ds_config_path')} (a DeepSpeed JSON of your own)", fmt, instead)
    if k.sharding_stage is None:
        what = k.setting("zero_stage") or "zero_stage=0"
        raise UsageError(
            f"trial {w.number} runs without DeepSpeed (knob {what}): there is no DeepSpeed config to export",
            hint=f"use --format {instead or 'json'}",
        )
    fixed = w.fixed
    bf16, fp16 = precision(w, fixed)
    hidden = w.settings.model.facts.get("hidden")
    name = w.study_name
    return ds_config(
        k,
        bf16=bf16,
        fp16=fp16,
        max_grad_norm=as_float(fixed.get("max_grad_norm")) or 1.0,
        hidden_size=int(hidden) if isinstance(hidden, int | float) and hidden > 0 else None,
        cpu_only=w.cpu_only,
        comment=f"{MARKER} from study {name}, trial {w.number}: ZeRO-{k.sharding_stage}"
        + (", optimizer states on the CPU" if k.ds_offload_optimizer else "")
        + (", parameters on the CPU" if k.ds_offload_param else "")
        + f"; world size {k.world_size}",
    )


def export_deepspeed(w: Winner) -> Export:
    """``ds_config.json`` for the winner.

    Raises:
        UsageError: the winner runs without DeepSpeed (see :func:`config_for`).
    """
    instead = w.own_format or "json"  # the study's own format, when it has one
    config = config_for(w, "deepspeed", instead=instead)
    return Export(format="deepspeed", files={DS_CONFIG: json_text(config)}, main=DS_CONFIG, trial=w.number)
