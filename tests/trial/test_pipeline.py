"""The trial pipeline that a study's executor and ``autotune profile`` share, on a scripted runner: what
differs between the two is the job's data (its Judging), and the live view, the pruner and the health
gate see every step. (tests/trial/test_execute.py and tests/cli/test_profile_cli.py run it on real
child processes.)"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from autotune.backends.command import CommandParser
from autotune.errors import LaunchError
from autotune.records import GpuInfo, Hardware, HostInfo, LaunchPlan, StepMetrics, TrialSpec, TrialStatus
from autotune.secrets import SecretRule
from autotune.trial.live import LiveGpus
from autotune.trial.outcome import LIVE_HEALTH_MIN_STEPS
from autotune.trial.pipeline import HealthGate, Judging, TrialJob, TrialPipeline
from autotune.trial.runner import EarlyStopConfig, RunRecord, WatchdogConfig

HOST = HostInfo(
    hostname="h", cpu_cores_logical=2, cpu_cores_physical=1, ram_total_bytes=2**34, platform="linux"
)
GPU = GpuInfo(index=0, name="H100", memory_total_bytes=80 * 2**30, uuid="GPU-0")


def steps(n: int, **values: float) -> list[StepMetrics]:
    return [
        StepMetrics(step=i, t_mono_s=2.0 * i, t_wall_s=2.0 * i, duration_s=2.0, values=dict(values))
        for i in range(1, n + 1)
    ]


class ScriptedRunner:
    """Stands in for run_trial: makes the samplers, shows each step to the observer as the runner
    would (stopping as the observer says), then returns the record it was given."""

    def __init__(self, made: list[StepMetrics], **record: Any) -> None:
        self.made, self.record = made, record
        self.verdicts: list[str | None] = []
        self.seen_live: list[list[str]] = []
        self.board: LiveGpus | None = None

    def __call__(self, plan: LaunchPlan, parser: Any, trial_dir: Path, **kw: Any) -> RunRecord:
        samplers: Callable[[int], Sequence[Any]] | None = kw["samplers"]
        if samplers is not None:
            samplers(1234)
        shown: list[StepMetrics] = []
        stopped_by, stop_reason = None, None
        for step in self.made:
            shown.append(step)
            verdict = kw["observer"].on_step(step, None)
            self.verdicts.append(verdict)
            if self.board is not None:
                self.seen_live.append([row.phase for row in self.board.now()])
            if verdict:
                stopped_by, stop_reason = "pruned", verdict
                break
        fields: dict[str, Any] = {
            "exit_code": 0,
            "signal": None,
            "stopped_by": stopped_by,
            "stop_reason": stop_reason,
            "stdout_tail": [],
            "stderr_tail": [],
            "evidence": [],
            "duration_s": 20.0,
            "startup_s": 1.0,
            "started_wall_s": 1000.0,
            "pid": 1234,
            "pgid": 1234,
            **self.record,
        }
        return RunRecord(steps=shown, **fields)


class LiveRows:
    """A sampler with live GPU rows (what NvmlSampler.samples_since serves)."""

    def samples_since(self, cursor: int, columns: Sequence[str]) -> tuple[list[tuple[float, ...]], int]:
        return ([(0.0, 50.0, 2.0**30, 80 * 2.0**30, 100.0, 700.0)] if cursor == 0 else []), 1


def job(tmp_path: Path, judging: Judging, **kw: Any) -> TrialJob:
    plan = LaunchPlan(argv=("train", "--token", "s3cr3t-value"), env={}, cwd=str(tmp_path))
    return TrialJob(
        spec=TrialSpec(number=4, params={"bs": 8}),
        plan=plan,
        parser=CommandParser(tmp_path / "m.jsonl"),
        trial_dir=tmp_path,
        label="trial 4",
        global_batch=16,
        watchdog=WatchdogConfig(),
        early_stop=EarlyStopConfig(enabled=False),
        judging=judging,
        **kw,
    )


def pipeline(runner: ScriptedRunner, **kw: Any) -> TrialPipeline:
    return TrialPipeline(hardware=Hardware(host=HOST, gpus=[GPU]), runner=runner, **kw)


def test_a_failed_runs_speed_is_kept_only_when_its_judging_says_so(tmp_path: Path) -> None:
    crashed = {"exit_code": 1, "stderr_tail": ["Traceback (most recent call last):", "RuntimeError: boom"]}
    study = pipeline(ScriptedRunner(steps(8), **crashed)).run(job(tmp_path, Judging(steps_expected=20)))
    profile = pipeline(ScriptedRunner(steps(8), **crashed)).run(
        job(tmp_path, Judging(steps_required=False, steady_of_failures=True))
    )
    assert study.result.status is profile.result.status is TrialStatus.CRASH
    assert study.result.steady is None  # a study ranks only runs that ran right
    assert profile.result.steady is not None and profile.result.steady.throughput > 0
    assert profile.result.gpu_seconds == 20.0 and profile.result.steps == 8 == len(profile.record.steps)


def test_the_live_view_shows_each_step_and_the_run_leaves_it(tmp_path: Path) -> None:
    board = LiveGpus()
    runner = ScriptedRunner(steps(3))
    runner.board = board
    judged = pipeline(runner, live=board, samplers=lambda pid: [LiveRows()]).run(job(tmp_path, Judging()))
    assert runner.seen_live == [["step 1"], ["step 2"], ["step 3"]]
    assert board.now() == []  # closed once the run ended
    assert judged.result.status is TrialStatus.COMPLETE and judged.result.peak_mem_bytes == []  # no timeline


def test_the_health_gate_stops_a_run_that_cannot_learn_only_when_asked(tmp_path: Path) -> None:
    n = LIVE_HEALTH_MIN_STEPS + 2
    gated = ScriptedRunner(steps(n, grad_norm=0.0, loss=0.1))
    result = pipeline(gated).run(job(tmp_path, Judging(health=HealthGate(stop_early=True)))).result
    assert gated.verdicts[-1] is not None and "grad_norm is 0" in gated.verdicts[-1]
    assert len(gated.verdicts) == LIVE_HEALTH_MIN_STEPS
    assert result.status is TrialStatus.UNHEALTHY and any("grad_norm" in h for h in result.health)
    # the same run under a gate that only judges at the end runs to its end, then is found unhealthy
    ungated = ScriptedRunner(steps(n, grad_norm=0.0, loss=0.1))
    result = pipeline(ungated).run(job(tmp_path, Judging(health=HealthGate()))).result
    assert ungated.verdicts == [None] * n and result.status is TrialStatus.UNHEALTHY


def test_the_studys_pruner_hears_every_step(tmp_path: Path) -> None:
    heard: list[int] = []

    def on_step(step: int, throughput: float | None, optimistic: float) -> str | None:
        heard.append(step)
        return "slower than the best" if step == 2 else None

    runner = ScriptedRunner(steps(5))
    result = pipeline(runner).run(job(tmp_path, Judging(), on_step=on_step)).result
    assert heard == [1, 2] and result.status is TrialStatus.PRUNED


def test_a_timeout_of_the_studys_own_budget_is_an_interruption(tmp_path: Path) -> None:
    def timed_out() -> ScriptedRunner:
        return ScriptedRunner(steps(2), exit_code=-15, signal=15, stopped_by="timeout", stop_reason="budget")

    assert pipeline(timed_out()).run(job(tmp_path, Judging())).result.status is TrialStatus.TIMEOUT
    cut = pipeline(timed_out()).run(job(tmp_path, Judging(timeout_is_interruption=True))).result
    assert cut.status is TrialStatus.INTERRUPTED


def test_the_result_holds_no_secret_of_the_run(tmp_path: Path) -> None:
    leaked = {"exit_code": 1, "stderr_tail": ["RuntimeError: bad token s3cr3t-value"]}
    secrets = SecretRule(("--token",))
    result = pipeline(ScriptedRunner([], **leaked), secrets=secrets).run(job(tmp_path, Judging())).result
    assert result.status is TrialStatus.CRASH
    assert "s3cr3t-value" not in result.reason + (result.evidence or "")


def test_a_command_that_cannot_start_propagates_and_leaves_the_live_view(tmp_path: Path) -> None:
    board = LiveGpus()

    def refuse(*args: Any, **kw: Any) -> RunRecord:
        kw["samplers"](1)
        raise LaunchError("cannot start 'train'", hint="check it")

    with pytest.raises(LaunchError):
        TrialPipeline(
            hardware=Hardware(host=HOST), live=board, samplers=lambda pid: [LiveRows()], runner=refuse
        ).run(job(tmp_path, Judging()))
    assert board.now() == []
