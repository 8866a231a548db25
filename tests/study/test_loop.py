"""The study loop with a fake backend and a fake executor (no processes): ask → pre-screen → run →
tell, baseline first, no configuration twice, resume, orphan recovery, OOM inference, interruption."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.backends import Backend, BackendInfo, ModelRef, RuleViolation, StepParser, TrialContext
from autotune.backends.command import CommandBackend
from autotune.errors import UsageError
from autotune.records import (
    Hardware,
    HostInfo,
    LaunchPlan,
    SteadyEstimate,
    TrialResult,
    TrialSpec,
    TrialStatus,
)
from autotune.space import canonical_key, load_space
from autotune.study.loop import Study, StudyConfig
from autotune.studydir import StudyDir

SPACE = """
backend: fake
knobs:
  per_device_train_batch_size: {type: int, choices: [1, 2, 4, 8, 16], default: 2, memory: increasing}
  gradient_checkpointing: {type: bool, default: true, memory: decreasing}
  dataloader_num_workers: {type: int, choices: [0, 2], default: 0}
"""


class FakeBackend(Backend):
    name = "fake"

    @classmethod
    def describe(cls, params, derived, fixed, n_gpus):  # noqa: ANN001, ANN206 - knobs in TRL's words
        return CommandBackend.describe(params, derived, fixed, n_gpus)

    def probe(self) -> BackendInfo:
        return BackendInfo(name="fake", version="1")

    def derive(self, params: dict[str, Any], ctx: TrialContext) -> dict[str, Any]:
        per_step = params["per_device_train_batch_size"]
        return {"world_size": 1, "gradient_accumulation_steps": ctx.global_batch / per_step}

    def check_rules(self, params, derived, ctx) -> list[RuleViolation]:
        ga = derived["gradient_accumulation_steps"]
        if ga != int(ga) or ga < 1:
            return [
                RuleViolation(
                    "global_batch_divisible",
                    f"global batch {ctx.global_batch} is not divisible by {params['per_device_train_batch_size']}",
                )
            ]
        return []

    def render(self, spec: TrialSpec, ctx: TrialContext) -> LaunchPlan:
        return LaunchPlan(argv=("true",), cwd=str(ctx.trial_dir))

    def parser(self, spec, ctx) -> StepParser:  # pragma: no cover - the fake executor never parses
        raise NotImplementedError


class FakeExecutor:
    """Throughput grows with batch size, checkpointing costs 20 %, batch 16 without checkpointing OOMs."""

    def __init__(self, interrupt_at: int | None = None, flag: list[bool] | None = None) -> None:
        self.ran: list[dict[str, Any]] = []
        self.interrupt_at = interrupt_at
        self.flag = flag

    def execute(self, spec: TrialSpec, ctx: TrialContext, *, on_step, time_left_s) -> TrialResult:
        p = spec.params
        self.ran.append(dict(p))
        base = {
            "number": spec.number,
            "params": p,
            "derived": spec.derived,
            "is_baseline": spec.is_baseline,
            "duration_s": 1.0,
            "gpu_seconds": 1.0,
        }
        if self.interrupt_at is not None and len(self.ran) == self.interrupt_at:
            assert self.flag is not None
            self.flag[0] = True
            return TrialResult(**base, status=TrialStatus.INTERRUPTED, reason="interrupted by the user")
        if p["per_device_train_batch_size"] >= 8 and not p["gradient_checkpointing"]:
            return TrialResult(**base, status=TrialStatus.OOM, reason="CUDA out of memory", steps=1)
        tp = (
            p["per_device_train_batch_size"] * (0.8 if p["gradient_checkpointing"] else 1.0)
            + 0.01 * p["dataloader_num_workers"]
        )
        steady = SteadyEstimate(
            step_time_s=16 / tp, rel_ci95=0.01, steady_steps=4, warmup_steps=1, throughput=tp
        )
        return TrialResult(**base, status=TrialStatus.COMPLETE, reason="completed", steps=5, steady=steady)


def make(
    tmp_path: Path,
    *,
    n_trials: int,
    search: str = "auto",
    executor: FakeExecutor | None = None,
    interrupted=lambda: False,
    name: str = "s",
    **more: Any,
):
    space_file = tmp_path / "space.yaml"
    space_file.write_text(SPACE)
    space = load_space(space_file, backend="fake")
    hw = Hardware(
        host=HostInfo(
            hostname="h", cpu_cores_logical=2, cpu_cores_physical=1, ram_total_bytes=1 << 30, platform="x"
        )
    )
    cfg = StudyConfig(
        study_dir=tmp_path / name,
        backend="fake",
        model=ModelRef(name="m", path_or_id="m"),
        hardware=hw,
        global_batch=16,
        num_generations=4,
        max_steps=5,
        max_completion_length=8,
        search=search,
        n_trials=n_trials,
        seed=3,
        **more,
    )
    ex = executor or FakeExecutor()
    return Study(cfg, FakeBackend(), space, ex, interrupted=interrupted), ex


def test_baseline_first_no_repeats_and_a_recommendation(tmp_path: Path) -> None:
    study, ex = make(tmp_path, n_trials=6)
    outcome = study.run()
    assert ex.ran[0] == {
        "per_device_train_batch_size": 2,
        "gradient_checkpointing": True,
        "dataloader_num_workers": 0,
    }
    keys = [canonical_key(p) for p in ex.ran]
    assert len(keys) == len(set(keys)) == 6
    assert outcome.recommendation is not None
    best = max(
        (r for r in outcome.results if r.status is TrialStatus.COMPLETE), key=lambda r: r.throughput or 0
    )
    assert outcome.recommendation.trial == best.number
    assert outcome.recommendation.speedup == pytest.approx(best.throughput / 1.6)
    on_disk = sorted(p.name for p in (tmp_path / "s" / "trials").iterdir())
    assert len(on_disk) == len(outcome.results)
    assert (tmp_path / "s" / "study.db").exists()


def test_resume_keeps_results_and_never_repeats(tmp_path: Path) -> None:
    study, ex1 = make(tmp_path, n_trials=3)
    first = study.run()
    study2, ex2 = make(tmp_path, n_trials=3)
    again = study2.run()
    assert ex2.ran == []  # budget already used: nothing runs twice
    assert again.stopped == "budget"
    study3, ex3 = make(tmp_path, n_trials=6)
    third = study3.run()
    assert len(ex3.ran) == 3
    all_keys = [canonical_key(p) for p in ex1.ran + ex3.ran]
    assert len(set(all_keys)) == 6
    first_numbers = {r.number: r.status for r in first.results}
    assert all(r.status == first_numbers[r.number] for r in third.results if r.number in first_numbers)


def test_grid_covers_the_space_without_repeats_and_ooms_prune_dominated(tmp_path: Path) -> None:
    study, ex = make(tmp_path, n_trials=100, search="grid")
    outcome = study.run()
    assert outcome.stopped == "exhausted"
    statuses = {canonical_key(r.params): r for r in outcome.results}
    assert len(statuses) == 5 * 2 * 2
    # the first OOM (batch 8, no checkpointing) makes batch 16 without checkpointing infeasible unseen
    inferred = [
        r for r in outcome.results if r.status is TrialStatus.PRUNED and "ran out of memory" in r.reason
    ]
    assert inferred, [r.reason for r in outcome.results]
    assert all(
        r.params["per_device_train_batch_size"] == 16 and not r.params["gradient_checkpointing"]
        for r in inferred
    )
    assert all(r.params not in ex.ran for r in inferred)
    # batch 1 breaks nothing; global batch 16 is divisible by every choice, so no rule pruning here
    assert not [r for r in outcome.results if "breaks" in r.reason]


def test_rule_violations_never_launch(tmp_path: Path) -> None:
    # global batch 12: batches 8 and 16 do not divide it, so the grid meets 2 × 2 × 2 = 8 such
    # configurations; each is recorded as pruned for the rule and never reaches the executor.
    study, ex = make(tmp_path, n_trials=100, search="grid")
    study.cfg = study.cfg.__class__(**{**study.cfg.__dict__, "global_batch": 12})
    outcome = study.run()
    bad = [r for r in outcome.results if r.params["per_device_train_batch_size"] in (8, 16)]
    assert len(bad) == 8
    for r in bad:
        assert r.status is TrialStatus.PRUNED
        assert r.reason.startswith(
            "not launched, breaks global_batch_divisible: global batch 12 is not divisible"
        )
    assert [p for p in ex.ran if p["per_device_train_batch_size"] in (8, 16)] == []
    # the configurations that keep the rule did run: the check is the rule's, not a blanket refusal
    assert {p["per_device_train_batch_size"] for p in ex.ran} == {1, 2, 4}


def test_orphaned_running_trial_is_marked_interrupted_and_rerun(tmp_path: Path) -> None:
    study, ex = make(tmp_path, n_trials=2)
    study.run()
    # simulate a tuner killed mid-trial: a RUNNING optuna trial with params and no result
    storage = f"sqlite:///{tmp_path / 's' / 'study.db'}"
    ostudy = optuna.load_study(study_name="s", storage=storage)
    orphan_params = {
        "per_device_train_batch_size": 16,
        "gradient_checkpointing": True,
        "dataloader_num_workers": 2,
    }
    ostudy.enqueue_trial(orphan_params)
    t = ostudy.ask()
    study.space.suggest(t)
    reaped: list[Path] = []
    study2, ex2 = make(tmp_path, n_trials=3)
    study2.reaper = lambda d: reaped.append(d) or "process group 4242 ended"
    outcome = study2.run()
    assert reaped == [tmp_path / "s" / "trials" / str(t.number)]
    assert ex2.ran[0] == orphan_params
    orphan = next(r for r in outcome.results if r.number == t.number)
    assert orphan.status is TrialStatus.INTERRUPTED and "4242" in orphan.reason
    assert ostudy.get_trials()[t.number].state is optuna.trial.TrialState.FAIL


def test_interrupt_stops_the_study_and_records_interrupted(tmp_path: Path) -> None:
    flag = [False]
    ex = FakeExecutor(interrupt_at=2, flag=flag)
    study, _ = make(tmp_path, n_trials=5, executor=ex, interrupted=lambda: flag[0])
    outcome = study.run()
    assert outcome.stopped == "interrupted"
    assert [r.status for r in outcome.results][-1] is TrialStatus.INTERRUPTED
    assert len(ex.ran) == 2
    # resuming re-runs the interrupted configuration first (it says nothing about the config)
    study2, ex2 = make(tmp_path, n_trials=5)
    study2.run()
    assert canonical_key(ex2.ran[0]) == canonical_key(ex.ran[1])


def test_resume_with_other_settings_is_refused_before_anything_changes(tmp_path: Path) -> None:
    study, _ = make(tmp_path, n_trials=2)
    study.run()
    before = (tmp_path / "s" / "study.json").read_text()
    study2, _ = make(tmp_path, n_trials=2)
    study2.cfg = study2.cfg.__class__(**{**study2.cfg.__dict__, "global_batch": 32})
    with pytest.raises(UsageError, match="global_batch"):
        study2.run()
    assert (tmp_path / "s" / "study.json").read_text() == before


def test_the_recommendation_is_stored_in_study_json_with_the_outcome(tmp_path: Path) -> None:
    study, _ = make(tmp_path, n_trials=4)
    outcome = study.run()
    stored = StudyDir(tmp_path / "s")
    settings = stored.read_settings().to_json()
    assert outcome.recommendation is not None
    assert stored.recommendation() == outcome.recommendation
    assert settings["outcome"]["recommended_trial"] == outcome.recommendation.trial
    assert settings["outcome"]["stopped"] == outcome.stopped == "budget"
    assert settings["outcome"]["trials_run"] == settings["outcome"]["trials_run_now"] == 4


class RecordingExecutor(FakeExecutor):
    def __init__(self) -> None:
        super().__init__()
        self.time_left_s: list[float | None] = []

    def execute(self, spec: TrialSpec, ctx: TrialContext, *, on_step, time_left_s) -> TrialResult:
        self.time_left_s.append(time_left_s)
        return super().execute(spec, ctx, on_step=on_step, time_left_s=time_left_s)


def test_the_time_budget_stops_the_study_and_bounds_each_trial(tmp_path: Path) -> None:
    ex = RecordingExecutor()
    study, _ = make(tmp_path, n_trials=10, executor=ex)
    study.cfg = study.cfg.__class__(**{**study.cfg.__dict__, "time_budget_s": 250.0})
    ticks = iter(range(0, 10_000, 100))
    study.clock = lambda: float(next(ticks))  # every look at the clock: 100 s later
    outcome = study.run()
    # start 0; before trial 0: 100 s used, 250 - 200 s left for it; before the next: 300 s used
    assert ex.time_left_s == [50.0]
    assert outcome.stopped == "budget" and outcome.detail == "time budget of 250s reached"
