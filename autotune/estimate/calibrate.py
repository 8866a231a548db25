"""Correct the memory estimate from what the study measures.

Each completed trial gives a measured NVML peak; each OOM says the true peak exceeded the capacity.
Both are turned into a factor on the *modelled* part of the estimate (everything except
``vllm_reserved``, which is exact): ``adjusted = vllm_reserved + factor × rest``.

The factor is the median of the measured ratios, raised — only as far as needed — so that every
observed OOM would have been predicted to overflow, and capped so that every trial that ran is still
predicted to fit: calibration never makes the study prune a configuration a trial showed to work.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from autotune.estimate.memory import MemoryEstimate
from autotune.jsontypes import JsonObject

__all__ = ["Calibration", "Observation", "prediction_error"]

_MIN_FACTOR, _MAX_FACTOR = 0.25, 4.0
_OOM_NUDGE = 1.0001  # "only as much as needed": just past the capacity


def prediction_error(predicted_peak_bytes: int, measured_peak_bytes: int) -> float:
    """Relative error of a prediction: ``(predicted − measured) / measured``."""
    if measured_peak_bytes <= 0:
        return 0.0
    return (predicted_peak_bytes - measured_peak_bytes) / measured_peak_bytes


@dataclass(frozen=True)
class Observation:
    """One trial's evidence, as recorded by :meth:`Calibration.observe`."""

    trial: int | None
    predicted_peak_bytes: int
    modelled_bytes: int  # the part the factor scales (peak minus vllm_reserved)
    exact_bytes: int  # vllm_reserved at the peak phase
    capacity_bytes: int
    measured_peak_bytes: int | None
    oom: bool

    @property
    def ratio(self) -> float | None:
        """Measured over predicted, on the modelled part (None for an OOM or a missing measurement)."""
        if self.oom or self.measured_peak_bytes is None or self.modelled_bytes <= 0:
            return None
        return max(0.0, self.measured_peak_bytes - self.exact_bytes) / self.modelled_bytes

    @property
    def oom_floor(self) -> float | None:
        """The smallest factor that predicts this OOM (None when not an OOM or already predicted)."""
        if not self.oom or self.modelled_bytes <= 0 or self.capacity_bytes <= 0:
            return None
        return (self.capacity_bytes - self.exact_bytes) / self.modelled_bytes * _OOM_NUDGE

    @property
    def fit_ceiling(self) -> float | None:
        """The largest factor that still predicts this completed trial to fit (None for an OOM)."""
        if (
            self.oom
            or self.measured_peak_bytes is None
            or self.modelled_bytes <= 0
            or self.capacity_bytes <= 0
        ):
            return None
        return max(0.0, self.capacity_bytes - self.exact_bytes) / self.modelled_bytes / _OOM_NUDGE

    @property
    def rel_error(self) -> float | None:
        """Relative error of the raw prediction against the measured peak."""
        if self.measured_peak_bytes is None or self.oom:
            return None
        return prediction_error(self.predicted_peak_bytes, self.measured_peak_bytes)

    def to_dict(self) -> JsonObject:
        return {
            "trial": self.trial,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "modelled_bytes": self.modelled_bytes,
            "exact_bytes": self.exact_bytes,
            "capacity_bytes": self.capacity_bytes,
            "measured_peak_bytes": self.measured_peak_bytes,
            "oom": self.oom,
            "rel_error": self.rel_error,
        }


@dataclass
class Calibration:
    """A correction factor learned from measured peaks and OOMs. Serialisable for resumed studies."""

    observations: list[Observation] = field(default_factory=list)

    def observe(
        self,
        predicted: MemoryEstimate,
        measured_peak_bytes: int | None,
        oom: bool,
        *,
        trial: int | None = None,
    ) -> None:
        """Record one trial. ``predicted`` must be the raw estimate (not :meth:`adjust`-ed).

        Args:
            predicted: the estimate made for the trial.
            measured_peak_bytes: NVML peak of the most loaded GPU, or None when unknown.
            oom: the trial ran out of GPU memory.
            trial: the trial number, for the report.
        """
        if not predicted.on_gpu or predicted.capacity_bytes <= 0:
            return
        raw = predicted.scaled(1.0)  # itself when no factor was applied
        exact = raw.components_bytes.get("vllm_reserved", 0)
        self.observations.append(
            Observation(
                trial=trial,
                predicted_peak_bytes=raw.peak_bytes,
                modelled_bytes=raw.peak_bytes - exact,
                exact_bytes=exact,
                capacity_bytes=raw.capacity_bytes,
                measured_peak_bytes=int(measured_peak_bytes) if measured_peak_bytes is not None else None,
                oom=bool(oom),
            )
        )

    @property
    def factor(self) -> float:
        """The factor :meth:`adjust` applies (1.0 before any evidence)."""
        ratios = [r for o in self.observations if (r := o.ratio) is not None]
        factor = statistics.median(ratios) if ratios else 1.0
        floors = [f for o in self.observations if (f := o.oom_floor) is not None]
        if floors:
            factor = max(factor, max(floors))
        # Never so high that a configuration seen to run would be predicted not to fit.
        ceilings = [c for o in self.observations if (c := o.fit_ceiling) is not None]
        if ceilings:
            factor = min(factor, min(ceilings))
        return min(_MAX_FACTOR, max(_MIN_FACTOR, factor))

    def adjust(self, est: MemoryEstimate) -> MemoryEstimate:
        """``est`` with the learned factor applied to its modelled components."""
        if not est.on_gpu:
            return est
        return est.scaled(self.factor)

    def errors(self) -> list[dict[str, Any]]:
        """Per-trial prediction error of the raw estimate (for the report)."""
        return [o.to_dict() for o in self.observations]

    def to_dict(self) -> JsonObject:
        return {"factor": self.factor, "observations": [o.to_dict() for o in self.observations]}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Calibration:
        """Rebuild from :meth:`to_dict` output (None or empty gives a fresh calibration)."""
        cal = cls()
        for o in (data or {}).get("observations", []):
            cal.observations.append(
                Observation(
                    trial=o.get("trial"),
                    predicted_peak_bytes=int(o["predicted_peak_bytes"]),
                    modelled_bytes=int(o["modelled_bytes"]),
                    exact_bytes=int(o.get("exact_bytes", 0)),
                    capacity_bytes=int(o["capacity_bytes"]),
                    measured_peak_bytes=None
                    if o.get("measured_peak_bytes") is None
                    else int(o["measured_peak_bytes"]),
                    oom=bool(o.get("oom")),
                )
            )
        return cal
