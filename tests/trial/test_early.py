"""Early calls (autotune.trial.early): hangs called from evidence and fatal lines that end the process tree,
against real child processes (tests/fixtures/faults) and an autospec fake of NVML.

No test asserts on wall-clock time. Where a test shows a call came before the plain watchdog's limit,
that limit is set to 600 s and the test's own budget (the trial's wall budget) to 60 s: had the early
call not come, the trial would end as "timeout" and the test fail.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from autotune.probes.nvml import NvmlSampler
from autotune.probes.testing import FakeGpu, FakeNvml, fake_nvml
from autotune.probes.timeline import GPU_METRICS, RowBuffer

from autotune.backends import ModelRef, OpenPhase, StepParser, TrialContext
from autotune.backends.command import CommandBackend, CommandParser
from autotune.backends.swift._log import SwiftLogParser
from autotune.errors import UsageError
from autotune.records import (
    Hardware,
    HostInfo,
    LaunchPlan,
    SteadyEstimate,
    StepMetrics,
    TrialSpec,
    TrialStatus,
)
from autotune.trial.early import (
    EarlyCallConfig,
    FatalLines,
    GpuSpinWatch,
    Spin,
    spin_call,
    sync_call,
)
from autotune.trial.evidence import COMMON_PATTERNS
from autotune.trial.execute import Executor
from autotune.trial.failure_phase import trial_failure_phase
from autotune.trial.outcome import Verdict, classify
from autotune.trial.runner import EarlyStopConfig, RunRecord, WatchdogConfig, alive_pids, run_trial

FAULT = Path(__file__).parents[1] / "fixtures" / "faults" / "fault.py"
PLAIN_LIMIT_S = 600.0  # the plain watchdog's limits where a test shows an early call beats them
OWN_BUDGET_S = 60.0  # the test's own limit: the trial's wall budget, far below PLAIN_LIMIT_S
NO_EARLY_STOP = EarlyStopConfig(enabled=False)
TRAINING_MW, SPIN_MW, LIMIT_MW = 450_000, 95_000, 700_000


def watchdog(
    *, early_calls: bool = True, hang_floor_s: float = PLAIN_LIMIT_S, **early: Any
) -> WatchdogConfig:
    settings: dict[str, Any] = {"spin_floor_s": 2.0, "sync_floor_s": 1.0, "fatal_grace_s": 0.5} | early
    return WatchdogConfig(
        startup_timeout_s=PLAIN_LIMIT_S,
        hang_floor_s=hang_floor_s,
        trial_timeout_s=OWN_BUDGET_S,
        grace_s=0.5,
        poll_interval_s=0.05,
        early_calls=early_calls,
        early=EarlyCallConfig(**settings),
    )


def run(
    trial_dir: Path,
    *args: str,
    wd: WatchdogConfig,
    parser: Callable[[Path], StepParser] | None = None,
    **kw: Any,
) -> RunRecord:
    trial_dir.mkdir(parents=True, exist_ok=True)
    metrics, phases = trial_dir / "script_metrics.jsonl", trial_dir / "phases.jsonl"
    plan = LaunchPlan(
        argv=(sys.executable, str(FAULT), *args),
        env={"AUTOTUNE_METRICS_FILE": str(metrics), "AUTOTUNE_PHASES_FILE": str(phases)},
        cwd=str(trial_dir),
        metrics_paths=(str(metrics),),
    )
    made = parser(trial_dir) if parser is not None else CommandParser(metrics, phases)
    return run_trial(plan, made, trial_dir, global_batch=16, watchdog=wd, early_stop=NO_EARLY_STOP, **kw)


def assert_tree_gone(rec: RunRecord) -> None:
    assert alive_pids(rec.pids_seen) == []
    assert len(rec.pids_seen) >= 1


def same_verdict(a: Verdict, b: Verdict) -> bool:
    return (a.status, a.reason, a.evidence) == (b.status, b.reason, b.evidence)


# --------------------------------------------------------------------------------------------------
# GPU spin: a fake NVML whose GPUs the observer scripts as the trial goes


class GpusSpinAfter:
    """Observer: the fake GPUs train (busy, hot) until step ``n`` arrives, then spin (busy, cool)."""

    def __init__(self, fake: FakeNvml, n: int | None) -> None:
        self.fake, self.n = fake, n

    def on_started(self, pid: int, pgid: int) -> None:
        pass

    def on_step(self, step: StepMetrics, estimate: SteadyEstimate | None) -> str | None:
        if self.n is not None and step.step >= self.n:
            for gpu in self.fake.gpus:
                gpu.power_mw = SPIN_MW
        return None


def gpus(n: int = 2, *, util: int = 100, power_mw: int = TRAINING_MW) -> FakeNvml:
    return fake_nvml(
        [
            FakeGpu(uuid=f"GPU-{i}", gpu_util_pct=util, power_mw=power_mw, power_limit_mw=LIMIT_MW)
            for i in range(n)
        ]
    )


def nvml_samplers(fake: FakeNvml) -> Callable[[int], Sequence[Any]]:
    indices = list(range(len(fake.gpus)))
    return lambda pid: [
        NvmlSampler(indices, nvml=fake.module, interval_s=0.05, slow_interval_s=0.2, gpm=False)
    ]


def test_gpus_busy_at_low_power_with_no_step_is_a_hang(tmp_path: Path) -> None:
    fake = gpus()
    rec = run(
        tmp_path / "t",
        "--mode", "hang", "--fail-at", "4", "--step-s", "0.1",
        wd=watchdog(spin_floor_s=2.0),
        observer=GpusSpinAfter(fake, n=4),
        samplers=nvml_samplers(fake),
    )  # fmt: skip
    assert (rec.stopped_by, rec.hang_signal) == ("hang", "gpu_spin")
    assert [s.step for s in rec.steps] == [1, 2, 3, 4]
    verdict = classify(rec)
    assert verdict.status is TrialStatus.HANG
    assert "all busy at low power" in verdict.reason and "after step 4" in verdict.reason
    assert verdict.evidence is not None and verdict.evidence.startswith("gpu_spin: GPUs 0, 1 at >= 90 %")
    assert "95 W of 700 W" in verdict.evidence
    assert trial_failure_phase(rec, verdict.status) is None  # the GPUs do not say which collective waits
    assert_tree_gone(rec)


def test_a_slow_step_on_busy_hot_gpus_is_left_to_the_plain_watchdog(tmp_path: Path) -> None:
    # Same stall, but the GPUs keep drawing training power: real work, however slow. The spin window
    # (2 s) passes long before the plain watchdog's 4 s floor, which is what calls it.
    fake = gpus()
    rec = run(
        tmp_path / "t",
        "--mode", "hang", "--fail-at", "4", "--step-s", "0.1",
        wd=watchdog(spin_floor_s=2.0, hang_floor_s=4.0),
        observer=GpusSpinAfter(fake, n=None),
        samplers=nvml_samplers(fake),
    )  # fmt: skip
    assert (rec.stopped_by, rec.hang_signal, rec.stop_evidence) == ("hang", "no_step", None)
    assert "no step for" in classify(rec).reason
    assert_tree_gone(rec)


def test_one_gpu_idle_while_the_other_spins_is_not_a_spin(tmp_path: Path) -> None:
    # rank 1 waits in a collective while rank 0 works on the CPU (its GPU idle): a healthy pattern
    fake = gpus()
    fake.gpus[0].gpu_util_pct = 0
    rec = run(
        tmp_path / "t",
        "--mode", "hang", "--fail-at", "3", "--step-s", "0.1",
        wd=watchdog(spin_floor_s=1.0, hang_floor_s=3.0),
        observer=GpusSpinAfter(fake, n=3),
        samplers=nvml_samplers(fake),
    )  # fmt: skip
    assert (rec.stopped_by, rec.hang_signal) == ("hang", "no_step")


def test_steps_that_keep_coming_are_no_hang_whatever_the_gpus_show(tmp_path: Path) -> None:
    # The GPUs show the spin signature from the start; 20 steps of 0.2 s (4 s) outlast the 2 s spin
    # window but each resets it. Once the steps stop, the same signature is called within the budget.
    fake = gpus(power_mw=SPIN_MW)
    rec = run(
        tmp_path / "t",
        "--mode", "hang", "--fail-at", "20", "--step-s", "0.2",
        wd=watchdog(spin_floor_s=2.0, spin_k=2.0),
        observer=GpusSpinAfter(fake, n=None),
        samplers=nvml_samplers(fake),
    )  # fmt: skip
    assert len(rec.steps) == 20  # none of the progressing steps was cut short
    assert (rec.stopped_by, rec.hang_signal) == ("hang", "gpu_spin")
    assert_tree_gone(rec)


def test_without_early_calls_the_gpus_are_not_read_for_hangs(tmp_path: Path) -> None:
    fake = gpus()
    rec = run(
        tmp_path / "t",
        "--mode", "hang", "--fail-at", "3", "--step-s", "0.1",
        wd=watchdog(early_calls=False, spin_floor_s=1.0, hang_floor_s=3.0),
        observer=GpusSpinAfter(fake, n=3),
        samplers=nvml_samplers(fake),
    )  # fmt: skip
    assert (rec.stopped_by, rec.hang_signal) == ("hang", "no_step")
    assert rec.timeline_rows > 0  # the sampler ran: only the call was off


# --------------------------------------------------------------------------------------------------
# A weight sync the framework's log shows never ending


def test_weight_sync_marker_never_closed_is_a_hang(tmp_path: Path) -> None:
    rec = run(tmp_path / "t", "--mode", "sync_stall", "--fail-at", "3", "--step-s", "0.2", wd=watchdog())
    assert (rec.stopped_by, rec.hang_signal) == ("hang", "weight_sync_log")
    assert len(rec.steps) == 3  # the short syncs of every step were not called
    verdict = classify(rec)
    assert verdict.status is TrialStatus.HANG
    assert "in weight sync for" in verdict.reason and "after step 3" in verdict.reason
    assert verdict.evidence is not None
    assert verdict.evidence.startswith("weight_sync_log: weight_sync entered and not left for ")
    assert verdict.evidence.endswith("(phase marker: weight_sync began at step 4)")
    assert (rec.open_phase, trial_failure_phase(rec, verdict.status)) == ("weight_sync", "weight_sync")
    assert_tree_gone(rec)


def test_swift_weight_sync_stall_from_vllm_wake_up_lines(tmp_path: Path) -> None:
    rec = run(
        tmp_path / "t",
        "--mode", "swift_sync_stall", "--fail-at", "3", "--steps", "10", "--step-s", "0.2",
        wd=watchdog(),
        parser=lambda _: SwiftLogParser(samples=16),
    )  # fmt: skip
    assert [s.step for s in rec.steps] == [1, 2, 3]
    assert (rec.stopped_by, rec.hang_signal) == ("hang", "weight_sync_log")
    assert rec.stop_evidence is not None and "wake up tags ['weights']" in rec.stop_evidence
    assert trial_failure_phase(rec, classify(rec).status) == "weight_sync"
    assert_tree_gone(rec)


def test_weight_sync_stall_without_early_calls_waits_for_the_watchdog(tmp_path: Path) -> None:
    rec = run(
        tmp_path / "t",
        "--mode", "sync_stall", "--fail-at", "2", "--step-s", "0.2",
        wd=watchdog(early_calls=False, hang_floor_s=2.0),
    )  # fmt: skip
    assert (rec.stopped_by, rec.hang_signal) == ("hang", "no_step")
    assert rec.open_phase == "weight_sync"  # the log still says where it was


# --------------------------------------------------------------------------------------------------
# Fatal lines end the process tree, with the classification the trial would have had


def test_a_fatal_startup_line_ends_the_tree_with_todays_verdict(tmp_path: Path) -> None:
    # vLLM refuses to start, then the job and its engine process stay alive until killed
    rec = run(tmp_path / "linger", "--mode", "vllm_init", "--linger-s", "-1", "--engine-child", wd=watchdog())
    assert rec.stopped_by == "fatal_output"
    assert rec.stop_reason is not None and "VLLM_INIT" in rec.stop_reason
    assert_tree_gone(rec)
    assert len(rec.pids_seen) >= 2  # the engine child was seen, and is gone too
    exits = run(tmp_path / "exits", "--mode", "vllm_init", wd=watchdog())  # today's: it exits at once
    assert exits.stopped_by is None
    verdict = classify(rec)
    assert same_verdict(verdict, classify(exits)), (verdict, classify(exits))
    assert verdict.status is TrialStatus.VLLM_INIT
    assert trial_failure_phase(rec, verdict.status) == "startup"


@pytest.mark.parametrize(
    "args",
    [
        ("--mode", "vllm_init", "--vllm-variant", "max_len"),
        ("--mode", "oom", "--fail-at", "2", "--rank", "1"),
        ("--mode", "nccl", "--fail-at", "2"),
    ],
    ids=["vllm_max_len", "oom", "nccl"],
)
def test_early_and_plain_runs_give_the_same_verdict(tmp_path: Path, args: tuple[str, ...]) -> None:
    # The job lingers 3 s after its failure text, then exits by itself (plain run); with early calls the
    # group is ended 0.5 s after the line. Same status, reason and evidence either way.
    fault = (*args, "--step-s", "0.05", "--linger-s", "3")
    plain = run(tmp_path / "plain", *fault, wd=watchdog(early_calls=False))
    early = run(tmp_path / "early", *fault, wd=watchdog())
    assert plain.stopped_by is None and early.stopped_by == "fatal_output"
    assert same_verdict(classify(early), classify(plain)), (classify(early), classify(plain))
    assert_tree_gone(early)


def test_a_group_that_ignores_sigterm_needs_our_sigkill_and_is_not_a_host_oom(tmp_path: Path) -> None:
    rec = run(
        tmp_path / "t",
        "--mode", "nccl", "--fail-at", "2", "--step-s", "0.05", "--linger-s", "-1", "--ignore-sigterm",
        wd=watchdog(),
    )  # fmt: skip
    assert rec.stopped_by == "fatal_output"
    assert rec.signal == 9 and rec.survivors  # it took SIGKILL
    verdict = classify(rec)
    assert verdict.status is TrialStatus.HANG and "watchdog" in verdict.reason
    assert_tree_gone(rec)


def test_a_step_after_the_fatal_text_means_the_framework_recovered(tmp_path: Path) -> None:
    rec = run(
        tmp_path / "t",
        "--mode", "oom_recover", "--steps", "6", "--fail-at", "2", "--step-s", "0.2",
        wd=watchdog(fatal_grace_s=3.0),
    )  # fmt: skip
    assert rec.stopped_by is None and rec.exit_code == 0
    assert any("CUDA out of memory" in line.text for line in rec.evidence)
    assert classify(rec).status is TrialStatus.COMPLETE  # as without early calls


def test_the_trial_result_says_which_signal_called_it_and_the_failed_phase(tmp_path: Path) -> None:
    backend = CommandBackend(
        [
            sys.executable,
            str(FAULT),
            "--mode",
            "{mode}",
            "--fail-at",
            "3",
            "--step-s",
            "0.2",
            "--linger-s",
            "-1",
        ]
    )
    host = HostInfo(
        hostname="h", cpu_cores_logical=2, cpu_cores_physical=1, ram_total_bytes=2**34, platform="linux"
    )
    executor = Executor(
        backend=backend, hardware=Hardware(host=host), watchdog=watchdog(), early_stop=NO_EARLY_STOP
    )
    got = {}
    for number, mode in enumerate(("vllm_init", "sync_stall"), start=1):
        ctx = TrialContext(
            study_dir=tmp_path, trial_dir=tmp_path / "trials" / str(number), model=ModelRef("m", "/models/m")
        )
        spec = TrialSpec(number=number, params={"mode": mode})
        got[mode] = executor.execute(spec, ctx, on_step=lambda *_: None, time_left_s=None)
    startup, sync = got["vllm_init"], got["sync_stall"]
    assert (startup.status, startup.failed_phase) == (TrialStatus.VLLM_INIT, "startup")
    assert startup.evidence is not None and "Free memory on device" in startup.evidence
    assert (sync.status, sync.failed_phase, sync.steps) == (TrialStatus.HANG, "weight_sync", 3)
    assert sync.evidence is not None and sync.evidence.startswith("weight_sync_log: ")


# --------------------------------------------------------------------------------------------------
# The rules on their own


class Rows:
    """A live GPU source scripted row by row (what NvmlSampler.samples_since serves)."""

    def __init__(self) -> None:
        self.buffer = RowBuffer("gpu", GPU_METRICS)

    def add(self, t: float, device: int, **values: float) -> None:
        row = self.buffer.blank(t, t, device)
        for name, value in values.items():
            row[3 + GPU_METRICS.index(name)] = value
        self.buffer.append(row)

    def samples_since(self, cursor: int, columns: Sequence[str]) -> tuple[list[tuple[float, ...]], int]:
        return self.buffer.since(cursor, columns)


def spin_watch(rows: Rows, **config: Any) -> GpuSpinWatch:
    watch = GpuSpinWatch([rows], EarlyCallConfig(**config))
    watch.update()
    return watch


def two_spinning(rows: Rows, start: float, end: float, *, limit_w: float = 700.0) -> None:
    t = start
    while t <= end:
        for device in (0, 1):
            rows.add(t, device, gpu_util_pct=100, power_w=95, power_limit_w=limit_w)
        t += 0.5


def test_spin_since_the_last_gpu_started_spinning() -> None:
    rows = Rows()
    two_spinning(rows, 0.0, 10.0)
    rows.add(10.5, 0, gpu_util_pct=100, power_w=400)  # GPU 0 works for a moment
    for t in (11.0, 11.5, 12.0):
        rows.add(t, 0, gpu_util_pct=100, power_w=95)
    spin = spin_watch(rows).spin(now_mono_s=12.0)
    assert spin is not None and spin.since_mono_s == 11.0 and spin.gpus == (0, 1)
    assert "GPU 1 100 % busy at 95 W of 700 W" in spin.detail


@pytest.mark.parametrize(
    ("tweak", "why"),
    [
        (lambda r: r.add(11.0, 1, gpu_util_pct=40), "one GPU not busy"),
        (lambda r: r.add(11.0, 1, power_w=300), "one GPU above a quarter of its limit"),
        (lambda r: r.add(11.0, 2, gpu_util_pct=0, power_w=60, power_limit_w=700), "a third GPU idle"),
    ],
)
def test_no_spin_unless_every_gpu_shows_it(tweak: Callable[[Rows], None], why: str) -> None:
    rows = Rows()
    two_spinning(rows, 0.0, 10.0)
    tweak(rows)
    assert spin_watch(rows).spin(now_mono_s=11.0) is None, why


def test_no_spin_on_one_gpu_without_a_power_limit_or_with_stale_samples() -> None:
    rows = Rows()
    for t in (0.0, 1.0, 2.0):
        rows.add(t, 0, gpu_util_pct=100, power_w=95, power_limit_w=700)
    assert spin_watch(rows).spin(now_mono_s=2.0) is None  # one GPU: no peer to wait for
    rows = Rows()
    two_spinning(rows, 0.0, 5.0, limit_w=math.nan)
    assert spin_watch(rows).spin(now_mono_s=5.0) is None  # low against what? never guessed
    rows = Rows()
    two_spinning(rows, 0.0, 5.0)
    watch = spin_watch(rows, sample_stale_s=10.0)
    assert watch.spin(now_mono_s=5.0) is not None
    assert watch.spin(now_mono_s=16.0) is None  # the sampler went quiet: nothing is known now


def test_gpus_that_hold_none_of_the_trials_memory_are_not_its_gpus() -> None:
    rows = Rows()
    two_spinning(rows, 0.0, 5.0)
    rows.add(5.0, 0, proc_mem_bytes=30e9)
    rows.add(5.0, 1, proc_mem_bytes=30e9)
    rows.add(5.0, 2, gpu_util_pct=0, power_w=60, power_limit_w=700, proc_mem_bytes=0)
    watch = spin_watch(rows)
    assert watch.trial_gpus() == [0, 1]
    assert watch.spin(now_mono_s=5.0) is not None


def test_windows_count_from_the_later_of_the_signal_and_the_last_step() -> None:
    cfg = EarlyCallConfig()
    window, rule = cfg.spin_window_s(median_step_s=40.0, startup_timeout_s=600.0)
    assert window == 80.0 and "2 × median step 40 s" in rule
    assert cfg.spin_window_s(median_step_s=1.0, startup_timeout_s=600.0)[0] == 30.0  # the floor
    assert cfg.spin_window_s(median_step_s=None, startup_timeout_s=600.0)[0] == 150.0  # 0.25 × start-up
    assert cfg.sync_window_s(median_step_s=40.0, startup_timeout_s=600.0)[0] == 120.0
    assert cfg.sync_window_s(median_step_s=1.0, startup_timeout_s=600.0)[0] == 60.0
    spin = Spin(since_mono_s=100.0, gpus=(0, 1), detail="")
    kw: dict[str, Any] = {"after": " after step 3", "window_s": 30.0, "rule": "r", "config": cfg}
    assert spin_call(spin, now_mono_s=129.0, last_progress_mono_s=50.0, **kw) is None
    assert spin_call(spin, now_mono_s=130.0, last_progress_mono_s=50.0, **kw) is not None
    assert spin_call(spin, now_mono_s=130.0, last_progress_mono_s=110.0, **kw) is None  # a step came
    sync = OpenPhase("weight_sync", 100.0, "marker")
    assert sync_call(sync, now_mono_s=130.0, last_progress_mono_s=0.0, after="", window_s=30.0, rule="r")
    rollout = OpenPhase("rollout", 100.0, "marker")  # a long rollout is not a blocking collective
    assert (
        sync_call(rollout, now_mono_s=1e6, last_progress_mono_s=0.0, after="", window_s=30.0, rule="r")
        is None
    )


def test_fatal_lines_are_those_the_outcome_reads_and_invalid_only_before_a_step() -> None:
    lines = FatalLines(COMMON_PATTERNS)
    oom = "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.32 GiB."
    found = lines.match(oom, 1.0, before_first_step=False)
    assert found is not None and found.pattern.status == "OOM" and found.line == oom
    usage = "train.py: error: unrecognized arguments: --bogus 1"
    assert lines.match(usage, 1.0, before_first_step=True) is not None
    assert lines.match(usage, 1.0, before_first_step=False) is None
    assert lines.match("loading model ... done (0 errors, 0 warnings)", 1.0, before_first_step=True) is None


@pytest.mark.parametrize(
    "bad",
    [{"spin_floor_s": -1.0}, {"spin_power_frac": 1.5}, {"spin_min_gpus": 1}, {"sync_k": math.nan}],
)
def test_settings_that_cannot_mean_anything_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(UsageError):
        EarlyCallConfig(**bad)
