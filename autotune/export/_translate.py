"""One vocabulary for the winner's knobs, so each format can say them in its own words (or refuse).

:class:`Knobs` holds what a trial's knobs *mean* — DeepSpeed stage and offload, vLLM settings, batch
shape — whichever framework the study ran. Each field remembers the source knob it came from
(``origin``), so a format that cannot express a value refuses it with the name the user knows
(``knob move_model_batches=8``).

ms-swift → meaning:

- ``deepspeed`` presets (ms-swift's ``swift/config/*.json``): ``zero0`` stage 0, ``zero1`` stage 1,
  ``zero2`` stage 2, ``zero2_offload`` stage 2 + optimizer states on the CPU, ``zero3`` stage 3,
  ``zero3_offload`` stage 3 + optimizer states and parameters on the CPU. A JSON path is a custom
  config only ms-swift's own format carries.
- ``offload_optimizer`` / ``offload_model`` move optimizer states / weights to the CPU *while vLLM
  generates* (colocate mode). They are not DeepSpeed offload and only ms-swift has them.
- ``sleep_level`` 1: vLLM's KV cache freed and weights moved to the CPU between rollouts; 2: both freed.
- ``move_model_batches``: ZeRO-3 weight gathering for the vLLM sync in N batches (ms-swift only).

TRL → meaning: ``zero_stage`` 0 = no DeepSpeed, 1–3 the stage; ``offload_optimizer`` /
``offload_param`` = DeepSpeed CPU offload; ``vllm_enable_sleep_mode`` = vLLM sleep level 2 (TRL 1.x calls
``llm.sleep(level=2)``). Both: ``per_device_train_batch_size``, ``gradient_checkpointing``,
``dataloader_num_workers``, ``use_vllm``, ``vllm_gpu_memory_utilization``, ``vllm_tensor_parallel_size``;
``num_processes`` is the world size of a CPU-only study.

The user's fixed arguments are in the vocabulary of the study's framework. Between ms-swift and TRL,
:data:`SHARED_ARGS` (the same name means the same in ms-swift's ``RLHFArguments`` and TRL's ``GRPOConfig``
— both extend transformers' ``TrainingArguments``) pass unchanged and :data:`SWIFT_TO_TRL` are renamed;
anything else is refused, named, rather than guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autotune.errors import UsageError
from autotune.export._winner import Winner

__all__ = [
    "SHARED_ARGS",
    "SWIFT_PRESETS",
    "SWIFT_TO_TRL",
    "Knobs",
    "as_bool",
    "as_float",
    "as_int",
    "fixed_args",
    "knobs_of",
    "swift_preset",
]

#: ms-swift ``--deepspeed`` preset → (ZeRO stage, optimizer offload, parameter offload).
SWIFT_PRESETS: dict[str, tuple[int, bool, bool]] = {
    "zero0": (0, False, False),
    "zero1": (1, False, False),
    "zero2": (2, False, False),
    "zero2_offload": (2, True, False),
    "zero3": (3, False, False),
    "zero3_offload": (3, True, True),
}

#: arguments that mean the same in ms-swift's RLHFArguments and TRL's GRPOConfig (checked against both
#: installed frameworks by tests/export/test_translate_fields.py).
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
SWIFT_TO_TRL: dict[str, str] = {
    "vllm_max_model_len": "vllm_max_model_length",
    "lora_rank": "lora_r",
    "lora_alpha": "lora_alpha",
    "lora_dropout": "lora_dropout",
    "target_modules": "lora_target_modules",
    "torch_dtype": "dtype",
    "attn_impl": "attn_implementation",
}

#: flags ms-swift takes as ``--flag a b c`` and TRL/YAML as a list.
_LIST_ARGS = frozenset(
    {"report_to", "target_modules", "lora_target_modules", "reward_funcs", "external_plugins"}
)


def as_bool(value: Any) -> bool:
    """``True``/``"true"``/``"1"``/``"yes"`` → True; everything else False (None too)."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes", "on")
    return bool(value)


