"""The runner against real child processes that fail the way GRPO jobs fail (tests/fixtures/faults)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from autotune.backends.command import CommandParser
from autotune.errors import BackendError, UsageError
from autotune.records import LaunchPlan, SteadyEstimate, StepMetrics, TrialStatus
from autotune.trial.outcome import classify, health_check
from autotune.trial.runner import (
    EarlyStopConfig,
    RunRecord,
    WatchdogConfig,
    alive_pids,
    default_startup_timeout_s,
    reap_orphan,
    run_trial,
    terminate_group,
)
from autotune.trial.steady import is_stable, step_durations

FAULT = Path(__file__).parents[1] / "fixtures" / "faults" / "fault.py"
FAST = WatchdogConfig(startup_timeout_s=20, hang_k=3, hang_floor_s=0.6, grace_s=0.5, poll_interval_s=0.05)
NO_EARLY = EarlyStopConfig(enabled=False)


def plan_for(trial_dir: Path, *args: str, env: dict[str, str] | None = None) -> LaunchPlan:
    metrics = trial_dir / "script_metrics.jsonl"
    return LaunchPlan(
        argv=(sys.executable, str(FAULT), *args),
        env={"AUTOTUNE_METRICS_FILE": str(metrics), "AUTOTUNE_GLOBAL_BATCH": "16", **(env or {})},
        cwd=str(trial_dir),
        metrics_paths=(str(metrics),),
    )


def run(
    trial_dir: Path, *args: str, watchdog: WatchdogConfig = FAST, early: EarlyStopConfig = NO_EARLY, **kw: Any
) -> RunRecord:
    trial_dir.mkdir(parents=True, exist_ok=True)
    plan = plan_for(trial_dir, *args)
    parser = CommandParser(trial_dir / "script_metrics.jsonl")
    return run_trial(plan, parser, trial_dir, global_batch=16, watchdog=watchdog, early_stop=early, **kw)


def assert_nothing_survives(rec: RunRecord, *extra_pids: int) -> None:
    assert alive_pids([*rec.pids_seen, *extra_pids]) == []
    group = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == rec.pgid and proc.status() != psutil.STATUS_ZOMBIE:
                group.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    assert group == []


def read_pid(path: Path, timeout_s: float = 5.0) -> int:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} never appeared")
        time.sleep(0.02)
    return int(path.read_text())


# --------------------------------------------------------------------------------------------------
# The fault fixtures: status, reason, nothing left behind


@pytest.mark.parametrize(
    ("args", "status", "reason_part"),
    [
        (("--mode", "ok"), TrialStatus.COMPLETE, "completed 5 steps"),
        (("--mode", "oom", "--fail-at", "3", "--rank", "1"), TrialStatus.OOM, "CUDA out of memory on rank 1"),
        (("--mode", "oom", "--oom-spelling", "runtime"), TrialStatus.OOM, "tried to allocate 20.00 MiB"),
        (("--mode", "oom", "--oom-spelling", "cumem"), TrialStatus.OOM, "out of memory"),
        (("--mode", "oom", "--oom-spelling", "nccl", "--rank", "2"), TrialStatus.OOM, "on rank 2"),
        (("--mode", "vllm_init"), TrialStatus.VLLM_INIT, "gpu_memory_utilization"),
        (("--mode", "vllm_init", "--vllm-variant", "profiling"), TrialStatus.VLLM_INIT, "profiled"),
        (("--mode", "vllm_init", "--vllm-variant", "max_len"), TrialStatus.VLLM_INIT, "max_model_len"),
        (("--mode", "hang"), TrialStatus.HANG, "no step for"),
        (("--mode", "segv"), TrialStatus.CRASH, "SIGSEGV"),
        (("--mode", "sigkill"), TrialStatus.HOST_OOM, "SIGKILL"),
        (("--mode", "torchrun_sigkill"), TrialStatus.HOST_OOM, "SIGKILL"),
        (("--mode", "nccl"), TrialStatus.HANG, "watchdog"),
        (("--mode", "port_in_use"), TrialStatus.INTERRUPTED, "EADDRINUSE"),
        (("--mode", "startup_invalid"), TrialStatus.INVALID, "unrecognized arguments: --bogus_flag"),
        (("--mode", "config_error"), TrialStatus.INVALID, "must be divisible by num_generations"),
        (("--mode", "crash"), TrialStatus.CRASH, "RuntimeError: Expected all tensors"),
        (("--mode", "no_step"), TrialStatus.CRASH, "without a step"),
    ],
)
def test_fault(tmp_path: Path, args: tuple[str, ...], status: TrialStatus, reason_part: str) -> None:
    rec = run(tmp_path / "t", *args)
    verdict = classify(rec)
    assert verdict.status is status, (verdict, rec.stderr_tail[-5:])
    assert reason_part in verdict.reason
    assert "\n" not in verdict.reason
    assert_nothing_survives(rec)


def test_hang_is_stopped_by_the_watchdog_with_its_numbers(tmp_path: Path) -> None:
    rec = run(tmp_path / "t", "--mode", "hang", "--fail-at", "3")
    assert rec.stopped_by == "hang"
    assert len(rec.steps) == 3
    assert rec.signal == signal.SIGTERM  # it obeyed SIGTERM: nothing needed SIGKILL
    assert rec.survivors == []
    assert (
        rec.stop_reason is not None and "after step 3" in rec.stop_reason and "floor 0.6 s" in rec.stop_reason
    )


def test_unhealthy_fixtures(tmp_path: Path) -> None:
    kl = run(tmp_path / "kl", "--mode", "kl_zero", "--steps", "4")
    problems = health_check(kl.steps, beta=0.04, max_completion_length=16, baseline=None)
    verdict = classify(kl, health=problems)
    assert verdict.status is TrialStatus.UNHEALTHY
    assert any("grad_norm is 0 on all 4 steps" in p for p in problems)
    assert any("kl is 0 on all 3 steps after the first" in p for p in problems)

    nan = run(tmp_path / "nan", "--mode", "nan", "--steps", "3")
    problems = health_check(nan.steps, beta=0.04, max_completion_length=16, baseline=None)
    assert classify(nan, health=problems).status is TrialStatus.UNHEALTHY
    assert problems == ["loss is NaN at step 1 (3 of 3 steps not finite)."]
    # NaN survives the trip through metrics.jsonl
    first = json.loads((tmp_path / "nan" / "metrics.jsonl").read_text().splitlines()[0])
    assert math.isnan(StepMetrics.model_validate(first).values["loss"])

    ok = run(tmp_path / "ok", "--mode", "ok")
    assert health_check(ok.steps, beta=0.04, max_completion_length=16, baseline=kl.steps) == []


@pytest.mark.parametrize("escape", [False, True])
def test_grandchild_that_ignores_sigterm_is_killed(tmp_path: Path, escape: bool) -> None:
    pid_file = tmp_path / "grandchild.pid"
    args = ["--mode", "grandchild", "--pid-file", str(pid_file)] + (["--escape"] if escape else [])
    rec = run(tmp_path / "t", *args)
    grandchild = read_pid(pid_file)
    assert classify(rec).status is TrialStatus.HANG
    assert grandchild in rec.pids_seen
    assert grandchild in rec.survivors  # it ignored SIGTERM, so it needed SIGKILL
    assert_nothing_survives(rec, grandchild)


def test_terminate_group_is_idempotent(tmp_path: Path) -> None:
    pid_file = tmp_path / "gc.pid"
    proc = subprocess.Popen(
        [sys.executable, str(FAULT), "--mode", "grandchild", "--pid-file", str(pid_file), "--step-s", "0"],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    grandchild = read_pid(pid_file)
    killed = terminate_group(proc.pid, [proc.pid, grandchild], grace_s=0.3)
    assert proc.wait(timeout=5) == -signal.SIGTERM
    assert killed == [grandchild]
    assert terminate_group(proc.pid, [proc.pid, grandchild], grace_s=0.3) == []
    assert alive_pids([proc.pid, grandchild]) == []


def test_terminate_group_skips_a_reused_pid(tmp_path: Path) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        wrong_ctime = psutil.Process(other.pid).create_time() - 100.0
        assert terminate_group(-1, {other.pid: wrong_ctime}, grace_s=0.1) == []
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


# --------------------------------------------------------------------------------------------------
# Watchdog, early stop, pruning, interruption


def test_startup_budget(tmp_path: Path) -> None:
    watchdog = WatchdogConfig(startup_timeout_s=0.5, hang_floor_s=0.5, grace_s=0.5, poll_interval_s=0.05)
    rec = run(tmp_path / "t", "--mode", "ok", "--startup-s", "30", watchdog=watchdog)
    verdict = classify(rec)
    assert rec.stopped_by == "startup_timeout"
    assert verdict.status is TrialStatus.HANG
    assert verdict.reason == "no step within the start-up budget of 0.5 s"
    assert rec.steps == [] and rec.startup_s is None
    assert_nothing_survives(rec)


def test_slow_steady_steps_are_not_a_hang_but_a_stall_after_them_is(tmp_path: Path) -> None:
    watchdog = WatchdogConfig(
        startup_timeout_s=20, hang_k=4, hang_floor_s=0.1, grace_s=0.5, poll_interval_s=0.02
    )
    slow = run(tmp_path / "slow", "--mode", "ok", "--steps", "5", "--step-s", "0.25", watchdog=watchdog)
    assert classify(slow).status is TrialStatus.COMPLETE  # 0.25 s steps against a 0.1 s floor
    stall = run(tmp_path / "stall", "--mode", "hang", "--fail-at", "4", "--step-s", "0.25", watchdog=watchdog)
    assert stall.stopped_by == "hang"
    # the limit is 4 × the median of the step times the record holds (whatever this machine made them)
    median_s = statistics.median(step_durations(stall.steps)[0])
    assert stall.stop_reason is not None and f"4 × median step {median_s:.3g} s" in stall.stop_reason
    assert_nothing_survives(stall)


def test_until_a_step_time_is_known_the_startup_budget_applies(tmp_path: Path) -> None:
    watchdog = WatchdogConfig(startup_timeout_s=1.0, hang_floor_s=0.1, grace_s=0.5, poll_interval_s=0.02)
    rec = run(tmp_path / "t", "--mode", "hang", "--fail-at", "1", watchdog=watchdog)
    assert rec.stopped_by == "hang" and len(rec.steps) == 1
    # one step gives no step time: the limit after it is the start-up budget, not the 0.1 s floor
    assert rec.stop_reason is not None
    assert rec.stop_reason.endswith("(limit 1 s = the start-up budget, no step duration known yet)")


def test_output_alone_is_not_progress(tmp_path: Path) -> None:
    # tqdm-style output keeps coming but no step record: still a hang after the budget.
    script = tmp_path / "chatty.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, sys, time
            for i in range(1, 3):
                print(json.dumps({"step": i}), flush=True)
                time.sleep(0.05)
            while True:
                sys.stderr.write("\\rgenerating 50%|#####     |"); sys.stderr.flush(); time.sleep(0.02)
            """
        )
    )
    plan = LaunchPlan(argv=(sys.executable, str(script)), cwd=str(tmp_path))
    rec = run_trial(
        plan, CommandParser(None), tmp_path / "t", global_batch=4, watchdog=FAST, early_stop=NO_EARLY
    )
    assert rec.stopped_by == "hang"
    assert len(rec.stderr_tail) > 10
    assert classify(rec).status is TrialStatus.HANG
    assert_nothing_survives(rec)


