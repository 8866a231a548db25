"""The ms-swift backend: trials are real ``swift rlhf --rlhf_type grpo`` runs.

Every knob of ``search_spaces/swift.yaml`` is an ms-swift flag (``num_processes`` becomes
``NPROC_PER_NODE`` on CPU runs). Everything else about the user's job is fixed for all trials
(:mod:`autotune.fixed`): the dataset, reward functions, template, LoRA settings, beta … When the user
gives none, a CPU demo job is filled in: the tiny model's ``--model_type qwen2 --template qwen
--check_model false --tuner_type full``, autotune's generated prompts and its demo reward plugin.

A trial's knob values win over the fixed arguments, which win over ms-swift's defaults: knob flags among
the fixed arguments (the user's current setting) hold where the knob is not tuned. Flags that only mean
something with vLLM are left out of a trial without vLLM, and flags autotune controls (``--max_steps``,
``--logging_steps 1``, ``--output_dir`` in the trial directory …) replace the user's.

Flags are rendered for the installed ms-swift version (:mod:`autotune.backends.swift._args`): a flag
the version does not accept is reported by :meth:`SwiftBackend.check_flags` before any launch, and the
start-up validity rules ms-swift enforces (generation batch vs. ``num_generations``, vLLM TP vs. world
size, vLLM without a mode …) by :meth:`SwiftBackend.check_rules`, so an invalid combination never
costs a trial. Step records come from the stdout dict lines and ``logging.jsonl``
(:mod:`autotune.backends.swift._log`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping
from importlib.resources import as_file, files
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
from autotune.backends._versions import installed_versions
from autotune.backends._vllm import DISTRIBUTIONS as VLLM_DISTRIBUTIONS
from autotune.backends._vllm import cpu_thread_binding
from autotune.backends._vocab import SWIFT_KNOBS
from autotune.backends.swift._args import (
    MIN_VERSION,
    SwiftFlags,
    flag_items,
    introspect_flag_names,
    parse_version,
)
from autotune.backends.swift._log import SwiftLogParser
from autotune.backends.swift._rules import CONTROLLED_FLAGS, fixed_flag_notices, start_rules
from autotune.backends.swift.config import KNOB_FIELDS, PRESETS, canonical_args, describe_swift, preset_for
from autotune.errors import BackendError, UsageError
from autotune.fixed import flag_name
from autotune.jobconfig import JobConfig
from autotune.jobsemantics import FrameworkJobDefaults
from autotune.records import LaunchPlan, TrialSpec
from autotune.studydir import TrialDir
from autotune.values import as_bool, as_int

__all__ = ["SwiftBackend", "CONTROLLED_FLAGS", "VLLM_ONLY_FLAGS", "DEMO_REWARD"]

INSTALL_HINT = "Install it with: pip install 'autotune-grpo[swift]' (or pass the path of `swift`)"
DEMO_REWARD = "autotune_demo"
PLUGIN_ASSET = "swift_reward_plugin.py"
SYNC_SHIM = "vllm_cpu_sync.py"
PHASE_PLUGIN = "swift_phase_plugin.py"
PHASES_FILE = TrialDir.PHASES
#: the files a trial copies into its directory for ms-swift to load (``--external_plugins``)
_ASSETS = {
    PLUGIN_ASSET: files("autotune") / "assets" / PLUGIN_ASSET,  # "/": joinpath(a, b) is 3.11+
    SYNC_SHIM: files("autotune.backends") / SYNC_SHIM,
    PHASE_PLUGIN: files("autotune") / "assets" / PHASE_PLUGIN,
}

#: flags that only mean something with vLLM; dropped from a trial that runs without it.
VLLM_ONLY_FLAGS: frozenset[str] = frozenset(
    {"vllm_mode", "sleep_level", "offload_optimizer", "offload_model", "move_model_batches", "async_generate"}
)

#: the tiny model's flags (ms-swift cannot infer a model type from a locally built folder).
_TINY_DEFAULTS: dict[str, Any] = {
    "model_type": "qwen2",
    "template": "qwen",
    "check_model": False,
    "tuner_type": "full",
}


def _is_vllm_only(name: str) -> bool:
    return name in VLLM_ONLY_FLAGS or name.startswith("vllm_")


def _shebang_python(executable: str) -> str | None:
    """The interpreter named on the first line of a console script, when it names one directly."""
    try:
        with open(executable, "rb") as fh:
            first = fh.readline(4096).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    parts = first[2:].split()
    if not parts or os.path.basename(parts[0]) == "env":
        return None
    return parts[0]


class SwiftBackend(Backend):
    """ms-swift GRPO through the ``swift`` command.

    Args:
        executable: path of the ``swift`` command; default: ``swift`` on PATH.
        version: the ms-swift version to render for; default: detected by :meth:`probe` (or, without a
            probe, from the current interpreter's installed packages).
        python: the interpreter of that ms-swift; default: the one on the ``swift`` script's first line.
        flag_names: the flags the installed ms-swift accepts; default: asked from the installation
            once (10–20 s) and cached under ``flag_cache_dir``.
        flag_cache_dir: where the accepted-flags list is cached; default ``<autotune cache>/swift``.
        cpu_threads: ``OMP_NUM_THREADS`` per process on CPU runs; default 1.
        environ: the environment trials inherit (read only); default ``os.environ``.
        introspect: a function listing the flags of an installation (tests pass a fake).
    """

    name: ClassVar[str] = "swift"
    display_name: ClassVar[str] = "ms-swift"
    space_name: ClassVar[str | None] = "swift"
    knob_names: ClassVar[frozenset[str] | None] = frozenset(SWIFT_KNOBS)
    knob_fields = KNOB_FIELDS
    # ms-swift's GRPO arguments (swift/llm/argument/rlhf_args.py, GRPOArgumentsMixin / RLHFArguments):
    # num_generations 8, max_completion_length 512, per_device_train_batch_size 1, and
    # gradient_accumulation_steps 1 for GRPO. Its default generation batch (1 × world) fails its own
    # "divisible by num_generations" rule below 8 GPUs: raised to the smallest batch it accepts.
    job_command = ("swift", "rlhf")
    job_defaults = FrameworkJobDefaults(
        framework="ms-swift's GRPO",
        num_generations=8,
        max_completion_length=512,
        per_device_batch=1,
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
        """What ms-swift's knobs and flags mean (:func:`describe_swift`)."""
        return describe_swift(params, derived, fixed, n_gpus, cls.knob_defaults())

    @classmethod
    def from_cli(
        cls,
        *,
        command: tuple[str, ...] = (),
        space: str | None = None,
        metrics_file: str | None = None,
        executable: str | None = None,
    ) -> SwiftBackend:
        """``--executable`` names the ``swift`` command (default: on PATH)."""
        return cls(executable=executable) if executable else cls()

    @classmethod
    def lora_args(cls, rank: int) -> dict[str, Any]:
        """``--tuner_type lora --lora_rank N``."""
        return {"tuner_type": "lora", "lora_rank": rank}

    @classmethod
    def without_offload(cls, params: Mapping[str, object]) -> dict[str, Any]:
        """Offload off: a ``*_offload`` preset becomes the preset of the same ZeRO stage without offload."""
        out = super().without_offload(params)
        spec = PRESETS.get(str(out.get("deepspeed")))
        if spec is not None and (spec[1] or spec[2]):
            out["deepspeed"] = preset_for(spec[0], False, False)
        return out

    @classmethod
    def canonical_args(cls, args: Mapping[str, object]) -> dict[str, Any]:
        """One spelling of the tuner flag (3.x ``train_type``); the installed version's is chosen at render."""
        return canonical_args(args)

    def __init__(
        self,
        executable: str | None = None,
        *,
        version: str | None = None,
        python: str | None = None,
        flag_names: Iterable[str] | None = None,
        flag_cache_dir: Path | None = None,
        cpu_threads: int | None = None,
        environ: Mapping[str, str] | None = None,
        introspect: Callable[[str], frozenset[str]] = introspect_flag_names,
    ) -> None:
        if cpu_threads is not None and cpu_threads < 1:
            raise UsageError(
                f"cpu_threads {cpu_threads} is below 1", hint="Give at least 1 thread per process"
            )
        if version is not None:
            parse_version(version)  # fail early on garbage
        self._executable = executable
        self._version = version
        self._python = python
        self._flag_names = frozenset(flag_names) if flag_names is not None else None
        self._flag_cache_dir = flag_cache_dir
        self._cpu_threads = cpu_threads
        self._environ = environ
        self._introspect = introspect
        self._info: BackendInfo | None = None

    # ------------------------------------------------------------------ discovery
    def probe(self) -> BackendInfo:
        """Find ``swift`` and the ms-swift version; refuse a version older than 3.5.

        Raises:
            BackendError: ``swift`` is not found, its version cannot be read, or it is too old.
        """
        exe = self._find_executable()
        python = self.trial_python()
        versions = installed_versions(
            python,
            ("ms-swift", "deepspeed", *VLLM_DISTRIBUTIONS, "trl", "transformers", "torch"),
            framework="ms-swift",
            hint=INSTALL_HINT,
        )
        version = self._version or versions.get("ms-swift")
        if not version:
            raise BackendError(
                f"ms-swift is not installed for {python} (the interpreter of {exe})", hint=INSTALL_HINT
            )
        if parse_version(version) < MIN_VERSION:
            raise BackendError(
                f"ms-swift {version} is too old for autotune (needs {'.'.join(map(str, MIN_VERSION))} or newer)",
                hint="Upgrade it with: pip install -U ms-swift",
            )
        extra = {"python": python}
        extra.update({k: v for k, v in versions.items() if v and k != "ms-swift"})
        self._python = python
        self._version = version
        self._info = BackendInfo(name=self.name, version=version, executable=exe, extra=extra)
        return self._info

    def trial_python(self) -> str:
        """The interpreter of the ``swift`` command (its first line), else autotune's own.

        Raises:
            BackendError: ``swift`` is not found.
        """
        return self._python or _shebang_python(self._find_executable()) or sys.executable

    def _find_executable(self) -> str:
        if self._executable:
            path = Path(self._executable).expanduser()
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
            found = shutil.which(self._executable)
            if found:
                return found
            raise BackendError(
                f"the swift executable {self._executable!r} does not exist or is not executable",
                hint=INSTALL_HINT,
            )
        found = shutil.which("swift")
        if found:
            return found
        # autotune run from a virtual environment that is not activated: its bin/ is not on PATH
        beside = Path(sys.executable).parent / "swift"
        if beside.is_file() and os.access(beside, os.X_OK):
            return str(beside)
        raise BackendError("ms-swift's `swift` command is not on PATH", hint=INSTALL_HINT)

    def flags(self) -> SwiftFlags:
        """The flag vocabulary of the ms-swift version trials are rendered for.

        Raises:
            BackendError: no version given, probed, or installed in this interpreter.
        """
        if self._version is None:
            try:
                self._version = importlib.metadata.version("ms-swift")
            except importlib.metadata.PackageNotFoundError:
                raise BackendError(
                    "the ms-swift version is unknown",
                    hint="Call probe() first, or pass version= to SwiftBackend",
                ) from None
        return SwiftFlags.for_version(self._version)

    def accepted_flag_names(self) -> frozenset[str]:
        """Every flag the installed ``swift rlhf`` accepts (asked once, then cached on disk).

        Raises:
            BackendError: the installation cannot be asked.
        """
        if self._flag_names is not None:
            return self._flag_names
        python = self._python or (self.probe().extra["python"])
        version = self.flags().label
        key = hashlib.sha1(str(Path(python).resolve()).encode()).hexdigest()[:12]
        cache_dir = self._flag_cache_dir
        if cache_dir is None:
            from autotune.cachedir import default_cache_dir

            cache_dir = default_cache_dir() / "swift"
        cache = cache_dir / f"flags-{version}-{key}.json"
        try:
            names = frozenset(json.loads(cache.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            names = self._introspect(python)
            try:
                cache.parent.mkdir(parents=True, exist_ok=True)
                cache.write_text(json.dumps(sorted(names)), encoding="utf-8")
            except OSError:
                pass  # a cache that cannot be written only costs time next run
        self._flag_names = names
        return names

    # ------------------------------------------------------------------ configuration
    @staticmethod
    def _fixed(ctx: TrialContext) -> dict[str, Any]:
        """The user's fixed flags with normalised names; those after ``--`` win over the file's."""
        fixed = {flag_name(k): v for k, v in ctx.fixed.items()}
        return canonical_args(fixed)

    def _effective(self, params: Mapping[str, object], ctx: TrialContext) -> dict[str, Any]:
        """Fixed flags overlaid with the trial's knobs (knobs win)."""
        eff = self._fixed(ctx)
        eff.update(params)
        return eff

    @staticmethod
    def _world_size(params: Mapping[str, object], ctx: TrialContext) -> int:
        if ctx.cpu_only:
            return max(1, as_int(params.get("num_processes", 1)) or 1)
        return len(ctx.gpus)

    def derive(self, params: dict[str, Any], ctx: TrialContext) -> dict[str, Any]:
        world = self._world_size(params, ctx)
        pdbs = as_int(self._effective(params, ctx).get("per_device_train_batch_size", 1)) or 1
        derived: dict[str, Any] = {"world_size": world}
        if pdbs > 0 and ctx.global_batch % (pdbs * world) == 0 and ctx.global_batch >= pdbs * world:
            derived["gradient_accumulation_steps"] = ctx.global_batch // (pdbs * world)
        return derived

    def baseline(self, defaults: dict[str, Any], ctx: TrialContext) -> dict[str, Any]:
        """ms-swift's defaults, with the per-device batch lowered until it divides the global batch."""
        params = dict(defaults)
        world = self._world_size(params, ctx)
        pdbs = as_int(params.get("per_device_train_batch_size", 1)) or 1
        while pdbs > 1 and ctx.global_batch % (pdbs * world) != 0:
            pdbs -= 1
        if "per_device_train_batch_size" in params:
            params["per_device_train_batch_size"] = pdbs
        return params

    def check_rules(
        self, params: dict[str, Any], derived: dict[str, Any], ctx: TrialContext
    ) -> list[RuleViolation]:
        """ms-swift's start-up validity rules (each would raise ``ValueError`` at launch), by stable name."""
        eff = self._effective(params, ctx)
        world = int(derived.get("world_size") or self._world_size(params, ctx))
        return start_rules(eff, world, ctx, info=self._info, flags=self.flags)

    def check_flags(
        self, params: Mapping[str, object], fixed: Mapping[str, object], ctx: TrialContext | None = None
    ) -> list[str]:
        """Check every flag a trial would pass against the installed ms-swift, before any launch
        (:func:`~autotune.backends.swift._rules.fixed_flag_notices`).

        Returns:
            Notices for the user (fixed flags that trials replace).

        Raises:
            UnknownFlag: a fixed flag ``RLHFArguments`` does not have, with its nearest field.
            BackendError: a flag this version removed, or a fixed flag that conflicts with what autotune
                controls.
        """
        return fixed_flag_notices(self.flags(), self.accepted_flag_names, params, fixed, ctx)

    # ------------------------------------------------------------------ rendering
    def render(self, spec: TrialSpec, ctx: TrialContext) -> LaunchPlan:
        """``swift rlhf --rlhf_type grpo ...`` for one trial; writes only inside ``ctx.trial_dir``
        (the generated prompts and a copy of the demo reward plugin, when the job needs them)."""
        world = int(spec.derived.get("world_size") or self._world_size(dict(spec.params), ctx))
        args = self._argv(spec, ctx, trial=True)
        return LaunchPlan(
            argv=tuple(args),
            env={**self._env(spec, ctx, world), **self._vllm_env(self._effective(spec.params, ctx), ctx)},
            cwd=str(ctx.trial_dir),
            metrics_paths=(str(self._output_dir(ctx) / "logging.jsonl"),),
            world_size=world,
            unset_env=self._unset(spec, ctx, world),
        )

    def _unset(self, spec: TrialSpec, ctx: TrialContext, world: int) -> tuple[str, ...]:
        single = ("NPROC_PER_NODE",) if world == 1 else ()
        return ("NNODES", "NODE_RANK", "MASTER_ADDR", *single, *self.trial_env(spec, ctx).unset)

    def job_plan(self, spec: TrialSpec, ctx: TrialContext) -> LaunchPlan:
        """The user's real job with the knobs of ``spec``: the trial's command without what only a trial needs.

        ``--max_steps``, ``--logging_steps 1``, ``--save_strategy no``, ``--eval_strategy no``, ``--report_to
        none``, the trial's ``--output_dir``, ``--add_version false`` and the study's ``--seed`` are left out;
        the user's own values for them (among the fixed arguments) are kept. autotune's generated prompts and
        demo reward plugin, when the job used them, are referenced where the trial wrote them in
        ``ctx.trial_dir``. Pure: nothing is written.

        Returns:
            argv and the environment the job needs (``NPROC_PER_NODE``, ``CUDA_VISIBLE_DEVICES``, and
            ``OMP_NUM_THREADS`` on a CPU-only run); ``cwd`` is the trial directory.
        """
        world = int(spec.derived.get("world_size") or self._world_size(dict(spec.params), ctx))
        return LaunchPlan(
            argv=tuple(self._argv(spec, ctx, trial=False)),
            env={
                **self._job_env(spec, ctx, world, threads_of_host=False),
                **self._vllm_env(self._effective(spec.params, ctx), ctx),
            },
            cwd=str(ctx.trial_dir),
            world_size=world,
            unset_env=self.trial_env(spec, ctx).unset,
        )

    def _argv(self, spec: TrialSpec, ctx: TrialContext, *, trial: bool) -> list[str]:
        """The ``swift rlhf`` argv of a trial (``trial=True``: writes prompts/plugin, adds the controlled
        flags) or of the user's job (``trial=False``: pure, the user's own controlled flags kept)."""
        flags = self.flags()
        exe = (
            self._info.executable
            if self._info is not None and self._info.executable
            else (self._executable or "swift")
        )
        params = dict(spec.params)
        derived_ga = spec.derived.get("gradient_accumulation_steps")
        fixed = self._fixed(ctx)
        use_vllm = as_bool(params.get("use_vllm", fixed.get("use_vllm", False)))

        args: list[str] = [exe, "rlhf", "--rlhf_type", "grpo"]
        emitted: set[str] = {"rlhf_type"}

        def add(name: str, value: object) -> None:
            name = flags.translate(name)
            if name in emitted:
                return
            emitted.add(name)
            args.extend(flag_items(name, value))

        add("model", ctx.model.path_or_id)
        if not ctx.model.local:
            # ms-swift reads a hub id as a ModelScope id unless told otherwise (USE_HF defaults to 0); a
            # search passes the model's local snapshot, so only a hub id given here directly needs it. The
            # user's own dataset and reward ids keep the meaning ms-swift gives them in the user's job.
            add("use_hf", fixed.get("use_hf", True))
        if self._is_tiny(ctx):
            for name, value in _TINY_DEFAULTS.items():
                add(name, fixed.get(name, value))
        demo_prompts = self._write_prompts if trial else self._prompts_path
        add("dataset", fixed.get("dataset") or ctx.dataset or str(demo_prompts(ctx)))
        plugins = fixed.get("external_plugins") or []
        plugins = [plugins] if isinstance(plugins, str) else list(plugins)
        if ctx.cpu_only and use_vllm:  # vLLM's CPU layers keep an updatable weight (before the LLM is built)
            plugins.append(str(self._copy_asset(ctx, SYNC_SHIM, trial)))
        if trial:  # the rollout and the weight sync, timed by ms-swift, marked for the timeline
            plugins.append(str(self._copy_asset(ctx, PHASE_PLUGIN, trial)))
        if "reward_funcs" not in fixed and "reward_model" not in fixed:
            plugins.append(str(self._copy_asset(ctx, PLUGIN_ASSET, trial)))
            add("external_plugins", plugins)
            add("reward_funcs", [DEMO_REWARD])
        else:
            add("external_plugins", plugins or None)
            add("reward_funcs", fixed.get("reward_funcs"))
        if ctx.cpu_only:  # under torchrun on CPU, ms-swift's accelerator counts one process without it
            add("use_cpu", True)
        add("num_generations", ctx.num_generations)
        add("max_completion_length", ctx.max_completion_length)
        for name in SWIFT_KNOBS:
            if name == "num_processes" or name not in params:
                continue
            if not use_vllm and _is_vllm_only(name):
                continue
            add(name, params[name])
        if use_vllm and "vllm_mode" not in params and "vllm_mode" not in fixed and flags.vllm_mode_required:
            add("vllm_mode", "colocate")  # ms-swift ≥ 3.11.1 refuses use_vllm without a mode
        if derived_ga is not None:
            add("gradient_accumulation_steps", int(derived_ga))
        controlled = {
            "max_steps": ctx.max_steps,
            "logging_steps": 1,
            "save_strategy": "no",
            "eval_strategy": "no",
            "report_to": list(ctx.report_to) or ["none"],
            **({"run_name": ctx.run_name} if ctx.report_to else {}),
            "output_dir": str(self._output_dir(ctx)),
            "add_version": False,
            "seed": ctx.seed,
        }
        for name, value in fixed.items():
            if (trial and name in controlled) or name in (
                "gradient_accumulation_steps",
                "num_generations",
                "max_completion_length",
            ):
                continue
            if name == "num_processes":
                continue  # a knob of autotune's (NPROC_PER_NODE), not an ms-swift flag
            if not use_vllm and _is_vllm_only(name):
                continue
            add(name, value)
        if trial:
            for name, value in controlled.items():
                add(name, value)
        return args

    @staticmethod
    def _is_tiny(ctx: TrialContext) -> bool:
        from autotune.workload.tinymodels import is_tiny

        return is_tiny(ctx.model.name)

    @staticmethod
    def _output_dir(ctx: TrialContext) -> Path:
        return ctx.trial_dir / "output"

    @staticmethod
    def _vllm_env(params: Mapping[str, object], ctx: TrialContext) -> dict[str, str]:
        """vLLM on CPU: no vLLM plugins (ms-swift's ``swift_uembed`` imports torchvision's CUDA build), and
        an engine over several processes binds one core list to each (vLLM's default asserts)."""
        if not (ctx.cpu_only and as_bool(params.get("use_vllm", False))):
            return {}
        env = {"VLLM_PLUGINS": "none"}
        binding = cpu_thread_binding(as_int(params.get("vllm_tensor_parallel_size", 1)) or 1)
        if binding:
            env["VLLM_CPU_OMP_THREADS_BIND"] = binding
        return env

    def _env(self, spec: TrialSpec, ctx: TrialContext, world: int) -> dict[str, str]:
        """A trial's environment: the job's (:meth:`_job_env`) plus what only a trial needs."""
        return {
            "MASTER_PORT": str(ctx.master_port),
            "PYTHONUNBUFFERED": "1",
            **self._job_env(spec, ctx, world),
            "AUTOTUNE_PHASES_FILE": str(ctx.trial_dir / PHASES_FILE),
        }

    def _job_env(
        self, spec: TrialSpec, ctx: TrialContext, world: int, *, threads_of_host: bool = True
    ) -> dict[str, str]:
        """Processes, devices and threads: what the user's job needs as much as a trial (on GPUs, the
        environment every GPU trial gets: :meth:`Backend.trial_env`). ``threads_of_host=False`` leaves
        out a GPU trial's thread count read from this host (an export takes the trial's own)."""
        env: dict[str, str] = {}
        if world > 1:
            # ms-swift wraps itself in torchrun only when NPROC_PER_NODE is set; one process runs plain
            # (≈ 8 s less start-up on CPU) and an inherited NPROC_PER_NODE is removed (see unset_env).
            env["NPROC_PER_NODE"] = str(world)
        if ctx.cpu_only:
            env["CUDA_VISIBLE_DEVICES"] = ""
            # One thread per process by default: with the tiny models, on 2 shared cores, 2 OpenMP
            # threads per process made steps 10-20x slower (3-8 s against 0.3-0.5 s, measured).
            env["OMP_NUM_THREADS"] = str(self._cpu_threads or 1)
        else:
            gpu = self.trial_env(spec, ctx).env
            env.update(gpu if threads_of_host else {k: v for k, v in gpu.items() if k != "OMP_NUM_THREADS"})
        return env

    def _write_prompts(self, ctx: TrialContext) -> Path:
        from autotune.workload.datasets import write_prompts

        per_step = max(1, -(-ctx.global_batch // max(1, ctx.num_generations)))
        n = max(32, ctx.max_steps * per_step + 16)
        return write_prompts(self._prompts_path(ctx), n, seed=ctx.seed, style="messages")

    @staticmethod
    def _prompts_path(ctx: TrialContext) -> Path:
        return ctx.trial_dir / "prompts.jsonl"

    @staticmethod
    def _copy_asset(ctx: TrialContext, name: str, trial: bool) -> Path:
        """Where the trial has its copy of the packaged file ``name`` (copied there for a trial)."""
        target = ctx.trial_dir / name
        if trial:
            with as_file(_ASSETS[name]) as src:
                shutil.copyfile(src, target)
        return target

    # ------------------------------------------------------------------ parsing
    def parser(self, spec: TrialSpec, ctx: TrialContext) -> StepParser:
        return SwiftLogParser(jsonl_path=self._output_dir(ctx) / "logging.jsonl", samples=ctx.global_batch)

    def phase_frames(self) -> tuple[PhaseFrame, ...]:
        """ms-swift's GRPO phase methods (swift/rlhf_trainers/rollout_mixin.py and grpo_trainer.py,
        ms-swift 3.x/4.x): weights reach vLLM in ``_move_model_to_vllm`` (and the helpers it calls to
        load state dicts), completions come from ``_generate_completions`` / ``_fast_infer`` /
        ``_engine_infer`` and ``_infer_single_or_multi_turn`` (the frame every rollout mode passes
        through, HF generate included), the loss from ``compute_loss`` inside ``training_step``."""
        return (
            PhaseFrame(
                "weight_sync",
                r"swift/[^:]*:(_move_model_to_vllm|_load_state_dict_to_vllm)$",
            ),
            PhaseFrame(
                "rollout",
                r"swift/[^:]*:(_generate_completions|_fast_infer|_engine_infer|_infer_single_or_multi_turn)$",
            ),
            PhaseFrame("train", r"swift/[^:]*:(compute_loss|training_step)$"),
        )

    def failure_patterns(self) -> tuple[FailurePattern, ...]:
        """ms-swift's own start-up refusals (argument checks that raise before training)."""
        return (
            FailurePattern(
                "INVALID", r"ValueError: remaining_argv: \[", "ms-swift does not accept an argument"
            ),
            FailurePattern(
                "INVALID", r"vllm_mode is required when use_vllm is true", "use_vllm without vllm_mode"
            ),
            FailurePattern(
                "INVALID", r"vllm_mode is not supported when use_vllm is false", "vllm_mode without use_vllm"
            ),
            FailurePattern(
                "INVALID",
                r"generation_batch_size \(\d+\) must be (?:evenly )?divisible by|generation_batch_size \(\d+\) must equal",
                "generation batch does not fit the batch or num_generations",
            ),
            FailurePattern(
                "INVALID",
                r"vllm_tensor_parallel_size \(\d+\) must divide world size",
                "vLLM TP does not divide the world size",
            ),
            FailurePattern("INVALID", r"num_generations must be greater than 1", "num_generations below 2"),
            FailurePattern(
                "INVALID", r"is not compatible with `device_map`", "set NPROC_PER_NODE to the number of GPUs"
            ),
            FailurePattern(
                "INVALID",
                r"The '?deepspeed'? distribution was not found|No module named '?deepspeed'?",
                "DeepSpeed is not installed beside ms-swift",
            ),
        )
