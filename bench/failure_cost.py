"""What a failed trial costs until it is classified: the plain watchdog against the early calls.

    python bench/failure_cost.py [--scale 10] [--workers 10] [--faults a,b,...]

Each fault is a real child process (``tests/fixtures/faults/fault.py``) printing the real framework
text, run through the real runner (:func:`autotune.trial.runner.run_trial`) and classified
(:func:`autotune.trial.outcome.classify`) twice, side by side in one run: with
``WatchdogConfig.early_calls`` off (what autotune did before) and on. Printed per fault: seconds from
launch to classification, seconds from the fault to classification, their ratio, which signal made the
call, and whether both runs reached the same verdict (status and reason).

The faults, at full scale (a 7B-class GRPO job: 30 s steps, three healthy steps before a fault, the
default 600 s start-up budget, watchdog and early-call defaults):

- ``vllm_fatal``: vLLM refuses to start after 20 s of loading ("Free memory on device ... is less than
  desired GPU memory utilization") and the job and its engine process stay alive 120 s more, as vLLM
  and Ray do.
- ``oom_fatal``: a CUDA OOM traceback at step 4 on rank 1, then 120 s alive.
- ``nccl_spin``: steps stop after step 3; the two GPUs (an autospec fake of NVML, ``probes.testing``)
  read 100 % utilization at 95 W of a 700 W limit: NCCL spinning on a collective that never completes.
- ``nccl_spin_startup``: the same spin before any step (a rank that never joins the first collective).
- ``weight_sync_stall``: ms-swift's log with colocated vLLM in sleep mode: vLLM's wake-up lines around
  each weight sync, then "wake up tags ['weights']" after step 3 and nothing more.

``--scale k`` divides every duration of the scenario by k (steps, loading, lingering, every watchdog
limit and early-call window and grace, and the stale-sample limit), so a run takes minutes, not an hour.
The rules are linear in those durations, so the ratios hold; the "full-scale" column multiplies the
measured seconds back by k, which also multiplies the fixed costs that do not scale (Python start-up of
the fixture, about 0.2 s, and the runner's 0.1 s poll), so at k > 1 it overstates the early calls'
seconds a little. ``--scale 1`` runs the scenario as is (about 10 minutes). The fake GPUs are sampled at
20 Hz with slow reads every 0.2 s (the defaults are 10 Hz and 1 s) so the driver buffer's latency stays
small against the scaled windows.

Nothing is asserted: this measures.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autotune.probes.nvml import NvmlSampler
from autotune.probes.testing import FakeGpu, FakeNvml, fake_nvml

from autotune.backends import StepParser
from autotune.backends.command import CommandParser
from autotune.backends.swift._log import SwiftLogParser
from autotune.records import LaunchPlan, SteadyEstimate, StepMetrics
from autotune.trial.early import EarlyCallConfig
from autotune.trial.evidence import COMMON_PATTERNS
from autotune.trial.failure_phase import trial_failure_phase
from autotune.trial.outcome import Verdict, classify
from autotune.trial.runner import EarlyStopConfig, RunRecord, WatchdogConfig, run_trial

FAULT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "faults" / "fault.py"
STEP_S = 30.0  # full scale: a 7B-class GRPO step
LOADING_S = 20.0  # model loading before vLLM's start-up check
LINGER_S = 120.0  # how long vLLM / Ray keep the job alive after the fatal line
TRAINING_MW, SPIN_MW, LIMIT_MW = 450_000, 95_000, 700_000


@dataclass(frozen=True)
class Fault:
    """One fault scenario: the fixture's arguments (in full-scale seconds), its parser and GPUs."""

    name: str
    args: Callable[[float], tuple[str, ...]]  # scale -> fixture arguments
    parser: Callable[[Path], StepParser]
    spin_after_step: int | None = None  # fake GPUs spin from this step on (0: from launch); None: no GPUs


def _seconds(x: float) -> str:
    return f"{x:g}"


