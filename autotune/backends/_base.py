"""The backend extension point: one framework (TRL, ms-swift, verl, any command) per implementation.

Who calls what, and when:

1. The CLI builds a backend with :func:`autotune.backends.get_backend` and calls :meth:`Backend.probe`
   once, before anything is written. A framework that is missing or too old raises
   :class:`~autotune.errors.BackendError` there.
2. :mod:`autotune.study.space` loads :meth:`Backend.default_space` (or the user's file).
3. For every candidate the study calls :meth:`Backend.derive` (world size, gradient accumulation —
   values that keep training semantics fixed) and :meth:`Backend.check_rules` (the framework's own
   start-up validity rules). A candidate with a violation never launches.
4. :meth:`Backend.render` turns a :class:`~autotune.records.TrialSpec` into a
   :class:`~autotune.records.LaunchPlan`. Rendering must be pure: no process is started, nothing
   outside ``ctx.trial_dir`` is written.
5. The runner feeds every output line to the parser from :meth:`Backend.parser` and polls it for
   metric files; the parser returns :class:`~autotune.records.StepMetrics` as steps appear.

Implementations must not keep per-trial state on the backend object: per-trial state lives in the
parser. Conformance: ``tests/backends/conformance.py`` runs against every backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, ClassVar

from autotune.records import GpuInfo, LaunchPlan, StepMetrics, TrialSpec
from autotune.study.space import SearchSpace

__all__ = [
    "Backend",
    "BackendInfo",
    "FailurePattern",
    "ModelRef",
    "RuleViolation",
    "StepParser",
    "TrialContext",
    "as_number",
]


@dataclass(frozen=True)
class ModelRef:
    """The model a study trains.

    Attributes:
        name: what the user typed (``tiny-qwen2``, ``Qwen2-7B``, a path).
        path_or_id: what the framework receives (a local directory or a hub id).
        local: True when ``path_or_id`` is a local directory autotune built or the user named.
        facts: architecture facts when known (layers, hidden size, heads, ...), else empty.
    """

    name: str
    path_or_id: str
    local: bool = False
    facts: dict[str, Any] = field(default_factory=dict)


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
        passthrough: raw arguments the user gave after ``--``, appended verbatim as argv items.
        master_port: a free TCP port for torch.distributed.
        dataset: a dataset path the user named, or None for autotune's generated prompts.
        seed: training seed, the same for every trial.
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
    passthrough: tuple[str, ...] = ()
    master_port: int = 29500
    dataset: str | None = None
    seed: int = 0

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


class StepParser(ABC):
    """Turns a trial's output into step records. One instance per trial; not thread-safe.

    The runner calls :meth:`feed` from one thread for each complete line (stdout and stderr alike,
    carriage-return segments already split) and :meth:`poll` periodically from the same thread.
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


class Backend(ABC):
    """One GRPO framework. See the module docstring for the calling protocol."""

    name: ClassVar[str]
    #: knob names this backend knows how to render; None accepts any name (the command backend).
    knob_names: ClassVar[frozenset[str] | None] = None

    @abstractmethod
    def probe(self) -> BackendInfo:
        """Find the framework; raise :class:`~autotune.errors.BackendError` when it cannot run here."""

    def default_space(self) -> Traversable:
        """The search-space YAML shipped for this backend."""
        return files("autotune.search_spaces").joinpath(f"{self.name}.yaml")

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

    @abstractmethod
    def render(self, spec: TrialSpec, ctx: TrialContext) -> LaunchPlan:
        """Build the launch plan for one trial. Pure: starts nothing."""

    @abstractmethod
    def parser(self, spec: TrialSpec, ctx: TrialContext) -> StepParser:
        """A fresh parser for one trial."""

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

    def baseline(self, defaults: dict[str, Any], ctx: TrialContext) -> dict[str, Any]:
        """Trial 0: the framework's defaults (from the space), adjusted so the global batch holds."""
        return dict(defaults)

    def describe_command(self, plan: LaunchPlan) -> str:
        """The command a person would type to run ``plan`` (for reports)."""
        return plan.to_shell()


def as_number(value: Any) -> float | None:
    """A log value as a float: numbers and numeric text ('6e-08'); None for booleans and anything else."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def trial_path(ctx: TrialContext, *parts: str) -> Path:
    """A path inside the trial directory."""
    return ctx.trial_dir.joinpath(*parts)
