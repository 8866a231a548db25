"""What the GPUs of the running trials show right now: the live view's rows, read from the samplers.

The executor (and ``profile``) opens one :class:`LiveRun` per run on a :class:`LiveGpus` board: it wraps
the run's sampler factory so that the samplers it starts are known to the board, and it is told the
run's steps. The view reads :meth:`LiveGpus.now` from its own thread: each call takes only the rows the
samplers kept since the previous call (``NvmlSampler.samples_since``, the rows of the timeline, nothing
sampled twice) and keeps the newest measured value of each column per GPU. Nothing here decides
anything about a trial.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["GpuNow", "LiveGpus", "LiveRun", "run_label"]

_COLUMNS = ("device", "gpu_util_pct", "mem_used_bytes", "mem_total_bytes", "power_w", "power_limit_w")


@runtime_checkable
class _LiveSamples(Protocol):
    def samples_since(self, cursor: int, columns: Sequence[str]) -> tuple[list[tuple[float, ...]], int]: ...


@dataclass(frozen=True)
class GpuNow:
    """One GPU of a running run as last sampled (None: not measured yet).

    Attributes:
        run: the run's label (``trial 3``, ``confirm-3-1``, ``profile``).
        phase: what the run is doing (``rollout``, ``train``, ``weight_sync`` from its log or markers;
            else ``starting`` before its first step and ``step N`` after).
        device: the GPU's NVML index.
    """

    run: str
    phase: str
    device: int
    gpu_util_pct: float | None
    mem_used_bytes: float | None
    mem_total_bytes: float | None
    power_w: float | None
    power_limit_w: float | None


def run_label(directory_name: str) -> str:
    """``trial 3`` for a trial's directory ``3``, the directory's name for any other run."""
    return f"trial {directory_name}" if directory_name.isdigit() else directory_name


@dataclass
class _Source:
    sampler: _LiveSamples
    cursor: int = 0


@dataclass
class LiveRun:
    """One running run on the board. Its methods may be called from the run's thread."""

    label: str
    phase_of: Callable[[], Any] | None = None
    step: int | None = None
    _sources: list[_Source] = field(default_factory=list)
    _latest: dict[int, dict[str, float]] = field(default_factory=dict)
    _board: LiveGpus | None = None

    def samplers(
        self, factory: Callable[[int], Sequence[Any]] | None
    ) -> Callable[[int], Sequence[Any]] | None:
        """``factory`` wrapped so that the samplers it makes are read by the board (None stays None)."""
        if factory is None:
            return None

        def watched(pid: int) -> Sequence[Any]:
            made = factory(pid)
            live = [_Source(s) for s in made if isinstance(s, _LiveSamples)]
            if self._board is not None:
                with self._board.lock:
                    self._sources.extend(live)
            return made

        return watched

    def stepped(self, step: int) -> None:
        """The run reported step ``step``."""
        self.step = step

    def close(self) -> None:
        """The run ended: its rows leave the board."""
        if self._board is not None:
            self._board.remove(self)

    def phase(self) -> str:
        """What the run is doing now (see :attr:`GpuNow.phase`)."""
        opened = None
        if self.phase_of is not None:
            try:
                opened = self.phase_of()
            except Exception:  # noqa: BLE001 - read from another thread: a torn read shows no phase
                opened = None
        name = getattr(opened, "phase", None)
        if isinstance(name, str) and name:
            return name if self.step is None else f"{name}, step {self.step}"
        return "starting" if self.step is None else f"step {self.step}"

    def _read(self) -> None:
        for source in self._sources:
            rows, source.cursor = source.sampler.samples_since(source.cursor, _COLUMNS)
            for row in rows:
                latest = self._latest.setdefault(int(row[0]), {})
                for name, value in zip(_COLUMNS[1:], row[1:], strict=True):
                    if not math.isnan(value):
                        latest[name] = value

    def _rows(self) -> list[GpuNow]:
        phase = self.phase()
        return [
            GpuNow(
                run=self.label,
                phase=phase,
                device=device,
                gpu_util_pct=values.get("gpu_util_pct"),
                mem_used_bytes=values.get("mem_used_bytes"),
                mem_total_bytes=values.get("mem_total_bytes"),
                power_w=values.get("power_w"),
                power_limit_w=values.get("power_limit_w"),
            )
            for device, values in sorted(self._latest.items())
        ]


class LiveGpus:
    """The running runs' GPUs, for a live view (see the module docstring). Thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._runs: list[LiveRun] = []

    def open(self, label: str, phase_of: Callable[[], Any] | None = None) -> LiveRun:
        """Put a run on the board; ``phase_of`` returns its open phase (``StepParser.open_phase``)."""
        run = LiveRun(label=label, phase_of=phase_of, _board=self)
        with self.lock:
            self._runs.append(run)
        return run

    def remove(self, run: LiveRun) -> None:
        with self.lock:
            self._runs = [r for r in self._runs if r is not run]

    def now(self) -> list[GpuNow]:
        """One row per GPU of each running run, in the order the runs started."""
        out: list[GpuNow] = []
        with self.lock:
            for run in self._runs:
                run._read()
                out.extend(run._rows())
        return out
