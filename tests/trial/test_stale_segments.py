"""Shared memory a killed run's vLLM CPU engine left in /dev/shm is removed once its launcher has exited;
segments of a running launcher, and every other file, stay."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from autotune.backends.vllm_cpu_sync import run_name
from autotune.trial.hygiene import remove_stale_segments


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_only_the_segments_of_runs_whose_launcher_exited_are_removed(tmp_path: Path) -> None:
    import os

    dead, live = _dead_pid(), os.getpid()
    stale = [f"{run_name('29500', dead)}-tp:0-[0-1]-cpushm_{i}" for i in (0, 1)]
    running = f"{run_name('29501', live)}-tp:0-[0-1]-cpushm_0"
    others = [
        "torch_1234_0",
        "autotune-bench-x",
        f"{run_name('1', dead)}-not-a-segment",
        "-tp:0-[0-1]-cpushm_0",
    ]
    for name in (*stale, running, *others):
        (tmp_path / name).write_bytes(b"\0" * 16)
    removed = remove_stale_segments(tmp_path)
    assert sorted(removed) == sorted(stale)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([running, *others])


def test_a_link_is_never_followed_nor_a_folder_removed(tmp_path: Path) -> None:
    dead = _dead_pid()
    target = tmp_path / "mine.txt"
    target.write_text("keep")
    link = tmp_path / f"{run_name('1', dead)}-tp:0-[0-1]-cpushm_0"
    link.symlink_to(target)
    folder = tmp_path / f"{run_name('2', dead)}-tp:0-[0-1]-cpushm_0"
    folder.mkdir()
    assert remove_stale_segments(tmp_path) == []
    assert target.read_text() == "keep" and link.is_symlink() and folder.is_dir()


def test_no_shared_memory_folder_is_nothing_to_do(tmp_path: Path) -> None:
    assert remove_stale_segments(tmp_path / "absent") == []