def test_trial_wall_budget(tmp_path: Path) -> None:
    watchdog = WatchdogConfig(trial_timeout_s=0.8, hang_floor_s=30, grace_s=0.5, poll_interval_s=0.05)
    rec = run(tmp_path / "t", "--mode", "forever", "--step-s", "0.05", watchdog=watchdog)
    verdict = classify(rec)
    assert verdict.status is TrialStatus.TIMEOUT
    # the steps counted when the budget ran out: the record holds them (and any read while it stopped)
    counted = re.fullmatch(r"trial wall budget of 0\.8 s ran out after (\d+) steps", verdict.reason)
    assert counted is not None and int(counted.group(1)) <= len(rec.steps)
    assert_nothing_survives(rec)


def test_early_stop_at_steady_state(tmp_path: Path) -> None:
    early = EarlyStopConfig(enabled=True, min_steady_steps=3, target_rel_ci95=0.25, min_steps=5)
    watchdog = WatchdogConfig(trial_timeout_s=60, hang_floor_s=10, grace_s=0.5, poll_interval_s=0.05)
    obs = Recorder()
    rec = run(
        tmp_path / "t",
        "--mode",
        "forever",
        "--step-s",
        "0.05",
        "--warmup-s",
        "0.3",
        "--warmup-steps",
        "2",
        watchdog=watchdog,
        early=early,
        observer=obs,
    )
    verdict = classify(rec)
    assert rec.stopped_by == "early_stop"
    assert verdict.status is TrialStatus.COMPLETE
    assert verdict.reason.startswith("steady after")
    # It stopped at the first step whose estimate was stable, not before and not later.
    decided_at, estimate = obs.seen[-1]
    assert decided_at >= early.min_steps and is_stable(estimate, early)
    assert not any(is_stable(e, early) for s, e in obs.seen[:-1] if s >= early.min_steps)
    assert estimate is not None and estimate.warmup_steps >= 2  # the boundary record and the slow second step
    assert rec.estimate is not None
    assert_nothing_survives(rec)


