"""What a study is given and what it returns: its settings (:class:`StudyConfig`), its outcome, and the
contracts of the collaborators passed in (view, memory gate, trial executor)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from autotune.backends import ModelRef, TrialContext
from autotune.errors import UsageError
from autotune.recommend import Recommendation, headline
from autotune.records import Hardware, TrialResult, TrialSpec
from autotune.secrets import SecretRule
from autotune.study.ports import free_port
from autotune.studydir import StudyDir

__all__ = [
    "LaunchCheck",
    "MemoryGate",
    "NullView",
    "StudyConfig",
    "StudyOutcome",
    "StudyView",
    "TrialExecutor",
    "check_budget",
    "free_port",
    "summary_line",
]


@dataclass(frozen=True)
class StudyConfig:
    """Resolved settings of a study (everything in ``study.json`` except its outcome)."""

    study_dir: Path
    backend: str
    model: ModelRef
    hardware: Hardware
    global_batch: int
    num_generations: int
    max_steps: int
    max_completion_length: int
    fixed: Mapping[str, Any] = field(default_factory=dict)
    dataset: str | None = None
    seed: int = 0
    search: str = "auto"
    n_trials: int = 8
    time_budget_s: float | None = None
    storage_url: str | None = None
    user_baseline: Mapping[str, Any] | None = None
    min_headroom_frac: float = 0.05
    command_line: str = ""
    versions: Mapping[str, str] = field(default_factory=dict)
    backend_version: str | None = None
    max_duplicate_asks: int = 50
    # configurations in a row the pre-screen may refuse before the study stops: what is left of the
    # space is predicted not to fit or breaks a rule (``Asker.refused``)
    max_refused_in_a_row: int = 50
    # runs of each compared configuration in the re-measurement after the search (0: none); the
    # application's default is 2 (``autotune search --confirm-runs``), callers of the core opt in
    confirm_runs: int = 0
    # argument names the user declared secret (``--secret-arg``), on top of autotune's rule
    secret_args: tuple[str, ...] = ()
    # the Optuna study's name (``--study-name``; default: the study directory's name)
    study_name: str | None = None
    # a worker of a study other workers may share (``--study-name``, ``--gpus-per-trial``):
    # results and the queue live in the storage, a dead worker is found by its heartbeat
    shared: bool = False
    # this worker's slot when one process runs several (``--gpus-per-trial``)
    worker_slot: int | None = None
    # where each training-semantics value came from (autotune.jobsemantics: name → value, source, place)
    semantics: Mapping[str, Any] = field(default_factory=dict)
    # stop a trial clearly slower than the best completed one (``--prune/--no-prune``)
    prune: bool = True

    @property
    def name(self) -> str:
        """The Optuna study's name."""
        return self.study_name or self.study_dir.name

    @property
    def secrets(self) -> SecretRule:
        """The study's secret rule: nothing written to ``study.json`` holds a secret."""
        return SecretRule(self.secret_args)

    def identity(self) -> dict[str, Any]:
        """The plain settings that define the study (the study adds its space, fixed arguments and the
        backend's own, see :mod:`autotune.study.identity`)."""
        return {
            "backend": self.backend,
            "model": self.model.name,
            "global_batch": self.global_batch,
            "num_generations": self.num_generations,
            "max_completion_length": self.max_completion_length,
            "dataset": self.dataset,
        }


@dataclass(frozen=True)
class StudyOutcome:
    """How a study ended.

    Attributes:
        results: every trial, by number.
        recommendation: the winner, or None.
        stopped: budget | converged | exhausted | interrupted.
        detail: one line saying why it stopped (and, when early, how much of the budget it used).
        trials_run_now: trials launched by this run (a resumed study counts only its own).
        trials_run: trials launched in the whole study.
        budget_trials: the trial budget.
        final: whether this run ended the study (False: another worker was still running trials, and
            the last one to finish re-measures and writes the outcome).
    """

    results: list[TrialResult]
    recommendation: Recommendation | None
    stopped: str
    detail: str
    trials_run_now: int
    trials_run: int = 0
    budget_trials: int = 0
    final: bool = True


