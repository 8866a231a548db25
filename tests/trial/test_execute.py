"""The executor end to end on real child processes (tests/fixtures/faults): run, classify, result."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from autotune.backends import ModelRef, TrialContext
from autotune.backends.command import CommandBackend
from autotune.records import Hardware, HostInfo, TrialResult, TrialSpec, TrialStatus
from autotune.trial.execute import Executor
from autotune.trial.runner import EarlyStopConfig, WatchdogConfig

FAULT = Path(__file__).parents[1] / "fixtures" / "faults" / "fault.py"
WATCHDOG = WatchdogConfig(startup_timeout_s=60, hang_floor_s=60, grace_s=0.5, poll_interval_s=0.05)


def execute(tmp_path: Path, *, steps: str, mode: str = "ok", max_steps: int = 4) -> TrialResult:
    """One trial of ``fault.py --mode MODE --abort-at-exit`` asked for ``max_steps`` steps, making
    ``steps``."""
    backend = CommandBackend(
        [sys.executable, str(FAULT), "--mode", mode, "--abort-at-exit", "--to-file", "--steps", steps]
    )
    host = HostInfo(
        hostname="h", cpu_cores_logical=2, cpu_cores_physical=1, ram_total_bytes=2**34, platform="linux"
    )
    executor = Executor(
        backend=backend,
        hardware=Hardware(host=host),
        watchdog=WATCHDOG,
        early_stop=EarlyStopConfig(enabled=False),
        beta=0.04,
    )
    trial_dir = tmp_path / "trials" / "1"
    trial_dir.mkdir(parents=True)
    ctx = TrialContext(
        study_dir=tmp_path, trial_dir=trial_dir, model=ModelRef("m", "/models/m"), max_steps=max_steps
    )
    return executor.execute(TrialSpec(number=1, params={}), ctx, on_step=lambda *_: None, time_left_s=None)


def test_a_run_that_aborts_at_exit_after_every_step_is_complete(tmp_path: Path) -> None:
    result = execute(tmp_path, steps="{max_steps}")
    assert (result.exit_code, result.signal) == (-signal.SIGABRT, signal.SIGABRT)  # it really aborted
    assert result.status is TrialStatus.COMPLETE, result.reason
    assert result.reason == "finished all 4 steps; the process then aborted at exit (SIGABRT)"
    assert result.steps == 4 and result.steady is not None
    assert result.health == []  # checked, and the fixture's run learns
    assert any(n.startswith(result.reason) for n in result.notes)  # shown live by the study
    assert result.failed_phase is None


def test_a_run_that_aborts_before_its_last_step_is_a_crash(tmp_path: Path) -> None:
    result = execute(tmp_path, steps="3")
    assert result.status is TrialStatus.CRASH
    assert result.reason == "killed by SIGABRT at step 3"
    assert result.notes == []


def test_a_run_that_aborts_at_exit_after_every_step_is_still_health_checked(tmp_path: Path) -> None:
    # grad_norm and kl 0 on every step; 3 steps are too few for the live check to stop it first
    result = execute(tmp_path, steps="{max_steps}", mode="kl_zero", max_steps=3)
    assert result.status is TrialStatus.UNHEALTHY
    assert "grad_norm is 0 on all 3 steps" in result.reason
    assert any("aborted at exit (SIGABRT)" in n for n in result.notes)
