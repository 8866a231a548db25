"""The re-measurement at the end of a study, through the real loop with a fake backend and an executor
whose step times are scripted: interleaved runs beside the trials (no trial slot, no Optuna trial), the
verdict stored in study.json, resume, interruption, the time budget and the accounting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
from test_loop import FakeExecutor, make

from autotune.records import Recommendation, SteadyEstimate, TrialResult, TrialSpec, TrialStatus
from autotune.study.confirm import runners_up, schedule
from autotune.studydir import StudyDir


class ScriptedExecutor(FakeExecutor):
    """FakeExecutor's surface for the search; a re-measurement run (in a ``confirm-<trial>-<round>``
    directory) takes the step time ``step_s(batch size, round)``, so a test decides what re-measuring
    shows."""

    def __init__(self, step_s=None, *, stop_after: int | None = None, flag=None) -> None:  # noqa: ANN001
        super().__init__()
        self.step_s = step_s or _proportional
        self.confirm_calls: list[tuple[str, dict[str, Any]]] = []
        self.stop_after = stop_after
        self.flag = flag

    def execute(self, spec: TrialSpec, ctx, *, on_step, time_left_s) -> TrialResult:
        if not ctx.trial_dir.name.startswith("confirm-"):
            return super().execute(spec, ctx, on_step=on_step, time_left_s=time_left_s)
        self.confirm_calls.append((ctx.trial_dir.name, dict(spec.params)))
        base = {"number": spec.number, "params": spec.params, "is_baseline": spec.is_baseline}
        if self.stop_after is not None and len(self.confirm_calls) > self.stop_after:
            self.flag[0] = True
            return TrialResult(**base, status=TrialStatus.INTERRUPTED, reason="interrupted by the user")
        round_ = int(ctx.trial_dir.name.rsplit("-", 1)[1])
        step_s = self.step_s(spec.params["per_device_train_batch_size"], round_)
        steady = SteadyEstimate(
            step_time_s=step_s, rel_ci95=0.01, steady_steps=6, warmup_steps=1, throughput=16 / step_s
        )
        return TrialResult(
            **base,
            status=TrialStatus.COMPLETE,
            reason="completed",
            steps=7,
            steady=steady,
            duration_s=3.0,
            gpu_seconds=3.0,
        )


def _proportional(bs: int, round_: int) -> float:
    """20 s / batch size, the second round 2 % slower: batch size b is exactly b / 2 times the baseline's 2."""
    return 20.0 / bs * (1.0 if round_ % 2 else 1.02)


def _same(bs: int, round_: int) -> float:
    """Every configuration equally fast; the rounds differ by 10 %."""
    return 4.0 if round_ % 2 else 4.4


def _with(study, **changes):
    study.cfg = study.cfg.__class__(**{**study.cfg.__dict__, **changes})
    return study


def _setup(tmp_path: Path, ex: ScriptedExecutor, *, n_trials: int = 4, confirm_runs: int = 2, **kw):
    study, _ = make(tmp_path, n_trials=n_trials, executor=ex, **kw)
    return _with(study, confirm_runs=confirm_runs)


