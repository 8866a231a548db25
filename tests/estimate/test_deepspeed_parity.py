"""Model-state numbers against DeepSpeed's own estimators (skipped when deepspeed is absent)."""

from __future__ import annotations

import re

import pytest

from autotune.estimate import find_model, model_states

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
