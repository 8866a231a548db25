"""The environment every GPU trial gets, one mechanism for every backend (``Backend.trial_env``).

- GPU trials number GPUs as NVML does (``CUDA_DEVICE_ORDER=PCI_BUS_ID``; review #13);
- trials whose DeepSpeed optimizer lives on the CPU get ``OMP_NUM_THREADS = max(1, cores // world)``
  on GPUs too, and the exported job keeps it (review #10);
- trials whose vLLM sleeps run without ``expandable_segments:True``, which vLLM's sleep-mode allocator
  refuses (review #6);
- a verl trial starts a Ray cluster of its own (``RAY_ADDRESS=local``; review #3).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autotune.backends import Backend
from autotune.backends._env import usable_cores, without_expandable_segments
from autotune.backends.command import CommandBackend
from autotune.backends.trl.backend import TrlBackend
from autotune.backends.verl.backend import VerlBackend
from autotune.records import GpuInfo, LaunchPlan, TrialSpec
from autotune.trial.launch import child_env as _child_env
from tests.backends import test_command as command_t
from tests.backends.test_swift import test_swift_backend as swift_t
from tests.backends.test_trl import test_trl_backend as trl_t
from tests.backends.test_verl import test_verl_backend as verl_t

ALLOC = "PYTORCH_CUDA_ALLOC_CONF"


def _plan(backend: Backend, ctx: Any, params: dict[str, Any]) -> LaunchPlan:
    return backend.render(TrialSpec(number=1, params=params, derived=backend.derive(params, ctx)), ctx)


def _trl(tmp_path: Path, **params: Any) -> LaunchPlan:
    base = {"per_device_train_batch_size": 4, "use_vllm": False, "zero_stage": 0}
    return _plan(TrlBackend(), trl_t.make_ctx(tmp_path, gpus=2), {**base, **params})


def _swift(tmp_path: Path, **params: Any) -> LaunchPlan:
    ctx = swift_t.make_ctx(tmp_path, gpus=4, model="Qwen2.5-7B-Instruct")
    return swift_t.render(swift_t.backend(), {**swift_t.GPU_KNOBS, **params}, ctx)


def _verl(tmp_path: Path, **params: Any) -> LaunchPlan:
    backend = VerlBackend(python="python3")
    return _plan(backend, verl_t.make_ctx(tmp_path, gpus=4), {**verl_t.baseline(backend), **params})


def _command(tmp_path: Path, **params: Any) -> LaunchPlan:
    gpus = tuple(GpuInfo(index=i, name="H100", memory_total_bytes=80 * 2**30) for i in (2, 5))
    return CommandBackend(["python", "t.py"]).render(
        TrialSpec(number=0, params=params), command_t.ctx_for(tmp_path, gpus=gpus)
    )


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OMP_NUM_THREADS", ALLOC, "CUDA_DEVICE_ORDER", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("render", [_trl, _swift, _verl, _command], ids=["trl", "swift", "verl", "command"])
def test_every_gpu_trial_numbers_gpus_as_nvml_does(tmp_path: Path, render: Any) -> None:
    plan = render(tmp_path)
    assert plan.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert plan.env["CUDA_VISIBLE_DEVICES"]


def test_a_cpu_trial_sets_no_gpu_order(tmp_path: Path) -> None:
    plan = _plan(
        TrlBackend(), trl_t.make_ctx(tmp_path), {"per_device_train_batch_size": 4, "use_vllm": False}
    )
    assert "CUDA_DEVICE_ORDER" not in plan.env


def test_cpu_adam_gets_the_cores_of_its_rank_on_gpus(tmp_path: Path) -> None:
    offload = _trl(tmp_path / "off", zero_stage=2, offload_optimizer=True)
    assert offload.env["OMP_NUM_THREADS"] == str(max(1, usable_cores() // 2))
    swift = _swift(tmp_path / "swift", deepspeed="zero3_offload")
    assert swift.env["OMP_NUM_THREADS"] == str(max(1, usable_cores() // 4))
    # no CPU Adam, no thread setting: torchrun's own default holds
    assert "OMP_NUM_THREADS" not in _trl(tmp_path / "plain", zero_stage=2).env


def test_a_users_thread_count_holds_and_is_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert _trl(tmp_path, zero_stage=3, offload_optimizer=True).env["OMP_NUM_THREADS"] == "3"


def test_the_exported_job_keeps_the_threads_and_the_order(tmp_path: Path) -> None:
    from autotune.export._job import trial_environment

    plan = _trl(tmp_path, zero_stage=2, offload_optimizer=True)

    class _W:
        launch = plan

    kept = trial_environment(_W())  # type: ignore[arg-type]
    assert kept["OMP_NUM_THREADS"] == plan.env["OMP_NUM_THREADS"]
    assert kept["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    swift = _swift(tmp_path / "swift", deepspeed="zero3_offload")
    _W.launch = swift
    assert trial_environment(_W())["OMP_NUM_THREADS"] == swift.env["OMP_NUM_THREADS"]  # type: ignore[arg-type]


def test_expandable_segments_are_dropped_and_the_rest_kept() -> None:
    assert without_expandable_segments("expandable_segments:True,max_split_size_mb:128") == (
        "max_split_size_mb:128"
    )
    assert without_expandable_segments("garbage_collection_threshold:0.6, expandable_segments: true") == (
        "garbage_collection_threshold:0.6"
    )
    assert without_expandable_segments("expandable_segments:False") == "expandable_segments:False"


@pytest.mark.parametrize(
    ("render", "sleeping"),
    [
        (lambda p: _trl(p, use_vllm=True, vllm_enable_sleep_mode=True), True),
        (lambda p: _verl(p), True),  # verl's rollout sleeps by default (free_cache_engine)
        (lambda p: _trl(p, use_vllm=True, vllm_enable_sleep_mode=False), False),
    ],
    ids=["trl-sleep", "verl-default", "trl-awake"],
)
def test_a_sleeping_vllm_never_sees_expandable_segments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, render: Any, sleeping: bool
) -> None:
    monkeypatch.setenv(ALLOC, "expandable_segments:True")
    plan = render(tmp_path / "only")
    env = _child_env(plan, "marker")  # what the trial's processes really get
    if sleeping:
        assert ALLOC not in env and ALLOC in plan.unset_env
    else:
        assert env[ALLOC] == "expandable_segments:True"
    monkeypatch.setenv(ALLOC, "expandable_segments:True,max_split_size_mb:256")
    env = _child_env(render(tmp_path / "more"), "marker")
    assert env[ALLOC] == (
        "max_split_size_mb:256" if sleeping else "expandable_segments:True,max_split_size_mb:256"
    )


def test_a_verl_trial_owns_its_ray_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")  # a cluster the host runs: never the trial's
    plan = _verl(tmp_path)
    assert _child_env(plan, "marker")["RAY_ADDRESS"] == "local"
    argv = dict(a.partition("=")[::2] for a in plan.argv[3:])
    assert argv["+ray_kwargs.ray_init.include_dashboard"] == "false"
    assert int(argv["ray_kwargs.ray_init.num_cpus"]) >= max(usable_cores(), 3 * 4)
