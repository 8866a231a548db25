"""Issue 41, defect 9: what a trial prints is read by one bounded reader (:mod:`autotune.tail`) that keeps
up with the writer, and the tuner's own bound never decides a trial's status.

Real child processes print real text: ``\\r`` progress bars by the hundred megabytes, a line of hundreds
of megabytes without a newline, a valid 50 MB step record among ordinary ones, and step records that are
all longer than the line bound. The tuner's memory is sampled while each runs.
"""

from __future__ import annotations

import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from autotune.backends.command import CommandParser
from autotune.records import LaunchPlan, TrialStatus
from autotune.tail import LINE_BYTES
from autotune.trial.outcome import classify
from autotune.trial.runner import EarlyStopConfig, RunRecord, WatchdogConfig, run_trial

NO_EARLY = EarlyStopConfig(enabled=False)
MiB = 1 << 20


@contextmanager
def peak_growth_bytes() -> Iterator[list[int]]:
    """The tuner's resident memory growth at its peak while the block runs (sampled every 20 ms)."""
    me = psutil.Process()
    base = me.memory_info().rss
    box = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            box[0] = max(box[0], me.memory_info().rss - base)
            done.wait(0.02)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield box
    finally:
        done.set()
        thread.join()


def run_script(tmp_path: Path, body: str, watchdog: WatchdogConfig) -> tuple[RunRecord, float]:
    script = tmp_path / "trial.py"
    script.write_text(textwrap.dedent(body))
    plan = LaunchPlan(argv=(sys.executable, str(script)), cwd=str(tmp_path))
    began = time.monotonic()
    rec = run_trial(
        plan, CommandParser(None), tmp_path / "t", global_batch=4, watchdog=watchdog, early_stop=NO_EARLY
    )
    return rec, time.monotonic() - began


STEPS = """
for i in range(1, 6):
    print(json.dumps({"step": i, "samples": 4}), flush=True)
    time.sleep(0.05)
"""


def test_a_flood_of_progress_bars_is_drained_at_its_speed_in_bounded_memory(tmp_path: Path) -> None:
    """128 MiB of ``\\r`` bars without a newline (tqdm at full speed), then 5 steps. Before: every bar was
    a queued segment (797 MB of tuner memory for 200 MB) drained at 4 MiB/s, so the trial ran out its
    wall budget."""
    watchdog = WatchdogConfig(
        trial_timeout_s=60, startup_timeout_s=60, hang_floor_s=30, grace_s=0.5, poll_interval_s=0.05
    )
    body = """
        import json, sys, time
        bar = b"  7%|#         | 7/100 [00:01<00:13,  6.9it/s]\\r"
        block = bar * (1024 * 1024 // len(bar))
        for _ in range(128):
            sys.stdout.buffer.write(block)
        sys.stdout.buffer.flush()
        """ + textwrap.indent(STEPS, "        ")
    with peak_growth_bytes() as growth:
        rec, took_s = run_script(tmp_path, body, watchdog)
    verdict = classify(rec)
    assert verdict.status is TrialStatus.COMPLETE, verdict.reason
    assert [s.step for s in rec.steps] == [1, 2, 3, 4, 5]
    assert (tmp_path / "t" / "stdout.log").stat().st_size > 128 * MiB - MiB  # the log keeps every byte
    assert rec.stdout_tail[0].startswith("  7%|#")  # the bar's state was read
    assert growth[0] < 100 * MiB, f"the tuner grew {growth[0] / MiB:.0f} MiB"
    assert took_s < 45, f"{took_s:.0f} s"


