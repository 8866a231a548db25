"""Hygiene between trials: the next trial starts only when this study's processes have left the
GPUs and memory is back near where it was when the study started; the shared memory a killed run's vLLM
CPU engine left behind is removed (:func:`remove_stale_segments`).

Processes this study did not start are never touched: they are only named in the message.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

from autotune.errors import StudyError
from autotune.studydir import StudyDir, TrialDir

__all__ = ["GpuHygiene", "remove_stale_segments"]

#: where POSIX shared memory lives on Linux
SHM_DIR = Path("/dev/shm")


def remove_stale_segments(shm_dir: Path = SHM_DIR, alive: Callable[[int], bool] | None = None) -> list[str]:
    """Remove the shared-memory segments a finished run's vLLM CPU engine left behind (a run ended by
    SIGKILL never unlinks them: 8 MiB per tensor-parallel run); return their names.

    A segment is a run's by its name (:data:`autotune.backends.VLLM_CPU_SEGMENT`: ``MASTER_PORT`` and the
    launcher's pid) and stale once that launcher has exited. Only this user's files are touched.
    """
    import re

    from autotune.backends import VLLM_CPU_SEGMENT

    if alive is None:
        import psutil

        alive = psutil.pid_exists
    pattern = re.compile(VLLM_CPU_SEGMENT)
    removed: list[str] = []
    try:
        entries = list(os.scandir(shm_dir))
    except OSError:  # no /dev/shm (macOS), or unreadable: nothing to tidy
        return removed
    for entry in entries:
        match = pattern.match(entry.name)
        if match is None or alive(int(match["launcher"])):
            continue
        try:
            if (
                entry.is_file(follow_symlinks=False)
                and entry.stat(follow_symlinks=False).st_uid == os.getuid()
            ):
                os.unlink(entry.path)
                removed.append(entry.name)
        except OSError:  # gone meanwhile, or not ours to remove
            continue
    return removed


GIB = 1024**3


class GpuHygiene:
    """Waits until the selected GPUs are free of this study's processes.

    Args:
        indices: selected GPU indices.
        study_dir: the study directory (its trials' ``proc.json`` files name the process groups we started).
        timeout_s: how long to wait before giving up with a StudyError.
        tolerance_bytes: used memory above the study-start baseline still counted as "free".
        nvml: the pynvml module (tests pass an autospec fake).
        sleep: the sleep function (tests pass a fake).
    """

    def __init__(
        self,
        indices: Sequence[int],
        study_dir: Path,
        *,
        timeout_s: float = 120.0,
        tolerance_bytes: int = GIB,
        nvml: ModuleType | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from autotune.probes.nvml import memory_used

        self.indices = list(indices)
        self.study_dir = study_dir
        self.timeout_s = timeout_s
        self.tolerance_bytes = tolerance_bytes
        self.nvml = nvml
        self.sleep = sleep
        self.clock = clock
        self.baseline_bytes = memory_used(self.indices, nvml=nvml)

    def _our_pgids(self) -> set[int]:
        pgids: set[int] = set()
        trials = StudyDir(self.study_dir).trials_dir
        if trials.exists():
            for proc in trials.glob(f"*/{TrialDir.PROC}"):
                try:
                    data = json.loads(proc.read_text(encoding="utf-8"))
                except (OSError, json.JSONDecodeError):
                    continue
                if isinstance(data.get("pgid"), int):
                    pgids.add(data["pgid"])
        return pgids

    def _ours(self, pid: int, pgids: set[int]) -> bool:
        try:
            return os.getpgid(pid) in pgids
        except (ProcessLookupError, PermissionError):
            return False

    def check(self) -> tuple[list[int], dict[int, int]]:
        """(our pids still on the GPUs, excess bytes per GPU above the baseline + tolerance)."""
        from autotune.probes.nvml import gpu_processes, memory_used

        pgids = self._our_pgids()
        procs = gpu_processes(self.indices, nvml=self.nvml)
        ours = sorted({pid for plist in procs.values() for pid, _ in plist if self._ours(pid, pgids)})
        used = memory_used(self.indices, nvml=self.nvml)
        excess = {
            i: used[i] - self.baseline_bytes.get(i, 0)
            for i in used
            if used[i] - self.baseline_bytes.get(i, 0) > self.tolerance_bytes
        }
        return ours, excess

    def wait_until_free(self) -> None:
        """Block until free; raise StudyError naming the pids after ``timeout_s``."""
        deadline = self.clock() + self.timeout_s
        while True:
            ours, excess = self.check()
            if not ours and not excess:
                return
            if self.clock() >= deadline:
                if ours:
                    raise StudyError(
                        f"processes started by this study still hold the GPUs after {self.timeout_s:.0f}s: pids {', '.join(map(str, ours))}",
                        hint="End them (kill <pid>) and run the same command again to resume",
                    )
                where = ", ".join(f"GPU {i}: {b / GIB:.1f} GiB" for i, b in excess.items())
                raise StudyError(
                    f"GPU memory did not return to its level at study start ({where} above it)",
                    hint="Check nvidia-smi for other jobs on these GPUs, then run the same command again to resume",
                )
            self.sleep(1.0)
