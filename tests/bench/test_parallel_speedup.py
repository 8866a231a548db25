"""The parallel-speedup bench: paced trials, the run-twice and lost counts, one shared study end to end.

A narrowed TRL setting keeps the surface to a few hundred configurations, so the study runs in seconds.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import parallel_speedup as ps  # noqa: E402
from _settings import SETTINGS  # noqa: E402
from _surfaces import RawTable, Surface  # noqa: E402
from search_efficiency import SimulatedExecutor  # noqa: E402

from autotune.records import TrialResult, TrialSpec, TrialStatus  # noqa: E402
from tests.bench.test_search_efficiency import NARROW  # noqa: E402  (the same narrowed surface)


@pytest.fixture(scope="module")
def narrowed(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    setting = replace(SETTINGS[0], narrow=NARROW)  # trl Qwen2.5-1.5B on 4 x A10
    tmp = tmp_path_factory.mktemp("parbench")
    space = setting.space()
    return (
        setting,
        space,
        RawTable(setting, space, setting.make_backend(), setting.context(tmp / "ctx" / "0")),
    )


class FakeClock:
    """A clock that moves only when the executor waits: what it waited for is recorded."""

    def __init__(self) -> None:
        self.now = 100.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now


class RecordingStop(threading.Event):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.clock.waits.append(timeout)
        self.clock.now += timeout
        return False


def test_a_paced_trial_lasts_its_simulated_duration_scaled(narrowed: tuple, tmp_path: Path) -> None:
    setting, space, table = narrowed
    surface = Surface(table, 7)
    best, _, _ = surface.optimum()
    clock = FakeClock()
    executor = ps.PacedExecutor(
        SimulatedExecutor(surface, setting.n_gpus), 3600.0, RecordingStop(clock), clock
    )
    steps_seen: list[float] = []

    def on_step(step: int, tp: float | None, optimistic: float) -> str | None:
        steps_seen.append(clock.now)
        return None

    spec = TrialSpec(number=1, params=best, derived={}, is_baseline=False)
    result = executor.execute(
        spec, setting.context(tmp_path / "trials" / "1"), on_step=on_step, time_left_s=None
    )
    assert result.status is TrialStatus.COMPLETE
    # an hour lasts 3600 s here: the trial took exactly its simulated seconds, its steps in order
    assert clock.now - 100.0 == pytest.approx(result.duration_s)
    assert steps_seen == sorted(steps_seen) and steps_seen[0] - 100.0 > surface.truth(best).startup_s


def _result(number: int, params: dict, status: TrialStatus) -> TrialResult:
    return TrialResult(number=number, params=params, status=status, reason="")


def test_run_twice_counts_repeated_configurations_but_not_interrupted_ones() -> None:
    a, b = {"x": 1}, {"x": 2}
    once = [_result(0, a, TrialStatus.COMPLETE), _result(1, b, TrialStatus.OOM)]
    assert ps.runs_twice(once) == 0
    assert ps.runs_twice([*once, _result(2, a, TrialStatus.INTERRUPTED)]) == 0
    assert ps.runs_twice([*once, _result(2, a, TrialStatus.PRUNED), _result(3, a, TrialStatus.COMPLETE)]) == 2


def test_lost_counts_running_and_waiting_trials() -> None:
    results = [_result(0, {"x": 1}, TrialStatus.COMPLETE), _result(1, {"x": 2}, TrialStatus.RUNNING)]
    assert ps.lost_trials(results, ["COMPLETE", "FAIL", "PRUNED"]) == 1
    assert ps.lost_trials(results[:1], ["COMPLETE", "WAITING", "RUNNING"]) == 2


def test_two_workers_finish_one_budget_with_nothing_run_twice_or_lost(
    narrowed: tuple, tmp_path: Path
) -> None:
    setting, space, table = narrowed
    runs = [ps.run_study(setting, space, table, 100, workers, 6, 0.5, tmp_path, None) for workers in (1, 2)]
    for run in runs:
        assert run.run_twice == 0 and run.lost == 0 and run.error is None
        assert run.trials_run >= 1 and 0.0 <= run.regret <= 1.0 and run.gpu_h > 0
    assert runs[1].workers == 2 and runs[1].stopped in ("budget", "converged")
    table_text = ps.render(runs, 6, [100], 0.5, "SQLite")
    rows = [line for line in table_text.splitlines() if line.startswith(f"| {setting.name}")]
    assert [row.split("|")[2].strip() for row in rows] == ["1", "2"]
    assert "1.00x" in rows[0]  # one worker is the reference
