"""Phase-additive worlds (``bench/_phase_additive.py``), and what ``auto-v4`` learns from one.

A narrowed TRL space keeps the decoded table to ~1000 rows, so this runs in seconds.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import search_efficiency as se  # noqa: E402
from _independent import ConfigTable  # noqa: E402
from _phase_additive import PhaseAdditiveSurface  # noqa: E402
from _settings import HEADROOM, SETTINGS, STEP_PHASES, Truth  # noqa: E402

from autotune.records import TrialStatus  # noqa: E402
from autotune.space import canonical_key  # noqa: E402

NARROW = {
    "per_device_train_batch_size": (2, 4, 8, 16),
    "dataloader_num_workers": (0, 2),
    "vllm_gpu_memory_utilization": (0.3, 0.35, 0.5, 0.7),  # 0.35: the baseline's
    "vllm_tensor_parallel_size": (1, 2, 4),
}


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> ConfigTable:
    setting = replace(next(s for s in SETTINGS if s.name == "trl Qwen2.5-3B full 4xA10 phase"), narrow=NARROW)
    tmp = tmp_path_factory.mktemp("phase")
    return ConfigTable(setting, setting.space(), setting.make_backend(), setting.context(tmp / "ctx" / "0"))


@pytest.fixture(scope="module")
def h100(tmp_path_factory: pytest.TempPathFactory) -> ConfigTable:
    """TRL Qwen2.5-7B on 8 x H100: memory enough that the gate admits most of the narrowed space."""
    setting = replace(next(s for s in SETTINGS if s.name == "trl Qwen2.5-7B 8xH100"), narrow=NARROW)
    tmp = tmp_path_factory.mktemp("h100")
    return ConfigTable(setting, setting.space(), setting.make_backend(), setting.context(tmp / "ctx" / "0"))


def _params(table: ConfigTable) -> list[dict[str, Any]]:
    return [{**core, "dataloader_num_workers": w} for core in table.configs for w in table.worker_values]


def test_the_phase_additive_family_is_registered_beside_the_others() -> None:
    assert se.SURFACE_KINDS["phase-additive"] is PhaseAdditiveSurface
    assert "phase-additive" in se.KINDS
    twins = [s for s in SETTINGS if s.kind == "phase-additive"]
    assert len(twins) == len([s for s in SETTINGS if s.kind == "independent"]) >= 4


def test_a_world_is_drawn_per_seed_and_its_phases_sum_to_the_step(table: ConfigTable) -> None:
    a, b, c = PhaseAdditiveSurface(table, 1), PhaseAdditiveSurface(table, 1), PhaseAdditiveSurface(table, 2)
    params = _params(table)
    assert [a.truth(p) for p in params[:50]] == [b.truth(p) for p in params[:50]]
    assert [a.truth(p).step_s for p in params[:50]] != [c.truth(p).step_s for p in params[:50]]
    statuses = set()
    for p in params:
        t = a.truth(p)
        statuses.add(t.status)
        assert set(t.phases) == set(STEP_PHASES) and min(t.phases.values()) >= 0
        assert math.fsum(t.phases.values()) == pytest.approx(t.step_s, rel=1e-9)
    assert TrialStatus.COMPLETE in statuses and len(statuses) > 1  # some of it fails
    best, optimum, info = a.optimum()
    assert a.usable_throughput(best) == pytest.approx(optimum) and 0 < info["usable_frac"] < 1


def test_memory_is_a_monotone_cliff_in_the_batch(table: ConfigTable) -> None:
    for seed in (3, 4, 5):
        surface = PhaseAdditiveSurface(table, seed)
        batches = NARROW["per_device_train_batch_size"]
        for p in _params(table):
            if p["per_device_train_batch_size"] != batches[0]:
                continue
            peaks = [surface.truth({**p, "per_device_train_batch_size": b}).peak_bytes for b in batches]
            assert peaks == sorted(peaks)  # more batch never needs less memory
            ooms = [
                surface.truth({**p, "per_device_train_batch_size": b}).status is TrialStatus.OOM
                for b in batches
            ]
            assert ooms == sorted(ooms)  # once out of memory, out of memory at every larger batch


# ---------------------------------------------------------------- the combination of best levels
#: the four knobs whose best levels make the optimum, and those levels (none an end of its range that
#: the usual physics would favour, and none the baseline's)
BEST = {
    "per_device_train_batch_size": 4,
    "zero_stage": 2,
    "vllm_tensor_parallel_size": 2,
    "vllm_gpu_memory_utilization": 0.5,
}
#: each knob's cost per level, as a factor on its phase (1 at the best level)
COST: dict[str, Mapping[Any, float]] = {
    "per_device_train_batch_size": {2: 1.3, 4: 1.0, 8: 1.2, 16: 1.35},
    "zero_stage": {0: 1.3, 2: 1.0, 3: 1.25},
    "vllm_tensor_parallel_size": {1: 1.3, 2: 1.0, 4: 1.2},
    "vllm_gpu_memory_utilization": {0.3: 1.35, 0.35: 1.3, 0.5: 1.0, 0.7: 1.2},
}


class FourKnobWorld:
    """A phase-additive world with no failures: generation on TP and vLLM's share (and whether vLLM
    is used), training on the micro-batch and ZeRO stage, each knob's cost a factor on its own phase;
    the other knobs cost nothing, so the memory gate's choices among them do not matter."""

    def __init__(self, table: ConfigTable) -> None:
        self.table = table
        self.setting = table.setting
        self.seed = 0
        self.capacity = float(table.setting.gpu_spec().memory_bytes)

    def truth(self, params: Mapping[str, Any]) -> Truth:
        def cost(name: str) -> float:
            return COST[name][params[name]] if name in params else 1.3

        rollout = 6.0 * cost("vllm_tensor_parallel_size") * cost("vllm_gpu_memory_utilization")
        rollout *= 1.0 if params.get("use_vllm") else 3.0
        train = 5.0 * cost("per_device_train_batch_size") * cost("zero_stage")
        other = 1.0 + (0.5 if params.get("dataloader_num_workers", 0) == 0 else 0.0)
        phases = {"rollout": rollout, "train": train, "weight_sync": 1.0, "other": other}
        step = sum(phases.values())
        return Truth(
            status=TrialStatus.COMPLETE,
            reason="completed",
            throughput=self.setting.global_batch / step,
            step_s=step,
            startup_s=60.0,
            peak_bytes=int(0.6 * self.capacity),
            valid=True,
            phases=phases,
        )

    def usable_throughput(self, params: Mapping[str, Any]) -> float:
        t = self.truth(params)
        return t.throughput if t.peak_bytes <= HEADROOM * self.capacity else 0.0

    def optimum(self) -> tuple[dict[str, Any], float, dict[str, float]]:
        best = max(_params(self.table), key=self.usable_throughput)
        return best, self.usable_throughput(best), {"usable_frac": 1.0}


def _has_best(params: Mapping[str, Any]) -> bool:
    return all(canonical_key({"v": params.get(k)}) == canonical_key({"v": v}) for k, v in BEST.items())


def test_auto_v4_runs_the_combination_of_best_levels_never_measured_together(
    h100: ConfigTable, tmp_path: Path
) -> None:
    table = h100
    world = FourKnobWorld(table)
    best, _, _ = world.optimum()
    assert _has_best(best)  # the optimum is the combination of the four best levels
    setting = table.setting
    outcome, _ = se.run_study("autotune-v4", setting, setting.space(), world, 0, 12, tmp_path)
    runs = sorted((r for r in outcome.results if r.steps > 0), key=lambda r: r.number)[:12]
    screening = [r for r in runs if (r.choice or {}).get("mode") == "screen"]
    assert screening  # the study screened ...
    assert not [
        r for r in screening if _has_best(r.params)
    ]  # ... and never ran the four best levels together
    combined = [r for r in runs if _has_best(r.params)]
    assert combined, [
        (r.number, (r.choice or {}).get("mode"), {k: r.params.get(k) for k in BEST}) for r in runs
    ]
