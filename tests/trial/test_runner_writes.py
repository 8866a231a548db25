"""A write that fails during a trial (its logs, metrics.jsonl, proc.json, the timeline) ends the trial at
once, cleanly, and says which file and why; the pipes are drained meanwhile so the trial never blocks.

The failing writer is real: ``/dev/full`` answers every write with ENOSPC, as a full disk does."""

from __future__ import annotations

import errno
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest

from autotune.backends.command import CommandParser
from autotune.errors import WriteError
from autotune.records import LaunchPlan
from autotune.tail import OutputQueue, pump_pipe
from autotune.trial import runner as runner_mod
from autotune.trial.runner import EarlyStopConfig, WatchdogConfig, run_trial

FAULT = Path(__file__).parents[1] / "fixtures" / "faults" / "fault.py"
FAST = WatchdogConfig(startup_timeout_s=20, hang_k=3, hang_floor_s=30, grace_s=0.5, poll_interval_s=0.05)


def full_disk_for(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """``create_file`` hands out /dev/full for the trial file called ``name`` (every write: ENOSPC)."""
    real = runner_mod.create_file

    def create(path: Path, **kw: Any) -> Any:
        if path.name == name:
            real(path, **kw).close()  # the file exists, as on a disk that filled up later
            return open("/dev/full", "wb", buffering=0)  # noqa: SIM115
        return real(path, **kw)

    monkeypatch.setattr(runner_mod, "create_file", create)


def run(trial_dir: Path, *args: str, samplers: Any = None) -> None:
    trial_dir.mkdir(parents=True, exist_ok=True)
    plan = LaunchPlan(argv=(sys.executable, str(FAULT), *args), env={}, cwd=str(trial_dir))
    run_trial(
        plan,
        CommandParser(None),
        trial_dir,
        global_batch=16,
        watchdog=FAST,
        early_stop=EarlyStopConfig(enabled=False),
        samplers=samplers,
    )


def assert_group_gone(trial_dir: Path) -> None:
    info = json.loads((trial_dir / "proc.json").read_text())
    assert info["ended"] is True, info  # the trial was reaped and recorded as ended
    left = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == info["pgid"] and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    assert left == []


def test_the_pump_keeps_draining_after_its_log_fails() -> None:
    read_fd, write_fd = os.pipe()
    segments = OutputQueue(bound_bytes=1 << 30)  # room for every line: the test counts them
    failures: list[OSError] = []
    total = 8 << 20  # far more than a pipe holds: a pump that stopped reading would block the writer

    def writer() -> None:
        with os.fdopen(write_fd, "wb") as fh:
            for _ in range(total // 1024):
                fh.write(b"y" * 1023 + b"\n")

    t = threading.Thread(target=writer)
    t.start()
    with open("/dev/full", "wb", buffering=0) as log:
        pump_pipe(read_fd, "stdout", log, segments, failures.append)
    t.join(timeout=60)
    os.close(read_fd)
    assert not t.is_alive(), "the writer blocked: the pipe was not drained"
    assert len(failures) == 1 and failures[0].errno == errno.ENOSPC
    lines = 0
    while True:
        item = segments.get_nowait()
        if item[1] is None:
            break
        lines += 1
    assert lines == total // 1024  # every line still reached the watch


def test_a_full_disk_under_the_log_ends_a_flooding_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full_disk_for(monkeypatch, "stdout.log")
    trial = tmp_path / "t"
    with pytest.raises(WriteError, match=r"cannot write .*/t/stdout.log: No space left on device \(ENOSPC\)"):
        run(trial, "--mode", "flood", "--fail-at", "2", "--step-s", "0.01")
    assert_group_gone(trial)


def test_a_full_disk_under_metrics_jsonl_ends_a_trial_that_would_run_forever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full_disk_for(monkeypatch, "metrics.jsonl")
    trial = tmp_path / "t"
    with pytest.raises(WriteError, match=r"metrics.jsonl: No space left on device"):
        run(trial, "--mode", "forever", "--step-s", "0.01")
    assert_group_gone(trial)


class _Rows:
    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def rows(self) -> list[dict[str, Any]]:
        return [{"t_mono_s": 1.0, "t_wall_s": 1.0, "source": "host", "host_cpu_pct": 5.0}]


def test_a_timeline_that_cannot_be_written_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pandas as pd

    def refuse(self: Any, *args: Any, **kw: Any) -> None:
        target = args[0]
        target.write(b"PAR1 half a parquet file")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", refuse)
    trial = tmp_path / "t"
    with pytest.raises(WriteError, match=r"timeline.parquet: No space left on device"):
        run(trial, "--mode", "ok", "--steps", "3", samplers=lambda pid: [_Rows()])
    assert_group_gone(trial)
    assert not [p.name for p in trial.iterdir() if "timeline" in p.name]
