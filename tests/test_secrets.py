"""The one secret rule: what it finds in argv, env, mappings and text, and how scripts read it back."""

from __future__ import annotations

import os
import subprocess

import pytest

from autotune.records import LaunchPlan
from autotune.secrets import MASK, SecretRule, env_name

TOKEN = "hf_abcdefghijklmnopqrstuvwxyz"
ARGV = [
    "python",
    "train.py",
    "--hf_token",
    TOKEN,
    "--wandb-key=wandb-123456",
    "trainer.logger.api_key=api-987654",
    "HF_TOKEN=envlike-555555",
    "--storage",
    "postgresql://bob:pw-4444444@db.example/optuna",
    "--max_new_tokens",
    "64",
    "--use_auth_token",
    "true",
]
SECRETS = (TOKEN, "wandb-123456", "api-987654", "envlike-555555", "pw-4444444")


def test_every_kind_of_secret_argument_is_masked_and_nothing_else() -> None:
    out = SecretRule().redact_argv(ARGV)
    assert not any(s in " ".join(out) for s in SECRETS)
    assert out[3] == MASK and out[4] == f"--wandb-key={MASK}"
    assert out[5] == f"trainer.logger.api_key={MASK}" and out[6] == f"HF_TOKEN={MASK}"
    assert out[8] == f"postgresql://bob:{MASK}@db.example/optuna"
    # not secrets: a token count, a boolean switch, the program
    assert out[9:] == ("--max_new_tokens", "64", "--use_auth_token", "true") and out[:3] == tuple(ARGV[:3])


def test_scripts_read_each_secret_from_a_named_variable_and_run_with_the_real_value(tmp_path) -> None:
    words, needed = SecretRule().script_words(ARGV)
    assert needed == ["HF_TOKEN", "WANDB_KEY", "TRAINER_LOGGER_API_KEY", "STORAGE_PASSWORD"]
    line = " ".join(words)
    assert not any(s in line for s in SECRETS)
    assert '--hf_token "${HF_TOKEN}"' in line and '--wandb-key="${WANDB_KEY}"' in line
    # bash, given the variables, rebuilds the original argv exactly
    env = {
        **os.environ,
        "HF_TOKEN": TOKEN,
        "WANDB_KEY": "wandb-123456",
        "TRAINER_LOGGER_API_KEY": "api-987654",
        "STORAGE_PASSWORD": "pw-4444444",
    }
    shown = subprocess.run(
        ["bash", "-c", 'printf "%s\\n" ' + line], capture_output=True, text=True, env=env, check=True
    ).stdout.splitlines()
    expected = list(ARGV)
    expected[6] = f"HF_TOKEN={TOKEN}"  # env-like NAME=value reads the variable of its own name
    assert shown == expected


def test_a_name_the_user_declares_is_secret_in_every_spelling() -> None:
    rule = SecretRule(["run-label"])
    assert rule.redact_argv(
        ["x", "--run_label", "private1", "--run-label=private2", "a.run_label=private3"]
    ) == (
        "x",
        "--run_label",
        MASK,
        f"--run-label={MASK}",
        f"a.run_label={MASK}",
    )
    assert "private9" not in rule.mask("launching with --run-label private9")
    assert not SecretRule().is_secret_name("run_label")
    # autotune's own option holds a name, not a secret
    assert rule.mask("autotune search --secret-arg run-label") == "autotune search --secret-arg run-label"


def test_values_learned_from_argv_and_env_are_masked_in_any_text() -> None:
    rule = SecretRule().learning(ARGV, {"MY_SERVICE_TOKEN": "svc-value-77"})
    text = f"Traceback: bad credentials pw-4444444 for {TOKEN}; svc-value-77 refused"
    masked = rule.mask(text)
    assert not any(s in masked for s in (*SECRETS, "svc-value-77")) and masked.count(MASK) == 3


def test_mappings_keep_their_keys_and_mask_secret_values() -> None:
    rule = SecretRule()
    fixed = {"hub_token": "abcdef123", "learning_rate": 1e-5, "push": True, "db": "mysql://u:pw999999@h/x"}
    assert rule.redact_mapping(fixed) == {
        "hub_token": MASK,
        "learning_rate": 1e-5,
        "push": True,
        "db": f"mysql://u:{MASK}@h/x",
    }


def test_a_masked_record_read_back_still_becomes_a_variable_in_a_script() -> None:
    """Exports build scripts from launch.json and study.json, which hold the mask, never the value."""
    masked = SecretRule().redact_argv(ARGV)
    words, needed = SecretRule().script_words(masked)
    assert MASK not in " ".join(words) and "HF_TOKEN" in needed and "STORAGE_PASSWORD" in needed


def test_command_sh_and_launch_json_never_hold_a_secret() -> None:
    plan = LaunchPlan(argv=tuple(ARGV), env={"WANDB_API_KEY": "k-7777777", "A": "1"}, cwd="/tmp")
    script = plan.to_shell()
    record = plan.redacted().model_dump_json()
    for text in (script, record):
        assert not any(s in text for s in (*SECRETS, "k-7777777")), text
    assert "export A=1" in script and "export WANDB_API_KEY" not in script
    assert "export HF_TOKEN WANDB_KEY TRAINER_LOGGER_API_KEY STORAGE_PASSWORD WANDB_API_KEY" in script
    assert plan.argv[3] == TOKEN  # the plan the runner launches keeps the real value


@pytest.mark.parametrize(
    ("name", "var"),
    [
        ("--hf_token", "HF_TOKEN"),
        ("--wandb-key", "WANDB_KEY"),
        ("a.b.api_key", "A_B_API_KEY"),
        ("--", "SECRET"),
    ],
)
def test_env_name(name: str, var: str) -> None:
    assert env_name(name) == var
