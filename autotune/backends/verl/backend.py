"""The verl backend: trials are real ``python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo`` runs.

Every knob of ``search_spaces/verl.yaml`` is a verl hydra key, rendered as ``key=value`` on the command
line. The user's own overrides (``--fixed job.yaml`` with dotted keys, or ``key=value`` items after
``--``) hold for every trial; a trial's knobs win over them. autotune controls what makes a trial short and
comparable: the global batch (``data.train_batch_size`` × ``actor_rollout_ref.rollout.n``, with
``ppo_mini_batch_size`` = the train batch: one optimizer step per batch), ``trainer.total_training_steps``,
no checkpoint (``trainer.save_freq=-1``), no validation (``trainer.test_freq=-1``,
``trainer.val_before_train=False``), the console logger only, and the GPUs (``trainer.n_gpus_per_node``).

verl 0.9.1 needs a GPU: its resource pool asks Ray for GPU bundles, so the study refuses to start without
one (:attr:`VerlBackend.needs_gpu`); ``autotune plan --backend verl`` works anywhere.

The start-up rules verl enforces are checked before launch (:meth:`VerlBackend.check_rules`), each with
the verl function that raises it. Step records come from verl's console lines
(:mod:`autotune.backends.verl._log`); failures from the text Ray wraps them in (:data:`FAILURE_PATTERNS`).
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from autotune.backends._base import (
    Backend,
    BackendInfo,
    FailurePattern,
    PhaseFrame,
    RuleViolation,
    StepParser,
    TrialContext,
)
from autotune.backends._env import usable_cores
from autotune.backends._versions import installed_versions
from autotune.backends.verl._hydra import check_overrides
from autotune.backends.verl._log import FAILURE_PATTERNS, VerlLogParser
from autotune.backends.verl.config import (
    AR,
    DYNAMIC_BSZ,
    KNOB_FIELDS,
    LOG_PROB_MICRO,
    LORA_RANK,
    MAX_TOKENS,
    PPO_MICRO,
    PROMPT_LEN,
    REF_LOG_PROB_MICRO,
    ROLLOUT_TP,
    VERL_FACTS,
    describe_verl,
)
from autotune.errors import BackendError, UsageError
from autotune.jobconfig import JobConfig
from autotune.jobsemantics import FrameworkJobDefaults
from autotune.records import LaunchPlan, TrialSpec
from autotune.values import as_bool, as_int, none_like, whole_number

__all__ = ["CONTROLLED", "VerlBackend", "parse_overrides"]

INSTALL_HINT = (
    "Install verl 0.9.1 with its GPU stack (pip install verl[vllm]) or pass its python with --executable"
)
MIN_VERSION = (0, 9)
#: distributions verl 0.9's trainer imports at start-up but ships only in its ``verl-core`` extra
#: (``trainer/main_ppo.py``: ``import transfer_queue``; METADATA: ``TransferQueue``, ``tensordict``)
CORE_DISTRIBUTIONS = ("TransferQueue", "tensordict")
REWARD_FILE = "autotune_verl_reward.py"
PROMPTS_FILE = "prompts.jsonl"
#: verl's ``ray.init`` keywords (``ray_kwargs.ray_init``; the yaml has only ``num_cpus``, so the
#: dashboard switch is added with hydra's ``+``)
RAY_DASHBOARD = "+ray_kwargs.ray_init.include_dashboard"
RAY_CPUS = "ray_kwargs.ray_init.num_cpus"
#: CPUs verl 0.9.1's own actors reserve in Ray besides the per-GPU bundles: the TaskRunner, 8
#: agent-loop workers (``rollout.agent.num_workers``) and reward workers
_RAY_CPUS_BESIDE_GPUS = 16


def ray_cpus(n_gpus: int) -> int:
    """The CPUs a verl trial's Ray cluster is told it has: the cores this process may use, and at least
    what verl's placement asks for (3 per GPU bundle, ``max_colocate_count``, plus its other actors),
    so a small host does not leave a placement group waiting. Ray's CPUs are a scheduling count, not a
    limit on threads."""
    return max(usable_cores(), 3 * n_gpus + _RAY_CPUS_BESIDE_GPUS)


#: knob order of search_spaces/verl.yaml.
_KNOBS: tuple[str, ...] = (
    DYNAMIC_BSZ,
    MAX_TOKENS,
    PPO_MICRO,
    LOG_PROB_MICRO,
    f"{AR}.model.enable_gradient_checkpointing",
    f"{AR}.actor.entropy_from_logits_with_chunking",
    f"{AR}.actor.entropy_checkpointing",
    f"{AR}.actor.fsdp_config.param_offload",
    f"{AR}.actor.fsdp_config.optimizer_offload",
    f"{AR}.rollout.gpu_memory_utilization",
    ROLLOUT_TP,
    f"{AR}.rollout.free_cache_engine",
    f"{AR}.rollout.enable_chunked_prefill",
    f"{AR}.rollout.max_num_batched_tokens",
)

#: overrides autotune sets for every trial; a fixed value for them is replaced (with a notice).
CONTROLLED: tuple[str, ...] = (
    "trainer.total_training_steps",
    "trainer.save_freq",
    "trainer.test_freq",
    "trainer.val_before_train",
    "trainer.logger",
    "trainer.nnodes",
    "trainer.n_gpus_per_node",
    "trainer.default_local_dir",
)
#: overrides that carry the study's batch shape: a fixed value must agree with the study's.
_SHAPE = (
    "data.train_batch_size",
    f"{AR}.actor.ppo_mini_batch_size",
    f"{AR}.rollout.n",
    "data.max_response_length",
)


def parse_overrides(argv: Sequence[str]) -> dict[str, Any]:
    """The hydra overrides after ``--``: ``key=value``, value text as typed.

    Hydra's ``+key=value`` (add a key verl's config lacks) and ``~key`` (delete one) are refused: a trial's
    settings must be keys of verl's own config, which the study records and exports by name.

    Raises:
        UsageError: an item that is no ``key=value`` override, or a key given twice.
    """
    out: dict[str, Any] = {}
    for item in argv:
        key, eq, value = item.partition("=")
        name = key.strip()
        if name.startswith(("+", "~")):
            raise UsageError(
                f"{item!r} after -- adds or deletes a key of verl's config",
                hint="Give keys verl's ppo_trainer config has, as key=value",
            )
        if not eq or not name or not all(part.isidentifier() for part in name.split(".")):
            raise UsageError(
                f"{item!r} after -- is not a hydra override (key=value)",
                hint="Give verl's overrides as key=value, e.g. -- actor_rollout_ref.actor.optim.lr=1e-6",
            )
        if name in out:
            raise UsageError(f"override {name} is given twice", hint="Give each fixed override once")
        out[name] = value
    return out


def _flatten(values: Mapping[str, object], prefix: str = "") -> dict[str, Any]:
    """``{data: {train_files: x}}`` → ``{"data.train_files": x}`` (a YAML file may nest verl's keys).

    Raises:
        UsageError: one key given twice, dotted and nested, with two different values.
    """
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        items = _flatten(value, f"{name}.") if isinstance(value, Mapping) and value else {name: value}
        for flat, item in items.items():
            if flat in out and out[flat] != item:
                raise UsageError(
                    f"override {flat} is given twice, dotted and nested, as {out[flat]!r} and {item!r}",
                    hint="Give each override once, either dotted (a.b: 1) or nested (a: {b: 1})",
                )
            out[flat] = item
    return out


def override_value(value: object) -> str:
    """A value as hydra's override grammar reads it (booleans lower-case, lists bracketed, text as is)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        return format(value, ".10g")
    if isinstance(value, list | tuple):
        return "[" + ",".join(override_value(v) for v in value) + "]"
    return str(value)


class VerlBackend(Backend):
    """verl GRPO through ``python3 -m verl.trainer.main_ppo``.

    Args:
        python: the interpreter verl is installed in; default ``python3`` beside this one or on PATH.
    """

    name: ClassVar[str] = "verl"
    display_name: ClassVar[str] = "verl"
    space_name: ClassVar[str | None] = "verl"
    knob_names: ClassVar[frozenset[str] | None] = frozenset(_KNOBS)
    knob_fields = KNOB_FIELDS
    needs_gpu: ClassVar[bool] = True
    # verl 0.9.1's ppo_trainer.yaml: data.train_batch_size 1024 prompts, data.max_response_length 512;
    # its rollout.n defaults to 1, which is not GRPO (verl's GRPO docs: n > 1), so n is 8 as in plan.
    job_command = ("verl.trainer.main_ppo", "main_ppo.py")
    job_defaults = FrameworkJobDefaults(
        framework="verl's ppo_trainer.yaml",
        num_generations=8,
        max_completion_length=512,
        prompts_per_step=1024,
        note="rollout.n 1 is not GRPO: 8",
    )

    def __init__(self, python: str | None = None) -> None:
        self._python = python
        self._info: BackendInfo | None = None

    @classmethod
    def from_cli(
        cls,
        *,
        command: tuple[str, ...] = (),
        space: str | None = None,
        metrics_file: str | None = None,
        executable: str | None = None,
    ) -> VerlBackend:
        """``--executable`` names the python interpreter verl is installed in."""
        return cls(python=executable)

    @classmethod
    def describe(
        cls,
        params: Mapping[str, object],
        derived: Mapping[str, object],
        fixed: Mapping[str, object],
        n_gpus: int,
    ) -> JobConfig:
        """What verl's knobs and overrides mean (:func:`describe_verl`)."""
        return describe_verl(params, derived, _flatten(fixed), n_gpus, cls.knob_defaults())

    @classmethod
    def lora_args(cls, rank: int) -> dict[str, Any]:
        """``actor_rollout_ref.model.lora_rank=N``."""
        return {LORA_RANK: rank}

    @classmethod
    def parse_fixed_argv(cls, argv: Sequence[str], place: str = "your arguments after --") -> dict[str, Any]:
        """verl takes hydra overrides, ``key=value``, after ``--``."""
        return parse_overrides(argv)

    @classmethod
    def canonical_args(cls, args: Mapping[str, object]) -> dict[str, Any]:
        """Nested YAML mappings as dotted hydra keys."""
        return _flatten(args)

    @classmethod
    def uses_demo_reward(cls, fixed: Mapping[str, object]) -> bool:
        """True unless the user names a reward function (``reward.custom_reward_function.path``)."""
        return not any(k.startswith("reward.custom_reward_function") for k in _flatten(fixed))

    # ------------------------------------------------------------------ discovery
    def trial_python(self) -> str:
        """``--executable`` (the interpreter verl is installed in), else autotune's own.

        Raises:
            BackendError: the interpreter named does not exist.
        """
        return self._interpreter()

    def _interpreter(self) -> str:
        if self._python:
            found = shutil.which(self._python) or (self._python if Path(self._python).is_file() else None)
            if found is None:
                raise BackendError(f"the python {self._python!r} for verl does not exist", hint=INSTALL_HINT)
            return found
        return sys.executable

    def probe(self) -> BackendInfo:
        """Find verl in its interpreter and read its version.

        Raises:
            BackendError: verl is not installed there, or is older than 0.9.
        """
        python = self._interpreter()
        versions = installed_versions(
            python,
            ("verl", "vllm", "sglang", "ray", "torch", *CORE_DISTRIBUTIONS),
            framework="verl",
            hint=INSTALL_HINT,
        )
        version = versions.get("verl")
        if not version:
            raise BackendError(f"verl is not installed for {python}", hint=INSTALL_HINT)
        parts = tuple(int(x) for x in version.split(".")[:2] if x.isdigit())
        if parts < MIN_VERSION:
            raise BackendError(
                f"verl {version} is too old for autotune (needs 0.9 or newer: the knobs are 0.9's)",
                hint="Upgrade it with: pip install -U verl",
            )
        missing = [name for name in CORE_DISTRIBUTIONS if not versions.get(name)]
        if missing:
            raise BackendError(
                f"verl {version} cannot start a trial: {' and '.join(missing)} missing for {python} "
                "(verl's trainer imports transfer_queue at start-up; both ship in verl's verl-core extra)",
                hint='Install them with: pip install "verl[verl-core]"',
            )
        extra = {"python": python, **{k: v for k, v in versions.items() if v and k != "verl"}}
        self._info = BackendInfo(name=self.name, version=version, executable=python, extra=extra)
        return self._info

    # ------------------------------------------------------------------ configuration
    def _fixed(self, ctx: TrialContext) -> dict[str, Any]:
        return _flatten(ctx.fixed)

    def _effective(self, params: Mapping[str, object], ctx: TrialContext) -> dict[str, Any]:
        eff = self._fixed(ctx)
        eff.update(params)
        return eff

    def derive(self, params: dict[str, Any], ctx: TrialContext) -> dict[str, Any]:
        world = max(1, len(ctx.gpus))
        derived: dict[str, Any] = {"world_size": world}
        micro = as_int(self._effective(params, ctx).get(PPO_MICRO))
        per_gpu, rest = divmod(ctx.global_batch, world)
        if micro and not rest and per_gpu % micro == 0:
            derived["gradient_accumulation_steps"] = per_gpu // micro
        return derived

    def baseline(self, defaults: dict[str, Any], ctx: TrialContext) -> dict[str, Any]:
        """verl's defaults; its null micro-batch sizes (required without dynamic batch size) become 1."""
        params = dict(defaults)
        for name in (PPO_MICRO, LOG_PROB_MICRO):
            if name in params and params[name] is None:
                params[name] = 1
        return params

    def check_rules(
        self, params: dict[str, Any], derived: dict[str, Any], ctx: TrialContext
    ) -> list[RuleViolation]:
        """verl 0.9.1's start-up rules that ``params`` break, each named after the check that raises it."""
        eff = self._effective(params, ctx)
        out: list[RuleViolation] = []
        world = int(derived.get("world_size") or max(1, len(ctx.gpus)))
        if ctx.cpu_only:
            out.append(
                RuleViolation("verl_needs_gpu", "verl needs GPUs: its resource pool asks Ray for GPU bundles")
            )
        G, B = ctx.num_generations, ctx.global_batch
        dynamic = as_bool(eff.get(DYNAMIC_BSZ))
        # verl/utils/config.py::validate_config: real_train_batch_size (train_batch_size × n) must be
        # divisible by the minimal batch (the GPU count under FSDP) when dynamic batch size is off;
        # verl/workers/engine_workers.py::TrainingWorker.train_mini_batch asserts the mini-batch
        # (ppo_mini_batch_size × n, here the global batch) divides over the data-parallel ranks always.
        if B % world:
            out.append(
                RuleViolation(
                    "batch_divisible_by_gpus",
                    f"global batch {B} (data.train_batch_size × rollout.n) is not divisible by {world} GPUs",
                )
            )
        per_gpu = B // world if B % world == 0 else None
        if not dynamic:
            for name, where in (
                (PPO_MICRO, "verl/workers/config/actor.py::ActorConfig.__post_init__"),
                (LOG_PROB_MICRO, "verl/utils/config.py::validate_config (check_mutually_exclusive)"),
            ):
                micro = as_int(eff.get(name))
                if micro is None or micro < 1:
                    out.append(
                        RuleViolation(
                            "micro_batch_required",
                            f"{name} must be set (a positive number) without dynamic batch size ({where})",
                        )
                    )
                elif per_gpu is not None and per_gpu % micro:
                    # verl/workers/engine/utils.py::prepare_micro_batches: the per-GPU batch splits into
                    # whole micro-batches.
                    out.append(
                        RuleViolation(
                            "micro_batch_divides_per_gpu_batch",
                            f"{name} {micro} does not divide the per-GPU batch {per_gpu} (global batch {B} over "
                            f"{world} GPUs)",
                        )
                    )
        else:
            budget = as_int(eff.get(MAX_TOKENS)) or int(self.knob_defaults().get(MAX_TOKENS) or 16384)
            seq = self._seq_len(eff, ctx)
            if budget < seq:
                # verl/utils/seqlen_balancing.py::rearrange_micro_batches: max_token_len must be at least
                # the longest sequence.
                out.append(
                    RuleViolation(
                        "token_budget_holds_a_sequence",
                        f"{MAX_TOKENS} {budget} is below one sequence of prompt + response = {seq} tokens",
                    )
                )
        tp = as_int(eff.get(ROLLOUT_TP)) or 1
        if tp < 1 or world % tp:
            # verl/workers/engine_workers.py::ActorRolloutRefWorker.init_model asserts the rollout world
            # (GPUs) divides by tensor × data × pipeline parallel sizes.
            out.append(
                RuleViolation(
                    "rollout_tp_divides_gpus",
                    f"{ROLLOUT_TP} {tp} does not divide the {world} GPUs",
                )
            )
        # vLLM's TP dividing the attention heads is a rule every backend shares (Backend.rules)
        if G < 2:
            out.append(RuleViolation("num_generations_min", f"rollout.n is {G}; GRPO needs at least 2"))
        return out

    @staticmethod
    def _seq_len(eff: Mapping[str, object], ctx: TrialContext) -> int:
        prompt = as_int(eff.get(PROMPT_LEN)) or int(VERL_FACTS[PROMPT_LEN])
        return prompt + ctx.max_completion_length

    def check_flags(
        self, params: dict[str, Any], fixed: dict[str, Any], ctx: TrialContext | None = None
    ) -> list[str]:
        """Refuse fixed overrides that contradict the study's batch shape; say which ones trials replace.

        Raises:
            UnknownFlag: a key verl's config does not have (hydra, :func:`check_overrides`).
            UsageError: a value verl's config refuses.
            BackendError: a fixed ``rollout.n``, train or mini batch size or response length that differs
                from the study's own, or a model path among the fixed overrides.
        """
        flat = _flatten(fixed)
        check_overrides(self._interpreter(), {k: override_value(v) for k, v in flat.items()})
        if f"{AR}.model.path" in flat:
            raise BackendError(
                f"{AR}.model.path is among the fixed overrides", hint="Give the model with autotune's --model"
            )
        adv = flat.get("algorithm.adv_estimator")
        if adv is not None and str(adv) != "grpo":
            raise BackendError(
                f"algorithm.adv_estimator={adv} is fixed, but autotune tunes GRPO runs",
                hint="Remove algorithm.adv_estimator from the fixed overrides",
            )
        if ctx is not None:
            own = self._shape(ctx)
            for name in _SHAPE:
                if name in flat and as_int(flat[name]) != own[name]:
                    raise BackendError(
                        f"{name}={flat[name]} in the fixed overrides differs from the study's {own[name]}",
                        hint="Set the batch with --global-batch and --num-generations, the length with "
                        "--max-completion-length",
                    )
        notes = [
            f"{name} from the fixed overrides is replaced by autotune's own value in trials"
            for name in CONTROLLED
            if name in flat
        ]
        notes += [
            f"{name} is a tuned knob: trials set their own value (the fixed one holds where it is not tuned)"
            for name in sorted(set(params) & set(flat))
        ]
        return notes

    @classmethod
    def job_semantics(cls, args: Mapping[str, object], n_gpus: int) -> dict[str, tuple[int, str]]:
        """verl's names for the job's semantics: ``rollout.n``, ``data.max_response_length``, and the
        global batch as ``data.train_batch_size`` prompts × ``rollout.n`` (nested YAML keys too)."""
        flat = {k: v for k, v in _flatten(args).items() if not none_like(v)}
        out: dict[str, tuple[int, str]] = {}
        n_key, len_key, prompts_key = f"{AR}.rollout.n", "data.max_response_length", "data.train_batch_size"
        if n_key in flat:
            out["num_generations"] = (whole_number(flat[n_key], n_key), n_key)
        if len_key in flat:
            out["max_completion_length"] = (whole_number(flat[len_key], len_key), len_key)
        if prompts_key in flat and n_key in flat:
            prompts = whole_number(flat[prompts_key], prompts_key)
            out["global_batch"] = (prompts * out["num_generations"][0], f"{prompts_key} × {n_key}")
        return out

    @staticmethod
    def _shape(ctx: TrialContext) -> dict[str, int]:
        prompts = ctx.global_batch // max(1, ctx.num_generations)
        return {
            "data.train_batch_size": prompts,
            f"{AR}.actor.ppo_mini_batch_size": prompts,
            f"{AR}.rollout.n": ctx.num_generations,
            "data.max_response_length": ctx.max_completion_length,
        }

    # ------------------------------------------------------------------ rendering
    def render(self, spec: TrialSpec, ctx: TrialContext) -> LaunchPlan:
        """``python3 -m verl.trainer.main_ppo`` with the trial's overrides; writes only inside the trial
        directory (the generated prompts and the demo reward, when the job uses them)."""
        overrides = self.overrides(spec, ctx, write=True)
        python = self._info.executable if self._info and self._info.executable else self._python or "python3"
        world = int(spec.derived.get("world_size") or max(1, len(ctx.gpus)))
        gpu = self.trial_env(spec, ctx)
        env = {
            "PYTHONUNBUFFERED": "1",
            # every rank's lines, not Ray's "[repeated Nx across cluster]" summaries
            "RAY_DEDUP_LOGS": "0",
            # a cluster of the trial's own: never one the host's RAY_ADDRESS or `ray start` left running,
            # whose GPUs are not the trial's (Ray's canonicalize_bootstrap_address: "local" starts one)
            "RAY_ADDRESS": "local",
            "CUDA_VISIBLE_DEVICES": ctx.cuda_visible_devices,
            **gpu.env,
        }
        return LaunchPlan(
            argv=(python, "-m", "verl.trainer.main_ppo", *(f"{k}={override_value(v)}" for k, v in overrides)),
            env=env,
            cwd=str(ctx.trial_dir),
            world_size=world,
            unset_env=gpu.unset,
        )

    def overrides(self, spec: TrialSpec, ctx: TrialContext, *, write: bool = False) -> list[tuple[str, Any]]:
        """The trial's hydra overrides, in order: what autotune sets, the knobs, the user's fixed ones.

        Args:
            write: write the generated prompts and the demo reward into the trial directory (render
                does; tests of the override list do not need to).
        """
        fixed = self._fixed(ctx)
        out: list[tuple[str, Any]] = [
            ("algorithm.adv_estimator", "grpo"),
            (f"{AR}.model.path", ctx.model.path_or_id),
        ]
        emitted = {k for k, _ in out}

        def add(key: str, value: object) -> None:
            if key not in emitted:
                emitted.add(key)
                out.append((key, value))

        if "data.train_files" not in fixed:
            data = ctx.dataset or str(self._write_prompts(ctx) if write else ctx.trial_dir / PROMPTS_FILE)
            add("data.train_files", data)
            add("data.val_files", data)
        for key, value in self._shape(ctx).items():
            add(key, value)
        add(f"{AR}.rollout.name", fixed.get(f"{AR}.rollout.name", VERL_FACTS["rollout_name"]))
        params = dict(spec.params)
        for name in _KNOBS:
            if name in params and not none_like(params[name]):
                add(name, params[name])
                if name == LOG_PROB_MICRO:
                    add(REF_LOG_PROB_MICRO, params[name])
        controlled: dict[str, Any] = {
            "trainer.total_training_steps": ctx.max_steps,
            "trainer.save_freq": -1,
            "trainer.test_freq": -1,
            "trainer.val_before_train": False,
            "trainer.logger": ["console", *ctx.report_to],
            **(
                {"trainer.project_name": ctx.project, "trainer.experiment_name": ctx.run_name}
                if ctx.report_to
                else {}
            ),
            "trainer.nnodes": 1,
            "trainer.n_gpus_per_node": max(1, len(ctx.gpus)),
            "trainer.default_local_dir": str(ctx.trial_dir / "checkpoints"),
            # every completion runs to max_response_length, as TRL trials do (min_new_tokens): step
            # times of two trials then compare the same work, not the lengths each happened to sample
            f"{AR}.rollout.ignore_eos": True,
            # the trial's own Ray cluster (RAY_ADDRESS=local) without a dashboard, whose agent's fixed
            # port clashes between two trials at once (ray-project/ray#34886), and with an explicit CPU
            # count instead of Ray's guess of the host's
            RAY_DASHBOARD: False,
            RAY_CPUS: ray_cpus(max(1, len(ctx.gpus))),
        }
        for key, value in controlled.items():
            add(key, value)
        if self.uses_demo_reward(fixed):
            reward = ctx.trial_dir / REWARD_FILE
            if write:
                self._write_reward(reward)
            add("reward.custom_reward_function.path", str(reward))
            add("reward.custom_reward_function.name", "compute_score")
        for key, value in fixed.items():
            add(key, value)
        return out

    @staticmethod
    def _write_prompts(ctx: TrialContext) -> Path:
        """autotune's generated prompts in verl's columns (``prompt`` chat list, ``data_source``,
        ``reward_model.ground_truth``)."""
        from autotune.workload.datasets import generate_tasks

        prompts = max(1, ctx.global_batch // max(1, ctx.num_generations))
        rows = []
        for task in generate_tasks(max(32, ctx.max_steps * prompts + 16), ctx.seed):
            row = task.row("messages")
            rows.append(
                {
                    "data_source": "autotune",
                    "prompt": row["messages"],
                    "reward_model": {"style": "rule", "ground_truth": row["solution"]},
                }
            )
        path = ctx.trial_dir / PROMPTS_FILE
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        return path

    @staticmethod
    def _write_reward(path: Path) -> None:
        from autotune.backends.verl.export import reward_source

        path.write_text(reward_source(), encoding="utf-8")

    # ------------------------------------------------------------------ parsing
    def parser(self, spec: TrialSpec, ctx: TrialContext) -> StepParser:
        return VerlLogParser()

    def failure_patterns(self) -> tuple[FailurePattern, ...]:
        """Ray-wrapped failures and verl's own start-up refusals (:data:`FAILURE_PATTERNS`)."""
        return FAILURE_PATTERNS

    def phase_frames(self) -> tuple[PhaseFrame, ...]:
        """verl 0.9.1's phase methods (verl/trainer/ppo/v1/trainer_base.py and the workers): completions
        come from the agent loop's ``generate_sequences``, the log-prob passes and the update from the
        actor worker's ``compute_log_prob`` / ``update_actor``, weights reach vLLM in ``update_weights``."""
        return (
            PhaseFrame("weight_sync", r"verl/[^:]*:(update_weights|update_weights_from_ipc)$"),
            PhaseFrame("rollout", r"verl/[^:]*:(generate_sequences|_generate_sequences)$"),
            PhaseFrame("train", r"verl/[^:]*:(update_actor|train_mini_batch|train_batch|compute_log_prob)$"),
        )