def as_int(value: Any) -> int | None:
    """An int from an int or its text; None for None, booleans and anything else."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def as_float(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def typed(value: Any) -> Any:
    """A value as the frameworks' parsers read text: ``"1e-5"`` → 1e-05, ``"32"`` → 32, ``"true"`` → True.

    Lists are typed item by item; other text stays text.
    """
    if isinstance(value, list | tuple):
        return [typed(v) for v in value]
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            continue
    return value


def _int_or(value: Any, default: int) -> int:
    out = as_int(value)
    return default if out is None else out


def _float_or(value: Any, default: float) -> float:
    out = as_float(value)
    return default if out is None else out


def _none_like(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null"))


@dataclass(frozen=True)
class Knobs:
    """What the winner's knobs mean, framework-neutral.

    Attributes:
        per_device_train_batch_size: completions per device per micro-batch.
        gradient_accumulation_steps: micro-batches per optimizer step (keeps the global batch).
        world_size: training processes (GPUs, or processes on a CPU-only study).
        gradient_checkpointing: activations recomputed in backward (the source framework's default
            filled in when the study did not set it: True for both).
        dataloader_num_workers: data-loading workers (defaults filled in: ms-swift 1, TRL 0).
        zero_stage: DeepSpeed ZeRO stage; None when DeepSpeed is off.
        ds_offload_optimizer: DeepSpeed optimizer states on the CPU.
        ds_offload_param: DeepSpeed parameters on the CPU (stage 3).
        ds_config_path: a custom DeepSpeed JSON (ms-swift ``--deepspeed <path>``); then zero_stage is None.
        use_vllm: rollouts by vLLM.
        vllm_mode: ``colocate`` or ``server`` (None without vLLM).
        vllm_gpu_memory_utilization: share of each GPU vLLM reserves (defaults filled in: ms-swift 0.9,
            TRL 0.3); None without vLLM.
        vllm_tensor_parallel_size: GPUs per vLLM engine; None without vLLM.
        sleep_level: 0 none, 1 KV freed + weights to CPU, 2 both freed, between rollouts.
        vllm_offload_optimizer: ms-swift: optimizer states to the CPU while vLLM generates.
        vllm_offload_model: ms-swift: weights to the CPU while vLLM generates.
        move_model_batches: ms-swift: ZeRO-3 gather for the vLLM sync in N batches.
        origin: field name → ``"knob=value"`` as the study named it (for refusals).
    """

    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    world_size: int
    gradient_checkpointing: bool = True
    dataloader_num_workers: int = 0
    zero_stage: int | None = None
    ds_offload_optimizer: bool = False
    ds_offload_param: bool = False
    ds_config_path: str | None = None
    use_vllm: bool = False
    vllm_mode: str | None = None
    vllm_gpu_memory_utilization: float | None = None
    vllm_tensor_parallel_size: int | None = None
    sleep_level: int = 0
    vllm_offload_optimizer: bool = False
    vllm_offload_model: bool = False
    move_model_batches: int | None = None
    origin: dict[str, str] = field(default_factory=dict)

    def named(self, name: str) -> str:
        """How the study named the knob behind field ``name`` (``"knob deepspeed=zero2"``)."""
        return f"knob {self.origin.get(name, name)}"


def _fmt(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return f"{name}={'true' if value else 'false'}"
    if isinstance(value, float):
        return f"{name}={value:.10g}"
    return f"{name}={value}"


def _global_batch(w: Winner) -> int:
    return int(w.setting("global_batch", 16))


def _ga(w: Winner, pdbs: int, world: int) -> int:
    ga = as_int(w.result.derived.get("gradient_accumulation_steps"))
    if ga is not None and ga > 0:
        return ga
    per_step = max(1, pdbs * world)
    return max(1, _global_batch(w) // per_step)


def fixed_args(w: Winner) -> dict[str, Any]:
    """The study's fixed arguments with normalised names, those given after ``--`` winning."""
    from autotune.study.fixed import flag_name, parse_flag_argv

    raw = w.settings.get("fixed") or {}
    out = {flag_name(str(k)): v for k, v in raw.items()} if isinstance(raw, Mapping) else {}
    passthrough = w.settings.get("passthrough") or []
    if isinstance(passthrough, list) and passthrough:
        try:
            out.update(parse_flag_argv([str(p) for p in passthrough]))
        except UsageError:
            pass  # arguments the study itself could not read are not carried
    if w.backend == "swift":
        out = {("tuner_type" if k == "train_type" else k): v for k, v in out.items()}
    return out


