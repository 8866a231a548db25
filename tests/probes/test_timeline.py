"""Timeline storage, summaries and the phase split, replayed on committed timelines with known answers.

``data/gpu_trial`` is scripted by ``data/make_gpu_trial.py`` (its docstring derives every number
asserted here); ``data/cpu_trial`` is a real CPU run recorded by ``data/record_cpu_trial.py``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from autotune.probes.phases import PHASES, read_phases
from autotune.probes.timeline import (
    COLUMNS,
    GPU_METRICS,
    InferenceThresholds,
    RowBuffer,
    phase_intervals,
    read_timeline,
    write_timeline,
)
from autotune.probes.timeline import summarize as summarize_record

DATA = Path(__file__).resolve().parent / "data"


def summarize(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """The summary as ``result.json`` holds it: these tests pin its JSON shape (key names included)."""
    return summarize_record(*args, **kwargs).to_json()


GiB = 1024**3
STEP_S = 3.0
# per step of the scripted GPU trial: (seconds, utilization of GPU 0, power W)
SCRIPT = {
    "other": (0.5, 0.0, 80.0),
    "weight_sync": (0.2, 3.0, 90.0),
    "rollout": (1.5, 92.0, 210.0),
    "train": (0.8, 99.0, 630.0),
}


def _load(name: str) -> tuple[pd.DataFrame, list[dict], list[dict]]:
    d = DATA / name
    steps = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    return read_timeline(d / "timeline.parquet"), steps, read_phases(d / "phases.jsonl")


def _by_step_weighted(index: int) -> float:
    return sum(s * v[index] for s, *v in [(sec, u, p) for sec, u, p in SCRIPT.values()]) / STEP_S


# ------------------------------------------------------------------------------------ storage
def test_rows_round_trip_through_parquet_with_the_schema(tmp_path: Path) -> None:
    buffer = RowBuffer("gpu", GPU_METRICS)
    row = buffer.blank(12.5, 1e9, 3)
    row[3] = 55.0  # gpu_util_pct
    buffer.append(row)
    buffer.append(buffer.blank(11.0, 1e9 - 1.5, 0))
    with pytest.raises(ValueError, match="values"):
        buffer.append([1.0, 2.0])
    rows = buffer.rows()
    assert rows[0]["device"] == 3 and rows[0]["gpu_util_pct"] == 55.0 and rows[0]["power_w"] is None
    host_rows = [{"t_mono_s": 11.5, "t_wall_s": 1e9 - 1, "source": "host", "device": -1, "cpu_pct": 150.0}]

    path = tmp_path / "trial" / "timeline.parquet"
    assert write_timeline(path, rows + host_rows) == 3
    assert [p.name for p in path.parent.iterdir()] == ["timeline.parquet"]  # no temporary left
    df = read_timeline(path)
    assert list(df.columns) == list(COLUMNS)
    assert list(df["t_mono_s"]) == [11.0, 11.5, 12.5]  # sorted by time
    assert list(df["source"]) == ["gpu", "host", "gpu"] and list(df["device"]) == [0, -1, 3]
    assert df["device"].dtype == "int64"
    assert all(df[c].dtype == "float64" for c in COLUMNS if c not in ("source", "device"))
    assert df.loc[2, "gpu_util_pct"] == 55.0 and math.isnan(df.loc[0, "gpu_util_pct"])


def test_an_empty_run_writes_the_schema_and_summarizes_to_unknowns(tmp_path: Path) -> None:
    path = tmp_path / "timeline.parquet"
    assert write_timeline(path, []) == 0
    df = read_timeline(path)
    assert list(df.columns) == list(COLUMNS) and len(df) == 0
    summary = summarize(df, [], [])
    assert summary["gpus"] == [] and summary["duration_s"] is None and summary["sample_rate_hz"] is None
    assert summary["host"]["cpu_mean_pct"] is None and summary["phases"]["source"] == "none"
    assert set(summary["phases"]["seconds"]) == set(PHASES)
    json.dumps(summary, allow_nan=False)
    assert summarize(None, [{"step": 1, "t_mono_s": 5.0}], [])["steps"] == 1


def test_read_timeline_fills_columns_an_older_file_lacks(tmp_path: Path) -> None:
    path = tmp_path / "old.parquet"
    pd.DataFrame(
        {"t_mono_s": [1.0], "t_wall_s": [2.0], "source": ["gpu"], "device": [0], "gpu_util_pct": [7.0]}
    ).to_parquet(path)
    df = read_timeline(path)
    assert list(df.columns) == list(COLUMNS) and math.isnan(df.loc[0, "power_w"])


# ------------------------------------------------------------------------------------ GPU summary
@pytest.fixture(scope="module")
def gpu_trial() -> tuple[pd.DataFrame, list[dict], list[dict]]:
    return _load("gpu_trial")


def test_gpu_trial_summary_has_the_known_answers(gpu_trial) -> None:
    df, steps, markers = gpu_trial
    flops = 0.3 * 989e12 * STEP_S * 2  # MFU 0.3 on 2 GPUs at 3 s/step
    s = summarize(df, steps, markers, model_flops_per_step=flops, peak_flops=989e12)
    json.dumps(s, allow_nan=False)
    assert (
        s["steps"] == 6
        and s["duration_s"] == pytest.approx(23.0)
        and s["sample_rate_hz"] == pytest.approx(10.0)
    )
    assert s["window"] == {"t0_mono_s": 1007.0, "t1_mono_s": 1022.0, "steps": 5}
    g0, g1 = s["gpus"]
    assert (g0["index"], g1["index"]) == (0, 1)
    assert g0["util_mean_pct"] == pytest.approx(_by_step_weighted(0))  # 72.6
    assert g0["util_mean_pct"] == pytest.approx(72.6)
    assert (g0["util_p50_pct"], g0["util_p95_pct"]) == (92.0, 99.0)
    assert (g1["util_p50_pct"], g1["util_p95_pct"]) == (90.0, 97.0)
    assert g0["idle_share"] == pytest.approx(0.7 / 3)  # other + weight sync are below 5 %
    assert g0["power_mean_w"] == pytest.approx(_by_step_weighted(1))  # 292.33
    assert g0["energy_per_step_j"] == pytest.approx(877.0)
    assert g0["energy_j"] == pytest.approx(4 * 70 + 6 * 877 + 1 * 70)  # start-up + steps + tear-down
    assert g0["pcie_bytes_per_step"] == pytest.approx(0.2 * (1e10 + 1e9))
    assert g0["peak_mem_bytes"] == 62 * GiB and g1["peak_mem_bytes"] == 60 * GiB  # warm-up peak
    assert g0["peak_proc_mem_bytes"] == pytest.approx(61.5 * GiB) and g0["mem_total_bytes"] == 80 * GiB
    assert g0["sm_util_mean_pct"] == pytest.approx(0.6 * 72.6) and g1["sm_util_mean_pct"] is None
    assert g0["mfu"] == pytest.approx(0.3) and g1["mfu"] == pytest.approx(0.3)
    host = s["host"]
    assert host["cpu_cores"] == 32 and host["peak_rss_bytes"] == 8 * GiB
    assert host["min_available_bytes"] == 90 * GiB
    assert host["cpu_mean_pct"] == pytest.approx(332 / 3, abs=3)  # 4 Hz host samples vs 0.1 s phases
    assert host["cpu_p95_pct"] == 150.0


def test_gpu_trial_phases_from_nested_markers(gpu_trial) -> None:
    df, steps, markers = gpu_trial
    phases = summarize(df, steps, markers)["phases"]
    assert phases["source"] == "markers"
    for name, (seconds, _, _) in SCRIPT.items():
        assert phases["seconds"][name] == pytest.approx(5 * seconds)
        assert phases["share"][name] == pytest.approx(seconds / STEP_S)
    assert phases["gpu_idle_share_by_phase"] == pytest.approx(
        {"rollout": 0.0, "train": 0.0, "weight_sync": 1.0, "other": 1.0}
    )
    intervals = phase_intervals(steps, markers, df)
    step3 = [(i["phase"], round(i["t1_mono_s"] - i["t0_mono_s"], 6)) for i in intervals if i["step"] == 3]
    assert step3 == [("other", 0.5), ("weight_sync", 0.2), ("rollout", 1.5), ("train", 0.8)]
    assert all(i["source"] == "markers" for i in intervals)
    ends = [(i["t0_mono_s"], i["t1_mono_s"]) for i in intervals]
    assert all(a < b for a, b in ends) and all(
        b1 <= a2 + 1e-9 for (_, b1), (a2, _) in zip(ends, ends[1:], strict=False)
    )


def test_gpu_trial_phases_inferred_from_utilization_and_power(gpu_trial) -> None:
    df, steps, _ = gpu_trial
    phases = summarize(df, steps, [])["phases"]
    assert phases["source"] == "inferred"
    # the weight sync (util 3 %) cannot be told from other idle time: it lands in "other"
    assert phases["seconds"]["rollout"] == pytest.approx(5 * 1.5)
    assert phases["seconds"]["train"] == pytest.approx(5 * 0.8)
    assert phases["seconds"]["other"] == pytest.approx(5 * 0.7)
    assert phases["seconds"]["weight_sync"] == 0.0
    assert phases["gpu_idle_share_by_phase"]["other"] == pytest.approx(1.0)
    assert phases["gpu_idle_share_by_phase"]["weight_sync"] is None
    first = [i for i in phase_intervals(steps, [], df) if i["step"] == 1]
    assert [i["phase"] for i in first] == ["other", "rollout", "train"]
    assert first[0]["t0_mono_s"] == pytest.approx(1004.0)  # step 1 starts one median step before its end


def test_inference_ignores_single_sample_flickers(gpu_trial) -> None:
    df, steps, _ = gpu_trial
    noisy = df.copy()
    # in step 3's rollout (1010.7-1012.2): one sample where a GPU reads idle, one power spike
    at = noisy["source"] == "gpu"
    noisy.loc[at & (noisy["t_mono_s"].round(1) == 1011.0), "gpu_util_pct"] = 0.0
    noisy.loc[at & (noisy["t_mono_s"].round(1) == 1011.5), "power_w"] = 690.0
    assert summarize(noisy, steps, [])["phases"]["seconds"] == pytest.approx(
        summarize(df, steps, [])["phases"]["seconds"]
    )
    # without smoothing the flickers show up
    raw = summarize(noisy, steps, [], thresholds=InferenceThresholds(smooth_samples=1))
    assert raw["phases"]["seconds"]["train"] == pytest.approx(5 * 0.8 + 0.1)


def test_inference_thresholds_decide_the_split(gpu_trial) -> None:
    df, steps, _ = gpu_trial
    # raise the train threshold above 630/700 W: every busy sample becomes rollout
    everything_rollout = summarize(df, steps, [], thresholds=InferenceThresholds(train_power_frac=0.95))
    assert everything_rollout["phases"]["seconds"]["train"] == 0.0
    assert everything_rollout["phases"]["seconds"]["rollout"] == pytest.approx(5 * 2.3)
    # without a power limit the highest power seen stands in (630 W): the split is unchanged
    no_limit = df.assign(power_limit_w=float("nan"))
    assert summarize(no_limit, steps, [])["phases"]["seconds"]["train"] == pytest.approx(5 * 0.8)


def test_energy_falls_back_to_power_integration_and_gaps_are_not_filled(gpu_trial) -> None:
    df, steps, _ = gpu_trial
    no_counter = df.assign(energy_mj=float("nan"))
    g0 = summarize(no_counter, steps, [])["gpus"][0]
    assert g0["energy_per_step_j"] == pytest.approx(877.0)
    # GPU 1 lost at 1010 s: its last sample is at 1009.9, its rows carry NaN from then on
    lost = df.copy()
    late = (lost["device"] == 1) & (lost["t_mono_s"] > 1009.95)
    lost.loc[late, list(GPU_METRICS)] = float("nan")
    g1 = summarize(lost, steps, [])["gpus"][1]
    assert g1["peak_mem_bytes"] == 60 * GiB
    # only the 3 s it was seen in the window count: (1007, 1010] is exactly one scripted step
    assert g1["util_mean_pct"] == pytest.approx((0.2 * 1 + 1.5 * 90 + 0.8 * 97) / 3)
    assert g1["energy_per_step_j"] is None  # counter and power do not cover the window


def test_no_mfu_without_flops_or_peak(gpu_trial) -> None:
    df, steps, markers = gpu_trial
    assert all(g["mfu"] is None for g in summarize(df, steps, markers)["gpus"])
    assert all(g["mfu"] is None for g in summarize(df, steps, markers, model_flops_per_step=1e15)["gpus"])


# ------------------------------------------------------------------------------------ framework phases
def test_verl_timings_are_laid_out_inside_each_step() -> None:
    def step(n: int, end: float) -> dict:
        return {
            "step": n,
            "t_mono_s": end,
            "values": {
                "timing_s/step": 10.0,
                "timing_s/gen": 4.0,
                "timing_s/reward": 0.5,
                "timing_s/old_log_prob": 1.0,
                "timing_s/ref": 0.5,
                "timing_s/adv": 0.1,
                "timing_s/update_actor": 3.0,
                "timing_s/update_weights": 0.4,
                "timing_s/testing": 0.0,
            },
        }

    steps = [step(1, 110.0), step(2, 121.0), step(3, 132.0)]  # 1 s between steps (logging, dataloader)
    phases = summarize(None, steps, [])["phases"]
    assert phases["source"] == "framework"
    # window (110, 132]: two steps of 10 s + 1 s gap each; other = reward + adv + rest + gaps
    assert phases["seconds"] == pytest.approx(
        {"rollout": 8.0, "train": 9.0, "weight_sync": 0.8, "other": 4.2}
    )
    assert sum(phases["share"].values()) == pytest.approx(1.0)
    assert phases["gpu_idle_share_by_phase"] == {p: None for p in PHASES}  # no GPU rows
    intervals = phase_intervals(steps, [], None)
    two = [
        (i["phase"], round(i["t0_mono_s"], 6), round(i["t1_mono_s"], 6)) for i in intervals if i["step"] == 2
    ]
    assert two == [
        ("other", 110.0, 111.0),
        ("rollout", 111.0, 115.0),
        ("other", 115.0, 115.5),
        ("train", 115.5, 117.0),
        ("other", 117.0, 117.1),
        ("train", 117.1, 120.1),
        ("weight_sync", 120.1, 120.5),
        ("other", 120.5, 121.0),
    ]


# ------------------------------------------------------------------------------------ recorded CPU run
def test_recorded_cpu_run_summary_and_marker_split() -> None:
    df, steps, markers = _load("cpu_trial")
    s = summarize(df, steps, markers)
    json.dumps(s, allow_nan=False)
    assert s["gpus"] == [] and s["steps"] == 6
    assert s["sample_rate_hz"] == pytest.approx(10.0, rel=0.1)
    assert s["host"]["cpu_cores"] >= 1 and s["host"]["peak_rss_bytes"] > 100e6  # torch is loaded
    assert 10 < s["host"]["cpu_mean_pct"] <= 100 * s["host"]["cpu_cores"]
    assert s["phases"]["source"] == "markers"

    # the answer, computed independently from the markers of steps 2..6 (the window):
    # weight_sync inside rollout inside train; "other" is the rest of the window
    def span(step: int, name: str) -> float:
        begin = next(m for m in markers if m["step"] == step and m["phase"] == name and m["event"] == "begin")
        end = next(m for m in markers if m["step"] == step and m["phase"] == name and m["event"] == "end")
        return end["t_mono_s"] - begin["t_mono_s"]

    window = steps[-1]["t_mono_s"] - steps[0]["t_mono_s"]
    sync = sum(span(k, "weight_sync") for k in range(2, 7))
    rollout = sum(span(k, "rollout") for k in range(2, 7)) - sync
    train = sum(span(k, "train") for k in range(2, 7)) - rollout - sync
    expected = {
        "weight_sync": sync,
        "rollout": rollout,
        "train": train,
        "other": window - sync - rollout - train,
    }
    assert s["phases"]["seconds"] == pytest.approx(expected, abs=1e-6)
    assert s["phases"]["share"]["rollout"] == pytest.approx(rollout / window)


def test_a_cpu_run_without_markers_has_no_phase_split() -> None:
    df, steps, _ = _load("cpu_trial")
    phases = summarize(df, steps, [])["phases"]
    assert phases["source"] == "none" and phases["seconds"]["train"] is None
    assert phase_intervals(steps, [], df) == []


@dataclass
class _StepRecord:  # the attributes of autotune.records.StepMetrics
    step: int
    t_mono_s: float
    duration_s: float | None = None
    values: dict = field(default_factory=dict)


def test_step_objects_are_accepted_like_dicts(gpu_trial) -> None:
    df, steps, markers = gpu_trial
    objects = [_StepRecord(s["step"], s["t_mono_s"]) for s in steps]
    assert summarize(df, objects, markers) == summarize(df, steps, markers)


def test_host_load_columns_are_summarized_over_the_steady_window_and_absent_from_older_files(
    tmp_path: Path,
) -> None:
    # the recorded CPU run predates the columns: they read as unknown, not as zero
    df, steps, markers = _load("cpu_trial")
    assert df["other_cpu_cores"].isna().all() and df["load_avg_1m"].isna().all()
    old = summarize(df, steps, markers)["host"]
    assert old["other_busy_cores_mean"] is None and old["load_avg_1m_mean"] is None
    assert old["host_cpu_count"] is None
    # a new one: 1.5 cores busy elsewhere before the first step ends (start-up, outside the window),
    # then 0.5 during the steps; the window's time-weighted mean is 0.5
    rows = [
        {
            "t_mono_s": t,
            "t_wall_s": 1000 + t,
            "source": "host",
            "device": -1,
            "other_cpu_cores": 1.5 if t < 2.0 else 0.5,
            "load_avg_1m": 3.0,
            "host_cpu_count": 2.0,
        }
        for t in [x / 10 for x in range(0, 61)]
    ]
    path = tmp_path / "timeline.parquet"
    write_timeline(path, rows)
    steps = [{"step": k, "t_mono_s": 2.0 + k} for k in range(0, 4)]
    host = summarize(read_timeline(path), steps, [])["host"]
    assert host["other_busy_cores_mean"] == pytest.approx(0.5)
    assert host["load_avg_1m_mean"] == pytest.approx(3.0) and host["host_cpu_count"] == 2
