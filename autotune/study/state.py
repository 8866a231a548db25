"""What the parts of the study loop share: the settings, the study directory and the results so far
(:class:`StudyState`), what one run carries from trial to trial (:class:`LoopState`), and why it
stops (:class:`Stop`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar, cast, overload

import optuna

from autotune.backends import Backend
from autotune.records import TrialResult
from autotune.space import SearchSpace
from autotune.strategy import BaseStrategy
from autotune.study.config import MemoryGate, StudyConfig, StudyView, TrialExecutor
from autotune.study.storage import Heartbeat
from autotune.studydir import StudyDir

__all__ = ["LoopState", "Shared", "Stop", "StudyPart", "StudyState"]

T = TypeVar("T")


@dataclass(frozen=True)
class Stop:
    """Why the loop stops (the ``stopped`` and ``detail`` of :class:`StudyOutcome`)."""

    stopped: Literal["budget", "converged", "exhausted", "interrupted"]
    detail: str


@dataclass
class LoopState:
    """What one run of the loop carries from trial to trial.

    Attributes:
        pending: configurations to run next, each with whether it is the baseline.
        visited: canonical keys of the configurations tried (interrupted ones excepted).
        launched_total: trials launched in the whole study.
        start_s: the study clock when this run began (the time budget counts from it).
        run_now: trials launched by this run.
        duplicates: asks in a row that returned a configuration already tried.
        refused: configurations in a row the pre-screen refused (never launched).
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
    refused: int = 0
    choices: dict[str, dict[str, Any]] = field(default_factory=dict)
    running: dict[int, str] = field(default_factory=dict)
    queued: set[str] = field(default_factory=set)
    heartbeat: Heartbeat | None = None


@dataclass
class StudyState:
    """What the study's parts share, read at every use: a caller may replace any of it (the settings,
    the reaper, the clock, ...) on the :class:`~autotune.study.loop.Study` before ``run``, and every part
    sees the change.

    Attributes:
        cfg: the study's settings.
        dir: the study directory.
        backend: the framework's backend.
        space: the search space.
        executor: runs a launched trial.
        memory_gate: the memory estimate's gate, or None.
        view: the live display.
        reaper: ends what a dead trial left running in its directory (a note on what it did), or None.
        hygiene: cleans the GPUs before a launch, or None.
        interrupted: whether the user stopped the study.
        clock: the study clock.
        strategy: the search strategy.
        results: every trial this worker knows of, by number (its own, the storage's, the directory's).
    """

    cfg: StudyConfig
    dir: StudyDir
    backend: Backend
    space: SearchSpace
    executor: TrialExecutor
    memory_gate: MemoryGate | None
    view: StudyView
    reaper: Callable[[Path], str | None] | None
    hygiene: Callable[[], None] | None
    interrupted: Callable[[], bool]
    clock: Callable[[], float]
    results: dict[int, TrialResult] = field(default_factory=dict)
    strategy: BaseStrategy = field(init=False)  # set once the pre-screen it borrows from exists


class Shared(Generic[T]):
    """An attribute of a study part that lives in its :class:`StudyState` (``self.state``)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> Shared[T]: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> T: ...
    def __get__(self, obj: object | None, objtype: type | None = None) -> T | Shared[T]:
        if obj is None:
            return self
        return cast("T", getattr(obj.state, self.name))  # type: ignore[attr-defined]

    def __set__(self, obj: object, value: T) -> None:
        setattr(obj.state, self.name, value)  # type: ignore[attr-defined]


class StudyPart:
    """A part of the study loop (the study, its pre-screen, workers, finish): its collaborators and
    results are the shared :class:`StudyState`'s."""

    cfg: Shared[StudyConfig] = Shared()
    dir: Shared[StudyDir] = Shared()
    backend: Shared[Backend] = Shared()
    space: Shared[SearchSpace] = Shared()
    executor: Shared[TrialExecutor] = Shared()
    memory_gate: Shared[MemoryGate | None] = Shared()
    view: Shared[StudyView] = Shared()
    reaper: Shared[Callable[[Path], str | None] | None] = Shared()
    hygiene: Shared[Callable[[], None] | None] = Shared()
    interrupted: Shared[Callable[[], bool]] = Shared()
    clock: Shared[Callable[[], float]] = Shared()
    strategy: Shared[BaseStrategy] = Shared()

    def __init__(self, state: StudyState) -> None:
        self.state = state

    @property
    def _results(self) -> dict[int, TrialResult]:
        return self.state.results
