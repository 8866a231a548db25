"""The calibration table of one GPU type: real trials (``autotune doctor --calibrate``) against the
estimator's predictions, kept per machine for the studies that run there.

Each point is one short trial: the raw memory estimate and the measured NVML peak (or an OOM), the
predicted and the measured step time. The table's memory correction is :class:`Calibration`'s, learned
from those points; a study on the same GPU type and the same model starts from it
(:func:`seed_calibration`, read by the study's memory gate) instead of from no evidence, and keeps
learning from its own trials. The step-time ratio is reported (the timing model orders candidates; a
constant factor would not change the order).
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from autotune.estimate.calibrate import Calibration
from autotune.estimate.memory import MemoryEstimate
from autotune.jsontypes import JsonObject
from autotune.records import TrialStatus

__all__ = [
    "CalibrationPoint",
    "CalibrationTable",
    "build_table",
    "store_table",
    "cached_table",
    "seed_calibration",
    "table_path",
]

TABLE_VERSION = 1
OOM = TrialStatus.OOM.value


@dataclass(frozen=True)
class CalibrationPoint:
    """One calibration trial.

    Attributes:
        trial: its number in the calibration study.
        label: its configuration, short (``bs=16 ckpt=False``).
        status: the trial's status as classified (``TrialStatus`` value: ``COMPLETE``, ``OOM``, ...).
        expected_oom: it was sized to run out of memory on purpose.
        estimate: the raw memory estimate (``MemoryEstimate.to_dict()``, no calibration applied).
        measured_peak_bytes: NVML peak of the most loaded GPU (None: OOM or not measured).
        predicted_step_s: the estimator's seconds per step.
        measured_step_s: the steady step time measured (None: it did not reach steady state).
    """

    trial: int
    label: str
    status: str
    expected_oom: bool
    estimate: dict[str, Any] | None
    measured_peak_bytes: int | None
    predicted_step_s: float | None
    measured_step_s: float | None

    @property
    def predicted_peak_bytes(self) -> int | None:
        return int(self.estimate["peak_bytes"]) if self.estimate else None

    @property
    def memory_ratio(self) -> float | None:
        """Measured over predicted peak."""
        pred = self.predicted_peak_bytes
        if not pred or self.measured_peak_bytes is None:
            return None
        return self.measured_peak_bytes / pred

    @property
    def step_ratio(self) -> float | None:
        """Measured over predicted step time."""
        if not self.predicted_step_s or self.measured_step_s is None:
            return None
        return self.measured_step_s / self.predicted_step_s


@dataclass(frozen=True)
class CalibrationTable:
    """Every point of one calibration run and what they teach.

    Attributes:
        device: the GPU's name (as NVML reports it).
        model: the model the trials trained.
        model_params: its parameter count (a study of the same model is seeded from this table).
        measured_at: when (ISO 8601, UTC).
        points: the trials.
        memory: the memory correction learned from them (``Calibration.to_dict()``).
        step_time_ratio: median measured ÷ predicted step time (None: no steady trial).
        oom_classified: whether the deliberately too large trials were classified OOM (None: none ran).
    """

    device: str
    model: str
    model_params: int
    measured_at: str
    points: tuple[CalibrationPoint, ...]
    memory: dict[str, Any]
    step_time_ratio: float | None
    oom_classified: bool | None

    def calibration(self) -> Calibration:
        return Calibration.from_dict(self.memory)

    def to_dict(self) -> JsonObject:
        return {
            "version": TABLE_VERSION,
            **{k: v for k, v in asdict(self).items() if k != "points"},
            "points": [asdict(p) for p in self.points],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CalibrationTable:
        return cls(
            device=str(data["device"]),
            model=str(data["model"]),
            model_params=int(data["model_params"]),
            measured_at=str(data["measured_at"]),
            points=tuple(CalibrationPoint(**p) for p in data.get("points", [])),
            memory=dict(data.get("memory") or {}),
            step_time_ratio=data.get("step_time_ratio"),
            oom_classified=data.get("oom_classified"),
        )

    def to_markdown(self) -> str:
        """The table as Markdown (for ``docs/`` and the doctor's output)."""
        gib = 1024**3

        def num(v: float | None, fmt: str) -> str:
            return "—" if v is None else format(v, fmt)

        rows = [
            f"# Calibration: {self.model} on {self.device} ({self.measured_at})",
            "",
            "| trial | configuration | status | predicted peak GiB | measured peak GiB | ratio "
            "| predicted step s | measured step s | ratio |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for p in self.points:
            pred = p.predicted_peak_bytes
            rows.append(
                f"| {p.trial} | {p.label}{' (sized to OOM)' if p.expected_oom else ''} | {p.status} "
                f"| {num(pred / gib if pred else None, '.2f')} "
                f"| {num(p.measured_peak_bytes / gib if p.measured_peak_bytes else None, '.2f')} "
                f"| {num(p.memory_ratio, '.2f')} | {num(p.predicted_step_s, '.3f')} "
                f"| {num(p.measured_step_s, '.3f')} | {num(p.step_ratio, '.2f')} |"
            )
        rows += [
            "",
            f"Memory factor learned: {self.calibration().factor:.3f}. "
            f"Step time measured ÷ predicted (median): {num(self.step_time_ratio, '.2f')}. "
            f"Deliberate OOM classified as OOM: {self.oom_classified}.",
        ]
        return "\n".join(rows) + "\n"


def build_table(
    device: str, model: str, model_params: int, points: list[CalibrationPoint], measured_at: str
) -> CalibrationTable:
    """The table of these points: their memory correction, step-time ratio and OOM verdict."""
    cal = Calibration()
    for p in points:
        # a trial sized to run out of memory on purpose is not evidence of the estimate's error; any
        # other that ran out of memory or left a measured peak is (one stopped as slower included)
        oom = p.status == OOM
        if p.estimate is None or p.expected_oom or (not oom and p.measured_peak_bytes is None):
            continue
        cal.observe(
            MemoryEstimate.from_dict(p.estimate),
            None if oom else p.measured_peak_bytes,
            oom,
            trial=p.trial,
        )
    ratios = [r for p in points if not p.expected_oom and (r := p.step_ratio) is not None]
    ooms = [p.status == OOM for p in points if p.expected_oom]
    return CalibrationTable(
        device=device,
        model=model,
        model_params=model_params,
        measured_at=measured_at,
        points=tuple(points),
        memory=cal.to_dict(),
        step_time_ratio=statistics.median(ratios) if ratios else None,
        oom_classified=all(ooms) if ooms else None,
    )


def _slug(device: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", device).strip("-").lower() or "gpu"


def _cache(cache_dir: Path | None) -> Path:
    from autotune.cachedir import default_cache_dir

    return (cache_dir if cache_dir is not None else default_cache_dir()) / "calibration"


def table_path(device: str, cache_dir: Path | None = None) -> Path:
    """Where the table of ``device`` is kept."""
    return _cache(cache_dir) / f"{_slug(device)}.json"


def store_table(table: CalibrationTable, cache_dir: Path | None = None) -> Path:
    """Write the table (atomically) under the cache directory; returns its path."""
    from autotune.studydir import write_json_atomic

    path = table_path(table.device, cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, table.to_dict())
    return path


def cached_table(device: str, cache_dir: Path | None = None) -> CalibrationTable | None:
    """The stored table of ``device``; None when there is none or it cannot be read (a damaged file is
    ignored, never fatal: the estimator then starts from no evidence as before)."""
    path = table_path(device, cache_dir)
    try:
        return CalibrationTable.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def seed_calibration(device: str, model_params: int, cache_dir: Path | None = None) -> Calibration | None:
    """The memory correction a study of a ``model_params`` model on ``device`` starts from: the stored
    table's, when it was measured on the same GPU type with the same model; else None."""
    table = cached_table(device, cache_dir)
    if table is None or table.model_params != model_params or not table.memory.get("observations"):
        return None
    seeded = table.calibration()
    # the table's trial numbers are the calibration study's, not this study's
    seeded.observations[:] = [replace(o, trial=None) for o in seeded.observations]
    return seeded
