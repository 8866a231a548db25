"""The calibration table of a machine, exactly: which points teach the memory correction, the step-time
median, the OOM verdict, the Markdown and JSON it is kept as, and where it is kept.

Six hand-made points (sizes in GiB; each estimate 7 GiB modelled + 3 GiB reserved by vLLM, exact):

====  ======  ==========  ========  ========  =========  =========  ===========================
trial status  sized OOM?  estimate  measured  predicted  measured   what it teaches
                          peak      peak      step s     step s
====  ======  ==========  ========  ========  =========  =========  ===========================
0     COMPLETE no         10 / 20   12        2.0        3.0        ratio (12 − 3) / 7 = 9/7
1     PRUNED   no         10 / 20   13        4.0        5.0        ratio (13 − 3) / 7 = 10/7
2     OOM      yes        30 / 20   —         1.0        10.0       the OOM verdict only
3     OOM      no         10 / 15   —         —          —          floor (15 − 3) / 7 · 1.0001
4     COMPLETE no         —         5         —          1.0        nothing (no estimate)
5     FAIL     no         10 / 20   —         1.0        2.0        step ratio 2.0 only
====  ======  ==========  ========  ========  =========  =========  ===========================

(estimate peak / capacity). Memory: median(9/7, 10/7) = 19/14 ≈ 1.357, raised to the OOM floor
12/7 · 1.0001 ≈ 1.7145, under the ceilings (20 − 3) / 7 / 1.0001 ≈ 2.428: 1.7145. Step time: median of
1.5, 1.25 and 2.0 (trial 2's 10.0 is left out: sized to OOM) = 1.5.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autotune.estimate import (
    CalibrationPoint,
    CalibrationTable,
    build_table,
    cached_table,
    seed_calibration,
    store_table,
)

G = 1024**3
DEVICE = "NVIDIA H100 80GB HBM3"
WHEN = "2026-11-25T20:00:00+00:00"


def _estimate(peak_gib: int, capacity_gib: int) -> dict[str, Any]:
    return {
        "components_bytes": {"weights": (peak_gib - 3) * G, "vllm_reserved": 3 * G},
        "peak_bytes": peak_gib * G,
        "capacity_bytes": capacity_gib * G,
    }


POINTS = [
    CalibrationPoint(0, "bs=2", "COMPLETE", False, _estimate(10, 20), 12 * G, 2.0, 3.0),
    CalibrationPoint(1, "bs=4", "PRUNED", False, _estimate(10, 20), 13 * G, 4.0, 5.0),
    CalibrationPoint(2, "bs=64", "OOM", True, _estimate(30, 20), None, 1.0, 10.0),
    CalibrationPoint(3, "bs=8", "OOM", False, _estimate(10, 15), None, None, None),
    CalibrationPoint(4, "bs=1", "COMPLETE", False, None, 5 * G, None, 1.0),
    CalibrationPoint(5, "bs=16", "FAIL", False, _estimate(10, 20), None, 1.0, 2.0),
]
FACTOR = 12 / 7 * 1.0001


def _observation(trial: int, capacity_gib: int, measured_gib: int | None) -> dict[str, Any]:
    return {
        "trial": trial,
        "predicted_peak_bytes": 10 * G,
        "modelled_bytes": 7 * G,
        "exact_bytes": 3 * G,
        "capacity_bytes": capacity_gib * G,
        "measured_peak_bytes": None if measured_gib is None else measured_gib * G,
        "oom": measured_gib is None,
        "rel_error": None if measured_gib is None else (10 - measured_gib) / measured_gib,
    }


def _table(points: list[CalibrationPoint] = POINTS) -> CalibrationTable:
    return build_table(DEVICE, "Qwen2.5-0.5B", 494_032_768, points, WHEN)


def test_the_table_learns_from_the_points_that_are_evidence() -> None:
    table = _table()
    assert table.memory == {
        "factor": pytest.approx(FACTOR, rel=1e-12),
        "observations": [_observation(0, 20, 12), _observation(1, 20, 13), _observation(3, 15, None)],
    }
    assert table.calibration().factor == pytest.approx(FACTOR, rel=1e-12)
    assert table.step_time_ratio == 1.5
    assert table.oom_classified is True
    assert (table.device, table.model, table.model_params, table.measured_at) == (
        DEVICE,
        "Qwen2.5-0.5B",
        494_032_768,
        WHEN,
    )
    assert table.points == tuple(POINTS)


def test_the_oom_verdict_and_the_step_ratio_need_their_points() -> None:
    missed = CalibrationPoint(6, "bs=64", "COMPLETE", True, _estimate(30, 20), 19 * G, None, None)
    assert _table([POINTS[2], missed]).oom_classified is False  # one sized to OOM ran
    # an OOM whose peak was read before it died: the observation keeps no measured peak
    late = CalibrationPoint(7, "bs=32", "OOM", False, _estimate(10, 15), 16 * G, None, None)
    assert _table([late]).memory["observations"] == [_observation(7, 15, None)]
    nothing = _table([POINTS[3]])  # an OOM only: no step ratio, no deliberate OOM
    assert (nothing.step_time_ratio, nothing.oom_classified) == (None, None)
    assert nothing.memory["observations"] == [_observation(3, 15, None)]
    assert _table([]).memory == {"factor": 1.0, "observations": []}


def test_the_markdown_table() -> None:
    assert _table().to_markdown() == (
        f"# Calibration: Qwen2.5-0.5B on {DEVICE} ({WHEN})\n"
        "\n"
        "| trial | configuration | status | predicted peak GiB | measured peak GiB | ratio "
        "| predicted step s | measured step s | ratio |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
        "| 0 | bs=2 | COMPLETE | 10.00 | 12.00 | 1.20 | 2.000 | 3.000 | 1.50 |\n"
        "| 1 | bs=4 | PRUNED | 10.00 | 13.00 | 1.30 | 4.000 | 5.000 | 1.25 |\n"
        "| 2 | bs=64 (sized to OOM) | OOM | 30.00 | — | — | 1.000 | 10.000 | 10.00 |\n"
        "| 3 | bs=8 | OOM | 10.00 | — | — | — | — | — |\n"
        "| 4 | bs=1 | COMPLETE | — | 5.00 | — | — | 1.000 | — |\n"
        "| 5 | bs=16 | FAIL | 10.00 | — | — | 1.000 | 2.000 | 2.00 |\n"
        "\n"
        "Memory factor learned: 1.714. Step time measured ÷ predicted (median): 1.50. "
        "Deliberate OOM classified as OOM: True.\n"
    )
    # nothing measured: dashes and None, no crash
    empty = _table([])
    assert empty.to_markdown().endswith(
        "|---|---|---|---|---|---|---|---|---|\n"
        "\n"
        "Memory factor learned: 1.000. Step time measured ÷ predicted (median): —. "
        "Deliberate OOM classified as OOM: None.\n"
    )


def test_the_json_form_and_back() -> None:
    table = _table()
    data = table.to_dict()
    assert list(data) == [
        "version",
        "device",
        "model",
        "model_params",
        "measured_at",
        "memory",
        "step_time_ratio",
        "oom_classified",
        "points",
    ]
    assert data["version"] == 1
    assert data["points"][0] == {
        "trial": 0,
        "label": "bs=2",
        "status": "COMPLETE",
        "expected_oom": False,
        "estimate": _estimate(10, 20),
        "measured_peak_bytes": 12 * G,
        "predicted_step_s": 2.0,
        "measured_step_s": 3.0,
    }
    assert CalibrationTable.from_dict(json.loads(json.dumps(data))) == table
    # the optional parts may be missing; the required ones are read as their types
    bare = CalibrationTable.from_dict({"device": 1, "model": 2, "model_params": "3", "measured_at": 4})
    assert bare == CalibrationTable("1", "2", 3, "4", (), {}, None, None)
    assert CalibrationTable.from_dict({**data, "memory": None}).memory == {}


def test_tables_are_kept_per_gpu_type(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = _table()
    path = store_table(table, tmp_path)
    assert path == tmp_path / "calibration" / "nvidia-h100-80gb-hbm3.json"
    assert json.loads(path.read_text()) == json.loads(json.dumps(table.to_dict()))
    assert cached_table(DEVICE, tmp_path) == table
    # a name with nothing but punctuation still gets a file
    odd = store_table(CalibrationTable("  ", "m", 1, WHEN, (), {}, None, None), tmp_path)
    assert odd.name == "gpu.json"
    assert store_table(
        CalibrationTable("--A10 (24G)--", "m", 1, WHEN, (), {}, None, None), tmp_path
    ).name == ("a10-24g.json")
    # lower case and a trailing letter X are kept
    titan = CalibrationTable("NVIDIA TITAN X", "m", 1, WHEN, (), {}, None, None)
    assert store_table(titan, tmp_path).name == "nvidia-titan-x.json"
    assert store_table(CalibrationTable("Tesla T4", "m", 1, WHEN, (), {}, None, None), tmp_path).name == (
        "tesla-t4.json"
    )
    # without a folder: the autotune cache
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path / "cache"))
    assert store_table(table) == tmp_path / "cache" / "calibration" / "nvidia-h100-80gb-hbm3.json"
    assert cached_table(DEVICE) == table


@pytest.mark.parametrize(
    "text",
    [
        "{not json",  # ValueError
        '{"model": "m"}',  # KeyError: no device
        '{"device": "d", "model": "m", "model_params": 1, "measured_at": "t", "points": [{"x": 1}]}',  # TypeError
    ],
)
def test_an_unreadable_table_is_no_table(tmp_path: Path, text: str) -> None:
    assert cached_table(DEVICE, tmp_path) is None  # none stored: OSError
    path = store_table(_table(), tmp_path)
    path.write_text(text)
    assert cached_table(DEVICE, tmp_path) is None
    assert seed_calibration(DEVICE, 494_032_768, tmp_path) is None


def test_a_study_of_the_same_model_on_the_same_gpu_is_seeded(tmp_path: Path) -> None:
    store_table(_table(), tmp_path)
    seeded = seed_calibration(DEVICE, 494_032_768, tmp_path)
    assert seeded is not None
    assert seeded.factor == pytest.approx(FACTOR, rel=1e-12)
    # the calibration study's trial numbers are dropped, the evidence kept
    assert [o.to_dict() for o in seeded.observations] == [
        {**_observation(t, c, m), "trial": None} for t, c, m in ((0, 20, 12), (1, 20, 13), (3, 15, None))
    ]
    assert seed_calibration(DEVICE, 494_032_769, tmp_path) is None  # another model
    assert seed_calibration("NVIDIA A10", 494_032_768, tmp_path) is None  # another GPU


def test_a_table_without_memory_evidence_seeds_nothing(tmp_path: Path) -> None:
    store_table(_table([POINTS[4]]), tmp_path)  # no estimate: no observation
    assert cached_table(DEVICE, tmp_path) is not None
    assert seed_calibration(DEVICE, 494_032_768, tmp_path) is None