def test_the_winner_and_the_baseline_are_re_measured_interleaved_beside_the_trials(tmp_path: Path) -> None:
    ex = ScriptedExecutor()
    outcome = _setup(tmp_path, ex, n_trials=4).run()
    rec = outcome.recommendation
    assert rec is not None and rec.confirmation is not None and rec.confirmation.note is None
    winner_bs = next(r for r in outcome.results if r.number == rec.trial).params[
        "per_device_train_batch_size"
    ]
    assert winner_bs > 2
    # baseline, winner (and runners-up), then the same reversed: each configuration early and late
    names = [name for name, _ in ex.confirm_calls]
    order = [p["per_device_train_batch_size"] for _, p in ex.confirm_calls]
    assert order[0] == 2 and order[1] == winner_bs and order[-1] == 2 and order[-2] == winner_bs
    assert names[0] == "confirm-0-1" and names[-1] == "confirm-0-2"
    assert len(names) == len(set(names)) == 2 * len({name.rsplit("-", 1)[0] for name in names})
    # not trials: the trial count, Optuna's trials and the trial budget are untouched
    assert outcome.trials_run == 4 and len(outcome.results) == 4
    storage = f"sqlite:///{tmp_path / 's' / 'study.db'}"
    assert len(optuna.load_study(study_name="s", storage=storage).get_trials()) == 4
    sd = StudyDir(tmp_path / "s")
    assert [r.number for r in sd.results()] == [r.number for r in outcome.results]
    for name in names:
        assert json.loads((sd.trials_dir / name / "result.json").read_text())["status"] == "COMPLETE"
    # the verdict comes from the re-measured runs only, and is stored with its interval
    assert sd.recommendation() == rec
    assert rec.speedup == pytest.approx(winner_bs / 2)
    assert rec.speedup_low is not None and rec.speedup_high is not None and rec.measurable is True
    assert rec.verdict is not None and rec.verdict.startswith("speedup over the baseline (trial 0):")
    # the re-measurement's cost counts in the study's accounting
    outcome_json = sd.read_settings().outcome
    assert outcome_json is not None
    assert outcome_json["confirm_seconds"] == pytest.approx(3.0 * len(names))
    assert outcome_json["gpu_seconds"] == pytest.approx(
        sum(r.gpu_seconds for r in outcome.results) + 3.0 * len(names)
    )
    assert sd.read_settings().confirm_runs == 2


def test_noise_found_by_the_re_measurement_is_not_called_a_win(tmp_path: Path) -> None:
    # the search's single runs say bs 16 is 10x the baseline; re-measured, they are the same speed
    ex = ScriptedExecutor(_same)
    study = _setup(tmp_path, ex, n_trials=4)
    outcome = study.run()
    rec = outcome.recommendation
    assert rec is not None and rec.search_speedup is not None and rec.search_speedup > 1.5
    assert rec.measurable is False
    assert rec.speedup_low is not None and rec.speedup_low <= 1.0 <= (rec.speedup_high or 0)
    assert rec.verdict is not None and rec.verdict.startswith("no measurable speedup over the baseline")


def test_a_finished_study_resumes_without_running_anything_again(tmp_path: Path) -> None:
    first = _setup(tmp_path, ScriptedExecutor()).run()
    again_ex = ScriptedExecutor()
    again = _setup(tmp_path, again_ex).run()
    assert again_ex.ran == [] and again_ex.confirm_calls == []
    assert again.recommendation == first.recommendation


def test_an_interrupted_re_measurement_is_redone_on_resume(tmp_path: Path) -> None:
    flag = [False]
    ex = ScriptedExecutor(stop_after=2, flag=flag)
    study = _setup(tmp_path, ex, interrupted=lambda: flag[0])
    outcome = study.run()
    assert outcome.stopped == "interrupted" and "re-measurement" in outcome.detail
    assert outcome.recommendation is not None and outcome.recommendation.measurable is None
    sd = StudyDir(tmp_path / "s")
    third = ex.confirm_calls[2][0]
    assert json.loads((sd.trials_dir / third / "result.json").read_text())["status"] == "INTERRUPTED"
    resumed_ex = ScriptedExecutor()
    resumed = _setup(tmp_path, resumed_ex).run()
    assert resumed_ex.ran == []  # no trial again
    assert resumed.stopped == "budget" and resumed.recommendation is not None
    conf = resumed.recommendation.confirmation
    assert conf is not None and conf.note is None and all(r.status is TrialStatus.COMPLETE for r in conf.runs)
    schedule_names = [f"confirm-{r.trial}-{r.round}" for r in conf.runs]
    # the two finished runs are kept; the interrupted one and the rest run now
    assert [name for name, _ in resumed_ex.confirm_calls] == schedule_names[2:]
    assert [name for name, _ in ex.confirm_calls] == schedule_names[:3]
    assert resumed.recommendation.measurable is True