class Recorder:
    def __init__(self, prune_at: int | None = None, stop_event: threading.Event | None = None) -> None:
        self.prune_at = prune_at
        self.stop_event = stop_event
        self.started: tuple[int, int] | None = None
        self.seen: list[tuple[int, SteadyEstimate | None]] = []
        self.output: list[tuple[str, str]] = []

    def on_started(self, pid: int, pgid: int) -> None:
        self.started = (pid, pgid)

    def on_step(self, step: StepMetrics, estimate: SteadyEstimate | None) -> str | None:
        self.seen.append((step.step, estimate))
        if self.stop_event is not None and step.step == 2:
            self.stop_event.set()
        if self.prune_at is not None and step.step >= self.prune_at:
            return "slower than best: 0.41 s/step against 0.20 s/step"
        return None

    def on_output(self, stream: str, line: str) -> None:
        self.output.append((stream, line))


def test_observer_prunes(tmp_path: Path) -> None:
    obs = Recorder(prune_at=4)
    rec = run(tmp_path / "t", "--mode", "forever", observer=obs)
    verdict = classify(rec)
    assert verdict.status is TrialStatus.PRUNED
    assert verdict.reason == "slower than best: 0.41 s/step against 0.20 s/step"
    assert obs.started == (rec.pid, rec.pgid)
    assert [s for s, _ in obs.seen[:4]] == [1, 2, 3, 4]
    assert (
        obs.seen[0][1] is None and obs.seen[3][1] is not None
    )  # estimates appear once there are enough steps
    assert ("stdout", "loading model ... done (0 errors, 0 warnings)") in obs.output
    assert_nothing_survives(rec)


