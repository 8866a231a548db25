"""``autotune plan``: each candidate's predicted step time beside its physical ceiling (table and JSON),
from the catalog's peaks or from this machine's measured ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.cli.app import main
from autotune.estimate import MeasuredPeaks, PeakBasis, find_gpu, machine_id, step_ceiling, store_peaks

TRL_SPACE = str(Path(__file__).parents[1] / "estimate" / "data" / "trl_small.yaml")
ARGS = ("--gpus", "4", "--gpu-type", "H100", "--model", "Qwen2-7B", "--space", TRL_SPACE)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(["plan", *args])
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def test_json_carries_each_candidates_ceiling(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))  # no measured peaks: the catalog's
    code, out, err = run(capsys, *ARGS, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["ceiling_basis"]["source"] == "catalog" and data["ceiling_basis"]["device"] == "H100"
    assert any("ceilings from catalog peaks of H100" in n for n in data["notes"])
    assert data["candidates"]
    for c in data["candidates"]:
        ceiling = c["ceiling"]
        assert 0 < ceiling["step_s"] <= c["time"]["total_s"]
        assert c["ceiling_fraction"] == pytest.approx(ceiling["step_s"] / c["time"]["total_s"])
        assert set(ceiling) >= {
            "rollout_s",
            "rollout_prefill_s",
            "rollout_decode_s",
            "train_s",
            "weight_sync_s",
        }


def test_the_plans_ceilings_are_the_one_trial_ceilings() -> None:
    from autotune.app.plan import run_plan

    result, _ = run_plan(
        model="Qwen2-7B", model_config=None, gpus=4, gpu_type="H100", gpu_memory_gib=None, backend="trl",
        space_path=TRL_SPACE, global_batch=64, num_generations=8, max_completion_length=1024,
        max_prompt_length=512, beta=0.04, lora_rank=0, vllm_max_model_len=None, knobs=[], margin=0.15,
    )  # fmt: skip
    gpu = find_gpu("H100")
    assert gpu is not None
    for c in result.candidates[:: max(1, len(result.candidates) // 12)]:
        assert c.ceiling is not None
        one = step_ceiling(c.shape, PeakBasis.from_gpu(gpu))
        assert c.ceiling.phase_s() == pytest.approx(one.phase_s(), rel=1e-12)
        assert c.ceiling.step_s == pytest.approx(one.step_s, rel=1e-12)


def test_measured_peaks_replace_the_catalogs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    name = "NVIDIA H100 80GB HBM3"
    store_peaks(
        MeasuredPeaks(name, 7e14, 2.9e12, 5.0e10, 3.6e11, 4, machine_id((name,) * 4), "2026-01-01T00:00Z")
    )
    code, out, err = run(capsys, *ARGS, "--json")
    assert code == 0, err
    data = json.loads(out)
    basis = data["ceiling_basis"]
    assert (basis["source"], basis["flops_per_s"], basis["peer_bytes_per_s"]) == ("measured", 7e14, 3.6e11)
    assert all(c["ceiling"]["basis"]["source"] == "measured" for c in data["candidates"])


def test_table_shows_step_and_ceiling(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    code, out, err = run(capsys, *ARGS, "--top", "3")
    assert code == 0, err
    header = next(line for line in out.splitlines() if line.startswith("#"))
    assert "step s" in header and "ceiling s" in header
    assert "ceiling s: the least time the step could take" in out