def knobs_of(w: Winner) -> Knobs:
    """The meaning of the winner's knobs (its params over the study's fixed arguments)."""
    fixed = fixed_args(w)
    eff = {**fixed, **w.result.params}
    world = w.world_size
    origin: dict[str, str] = {}

    def note(field_name: str, knob: str) -> None:
        if knob in eff:
            origin[field_name] = _fmt(knob, eff[knob])

    if w.backend == "trl":
        pdbs = as_int(eff.get("per_device_train_batch_size")) or 8
        zero = as_int(eff.get("zero_stage")) or 0
        use_vllm = as_bool(eff.get("use_vllm", False))
        for f_, k in (
            ("zero_stage", "zero_stage"),
            ("ds_offload_optimizer", "offload_optimizer"),
            ("ds_offload_param", "offload_param"),
            ("sleep_level", "vllm_enable_sleep_mode"),
        ):
            note(f_, k)
        knobs = Knobs(
            per_device_train_batch_size=pdbs,
            gradient_accumulation_steps=_ga(w, pdbs, world),
            world_size=world,
            gradient_checkpointing=as_bool(eff.get("gradient_checkpointing", True)),
            dataloader_num_workers=_int_or(eff.get("dataloader_num_workers"), 0),
            zero_stage=zero if zero > 0 else None,
            ds_offload_optimizer=zero >= 2 and as_bool(eff.get("offload_optimizer", False)),
            ds_offload_param=zero == 3 and as_bool(eff.get("offload_param", False)),
            use_vllm=use_vllm,
            vllm_mode=str(eff.get("vllm_mode") or "colocate") if use_vllm else None,
            vllm_gpu_memory_utilization=_float_or(eff.get("vllm_gpu_memory_utilization"), 0.3)
            if use_vllm
            else None,
            vllm_tensor_parallel_size=_int_or(eff.get("vllm_tensor_parallel_size"), 1) if use_vllm else None,
            sleep_level=2 if use_vllm and as_bool(eff.get("vllm_enable_sleep_mode", False)) else 0,
            origin=origin,
        )
    else:  # swift (and anything with ms-swift's knob names)
        pdbs = as_int(eff.get("per_device_train_batch_size")) or 1
        preset = eff.get("deepspeed")
        zero: int | None = None
        off_opt = off_param = False
        custom: str | None = None
        if not _none_like(preset):
            spec = SWIFT_PRESETS.get(str(preset))
            if spec is None:
                custom = str(preset)
            else:
                zero, off_opt, off_param = spec
                zero = None if zero == 0 else zero
        use_vllm = as_bool(eff.get("use_vllm", False))
        for f_, k in (
            ("zero_stage", "deepspeed"),
            ("ds_offload_optimizer", "deepspeed"),
            ("ds_offload_param", "deepspeed"),
            ("ds_config_path", "deepspeed"),
            ("sleep_level", "sleep_level"),
            ("vllm_offload_optimizer", "offload_optimizer"),
            ("vllm_offload_model", "offload_model"),
            ("move_model_batches", "move_model_batches"),
            ("vllm_mode", "vllm_mode"),
        ):
            note(f_, k)
        knobs = Knobs(
            per_device_train_batch_size=pdbs,
            gradient_accumulation_steps=_ga(w, pdbs, world),
            world_size=world,
            gradient_checkpointing=as_bool(eff.get("gradient_checkpointing", True)),
            dataloader_num_workers=_int_or(eff.get("dataloader_num_workers"), 1),
            zero_stage=zero,
            ds_offload_optimizer=off_opt,
            ds_offload_param=off_param,
            ds_config_path=custom,
            use_vllm=use_vllm,
            vllm_mode=str(eff.get("vllm_mode") or "colocate") if use_vllm else None,
            vllm_gpu_memory_utilization=_float_or(eff.get("vllm_gpu_memory_utilization"), 0.9)
            if use_vllm
            else None,
            vllm_tensor_parallel_size=_int_or(eff.get("vllm_tensor_parallel_size"), 1) if use_vllm else None,
            sleep_level=(as_int(eff.get("sleep_level")) or 0) if use_vllm else 0,
            vllm_offload_optimizer=use_vllm and as_bool(eff.get("offload_optimizer", False)),
            vllm_offload_model=use_vllm and as_bool(eff.get("offload_model", False)),
            move_model_batches=as_int(eff.get("move_model_batches")) if use_vllm else None,
            origin=origin,
        )
    return knobs


def swift_preset(k: Knobs, fmt: str, instead: str | None) -> str | None:
    """The ms-swift ``--deepspeed`` preset for the knobs' ZeRO stage and offload (None: DeepSpeed off).

    Raises:
        UsageError: a stage/offload combination no preset has (ZeRO-3 with only one kind of offload,
            ZeRO-1 with offload).
    """
    from autotune.export._common import refuse

    if k.ds_config_path is not None:
        return k.ds_config_path
    if k.zero_stage is None:
        return None
    for name, spec in SWIFT_PRESETS.items():
        if spec == (k.zero_stage, k.ds_offload_optimizer, k.ds_offload_param):
            return name
    what = k.named("ds_offload_param" if k.zero_stage == 3 else "ds_offload_optimizer")
    raise refuse(f"{what} with ZeRO-{k.zero_stage}", fmt, instead)


def list_value(name: str, value: Any) -> Any:
    """Flags that are lists in one framework and may be a single text in the other."""
    if name in _LIST_ARGS and isinstance(value, str):
        return value.split() if " " in value.strip() else [value]
    return value
