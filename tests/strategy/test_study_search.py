"""``--search auto`` through the real study loop with a fake backend, gate and executor (no processes):
a resumed study continues the same search, early stops are reported with the budget used, and a
strategy can be passed in."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from autotune.backends import Backend, BackendInfo, ModelRef, RuleViolation, TrialContext
from autotune.backends.command import CommandBackend
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
from autotune.strategy import Collaborators, DeepSpeedSweep, SweepSettings, build_strategy
from autotune.study.loop import Study, StudyConfig, summary_line

SPACE = """
backend: fake
knobs:
  per_device_train_batch_size: {type: int, choices: [1, 2, 4, 8, 16], default: 2, memory: increasing}
  gradient_checkpointing: {type: bool, default: true, memory: decreasing}
  zero_stage: {type: int, choices: [0, 2, 3], default: 0, memory: decreasing}
  offload_optimizer: {type: bool, default: false, when: {zero_stage: [2, 3]}, memory: decreasing}
  dataloader_num_workers: {type: int, choices: [0, 1, 2, 4], default: 0}
"""
GIB = 2**30


class FakeBackend(Backend):
    name = "fake"

    @classmethod
    def describe(cls, params, derived, fixed, n_gpus):  # noqa: ANN001, ANN206 - knobs in TRL's words
        return CommandBackend.describe(params, derived, fixed, n_gpus)

    def probe(self) -> BackendInfo:
        return BackendInfo(name="fake", version="1")

    def derive(self, params: dict[str, Any], ctx: TrialContext) -> dict[str, Any]:
        return {
            "world_size": 1,
            "gradient_accumulation_steps": ctx.global_batch // params["per_device_train_batch_size"],
        }

    def check_rules(self, params, derived, ctx) -> list[RuleViolation]:
        return []

    def render(self, spec: TrialSpec, ctx: TrialContext) -> LaunchPlan:
        return LaunchPlan(argv=("true",), cwd=str(ctx.trial_dir))

    def parser(self, spec, ctx):  # pragma: no cover - the fake executor never parses
        raise NotImplementedError


def memory_gib(p: dict[str, Any]) -> float:
    states = {0: 16.0, 2: 8.0, 3: 4.0}[p["zero_stage"]] * (0.5 if p.get("offload_optimizer") else 1.0)
    return states + p["per_device_train_batch_size"] * (1.0 if p["gradient_checkpointing"] else 3.0)


def speed(p: dict[str, Any]) -> float:
    tp = p["per_device_train_batch_size"] ** 0.5 * (0.85 if p["gradient_checkpointing"] else 1.0)
    tp *= {0: 1.0, 2: 0.95, 3: 0.8}[p["zero_stage"]] * (0.6 if p.get("offload_optimizer") else 1.0)
    return tp * (1.0 + 0.02 * p["dataloader_num_workers"])


class FakeGate:
    """An estimator that is right about memory to 10 % and about speed up to the data loader."""

    def check(self, params, derived, *, margin=None):
        peak = memory_gib(params) * 0.9
        breakdown = {"peak_bytes": int(peak * GIB), "capacity_bytes": 24 * GIB}
        return ("predicted not to fit" if peak > 24 * (1 + (margin or 0.15)) else None), breakdown

    def rank(self, params):
        return speed({**params, "dataloader_num_workers": 0})

    def observe(self, result: TrialResult) -> None:
        pass

    def state(self) -> dict[str, Any]:
        return {}


class FakeExecutor:
    def __init__(self) -> None:
        self.ran: list[dict[str, Any]] = []

    def execute(self, spec: TrialSpec, ctx: TrialContext, *, on_step, time_left_s) -> TrialResult:
        p = spec.params
        self.ran.append(dict(p))
        base = {
            "number": spec.number,
            "params": p,
            "derived": spec.derived,
            "is_baseline": spec.is_baseline,
            "duration_s": 60.0,
            "gpu_seconds": 60.0,
        }
        if memory_gib(p) > 24:
            return TrialResult(**base, status=TrialStatus.OOM, reason="CUDA out of memory")
        tp = speed(p)
        steady = SteadyEstimate(
            step_time_s=1 / tp, rel_ci95=0.01, steady_steps=4, warmup_steps=1, throughput=tp
        )
        return TrialResult(**base, status=TrialStatus.COMPLETE, reason="completed", steps=5, steady=steady)


def make(tmp_path: Path, name: str, n_trials: int, **kwargs: Any) -> tuple[Study, FakeExecutor]:
    space_file = tmp_path / "space.yaml"
    space_file.write_text(SPACE)
    space = load_space(space_file, backend="fake")
    hw = Hardware(
        host=HostInfo(
            hostname="h", cpu_cores_logical=2, cpu_cores_physical=1, ram_total_bytes=GIB, platform="x"
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
        search="auto",
        n_trials=n_trials,
        seed=11,
    )
    executor = FakeExecutor()
    return Study(cfg, FakeBackend(), space, executor, memory_gate=FakeGate(), **kwargs), executor


def no_early_stop(study: Study) -> None:
    """The auto strategy of ``study``, told to run its whole budget."""
    study.strategy.settings = replace(study.strategy.settings, min_trials=100)  # type: ignore[call-arg]


def test_a_resumed_study_continues_the_same_search(tmp_path: Path) -> None:
    straight, ex_straight = make(tmp_path, "straight", 9)
    no_early_stop(straight)  # compare whole sequences
    straight.run()
    # stopped by the user after four trials, then resumed with the same budget (the schedule — the
    # screening design's share, the refinement share — is a function of the budget)
    ran: list[dict[str, Any]] = []
    first, ex_first = make(tmp_path, "resumed", 9, interrupted=lambda: len(ran) >= 4)
    ran = ex_first.ran
    first.strategy.min_trials = 100
    first.run()
    assert len(ex_first.ran) == 4
    second, ex_second = make(tmp_path, "resumed", 9)
    no_early_stop(second)
    second.run()
    resumed = ex_first.ran + ex_second.ran
    assert [canonical_key(p) for p in resumed] == [canonical_key(p) for p in ex_straight.ran]
    assert len({canonical_key(p) for p in resumed}) == len(resumed) == 9


def test_auto_finds_the_fastest_fitting_configuration_and_reports_an_early_stop(tmp_path: Path) -> None:
    study, ex = make(tmp_path, "s", 30)
    outcome = study.run()
    assert outcome.stopped == "converged"
    assert f"used {outcome.trials_run} of 30 trials" in outcome.detail
    assert outcome.trials_run == len(ex.ran) < 30 and outcome.budget_trials == 30
    assert "stopped early after" in summary_line(outcome)
    fits = [p for p in study.space.grid() if memory_gib(p) <= 24]
    best = max(speed(p) for p in fits)
    assert outcome.recommendation is not None and outcome.recommendation.throughput >= 0.97 * best
    # the pre-screen kept it off what the gate predicted would not fit: OOMs are rare
    assert sum(memory_gib(p) > 24 for p in ex.ran) <= 2
    stored = study.dir.read_settings().outcome
    assert (
        stored is not None and stored["stopped"] == "converged" and stored["trials_run"] == outcome.trials_run
    )


def test_a_strategy_can_be_passed_in(tmp_path: Path) -> None:
    space_file = tmp_path / "space.yaml"
    space_file.write_text(SPACE)
    space = load_space(space_file, backend="fake")
    sweep = DeepSpeedSweep(
        space,
        settings=SweepSettings(
            base=space.defaults(),
            stage_knob="zero_stage",
            stages=(0, 2, 3),
            batch_knob="per_device_train_batch_size",
        ),
    )
    study, ex = make(tmp_path, "sweep", 30, strategy=sweep)
    outcome = study.run()
    assert study.strategy is sweep
    assert outcome.stopped == "converged" and "DeepSpeed-style sweep" in outcome.detail
    # baseline first, then stage 0 from batch 1 upwards
    assert ex.ran[0] == space.defaults()
    stage0 = [p["per_device_train_batch_size"] for p in ex.ran[1:] if p["zero_stage"] == 0]
    assert stage0 == sorted(stage0) and stage0[0] == 1


@pytest.mark.parametrize("search", ["random", "grid"])
def test_comparison_kinds_run_through_the_same_loop(tmp_path: Path, search: str) -> None:
    study, ex = make(tmp_path, search, 6)
    study.cfg = study.cfg.__class__(**{**study.cfg.__dict__, "search": search})
    study.strategy = build_strategy(
        search, study.space, Collaborators(feasible=study.screen.cheap_feasible), seed=1
    )
    outcome = study.run()
    keys = [canonical_key(p) for p in ex.ran]
    assert len(keys) == len(set(keys)) == outcome.trials_run == 6


def test_refinement_moves_change_one_or_two_knobs_of_the_best_trial_and_never_a_known_failure(
    tmp_path: Path,
) -> None:
    from autotune.strategy import infer_infeasible

    study, _ = make(tmp_path, "refine", 16)
    no_early_stop(study)  # run the whole budget
    outcome = study.run()
    results = sorted(outcome.results, key=lambda r: r.number)
    assert results[0].choice == {"mode": "baseline"}
    refines = [r for r in results if (r.choice or {}).get("mode") == "refine"]
    assert len(refines) >= 5  # the schedule refines more and more as the budget is used
    for r in refines:
        before = [x for x in results if x.number < r.number]
        usable = [x for x in before if x.status is TrialStatus.COMPLETE and x.throughput]
        incumbent = max(usable, key=lambda x: (x.throughput or 0.0, -x.number))
        assert r.choice is not None and r.choice["incumbent"] == incumbent.number
        move = r.choice["move"]
        # knobs set on both sides count as moved; a conditional knob that (dis)appears with its
        # parent is shown in the move but is not a move of its own
        assert 1 <= len([k for k in move if k in r.params and k in incumbent.params]) <= 2
        assert {
            k for k in set(r.params) | set(incumbent.params) if r.params.get(k) != incumbent.params.get(k)
        } == set(move)
        assert infer_infeasible(study.space, r.params, before) is None
        assert r.choice["predicted_throughput"] > 0 and 0.0 <= r.choice["failure_risk"] <= 1.0
    keys = [canonical_key(r.params) for r in results]
    assert len(keys) == len(set(keys))
