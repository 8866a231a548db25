"""The GPU rows' source and their non-terminal lines, without processes: a board keeps the newest
measured value of each column per GPU (a row that did not measure a column leaves it), a run that ended
leaves the board, and ``watching_gpus`` (profile) prints a line per run on a console that is no terminal."""

from __future__ import annotations

import io
import math
import threading
from collections.abc import Sequence

from rich.console import Console

from autotune.cli._gpus import GpuPanel, watching_gpus
from autotune.trial.live import LiveGpus

NAN = math.nan
COLUMNS = ("device", "gpu_util_pct", "mem_used_bytes", "mem_total_bytes", "power_w", "power_limit_w")


class ScriptedSampler:
    """Rows appended by the test, read like ``NvmlSampler.samples_since``."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []
        self.lock = threading.Lock()

    def add(self, **values: float) -> None:
        with self.lock:
            self.rows.append(values)

    def samples_since(self, cursor: int, columns: Sequence[str]) -> tuple[list[tuple[float, ...]], int]:
        assert tuple(columns) == COLUMNS
        with self.lock:
            new = self.rows[cursor:]
            return [tuple(r.get(c, NAN) for c in columns) for r in new], len(self.rows)


def test_the_board_keeps_the_newest_measured_values_and_forgets_ended_runs() -> None:
    board = LiveGpus()
    run = board.open("trial 2")
    sampler = ScriptedSampler()
    factory = run.samplers(lambda pid: [sampler, object()])  # a sampler without live rows is left out
    assert factory is not None and len(factory(123)) == 2
    assert board.now() == []  # nothing sampled yet
    sampler.add(device=0, gpu_util_pct=40, mem_used_bytes=2 * 2**30, mem_total_bytes=80 * 2**30)
    sampler.add(device=0, power_w=300)  # a driver sample: power only
    sampler.add(device=1, gpu_util_pct=10)
    (gpu0, gpu1) = board.now()
    assert (gpu0.device, gpu0.gpu_util_pct, gpu0.power_w, gpu0.power_limit_w) == (0, 40, 300, None)
    assert gpu0.mem_used_bytes == 2 * 2**30 and gpu0.phase == "starting" and gpu0.run == "trial 2"
    assert (gpu1.device, gpu1.gpu_util_pct, gpu1.mem_used_bytes) == (1, 10, None)
    sampler.add(device=0, gpu_util_pct=95, power_limit_w=700)
    run.stepped(4)
    gpu0 = board.now()[0]
    assert (gpu0.gpu_util_pct, gpu0.power_w, gpu0.power_limit_w, gpu0.phase) == (95, 300, 700, "step 4")
    run.close()
    assert board.now() == []


def test_the_phase_comes_from_the_runs_log_when_it_shows_one() -> None:
    class Opened:
        phase = "weight_sync"

    board = LiveGpus()
    shown: list[object | None] = [None]
    run = board.open("trial 1", lambda: shown[0])
    sampler = ScriptedSampler()
    factory = run.samplers(lambda pid: [sampler])
    assert factory is not None
    factory(1)
    sampler.add(device=0, gpu_util_pct=5)
    assert board.now()[0].phase == "starting"
    shown[0] = Opened()
    run.stepped(2)
    assert board.now()[0].phase == "weight_sync, step 2"
    lines = GpuPanel(Console(file=io.StringIO()), board).lines()
    assert lines == ["trial 1 (weight_sync, step 2): GPU 0 5 % — / — GiB — / — W"]


def test_profile_prints_a_line_per_run_without_a_terminal() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    sampler = ScriptedSampler()
    sampler.add(device=0, gpu_util_pct=70, mem_used_bytes=8 * 2**30, mem_total_bytes=24 * 2**30, power_w=150)
    sampler.add(device=0, power_limit_w=300)
    with watching_gpus(console, every_s=0.05) as board:
        run = board.open("profile")
        factory = run.samplers(lambda pid: [sampler])
        assert factory is not None
        factory(1)
        seen = threading.Event()
        for _ in range(200):
            if "profile (starting): GPU 0 70 % 8.0 / 24.0 GiB 150 / 300 W" in out.getvalue():
                seen.set()
                break
            threading.Event().wait(0.05)
        run.close()
    assert seen.is_set(), out.getvalue()
    assert "\x1b[" not in out.getvalue()
