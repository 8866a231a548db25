"""Whether other processes loaded the host while a trial ran (from its timeline summary).

A trial's throughput is only as good as the machine was quiet: on a shared host a neighbour's build or
training run takes cores the trial would have used, and a configuration measured under that load looks
slower than it is. The host probe records the cores busy *outside* the trial's process tree and autotune
(``other_cpu_cores``, :mod:`autotune.probes.host`); its mean over the trial's steady window is what this
module judges.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.probes.summary import TimelineSummary

__all__ = ["LOADED_MIN_CORES", "LOADED_MIN_SHARE", "HostLoad", "host_load"]

#: A trial is flagged when other processes kept at least this many cores busy on average ...
LOADED_MIN_CORES = 0.5
#: ... and at least this share of the host's cores (so a 64-core host is not flagged for one busy core).
LOADED_MIN_SHARE = 0.1


@dataclass(frozen=True)
class HostLoad:
    """What other processes used while a trial measured its steps.

    Attributes:
        other_busy_cores: mean cores busy outside the trial (and autotune) over the steady window.
        host_cores: the host's logical CPUs, when known.
        loaded: True when that load is high enough to distort the trial's step times.
    """

    other_busy_cores: float
    host_cores: int | None
    loaded: bool

    def text(self, what: str = "this trial") -> str:
        """``host loaded by other processes during this trial (1.3 of 2 cores busy outside the trial)``."""
        of = f" of {self.host_cores}" if self.host_cores else ""
        return (
            f"host loaded by other processes during {what}"
            f" ({self.other_busy_cores:.1f}{of} cores busy outside the trial)"
        )


def host_load(summary: TimelineSummary | None) -> HostLoad | None:
    """The host load of a trial from its timeline summary, or None when it was not measured (a timeline
    recorded before the probe measured it, or no timeline)."""
    if summary is None or summary.host.other_busy_cores_mean is None:
        return None
    other = float(summary.host.other_busy_cores_mean)
    cores = summary.host.host_cpu_count or summary.host.cpu_cores
    n = int(cores) if cores is not None and cores > 0 else None
    threshold = max(LOADED_MIN_CORES, LOADED_MIN_SHARE * n) if n else LOADED_MIN_CORES
    return HostLoad(other_busy_cores=other, host_cores=n, loaded=other >= threshold)
