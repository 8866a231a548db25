"""The study loop: ask → pre-screen → run → tell, with resume, budgets and the recommendation.

Collaborators (backend, search strategy, memory gate, runner, samplers, GPU hygiene, view) are passed
in, so tests substitute fakes. The study never samples hardware itself: measurements arrive in the
runner's record and the timeline summary.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import random
import socket
import threading
import time
import warnings
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol

import optuna

from autotune.backends import Backend, ModelRef, TrialContext
from autotune.errors import UsageError, WriteError
from autotune.records import Confirmation, Hardware, TrialResult, TrialSpec, TrialStatus
from autotune.secrets import SecretRule
from autotune.space import SearchSpace, canonical_key
from autotune.strategy import SearchStrategy, infer_infeasible
from autotune.study.binding import bind_storage, bound_name, claim_number, study_uid
from autotune.study.confirm import Confirmer, ConfirmTask, runners_up, runs_cost, schedule
from autotune.study.identity import identity_differences, study_identity
from autotune.study.lock import StudyLock
from autotune.study.recommend import Recommendation, headroom_bytes, recommend
from autotune.study.storage import (
    Heartbeat,
    Worker,
    fail_stale,
    grace_s,
    heartbeat_s,
    live_workers,
    open_storage,
    silent_trials,
    storage_error,
)
from autotune.study.verdict import METHOD, headline, judge, not_remeasured
from autotune.studydir import StudyDir

__all__ = ["StudyConfig", "StudyOutcome", "StudyView", "NullView", "MemoryGate", "TrialExecutor", "Study"]

log = logging.getLogger(__name__)


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
    def trial_started(self, number: int, params: Mapping[str, Any], is_baseline: bool) -> None: ...
    def trial_step(self, number: int, step: int, throughput: float | None) -> None: ...
    def trial_finished(self, result: TrialResult) -> None: ...
    def notice(self, text: str) -> None: ...


class NullView:
    """A view that shows nothing."""

    def study_started(self, cfg: StudyConfig, done: int, budget: int) -> None:
        pass

    def trial_started(self, number: int, params: Mapping[str, Any], is_baseline: bool) -> None:
        pass

    def trial_step(self, number: int, step: int, throughput: float | None) -> None:
        pass

    def trial_finished(self, result: TrialResult) -> None:
        pass

    def notice(self, text: str) -> None:
        pass


class MemoryGate(Protocol):
    """Pre-screens candidates with the memory estimate and learns from measured peaks."""

    def check(
        self, params: Mapping[str, Any], derived: Mapping[str, Any]
    ) -> tuple[str | None, dict[str, Any] | None]:
        """(reason to prune or None, the predicted breakdown or None).

        The search reads ``peak_bytes``, ``capacity_bytes``, ``vllm_startup_deficit_bytes`` and
        ``kv_deficit_bytes`` from the breakdown when present (``MemoryEstimate.to_dict()``) to weigh
        the risk of running out of memory.
        """
        ...

    def rank(self, params: Mapping[str, Any]) -> float | None:
        """Predicted throughput, for ordering only."""
        ...

    def observe(self, result: TrialResult) -> None: ...

    def state(self) -> dict[str, Any]: ...


class TrialExecutor(Protocol):
    """Runs one launched trial and returns its result (see :class:`autotune.trial.execute.Executor`)."""

    def execute(
        self,
        spec: TrialSpec,
        ctx: TrialContext,
        *,
        on_step: Callable[[int, float | None, float], str | None],
        time_left_s: float | None,
    ) -> TrialResult: ...


def free_port() -> int:
    """A TCP port free right now on this host (for torch.distributed's MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SlowerThanBest(optuna.pruners.BasePruner):
    """Prune a trial whose optimistic throughput is clearly below the best completed trial.

    The study reports ``throughput × (1 + rel_ci95)`` (the optimistic end of the estimate) after every
    steady step; the trial is pruned once it has ``min_reports`` reports and that value is below
    ``best × (1 − margin)``. The baseline is never pruned (its throughput defines the speedup).
    """

    def __init__(self, margin: float = 0.15, min_reports: int = 3) -> None:
        self.margin = margin
        self.min_reports = min_reports

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        if trial.user_attrs.get("is_baseline") or len(trial.intermediate_values) < self.min_reports:
            return False
        best = max(
            (
                t.value
                for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
                if t.value and t.user_attrs.get("status") == TrialStatus.COMPLETE.value
            ),
            default=None,
        )
        if best is None:
            return False
        last = trial.intermediate_values[max(trial.intermediate_values)]
        return last < best * (1 - self.margin)


_EXHAUSTED = "every configuration of the space has been tried"
_ASKING = threading.Lock()


@dataclass(frozen=True)
class _Stop:
    """Why the loop stops (the ``stopped`` and ``detail`` of :class:`StudyOutcome`)."""

    stopped: Literal["budget", "converged", "exhausted", "interrupted"]
    detail: str


@dataclass
class _Loop:
    """What one run of the loop carries from trial to trial.

    Attributes:
        pending: configurations to run next, each with whether it is the baseline.
        visited: canonical keys of the configurations tried (interrupted ones excepted).
        launched_total: trials launched in the whole study.
        start_s: the study clock when this run began (the time budget counts from it).
        run_now: trials launched by this run.
        duplicates: asks in a row that returned a configuration already tried.
        choices: why the strategy proposed each pending configuration (canonical key → choice).
        running: other workers' running trials (number → canonical key), from the storage.
        queued: canonical keys of configurations waiting in the storage's queue for any worker.
        heartbeat: this worker's heartbeat (the running trial's, and the worker's own).
    """

    study: optuna.Study
    settings: dict[str, Any]
    pending: list[tuple[dict[str, Any], bool]]
    visited: set[str]
    launched_total: int
    start_s: float
    run_now: int = 0
    duplicates: int = 0
    choices: dict[str, dict[str, Any]] = field(default_factory=dict)
    running: dict[int, str] = field(default_factory=dict)
    queued: set[str] = field(default_factory=set)
    heartbeat: Heartbeat | None = None


class Study:
    """One tuning study. ``run()`` resumes whatever the study directory already holds."""

    def __init__(
        self,
        cfg: StudyConfig,
        backend: Backend,
        space: SearchSpace,
        executor: TrialExecutor,
        *,
        memory_gate: MemoryGate | None = None,
        view: StudyView | None = None,
        reaper: Callable[[Path], str | None] | None = None,
        hygiene: Callable[[], None] | None = None,
        interrupted: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.monotonic,
        strategy: SearchStrategy | None = None,
    ) -> None:
        self.cfg = cfg
        self.backend = backend
        self.space = space
        self.executor = executor
        self.memory_gate = memory_gate
        self.view = view or NullView()
        self.reaper = reaper
        self.hygiene = hygiene
        self.interrupted = interrupted
        self.clock = clock
        self.dir = StudyDir(cfg.study_dir)
        self.worker = Worker.this(cfg.worker_slot)
        # workers of one study draw differently (the same seed would make them propose alike)
        # (a slot of this process by its number, reproducibly; a worker of its own by host and pid)
        seed = cfg.seed + (
            (
                cfg.worker_slot
                if cfg.worker_slot is not None
                else zlib.crc32(self.worker.name.encode()) % 100_000
            )
            if cfg.shared
            else 0
        )
        self.strategy = strategy or SearchStrategy(
            space,
            cfg.search,
            seed=seed,
            rank=memory_gate.rank if memory_gate else None,
            # a gate that can split its prediction by phase (the estimator's) enables the phase model
            phase_prior=getattr(memory_gate, "phase_times", None),
            valid=self._valid,
            feasible=self._cheap_feasible,
            memory_load=self._memory_load if memory_gate else None,
            usable=self.usable,
        )
        self.pruner = SlowerThanBest()
        self._results: dict[int, TrialResult] = {}
        self._storage: optuna.storages.BaseStorage | None = None
        self._stale: list[optuna.trial.FrozenTrial] = []  # trials whose worker died, to requeue
        self._silent_waited_s = 0.0  # how long this worker waited for a dead worker's trial to go stale

    # -- settings -----------------------------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        c = self.cfg
        return {
            "name": c.name,
            "created_wall_s": time.time(),
            "backend": c.backend,
            "backend_version": c.backend_version,
            "command": c.secrets.mask(c.command_line),
            "model": {
                "name": c.model.name,
                "path_or_id": c.model.path_or_id,
                "local": c.model.local,
                "facts": c.model.facts,
            },
            "hardware": c.hardware.model_dump(mode="json"),
            "global_batch": c.global_batch,
            "num_generations": c.num_generations,
            "max_steps": c.max_steps,
            "max_completion_length": c.max_completion_length,
            "fixed": c.secrets.redact_mapping(dict(c.fixed)),
            "dataset": c.dataset,
            "seed": c.seed,
            "confirm_runs": c.confirm_runs,
            "space": self.space.describe(),
            "space_source": self.space.source,
            "dropped_knobs": dict(self.space.dropped),
            "versions": dict(c.versions),
            "search": c.search,
            "budget": {"trials": c.n_trials, "time_s": c.time_budget_s},
            "storage": c.secrets.redact_url(c.storage_url) or f"sqlite:///{StudyDir.DB}",
            "secret_args": list(c.secret_args),
            "identity": self.identity(),
        }

    def identity(self) -> dict[str, Any]:
        """What defines this study (``study.json``'s ``identity``)."""
        rule = self.cfg.secrets  # compared (and digested) in their redacted form: a secret changes nothing
        backend_args = {
            k: list(rule.redact_argv(v)) if isinstance(v, list | tuple) else rule.mask_value(v)
            for k, v in self.backend.study_identity().items()
        }
        return study_identity(
            self.cfg.identity(),
            self.space.describe(),
            rule.redact_mapping(dict(self.cfg.fixed)),
            backend_args,
        )

    def _check_compatible(self) -> dict[str, Any] | None:
        if not self.dir.exists():
            return None
        old = self.dir.read_settings()
        differences = identity_differences(old.get("identity") or {}, self.identity())
        if differences:
            raise UsageError(
                f"{self.dir.root} holds a different study: {'; '.join(differences)}",
                hint="Resume it with the command it was started with (study.json: command), "
                "or choose a new --out to start a new study",
            )
        return old

    # -- optuna --------------------------------------------------------------------------------
    def _open(self) -> optuna.Study:
        url = self.cfg.storage_url or f"sqlite:///{self.dir.db_path}"
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        # ":memory:" keeps the Optuna study in this process only (benches, tests): the trial results
        # still land in the study directory, but Optuna's own history does not persist
        self._storage = open_storage(url, self.cfg.secrets, on_stale=lambda _s, t: self._stale.append(t))
        try:
            study = optuna.create_study(
                storage=self._storage,
                study_name=self.cfg.name,
                direction="maximize",
                sampler=self.strategy.sampler(parallel=self.cfg.shared),
                pruner=self.pruner,
                load_if_exists=True,
            )
        except Exception as exc:  # noqa: BLE001 - Optuna and SQLAlchemy raise many kinds; all are one line
            raise storage_error(url, exc, self.cfg.secrets) from None
        self._check_same_definition(study, url)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([METRIC_NAME])
        for key, value in self._study_attrs().items():
            study.set_user_attr(key, value)
        return study

    def _check_same_definition(self, study: optuna.Study, url: str) -> None:
        """A study name already in the storage must hold the same study (its identity attribute)."""
        stored = study.user_attrs.get("identity")
        if not isinstance(stored, dict):
            return
        differences = identity_differences(stored, self.identity())
        if differences:
            raise UsageError(
                f"the study {self.cfg.name!r} in {self.cfg.secrets.redact_url(url)} has a different "
                f"definition: {'; '.join(differences)}",
                hint="Join it with the same arguments as its other workers, or choose another --study-name",
            )

    def _study_attrs(self) -> dict[str, Any]:
        """What Optuna's tools show about the study: hardware, model, backend and versions."""
        c = self.cfg
        return {
            "backend": c.backend,
            "backend_version": c.backend_version,
            "model": {
                "name": c.model.name,
                "path_or_id": c.model.path_or_id,
                "params": c.model.facts.get("params"),
            },
            "hardware": c.hardware.model_dump(mode="json"),
            "versions": dict(c.versions),
            "pinned": dict(self.space.pinned),
            "identity": self.identity(),
        }

    def _tell(self, study: optuna.Study, trial: optuna.Trial, result: TrialResult) -> None:
        """Record a trial in Optuna as Optuna's own tools read it (optuna-dashboard, ``load_study``).

        A configuration that does not work (OOM, hang, crash, ...) is FAIL and one never launched (the
        pre-screen) or stopped early as clearly slower is PRUNED; only a healthy finished run is
        COMPLETE with its throughput as the value. How the trial ended (``status``, ``reason``) and what
        it measured (:func:`trial_attrs`) are user attributes. The search itself never reads these
        back: it learns from the study directory's results.
        """
        infeasible = result.status.is_failure or (result.status is TrialStatus.PRUNED and result.steps == 0)
        for key, value in trial_attrs(result).items():
            trial.set_user_attr(key, value)
        if result.number == trial.number:  # a duplicate is told with its twin's result, not stored again
            for key, value in stored_attrs(result, self.dir).items():
                trial.set_user_attr(key, value)
        trial.set_constraint("infeasible", 1.0 if infeasible else 0.0)
        if result.status is TrialStatus.COMPLETE and result.throughput is not None:
            study.tell(trial, result.throughput)
        elif result.status is TrialStatus.PRUNED:
            # Optuna keeps the last reported value of a pruned trial (none when it never launched)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)

    # -- pre-screen ------------------------------------------------------------------------------
    def _context(self, trial_dir: Path, master_port: int = 0) -> TrialContext:
        c = self.cfg
        return TrialContext(
            study_dir=c.study_dir,
            trial_dir=trial_dir,
            model=c.model,
            gpus=c.hardware.gpus,
            global_batch=c.global_batch,
            num_generations=c.num_generations,
            max_steps=c.max_steps,
            max_completion_length=c.max_completion_length,
            fixed=dict(c.fixed),
            master_port=master_port,
            dataset=c.dataset,
            seed=c.seed,
        )

    def _valid(self, params: Mapping[str, Any]) -> bool:
        """The framework's start-up rules hold (static: the same answer for the whole study)."""
        ctx = self._context(self.dir.trials_dir)
        return not self.backend.check_rules(dict(params), self.backend.derive(dict(params), ctx), ctx)

    def _cheap_feasible(self, params: Mapping[str, Any]) -> bool:
        ctx = self._context(self.dir.trials_dir)
        derived = self.backend.derive(dict(params), ctx)
        if self.backend.check_rules(dict(params), derived, ctx):
            return False
        if infer_infeasible(self.space, params, self._results.values()):
            return False
        if self.memory_gate is not None:
            reason, _ = self.memory_gate.check(params, derived)
            return reason is None
        return True

    def _memory_load(self, params: Mapping[str, Any]) -> float | None:
        """Predicted peak ÷ capacity per GPU (above 1 by the deficit when vLLM's checks fail), or None."""
        if self.memory_gate is None:
            return None
        derived = self.backend.derive(dict(params), self._context(self.dir.trials_dir))
        _, breakdown = self.memory_gate.check(params, derived)
        if not breakdown:
            return None
        capacity = float(breakdown.get("capacity_bytes") or 0)
        peak = breakdown.get("peak_bytes")
        if capacity <= 0 or peak is None:
            return None
        deficit = max(
            float(breakdown.get("vllm_startup_deficit_bytes") or 0),
            float(breakdown.get("kv_deficit_bytes") or 0),
        )
        if deficit > 0:
            return max(float(peak) / capacity, 1.0 + deficit / capacity)
        return float(peak) / capacity

    def usable(self, result: TrialResult) -> bool:
        """Whether a result may be recommended: complete, with a throughput and the headroom asked for."""
        if result.status is not TrialStatus.COMPLETE or not result.throughput:
            return False
        gpus = self.cfg.hardware.gpus
        for i, room in enumerate(headroom_bytes(result, self.cfg.hardware)):
            if room is not None and room < self.cfg.min_headroom_frac * gpus[i].memory_total_bytes:
                return False
        return True

    def _prescreen(self, number: int, params: dict[str, Any], is_baseline: bool) -> TrialResult | None:
        ctx = self._context(self.dir.trial_dir(number))
        derived = self.backend.derive(params, ctx)
        base: dict[str, Any] = {
            "number": number,
            "params": params,
            "derived": derived,
            "is_baseline": is_baseline,
        }
        violations = self.backend.check_rules(params, derived, ctx)
        if violations:
            text = "; ".join(f"{v.rule}: {v.message}" for v in violations)
            return TrialResult(**base, status=TrialStatus.PRUNED, reason=f"not launched, breaks {text}")
        inferred = infer_infeasible(self.space, params, self._results.values())
        if inferred is not None:
            return TrialResult(**base, status=TrialStatus.PRUNED, reason=f"not launched: {inferred.reason}")
        if self.memory_gate is not None:
            reason, breakdown = self.memory_gate.check(params, derived)
            if reason is not None:
                return TrialResult(
                    **base, status=TrialStatus.PRUNED, reason=f"not launched: {reason}", estimate=breakdown
                )
        return None

    # -- the loop -------------------------------------------------------------------------------
    def _baseline_params(self) -> dict[str, Any]:
        if self.cfg.user_baseline is not None:
            params = self.space.active(dict(self.cfg.user_baseline))
            self.space.validate_params(params)
            return params
        return self.space.active(
            self.backend.baseline(self.space.defaults(), self._context(self.dir.trials_dir))
        )

    def _recover(self, study: optuna.Study) -> list[dict[str, Any]]:
        """Mark trials left RUNNING by a killed tuner as interrupted; return their params to re-run.

        A shared study's running trials may be other workers' live ones: only those whose worker
        stopped beating are recovered (:meth:`_recover_stale`), and they are queued in the storage for
        any worker.
        """
        if self.cfg.shared:
            self._recover_stale(study)
            return []
        rerun: list[dict[str, Any]] = []
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            trial_dir = self.dir.trial_dir(t.number)
            note = self.reaper(trial_dir) if self.reaper else None
            params = self.space.active(t.params)
            reason = "autotune was stopped while this trial ran; it says nothing about the configuration"
            if note:
                reason += f" ({note})"
            existing = self.dir.read_result(t.number)
            if existing is None or existing.status is TrialStatus.RUNNING:
                result = _interrupted(t, params, reason)
                self.dir.write_result(result)
                self._results[t.number] = result
            study.tell(t.number, state=optuna.trial.TrialState.FAIL)
            self.view.notice(
                f"trial {t.number} was left running by a stopped autotune: marked interrupted, will run again"
            )
            rerun.append(params)
        return rerun

    def _recover_stale(self, study: optuna.Study) -> None:
        """Fail the trials of workers that stopped beating, mark them interrupted and queue them again."""
        fail_stale(study)
        # a running trial no worker claimed (left by an autotune before workers, or by a worker killed
        # between asking for it and naming itself) never beats: stale once its grace has passed
        cutoff = datetime.datetime.now() - datetime.timedelta(seconds=grace_s())
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            if "worker" not in t.user_attrs and t.datetime_start is not None and t.datetime_start < cutoff:
                with contextlib.suppress(
                    optuna.exceptions.UpdateFinishedTrialError, RuntimeError, ValueError
                ):
                    study.tell(t.number, state=optuna.trial.TrialState.FAIL)
                    self._stale.append(t)
        while self._stale:
            t = self._stale.pop(0)
            worker = (t.user_attrs.get("worker") or {}).get("name", "a worker")
            trial_dir = self.dir.trial_dir(t.number)
            note = self.reaper(trial_dir) if self.reaper and trial_dir.is_dir() else None
            params = self.space.active(t.params)
            reason = f"its worker ({worker}) stopped beating; it says nothing about the configuration"
            if note:
                reason += f" ({note})"
            result = _interrupted(t, params, reason)
            if trial_dir.is_dir():
                existing = self.dir.read_result(t.number)
                if existing is None or existing.status is TrialStatus.RUNNING:
                    self.dir.write_result(result)
            self._results[t.number] = result
            if params:
                study.enqueue_trial(
                    params,
                    user_attrs={"is_baseline": result.is_baseline, "requeued_from": t.number},
                    skip_if_exists=False,
                )
            self.view.notice(
                f"trial {t.number} of worker {worker}, which stopped beating: marked interrupted, queued again"
            )

    def _sync(self, loop: _Loop) -> None:
        """Take in what the other workers of a shared study did: their finished trials' results (from
        the storage), their running trials and the queue; recover the trials of dead workers.

        The budget counts the study's trials, the running ones included, and the time budget counts from
        the start of the oldest live worker.
        """
        if not self.cfg.shared:
            return
        self._recover_stale(loop.study)
        running: dict[int, str] = {}
        queued: set[str] = set()
        for t in loop.study.get_trials(deepcopy=False):
            if t.state is optuna.trial.TrialState.RUNNING:
                if t.params:
                    running[t.number] = canonical_key(self.space.active(t.params))
                continue
            if t.state is optuna.trial.TrialState.WAITING:  # enqueued: its configuration is a system attr
                fixed = t.system_attrs.get("fixed_params")
                if isinstance(fixed, dict) and fixed:
                    queued.add(canonical_key(self.space.active(fixed)))
                continue
            have = self._results.get(t.number)
            if "duplicate_of" in t.user_attrs or (
                have is not None and have.status is not TrialStatus.RUNNING
            ):
                continue
            result = _stored_result(t)
            if result is None and t.state is optuna.trial.TrialState.FAIL and t.params:
                result = _interrupted(
                    t,
                    self.space.active(t.params),
                    "its worker ended before recording it; it says nothing about the configuration",
                )
            if result is not None:
                self._results[t.number] = result
                if self.memory_gate is not None:
                    self.memory_gate.observe(result)
        loop.running, loop.queued = running, queued
        loop.visited = {
            canonical_key(r.params) for r in self._results.values() if r.status is not TrialStatus.INTERRUPTED
        } | set(running.values())
        # a running trial is counted once (its RUNNING placeholder in a shared --out is not a second one)
        loop.launched_total = sum(
            1 for n, r in self._results.items() if _counts(r) and n not in running
        ) + len(running)
        started = [float(w.get("started_wall_s") or 0) for w in live_workers(loop.study)]
        if loop.heartbeat is not None:
            started.append(loop.heartbeat.started_wall_s)
        loop.start_s = self.clock() - max(0.0, time.time() - min(started))

    def _twin_elsewhere(self, study: optuna.Study, number: int, key: str) -> int | None:
        """Another trial of a shared study that runs or ran this configuration, or None.

        Every worker writes its trial's configuration before it looks, so of two workers that drew the
        same configuration at once the later look sees the other's: at most one runs it.
        """
        if not self.cfg.shared:
            return None
        for t in study.get_trials(deepcopy=False):
            if t.number == number or not t.params or "duplicate_of" in t.user_attrs:
                continue
            if canonical_key(self.space.active(t.params)) != key:
                continue
            if t.state is optuna.trial.TrialState.RUNNING:
                return t.number
            done = self._results.get(t.number) or _stored_result(t)
            if done is not None and done.status not in (TrialStatus.INTERRUPTED, TrialStatus.RUNNING):
                return t.number
        return None

    def run(self) -> StudyOutcome:
        """Run (or resume) the study until a budget ends, it converges, or the user interrupts.

        Opens (or resumes) the study, queues the baseline first, then repeats until a stopping rule
        holds: check the budgets, plan the next configuration, and ask → pre-screen → launch → tell one
        trial. At the end the recommendation is decided and stored in ``study.json`` with the outcome.

        Raises:
            WriteError: a file of the study or its storage could not be written (disk full, read-only,
                no permission): the running trial was ended and is left INTERRUPTED (never RUNNING),
                every finished trial is kept, and running the same command again resumes.
        """
        with StudyLock(self.cfg.study_dir, shared=self.cfg.shared) as lock:
            if lock.took_over:
                self.view.notice(
                    f"the run that held this study (pid {lock.took_over.get('pid')} on "
                    f"{lock.took_over.get('host')}) is gone: its lock was taken over"
                )
            try:
                loop = self._resume()
                with Heartbeat(loop.study, self._storage, self.worker) as heartbeat:
                    loop.heartbeat = heartbeat
                    self._sync(loop)
                    self.view.study_started(self.cfg, loop.launched_total, self.cfg.n_trials)
                    stop: _Stop | None = None
                    while stop is None:
                        self._sync(loop)
                        stop = self._stopping_rule(loop) or self._plan(loop) or self._next_trial(loop)
                        if stop is not None and self._wait_for_silent(loop, stop):
                            stop = None
                    return self._finish(loop, stop)
            except optuna.exceptions.StorageInternalError as exc:
                raise self._storage_failure(exc) from None

    def _wait_for_silent(self, loop: _Loop, stop: _Stop) -> bool:
        """Whether to wait (one heartbeat, then go on) instead of stopping: a shared study's running
        trials whose worker stopped beating go stale after the grace and run again, so the study never
        ends with a slot lost to a dead worker. Bounded: twice the grace at most."""
        if not self.cfg.shared or stop.stopped == "interrupted" or self.interrupted():
            self._silent_waited_s = 0.0
            return False
        silent = silent_trials(loop.study)
        if not silent:
            self._silent_waited_s = 0.0
            return False
        if self._silent_waited_s > 2 * grace_s():
            return False
        if self._silent_waited_s == 0.0:
            self.view.notice(
                f"waiting for trial(s) {', '.join(map(str, silent))} of a worker that stopped beating: "
                f"they run again once stale (at most {grace_s()} s)"
            )
        time.sleep(heartbeat_s())
        self._silent_waited_s += heartbeat_s()
        return True

    def _resume(self) -> _Loop:
        """Write the settings, open the Optuna study and take in what the study directory already holds."""
        old = self._check_compatible()
        # a renamed or copied directory resumes under the name it recorded (see autotune.study.binding)
        self.cfg = replace(self.cfg, study_name=bound_name(self.dir, old, self.cfg.study_name))
        settings = {**self.settings(), "uid": study_uid(old)}
        if old is not None:
            settings["created_wall_s"] = old.get("created_wall_s", settings["created_wall_s"])
            if "calibration" in old:
                settings["calibration"] = old["calibration"]
        try:
            self.dir.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WriteError.of(self.dir.root, exc) from None
        study = self._open()  # a storage that cannot be opened leaves the study directory as it was
        url = self.cfg.secrets.redact_url(self.cfg.storage_url) or str(self.dir.db_path)
        attrs = lambda r: {**trial_attrs(r), **stored_attrs(r, self.dir)}  # noqa: E731
        bound = bind_storage(
            study,
            self.dir,
            settings["uid"],
            shared=self.cfg.shared,
            own=self.cfg.storage_url is None,
            space=self.space,
            attrs=attrs,
            where=url,
        )
        settings["uid"] = bound.uid
        if bound.rebuilt:
            self.view.notice(f"the study storage was rebuilt from {bound.rebuilt} trial directories")
        self.dir.own_dir(self.dir.trials_dir)
        self.dir.write_settings(settings)
        if "settings" not in study.user_attrs:  # what `autotune report --storage` shows before the end
            study.set_user_attr("settings", settings)
        for r in self.dir.results():
            self._results[r.number] = r
        if self.memory_gate is not None:
            for r in self._results.values():
                self.memory_gate.observe(r)
        pending: list[tuple[dict[str, Any], bool]] = [(p, False) for p in self._recover(study)]
        visited = {
            canonical_key(r.params) for r in self._results.values() if r.status is not TrialStatus.INTERRUPTED
        }
        # an interrupted trial said nothing about its configuration: it runs again, first
        for params in _interrupted_unrun(self._results.values()):
            if all(canonical_key(p) != canonical_key(params) for p, _ in pending):
                pending.append((params, False))
        if not baseline_done_or(self._results):
            pending = self._baseline_first(pending)
        # the budget counts launched trials that said something: not pruned before launch, not interrupted
        launched_total = sum(1 for r in self._results.values() if _counts(r))
        return _Loop(
            study=study,
            settings=settings,
            pending=pending,
            visited=visited,
            launched_total=launched_total,
            start_s=self.clock(),
        )

    def _baseline_first(
        self, pending: list[tuple[dict[str, Any], bool]]
    ) -> list[tuple[dict[str, Any], bool]]:
        """``pending`` with the baseline at its head (and not again further down)."""
        baseline = self._baseline_params()
        pending = [(p, b) for p, b in pending if canonical_key(p) != canonical_key(baseline)]
        pending.insert(0, (baseline, True))
        return pending

    def _stopping_rule(self, loop: _Loop) -> _Stop | None:
        """Why the study stops before its next trial: the user, the trial budget or the time budget."""
        if self.interrupted():
            return _Stop("interrupted", "stopped by the user")
        if loop.launched_total >= self.cfg.n_trials:
            return _Stop("budget", f"trial budget of {self.cfg.n_trials} reached")
        elapsed = self.clock() - loop.start_s
        budget = self.cfg.time_budget_s
        if budget is not None:
            reserve = self._confirm_reserve_s()
            if elapsed + reserve >= budget:
                kept = f" ({reserve:.0f}s kept for the re-measurement)" if reserve else ""
                return _Stop("budget", f"time budget of {budget:.0f}s reached{kept}")
        return None

    def _confirm_reserve_s(self) -> float:
        """Time to keep for the re-measurement the results so far would need: its runs at the durations
        their search runs took (0 when it is off or there is nothing to re-measure yet)."""
        if self.cfg.confirm_runs <= 0:
            return 0.0
        results = sorted(self._results.values(), key=lambda r: r.number)
        rec = recommend(results, self.cfg.hardware, min_headroom_frac=self.cfg.min_headroom_frac)
        tasks = self._confirm_tasks(rec, results) if rec is not None else "nothing recommended yet"
        return 0.0 if isinstance(tasks, str) else sum(t.expected_s for t in tasks)

    def _confirm_tasks(self, rec: Recommendation, results: list[TrialResult]) -> list[ConfirmTask] | str:
        """The re-measurement's runs, or why there is none."""
        by_number = {r.number: r for r in results}
        base = by_number.get(rec.baseline_trial) if rec.baseline_trial is not None else None
        if rec.trial == rec.baseline_trial:
            return "the baseline is the winner"
        if base is None or base.status is not TrialStatus.COMPLETE:
            return "the baseline did not complete"
        others = runners_up(results, rec, self.usable)
        return schedule(base, by_number[rec.trial], others, self.cfg.confirm_runs)

    def _plan(self, loop: _Loop) -> _Stop | None:
        """Queue the strategy's next configuration once nothing is pending and the baseline has run.

        Stops the study when the strategy says it has converged, or when a grid has nothing left.
        """
        if loop.pending or loop.queued or not baseline_done_or(self._results):
            return None
        history = list(self._results.values())
        reason = self.strategy.converged(history, self.cfg.n_trials - loop.launched_total, loop.visited)
        if reason:
            used = f"used {loop.launched_total} of {self.cfg.n_trials} trials"
            return _Stop("converged", f"{reason}; {used}")
        left = self.cfg.n_trials - loop.launched_total
        nxt = self.strategy.propose(history, loop.visited, left)
        if nxt is not None:
            loop.pending.append((nxt, False))
            proposal = self.strategy.explain(history, loop.visited, left)
            if proposal is not None and canonical_key(proposal.params) == canonical_key(nxt):
                loop.choices[canonical_key(nxt)] = proposal.choice()
        elif self.strategy.kind == "grid":
            return _Stop("exhausted", _EXHAUSTED)
        return None

    def _next_trial(self, loop: _Loop) -> _Stop | None:
        """Ask → pre-screen → launch → tell one trial (the next queued configuration, else the sampler's).

        The queue is the storage's (Optuna's waiting trials): in a shared study any worker may run what
        another queued, so whether a configuration is the baseline travels with it.
        """
        # what the storage's queue holds runs first (another worker's, or a dead worker's trial)
        take = bool(loop.pending) and not loop.queued
        fixed_params, is_baseline = loop.pending.pop(0) if take else (None, False)
        # workers of one process take from the queue one at a time: SQLite has no row locks, so two
        # threads could both pop one waiting trial (PostgreSQL's SELECT … FOR UPDATE keeps processes apart)
        with _ASKING:
            if fixed_params is not None:
                loop.study.enqueue_trial(
                    fixed_params, user_attrs={"is_baseline": is_baseline}, skip_if_exists=False
                )
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "heartbeat is supposed to be used with Study.optimize"
                trial = loop.study.ask()
            trial.set_user_attr("worker", self.worker.to_dict())
        claim_number(self.dir, loop.study, trial)
        if loop.heartbeat is not None:
            loop.heartbeat.beat_for(trial._trial_id)
        queued = fixed_params is not None or "is_baseline" in trial.user_attrs
        is_baseline = bool(trial.user_attrs.get("is_baseline", False))
        params = self.space.suggest(trial)
        key = canonical_key(params)
        twin = self._twin_elsewhere(loop.study, trial.number, key)
        if key in loop.visited or twin is not None:
            stop = self._duplicate(loop, trial, key, twin)
            if loop.heartbeat is not None:
                loop.heartbeat.beat_for(None)
            return stop
        loop.duplicates = 0
        trial.set_user_attr("is_baseline", is_baseline)
        loop.visited.add(key)
        choice = loop.choices.pop(key, None) or self._default_choice(is_baseline, queued)
        result = self._prescreen(trial.number, params, is_baseline)
        try:
            if result is None:
                try:
                    result = self._launch(loop.study, trial, params, is_baseline, self._time_left_s(loop))
                except KeyboardInterrupt:  # a forced stop (second signal): the trial's processes are ended
                    self._record_forced(loop, trial, key, params, is_baseline)
                    raise
                loop.launched_total += 1 if _counts(result) else 0
                loop.run_now += 1
            self._record(loop, trial, key, result.model_copy(update={"choice": choice}))
        except (WriteError, optuna.exceptions.StorageInternalError) as exc:
            self._abandon(loop.study, trial, params, is_baseline, exc)
            raise
        finally:
            if loop.heartbeat is not None:
                loop.heartbeat.beat_for(None)
        if result.status is TrialStatus.INTERRUPTED and self.interrupted():
            return _Stop("interrupted", f"stopped by the user during trial {result.number}")
        return None

    def _abandon(
        self,
        study: optuna.Study,
        trial: optuna.Trial,
        params: dict[str, Any],
        is_baseline: bool,
        exc: Exception,
    ) -> None:
        """Leave a trial that a failed write cut short INTERRUPTED (never RUNNING), on disk and in Optuna,
        as far as the failing disk or storage allows; a finished trial's result is kept as it is."""
        number = trial.number
        try:
            existing = self.dir.read_result(number)
        except (OSError, ValueError):
            existing = None
        linked = self.dir.trial_dir(number).is_symlink()  # never ours: nothing is written through it
        if not linked and (existing is None or existing.status is TrialStatus.RUNNING):
            cause = (
                exc.one_line() if isinstance(exc, WriteError) else "the study storage could not be written"
            )
            result = TrialResult(
                number=number,
                params=params,
                is_baseline=is_baseline,
                status=TrialStatus.INTERRUPTED,
                reason=f"autotune stopped: {cause.rstrip('.')}; it says nothing about the configuration",
            )
            try:
                self.dir.write_result(result)
            except WriteError:  # the disk refuses even this: drop the RUNNING placeholder (needs no space)
                with contextlib.suppress(OSError):
                    self.dir.trial(number).result_json.unlink(missing_ok=True)
        # best effort: a storage that refuses this leaves the trial RUNNING there, and resuming marks
        # it interrupted (_recover)
        with contextlib.suppress(optuna.exceptions.OptunaError, RuntimeError, ValueError):
            study.tell(trial, state=optuna.trial.TrialState.FAIL)

    def _storage_failure(self, exc: optuna.exceptions.StorageInternalError) -> WriteError:
        """The one-line error for a storage that refused a write (its password masked)."""
        cause = getattr(exc.__cause__, "orig", None) or exc.__cause__ or exc
        text = " ".join(str(cause).split()) or type(cause).__name__
        url = self.cfg.storage_url or f"sqlite:///{self.dir.db_path}"
        return WriteError(
            f"cannot write the study storage {self.cfg.secrets.redact_url(url)}: {self.cfg.secrets.mask(text)[:200]}",
            hint="Free space or fix the storage's permissions, then run the same command again to resume",
        )

    def _default_choice(self, is_baseline: bool, queued: bool) -> dict[str, Any]:
        """Why a configuration the strategy did not explain was run."""
        if is_baseline:
            return {"mode": "baseline"}
        if self.strategy.kind == "grid":
            return {"mode": "grid"}
        # queued without a strategy's reason: a trial re-run after an interruption, or the next
        # unvisited configuration after duplicates; otherwise the Optuna sampler chose it
        return {"mode": "requeued" if queued else "sampler"}

    def _duplicate(
        self, loop: _Loop, trial: optuna.Trial, key: str, elsewhere: int | None = None
    ) -> _Stop | None:
        """Tell a configuration already tried with its twin's result instead of running it again.

        After two duplicates in a row the next unvisited configuration is queued; none left stops the
        study. A twin that another worker is still running (``elsewhere``) leaves this trial FAIL.
        """
        twin = next((r for r in self._results.values() if canonical_key(r.params) == key), None)
        if twin is None and elsewhere is not None:
            trial.set_user_attr("duplicate_of", elsewhere)
            loop.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            time.sleep(random.uniform(0.0, 0.5))  # two workers that drew alike draw again apart
            return None
        trial.set_user_attr("duplicate_of", twin.number if twin else -1)
        if twin is not None and twin.status is not TrialStatus.INTERRUPTED:
            self._tell(loop.study, trial, twin)
        else:
            loop.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        loop.duplicates += 1
        if loop.duplicates >= 2:
            nxt = self.strategy.next_unvisited(loop.visited)
            if nxt is None:
                return _Stop("exhausted", _EXHAUSTED)
            loop.pending.append((nxt, False))
            loop.duplicates = 0
        return None

    def _time_left_s(self, loop: _Loop) -> float | None:
        """What is left of the time budget for the next trial, less what the re-measurement needs (at
        least a second), or None without a budget."""
        left = self._budget_left_s(loop)
        if left is None:
            return None
        return max(1.0, left - self._confirm_reserve_s())

    def _budget_left_s(self, loop: _Loop) -> float | None:
        """What is left of the time budget (may be negative), or None without one."""
        if self.cfg.time_budget_s is None:
            return None
        return self.cfg.time_budget_s - (self.clock() - loop.start_s)

    def _record(self, loop: _Loop, trial: optuna.Trial, key: str, result: TrialResult) -> None:
        """Store a trial's result, let the memory gate learn from it and tell Optuna."""
        self.dir.write_result(result)
        self._results[result.number] = result
        if result.status is TrialStatus.INTERRUPTED:
            loop.visited.discard(key)  # an interrupted trial says nothing: its configuration may run again
        if self.memory_gate is not None:
            self.memory_gate.observe(result)
        try:
            self._tell(loop.study, trial, result)
        except optuna.exceptions.UpdateFinishedTrialError:
            # another worker took this one for dead (its heartbeat lapsed: a stalled host or database)
            # and queued its configuration again; the result stays in the study directory
            self.view.notice(
                f"trial {result.number} was failed in the storage by another worker while it ran (its "
                f"heartbeat lapsed for over {grace_s()}s); its result is kept in {self.dir.root}"
            )
        self.view.trial_finished(result)
        for note in result.notes:
            self.view.notice(f"trial {result.number}: {note}")

    def _record_forced(
        self, loop: _Loop, trial: optuna.Trial, key: str, params: dict[str, Any], is_baseline: bool
    ) -> None:
        """A trial stopped by a forced interrupt: INTERRUPTED on disk and FAIL in Optuna, to run again."""
        result = TrialResult(
            number=trial.number,
            params=params,
            status=TrialStatus.INTERRUPTED,
            reason="stopped by a forced interrupt; it says nothing about the configuration",
            is_baseline=is_baseline,
        )
        try:
            self._record(loop, trial, key, result)
        except Exception as exc:  # the interrupt matters more; resume recovers a RUNNING trial anyway
            log.warning("could not record the interrupted trial %s: %s", trial.number, exc)

    def _finish(self, loop: _Loop, stop: _Stop) -> StudyOutcome:
        """Decide the recommendation, re-measure it (unless the user stopped the study) and store it in
        ``study.json`` with the outcome."""
        self._sync(loop)
        final = not loop.running
        results = sorted(self._results.values(), key=lambda r: r.number)
        rec = recommend(results, self.cfg.hardware, min_headroom_frac=self.cfg.min_headroom_frac)
        if rec is not None:
            if stop.stopped == "interrupted":
                rec = not_remeasured(rec, "the study was stopped before the re-measurement")
            elif not final:
                rec = not_remeasured(
                    rec, "other workers were still running trials: the last one to finish re-measures"
                )
            else:
                rec, interrupted = self._confirm(loop, rec, results)
                if interrupted:
                    stop = _Stop("interrupted", "stopped by the user during the re-measurement")
        confirmation = rec.confirmation if rec is not None else None
        settings = loop.settings
        settings["finished_wall_s"] = time.time()
        settings["outcome"] = {
            "stopped": stop.stopped,
            "detail": stop.detail,
            "trials_run": loop.launched_total,
            "trials_run_now": loop.run_now,
            "gpu_seconds": sum(r.gpu_seconds for r in results)
            + (confirmation.gpu_seconds if confirmation else 0.0),
            "trial_seconds": sum(r.duration_s for r in results),
            "confirm_seconds": confirmation.duration_s if confirmation else 0.0,
            "confirm_gpu_seconds": confirmation.gpu_seconds if confirmation else 0.0,
            "recommended_trial": rec.trial if rec else None,
        }
        settings["recommendation"] = rec.model_dump(mode="json") if rec is not None else None
        if self.memory_gate is not None:
            settings["calibration"] = self.memory_gate.state()
        self.dir.write_settings(settings)
        if final:
            loop.study.set_user_attr("settings", settings)
        return StudyOutcome(
            results=results,
            recommendation=rec,
            stopped=stop.stopped,
            detail=stop.detail,
            trials_run_now=loop.run_now,
            trials_run=loop.launched_total,
            budget_trials=self.cfg.n_trials,
            final=final,
        )

    def _confirm(
        self, loop: _Loop, rec: Recommendation, results: list[TrialResult]
    ) -> tuple[Recommendation, bool]:
        """Re-measure the winner against the baseline (and close runners-up), interleaved, and judge.

        Returns:
            (the recommendation with its verdict, whether the user stopped the re-measurement).
        """
        n = self.cfg.confirm_runs
        if n <= 0:
            return not_remeasured(rec, "re-measurement off (--confirm-runs 0)"), False
        tasks = self._confirm_tasks(rec, results)
        if isinstance(tasks, str):
            return not_remeasured(rec, tasks), False
        runner = Confirmer(
            self.dir,
            self._launch_confirm,
            time_left=lambda: self._budget_left_s(loop),
            interrupted=self.interrupted,
            reaper=self.reaper,
            notice=self.view.notice,
        )
        compared = ", ".join(f"trial {t.trial}" for t in tasks if t.round == 1)
        self.view.notice(f"re-measuring {compared}: {n} interleaved run(s) of each")
        runs, note, interrupted = runner.run(tasks)
        duration_s, gpu_s = runs_cost(runs)
        confirmation = Confirmation(
            rounds=n, runs=runs, duration_s=duration_s, gpu_seconds=gpu_s, method=METHOD, note=note
        )
        judged = judge(rec, confirmation, {r.number: r for r in results}, self.cfg.hardware)
        self.view.notice(headline(judged))
        return judged, interrupted

    def _launch_confirm(self, task: ConfirmTask, directory: Path, time_left_s: float | None) -> TrialResult:
        """One re-measurement run through the study's executor (never pruned: it is a measurement)."""
        ctx = self._context(directory, master_port=free_port())
        derived = self.backend.derive(dict(task.params), ctx)
        spec = TrialSpec(number=task.trial, params=task.params, derived=derived, is_baseline=task.is_baseline)
        if self.hygiene is not None:
            self.hygiene()
        return self.executor.execute(
            spec, ctx, on_step=lambda step, throughput, optimistic: None, time_left_s=time_left_s
        )

    def _launch(
        self,
        study: optuna.Study,
        trial: optuna.Trial,
        params: dict[str, Any],
        is_baseline: bool,
        time_left_s: float | None,
    ) -> TrialResult:
        number = trial.number
        trial_dir = self.dir.own_dir(self.dir.trial_dir(number))
        ctx = self._context(trial_dir, master_port=free_port())
        derived = self.backend.derive(params, ctx)
        spec = TrialSpec(number=number, params=params, derived=derived, is_baseline=is_baseline)
        self.dir.write_result(
            TrialResult(
                number=number,
                params=params,
                derived=derived,
                is_baseline=is_baseline,
                status=TrialStatus.RUNNING,
                reason="running",
            )
        )
        if self.hygiene is not None:
            self.hygiene()
        self.view.trial_started(number, params, is_baseline)

        def on_step(step: int, throughput: float | None, optimistic: float) -> str | None:
            self.view.trial_step(number, step, throughput)
            if throughput is None or is_baseline:
                return None
            try:
                trial.report(optimistic, step)
            except optuna.exceptions.UpdateFinishedTrialError:  # failed by another worker: see _record
                return None
            if trial.should_prune():
                best = study.best_value if _has_complete(study) else None
                return (
                    f"pruned: at most {optimistic:.3g} completions/s, clearly below the best so far ({best:.3g})"
                    if best
                    else "pruned"
                )
            return None

        result = self.executor.execute(spec, ctx, on_step=on_step, time_left_s=time_left_s)
        if self.memory_gate is not None and result.estimate is None:
            _, breakdown = self.memory_gate.check(params, derived)
            if breakdown is not None:
                result = result.model_copy(update={"estimate": breakdown})
        return result


#: the name of the value Optuna records (``study.set_metric_names``)
METRIC_NAME = "completions_per_s"


def trial_attrs(result: TrialResult) -> dict[str, Any]:
    """The user attributes a trial carries in Optuna: how it ended and what it measured.

    ``status`` and ``reason`` always; the rest when measured: ``peak_mem_bytes`` (one entry per GPU),
    ``tokens_per_s``, ``gpu_util_mean_pct`` and ``gpu_idle_share`` (means over the GPUs),
    ``host_peak_rss_bytes``, ``steps``, ``throughput`` (also for a trial that is not COMPLETE) and
    ``failed_phase``.
    """
    attrs: dict[str, Any] = {"status": result.status.value, "reason": result.reason[:500]}
    gpus = [g for g in (result.timeline_summary or {}).get("gpus") or [] if isinstance(g, dict)]
    measured: dict[str, Any] = {
        "steps": result.steps,
        "throughput": result.throughput,
        "tokens_per_s": result.steady.tokens_per_s if result.steady is not None else None,
        "peak_mem_bytes": list(result.peak_mem_bytes)
        if any(p is not None for p in result.peak_mem_bytes)
        else None,
        "gpu_util_mean_pct": _mean_of(gpus, "util_mean_pct"),
        "gpu_idle_share": _mean_of(gpus, "idle_share"),
        "host_peak_rss_bytes": result.host_peak_rss_bytes,
        "failed_phase": result.failed_phase,
    }
    attrs.update({k: v for k, v in measured.items() if v is not None})
    return attrs


def stored_attrs(result: TrialResult, study_dir: StudyDir) -> dict[str, Any]:
    """What a trial keeps in the storage so that any host can report the study and export its winner:
    its whole result and its launch plan (both as on disk: no secret in either)."""
    attrs: dict[str, Any] = {"result": result.model_dump_json()}
    launch = study_dir.trial(result.number).launch_json
    with contextlib.suppress(OSError):
        if launch.is_file() and not launch.is_symlink():
            attrs["launch"] = launch.read_text(encoding="utf-8")
    return attrs


def _interrupted(trial: optuna.trial.FrozenTrial, params: dict[str, Any], reason: str) -> TrialResult:
    """The result of a trial that was stopped before it said anything about its configuration."""
    return TrialResult(
        number=trial.number,
        params=params,
        status=TrialStatus.INTERRUPTED,
        reason=reason,
        is_baseline=bool(trial.user_attrs.get("is_baseline")),
    )


def _stored_result(trial: optuna.trial.FrozenTrial) -> TrialResult | None:
    """The result a worker stored in a trial (:func:`stored_attrs`), or None."""
    raw = trial.user_attrs.get("result")
    if not isinstance(raw, str):
        return None
    try:
        result = TrialResult.model_validate_json(raw)
    except ValueError:
        return None
    return result if result.number == trial.number else None


def _mean_of(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [
        float(r[key])
        for r in rows
        if isinstance(r.get(key), int | float) and not isinstance(r.get(key), bool)
    ]
    return sum(values) / len(values) if values else None


def _has_complete(study: optuna.Study) -> bool:
    return any(t.value for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))


def _counts(result: TrialResult) -> bool:
    """Whether a trial used a slot of the trial budget: it was launched and was not interrupted."""
    if result.status in (TrialStatus.INTERRUPTED, TrialStatus.RUNNING):  # RUNNING: counted as running
        return False
    return result.steps > 0 or result.status is not TrialStatus.PRUNED


def _interrupted_unrun(results: Any) -> list[dict[str, Any]]:
    """Configurations whose last trial was interrupted and that no later trial ran, oldest first."""
    last: dict[str, TrialResult] = {}
    for r in sorted(results, key=lambda r: r.number):
        last[canonical_key(r.params)] = r
    return [
        r.params for r in sorted(last.values(), key=lambda r: r.number) if r.status is TrialStatus.INTERRUPTED
    ]


def baseline_done_or(results: Mapping[int, TrialResult]) -> bool:
    """True once the baseline has been run (or could not be)."""
    return any(r.is_baseline and r.status is not TrialStatus.INTERRUPTED for r in results.values())


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
