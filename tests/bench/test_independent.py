"""The independent surfaces of the search-efficiency bench: a world that owes nothing to the estimator.

Narrowed spaces keep the decoded tables to a few hundred rows, so this runs in seconds.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import math
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import search_efficiency as se  # noqa: E402
from _adversarial import MIN_DISTANCE, AdversarialSurface, knob_distance  # noqa: E402
from _independent import ConfigTable, IndependentSurface  # noqa: E402
from _settings import FAILED_PHASES, SETTINGS, STEP_PHASES, Setting, Truth  # noqa: E402

from autotune.records import TrialSpec, TrialStatus  # noqa: E402
from autotune.studydir import StudyDir  # noqa: E402

SEEDS = (100, 101, 102, 103)


def _setting(name: str) -> Setting:
    return next(s for s in SETTINGS if s.name == name)


def _table(setting: Setting, tmp: Path) -> ConfigTable:
    return ConfigTable(setting, setting.space(), setting.make_backend(), setting.context(tmp / "ctx" / "0"))


@pytest.fixture(scope="module")
def trl(tmp_path_factory: pytest.TempPathFactory) -> ConfigTable:
    """TRL Qwen2.5-3B on 4 x A10, every knob but a few values (~1000 rows)."""
    setting = replace(
        _setting("trl Qwen2.5-3B full 4xA10"),
        narrow={
            "per_device_train_batch_size": (2, 4, 8),
            "dataloader_num_workers": (0, 2),
            "vllm_gpu_memory_utilization": (0.3, 0.35, 0.5, 0.7),  # 0.35: the baseline's
            "vllm_tensor_parallel_size": (1, 2, 4),
        },
    )
    return _table(setting, tmp_path_factory.mktemp("trl"))


@pytest.fixture(scope="module")
def swift(tmp_path_factory: pytest.TempPathFactory) -> ConfigTable:
    """ms-swift Qwen2.5-7B LoRA on 4 x RTX 4090, colocated vLLM, a corner of the space (~900 rows)."""
    setting = _setting("swift Qwen2.5-7B LoRA 4xRTX4090")
    setting = replace(
        setting,
        narrow={
            **setting.narrow,
            "use_vllm": (True,),
            "per_device_train_batch_size": (2, 8),
            "dataloader_num_workers": (1,),
            "deepspeed": ("zero2", "zero3"),
            "vllm_gpu_memory_utilization": (0.3, 0.5, 0.7),
            "vllm_tensor_parallel_size": (2, 4),
            "vllm_max_num_seqs": (256,),
            "move_model_batches": (None, 8),
        },
    )
    return _table(setting, tmp_path_factory.mktemp("swift"))


def _all_params(table: ConfigTable) -> list[dict]:
    return [
        {**core, "dataloader_num_workers": w} if table.has_workers else dict(core)
        for core in table.configs
        for w in table.worker_values
    ]


World = tuple[IndependentSurface, list[tuple[dict, Truth]]]


@pytest.fixture(scope="module")
def world(trl: ConfigTable, swift: ConfigTable) -> Callable[[str, int], World]:
    """A surface and the truth of every configuration of it, built once per (table, seed)."""
    tables = {"trl": trl, "swift": swift}

    @functools.cache
    def build(which: str, seed: int) -> World:
        surface = IndependentSurface(tables[which], seed)
        return surface, [(p, surface.truth(p)) for p in _all_params(tables[which])]

    return build


def test_surfaces_are_deterministic_per_seed_and_differ_between_seeds(
    trl: ConfigTable, world: Callable[[str, int], World]
) -> None:
    a, truths = world("trl", SEEDS[0])
    b = IndependentSurface(trl, SEEDS[0])
    assert [b.truth(p) for p, _ in truths] == [t for _, t in truths]
    assert a.optimum() == b.optimum()
    # another seed is another world: speeds, start-up costs and failure regions all move
    _, other = world("trl", SEEDS[1])
    assert all(t.step_s != u.step_s for (_, t), (_, u) in zip(truths, other, strict=True))
    assert [t.status for _, t in truths] != [u.status for _, u in other]


@pytest.mark.parametrize("which", ["trl", "swift"])
def test_the_optimum_beats_every_configuration(which: str, world: Callable[[str, int], World]) -> None:
    for seed in SEEDS:
        surface, truths = world(which, seed)
        best, optimum, info = surface.optimum()
        assert surface.usable_throughput(best) == pytest.approx(optimum)
        for params, _ in truths:
            assert surface.usable_throughput(params) <= optimum * (1 + 1e-9)
        assert 0 < info["usable_frac"] < 1


@pytest.mark.parametrize("which", ["trl", "swift"])
def test_some_configurations_fail_and_some_succeed(which: str, world: Callable[[str, int], World]) -> None:
    statuses: set[TrialStatus] = set()
    for seed in SEEDS:
        _, truths = world(which, seed)
        seen = {t.status for _, t in truths if t.valid}
        assert TrialStatus.COMPLETE in seen and len(seen) > 1, f"seed {seed}: {seen}"
        statuses |= seen
    assert {TrialStatus.OOM, TrialStatus.VLLM_INIT} <= statuses


@pytest.mark.parametrize("which", ["trl", "swift"])
def test_phases_sum_to_the_step_and_failures_name_their_phase(
    which: str, world: Callable[[str, int], World]
) -> None:
    phases_failed: set[str] = set()
    for seed in SEEDS:
        surface, truths = world(which, seed)
        for _, t in truths:
            assert set(t.phases) == set(STEP_PHASES)
            assert all(v >= 0 for v in t.phases.values())
            assert math.fsum(t.phases.values()) == pytest.approx(t.step_s, rel=1e-9)
            assert t.throughput == pytest.approx(surface.setting.global_batch / t.step_s)
            if t.status is TrialStatus.COMPLETE:
                assert t.failed_phase is None
            else:
                assert t.failed_phase in FAILED_PHASES
                phases_failed.add(t.failed_phase)
            if t.status is TrialStatus.VLLM_INIT:
                assert t.failed_phase == "startup"
    assert "startup" in phases_failed and phases_failed - {"startup"}  # failures at start-up and in a step


@pytest.mark.parametrize("module", ["_independent.py", "_adversarial.py", "_phase_additive.py"])
def test_the_independent_world_does_not_import_the_estimator(module: str) -> None:
    tree = ast.parse((BENCH / module).read_text())
    imported: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            imported.append(node.module or "")
            imported += [f"{node.module}.{alias.name}" for alias in node.names]
    assert imported  # the walk saw the module's imports
    assert not [m for m in imported if m.startswith("autotune.estimate") or m == "autotune.estimate"]
    assert "_surfaces" not in imported  # nor through the estimator-derived surfaces


# --- the same at run time: which functions of autotune.estimate run while a world is built and used
#
# The import check above cannot see an indirect call (``_settings`` imports the catalog, so the whole
# estimate package is loaded in the bench's process). This traces every Python call while each
# estimator-free surface family is built and evaluated; only the GPU/model catalog may answer.

ALLOWED_ESTIMATE_MODULES = ("autotune.estimate.catalog",)


@contextlib.contextmanager
def _estimator_calls() -> Iterator[list[str]]:
    """Every call into ``autotune.estimate`` outside the catalog while the block runs, as module:function."""
    seen: list[str] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if module.startswith("autotune.estimate") and module not in ALLOWED_ESTIMATE_MODULES:
            seen.append(f"{module}:{frame.f_code.co_name}")

    previous = sys.getprofile()
    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(previous)
        threading.setprofile(None)  # type: ignore[arg-type]


def _surface_kinds() -> dict[str, Callable[[ConfigTable, int], Any]]:
    """The bench's world of each kind of surface (its registry when it has one)."""
    return dict(getattr(se, "SURFACE_KINDS", {"independent": IndependentSurface}))


