"""What a format cannot express is refused in one line that names the knob (or argument) and the way out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autotune.app.export import export_study
from autotune.errors import UsageError
from tests.export.conftest import make_study


def swift_study(root: Path, **params: Any) -> Path:
    base = {"per_device_train_batch_size": 2, "deepspeed": "zero3", "use_vllm": True, "vllm_mode": "colocate"}
    return make_study(
        root,
        backend="swift",
        params={**base, **params},
        derived={"world_size": 4, "gradient_accumulation_steps": 8},
    )


def trl_study(root: Path, fixed: dict[str, Any] | None = None, **params: Any) -> Path:
    base = {"per_device_train_batch_size": 4, "zero_stage": 3, "use_vllm": True}
    return make_study(
        root,
        backend="trl",
        params={**base, **params},
        derived={"world_size": 4, "gradient_accumulation_steps": 4},
        fixed=fixed,
    )


def refusal(study: Path, fmt: str) -> str:
    with pytest.raises(UsageError) as info:
        export_study(study, fmt)
    message = info.value.one_line()
    assert "\n" not in message
    return message


@pytest.mark.parametrize("fmt", ["verl", "trl"])
def test_move_model_batches_is_refused_outside_ms_swift(tmp_path: Path, fmt: str) -> None:
    study = swift_study(tmp_path / "s", move_model_batches=8)
    message = refusal(study, fmt)
    assert message.startswith("knob move_model_batches=8 cannot be expressed in ")
    assert message.endswith("; use --format swift.")


def test_move_model_batches_is_kept_by_the_swift_export(tmp_path: Path) -> None:
    text = export_study(swift_study(tmp_path / "s", move_model_batches=8), "swift").files["command.sh"]
    assert "--move_model_batches 8" in text


def test_examples_of_the_brief(tmp_path: Path) -> None:
    study = swift_study(tmp_path / "s", move_model_batches=8)
    assert refusal(study, "verl") == (
        "knob move_model_batches=8 cannot be expressed in verl's configuration; use --format swift."
    )


@pytest.mark.parametrize(
    ("params", "fmt", "named"),
    [
        ({"sleep_level": 1}, "trl", "knob sleep_level=1"),
        ({"offload_model": True}, "trl", "knob offload_model=true"),
        ({"offload_optimizer": True}, "trl", "knob offload_optimizer=true"),
        ({"deepspeed": "zero1"}, "verl", "knob deepspeed=zero1"),
        ({"deepspeed": "/data/my_ds.json"}, "trl", "knob deepspeed=/data/my_ds.json"),
        ({"deepspeed": "/data/my_ds.json"}, "deepspeed", "knob deepspeed=/data/my_ds.json"),
        ({"use_vllm": False}, "verl", "knob use_vllm=false"),
        ({"vllm_mode": "server"}, "verl", "knob vllm_mode=server"),
    ],
)
def test_swift_knobs_without_an_equivalent_are_refused_by_name(
    tmp_path: Path, params: dict[str, Any], fmt: str, named: str
) -> None:
    message = refusal(swift_study(tmp_path / "s", **params), fmt)
    assert message.startswith(named), message
    assert "use --format swift" in message


@pytest.mark.parametrize(
    ("params", "fmt", "named"),
    [
        (
            {"offload_optimizer": True, "offload_param": False},
            "swift",
            "knob offload_param=false with ZeRO-3",
        ),
        ({"offload_optimizer": False, "offload_param": True}, "swift", "knob offload_param=true with ZeRO-3"),
        ({"vllm_enable_sleep_mode": True}, "verl", "knob vllm_enable_sleep_mode=true"),
    ],
)
def test_trl_knobs_without_an_equivalent_are_refused_by_name(
    tmp_path: Path, params: dict[str, Any], fmt: str, named: str
) -> None:
    message = refusal(trl_study(tmp_path / "s", **params), fmt)
    assert message.startswith(named), message
    assert "use --format trl" in message


def test_fixed_arguments_outside_the_shared_vocabulary_are_refused_by_name(fixture_study: Path) -> None:
    # the fixture fixes max_prompt_length, which TRL's GRPOConfig does not have
    assert refusal(fixture_study, "trl") == (
        "fixed argument max_prompt_length=512 cannot be expressed in TRL's configuration; use --format swift."
    )


def test_user_rewards_do_not_cross_frameworks(tmp_path: Path) -> None:
    study = trl_study(tmp_path / "s", fixed={"reward_funcs": ["my_rewards:accuracy"]})
    assert refusal(study, "swift").startswith(
        "fixed argument reward_funcs=my_rewards:accuracy cannot be expressed"
    )


def test_demo_prompts_of_one_framework_are_refused_for_the_other(tmp_path: Path) -> None:
    study = make_study(
        tmp_path / "s",
        backend="swift",
        gpus=0,
        params={"per_device_train_batch_size": 4, "num_processes": 1},
        derived={"world_size": 1, "gradient_accumulation_steps": 4},
        dataset=None,
    )
    message = refusal(study, "trl")
    assert "autotune's generated prompts" in message and "--format swift" in message


def test_command_studies_export_only_their_command_and_json(tmp_path: Path) -> None:
    study = make_study(tmp_path / "s", backend="command", params={"bs": 4}, derived={"world_size": 1})
    for fmt in ("swift", "trl", "verl"):
        assert "use --format command" in refusal(study, fmt)


def test_unknown_format(fixture_study: Path) -> None:
    with pytest.raises(UsageError, match="unknown export format 'yaml'"):
        export_study(fixture_study, "yaml")