def test_a_line_of_hundreds_of_megabytes_is_skipped_at_pipe_speed(tmp_path: Path) -> None:
    """512 MiB without a newline, then 5 steps: skipped as it comes, not cut into 1 MiB lines that the
    watch then searched one by one (4-5 MB/s: the trial ended as TIMEOUT)."""
    watchdog = WatchdogConfig(
        trial_timeout_s=60, startup_timeout_s=60, hang_floor_s=30, grace_s=0.5, poll_interval_s=0.05
    )
    body = """
        import json, sys, time
        block = b"x" * (1024 * 1024)
        for _ in range(512):
            sys.stdout.buffer.write(block)
        sys.stdout.buffer.write(b"\\n")
        sys.stdout.buffer.flush()
        """ + textwrap.indent(STEPS, "        ")
    with peak_growth_bytes() as growth:
        rec, took_s = run_script(tmp_path, body, watchdog)
    verdict = classify(rec)
    assert verdict.status is TrialStatus.COMPLETE, verdict.reason
    assert [s.step for s in rec.steps] == [1, 2, 3, 4, 5]
    assert any(n.startswith("1 stdout line(s) longer than 1 MiB (512 MiB) were not read") for n in rec.notes)
    assert growth[0] < 100 * MiB, f"the tuner grew {growth[0] / MiB:.0f} MiB"
    assert took_s < 45, f"{took_s:.0f} s"


def test_a_valid_50_MB_step_line_is_skipped_with_a_note_and_the_trial_judged_on_its_other_steps(
    tmp_path: Path,
) -> None:
    """A step record of 50 MB is over the line bound: it is not read (a note says so), and the steps
    after it arrive at once. Before: its 1 MiB pieces held the watch long enough to call a HANG."""
    watchdog = WatchdogConfig(
        startup_timeout_s=20, hang_k=3, hang_floor_s=3.0, grace_s=0.5, poll_interval_s=0.05
    )
    body = """
        import json, sys, time
        def step(i, **extra):
            sys.stdout.write(json.dumps({"step": i, "samples": 4, **extra}) + "\\n"); sys.stdout.flush()
        for i in (1, 2, 3):
            step(i); time.sleep(0.1)
        step(4, completions="y" * (50 * 1000 * 1000))
        for i in (5, 6, 7, 8):
            time.sleep(0.1); step(i)
        """
    with peak_growth_bytes() as growth:
        rec, _ = run_script(tmp_path, body, watchdog)
    verdict = classify(rec)
    assert verdict.status is TrialStatus.COMPLETE, verdict.reason
    assert [s.step for s in rec.steps] == [1, 2, 3, 5, 6, 7, 8]
    (note,) = [n for n in rec.notes if "were not read" in n]
    assert note.startswith("1 stdout line(s) longer than 1 MiB (48 MiB) were not read (a step record among")
    assert growth[0] < 100 * MiB, f"the tuner grew {growth[0] / MiB:.0f} MiB"


def test_step_lines_all_over_the_bound_are_never_called_a_hang(tmp_path: Path) -> None:
    """Every step record is longer than the line bound and they come slower than the start-up budget
    allows for a first step: the watch cannot see a step, but it has no evidence of a hang either (the
    bound is autotune's), so the trial runs to its end and is judged by it, with the note."""
    watchdog = WatchdogConfig(
        startup_timeout_s=1.0, hang_k=3, hang_floor_s=0.6, grace_s=0.5, poll_interval_s=0.05
    )
    body = f"""
        import json, sys, time
        for i in range(1, 9):
            sys.stdout.write(json.dumps({{"step": i, "pad": "z" * {2 * LINE_BYTES}}}) + "\\n"); sys.stdout.flush()
            time.sleep(0.3)
        """
    rec, _ = run_script(tmp_path, body, watchdog)
    verdict = classify(rec)
    assert rec.stopped_by is None and rec.exit_code == 0
    assert verdict.status is not TrialStatus.HANG
    assert verdict.status is TrialStatus.CRASH and verdict.reason.startswith("exited without a step")
    assert any(n.startswith("8 stdout line(s) longer than 1 MiB") for n in rec.notes)


def test_a_trial_printing_nothing_readable_still_hangs_once_its_long_lines_stop(tmp_path: Path) -> None:
    """The long lines only hold the no-step clock while they come: after the last one, a trial that
    makes no step is a hang as before."""
    watchdog = WatchdogConfig(
        startup_timeout_s=1.0, hang_k=3, hang_floor_s=0.6, grace_s=0.5, poll_interval_s=0.05
    )
    body = f"""
        import sys, time
        sys.stdout.write("q" * {2 * LINE_BYTES} + "\\n"); sys.stdout.flush()
        time.sleep(60)
        """
    rec, took_s = run_script(tmp_path, body, watchdog)
    assert classify(rec).status is TrialStatus.HANG and rec.stopped_by == "startup_timeout"
    assert took_s < 30
