"""The host-load flag of a trial, from its timeline summary (deterministic inputs)."""

from __future__ import annotations

import pytest
from autotune.probes.summary import TimelineSummary

from autotune.trial.hostload import HostLoad, host_load


def _summary(other: float | None, cores: int | None = 2) -> dict:
    return {"host": {"cpu_mean_pct": 90.0, "other_busy_cores_mean": other, "host_cpu_count": cores}}


def _load(summary: dict | None) -> HostLoad | None:
    """The flag of a summary as ``result.json`` holds it (read by the record's one reader)."""
    return host_load(TimelineSummary.from_json(summary) if summary is not None else None)


@pytest.mark.parametrize(
    ("other", "cores", "loaded"),
    [
        (0.1, 2, False),  # autotune's neighbours idle
        (0.49, 2, False),  # under half a core: not enough to flag
        (0.5, 2, True),  # half a core of 2 taken by another process
        (1.3, 2, True),
        (0.6, 16, False),  # half a core of 16 is background noise ...
        (1.6, 16, True),  # ... a tenth of the host is not
        (0.5, None, True),  # the host's size unknown: the half-core floor alone
    ],
)
def test_a_trial_is_flagged_when_other_processes_take_a_real_share_of_the_host(
    other: float, cores: int | None, loaded: bool
) -> None:
    load = _load(_summary(other, cores))
    assert load is not None and load.loaded is loaded
    assert load.other_busy_cores == pytest.approx(other)


def test_the_flag_reads_as_the_report_shows_it() -> None:
    load = _load(_summary(1.34, 2))
    assert load == HostLoad(other_busy_cores=1.34, host_cores=2, loaded=True)
    assert (
        load.text()
        == "host loaded by other processes during this trial (1.3 of 2 cores busy outside the trial)"
    )
    assert HostLoad(0.7, None, True).text("run 3") == (
        "host loaded by other processes during run 3 (0.7 cores busy outside the trial)"
    )


@pytest.mark.parametrize(
    "summary",
    [
        None,
        {},
        {"host": None},
        {"host": {"cpu_mean_pct": 50.0}},
        _summary(None),
        {"error": "timeline unreadable"},
    ],
)
def test_no_measurement_no_flag(summary: dict | None) -> None:
    # timelines recorded before the probe measured other processes, or none at all
    assert _load(summary) is None