def test_off_means_no_extra_run_and_a_verdict_that_says_so(tmp_path: Path) -> None:
    ex = ScriptedExecutor()
    outcome = _setup(tmp_path, ex, confirm_runs=0).run()
    assert ex.confirm_calls == []
    rec = outcome.recommendation
    assert rec is not None and rec.confirmation is None
    assert rec.verdict is not None and "not re-measured: re-measurement off (--confirm-runs 0)" in rec.verdict
    assert not any(p.name.startswith("confirm-") for p in (tmp_path / "s" / "trials").iterdir())


def test_the_time_budget_keeps_room_for_the_re_measurement(tmp_path: Path) -> None:
    # every run (trial or re-measurement) takes 1 s of the study's clock; FakeExecutor's trials say 1 s
    ex = ScriptedExecutor()
    study = _with(_setup(tmp_path, ex, n_trials=50), time_budget_s=10.0)
    clock = {"t": 0.0}
    original = ex.execute

    def timed(spec, ctx, *, on_step, time_left_s):
        clock["t"] += 1.0
        return original(spec, ctx, on_step=on_step, time_left_s=time_left_s)

    ex.execute = timed  # type: ignore[method-assign]
    study.clock = lambda: clock["t"]
    outcome = study.run()
    assert outcome.stopped == "budget" and "kept for the re-measurement" in outcome.detail
    rec = outcome.recommendation
    assert rec is not None and rec.confirmation is not None
    assert rec.confirmation.note is None and len(ex.confirm_calls) == len(rec.confirmation.runs) >= 4
    assert clock["t"] <= 10.0  # the search stopped early enough for every re-measurement run
    assert outcome.trials_run + len(ex.confirm_calls) == clock["t"]


def test_schedule_reverses_every_other_round() -> None:
    def r(n: int) -> TrialResult:
        return TrialResult(number=n, params={"bs": n}, status=TrialStatus.COMPLETE, reason="ok")

    tasks = schedule(r(0), r(3), [r(5)], 3)
    assert [(t.trial, t.round) for t in tasks] == [
        (0, 1), (3, 1), (5, 1), (5, 2), (3, 2), (0, 2), (0, 3), (3, 3), (5, 3),
    ]  # fmt: skip
    assert [t.order for t in tasks] == list(range(1, 10))
    assert [t.role for t in tasks[:3]] == ["baseline", "winner", "runner_up"]
    assert tasks[0].is_baseline and not tasks[1].is_baseline


def test_runners_up_are_the_usable_trials_within_the_noise_of_the_winner() -> None:
    def r(n: int, tp: float, ci: float = 0.01, *, status: TrialStatus = TrialStatus.COMPLETE) -> TrialResult:
        steady = SteadyEstimate(
            step_time_s=16 / tp, rel_ci95=ci, steady_steps=5, warmup_steps=1, throughput=tp
        )
        return TrialResult(
            number=n, params={"bs": n}, status=status, reason="ok", steady=steady, is_baseline=n == 0
        )

    results = [
        r(0, 9.95),  # the baseline: re-measured anyway, never a runner-up
        r(1, 10.0),  # the winner
        r(2, 9.8),  # within 5 %
        r(3, 9.2, ci=0.08),  # 8 % slower, but its own interval is ±8 %: within the two trials' noise
        r(4, 9.2, ci=0.01),  # 8 % slower and sure of it
        r(5, 9.9, status=TrialStatus.UNHEALTHY),  # close, but not usable
        r(6, 9.7),  # within 5 %, the third closest: over the limit of two
    ]
    rec = Recommendation(
        trial=1, throughput=10.0, baseline_trial=0, baseline_throughput=9.95, speedup=1.005,
        headroom_bytes=[], why="w",
    )  # fmt: skip
    usable = lambda x: x.status is TrialStatus.COMPLETE  # noqa: E731
    assert [x.number for x in runners_up(results, rec, usable)] == [2, 6]
    assert [x.number for x in runners_up(results, rec, usable, limit=5)] == [2, 6, 3]
