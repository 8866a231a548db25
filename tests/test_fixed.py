from __future__ import annotations

from pathlib import Path

import pytest

from autotune.errors import AutotuneError, UsageError
from autotune.fixed import (
    coerce_knob_values,
    flag_name,
    load_fixed,
    parse_flag_argv,
    parse_pins,
    read_fixed_file,
    split_baseline,
)
from autotune.space import load_space

SPACE = """
backend: swift
knobs:
  per_device_train_batch_size: {type: int, choices: [1, 2, 4, 8], default: 1}
  gradient_checkpointing: {type: bool, default: true}
  vllm_gpu_memory_utilization: {type: float, low: 0.3, high: 0.9, default: 0.9}
  deepspeed: {type: str, choices: [null, zero2, zero3], default: null}
"""


def test_parse_flag_argv_forms() -> None:
    argv = [
        "--beta", "0.04",
        "--reward-funcs", "accuracy", "format",
        "--system=You are a helpful assistant.",
        "--use_vllm",
        "--learning_rate", "-1e-6",
        "--lora_rank", "16",
    ]  # fmt: skip
    assert parse_flag_argv(argv) == {
        "beta": "0.04",
        "reward_funcs": ["accuracy", "format"],
        "system": "You are a helpful assistant.",
        "use_vllm": True,
        "learning_rate": "-1e-6",
        "lora_rank": "16",
    }
    assert parse_flag_argv([]) == {}


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["accuracy"], "belongs to no flag"),
        (["--beta", "0.1", "--beta", "0.2"], "given twice"),
        (["--", "x"], "is not a flag name"),
        (["--a b", "1"], "is not a flag name"),
    ],
)
def test_parse_flag_argv_errors(argv: list[str], needle: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_flag_argv(argv)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)  # one line
    assert info.value.exit_code == 2


def test_flag_name() -> None:
    assert flag_name("--max-completion-length") == "max_completion_length"
    assert flag_name("beta") == "beta"


def test_read_fixed_file(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        "dataset: /data/gsm8k.jsonl\n"
        "reward_funcs: [accuracy, format]\n"
        "--lora-rank: 16\n"
        "beta: 0.04\n"
        "use_vllm: true\n"
        "vllm_engine_kwargs: {enforce_eager: true}\n"
    )
    assert read_fixed_file(path) == {
        "dataset": "/data/gsm8k.jsonl",
        "reward_funcs": ["accuracy", "format"],
        "lora_rank": 16,
        "beta": 0.04,
        "use_vllm": True,
        "vllm_engine_kwargs": {"enforce_eager": True},
    }
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert read_fixed_file(empty) == {}


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("- a\n- b\n", "not a mapping"),
        ("a: [1, 2\n", "not valid YAML at line"),
        ("1: x\n", "is not a flag name"),
        ("ENV:\n  A: 1\n", "ENV section"),
        ("beta: 1\n--beta: 2\n", "given twice"),
    ],
)
def test_read_fixed_file_errors(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UsageError) as info:
        read_fixed_file(path)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_missing_file() -> None:
    with pytest.raises(UsageError, match="does not exist"):
        read_fixed_file("/nonexistent/job.yaml")