def test_stop_event_interrupts(tmp_path: Path) -> None:
    event = threading.Event()
    rec = run(tmp_path / "t", "--mode", "forever", observer=Recorder(stop_event=event), stop_event=event)
    verdict = classify(rec)
    assert rec.stopped_by == "interrupt"
    assert verdict.status is TrialStatus.INTERRUPTED
    assert_nothing_survives(rec)


def test_observer_exception_still_cleans_up(tmp_path: Path) -> None:
    class Broken(Recorder):
        def on_step(self, step: StepMetrics, estimate: SteadyEstimate | None) -> str | None:
            raise RuntimeError("observer bug")

    obs = Broken()
    with pytest.raises(RuntimeError, match="observer bug"):
        run(tmp_path / "t", "--mode", "forever", observer=obs)
    assert obs.started is not None
    assert alive_pids([obs.started[0]]) == []


# --------------------------------------------------------------------------------------------------
# Output handling and files


def test_carriage_returns_and_metrics_file(tmp_path: Path) -> None:
    progress = run(tmp_path / "p", "--mode", "ok", "--progress")
    assert [s.step for s in progress.steps] == [1, 2, 3, 4, 5]
    assert any(line.startswith("100%|") for line in progress.stdout_tail)
    to_file = run(tmp_path / "f", "--mode", "ok", "--to-file")
    assert [s.step for s in to_file.steps] == [1, 2, 3, 4, 5]
    assert classify(to_file).status is TrialStatus.COMPLETE