ESTIMATOR_FREE = [s for s in SETTINGS if s.kind != "estimator"]


def _small(setting: Setting) -> Setting:
    """The setting around its baseline: each knob of the baseline at its value and the next one up (the
    next down at the top), every other knob at its default: a few hundred rows at most."""
    space = setting.space()
    keep: dict[str, tuple[Any, ...]] = {}
    for name in space.names:
        values = list(space[name].values())
        base = setting.baseline.get(name)
        if base in values and len(values) > 1:
            at = values.index(base)
            keep[name] = (base, values[at + 1] if at + 1 < len(values) else values[at - 1])
        else:
            keep[name] = (space[name].default,)
    return replace(setting, narrow=keep)


def test_every_estimator_free_surface_family_is_guarded() -> None:
    kinds = _surface_kinds()
    assert {s.kind for s in ESTIMATOR_FREE} >= {"independent"}
    missing = {s.kind for s in ESTIMATOR_FREE} - set(kinds)
    assert not missing, f"surface kinds with no world to trace: {missing}"


def test_the_tracer_sees_an_estimator_call() -> None:
    # the guard below can fail: a call into the estimator is recorded, one into the catalog is not
    from autotune.estimate import estimate_memory, find_gpu

    with _estimator_calls() as seen:
        find_gpu("A10")
        with contextlib.suppress(Exception):
            estimate_memory(None, None)  # type: ignore[arg-type]
    assert "autotune.estimate.memory:estimate_memory" in seen
    assert not [c for c in seen if c.startswith("autotune.estimate.catalog")]