class StudyView(Protocol):
    """Live display of a study (rich in the CLI, nothing in tests)."""

    def study_started(self, cfg: StudyConfig, done: int, budget: int) -> None: ...
    def trial_started(self, number: int, params: Mapping[str, object], is_baseline: bool) -> None: ...
    def trial_step(self, number: int, step: int, throughput: float | None) -> None: ...
    def trial_finished(self, result: TrialResult) -> None: ...
    def notice(self, text: str) -> None: ...
    def remeasure_started(self, runs: int) -> None:
        """The re-measurement after the search begins: ``runs`` runs in all (those on disk included)."""

    def remeasure_ran(self) -> None:
        """One re-measurement run ended (or was found finished on disk)."""


class NullView:
    """A view that shows nothing."""

    def study_started(self, cfg: StudyConfig, done: int, budget: int) -> None:
        pass

    def trial_started(self, number: int, params: Mapping[str, object], is_baseline: bool) -> None:
        pass

    def trial_step(self, number: int, step: int, throughput: float | None) -> None:
        pass

    def trial_finished(self, result: TrialResult) -> None:
        pass

    def notice(self, text: str) -> None:
        pass

    def remeasure_started(self, runs: int) -> None:
        pass

    def remeasure_ran(self) -> None:
        pass


class MemoryGate(Protocol):
    """Pre-screens candidates with the memory estimate and learns from measured peaks."""

    def check(
        self, params: Mapping[str, object], derived: Mapping[str, object], *, margin: float | None = None
    ) -> tuple[str | None, dict[str, Any] | None]:
        """(reason to prune or None, the predicted breakdown or None).

        ``margin``: how far over capacity a prediction may go before it is refused (None: the gate's
        own); the study passes a wider one for a memory probe only.

        The search reads ``peak_bytes``, ``capacity_bytes``, ``vllm_startup_deficit_bytes`` and
        ``kv_deficit_bytes`` from the breakdown when present (``MemoryEstimate.to_dict()``) to weigh
        the risk of running out of memory.
        """
        ...

    def rank(self, params: Mapping[str, object]) -> float | None:
        """Predicted throughput, for ordering only."""
        ...

    def observe(self, result: TrialResult) -> None: ...

    def state(self) -> dict[str, Any]: ...


@runtime_checkable
class LaunchCheck(Protocol):
    """An executor that starts real commands says why one cannot start before the study records the
    trial RUNNING (:class:`autotune.trial.execute.Executor`); a simulated one has nothing to refuse."""

    def launch_refusal(self, spec: TrialSpec, ctx: TrialContext) -> str | None:
        """Why the trial's command cannot be launched (one line: unrenderable, E2BIG, no executable)."""
        ...


class TrialExecutor(Protocol):
    """Runs one launched trial and returns its result (see :class:`autotune.trial.execute.Executor`).

    When it is also a :class:`LaunchCheck`, the study asks it first, before it records the trial
    RUNNING, and calls :meth:`execute` only when there was no refusal.
    """

    def execute(
        self,
        spec: TrialSpec,
        ctx: TrialContext,
        *,
        on_step: Callable[[int, float | None, float], str | None],
        time_left_s: float | None,
    ) -> TrialResult: ...


def check_budget(n_trials: int) -> None:
    if n_trials < 1:
        raise UsageError(
            f"--trials must be at least 1, got {n_trials}",
            hint="Give the number of trials to run, e.g. --trials 8",
        )


def summary_line(outcome: StudyOutcome) -> str:
    """The one line printed at the end of a study."""
    rec = outcome.recommendation
    if rec is None:
        return f"no healthy trial completed: nothing to recommend (see {StudyDir.REPORT_MD} for why each trial failed)"
    line = f"best: trial {rec.trial} at {rec.throughput:.3g} completions/s; {headline(rec)}"
    if rec.host_load:
        line += f"; {rec.host_load}"
    if outcome.stopped == "converged" and outcome.budget_trials:
        line += f"; stopped early after {outcome.trials_run} of {outcome.budget_trials} trials (further trials unlikely to gain more)"
    return line
