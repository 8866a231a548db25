"""A trial's timeline summary as a typed record: :class:`TimelineSummary` and its parts.

:func:`autotune.probes.timeline.summarize` produces it; ``result.json`` holds it as JSON under
``timeline_summary``. :meth:`TimelineSummary.from_json` is the one reader and
:meth:`TimelineSummary.to_json` the one writer, so a file of any version reads and writes back the same:

* a key an older version did not write (``window``, the host's ``other_busy_cores_*``) reads as None
  (an empty part for a nested one) and is left out again when the record is written;
* a key this version does not know is kept as it was (``extra``);
* a value of the wrong type reads as None, as the string-key readers treated it before.

Attribute names carry their units; where the name on disk lacks one (``idle_share``, ``mfu``, the
phases' ``seconds`` / ``share``), the field's ``disk`` metadata maps it. This module imports nothing
outside the probes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields
from typing import Any, TypeVar

__all__ = ["GpuSummary", "HostSummary", "PhaseSplit", "StepWindow", "TimelineSummary", "MEASURED_SPLITS"]

#: phase splits measured by the framework's own timers or autotune's markers (not inferred from power)
MEASURED_SPLITS = frozenset({"framework", "markers"})

_P = TypeVar("_P", bound="_Part")


def _number(raw: object) -> float | None:
    """A JSON number as it was written (an int stays an int), else None."""
    return raw if isinstance(raw, int | float) and not isinstance(raw, bool) else None


def _count(raw: object) -> int | None:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else None


def _text(raw: object) -> str | None:
    return raw if isinstance(raw, str) else None


def _by_phase(raw: object) -> Mapping[str, float | None]:
    """``{phase: number}``; a value that is not a number reads None."""
    return {str(k): _number(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}


def _same(value: object) -> object:
    return value


def _mapping(value: object) -> object:
    return dict(value) if isinstance(value, Mapping) else value


def _on_disk(
    read: Callable[[object], object], *, disk: str | None = None, write: Callable[[object], object] = _same
) -> Any:
    """A field read from JSON by ``read``, written by ``write``, named ``disk`` on disk (default: its name)."""
    return field(default=None, metadata={"read": read, "write": write, "disk": disk})


def _nested(cls: type[_Part], *, disk: str | None = None) -> Any:
    return field(
        default_factory=cls,
        metadata={"read": cls.from_json, "write": lambda part: part.to_json(), "disk": disk},
    )


@dataclass(frozen=True)
class _Part:
    """The reader and writer every part shares, driven by its fields' metadata."""

    #: keys on disk this version does not know, kept as they were
    extra: Mapping[str, object] = field(default_factory=dict, kw_only=True)
    #: attributes whose key the file lacked: left out again when written (not compared)
    absent: frozenset[str] = field(default=frozenset(), kw_only=True, compare=False, repr=False)

    @classmethod
    def _disk_fields(cls) -> list[tuple[Field[Any], str]]:
        return [(f, f.metadata.get("disk") or f.name) for f in fields(cls) if "read" in f.metadata]

    @classmethod
    def from_json(cls: type[_P], raw: object) -> _P:
        """The part from its JSON object (anything else reads as an empty part)."""
        data: Mapping[str, object] = raw if isinstance(raw, Mapping) else {}
        known: dict[str, Any] = {}
        absent: set[str] = set()
        names = set()
        for f, disk in cls._disk_fields():
            names.add(disk)
            if disk in data:
                known[f.name] = f.metadata["read"](data[disk])
            else:
                absent.add(f.name)
        extra = {str(k): v for k, v in data.items() if k not in names}
        return cls(**known, extra=extra, absent=frozenset(absent))

    def to_json(self) -> dict[str, object]:
        """The part as JSON, in the shape it was read in (or every field, for one built here)."""
        out: dict[str, object] = {
            disk: f.metadata["write"](getattr(self, f.name))
            for f, disk in self._disk_fields()
            if f.name not in self.absent
        }
        out.update(self.extra)
        return out


@dataclass(frozen=True)
class GpuSummary(_Part):
    """One GPU over the trial: means and percentiles over the steady window, peaks over the whole run."""

    index: int | None = _on_disk(_count)
    util_mean_pct: float | None = _on_disk(_number)
    util_p50_pct: float | None = _on_disk(_number)
    util_p95_pct: float | None = _on_disk(_number)
    idle_fraction: float | None = _on_disk(_number, disk="idle_share")
    peak_mem_bytes: float | None = _on_disk(_number)
    mem_total_bytes: float | None = _on_disk(_number)
    peak_proc_mem_bytes: float | None = _on_disk(_number)
    power_mean_w: float | None = _on_disk(_number)
    energy_j: float | None = _on_disk(_number)
    energy_per_step_j: float | None = _on_disk(_number)
    pcie_bytes_per_step: float | None = _on_disk(_number)
    sm_util_mean_pct: float | None = _on_disk(_number)
    mfu_fraction: float | None = _on_disk(_number, disk="mfu")


