"""The trl export, read by TRL's own parsers and by accelerate's and transformers' DeepSpeed checks.

``trl grpo --config grpo.yaml`` parses the YAML with ``TrlParser`` over GRPOScriptArguments, GRPOConfig,
ModelConfig and DatasetMixtureConfig (building each dataclass runs its own validation) and hands the
fields it does not know to ``accelerate launch``; these tests do exactly that, then check the launch
arguments, the DeepSpeed plugin accelerate would build, and transformers' consistency check between
``ds_config.json`` and the training arguments. The e2e test trains two steps on CPU with the tiny model.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autotune.app.export import export_study
from autotune.export import write_export
from autotune.workload.datasets import write_prompts
from tests.export.conftest import make_study
from tests.export.test_golden import swift_gpu_study, trl_gpu_study

pytestmark = pytest.mark.trl
trl = pytest.importorskip("trl")
pytest.importorskip("accelerate")
if int(trl.__version__.split(".")[0]) < 1:
    pytest.skip("the trl export is written for trl >= 1.0's `trl grpo`", allow_module_level=True)


def cpu_trl_study(root: Path, model: dict[str, Any] | None = None) -> Path:
    """A CPU-only TRL study on autotune's generated prompts (as autotune search writes it)."""
    study = make_study(
        root,
        backend="trl",
        gpus=0,
        params={
            "per_device_train_batch_size": 8,
            "gradient_checkpointing": True,
            "dataloader_num_workers": 0,
            "zero_stage": 0,
            "num_processes": 1,
        },
        derived={"world_size": 1, "gradient_accumulation_steps": 2},
        dataset=None,
        global_batch=16,
        num_generations=4,
        max_completion_length=16,
        model=model,
    )
    write_prompts(study / "trials" / "1" / "prompts.jsonl", 64, seed=0, style="prompt")
    return study


def parse(out: Path, monkeypatch: pytest.MonkeyPatch, *, gpu: bool) -> tuple[Any, ...]:
    """``trl grpo --config grpo.yaml``'s own parsing, from the export directory."""
    from trl.scripts.grpo import make_parser

    if gpu:  # the export targets the study's GPUs; let transformers believe it has a bf16 GPU
        monkeypatch.setattr("transformers.training_args.is_torch_bf16_gpu_available", lambda: True)
    monkeypatch.chdir(out)
    return make_parser().parse_args_and_config(
        ["--config", "grpo.yaml"], return_remaining_strings=True, separate_remaining_strings=True
    )


def test_cpu_trl_export_parses_with_trls_parser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    study = cpu_trl_study(tmp_path / "cpu")
    out = tmp_path / "out"
    write_export(export_study(study, "trl"), out)
    script, training, model, data, config_rest, cli_rest = parse(out, monkeypatch, gpu=False)
    assert config_rest == ["--accelerate_config", "accelerate.yaml"] and cli_rest == []
    assert (training.per_device_train_batch_size, training.gradient_accumulation_steps) == (8, 2)
    assert training.use_cpu is True and training.bf16 is False
    assert (training.num_generations, training.max_completion_length) == (4, 16)
    # what only a trial needs is not carried: TRL's own defaults hold
    assert training.max_steps == -1 and training.logging_steps == 10 and training.save_strategy == "steps"
    assert training.output_dir != str(
        study / "trials" / "1" / "output"
    )  # the trial's output dir is not carried
    assert script.reward_funcs == ["autotune.backends.trl_worker.autotune_reward"]
    assert data.datasets[0].path == "json" and data.datasets[0].data_files == str(
        study / "trials" / "1" / "prompts.jsonl"
    )
    assert model.model_name_or_path == "Qwen/Qwen2.5-1.5B-Instruct"


def _launch_args(out: Path) -> Any:
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from trl.cli.accelerate_config import resolve_accelerate_config_argument

    launch = resolve_accelerate_config_argument(["--accelerate_config", "accelerate.yaml"])
    args = launch_command_parser().parse_args([*launch, str(out / "train.py")])
    return _validate_launch_command(args)