FAULTS: tuple[Fault, ...] = (
    Fault(
        "vllm_fatal",
        lambda k: (
            "--mode",
            "vllm_init",
            "--startup-s",
            _seconds(LOADING_S / k),
            "--linger-s",
            _seconds(LINGER_S / k),
            "--engine-child",
        ),
        lambda d: CommandParser(d / "script_metrics.jsonl", d / "phases.jsonl"),
    ),  # fmt: skip
    Fault(
        "oom_fatal",
        lambda k: (
            "--mode",
            "oom",
            "--fail-at",
            "3",
            "--rank",
            "1",
            "--step-s",
            _seconds(STEP_S / k),
            "--linger-s",
            _seconds(LINGER_S / k),
        ),
        lambda d: CommandParser(d / "script_metrics.jsonl", d / "phases.jsonl"),
    ),  # fmt: skip
    Fault(
        "nccl_spin",
        lambda k: ("--mode", "hang", "--fail-at", "3", "--step-s", _seconds(STEP_S / k)),
        lambda d: CommandParser(d / "script_metrics.jsonl", d / "phases.jsonl"),
        spin_after_step=3,
    ),
    Fault(
        "nccl_spin_startup",
        lambda k: ("--mode", "hang", "--fail-at", "0"),
        lambda d: CommandParser(d / "script_metrics.jsonl", d / "phases.jsonl"),
        spin_after_step=0,
    ),
    Fault(
        "weight_sync_stall",
        lambda k: (
            "--mode",
            "swift_sync_stall",
            "--fail-at",
            "3",
            "--steps",
            "100",
            "--step-s",
            _seconds(STEP_S / k),
        ),
        lambda d: SwiftLogParser(samples=16),
    ),  # fmt: skip
)


def watchdog(scale: float, *, early_calls: bool) -> WatchdogConfig:
    """The defaults (600 s start-up budget, no-step limit max(5 × median, 60 s), early-call windows),
    every duration divided by ``scale``."""
    base, early = WatchdogConfig(), EarlyCallConfig()
    return WatchdogConfig(
        startup_timeout_s=base.startup_timeout_s / scale,
        hang_k=base.hang_k,
        hang_floor_s=base.hang_floor_s / scale,
        grace_s=base.grace_s / scale,
        poll_interval_s=base.poll_interval_s,
        early_calls=early_calls,
        early=replace(
            early,
            fatal_grace_s=early.fatal_grace_s / scale,
            spin_floor_s=early.spin_floor_s / scale,
            sync_floor_s=early.sync_floor_s / scale,
            sample_stale_s=early.sample_stale_s / scale,
        ),
    )


class Watcher:
    """Observer: when the fault began (the last step, or the first failure line), and the fake GPUs."""

    def __init__(self, fake: FakeNvml | None, spin_after_step: int | None) -> None:
        self.fake, self.spin_after_step = fake, spin_after_step
        self.launched = time.monotonic()
        self.last_step: float | None = None
        self.fatal_line: float | None = None
        self._fatal = [re.compile(p.regex) for p in COMMON_PATTERNS]

    def _spin(self) -> None:
        if self.fake is not None:
            for gpu in self.fake.gpus:
                gpu.power_mw = SPIN_MW

    def on_started(self, pid: int, pgid: int) -> None:
        if self.spin_after_step == 0:
            self._spin()

    def on_step(self, step: StepMetrics, estimate: SteadyEstimate | None) -> str | None:
        self.last_step = time.monotonic()
        if self.spin_after_step is not None and step.step >= self.spin_after_step:
            self._spin()
        return None

    def on_output(self, stream: str, line: str) -> None:
        if self.fatal_line is None and any(rx.search(line) for rx in self._fatal):
            self.fatal_line = time.monotonic()

    def fault_began(self) -> float:
        """Seconds after launch."""
        marks = [t for t in (self.last_step, self.fatal_line) if t is not None]
        return (max(marks) if marks else self.launched) - self.launched


@dataclass
class Outcome:
    fault: str
    early_calls: bool
    to_verdict_s: float
    after_fault_s: float
    record: RunRecord
    verdict: Verdict