@dataclass(frozen=True)
class HostSummary(_Part):
    """The host over the trial (the trial's process tree, and what other processes used)."""

    cpu_mean_pct: float | None = _on_disk(_number)
    cpu_p95_pct: float | None = _on_disk(_number)
    peak_rss_bytes: float | None = _on_disk(_number)
    min_available_bytes: float | None = _on_disk(_number)
    cpu_cores: int | None = _on_disk(_count)
    other_busy_cores_mean: float | None = _on_disk(_number)
    other_busy_cores_p95: float | None = _on_disk(_number)
    load_avg_1m_mean: float | None = _on_disk(_number)
    host_cpu_count: int | None = _on_disk(_count)


@dataclass(frozen=True)
class StepWindow(_Part):
    """The steady window the rates cover (monotonic clock seconds) and the steps in it."""

    t0_mono_s: float | None = _on_disk(_number)
    t1_mono_s: float | None = _on_disk(_number)
    steps: int | None = _on_disk(_count)


@dataclass(frozen=True)
class PhaseSplit(_Part):
    """The steady window split into phases (rollout, train, weight_sync, other).

    Attributes:
        source: who split it: ``framework``, ``markers``, ``inferred`` or ``none``.
        time_s: seconds of each phase over the window.
        share_fraction: each phase's share of the window (0-1).
        gpu_idle_fraction: the share of each phase the GPUs sat idle (0-1).
    """

    source: str | None = _on_disk(_text)
    time_s: Mapping[str, float | None] = field(
        default_factory=dict, metadata={"read": _by_phase, "write": _mapping, "disk": "seconds"}
    )
    share_fraction: Mapping[str, float | None] = field(
        default_factory=dict, metadata={"read": _by_phase, "write": _mapping, "disk": "share"}
    )
    gpu_idle_fraction: Mapping[str, float | None] = field(
        default_factory=dict,
        metadata={"read": _by_phase, "write": _mapping, "disk": "gpu_idle_share_by_phase"},
    )

    @property
    def measured(self) -> bool:
        """Split by the framework's timers or autotune's markers (not inferred, not missing)."""
        return self.source in MEASURED_SPLITS


def _gpus(raw: object) -> tuple[GpuSummary, ...]:
    """Each GPU's entry (one that is not a JSON object is skipped, as the readers skipped it)."""
    items = raw if isinstance(raw, list | tuple) else ()
    return tuple(GpuSummary.from_json(g) for g in items if isinstance(g, Mapping))


def _gpus_json(gpus: object) -> object:
    return [g.to_json() for g in gpus] if isinstance(gpus, tuple) else gpus


@dataclass(frozen=True)
class TimelineSummary(_Part):
    """What one trial's timeline says: per GPU, the host, the steady window and its phase split.

    Attributes:
        duration_s: the timeline's length.
        sample_rate_hz: the polling rate per GPU (or the host's on a CPU-only run).
        steps: step records seen.
        window: the steady window (:class:`StepWindow`).
        gpus: one :class:`GpuSummary` per GPU, by index.
        host: :class:`HostSummary`.
        phases: :class:`PhaseSplit`.
        error: why there is no summary (an unreadable timeline), instead of the rest.
    """

    duration_s: float | None = _on_disk(_number)
    sample_rate_hz: float | None = _on_disk(_number)
    steps: int | None = _on_disk(_count)
    window: StepWindow = _nested(StepWindow)
    gpus: tuple[GpuSummary, ...] = field(default=(), metadata={"read": _gpus, "write": _gpus_json})
    host: HostSummary = _nested(HostSummary)
    phases: PhaseSplit = _nested(PhaseSplit)
    error: str | None = _on_disk(_text)

    @classmethod
    def unreadable(cls, why: str) -> TimelineSummary:
        """The summary of a trial whose timeline could not be read (``{"error": why}`` on disk)."""
        return cls.from_json({"error": why})

    def gpu(self, index: int) -> GpuSummary | None:
        """The GPU with that index, when the timeline sampled it."""
        return next((g for g in self.gpus if g.index == index), None)
