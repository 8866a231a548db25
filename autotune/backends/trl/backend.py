"""The TRL backend: each trial is a real ``GRPOTrainer`` run by :mod:`autotune.backends.trl_worker`.

Knobs are those of ``search_spaces/trl.yaml``. A trial with one process and no DeepSpeed runs as
``python -m autotune.backends.trl_worker <trial_config.json>``; more processes, or any ZeRO stage (which
needs torch.distributed even for one process), run under ``python -m torch.distributed.run``. On a
CPU-only machine ``num_processes`` sets the world size; ``accelerate launch --cpu --num_processes 2``
would silently run one process, torchrun really runs two.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune.affinity import CORES_ENV, format_cores, usable_cores
from autotune.backends._base import (
    Backend,
    BackendInfo,
    FailurePattern,
    OpenPhase,
    PhaseFrame,
    RuleViolation,
    StepParser,
    TrialContext,
    trial_path,
)
from autotune.backends._phases import MarkerPhases
from autotune.backends._vllm import DISTRIBUTIONS as VLLM_DISTRIBUTIONS
from autotune.backends._vllm import cpu_thread_binding, sampling_kwargs
from autotune.backends._vllm import refusals as vllm_refusals
from autotune.backends.trl.argv import parse_trl_argv, type_trl_mapping
from autotune.backends.trl.config import KNOB_FIELDS, describe_trl
from autotune.backends.trl.job import SCRIPT_KEEPS, installed_fields, job_notes
from autotune.errors import BackendError
from autotune.fixed import JOB_ARGS_PLACE
from autotune.jobconfig import JobConfig
from autotune.jobsemantics import FrameworkJobDefaults
from autotune.records import LaunchPlan, StepMetrics, TrialSpec
from autotune.secrets import SecretRule, env_name
from autotune.space import SearchSpace
from autotune.studydir import write_text_atomic
from autotune.tail import FileTail

__all__ = ["TrlBackend", "TrlMetricsParser", "ds_config", "MIN_TRL_VERSION"]

MIN_TRL_VERSION = (0, 20)
INSTALL_HINT = "Install it with: pip install 'autotune-grpo[trl]'"
METRICS_FILE = "metrics.jsonl"
PHASES_FILE = "phases.jsonl"
CONFIG_FILE = "trial_config.json"
DS_CONFIG_FILE = "ds_config.json"
PROMPTS_FILE = "prompts.jsonl"

#: the knobs a TRL trial renders (their defaults are TRL's own, in search_spaces/trl.yaml).
_KNOBS: tuple[str, ...] = (
    "per_device_train_batch_size",
    "gradient_checkpointing",
    "dataloader_num_workers",
    "zero_stage",
    "offload_optimizer",
    "offload_param",
    "num_processes",
    "use_vllm",
    "vllm_gpu_memory_utilization",
    "vllm_enable_sleep_mode",
    "vllm_tensor_parallel_size",
)

# GRPOConfig arguments autotune owns: the user's fixed arguments cannot change them, because the
# metrics file, the step budget and the fixed training semantics depend on them.
_OWNED = frozenset(
    {
        "output_dir",
        "logging_steps",
        "max_steps",
        "report_to",
        "save_strategy",
        "num_generations",
        "max_completion_length",
        "gradient_accumulation_steps",
        "per_device_train_batch_size",
        "seed",
        "use_cpu",
        "deepspeed",
    }
)


#: owned arguments a study honours from the user's job: its semantics, and the batch of the baseline
_SEMANTIC = frozenset(
    {"num_generations", "max_completion_length", "per_device_train_batch_size", "gradient_accumulation_steps"}
)


def _secrets_to_env(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, tuple[str, str]]]:
    """``GRPOConfig`` arguments without their secrets (:mod:`autotune.secrets`), and each secret's
    environment variable and value: the worker reads them from its environment, so the trial's config
    file never holds one."""
    rule = SecretRule()
    clean: dict[str, Any] = {}
    moved: dict[str, tuple[str, str]] = {}
    for name, value in kwargs.items():
        if isinstance(value, str) and (rule.is_secret_name(name) or rule.looks_secret(value)):
            moved[name] = (f"AUTOTUNE_SECRET_{env_name(name)}", value)
        else:
            clean[name] = value
    return clean, moved


def _version_tuple(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def ds_config(
    zero_stage: int, *, offload_optimizer: bool, offload_param: bool, cpu_only: bool
) -> dict[str, Any]:
    """A DeepSpeed config for the HF integration ("auto" values are filled from GRPOConfig).

    Args:
        zero_stage: 1, 2 or 3.
        offload_optimizer: optimizer states on the CPU (ZeRO-2/3).
        offload_param: parameters on the CPU (ZeRO-3 only).
        cpu_only: no GPU: pinned memory off, fp16/bf16 off.
    """
    zero: dict[str, Any] = {"stage": zero_stage, "contiguous_gradients": True}
    if cpu_only:
        # DeepSpeed's CPU accelerator has no side streams to overlap on; on GPUs overlap_comm keeps
        # DeepSpeed's own default (on for ZeRO-3, off below), as TRL's accelerate presets leave it
        zero["overlap_comm"] = False
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": not cpu_only}
    if offload_param and zero_stage == 3:
        zero["offload_param"] = {"device": "cpu", "pin_memory": not cpu_only}
    if zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = False
    precision: Any = False if cpu_only else "auto"
    return {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": precision},
        "fp16": {"enabled": precision},
        "zero_optimization": zero,
    }


class TrlMetricsParser(StepParser):
    """Tails the worker's ``metrics.jsonl``; one :class:`StepMetrics` per new complete line.

    A partial last line (the worker is mid-write) is kept until its newline arrives. Lines that are not
    JSON objects with an integer ``step`` are skipped; a step already returned is not returned again.

    TRL prints nothing of its own around its phases; the worker marks them (``PhaseTracker`` in
    ``autotune/backends/trl_worker.py``: rollout, ``weight_sync`` around the installed TRL's
    ``_move_model_to_vllm`` or ``vllm_generation.sync_weights``, train) in ``phases_path``, which
    :meth:`open_phase` reads.

    Args:
        path: the worker's metrics file.
        phases_path: the worker's phase-marker file (``$AUTOTUNE_PHASES_FILE``), when there is one.
    """

    def __init__(self, path: Path, phases_path: Path | None = None) -> None:
        self.path = Path(path)
        self._tail = FileTail(self.path)  # bounded and non-blocking, whatever the worker makes of it
        self._seen: set[int] = set()
        self._phases = MarkerPhases(phases_path) if phases_path is not None else None

    def open_phase(self) -> OpenPhase | None:
        """The phase the worker's last marker opened and no marker closed."""
        return self._phases.open() if self._phases is not None else None

    def feed(self, stream: str, line: str, t_mono_s: float, t_wall_s: float) -> list[StepMetrics]:
        return []  # the worker's metrics go to the file, not to stdout

    def poll(self, t_mono_s: float, t_wall_s: float) -> list[StepMetrics]:
        if self._phases is not None:
            self._phases.poll()
        out: list[StepMetrics] = []
        for raw in self._tail.lines():
            step = self._parse(raw)
            if step is not None and step.step not in self._seen:
                self._seen.add(step.step)
                out.append(step)
        return out

    @staticmethod
    def _parse(raw: bytes) -> StepMetrics | None:
        try:
            record = json.loads(raw)
        except ValueError:
            return None
        if (
            not isinstance(record, dict)
            or isinstance(record.get("step"), bool)
            or not isinstance(record.get("step"), int)
        ):
            return None
        values = record.get("values") or {}
        try:
            return StepMetrics(
                step=record["step"],
                t_mono_s=float(record["t_mono_s"]),
                t_wall_s=float(record["t_wall_s"]),
                duration_s=_opt_float(record.get("duration_s")),
                samples=int(record["samples"]) if record.get("samples") is not None else None,
                tokens=_opt_float(record.get("tokens")),
                values={
                    k: float(v)
                    for k, v in values.items()
                    if isinstance(v, (int, float)) and not isinstance(v, bool)
                },
            )
        except (KeyError, TypeError, ValueError):
            return None