@pytest.mark.deepspeed
@pytest.mark.parametrize("which", ["trl", "swift"])
def test_gpu_exports_parse_and_agree_with_deepspeed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    pytest.importorskip("deepspeed")
    from accelerate.utils import DeepSpeedPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig
    from trl import GRPOConfig

    study = (
        trl_gpu_study(tmp_path / "s", rewards=["my_rewards:accuracy"])
        if which == "trl"
        else swift_gpu_study(tmp_path / "s")
    )
    out = tmp_path / "out"
    write_export(export_study(study, "trl"), out)
    script, training, model, data, config_rest, cli_rest = parse(out, monkeypatch, gpu=True)
    assert config_rest == ["--accelerate_config", "accelerate.yaml"] and cli_rest == []
    assert training.bf16 is True and training.use_vllm is True and training.vllm_mode == "colocate"
    world = 4 if which == "trl" else 2
    if which == "trl":
        assert script.reward_funcs == ["my_rewards.accuracy"]
        assert (training.vllm_tensor_parallel_size, training.vllm_gpu_memory_utilization) == (2, 0.45)
        assert data.datasets == [] and script.dataset_name == "trl-lib/DeepMath-103K"
    else:
        assert model.use_peft is True and model.lora_r == 32 and training.beta == 0.04
        assert training.learning_rate == 1e-5 and training.vllm_gpu_memory_utilization == 0.5

    # accelerate launch, as `trl grpo` calls it, with the exported accelerate.yaml
    args, defaults, mixed_precision_from_config = _launch_args(out)
    assert args.use_deepspeed and args.num_processes == world
    assert args.deepspeed_config_file == "ds_config.json" and not mixed_precision_from_config
    args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
    _, env = prepare_deepspeed_cmd_env(args)
    for key, value in env.items():
        if key.startswith("ACCELERATE_"):
            monkeypatch.setenv(key, value)
    plugin = DeepSpeedPlugin()  # runs accelerate's checks of a deepspeed_config_file
    stage = plugin.deepspeed_config["zero_optimization"]["stage"]
    assert stage == (3 if which == "trl" else 2)

    # transformers: every value in ds_config.json must match the training arguments
    monkeypatch.setattr(GRPOConfig, "world_size", property(lambda self: world))
    hf = HfTrainerDeepSpeedConfig(json.loads((out / "ds_config.json").read_text()))
    hf.trainer_config_process(training)  # raises ValueError listing any mismatch


def test_cpu_trl_accelerate_config_runs_one_cpu_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    study = cpu_trl_study(tmp_path / "cpu")
    out = tmp_path / "out"
    write_export(export_study(study, "trl"), out)
    monkeypatch.chdir(out)
    args, _, _ = _launch_args(out)
    assert args.use_cpu and args.num_processes == 1
    assert not args.use_deepspeed and not args.multi_gpu


@pytest.mark.e2e
def test_exported_trl_config_trains_two_steps_on_cpu(tmp_path: Path) -> None:
    """``bash command.sh --max_steps 2``: the exported TRL job trains the tiny model on CPU."""
    from autotune.workload.models import resolve_model

    trl_cli = Path(sys.executable).with_name("trl")
    if not trl_cli.exists():
        pytest.skip("TRL's `trl` command is not installed beside this interpreter")
    tiny = resolve_model("tiny-qwen2")
    study = cpu_trl_study(
        tmp_path / "cpu",
        model={"name": "tiny-qwen2", "path_or_id": tiny.path_or_id, "local": True, "facts": {"hidden": 64}},
    )
    out = tmp_path / "out"
    write_export(export_study(study, "trl"), out)
    env = dict(
        os.environ, PATH=f"{trl_cli.parent}{os.pathsep}{os.environ.get('PATH', '')}", OMP_NUM_THREADS="1"
    )
    proc = subprocess.run(
        ["bash", str(out / "command.sh"), "--max_steps", "2", "--output_dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Training completed" in proc.stdout + proc.stderr
    assert (tmp_path / "run" / "config.json").exists()  # the trained model was saved
    shutil.rmtree(tmp_path / "run", ignore_errors=True)


def test_the_trl_export_uses_names_the_installed_transformers_does_not_deprecate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers 5 renamed gradient_checkpointing (an alias that warns on every run): the export reads
    the installed class's aliases, so `trl grpo` parses its YAML without a deprecation warning, and the
    setting holds under its current name."""
    import warnings

    study = cpu_trl_study(tmp_path / "cpu")
    out = tmp_path / "out"
    write_export(export_study(study, "trl"), out)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, training, *_ = parse(out, monkeypatch, gpu=False)
    deprecations = [str(w.message) for w in caught if "deprecated" in str(w.message).lower()]
    assert deprecations == []
    assert training.gradient_checkpointing is True


def test_the_trl_export_keeps_the_threads_the_trial_ran_with(tmp_path: Path) -> None:
    study = cpu_trl_study(tmp_path / "cpu")
    launch = study / "trials" / "1" / "launch.json"
    plan = (
        json.loads(launch.read_text()) if launch.exists() else {"argv": ["python"], "cwd": str(launch.parent)}
    )
    plan.setdefault("env", {})["OMP_NUM_THREADS"] = "2"
    launch.write_text(json.dumps(plan))
    script = export_study(study, "trl").files["command.sh"]
    assert "export OMP_NUM_THREADS=2" in script and "OMP_NUM_THREADS=1" not in script
