"""One job shape from a backend's knobs: the facts the memory and time models need, in one vocabulary.

TRL and ms-swift name the same things differently (``zero_stage: 3`` + ``offload_param`` vs
``deepspeed: zero3_offload``; ``vllm_enable_sleep_mode`` vs ``sleep_level``; ``use_peft`` + ``lora_r``
vs ``tuner_type lora`` + ``lora_rank``). :func:`job_shape` reads either and applies each framework's
defaults where a knob is absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from autotune.errors import UsageError
from autotune.estimate.catalog import ModelSpec

__all__ = ["JobShape", "job_shape", "BACKEND_DEFAULTS"]

# Framework defaults for facts the user did not fix (frameworks.md; trl 1.16 and ms-swift 4.6 sources).
BACKEND_DEFAULTS: dict[str, dict[str, Any]] = {
    "trl": {
        "beta": 0.0,
        "per_device_train_batch_size": 8,
        "gradient_checkpointing": True,
        "vllm_gpu_memory_utilization": 0.3,
        "vllm_mode": "colocate",
        "max_num_batched_tokens": 4096,  # trl/generation/vllm_generation.py passes 4096
    },
    "swift": {
        "beta": 0.04,
        "per_device_train_batch_size": 1,
        "gradient_checkpointing": True,
        "vllm_gpu_memory_utilization": 0.9,
        "vllm_mode": None,  # required with use_vllm (ms-swift raises)
        "max_num_batched_tokens": None,  # vLLM's own default
    },
}

_SWIFT_DEEPSPEED: dict[str | None, tuple[bool, int, bool, bool]] = {
    # preset → (deepspeed on, zero stage, offload optimizer, offload params)
    None: (False, 0, False, False),
    "zero0": (True, 0, False, False),
    "zero1": (True, 1, False, False),
    "zero2": (True, 2, False, False),
    "zero3": (True, 3, False, False),
    "zero2_offload": (True, 2, True, False),
    "zero3_offload": (True, 3, True, True),
}


@dataclass(frozen=True)
class JobShape:
    """Everything about one trial that memory and speed depend on, per framework-neutral names.

    Attributes:
        backend: ``trl``, ``swift`` or another backend name (TRL semantics are assumed for others).
        model: architecture facts.
        n_gpus: GPUs the trial runs on (the world size); 0 for a CPU-only trial.
        world_size: training processes.
        global_batch: completions per optimizer step.
        num_generations: completions per prompt.
        per_device_batch: completions per forward/backward micro-batch on one GPU.
        grad_accum: micro-batches per optimizer step.
        max_prompt_length: prompt tokens (upper bound).
        max_completion_length: completion tokens (upper bound).
        gradient_checkpointing: activations recomputed in the backward pass.
        deepspeed: DeepSpeed is in use (False: plain DDP with a bf16 torch optimizer).
        zero_stage: ZeRO stage 0–3 (0 without DeepSpeed).
        ds_offload_optimizer: DeepSpeed keeps optimizer states (and fp32 work) on the CPU.
        ds_offload_param: DeepSpeed ZeRO-3 keeps parameters on the CPU.
        rollout_offload_model: ms-swift ``offload_model``: weights to the CPU while vLLM generates.
        rollout_offload_optimizer: ms-swift ``offload_optimizer``: optimizer to the CPU while vLLM generates.
        lora_rank: LoRA rank; 0 for full fine-tuning.
        beta: KL coefficient; a reference model exists only when > 0.
        use_vllm: rollouts by vLLM (else by ``model.generate`` in the trainer).
        vllm_mode: ``colocate`` or ``server``.
        vllm_util: ``gpu_memory_utilization`` (fraction of total memory vLLM reserves).
        vllm_tp: vLLM tensor-parallel size.
        sleep_level: 0 awake, 1 weights to CPU + KV dropped between rollouts, 2 both dropped.
        vllm_max_model_len: the longest sequence vLLM must hold (model max when not set).
        vllm_max_num_seqs: sequences one vLLM instance decodes at once at most.
        vllm_max_num_batched_tokens: tokens per vLLM forward (drives its profiled activation peak).
        move_model_batches: ms-swift weight-sync split for ZeRO-3 (None: gather everything at once).
        dataloader_num_workers: data-loader worker processes per rank.
    """

    backend: str
    model: ModelSpec
    n_gpus: int
    world_size: int
    global_batch: int
    num_generations: int
    per_device_batch: int
    grad_accum: int
    max_prompt_length: int
    max_completion_length: int
    gradient_checkpointing: bool
    deepspeed: bool
    zero_stage: int
    ds_offload_optimizer: bool
    ds_offload_param: bool
    rollout_offload_model: bool
    rollout_offload_optimizer: bool
    lora_rank: int
    beta: float
    use_vllm: bool
    vllm_mode: Literal["colocate", "server"]
    vllm_util: float
    vllm_tp: int
    sleep_level: int
    vllm_max_model_len: int
    vllm_max_num_seqs: int
    vllm_max_num_batched_tokens: int | None
    move_model_batches: int | None
    dataloader_num_workers: int = 0

    @property
    def on_gpu(self) -> bool:
        return self.n_gpus > 0

    @property
    def lora(self) -> bool:
        return self.lora_rank > 0

    @property
    def colocate(self) -> bool:
        """vLLM shares the training GPUs."""
        return self.use_vllm and self.vllm_mode == "colocate"

    @property
    def seq_len(self) -> int:
        """Prompt plus completion tokens of one sample."""
        return self.max_prompt_length + self.max_completion_length

    @property
    def has_reference(self) -> bool:
        """A separate reference model is held (beta > 0 and full fine-tuning; LoRA's base serves)."""
        return self.beta > 0 and not self.lora

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["model"] = self.model.name
        return out


def _get(params: Mapping[str, Any], *names: str, default: Any = None) -> Any:
    for name in names:
        if name in params and params[name] is not None:
            return params[name]
    return default


def _bool(value: Any, default: bool = False) -> bool:
    if value is None:
        return default
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _int_or_none(value: Any) -> int | None:
    if value is None or value == "" or (isinstance(value, str) and value.lower() in ("none", "null")):
        return None
    return int(value)


def job_shape(
    backend: str,
    params: Mapping[str, Any],
    derived: Mapping[str, Any],
    fixed: Mapping[str, Any],
    model: ModelSpec,
    n_gpus: int,
) -> JobShape:
    """Normalise one candidate's knobs into a :class:`JobShape`.

    Args:
        backend: ``trl`` or ``swift`` (other names get TRL's semantics and defaults).
        params: the candidate's active knobs, named as the framework names them.
        derived: ``world_size`` and ``gradient_accumulation_steps`` when the backend derived them.
        fixed: the job facts that are the same for every trial: ``global_batch``, ``num_generations``,
            ``max_prompt_length``, ``max_completion_length``, ``beta``, LoRA (``tuner_type``/
            ``train_type`` + ``lora_rank``, or ``use_peft`` + ``lora_r``), ``vllm_max_model_len``
            (``vllm_max_model_length`` in TRL), ``vllm_max_num_seqs``.
        model: architecture facts.
        n_gpus: GPUs of the trial; 0 for a CPU-only trial.

    Raises:
        UsageError: a value that cannot be a number of the kind required, or a ms-swift ``deepspeed``
            value that is not a preset.
    """
    defaults = BACKEND_DEFAULTS.get(backend, BACKEND_DEFAULTS["trl"])
    merged: dict[str, Any] = {**fixed, **params}
    try:
        return _shape(backend, merged, derived, defaults, model, n_gpus)
    except (TypeError, ValueError) as exc:
        raise UsageError(
            f"cannot read the job shape: {exc}", hint="Check the knob and fixed-argument values"
        ) from None


def _shape(
    backend: str,
    p: Mapping[str, Any],
    derived: Mapping[str, Any],
    defaults: Mapping[str, Any],
    model: ModelSpec,
    n_gpus: int,
) -> JobShape:
    if derived.get("world_size"):
        world = int(derived["world_size"])
    elif n_gpus > 0:
        world = n_gpus
    else:
        world = int(_get(p, "num_processes", "world_size", default=1))
    global_batch = int(_get(p, "global_batch", "generation_batch_size", default=64))
    num_generations = int(_get(p, "num_generations", default=8))
    pdbs = int(_get(p, "per_device_train_batch_size", default=defaults["per_device_train_batch_size"]))
    ga_raw = derived.get("gradient_accumulation_steps") or _get(p, "gradient_accumulation_steps")
    grad_accum = int(ga_raw) if ga_raw else max(1, global_batch // max(1, pdbs * world))
    max_prompt = int(_get(p, "max_prompt_length", default=512))
    max_completion = int(_get(p, "max_completion_length", default=1024))

    if backend == "swift":
        preset = _get(p, "deepspeed")
        key = None if preset in (None, "", "none", "null") else str(preset)
        if key not in _SWIFT_DEEPSPEED:
            raise UsageError(
                f"deepspeed {preset!r} is not an ms-swift preset",
                hint="Use one of zero0, zero1, zero2, zero3, zero2_offload, zero3_offload (or none)",
            )
        ds, stage, ds_off_opt, ds_off_param = _SWIFT_DEEPSPEED[key]
        roll_off_model = _bool(_get(p, "offload_model"))
        roll_off_opt = _bool(_get(p, "offload_optimizer"))
        tuner = str(_get(p, "tuner_type", "train_type", default="full")).lower()
        lora_rank = int(_get(p, "lora_rank", default=8)) if tuner in ("lora", "longlora", "qlora") else 0
        sleep = int(_get(p, "sleep_level", default=0))
        mode = _get(p, "vllm_mode", default=defaults["vllm_mode"]) or "colocate"
        max_len = _int_or_none(_get(p, "vllm_max_model_len"))
        move_batches = _int_or_none(_get(p, "move_model_batches"))
    else:
        stage = int(_get(p, "zero_stage", default=0))
        ds = stage > 0
        ds_off_opt = ds and stage >= 2 and _bool(_get(p, "offload_optimizer"))
        ds_off_param = ds and stage == 3 and _bool(_get(p, "offload_param"))
        roll_off_model = roll_off_opt = False
        use_peft = _bool(_get(p, "use_peft"))
        lora_rank = int(_get(p, "lora_r", "lora_rank", default=16)) if use_peft else 0
        sleep = 2 if _bool(_get(p, "vllm_enable_sleep_mode")) else 0
        mode = _get(p, "vllm_mode", default=defaults["vllm_mode"]) or "colocate"
        max_len = _int_or_none(_get(p, "vllm_max_model_length", "vllm_max_model_len"))
        move_batches = None

    use_vllm = _bool(_get(p, "use_vllm")) and n_gpus > 0
    tp = int(_get(p, "vllm_tensor_parallel_size", default=1)) if use_vllm else 1
    if mode not in ("colocate", "server"):
        raise ValueError(f"vllm_mode {mode!r} is neither colocate nor server")
    if not use_vllm or mode == "server":
        sleep = 0  # ms-swift forces 0 in server mode and without vLLM
    steps_per_generation = int(_get(p, "steps_per_generation", default=grad_accum))
    max_num_seqs = _int_or_none(_get(p, "vllm_max_num_seqs")) or pdbs * tp * steps_per_generation
    batched = _int_or_none(_get(p, "vllm_max_num_batched_tokens")) or defaults["max_num_batched_tokens"]

    return JobShape(
        backend=backend,
        model=model,
        n_gpus=n_gpus,
        world_size=world,
        global_batch=global_batch,
        num_generations=num_generations,
        per_device_batch=pdbs,
        grad_accum=grad_accum,
        max_prompt_length=max_prompt,
        max_completion_length=max_completion,
        gradient_checkpointing=_bool(
            _get(p, "gradient_checkpointing", "activation_checkpointing"), defaults["gradient_checkpointing"]
        ),
        deepspeed=ds,
        zero_stage=stage,
        ds_offload_optimizer=ds_off_opt,
        ds_offload_param=ds_off_param,
        rollout_offload_model=roll_off_model and use_vllm and mode == "colocate",
        rollout_offload_optimizer=roll_off_opt and use_vllm and mode == "colocate",
        lora_rank=max(0, lora_rank),
        beta=float(_get(p, "beta", default=defaults["beta"])),
        use_vllm=use_vllm,
        vllm_mode=mode,
        vllm_util=float(
            _get(p, "vllm_gpu_memory_utilization", default=defaults["vllm_gpu_memory_utilization"])
        ),
        vllm_tp=max(1, tp),
        sleep_level=sleep,
        vllm_max_model_len=max_len or model.max_position,
        vllm_max_num_seqs=max(1, max_num_seqs),
        vllm_max_num_batched_tokens=batched,
        move_model_batches=move_batches if stage == 3 else None,
        dataloader_num_workers=int(_get(p, "dataloader_num_workers", default=0)),
    )
