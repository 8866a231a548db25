"""The verl export, composed by hydra from verl's own ``ppo_trainer`` config (verl 0.9.1).

verl pins its own torch, so it lives in another environment: these tests run hydra there, found as
``$AUTOTUNE_VERL_PYTHON``, this interpreter, or ``.venv-verl/bin/python`` in the repository. That
environment needs only ``pip install verl==0.9.1 --no-deps hydra-core omegaconf`` (composing the config
imports none of verl's Python). Without one, the tests skip.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from autotune.app.export import export_study
from autotune.errors import UsageError
from autotune.export import write_export
from tests.export.conftest import edit_result, python_with, script_command, script_env
from tests.export.test_golden import swift_gpu_study

REPO = Path(__file__).resolve().parents[3]

_COMPOSE = r"""
import importlib.util, json, os, sys
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
spec = importlib.util.find_spec("verl")
config_dir = os.path.join(spec.submodule_search_locations[0], "trainer", "config")
overrides = json.load(sys.stdin)
with initialize_config_dir(config_dir=config_dir, version_base=None):
    cfg = compose(config_name="ppo_trainer", overrides=overrides)
print(json.dumps(OmegaConf.to_container(cfg, resolve=False)))
"""


@pytest.fixture(scope="module")
def verl_python() -> str:
    python = python_with("verl", "AUTOTUNE_VERL_PYTHON", [REPO / ".venv-verl" / "bin" / "python"])
    if python is None:
        pytest.skip("no interpreter with verl + hydra-core (set AUTOTUNE_VERL_PYTHON)")
    return python


def compose(python: str, overrides: list[str]) -> dict[str, Any]:
    proc = subprocess.run(
        [python, "-c", _COMPOSE],
        input=json.dumps(overrides),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        raise AssertionError(f"hydra refused the overrides: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout)


def check_verl_rules(cfg: dict[str, Any]) -> None:
    """The batch rules verl checks at start-up (verl.utils.config.validate_config, ActorConfig)."""
    ar = cfg["actor_rollout_ref"]
    actor, rollout = ar["actor"], ar["rollout"]
    n_gpus = cfg["trainer"]["n_gpus_per_node"] * cfg["trainer"]["nnodes"]
    n = rollout["n"]
    assert rollout["name"] in ("vllm", "sglang", "trtllm")
    assert (cfg["data"]["train_batch_size"] * n) % n_gpus == 0
    assert cfg["data"]["train_batch_size"] >= actor["ppo_mini_batch_size"]
    assert actor["ppo_micro_batch_size_per_gpu"] is not None and actor["ppo_micro_batch_size"] is None
    assert rollout["log_prob_micro_batch_size_per_gpu"] is not None
    assert ar["ref"]["log_prob_micro_batch_size_per_gpu"] is not None
    per_gpu_mini = actor["ppo_mini_batch_size"] * n // n_gpus
    assert per_gpu_mini % actor["ppo_micro_batch_size_per_gpu"] == 0
    assert n_gpus % rollout["tensor_model_parallel_size"] == 0


def overrides(text: str, here: Path) -> list[str]:
    argv = script_command(text)
    assert argv[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    return [item.replace("$HERE", str(here)) for item in argv[3:]]


def test_fixture_export_composes_with_verls_config(
    fixture_study: Path, tmp_path: Path, verl_python: str
) -> None:
    export = export_study(fixture_study, "verl")
    out = tmp_path / "verl"
    write_export(export, out)
    text = (out / "command.sh").read_text()
    cfg = compose(verl_python, overrides(text, out))
    check_verl_rules(cfg)
    ar = cfg["actor_rollout_ref"]
    assert cfg["algorithm"]["adv_estimator"] == "grpo"
    assert (cfg["data"]["train_batch_size"], ar["rollout"]["n"]) == (4, 8)  # 32 completions = 4 prompts × 8
    assert ar["actor"]["ppo_micro_batch_size_per_gpu"] == 4
    assert ar["rollout"]["gpu_memory_utilization"] == 0.5 and ar["rollout"]["tensor_model_parallel_size"] == 4
    assert ar["actor"]["fsdp_config"]["reshard_after_forward"] is True  # ZeRO-3: full sharding
    assert ar["actor"]["use_kl_loss"] is True and ar["actor"]["kl_loss_coef"] == 0.04
    assert ar["model"]["lora_rank"] == 16 and ar["model"]["enable_gradient_checkpointing"] is True
    assert cfg["trainer"]["logger"] == ["console"] and cfg["trainer"]["n_gpus_per_node"] == 4
    reward = cfg["reward"]["custom_reward_function"]
    assert reward == {"path": str(out / "autotune_verl_reward.py"), "name": "compute_score"}
    assert script_env(text) == {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}


def test_zero2_offload_maps_to_shard_grad_op_with_offload(tmp_path: Path, verl_python: str) -> None:
    study = swift_gpu_study(tmp_path / "swift")
    cfg = compose(verl_python, overrides(export_study(study, "verl").files["command.sh"], tmp_path))
    check_verl_rules(cfg)
    fsdp = cfg["actor_rollout_ref"]["actor"]["fsdp_config"]
    assert fsdp["reshard_after_forward"] is False and fsdp["optimizer_offload"] is True
    assert fsdp["param_offload"] is False
    assert cfg["actor_rollout_ref"]["actor"]["optim"]["lr"] == 1e-5


def test_no_deepspeed_maps_to_one_gpu_shard_groups(
    fixture_study: Path, tmp_path: Path, verl_python: str
) -> None:
    edit_result(
        fixture_study,
        3,
        params={
            **json.loads((fixture_study / "trials/3/result.json").read_text())["params"],
            "deepspeed": None,
        },
    )
    cfg = compose(verl_python, overrides(export_study(fixture_study, "verl").files["command.sh"], tmp_path))
    assert cfg["actor_rollout_ref"]["actor"]["fsdp_config"]["fsdp_size"] == 1


def test_a_misspelt_override_is_refused_by_the_same_check(verl_python: str) -> None:
    with pytest.raises(AssertionError, match="hydra refused"):
        compose(verl_python, ["actor_rollout_ref.rollout.gpu_memory_utilisation=0.5"])


def test_exported_reward_scores_as_the_demo_reward(fixture_study: Path) -> None:
    source = export_study(fixture_study, "verl").files["autotune_verl_reward.py"]
    spec = importlib.util.spec_from_loader("autotune_verl_reward", loader=None)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    exec(compile(source, "autotune_verl_reward.py", "exec"), module.__dict__)
    from autotune.workload.datasets import score_completion

    for text, truth in (("42", "42"), ("the answer is 7", "8"), ("", "1")):
        assert module.compute_score("math", text, truth) == pytest.approx(score_completion(text, truth))


def test_demo_prompts_are_refused_for_verl(tmp_path: Path) -> None:
    from tests.export.conftest import make_study

    study = make_study(
        tmp_path / "s",
        backend="swift",
        params={"per_device_train_batch_size": 2, "use_vllm": True, "vllm_mode": "colocate"},
        derived={"world_size": 4, "gradient_accumulation_steps": 8},
        dataset=None,
    )
    with pytest.raises(UsageError, match="autotune's generated prompts"):
        export_study(study, "verl")


def verl_study(tmp_path: Path, fixed: dict[str, Any]) -> Path:
    """A verl study whose trial 1 ran (launch.json rendered by the verl backend itself)."""
    from autotune.backends._base import ModelRef, TrialContext
    from autotune.backends.verl.backend import VerlBackend
    from autotune.records import GpuInfo, TrialSpec
    from tests.export.conftest import make_study

    params = {
        "actor_rollout_ref.actor.use_dynamic_bsz": True,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 8192,
        "actor_rollout_ref.rollout.gpu_memory_utilization": 0.65,
    }
    study = make_study(
        tmp_path / "verl-study",
        backend="verl",
        params=params,
        derived={"world_size": 4},
        fixed=fixed,
        backend_version="0.9.1",
    )
    ctx = TrialContext(
        study_dir=study,
        trial_dir=study / "trials" / "1",
        model=ModelRef("Qwen2.5-1.5B", "Qwen/Qwen2.5-1.5B-Instruct"),
        gpus=tuple(GpuInfo(index=i, name="A100", memory_total_bytes=80 << 30) for i in range(4)),
        global_batch=64,
        num_generations=8,
        max_steps=20,
        max_completion_length=512,
        fixed=fixed,
    )
    plan = VerlBackend(python="/opt/verl/bin/python").render(
        TrialSpec(number=1, params=params, derived={}), ctx
    )
    (study / "trials" / "1" / "launch.json").write_text(plan.model_dump_json())
    return study


def test_a_verl_study_exports_the_overrides_its_trial_ran_with(tmp_path: Path, verl_python: str) -> None:
    fixed = {
        "data.train_files": "/data/gsm8k/train.parquet",
        "data.val_files": "/data/gsm8k/test.parquet",
        "trainer.save_freq": "50",
        "actor_rollout_ref.actor.use_kl_loss": "true",
        "trainer.wandb_api_key": "abcdefabcdefabcdefabcdefabcdef123456",
    }
    study = verl_study(tmp_path, fixed)
    export = export_study(study, "verl")
    text = export.files["command.sh"]
    # the secret override is read from a variable the user exports (autotune.secrets)
    assert "abcdef" not in text and 'trainer.wandb_api_key="${TRAINER_WANDB_API_KEY}"' in text
    assert any("trainer.wandb_api_key is a secret" in n for n in export.notes)
    cfg = compose(
        verl_python, [o for o in overrides(text, tmp_path) if not o.startswith("trainer.wandb_api_key=")]
    )
    trainer, ar = cfg["trainer"], cfg["actor_rollout_ref"]
    assert trainer["save_freq"] == 50  # the user's own, not the trial's -1
    assert trainer["total_training_steps"] is None and trainer["val_before_train"] is True  # verl's defaults
    assert ar["actor"]["use_dynamic_bsz"] is True and ar["actor"]["ppo_max_token_len_per_gpu"] == 8192
    assert ar["rollout"]["gpu_memory_utilization"] == 0.65 and ar["actor"]["use_kl_loss"] is True
    assert cfg["data"]["train_batch_size"] * ar["rollout"]["n"] == 64
    assert trainer["n_gpus_per_node"] == 4 and cfg["data"]["train_files"] == "/data/gsm8k/train.parquet"
    assert script_env(text) == {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_a_never_launched_verl_trial_is_refused(tmp_path: Path) -> None:
    study = verl_study(tmp_path, {"data.train_files": "/d.parquet"})
    (study / "trials" / "1" / "launch.json").unlink()
    with pytest.raises(UsageError, match="never launched"):
        export_study(study, "verl")