def run_one(fault: Fault, scale: float, early_calls: bool, root: Path) -> Outcome:
    trial_dir = root / f"{fault.name}-{'early' if early_calls else 'plain'}"
    trial_dir.mkdir(parents=True)
    plan = LaunchPlan(
        argv=(sys.executable, str(FAULT), *fault.args(scale)),
        env={
            "AUTOTUNE_METRICS_FILE": str(trial_dir / "script_metrics.jsonl"),
            "AUTOTUNE_PHASES_FILE": str(trial_dir / "phases.jsonl"),
        },
        cwd=str(trial_dir),
        metrics_paths=(str(trial_dir / "script_metrics.jsonl"),),
    )
    fake: FakeNvml | None = None
    samplers: Callable[[int], Sequence[Any]] | None = None
    if fault.spin_after_step is not None:
        fake = fake_nvml(
            [
                FakeGpu(uuid=f"GPU-{i}", gpu_util_pct=100, power_mw=TRAINING_MW, power_limit_mw=LIMIT_MW)
                for i in (0, 1)
            ]
        )
        module = fake.module
        samplers = lambda pid: [  # noqa: E731 - the runner's sampler factory
            NvmlSampler([0, 1], nvml=module, interval_s=0.05, slow_interval_s=0.2, gpm=False)
        ]
    watcher = Watcher(fake, fault.spin_after_step)
    rec = run_trial(
        plan,
        fault.parser(trial_dir),
        trial_dir,
        global_batch=16,
        watchdog=watchdog(scale, early_calls=early_calls),
        early_stop=EarlyStopConfig(enabled=False),
        observer=watcher,
        samplers=samplers,
    )
    verdict = classify(rec)
    done = time.monotonic() - watcher.launched
    return Outcome(fault.name, early_calls, done, done - watcher.fault_began(), rec, verdict)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=10.0, help="divide every duration by this (1: as is)")
    ap.add_argument("--workers", type=int, default=10, help="trials run at once (they mostly sleep)")
    ap.add_argument("--faults", default=",".join(f.name for f in FAULTS), help="comma-separated subset")
    args = ap.parse_args()
    chosen = [f for f in FAULTS if f.name in set(args.faults.split(","))]
    if not chosen or args.scale <= 0:
        raise SystemExit(f"pick faults from {', '.join(f.name for f in FAULTS)} and a scale above 0")

    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=max(1, args.workers)) as pool:
        jobs = {
            (f.name, early): pool.submit(run_one, f, args.scale, early, Path(tmp))
            for f in chosen
            for early in (False, True)
        }
        got = {key: job.result() for key, job in jobs.items()}

    k = args.scale
    print(
        f"seconds to classification, plain watchdog vs early calls (scale 1/{k:g}; full scale = measured x {k:g})"
    )
    head = (
        f"{'fault':<19} {'plain s':>8} {'early s':>8} {'after fault: plain':>19} {'early':>7} "
        f"{'ratio':>6} {'full-scale plain/early s':>25}  {'signal (early)':<16} {'status':<10} {'verdict':<12} phase"
    )
    print(head)
    print("-" * len(head))
    for fault in chosen:
        plain, early = got[(fault.name, False)], got[(fault.name, True)]
        signal = early.record.hang_signal or early.record.stopped_by or "exit"
        if (plain.verdict.status, plain.verdict.reason, plain.verdict.evidence) == (
            early.verdict.status,
            early.verdict.reason,
            early.verdict.evidence,
        ):
            same = "same"
        elif plain.verdict.status is early.verdict.status:
            same = "same status"
        else:
            same = "DIFFERS"
        status = (
            early.verdict.status.value
            if same != "DIFFERS"
            else f"{plain.verdict.status.value}/{early.verdict.status.value}"
        )
        print(
            f"{fault.name:<19} {plain.to_verdict_s:>8.2f} {early.to_verdict_s:>8.2f} {plain.after_fault_s:>19.2f} "
            f"{early.after_fault_s:>7.2f} {plain.after_fault_s / max(early.after_fault_s, 1e-9):>5.1f}x "
            f"{plain.to_verdict_s * k:>12.0f} / {early.to_verdict_s * k:<10.0f}  {signal:<16} {status:<10} "
            f"{same:<12} {trial_failure_phase(early.record, early.verdict.status) or '-'}"
        )
    print(
        "\nratio: seconds from the fault to classification, plain / early. verdict: 'same' = the same status, "
        "reason and evidence;\n'same status' = a hang called by another rule, whose reason and evidence name it."
    )
    for fault in chosen:
        early = got[(fault.name, True)]
        print(f"  {fault.name}: {early.record.stop_reason or early.verdict.reason}")


if __name__ == "__main__":
    main()
