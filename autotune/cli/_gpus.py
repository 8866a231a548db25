"""The running runs' GPUs in the live view: rows under the trials on a terminal, lines elsewhere.

On a terminal :meth:`GpuPanel.table` is drawn by the rich ``Live`` of the view (redrawn in place at
its refresh rate); without one (CI logs, ``| tee``) :meth:`GpuPanel.start` prints one line per running
run every ``every_s`` seconds, each GPU of the run in it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from autotune.trial.live import GpuNow, LiveGpus

__all__ = ["GpuPanel", "gpu_cells", "watching_gpus"]

_GIB = 2**30


def _num(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def gpu_cells(row: GpuNow) -> tuple[str, str, str]:
    """(utilisation, memory used / total, power / limit) of one GPU as the table shows them."""
    util = "—" if row.gpu_util_pct is None else f"{row.gpu_util_pct:.0f} %"
    used = None if row.mem_used_bytes is None else row.mem_used_bytes / _GIB
    total = None if row.mem_total_bytes is None else row.mem_total_bytes / _GIB
    mem = f"{_num(used, '.1f')} / {_num(total, '.1f')} GiB"
    power = f"{_num(row.power_w, '.0f')} / {_num(row.power_limit_w, '.0f')} W"
    return util, mem, power


class GpuPanel:
    """The GPU rows of a live view, read from a :class:`~autotune.trial.live.LiveGpus` board.

    Args:
        console: where the lines go (the table is drawn by the caller's ``Live``).
        board: the running runs' GPUs.
        every_s: seconds between two summaries when the console is not a terminal.
    """

    def __init__(self, console: Console, board: LiveGpus, every_s: float = 30.0) -> None:
        self.console = console
        self.board = board
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def table(self) -> Table | None:
        """One row per GPU of each running run; None while no run has a sampled GPU."""
        rows = self.board.now()
        if not rows:
            return None
        table = Table("run", "GPU", "util", "memory", "power", "phase", expand=False, title_justify="left")
        for row in rows:
            table.add_row(row.run, str(row.device), *gpu_cells(row), row.phase)
        return table

    def lines(self) -> list[str]:
        """One line per running run: its phase and each GPU's utilisation, memory and power."""
        by_run: dict[str, list[GpuNow]] = {}
        for row in self.board.now():
            by_run.setdefault(row.run, []).append(row)
        out = []
        for run, rows in by_run.items():
            gpus = "; ".join(f"GPU {r.device} " + " ".join(gpu_cells(r)) for r in rows)
            out.append(f"{run} ({rows[0].phase}): {gpus}")
        return out

    def start(self) -> None:
        """Print :meth:`lines` every ``every_s`` seconds until :meth:`stop` (not on a terminal)."""
        if self.console.is_terminal or self._thread is not None or self.every_s <= 0:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="autotune-gpu-lines", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the summaries (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            for line in self.lines():
                self.console.print(line, markup=False, highlight=False)


@contextlib.contextmanager
def watching_gpus(console: Console, every_s: float = 30.0) -> Iterator[LiveGpus]:
    """A board whose runs' GPUs are shown while the block runs (``autotune profile``): a table redrawn
    in place on a terminal, a line per run every ``every_s`` seconds elsewhere."""
    panel = GpuPanel(console, LiveGpus(), every_s=every_s)
    if not console.is_terminal:
        panel.start()
        try:
            yield panel.board
        finally:
            panel.stop()
        return
    waiting = Text("waiting for the command's GPUs…", style="dim")
    with Live(console=console, refresh_per_second=4, get_renderable=lambda: panel.table() or waiting):
        yield panel.board