def test_trial_directory_files(tmp_path: Path) -> None:
    trial = tmp_path / "t"
    rec = run(trial, "--mode", "ok", "--steps", "4")
    for name in ("launch.json", "command.sh", "proc.json", "stdout.log", "stderr.log", "metrics.jsonl"):
        assert (trial / name).exists(), name
    plan = LaunchPlan.model_validate_json((trial / "launch.json").read_text())
    assert plan.argv[1:] == (str(FAULT), "--mode", "ok", "--steps", "4")
    steps = [
        StepMetrics.model_validate(json.loads(x)) for x in (trial / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == rec.steps
    assert "loading model" in (trial / "stdout.log").read_text()
    assert "UserWarning" in (trial / "stderr.log").read_text()
    proc = json.loads((trial / "proc.json").read_text())
    assert proc["pid"] == rec.pid == proc["pgid"] and proc["ended"] is True and proc["exit_code"] == 0
    assert rec.startup_s is not None and rec.duration_s >= rec.startup_s
    assert rec.first_output_s is not None and rec.first_output_s <= rec.startup_s
    assert reap_orphan(trial) is None


def test_command_sh_reruns_the_trial(tmp_path: Path) -> None:
    trial = tmp_path / "t"
    run(trial, "--mode", "ok", "--steps", "3")
    out = subprocess.run(
        ["bash", str(trial / "command.sh")], capture_output=True, text=True, timeout=30, check=True
    )
    steps = [json.loads(x)["step"] for x in out.stdout.splitlines() if x.startswith("{")]
    assert steps == [1, 2, 3]


def test_samplers_get_the_pid_and_rows_land_in_the_timeline(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")

    class FakeSampler:
        def __init__(self, pid: int) -> None:
            self.pid = pid
            self.running = False

        def start(self) -> None:
            self.running = True

        def stop(self) -> None:
            self.running = False

        def rows(self) -> list[dict[str, Any]]:
            return [
                {
                    "t_mono_s": 1.0 + i,
                    "t_wall_s": 2.0,
                    "source": "host",
                    "device": -1,
                    "rss_bytes": float(self.pid),
                }
                for i in range(3)
            ]

    made: list[FakeSampler] = []

    def factory(pid: int) -> list[FakeSampler]:
        made.append(FakeSampler(pid))
        return made

    rec = run(tmp_path / "t", "--mode", "ok", samplers=factory)
    assert made[0].pid == rec.pid and not made[0].running
    assert rec.timeline_rows == 3
    frame = pd.read_parquet(tmp_path / "t" / "timeline.parquet")
    assert len(frame) == 3 and set(frame["rss_bytes"]) == {float(rec.pid)}


def test_a_failing_sampler_does_not_fail_the_trial(tmp_path: Path) -> None:
    class Bad:
        def start(self) -> None:
            raise OSError("no NVML")

        def stop(self) -> None: ...

        def rows(self) -> list[dict[str, Any]]:
            return []

    rec = run(tmp_path / "t", "--mode", "ok", samplers=lambda pid: [Bad()])
    assert classify(rec).status is TrialStatus.COMPLETE
    assert any("no NVML" in n for n in rec.notes)


def test_missing_executable_is_a_backend_error(tmp_path: Path) -> None:
    plan = LaunchPlan(argv=("definitely-not-a-program-xyz",), cwd=str(tmp_path))
    with pytest.raises(BackendError) as info:
        run_trial(
            plan, CommandParser(None), tmp_path / "t", global_batch=1, watchdog=FAST, early_stop=NO_EARLY
        )
    assert "definitely-not-a-program-xyz" in str(info.value) and "\n" not in str(info.value)


def test_framework_owned_metrics_file_is_not_overwritten(tmp_path: Path) -> None:
    trial = tmp_path / "t"
    trial.mkdir()
    metrics = trial / "metrics.jsonl"
    plan = LaunchPlan(
        argv=(sys.executable, str(FAULT), "--mode", "ok", "--to-file", "--steps", "3"),
        env={"AUTOTUNE_METRICS_FILE": str(metrics)},
        cwd=str(trial),
        metrics_paths=(str(metrics),),
    )
    rec = run_trial(plan, CommandParser(metrics), trial, global_batch=16, watchdog=FAST, early_stop=NO_EARLY)
    assert len(rec.steps) == 3
    assert len(metrics.read_text().splitlines()) == 3  # the script's lines only, not doubled
    assert rec.notes == []  # an ordinary case: nothing printed after the trial


# --------------------------------------------------------------------------------------------------
# Orphans left by a killed autotune


def test_reap_orphan_after_autotune_was_sigkilled(tmp_path: Path) -> None:
    trial = tmp_path / "t"
    pid_file = tmp_path / "gc.pid"
    driver = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from autotune.backends.command import CommandParser
        from autotune.records import LaunchPlan
        from autotune.trial.runner import EarlyStopConfig, WatchdogConfig, run_trial
        trial = Path({str(trial)!r})
        plan = LaunchPlan(argv=(sys.executable, {str(FAULT)!r}, "--mode", "grandchild", "--pid-file", {str(pid_file)!r}),
                          cwd=str(trial.parent))
        run_trial(plan, CommandParser(None), trial, global_batch=1,
                  watchdog=WatchdogConfig(hang_floor_s=600, startup_timeout_s=600), early_stop=EarlyStopConfig(enabled=False))
        """
    )
    autotune = subprocess.Popen([sys.executable, "-c", driver])
    try:
        grandchild = read_pid(pid_file, timeout_s=20)
        deadline = time.monotonic() + 10
        while json.loads((trial / "proc.json").read_text()).get("descendants") in ({}, None):
            assert time.monotonic() < deadline, "descendants never recorded"
            time.sleep(0.1)
        info = json.loads((trial / "proc.json").read_text())
        autotune.send_signal(signal.SIGKILL)
        autotune.wait(timeout=10)
        assert alive_pids([info["pid"], grandchild]) == [info["pid"], grandchild]  # orphaned, still running

        description = reap_orphan(trial, grace_s=0.3)
        assert description is not None and "\n" not in description
        assert f"group {info['pgid']}" in description and str(grandchild) in description
        assert alive_pids([info["pid"], grandchild]) == []
        assert reap_orphan(trial, grace_s=0.3) is None
    finally:
        if autotune.poll() is None:
            autotune.kill()
            autotune.wait()
        if pid_file.exists():
            terminate_group(-1, [read_pid(pid_file)], grace_s=0.1)


def test_reap_orphan_leaves_a_reused_pid_alone(tmp_path: Path) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        trial = tmp_path / "t"
        trial.mkdir()
        ctime = psutil.Process(other.pid).create_time()
        (trial / "proc.json").write_text(
            json.dumps({"pid": other.pid, "pgid": other.pid, "create_time": ctime - 50, "descendants": {}})
        )
        assert reap_orphan(trial, grace_s=0.1) is None
        assert other.poll() is None
        assert reap_orphan(tmp_path / "nowhere") is None
    finally:
        other.kill()
        other.wait()


# --------------------------------------------------------------------------------------------------
# Settings


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"hang_floor_s": -5}, "--hang-floor"),
        ({"startup_timeout_s": -1}, "--startup-timeout"),
        ({"hang_k": -0.5}, "--hang-k"),
        ({"trial_timeout_s": -10}, "--trial-timeout"),
        ({"grace_s": float("nan")}, "--grace"),
        ({"poll_interval_s": 0}, "--poll-interval"),
    ],
)
def test_watchdog_rejects_bad_values(kwargs: dict[str, float], flag: str) -> None:
    with pytest.raises(UsageError) as info:
        WatchdogConfig(**kwargs)
    assert flag in str(info.value)
    assert "\n" not in str(info.value)
    assert info.value.exit_code == 2


def test_startup_budget_grows_with_model_size() -> None:
    assert default_startup_timeout_s(None) == 600
    small, big = default_startup_timeout_s(500_000_000), default_startup_timeout_s(72_000_000_000)
    assert 600 < small < big


@pytest.mark.trl
def test_real_trl_config_rejection_is_invalid(tmp_path: Path) -> None:
    """TRL's own GRPOConfig.__post_init__ ValueError, raised in a real child process."""
    if importlib.util.find_spec("trl") is None:
        pytest.skip("trl is not installed")
    code = (
        "from trl import GRPOConfig; "
        "GRPOConfig(output_dir='out', per_device_train_batch_size=3, num_generations=4, use_cpu=True, report_to='none')"
    )
    plan = LaunchPlan(argv=(sys.executable, "-c", code), cwd=str(tmp_path), env={"OMP_NUM_THREADS": "1"})
    watchdog = WatchdogConfig(startup_timeout_s=300, grace_s=1)
    rec = run_trial(
        plan, CommandParser(None), tmp_path / "t", global_batch=16, watchdog=watchdog, early_stop=NO_EARLY
    )
    verdict = classify(rec)
    assert verdict.status is TrialStatus.INVALID, rec.stderr_tail[-5:]
    assert "must be divisible by num_generations" in verdict.reason
