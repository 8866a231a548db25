"""The tuner's own cost per trial: the runner against the same no-op trial started bare.

    python bench/runner_overhead.py [--trials 10] [--poll-interval 0.1]

A no-op trial (the fault fixture printing one step and exiting) is started N times bare
(``subprocess.Popen``, read stdout, wait) and N times through :func:`autotune.trial.runner.run_trial`. Printed:

- launch → first output: the runner's time against the bare start (Python start-up is in both);
- end → next launch: from the trial's exit being noticed to run_trial returning (reaping, the group
  check, closing files) plus the next run_trial's work before it launches (launch.json, command.sh);
- wall per trial: run_trial's whole call against the bare run; the difference is the tuner's cost.

Target: at most 1 s per trial. Times are measured, never asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autotune.backends.command import CommandParser
from autotune.records import LaunchPlan
from autotune.trial.runner import EarlyStopConfig, WatchdogConfig, run_trial

FAULT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "faults" / "fault.py"
ARGS = ("--mode", "ok", "--steps", "1", "--step-s", "0")


def bare(n: int) -> tuple[list[float], list[float]]:
    """(launch → first output line, launch → reaped) of n bare runs."""
    first, total = [], []
    for _ in range(n):
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, str(FAULT), *ARGS],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert proc.stdout is not None
        proc.stdout.readline()
        first.append(time.monotonic() - t0)
        proc.stdout.read()
        proc.wait()
        total.append(time.monotonic() - t0)
    return first, total


def through_runner(n: int, poll_interval_s: float, root: Path) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"first": [], "total": [], "cleanup": [], "prelaunch": [], "exit_seen": []}
    watchdog = WatchdogConfig(poll_interval_s=poll_interval_s, grace_s=1.0)
    early = EarlyStopConfig(enabled=False)
    for i in range(n):
        trial_dir = root / str(i)
        plan = LaunchPlan(argv=(sys.executable, str(FAULT), *ARGS), cwd=str(root))
        call_wall = time.time()
        t0 = time.monotonic()
        rec = run_trial(
            plan, CommandParser(None), trial_dir, global_batch=16, watchdog=watchdog, early_stop=early
        )
        total = time.monotonic() - t0
        if rec.exit_code != 0 or len(rec.steps) != 1:
            raise SystemExit(f"the no-op trial failed: exit {rec.exit_code}, {len(rec.steps)} steps")
        prelaunch = rec.started_wall_s - call_wall
        out["first"].append(rec.first_output_s or 0.0)
        out["total"].append(total)
        out["cleanup"].append(rec.cleanup_s)
        out["prelaunch"].append(prelaunch)
        out["exit_seen"].append(rec.duration_s)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--poll-interval", type=float, default=0.1)
    args = ap.parse_args()

    bare(2)  # warm the page cache so both sides start alike
    b_first, b_total = bare(args.trials)
    with tempfile.TemporaryDirectory() as tmp:
        r = through_runner(args.trials, args.poll_interval, Path(tmp))

    med = statistics.median
    first_over = med(r["first"]) - med(b_first)
    end_to_next = med(r["cleanup"]) + med(r["prelaunch"])
    wall_over = med(r["total"]) - med(b_total)
    print(f"no-op trial x {args.trials}, poll interval {args.poll_interval:g} s (medians)")
    print(
        f"  launch -> first output : runner {med(r['first']):.3f} s, bare {med(b_first):.3f} s, overhead {first_over:+.3f} s"
    )
    print(
        f"  end -> next launch     : {end_to_next:.3f} s "
        f"(cleanup after exit {med(r['cleanup']):.3f} s + set-up before launch {med(r['prelaunch']):.3f} s)"
    )
    print(
        f"  wall per trial         : runner {med(r['total']):.3f} s, bare {med(b_total):.3f} s, overhead {wall_over:+.3f} s"
    )
    print(f"  max overhead per trial : {max(t - med(b_total) for t in r['total']):+.3f} s  (target <= 1 s)")
    print(f"  ratio runner / bare    : {med(r['total']) / med(b_total):.2f}x")


if __name__ == "__main__":
    main()
