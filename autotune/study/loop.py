"""The study loop: ask → pre-screen → run → tell, with resume, budgets and the recommendation.

:class:`Study` opens (or resumes) the study and runs the loop: each turn it takes in the other workers'
trials, checks the stopping rules, asks for the next configuration, and runs one trial through Optuna's
ask, the pre-screen, the executor and the tell. Its parts live beside it and share one
:class:`~autotune.study.state.StudyState`:

- :mod:`~autotune.study.ask`: the baseline first, the strategy's next configuration (through
  :class:`~autotune.strategy.BaseStrategy`'s contract only), the stopping rules, duplicates;
- :mod:`~autotune.study.prescreen`: what is refused before launch;
- :mod:`~autotune.study.tell`: how a trial is recorded in Optuna and read back;
- :mod:`~autotune.study.workers`: other workers' trials, queue and dead workers, through the storage;
- :mod:`~autotune.study.finish`: the recommendation, its re-measurement and the stored outcome;
- :mod:`~autotune.study.config`: the settings and outcome, and the collaborators' contracts.

Collaborators (backend, search strategy, memory gate, runner, samplers, GPU hygiene, view) are passed
in, so tests substitute fakes. The study never samples hardware itself: measurements arrive in the
runner's record and the timeline summary.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import warnings
import zlib
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna

from autotune.backends import Backend
from autotune.errors import UsageError, WriteError
from autotune.records import TrialResult, TrialSpec, TrialStatus
from autotune.space import SearchSpace, canonical_key
from autotune.strategy import BaseStrategy, Collaborators, StrategySettings, build_strategy
from autotune.study.ask import Asker
from autotune.study.binding import bind_storage, bound_name, claim_number, study_uid
from autotune.study.ceiling import TrialCeilings
from autotune.study.config import (
    LaunchCheck,
    MemoryGate,
    NullView,
    StudyConfig,
    StudyOutcome,
    StudyView,
    TrialExecutor,
    check_budget,
    free_port,
    summary_line,
)
from autotune.study.finish import Finisher
from autotune.study.identity import identity_differences, study_identity
from autotune.study.lock import StudyLock
from autotune.study.optuna_view import MachineAttrs, shown_attrs
from autotune.study.prescreen import Prescreen
from autotune.study.state import LoopState, Stop, StudyPart, StudyState
from autotune.study.storage import (
    Heartbeat,
    Worker,
    grace_s,
    heartbeat_s,
    open_storage,
    silent_trials,
    storage_error,
)
from autotune.study.tell import (
    METRIC_NAME,
    MeasureEvery,
    SlowerThanBest,
    baseline_done_or,
    counts_in_budget,
    has_complete,
    interrupted_unrun,
    stored_attrs,
    tell,
    trial_attrs,
)
from autotune.study.workers import Workers
from autotune.studydir import StudyDir
from autotune.studysettings import StudySettings
from autotune.trial.execute import not_launched

__all__ = [
    "METRIC_NAME",
    "MemoryGate",
    "NullView",
    "Study",
    "StudyConfig",
    "StudyOutcome",
    "StudyView",
    "TrialExecutor",
    "baseline_done_or",
    "check_budget",
    "free_port",
    "stored_attrs",
    "summary_line",
    "trial_attrs",
]

log = logging.getLogger(__name__)


_ASKING = threading.Lock()


class Study(StudyPart):
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
        strategy: BaseStrategy | None = None,
        strategy_settings: StrategySettings | None = None,
    ) -> None:
        super().__init__(
            StudyState(
                cfg=cfg,
                dir=StudyDir(cfg.study_dir),
                backend=backend,
                space=space,
                executor=executor,
                memory_gate=memory_gate,
                view=view or NullView(),
                reaper=reaper,
                hygiene=hygiene,
                interrupted=interrupted,
                clock=clock,
            )
        )
        self.worker = Worker.this(cfg.worker_slot)
        self.screen = Prescreen(self.state)
        self.workers = Workers(self.state, self._learn)
        self.finisher = Finisher(self.state, self.screen)
        self.asker = Asker(self.state, self.screen, self.finisher)
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
        self.strategy = strategy or build_strategy(
            cfg.search,
            space,
            Collaborators(
                rank=memory_gate.rank if memory_gate else None,
                # a gate that can split its prediction by phase (the estimator's) enables the phase model
                phase_prior=getattr(memory_gate, "phase_times", None),
                valid=self.screen.valid,
                feasible=self.screen.cheap_feasible,
                memory_load=self.screen.memory_load if memory_gate else None,
                usable=self.screen.usable,
                ceiling_throughput=self._ceiling_throughput(memory_gate),
            ),
            seed=seed,
            settings=strategy_settings,
        )
        self.pruner = SlowerThanBest() if cfg.prune else MeasureEvery()
        self.ceilings = TrialCeilings.for_study(cfg)
        self._silent_waited_s = 0.0  # how long this worker waited for a dead worker's trial to go stale
        self._storage: optuna.storages.BaseStorage | None = None

    def _ceiling_throughput(self, gate: object) -> Callable[[Mapping[str, Any]], float | None] | None:
        """The physical ceiling's completions/s of a configuration, from a gate that knows its step's
        least seconds (the estimator's: ``ceiling_s``), or None."""
        ceiling_s = getattr(gate, "ceiling_s", None)
        if ceiling_s is None or not self.cfg.hardware.gpus:
            return None
        batch = self.cfg.global_batch

        def bound(params: Mapping[str, object]) -> float | None:
            try:
                seconds = float(ceiling_s(params))
            except (ValueError, KeyError, ZeroDivisionError):  # a shape the ceiling cannot price
                return None
            return batch / seconds if seconds > 0 else None

        return bound

    def _learn(self, result: TrialResult) -> None:
        """A result the study took in (its own, another worker's, or stored): the memory gate and the
        strategy learn from it."""
        if self.memory_gate is not None:
            self.memory_gate.observe(result)
        self.strategy.after_trial(result)

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
            "semantics": dict(c.semantics),
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

    def _check_compatible(self) -> StudySettings | None:
        if not self.dir.exists():
            return None
        old = self.dir.read_settings()
        differences = identity_differences(old.identity, self.identity())
        if differences:
            raise UsageError(
                f"{self.dir.root} holds a different study: {'; '.join(differences)}",
                hint="Resume it with the command it was started with (study.json: command), "
                "or choose a new --out to start a new study",
            )
        return old

    # -- optuna --------------------------------------------------------------------------------
    def _open(self) -> optuna.Study:
        url = self.cfg.storage_url or f"sqlite:///{self.dir.own_file(self.dir.db_path)}"
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        # ":memory:" keeps the Optuna study in this process only (benches, tests): the trial results
        # still land in the study directory, but Optuna's own history does not persist
        own = self.cfg.storage_url is None
        self._storage = open_storage(
            url, self.cfg.secrets, on_stale=lambda _s, t: self.workers.stale.append(t), own=own
        )
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
            raise storage_error(url, exc, self.cfg.secrets, own=own) from None
        self._check_same_definition(study, url)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([METRIC_NAME])
        machine = MachineAttrs(study)
        for key, value in self._study_attrs().items():
            machine.set(key, value)
        for key, value in self._shown_attrs().items():
            study.set_user_attr(key, value)
        return study

    def _check_same_definition(self, study: optuna.Study, url: str) -> None:
        """A study name already in the storage must hold the same study (its identity attribute)."""
        stored = MachineAttrs(study).get("identity")
        if not isinstance(stored, dict):
            return
        differences = identity_differences(stored, self.identity())
        if differences:
            raise UsageError(
                f"the study {self.cfg.name!r} in {self.cfg.secrets.redact_url(url)} has a different "
                f"definition: {'; '.join(differences)}",
                hint="Join it with the same arguments as its other workers, or choose another --study-name",
            )

    def _shown_attrs(self) -> dict[str, str]:
        """What Optuna's tools show about the study (:func:`~autotune.study.optuna_view.shown_attrs`)."""
        gpus = self.cfg.hardware.gpus
        names = sorted({g.name for g in gpus})
        shown = f"{len(gpus)}x {' / '.join(names)}" if gpus else "cpu"
        return shown_attrs(
            backend=self.cfg.backend,
            model=self.cfg.model.name,
            gpus=shown,
            settings_path=str(self.dir.root / StudyDir.SETTINGS),
        )

    def _study_attrs(self) -> dict[str, Any]:
        """What autotune reads back about the study: hardware, model, backend, versions, identity."""
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

    # -- the loop -------------------------------------------------------------------------------
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
                    self.workers.sync(loop)
                    self.view.study_started(self.cfg, loop.launched_total, self.cfg.n_trials)
                    stop: Stop | None = None
                    while stop is None:
                        self.workers.sync(loop)
                        stop = (
                            self.asker.stopping_rule(loop) or self.asker.plan(loop) or self._next_trial(loop)
                        )
                        if stop is not None and self._wait_for_silent(loop, stop):
                            stop = None
                    self.workers.sync(loop)
                    return self.finisher.finish(loop, stop)
            except optuna.exceptions.StorageInternalError as exc:
                raise self._storage_failure(exc) from None

    def _wait_for_silent(self, loop: LoopState, stop: Stop) -> bool:
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

    def _resume(self) -> LoopState:
        """Write the settings, open the Optuna study and take in what the study directory already holds."""
        old = self._check_compatible()
        # a renamed or copied directory resumes under the name it recorded (see autotune.study.binding)
        self.cfg = replace(self.cfg, study_name=bound_name(self.dir, old, self.cfg.study_name))
        uid = study_uid(old)
        settings = {**self.settings(), "uid": uid}
        if old is not None:
            if "created_wall_s" in old.model_fields_set:
                settings["created_wall_s"] = old.created_wall_s
            if "calibration" in old.model_fields_set:
                settings["calibration"] = old.calibration
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
            uid,
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
        self.dir.write_settings(StudySettings.from_json(settings))
        machine = MachineAttrs(study)
        if machine.get("settings") is None:  # what `autotune report --storage` shows before the end
            machine.set("settings", settings)
        for r in self.dir.results():
            self._results[r.number] = r
        for r in self._results.values():
            self._learn(r)
        pending: list[tuple[dict[str, Any], bool]] = [(p, False) for p in self.workers.recover(study)]
        visited = {
            canonical_key(r.params) for r in self._results.values() if r.status is not TrialStatus.INTERRUPTED
        }
        # an interrupted trial said nothing about its configuration: it runs again, first
        for params in interrupted_unrun(self._results.values()):
            if all(canonical_key(p) != canonical_key(params) for p, _ in pending):
                pending.append((params, False))
        if not baseline_done_or(self._results):
            pending = self.asker.baseline_first(pending)
        # the budget counts launched trials that said something: not pruned before launch, not interrupted
        launched_total = sum(1 for r in self._results.values() if counts_in_budget(r))
        return LoopState(
            study=study,
            settings=settings,
            pending=pending,
            visited=visited,
            launched_total=launched_total,
            start_s=self.clock(),
        )

    def _next_trial(self, loop: LoopState) -> Stop | None:
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
        twin = self.workers.twin_elsewhere(loop.study, trial.number, key)
        if key in loop.visited or twin is not None:
            stop = self.asker.duplicate(loop, trial, key, twin)
            if loop.heartbeat is not None:
                loop.heartbeat.beat_for(None)
            return stop
        loop.duplicates = 0
        trial.set_user_attr("is_baseline", is_baseline)
        loop.visited.add(key)
        choice = loop.choices.pop(key, None) or self.asker.default_choice(is_baseline, queued)
        result = self.screen.check(
            trial.number, params, is_baseline, memory_probe=bool(choice.get("memory_probe"))
        )
        try:
            if result is None:
                try:
                    result = self._launch(loop.study, trial, params, is_baseline, self._time_left_s(loop))
                except KeyboardInterrupt:  # a forced stop (second signal): the trial's processes are ended
                    self._record_forced(loop, trial, key, params, is_baseline)
                    raise
                loop.launched_total += 1 if counts_in_budget(result) else 0
                loop.run_now += 1
                loop.refused = 0
                refused = None
            else:
                refused = self.asker.refused(loop)
            self._record(loop, trial, key, result.model_copy(update={"choice": choice}))
        except (WriteError, optuna.exceptions.StorageInternalError) as exc:
            self._abandon(loop.study, trial, params, is_baseline, exc)
            raise
        finally:
            if loop.heartbeat is not None:
                loop.heartbeat.beat_for(None)
        if result.status is TrialStatus.INTERRUPTED and self.interrupted():
            return Stop("interrupted", f"stopped by the user during trial {result.number}")
        return refused

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
            result = TrialResult.interrupted(
                number,
                params,
                is_baseline=is_baseline,
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

    def _time_left_s(self, loop: LoopState) -> float | None:
        """What is left of the time budget for the next trial, less what the re-measurement needs (at
        least a second), or None without a budget."""
        left = self.finisher.budget_left_s(loop)
        if left is None:
            return None
        return max(1.0, left - self.finisher.confirm_reserve_s())

    def _record(self, loop: LoopState, trial: optuna.Trial, key: str, result: TrialResult) -> None:
        """Store a trial's result, let the memory gate learn from it and tell Optuna."""
        self.dir.write_result(result)
        self._results[result.number] = result
        if result.status is TrialStatus.INTERRUPTED:
            loop.visited.discard(key)  # an interrupted trial says nothing: its configuration may run again
        self._learn(result)
        try:
            tell(loop.study, trial, result, self.dir, self.pruner.reports)
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
        self, loop: LoopState, trial: optuna.Trial, key: str, params: dict[str, Any], is_baseline: bool
    ) -> None:
        """A trial stopped by a forced interrupt: INTERRUPTED on disk and FAIL in Optuna, to run again."""
        result = TrialResult.interrupted(
            trial.number,
            params,
            reason="stopped by a forced interrupt; it says nothing about the configuration",
            is_baseline=is_baseline,
        )
        try:
            self._record(loop, trial, key, result)
        except Exception as exc:  # the interrupt matters more; resume recovers a RUNNING trial anyway
            log.warning("could not record the interrupted trial %s: %s", trial.number, exc)

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
        ctx = self.screen.context(trial_dir, master_port=free_port())
        derived = self.backend.derive(params, ctx)
        spec = TrialSpec(number=number, params=params, derived=derived, is_baseline=is_baseline)
        refusal = self.executor.launch_refusal(spec, ctx) if isinstance(self.executor, LaunchCheck) else None
        if refusal is not None:  # INVALID, and never recorded RUNNING (nothing was started)
            return not_launched(spec, refusal)
        self.dir.write_result(TrialResult.running(number, params, derived=derived, is_baseline=is_baseline))
        if self.hygiene is not None:
            self.hygiene()
        self.view.trial_started(number, params, is_baseline)

        def on_step(step: int, throughput: float | None, optimistic: float) -> str | None:
            self.view.trial_step(number, step, throughput)
            if throughput is None or is_baseline:
                return None
            try:
                self.pruner.reports.report(trial, step, throughput, optimistic)
            except optuna.exceptions.UpdateFinishedTrialError:  # failed by another worker: see _record
                return None
            if trial.should_prune():
                best = study.best_value if has_complete(study) else None
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
        return self.ceilings.attach(result) if self.ceilings is not None else result