def _rewards(fixed: Mapping[str, Any]) -> list[str]:
    """The trials' rewards: ``reward_funcs`` (default autotune's) and ``reward_model_name_or_path``."""
    given = fixed.get("reward_funcs") or ["autotune"]
    rewards = [given] if isinstance(given, str) else [str(r) for r in given]
    model = fixed.get("reward_model_name_or_path")
    if model and (not fixed.get("reward_funcs")):
        rewards = [str(model)]
    elif model:
        rewards.append(str(model))
    return rewards


def _everything_local(ctx: TrialContext) -> bool:
    """True when the dataset and every reward are on disk or in code (the model is checked apart)."""
    if ctx.dataset is not None and not Path(ctx.dataset).expanduser().exists():
        return False
    for reward in _rewards(ctx.fixed):
        if reward != "autotune" and ":" not in str(reward) and not Path(str(reward)).expanduser().exists():
            return False  # a reward model id: TRL may need the hub
    return True


def _opt_float(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


class TrlBackend(Backend):
    """TRL ``GRPOTrainer`` trials (see the module docstring)."""

    name = "trl"
    display_name = "TRL"
    space_name = "trl"
    #: what :meth:`probe` found (None before it ran)
    _info: BackendInfo | None = None
    knob_names = frozenset(_KNOBS)
    knob_fields = KNOB_FIELDS
    # GRPOConfig's field defaults (trl 1.16: num_generations 8, max_completion_length 512,
    # per_device_train_batch_size 8, gradient_accumulation_steps 1); a test reads them back from the
    # installed TRL, so a release that changes them fails it.
    job_defaults = FrameworkJobDefaults(
        framework="TRL's GRPOConfig",
        num_generations=8,
        max_completion_length=512,
        per_device_batch=8,
        gradient_accumulation=1,
    )

    @classmethod
    def describe(
        cls,
        params: Mapping[str, object],
        derived: Mapping[str, object],
        fixed: Mapping[str, object],
        n_gpus: int,
    ) -> JobConfig:
        """What TRL's knobs and ``GRPOConfig`` arguments mean (:func:`describe_trl`)."""
        return describe_trl(params, derived, fixed, n_gpus, cls.knob_defaults())

    @classmethod
    def lora_args(cls, rank: int) -> dict[str, Any]:
        """PEFT LoRA through ``GRPOConfig``: ``use_peft`` with ``lora_r``."""
        return {"use_peft": True, "lora_r": rank}

    @classmethod
    def parse_fixed_argv(cls, argv: Sequence[str], place: str = JOB_ARGS_PLACE) -> dict[str, Any]:
        """The job's flags as ``trl grpo`` parses them (:func:`~autotune.backends.trl.argv.parse_trl_argv`):
        ``--beta 0.04`` is a float, a misspelt name is refused with the nearest argument."""
        return parse_trl_argv(argv, place)

    @classmethod
    def type_fixed_mapping(cls, args: Mapping[str, object], place: str) -> dict[str, Any]:
        """A ``trl grpo --config`` YAML read as TRL reads it (:func:`~autotune.backends.trl.argv.type_trl_mapping`)."""
        return type_trl_mapping(args, place)

    @classmethod
    def uses_demo_reward(cls, fixed: Mapping[str, object]) -> bool:
        """TRL trials score with autotune's reward unless ``reward_funcs`` leaves ``autotune`` out."""
        return "autotune" in _rewards(fixed)

    def check_flags(
        self, params: dict[str, Any], fixed: dict[str, Any], ctx: TrialContext | None = None
    ) -> list[str]:
        """Name what of the user's TRL job (a ``trl grpo --config`` YAML) cannot stay fixed
        (:mod:`autotune.backends.trl.job`).

        Raises:
            BackendError: the job names its own model.
        """
        # the job's semantics and the batch are honoured (autotune.jobsemantics; the batch is the baseline's)
        notes = job_notes(fixed, _OWNED - _SEMANTIC, installed_fields())
        notes += [
            f"{name} is a tuned knob: trials set their own value (yours is the baseline)"
            for name in sorted(set(params) & set(fixed))
        ]
        return notes

    def probe(self) -> BackendInfo:
        """Find trl and torch in this interpreter (the worker runs with ``sys.executable``)."""
        missing = [m for m in ("torch", "trl", "transformers") if importlib.util.find_spec(m) is None]
        if missing:
            raise BackendError(
                f"the trl backend needs {', '.join(missing)}, not installed here", hint=INSTALL_HINT
            )
        versions: dict[str, str] = {}
        for dist in ("trl", "torch", "transformers", "accelerate", "deepspeed", *VLLM_DISTRIBUTIONS):
            try:
                versions[dist] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                continue
        trl_version = versions.get("trl")
        if trl_version is None:
            raise BackendError("trl is importable but has no package metadata", hint=INSTALL_HINT)
        if _version_tuple(trl_version) < MIN_TRL_VERSION:
            raise BackendError(
                f"trl {trl_version} is older than the {'.'.join(map(str, MIN_TRL_VERSION))} this backend needs",
                hint="Upgrade it with: pip install -U 'autotune-grpo[trl]'",
            )
        extra = {k: v for k, v in versions.items() if k != "trl"}
        self._info = BackendInfo(name=self.name, version=trl_version, executable=sys.executable, extra=extra)
        return self._info

    def adapt_space(self, space: SearchSpace) -> tuple[SearchSpace, list[str]]:
        """Without DeepSpeed installed, ZeRO stays off (its knobs would only crash trials)."""
        if "zero_stage" in space and importlib.util.find_spec("deepspeed") is None:
            return space.narrow({"zero_stage": [0]}), [
                "knob zero_stage fixed at 0: DeepSpeed is not installed (pip install 'autotune-grpo[deepspeed]')"
            ]
        return space, []

    # -------------------------------------------------------------------------------- semantics

    @staticmethod
    def _vllm_mode(ctx: TrialContext) -> str:
        return str(ctx.fixed.get("vllm_mode", "colocate"))

    def _value(self, params: Mapping[str, object], name: str) -> Any:
        return params[name] if name in params else self.knob_defaults()[name]

    def _world_size(self, params: dict[str, Any], ctx: TrialContext) -> int:
        if ctx.cpu_only:
            return int(self._value(params, "num_processes"))
        return len(ctx.gpus)

    def derive(self, params: dict[str, Any], ctx: TrialContext) -> dict[str, Any]:
        """``world_size`` and, when the global batch splits evenly, ``gradient_accumulation_steps``."""
        world = self._world_size(params, ctx)
        pdbs = int(self._value(params, "per_device_train_batch_size"))
        derived: dict[str, Any] = {"world_size": world}
        per_micro_step = pdbs * world
        if per_micro_step > 0 and ctx.global_batch % per_micro_step == 0:
            derived["gradient_accumulation_steps"] = ctx.global_batch // per_micro_step
        return derived

    def check_rules(
        self, params: dict[str, Any], derived: dict[str, Any], ctx: TrialContext
    ) -> list[RuleViolation]:
        """TRL's start-up rules (GRPOConfig.__post_init__ and the vLLM set-up), checked before launch."""
        out: list[RuleViolation] = []
        world = int(derived.get("world_size", self._world_size(params, ctx)))
        pdbs = int(self._value(params, "per_device_train_batch_size"))
        if world < 1:
            out.append(
                RuleViolation("world_size_positive", f"world_size_positive: world size is {world}, need ≥ 1")
            )
        elif pdbs < 1 or ctx.global_batch % (pdbs * world) != 0:
            out.append(
                RuleViolation(
                    "global_batch_divisible",
                    f"global_batch_divisible: global batch {ctx.global_batch} is not a multiple of "
                    f"per_device_train_batch_size {pdbs} × world size {world} = {pdbs * world}",
                )
            )
        if ctx.num_generations < 2:
            out.append(
                RuleViolation(
                    "num_generations_min",
                    f"num_generations_min: GRPO needs num_generations ≥ 2, got {ctx.num_generations}",
                )
            )
        elif ctx.global_batch % ctx.num_generations != 0:
            out.append(
                RuleViolation(
                    "generation_batch_divisible",
                    f"generation_batch_divisible: generation batch {ctx.global_batch} is not a multiple of "
                    f"num_generations {ctx.num_generations}",
                )
            )
        zero = int(self._value(params, "zero_stage"))
        if zero not in (0, 1, 2, 3):
            out.append(
                RuleViolation("zero_stage_known", f"zero_stage_known: ZeRO stage {zero} is not 0, 1, 2 or 3")
            )
        if self._value(params, "offload_optimizer") and zero < 2:
            out.append(
                RuleViolation(
                    "offload_optimizer_needs_zero",
                    f"offload_optimizer_needs_zero: optimizer offload needs ZeRO stage 2 or 3, got {zero}",
                )
            )
        if self._value(params, "offload_param") and zero != 3:
            out.append(
                RuleViolation(
                    "offload_param_needs_zero3",
                    f"offload_param_needs_zero3: parameter offload needs ZeRO stage 3, got {zero}",
                )
            )
        if self._value(params, "use_vllm"):
            out += [
                RuleViolation(rule, message)
                for rule, message in vllm_refusals(
                    cpu_only=ctx.cpu_only,
                    versions=self._info.extra if self._info is not None else None,
                    server=self._vllm_mode(ctx) == "server",
                    sleep=bool(self._value(params, "vllm_enable_sleep_mode")),
                )
            ]
            tp = int(self._value(params, "vllm_tensor_parallel_size"))
            if tp < 1 or world % tp != 0:
                out.append(
                    RuleViolation(
                        "vllm_tp_divides_world",
                        f"vllm_tp_divides_world: vllm_tensor_parallel_size {tp} does not divide world size {world}",
                    )
                )
        return out

    def baseline(self, defaults: dict[str, Any], ctx: TrialContext) -> dict[str, Any]:
        """TRL's defaults, with the largest per-device batch ≤ the default that keeps the global batch."""
        out = dict(defaults)
        world = max(1, self._world_size(out, ctx))
        pdbs = int(self._value(out, "per_device_train_batch_size"))
        while pdbs > 1 and ctx.global_batch % (pdbs * world) != 0:
            pdbs -= 1
        out["per_device_train_batch_size"] = pdbs
        return out

    # -------------------------------------------------------------------------------- rendering

    def grpo_kwargs(
        self, params: dict[str, Any], derived: dict[str, Any], ctx: TrialContext
    ) -> dict[str, Any]:
        """The ``GRPOConfig`` keyword arguments of a trial (the user's fixed ones included)."""
        fixed = {k: v for k, v in ctx.fixed.items() if k not in ("reward_funcs", "dataset", *SCRIPT_KEEPS)}
        fields = installed_fields()
        if fields is not None:  # GRPOConfig's and ModelConfig's (the worker splits them); no accelerate keys
            fixed = {k: v for k, v in fixed.items() if fields.kind(k) in ("grpo", "model")}
        kwargs: dict[str, Any] = {"disable_tqdm": True}
        if ctx.cpu_only:
            kwargs.update(bf16=False, fp16=False)
        kwargs.update({k: v for k, v in fixed.items() if k not in _OWNED})
        generation_kwargs = dict(fixed.get("generation_kwargs") or {})
        if self._value(params, "use_vllm"):  # vLLM's SamplingParams takes the kwargs: its names
            generation_kwargs = sampling_kwargs(generation_kwargs, min_tokens=ctx.max_completion_length)
        else:
            generation_kwargs["min_new_tokens"] = ctx.max_completion_length
        kwargs.update(
            output_dir=str(trial_path(ctx, "output")),
            use_cpu=ctx.cpu_only,
            report_to=list(ctx.report_to) or "none",
            save_strategy="no",
            logging_steps=1,
            max_steps=ctx.max_steps,
            seed=ctx.seed,
            num_generations=ctx.num_generations,
            max_completion_length=ctx.max_completion_length,
            generation_kwargs=generation_kwargs,
            per_device_train_batch_size=int(self._value(params, "per_device_train_batch_size")),
            gradient_accumulation_steps=int(derived["gradient_accumulation_steps"]),
            gradient_checkpointing=bool(self._value(params, "gradient_checkpointing")),
            dataloader_num_workers=int(self._value(params, "dataloader_num_workers")),
        )
        if ctx.report_to:
            kwargs["run_name"] = ctx.run_name
        if int(self._value(params, "zero_stage")) > 0:
            kwargs["deepspeed"] = str(trial_path(ctx, DS_CONFIG_FILE))
        if self._value(params, "use_vllm"):
            kwargs.update(
                use_vllm=True,
                vllm_mode=self._vllm_mode(ctx),
                vllm_gpu_memory_utilization=float(self._value(params, "vllm_gpu_memory_utilization")),
                vllm_enable_sleep_mode=bool(self._value(params, "vllm_enable_sleep_mode")),
                vllm_tensor_parallel_size=int(self._value(params, "vllm_tensor_parallel_size")),
            )
        return kwargs

    def render(self, spec: TrialSpec, ctx: TrialContext) -> LaunchPlan:
        """Write ``trial_config.json`` (and ``ds_config.json``, ``prompts.jsonl``) into the trial directory."""
        params = dict(spec.params)
        derived = {**self.derive(params, ctx), **spec.derived}
        violations = self.rules(params, derived, ctx)
        if violations:
            raise BackendError(
                f"trial {spec.number} breaks TRL's rules: {violations[0].message}",
                hint="The study screens these out before rendering; report this as a bug",
            )
        world = int(derived["world_size"])
        zero = int(self._value(params, "zero_stage"))
        ctx.trial_dir.mkdir(parents=True, exist_ok=True)
        named = ctx.dataset or ctx.fixed.get("dataset_name")  # --dataset, else the job's dataset_name
        if named:
            local = Path(str(named)).expanduser()
            dataset = str(local.resolve()) if local.exists() else str(named)
        else:
            from autotune.workload.datasets import write_prompts

            n_prompts = min(
                4096, max(64, math.ceil(ctx.max_steps * ctx.global_batch / max(1, ctx.num_generations)))
            )
            dataset = str(write_prompts(trial_path(ctx, PROMPTS_FILE), n_prompts, ctx.seed, style="prompt"))
        if zero > 0:
            config = ds_config(
                zero,
                offload_optimizer=bool(self._value(params, "offload_optimizer")),
                offload_param=bool(self._value(params, "offload_param")),
                cpu_only=ctx.cpu_only,
            )
            write_text_atomic(trial_path(ctx, DS_CONFIG_FILE), json.dumps(config, indent=2) + "\n")
        rewards = _rewards(ctx.fixed)
        grpo_config, secret_env = _secrets_to_env(self.grpo_kwargs(params, derived, ctx))
        worker_config = {
            "model": ctx.model.path_or_id,
            "dataset": dataset,
            "metrics_path": str(trial_path(ctx, METRICS_FILE)),
            "samples_per_step": ctx.global_batch,
            "reward_funcs": [rewards] if isinstance(rewards, str) else list(rewards),
            "grpo_config": grpo_config,
            # secret arguments (a hub token) reach the worker through its environment, never this file
            "secret_env": {name: var for name, (var, _) in secret_env.items()},
        }
        config_path = trial_path(ctx, CONFIG_FILE)
        write_text_atomic(config_path, json.dumps(worker_config, indent=2, default=str) + "\n")

        worker = ["-m", "autotune.backends.trl_worker", str(config_path)]
        if world > 1 or zero > 0:
            rendezvous = (
                ["--master_addr", "127.0.0.1", "--master_port", str(ctx.master_port)]
                if ctx.master_port
                else ["--standalone"]
            )
            argv = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "1",
                "--nproc_per_node",
                str(world),
            ]
            argv += [*rendezvous, *worker]
        else:
            argv = [sys.executable, *worker]
        gpu = self.trial_env(spec, ctx)
        return LaunchPlan(
            argv=tuple(argv),
            env={
                **self._env(ctx, world, zero),
                **gpu.env,
                **self._vllm_env(params, ctx),
                **dict(secret_env.values()),
            },
            unset_env=gpu.unset,
            cwd=str(ctx.trial_dir),
            metrics_paths=(str(trial_path(ctx, METRICS_FILE)),),
            world_size=world,
        )

    def _vllm_env(self, params: Mapping[str, object], ctx: TrialContext) -> dict[str, str]:
        """On CPU, an engine over several processes binds one core list to each (vLLM's default asserts)."""
        if not (ctx.cpu_only and self._value(params, "use_vllm")):
            return {}
        binding = cpu_thread_binding(int(self._value(params, "vllm_tensor_parallel_size")))
        return {"VLLM_CPU_OMP_THREADS_BIND": binding} if binding else {}

    def _env(self, ctx: TrialContext, world: int, zero: int) -> dict[str, str]:
        env = {
            "AUTOTUNE_PHASES_FILE": str(trial_path(ctx, PHASES_FILE)),
            "PYTHONUNBUFFERED": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        if ctx.master_port:
            env["MASTER_PORT"] = str(ctx.master_port)
        if "TORCH_EXTENSIONS_DIR" not in os.environ:
            # DeepSpeed compiles its CPU ops (cpu_adam, ...) on first use (minutes): keep them in the
            # user's autotune cache so they compile once per machine, not once per study or trial.
            from autotune.cachedir import default_cache_dir

            env["TORCH_EXTENSIONS_DIR"] = str(default_cache_dir() / "torch_extensions")
        if ctx.cpu_only:
            # the trial's cores, each rank pinned to its share of them (trl_worker), one OpenMP thread per
            # core of the share; a user's own thread count holds, and the launch plan records both
            cores = usable_cores()
            env[CORES_ENV] = format_cores(cores)
            env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS") or str(
                max(1, len(cores) // max(1, world))
            )
            if zero > 0:
                env["DS_ACCELERATOR"] = "cpu"
        if ctx.model.local and _everything_local(ctx):
            env["HF_HUB_OFFLINE"] = "1"  # everything is on disk: never wait on a hub
        return env

    def parser(self, spec: TrialSpec, ctx: TrialContext) -> StepParser:
        return TrlMetricsParser(trial_path(ctx, METRICS_FILE), trial_path(ctx, PHASES_FILE))

    def phase_frames(self) -> tuple[PhaseFrame, ...]:
        """GRPOTrainer's phase methods (trl/trainer/grpo_trainer.py, trl/generation/vllm_generation.py,
        TRL 1.x): weights reach vLLM in ``VLLMGeneration.sync_weights`` (older releases:
        ``_move_model_to_vllm``), completions come from ``_generate_single_turn`` / ``_generate``, the
        loss from ``compute_loss`` / ``_compute_loss`` inside ``training_step``. The reference and old
        log-probs (``_get_per_token_logps_and_entropies``) run in both rollout and training, so they name
        no phase; ``training_step`` is the outermost fallback."""
        return (
            PhaseFrame(
                "weight_sync", r"trl/[^:]*:(sync_weights|_move_model_to_vllm|_sync_fsdp\w*_params_to_vllm)$"
            ),
            PhaseFrame("rollout", r"trl/[^:]*:(_generate_single_turn|_generate|_tool_call_loop)$"),
            PhaseFrame("train", r"trl/[^:]*:(_compute_loss|compute_loss|training_step)$"),
        )

    def failure_patterns(self) -> tuple[FailurePattern, ...]:
        """GRPOConfig's and TRL's own start-up errors (all mean: these arguments cannot work)."""
        invalid = "TRL rejected the configuration"
        return (
            FailurePattern("INVALID", r"generation_batch_size \(\d+\) must be divisible by", invalid),
            FailurePattern("INVALID", r"GRPO requires at least 2 generations per prompt", invalid),
            FailurePattern("INVALID", r"must be divisible by the number of generations", invalid),
            FailurePattern(
                "INVALID", r"'generation_batch_size' and 'steps_per_generation' can not be both", invalid
            ),
            FailurePattern("INVALID", r"tensor_parallel_size \(\d+\) must divide world size", invalid),
            FailurePattern("INVALID", r"auto_find_batch_size is not supported by GRPO", invalid),
            FailurePattern(
                "INVALID",
                r"GRPOConfig\.__init__\(\) got an unexpected keyword argument",
                "a fixed argument is not a GRPOConfig field of the installed TRL",
            ),
            FailurePattern(
                "INVALID", r"autotune trl_worker: cannot (?:import reward|read trial config)", invalid
            ),
        )
