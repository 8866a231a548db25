"""verl through the estimator and ``plan``, and ``search`` refusing a machine without a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autotune.backends import job_shape
from autotune.backends.verl.config import DYNAMIC_BSZ, MAX_TOKENS, PPO_MICRO
from autotune.cli.app import main
from autotune.estimate import find_model, resolve_gpu
from autotune.estimate.memory import estimate_memory
from autotune.estimate.timing import estimate_step_time

AR = "actor_rollout_ref"
JOB = {"global_batch": 1024, "num_generations": 8, "max_completion_length": 1024, "max_prompt_length": 512}


def memory(params: dict[str, Any], fixed: dict[str, Any] | None = None) -> Any:
    model = find_model("Qwen2.5-7B")
    assert model is not None
    gpu = resolve_gpu("H100", None)
    shape = job_shape("verl", params, {"world_size": 8}, {**JOB, **(fixed or {})}, model, 8)
    return shape, estimate_memory(shape, gpu), gpu


def test_fsdp_states_shard_over_the_gpus_and_offload_empties_the_rollout_phase() -> None:
    base = {PPO_MICRO: 4, f"{AR}.rollout.gpu_memory_utilization": 0.5}
    _, plain, _ = memory(base)
    _, off, _ = memory(
        {
            **base,
            f"{AR}.actor.fsdp_config.param_offload": True,
            f"{AR}.actor.fsdp_config.optimizer_offload": True,
        }
    )
    rollout, train = plain.phases["rollout"], plain.phases["train"]
    params = find_model("Qwen2.5-7B").params  # type: ignore[union-attr]
    assert train["optimizer_states"] < 2 * params  # sharded over 8 GPUs (a whole copy is 12 B/param)
    assert rollout["vllm_reserved"] == int(0.5 * resolve_gpu("H100", None).memory_bytes)  # type: ignore[union-attr]
    assert off.phases["rollout"]["policy_weights"] == 0 and off.phases["rollout"]["optimizer_states"] == 0
    assert rollout["policy_weights"] > 0 and rollout["optimizer_states"] > 0
    assert off.phases["train"]["policy_weights"] == train["policy_weights"]  # loaded back to train
    assert off.host_bytes > plain.host_bytes


def test_reference_stays_on_the_host_and_costs_host_memory() -> None:
    kl = {"actor_rollout_ref.actor.use_kl_loss": True}
    _, without, _ = memory({PPO_MICRO: 4})
    shape, with_ref, _ = memory({PPO_MICRO: 4}, kl)
    assert shape.has_reference and shape.beta == pytest.approx(0.001)
    assert 0 < with_ref.phases["train"]["reference_model"] < 2 * shape.model.params // 8
    assert with_ref.host_bytes - without.host_bytes == 4 * shape.model.params


def test_dynamic_bsz_sizes_activations_by_the_token_budget() -> None:
    small, mem_small, gpu = memory({DYNAMIC_BSZ: True, MAX_TOKENS: 4096})
    large, mem_large, _ = memory({DYNAMIC_BSZ: True, MAX_TOKENS: 32768})
    assert small.micro_batch_tokens == 4096 and large.micro_batch_tokens == 32768
    act = lambda m: m.phases["train"]["activations"] + m.phases["train"]["logits"]  # noqa: E731
    assert act(mem_large) > 4 * act(mem_small)
    # fewer, larger micro-batches train faster in the time model
    assert (
        estimate_step_time(large, gpu, mem_large).train_s < estimate_step_time(small, gpu, mem_small).train_s
    )


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(list(args))
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def test_plan_for_qwen25_7b_on_8_h100(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    code, out, err = run(
        capsys,
        "plan",
        "--backend",
        "verl",
        "--gpus",
        "8",
        "--gpu-type",
        "H100",
        "--model",
        "Qwen2.5-7B",
        "--json",
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["backend"] == "verl" and data["counts"]["fit"] > 0
    first = data["candidates"][0]
    assert first["fits"] and first["memory"]["components_bytes"]["vllm_reserved"] > 0
    assert data["invalid"].get("rollout_tp_divides_heads") is None or data["counts"]["invalid"] > 0
    tps = {c["params"].get(f"{AR}.rollout.tensor_model_parallel_size") for c in data["candidates"]}
    assert 8 not in tps  # 28 heads do not split over 8 GPUs (plan's candidate rules)


def test_plan_table_renders(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys,
        *("plan", "--backend", "verl", "--gpus", "8", "--gpu-type", "H100", "--model", "Qwen2.5-7B"),
        *(
            "--knob",
            f"{AR}.rollout.tensor_model_parallel_size=2",
            "--knob",
            f"{AR}.actor.use_dynamic_bsz=true",
        ),
    )
    assert code == 0, err
    assert "vllm_util" in out and "Traceback" not in out + err


def test_search_refuses_without_a_gpu(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from autotune.records import Hardware
    from autotune.study import hardware as hw

    monkeypatch.setattr(
        hw,
        "resolve_hardware",
        lambda *a, **k: Hardware(gpus=(), host=hw.host_info(), nvml_note="NVML: driver not loaded"),
    )
    out_dir = tmp_path / "study"
    code, out, err = run(
        capsys, "search", "--backend", "verl", "--model", "Qwen2.5-7B", "--out", str(out_dir)
    )
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "needs a GPU" in lines[0], err
    assert "Traceback" not in out + err and not out_dir.exists()