def test_load_fixed_merges_the_file_and_argv_and_refuses_a_conflict(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("beta: 0.04\ntemperature: 1.0\nuse_peft: true\n")
    # the same value in both places holds once (text and number, bool spellings agree)
    assert load_fixed(
        path, ["--beta", "0.04", "--temperature", "1", "--use_peft", "True", "--lr", "1e-6"]
    ) == {
        "beta": "0.04",
        "temperature": "1",
        "use_peft": "True",
        "lr": "1e-6",
    }
    # two different values: one line naming both places, never a silent choice
    with pytest.raises(
        UsageError, match=r"beta is 0.04 in --fixed .*job.yaml but '0.0' in your arguments after --"
    ):
        load_fixed(path, ["--beta", "0.0"])
    assert load_fixed(None, ["--beta", "0"]) == {"beta": "0"}
    assert load_fixed() == {}


def test_split_and_coerce_the_users_baseline(tmp_path: Path) -> None:
    space_file = tmp_path / "space.yaml"
    space_file.write_text(SPACE)
    space = load_space(space_file)
    fixed = parse_flag_argv(
        [
            "--per_device_train_batch_size", "4", "--gradient_checkpointing", "false",
            "--vllm_gpu_memory_utilization", "0.5", "--deepspeed", "zero3", "--beta", "0.04",
        ]
    )  # fmt: skip
    rest, baseline = split_baseline(fixed, space.names)
    assert rest == {"beta": "0.04"}
    typed = coerce_knob_values(baseline, space)
    assert typed == {
        "per_device_train_batch_size": 4,
        "gradient_checkpointing": False,
        "vllm_gpu_memory_utilization": 0.5,
        "deepspeed": "zero3",
    }
    space.validate_params(typed)  # the space accepts the user's values as a trial
    assert coerce_knob_values({"deepspeed": "none", "other": "x"}, space) == {"deepspeed": None, "other": "x"}
    with pytest.raises(UsageError, match="is not a valid int"):
        coerce_knob_values({"per_device_train_batch_size": "four"}, space)
    with pytest.raises(AutotuneError):
        coerce_knob_values({"gradient_checkpointing": "maybe"}, space)


def test_pins_are_read_with_their_knob_types(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(SPACE)
    space = load_space(tmp_path / "s.yaml", backend="swift")
    pins = parse_pins(
        ["per_device_train_batch_size=4", "gradient-checkpointing=false", "deepspeed=none", "x=1"], space
    )
    assert pins == {
        "per_device_train_batch_size": 4,
        "gradient_checkpointing": False,
        "deepspeed": None,
        "x": "1",
    }
    assert type(pins["per_device_train_batch_size"]) is int


@pytest.mark.parametrize(
    ("items", "needle"),
    [
        (["per_device_train_batch_size"], "is not name=value"),
        (["=4"], "is not name=value"),
        (["per_device_train_batch_size=four"], "per_device_train_batch_size=four: not a valid int"),
        (["per_device_train_batch_size=2", "per_device_train_batch_size=4"], "given twice"),
    ],
)
def test_bad_pins_are_usage_errors(tmp_path: Path, items: list[str], needle: str) -> None:
    (tmp_path / "s.yaml").write_text(SPACE)
    space = load_space(tmp_path / "s.yaml", backend="swift")
    with pytest.raises(UsageError, match=needle):
        parse_pins(items, space)


def test_a_job_is_read_as_the_user_has_it(tmp_path: Path) -> None:
    """--fixed takes an ms-swift shell script, a verl command line or override list, a YAML mapping:
    each read by the backend that owns the syntax; the environment a shell line sets is named."""
    from autotune.backends import backend_class

    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n# my ms-swift job\nCUDA_VISIBLE_DEVICES=0,1 NPROC_PER_NODE=2 \\\n"
        "swift rlhf \\\n  --rlhf_type grpo \\\n  --dataset 'AI-MO/NuminaMath-TIR#1000' \\\n"
        "  --num_generations 8 --beta 0.04  # the KL\n"
    )
    args, env = backend_class("swift").read_job_file(script)
    assert args == {
        "rlhf_type": "grpo",
        "dataset": "AI-MO/NuminaMath-TIR#1000",
        "num_generations": "8",
        "beta": "0.04",
    }
    assert env == ["CUDA_VISIBLE_DEVICES", "NPROC_PER_NODE"]

    line = tmp_path / "verl.txt"
    line.write_text(
        "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo \\\n  data.train_batch_size=128\n"
    )
    assert backend_class("verl").read_job_file(line) == (
        {"algorithm.adv_estimator": "grpo", "data.train_batch_size": "128"},
        [],
    )
    listed = tmp_path / "overrides.yaml"
    listed.write_text("- data.train_batch_size=64\n- actor_rollout_ref.rollout.n=4\n")
    assert backend_class("verl").read_job_file(listed)[0] == {
        "data.train_batch_size": "64",
        "actor_rollout_ref.rollout.n": "4",
    }
    mapping = tmp_path / "job.yaml"
    mapping.write_text("beta: 0.04\nnum_generations: 8\n")
    assert backend_class("trl").read_job_file(mapping) == ({"beta": 0.04, "num_generations": 8}, [])
    # a file of bare flags, and one that is no command line at all
    flags = tmp_path / "flags.txt"
    flags.write_text("--beta 0.04 --num_generations 8\n")
    assert backend_class("swift").read_job_file(flags)[0] == {"beta": "0.04", "num_generations": "8"}
    broken = tmp_path / "broken.sh"
    broken.write_text("swift rlhf --dataset 'unclosed\n")
    with pytest.raises(UsageError, match="not a shell command line"):
        backend_class("swift").read_job_file(broken)
    with pytest.raises(UsageError, match="does not exist"):
        backend_class("swift").read_job_file(tmp_path / "missing.sh")
