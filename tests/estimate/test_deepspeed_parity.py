"""Model-state numbers against DeepSpeed's own estimators (skipped when deepspeed is absent).

What DeepSpeed's ``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_model_states_mem_needs``
call model states, in autotune's terms:

- per GPU: ``policy_weights + gradients + optimizer_states`` of the estimate's ``train`` phase
  (:attr:`ModelStates.gpu_bytes`). Under ZeRO-3 the same sum holds in every phase: DeepSpeed keeps
  its gradient partitions in one flat buffer allocated once (``grad_partitions_flat_buffer``), so the
  rollout and the weight sync hold them too. ZeRO-1/2 free theirs after the optimizer step.
- on the CPU, with optimizer offload: :attr:`ModelStates.host_bytes`, which the estimate's
  ``host_bytes`` adds to what every rank's process holds. Without offload DeepSpeed's CPU figure is
  what loading an fp32 model in every process takes (``4·P·GPUs·1.5``); the frameworks load bf16
  weights, and autotune does not count that transient.
- ZeRO-0 is DeepSpeed's ZeRO-2 figure on one GPU (nothing partitioned); ZeRO-1, for which DeepSpeed
  has no estimator, is its ZeRO-2 figure with the bf16 gradients whole on every GPU.
"""

from __future__ import annotations

import re

import pytest

from autotune.backends import job_shape
from autotune.backends.swift.config import preset_for
from autotune.estimate import estimate_memory, find_gpu, find_model, model_states
from autotune.estimate.memory import HOST_RANK_BYTES

pytestmark = pytest.mark.deepspeed

stage_1_and_2 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")

MODELS = ["Qwen2.5-0.5B", "Qwen2-7B", "Qwen3-8B", "Qwen2.5-32B", "Llama-3.1-70B", "Qwen2.5-72B"]
GPUS = [1, 2, 4, 8]


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("n_gpus", GPUS)
@pytest.mark.parametrize("offload", [False, True])
def test_zero2_matches_deepspeed(name: str, n_gpus: int, offload: bool) -> None:
    spec = find_model(name)
    assert spec is not None
    ds_cpu, ds_gpu = stage_1_and_2.estimate_zero2_model_states_mem_needs(
        total_params=spec.params, num_gpus_per_node=n_gpus, cpu_offload=offload
    )
    ours = model_states(
        params=spec.params,
        largest_layer_params=spec.largest_layer_params,
        n_gpus=n_gpus,
        zero_stage=2,
        deepspeed=True,
        offload_optimizer=offload,
        offload_param=False,
    )
    assert ours.gpu_bytes == ds_gpu
    if offload:
        assert ours.host_bytes == ds_cpu


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("n_gpus", GPUS)
@pytest.mark.parametrize(
    ("offload_optimizer", "offload_param"), [(False, False), (True, False), (True, True)]
)
def test_zero3_matches_deepspeed(
    name: str, n_gpus: int, offload_optimizer: bool, offload_param: bool
) -> None:
    spec = find_model(name)
    assert spec is not None
    ds_cpu, ds_gpu, _ = stage3.estimate_zero3_model_states_mem_needs(
        total_params=spec.params,
        largest_layer_params=spec.largest_layer_params,
        num_gpus_per_node=n_gpus,
        cpu_offload=offload_optimizer,
        cpu_offload_params=offload_param,
        zero_init=True,
    )
    ours = model_states(
        params=spec.params,
        largest_layer_params=spec.largest_layer_params,
        n_gpus=n_gpus,
        zero_stage=3,
        deepspeed=True,
        offload_optimizer=offload_optimizer,
        offload_param=offload_param,
    )
    assert ours.gpu_bytes == ds_gpu
    if offload_optimizer:
        assert ours.host_bytes == ds_cpu


_ROW = re.compile(r"^\s*([\d.]+)GB \|\s*([\d.]+)GB \| (.*)$")


def _table(text: str) -> list[tuple[float, float, str]]:
    return [(float(m[1]), float(m[2]), m[3]) for line in text.splitlines() if (m := _ROW.match(line))]


def test_printed_zero3_table_matches(capsys: pytest.CaptureFixture[str]) -> None:
    """The `_all_cold` helper users know, parsed from what it prints (7.6B, 4 GPUs)."""
    spec = find_model("Qwen2-7B")
    assert spec is not None
    stage3.estimate_zero3_model_states_mem_needs_all_cold(spec.params, spec.largest_layer_params, 4, 1)
    rows = _table(capsys.readouterr().out)
    assert len(rows) == 6
    for cpu_gib, gpu_gib, options in rows:
        if "zero_init=0" in options:
            continue
        off_param = "offload_param=none" not in options
        off_opt = "offload_optimizer=none" not in options
        ours = model_states(
            params=spec.params,
            largest_layer_params=spec.largest_layer_params,
            n_gpus=4,
            zero_stage=3,
            deepspeed=True,
            offload_optimizer=off_opt,
            offload_param=off_param,
        )
        assert round(ours.gpu_bytes / 2**30, 2) == gpu_gib
        if off_opt:
            assert round(ours.host_bytes / 2**30, 2) == cpu_gib
    # the reference's numbers (cpu-trials.md): full offload 2.03 GB per GPU, optimizer offload 5.57/5.58
    assert any(g == 2.03 for _, g, o in rows if "offload_param=none" not in o)


