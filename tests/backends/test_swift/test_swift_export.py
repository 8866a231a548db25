"""The swift export, read by ms-swift's own argument classes; the e2e test trains two steps with it.

Run in the ms-swift environment (``pytest -m swift``): ms-swift pins its own transformers and TRL.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.resources import as_file, files
from pathlib import Path
from typing import Any

import pytest

from autotune.app.export import export_study
from autotune.export import write_export
from autotune.workload.datasets import write_prompts
from tests.export.conftest import edit_settings, make_study, script_command, script_env
from tests.export.test_golden import swift_gpu_study, trl_gpu_study

pytestmark = pytest.mark.swift
pytest.importorskip("swift")


def swift_parse(argv: list[str]) -> tuple[Any, list[str]]:
    """Parse ``swift rlhf`` arguments as ms-swift does (HfArgumentParser over RLHFArguments), without
    building the dataclass (its __post_init__ would fetch the model's files)."""
    from transformers import HfArgumentParser

    try:
        from swift.arguments import RLHFArguments
    except ImportError:  # ms-swift 3.x
        from swift.llm import RLHFArguments
    try:
        from swift.utils.utils import _patch_get_type_hints
    except ImportError:
        parser = HfArgumentParser([RLHFArguments])
    else:
        with _patch_get_type_hints():
            parser = HfArgumentParser([RLHFArguments])
    namespace, remaining = parser.parse_known_args(argv)
    return namespace, remaining


def test_fixture_export_parses_with_ms_swift(fixture_study: Path) -> None:
    # The committed fixture fixes --max_prompt_length, which ms-swift 4.6 does not have (a real study's fixed
    # flags pass check_flags against the installed ms-swift before any trial); use its 4.x neighbour.
    settings = json.loads((fixture_study / "study.json").read_text())
    fixed = settings["fixed"]
    fixed["max_length"] = fixed.pop("max_prompt_length") + settings["max_completion_length"]
    edit_settings(fixture_study, fixed=fixed)
    text = export_study(fixture_study, "swift").files["command.sh"]
    argv = script_command(text)
    assert argv[1:2] == ["rlhf"]
    ns, remaining = swift_parse(argv[2:])
    assert remaining == []
    assert ns.rlhf_type == "grpo" and ns.model == "Qwen/Qwen2-7B"
    assert (ns.per_device_train_batch_size, ns.gradient_accumulation_steps) == (4, 2)
    assert ns.deepspeed == "zero3" and ns.use_vllm is True and ns.vllm_mode == "colocate"
    assert (ns.vllm_gpu_memory_utilization, ns.vllm_tensor_parallel_size) == (0.5, 4)
    assert ns.tuner_type == "lora" and ns.lora_rank == 16 and ns.beta == 0.04 and ns.max_length == 1536
    assert ns.num_generations == 8 and ns.max_completion_length == 1024
    assert ns.max_steps == -1 and ns.output_dir is None  # trial-only flags are not carried
    assert script_env(text) == {
        "NPROC_PER_NODE": "4",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # NVML's numbering, as the trial had (review #13)
    }


def test_translated_trl_winner_parses_with_ms_swift(tmp_path: Path) -> None:
    study = trl_gpu_study(tmp_path / "trl")
    ns, remaining = swift_parse(script_command(export_study(study, "swift").files["command.sh"])[2:])
    assert remaining == []
    assert ns.deepspeed == "zero3_offload" and ns.sleep_level == 0 and ns.beta == 0.04
    assert ns.reward_funcs == ["autotune_demo"] and Path(ns.external_plugins[0]).is_file()
    assert ns.use_hf is True and ns.learning_rate == 1e-6


def test_swift_gpu_export_parses_with_ms_swift(tmp_path: Path) -> None:
    study = swift_gpu_study(tmp_path / "swift")
    ns, remaining = swift_parse(script_command(export_study(study, "swift").files["command.sh"])[2:])
    assert remaining == []
    assert ns.deepspeed == "zero2_offload" and ns.lora_rank == 32 and ns.learning_rate == 1e-5


def cpu_swift_study(root: Path, model_path: str) -> Path:
    """A CPU-only ms-swift study on autotune's prompts and demo reward, as autotune search leaves it."""
    study = make_study(
        root,
        backend="swift",
        gpus=0,
        params={
            "per_device_train_batch_size": 8,
            "gradient_checkpointing": False,
            "dataloader_num_workers": 0,
            "num_processes": 1,
        },
        derived={"world_size": 1, "gradient_accumulation_steps": 1},
        model={"name": "tiny-qwen2", "path_or_id": model_path, "local": True, "facts": {"hidden": 64}},
        dataset=None,
        global_batch=8,
        num_generations=4,
        max_completion_length=16,
    )
    trial = study / "trials" / "1"
    write_prompts(trial / "prompts.jsonl", 64, seed=0, style="messages")
    with as_file(files("autotune").joinpath("assets", "swift_reward_plugin.py")) as plugin:
        shutil.copyfile(plugin, trial / "swift_reward_plugin.py")
    return study


@pytest.mark.e2e
def test_exported_swift_script_trains_two_steps_on_cpu(tmp_path: Path) -> None:
    """``bash command.sh --max_steps 2`` runs ms-swift GRPO on the tiny model to the end."""
    from autotune.workload.models import resolve_model

    swift = shutil.which("swift") or str(Path(sys.executable).with_name("swift"))
    if not Path(swift).exists():
        pytest.skip("ms-swift's `swift` command is not installed here")
    study = cpu_swift_study(tmp_path / "cpu", resolve_model("tiny-qwen2").path_or_id)
    out = tmp_path / "export.sh"
    write_export(export_study(study, "swift"), out)
    assert os.access(out, os.X_OK)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = dict(
        os.environ,
        PATH=f"{Path(swift).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        MODELSCOPE_CACHE=str(tmp_path / "modelscope"),
    )
    proc = subprocess.run(
        [str(out), "--max_steps", "2"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=run_dir,
        check=False,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "'global_step/max_steps': '2/2'" in log
