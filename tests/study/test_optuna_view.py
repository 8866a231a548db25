"""Optuna's view of a study is the measurements: intermediate values are measured throughput (never the
pruner's optimistic bound), a PRUNED trial's value is what it measured, and ``optuna studies`` prints
short rows (the full settings stay in study.json and in attributes Optuna's listings do not print)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.records import SteadyEstimate, TrialResult, TrialSpec, TrialStatus
from autotune.study.optuna_view import MachineAttrs
from tests.study.test_loop import FakeExecutor, make

# the bound the trial reports beside its measurement: far above it, so a test that read it would see it
OPTIMISM = 1.5


class SteppingExecutor(FakeExecutor):
    """Reports every step to the study (measured throughput, an optimistic bound 50 % above it) and
    stops when the study says so; the measurement drifts down a little from step to step, so the final
    estimate differs from the last value reported."""

    def __init__(self) -> None:
        super().__init__()
        self.reported: dict[int, list[tuple[int, float, float]]] = {}

    def execute(self, spec: TrialSpec, ctx: Any, *, on_step, time_left_s) -> TrialResult:  # noqa: ANN001
        done = super().execute(spec, ctx, on_step=on_step, time_left_s=time_left_s)
        if done.status is not TrialStatus.COMPLETE or done.steady is None:
            return done
        tp = done.steady.throughput
        reason = None
        steps = 0
        for step in range(1, 9):
            measured = tp * (1 - 0.01 * step)
            self.reported.setdefault(spec.number, []).append((step, measured, measured * OPTIMISM))
            steps = step
            reason = on_step(step, measured, measured * OPTIMISM)
            if reason:
                break
        final = tp * (1 - 0.01 * steps) * 0.99  # the end-of-run estimate, over every step
        steady = SteadyEstimate(
            step_time_s=16 / final, rel_ci95=0.01, steady_steps=steps, warmup_steps=1, throughput=final
        )
        status = TrialStatus.PRUNED if reason else TrialStatus.COMPLETE
        return done.model_copy(
            update={"status": status, "reason": reason or "completed", "steps": steps, "steady": steady}
        )


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SteppingExecutor]:
    """One grid study of eight trials (the baseline, completed trials, trials pruned as slower)."""
    tmp_path = tmp_path_factory.mktemp("optuna-view")
    study, ex = make(tmp_path, n_trials=8, search="grid", executor=SteppingExecutor())
    study.run()
    return tmp_path, ex


def _study(
    ran: tuple[Path, SteppingExecutor],
) -> tuple[optuna.Study, dict[int, dict[str, Any]], SteppingExecutor]:
    tmp_path, ex = ran
    loaded = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's' / 'study.db'}")
    results = {
        int(p.parent.name): json.loads(p.read_text())
        for p in (tmp_path / "s" / "trials").glob("*/result.json")
        if p.parent.name.isdigit()
    }
    return loaded, results, ex


def test_values_and_intermediate_values_are_the_measurements(ran: tuple[Path, SteppingExecutor]) -> None:
    loaded, results, ex = _study(ran)
    trials = {t.number: t for t in loaded.get_trials(deepcopy=False)}
    seen = {"COMPLETE": 0, "PRUNED_RAN": 0}
    for number, r in results.items():
        t = trials[number]
        measured = r["steady"]["throughput"] if r.get("steady") else None
        reported = {step: value for step, value, _ in ex.reported.get(number, [])}
        if r["status"] == "COMPLETE":
            seen["COMPLETE"] += 1
            assert t.state is optuna.trial.TrialState.COMPLETE and t.value == measured
        elif r["status"] == "PRUNED" and r["steps"] > 0:
            seen["PRUNED_RAN"] += 1
            assert t.state is optuna.trial.TrialState.PRUNED
            assert t.value == measured  # what it measured, not the bound it was pruned on
            last = max(reported)
            assert t.intermediate_values[last + 1] == measured
        # every value reported during the run is the measured one, none is the optimistic bound
        for step, value in reported.items():
            if not r.get("is_baseline"):
                assert t.intermediate_values[step] == value
    assert seen["COMPLETE"] >= 2 and seen["PRUNED_RAN"] >= 1, seen


def test_optuna_studies_prints_short_rows_and_the_settings_stay_reachable(
    ran: tuple[Path, SteppingExecutor],
) -> None:
    loaded, _, _ = _study(ran)
    tmp_path = ran[0]
    shown = loaded.user_attrs
    assert shown["study_json"] == str(tmp_path / "s" / "study.json") and shown["backend"] == "fake"
    assert shown["gpus"] == "cpu"
    full = MachineAttrs(loaded).get("settings")
    assert full == json.loads((tmp_path / "s" / "study.json").read_text())
    assert isinstance(MachineAttrs(loaded).get("identity"), dict)
    cli = "import sys; from optuna.cli import main; sys.exit(main())"
    url = f"sqlite:///{tmp_path / 's' / 'study.db'}"
    proc = subprocess.run(
        [sys.executable, "-c", cli, "studies", "--storage", url],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    rows = [line for line in proc.stdout.splitlines() if line.strip()]
    assert any(loaded.study_name in line for line in rows), proc.stdout
    assert max(len(line) for line in rows) < 300, proc.stdout


class _CountingView:
    """A view that keeps what the study told it of the re-measurement."""

    def __init__(self) -> None:
        self.planned: list[int] = []
        self.ran = 0

    def study_started(self, cfg: Any, done: int, budget: int) -> None: ...
    def trial_started(self, number: int, params: Any, is_baseline: bool) -> None: ...
    def trial_step(self, number: int, step: int, throughput: float | None) -> None: ...
    def trial_finished(self, result: TrialResult) -> None: ...
    def notice(self, text: str) -> None: ...

    def remeasure_started(self, runs: int) -> None:
        self.planned.append(runs)

    def remeasure_ran(self) -> None:
        self.ran += 1


def test_the_view_is_told_how_many_re_measurement_runs_there_are_and_each_that_ends(tmp_path: Path) -> None:
    from tests.study.test_confirm import ScriptedExecutor, _setup

    ex = ScriptedExecutor()
    study = _setup(tmp_path, ex, n_trials=4)
    view = _CountingView()
    study.view = view
    outcome = study.run()
    runs = outcome.recommendation.confirmation.runs
    assert view.planned == [len(ex.confirm_calls)] == [len(runs)] and len(runs) >= 4
    assert view.ran == len(runs)