def test_printed_zero2_table_matches(capsys: pytest.CaptureFixture[str]) -> None:
    spec = find_model("Qwen2.5-14B")
    assert spec is not None
    stage_1_and_2.estimate_zero2_model_states_mem_needs_all_cold(spec.params, 8, 1)
    rows = _table(capsys.readouterr().out)
    assert len(rows) == 2
    for cpu_gib, gpu_gib, options in rows:
        off = "offload_optimizer=none" not in options
        ours = model_states(
            params=spec.params,
            largest_layer_params=spec.largest_layer_params,
            n_gpus=8,
            zero_stage=2,
            deepspeed=True,
            offload_optimizer=off,
            offload_param=False,
        )
        assert round(ours.gpu_bytes / 2**30, 2) == gpu_gib
        if off:
            assert round(ours.host_bytes / 2**30, 2) == cpu_gib


JOB = {"global_batch": 64, "num_generations": 8, "max_prompt_length": 512, "max_completion_length": 1024}
STATES = ("policy_weights", "gradients", "optimizer_states")
#: (ZeRO stage, optimizer offload, parameter offload): every combination DeepSpeed estimates
COMBOS = [(0, False, False), (1, False, False), (2, False, False), (2, True, False)] + [
    (3, False, False),
    (3, True, False),
    (3, True, True),
]


def _deepspeed(p: int, largest: int, n: int, stage: int, off_opt: bool, off_param: bool) -> tuple[int, int]:
    """DeepSpeed's (CPU, GPU) model-state bytes for the combination (see the module docstring)."""
    if stage == 3:
        cpu, gpu, _ = stage3.estimate_zero3_model_states_mem_needs(
            total_params=p,
            largest_layer_params=largest,
            num_gpus_per_node=n,
            cpu_offload=off_opt,
            cpu_offload_params=off_param,
            zero_init=True,
        )
        return cpu, gpu
    cpu, gpu = stage_1_and_2.estimate_zero2_model_states_mem_needs(
        total_params=p, num_gpus_per_node=1 if stage == 0 else n, cpu_offload=off_opt
    )
    if stage == 1:
        gpu += 2 * p - int(2 * p / n)  # bf16 gradients are not partitioned at stage 1
    return cpu, gpu


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("n_gpus", GPUS)
@pytest.mark.parametrize(("stage", "off_opt", "off_param"), COMBOS)
def test_the_estimate_holds_deepspeeds_model_states(
    name: str, n_gpus: int, stage: int, off_opt: bool, off_param: bool
) -> None:
    """Through the whole estimator (a backend's decoder, JobShape, estimate_memory): what plan reports."""
    spec, gpu = find_model(name), find_gpu("H100")
    assert spec is not None and gpu is not None
    preset = preset_for(stage, off_opt, off_param)
    if preset is not None:  # ms-swift's DeepSpeed presets (its zero0 is DeepSpeed at stage 0)
        knobs: dict[str, object] = {"deepspeed": preset, "dataloader_num_workers": 0}
        shape = job_shape("swift", knobs, {}, {**JOB, "beta": 0.0}, spec, n_gpus)
    else:  # ZeRO-3 with the optimizer offloaded alone: TRL's knobs
        knobs = {"zero_stage": stage, "offload_optimizer": off_opt, "offload_param": off_param}
        shape = job_shape("trl", knobs, {}, JOB, spec, n_gpus)
    assert (shape.deepspeed, shape.zero_stage, shape.ds_offload_optimizer, shape.ds_offload_param) == (
        True,
        stage,
        off_opt,
        off_param,
    )
    est = estimate_memory(shape, gpu)
    ds_cpu, ds_gpu = _deepspeed(spec.params, spec.largest_layer_params, n_gpus, stage, off_opt, off_param)
    train = sum(est.phases["train"][k] for k in STATES)
    # stage 1 adds 2P - int(2P/N) to an int(18P/N) term: one byte of rounding either way
    assert abs(train - ds_gpu) <= (1 if stage == 1 else 0)
    if stage == 3:  # every phase, the peak's components included (plan --json shows those)
        for phase in est.phases.values():
            assert sum(phase[k] for k in STATES) == train
        assert sum(est.components_bytes[k] for k in STATES) == train
    if off_opt:
        assert est.host_bytes == ds_cpu + n_gpus * HOST_RANK_BYTES