@pytest.mark.parametrize("setting", ESTIMATOR_FREE, ids=lambda s: s.name)
def test_no_estimator_function_runs_while_an_independent_world_is_built_and_used(
    setting: Setting, tmp_path: Path
) -> None:
    small = _small(setting)
    make = _surface_kinds()[setting.kind]
    with _estimator_calls() as seen:
        table = _table(small, tmp_path)
        surface = make(table, SEEDS[0])
        truths = [surface.truth(p) for p in _all_params(table)]
        best, _, _ = surface.optimum()
        _execute(surface, best)
        failing = next((p for p, t in zip(_all_params(table), truths, strict=True) if not t.valid), None)
        if failing is not None:
            _execute(surface, failing, number=2)
    assert truths  # the world was evaluated
    assert sorted(set(seen)) == []


def _execute(surface: IndependentSurface, params: dict, number: int = 1):
    setting = surface.setting
    ctx = setting.context(Path("/nonexistent") / "trials" / str(number))
    ex = se.SimulatedExecutor(surface, setting.n_gpus)
    spec = TrialSpec(number=number, params=params, derived={})
    return ex.execute(spec, ctx, on_step=lambda step, tp, optimistic: None, time_left_s=None)


def test_the_simulated_executor_reports_phases_and_failed_phases(world: Callable[[str, int], World]) -> None:
    surface, truths = world("swift", SEEDS[0])
    best, _, _ = surface.optimum()
    result = _execute(surface, best)
    assert result.status is TrialStatus.COMPLETE and result.failed_phase is None
    summary = result.timeline_summary
    assert summary is not None and summary.steps == result.steps
    window = summary.window
    assert window.steps == result.steady.steady_steps  # type: ignore[union-attr]
    seconds = {p: s or 0.0 for p, s in summary.phases.time_s.items()}
    assert summary.phases.source == "framework" and set(seconds) == set(STEP_PHASES)
    assert math.fsum(seconds.values()) == pytest.approx((window.t1_mono_s or 0) - (window.t0_mono_s or 0))
    truth = surface.truth(best)
    for phase in STEP_PHASES:  # per-step noise, the truth's split on average
        assert seconds[phase] / (window.steps or 1) == pytest.approx(truth.phases[phase], rel=0.1, abs=0.05)
    failing = next(p for p, t in truths if t.status is TrialStatus.OOM)
    oom = _execute(surface, failing)
    assert oom.status is TrialStatus.OOM and oom.reason == "CUDA out of memory"
    assert oom.failed_phase == surface.truth(failing).failed_phase in ("rollout", "train", "weight_sync")
    assert oom.timeline_summary is None and oom.steady is None


def test_studies_on_an_independent_surface_run_end_to_end(trl: ConfigTable, tmp_path: Path) -> None:
    setting = trl.setting
    space = setting.space()
    failures = completes = 0
    for strategy in ("autotune", "random"):
        m = se.run_one(strategy, setting, space, trl, 101, 12, tmp_path)
        assert m.kind == "independent" and 0 < m.trials_used <= 12
        assert 0.0 <= m.regret_at_12 <= 1.0 and 0.0 <= m.final_regret <= 1.0
        for r in StudyDir(tmp_path / f"{strategy}-101").results():
            if r.steady is not None:
                assert r.timeline_summary is not None
                assert math.fsum(s or 0.0 for s in r.timeline_summary.phases.time_s.values()) > 0
                completes += r.status is TrialStatus.COMPLETE
            if r.status.is_failure:
                assert r.failed_phase in FAILED_PHASES
                failures += 1
            else:
                assert r.failed_phase is None
    assert completes and failures


def _level_medians(surface: IndependentSurface, knob: str) -> dict[int, float]:
    """Median step time of the usable configurations at each level of ``knob`` (one data-loader setting)."""
    table = surface.table
    ev = surface._evaluate(table.worker_values[0])
    usable = surface._usable(ev)
    idx = table.knob_idx[knob]
    return {
        int(lv): float(np.median(ev["step"][usable & (idx == lv)]))
        for lv in set(idx[usable].tolist())
        if lv >= 0
    }


def test_an_adversarial_world_reverses_a_high_impact_knob_and_moves_the_optimum_away(
    trl: ConfigTable,
) -> None:
    """The level the plain world finds slowest becomes the fastest; the optimum is 3+ knobs from the
    baseline; some seeds' baseline fails at start-up; the plain world of the same seed is untouched."""
    baseline = trl.space.active(dict(trl.setting.baseline))
    failing = 0
    far = 0
    for seed in range(100, 110):
        plain, adversarial = IndependentSurface(trl, seed), AdversarialSurface(trl, seed)
        assert adversarial.reversed
        for knob, value in adversarial.reversed.items():
            promoted = trl.knob_values[knob].index(value)
            before, after = _level_medians(plain, knob), _level_medians(adversarial, knob)
            assert max(before, key=before.__getitem__) == promoted  # slowest in the plain world ...
            assert min(after, key=after.__getitem__) == promoted  # ... fastest in the adversarial one
        best, _, _ = adversarial.optimum()
        far += knob_distance(best, baseline) >= MIN_DISTANCE
        failing += adversarial.truth(baseline).status is TrialStatus.VLLM_INIT
    assert far >= 8 and 0 < failing < 10
