"""One GPU as the sampler (:class:`autotune.probes.nvml.NvmlSampler`) reads it: its handle, its blank
row, where it stands in the cadence and which reads fell back to their own call; the NVML tables the
reads decode with (GPM metrics, field value types), and the rule that tells a driver buffer wrapped."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GPM_METRICS", "VALUE_FIELDS", "Device", "buffer_overflowed"]

GPM_METRICS = (
    ("gpm_sm_util_pct", "NVML_GPM_METRIC_SM_UTIL"),
    ("gpm_sm_occupancy_pct", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("gpm_tensor_util_pct", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
)
VALUE_FIELDS = {  # nvmlValueType_t -> field of c_nvmlValue_t
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}


@dataclass
class Device:
    index: int
    handle: Any
    slow_phase: int  # this GPU's slow reads happen on ticks where tick % slow_every == slow_phase
    gpm: list[Any] = field(default_factory=list)  # two GPM sample buffers when GPM is on
    gpm_have_prev: bool = False
    last_sample_us: dict[int, int] = field(default_factory=dict)  # sampling type -> newest timestamp
    power_from_buffer: bool = False  # the driver's power buffer delivered at the last slow read
    util_from_buffer: bool = False  # the driver's utilization buffer delivered at the last slow read
    counters_off: set[str] = field(default_factory=set)  # columns read by their own call instead
    counter_prev: dict[str, tuple[int, float]] = field(default_factory=dict)  # column -> (t_us, bytes)
    state_cursor: int = 0  # position in the rotation of state reads
    slow_count: int = 0  # slow reads so far
    buffer_every: int = 2  # slow reads between two reads of the driver's buffers (1 after an overflow)
    # every metric NaN, ``device`` set: a tick's rows are copies (an array row is stored by one memcpy)
    blank_row: array[float] = field(default_factory=lambda: array("d"))

    def new_row(self, t_mono: float, t_wall: float) -> array[float]:
        """A blank row of this GPU at the given time."""
        row = self.blank_row[:]
        row[0] = t_mono
        row[1] = t_wall
        return row


def buffer_overflowed(last_us: int, stamps: list[int]) -> bool:
    """True when the oldest new sample is much later than the last one taken: the driver's ring buffer
    wrapped between two reads and samples were lost (needs >= 3 new samples to know their spacing)."""
    if len(stamps) < 3:
        return False
    gaps = sorted(b - a for a, b in zip(stamps, stamps[1:], strict=False))
    spacing = gaps[len(gaps) // 2]
    return spacing > 0 and stamps[0] - last_us > 3 * spacing
