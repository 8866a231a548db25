"""Secrets never reach a report; absolute study paths become relative."""

from __future__ import annotations

import pytest
from autotune.reports._safety import MASK, Sanitizer, is_secret_name


@pytest.mark.parametrize(
    ("text", "leaked"),
    [
        ("export HF_TOKEN=hf_abcdefghijklmnopqrstuvwx", "hf_abcdefghijklmnopqrstuvwx"),
        ("export WANDB_API_KEY='0123456789abcdef'", "0123456789abcdef"),
        ('{"hub_token": "s3cr3t-value"}', "s3cr3t-value"),
        ("'api_key': 'zz-top-secret'", "zz-top-secret"),
        ("--hub_token abcdef123456 --max_steps 5", "abcdef123456"),
        ("--api-key=qwerty987654", "qwerty987654"),
        ("--hub_token \\\n  abcdef123456", "abcdef123456"),
        ("postgresql://bob:pw123456@db.example/optuna", "pw123456"),
        ("see https://x.example/api?token=hf_abcdefghijklmnopqrstuv", "hf_abcdefghijklmnopqrstuv"),
        ("key sk-abcdefghijklmnopqrstuvwxyz012345 leaked", "sk-abcdefghijklmnopqrstuvwxyz012345"),
        ("ghp_abcdefghijklmnopqrstuvwxyz0123 in a log", "ghp_abcdefghijklmnopqrstuvwxyz0123"),
        ("AWS AKIAABCDEFGHIJKLMNOP used", "AKIAABCDEFGHIJKLMNOP"),
        ("PASSWORD: hunter22", "hunter22"),
    ],
)
def test_secrets_are_masked(text: str, leaked: str) -> None:
    out = Sanitizer().clean(text)
    assert leaked not in out
    assert MASK in out


@pytest.mark.parametrize(
    "text",
    [
        "max_new_tokens=16 num_tokens: 5 TOKENIZERS_PARALLELISM=false",
        "--max_completion_length 1024 --per_device_train_batch_size 4",
        "completions/mean_length 702 tokens/s 1400",
    ],
)
def test_ordinary_text_is_untouched(text: str) -> None:
    assert Sanitizer().clean(text) == text


def test_secret_values_from_the_environment_are_masked_anywhere() -> None:
    clean = Sanitizer.for_study(
        [], [{"MY_SERVICE_TOKEN": "plainvalue99"}], environ={"OTHER_SECRET": "zzz-12345", "HOME": "/root"}
    )
    assert clean.clean("got plainvalue99 and zzz-12345 at /root") == f"got {MASK} and {MASK} at /root"


def test_short_or_benign_values_are_not_treated_as_secrets() -> None:
    clean = Sanitizer.for_study([], [], environ={"SOME_TOKEN": "true", "TOKENIZERS_PARALLELISM": "false-ish"})
    assert clean.clean("true false-ish") == "true false-ish"
    # the same secret name with a value of six characters or more is masked wherever it appears,
    # beside the benign ones that stay
    clean = Sanitizer.for_study([], [], environ={"SOME_TOKEN": "tok123", "OTHER_TOKEN": "true"})
    assert clean.clean("got tok123 and true") == f"got {MASK} and true"


def test_secret_names() -> None:
    assert (
        is_secret_name("HF_TOKEN")
        and is_secret_name("WANDB_API_KEY")
        and is_secret_name("AWS_SECRET_ACCESS_KEY")
    )
    assert not is_secret_name("TOKENIZERS_PARALLELISM") and not is_secret_name("max_new_tokens")
    assert not is_secret_name("CUDA_VISIBLE_DEVICES") and not is_secret_name("MONKEY")


def test_study_paths_become_relative() -> None:
    clean = Sanitizer(["/data/runs/q", "/home/u/runs/q/"])
    assert clean.clean("cd /data/runs/q/trials/3 && ls /data/runs/q") == "cd trials/3 && ls ."
    assert clean.clean("'/home/u/runs/q/best/command.sh'") == "'best/command.sh'"
    # A sibling directory that merely starts with the same characters is not the study.
    assert clean.clean("/data/runs/q-old/x /data/runs/qq") == "/data/runs/q-old/x /data/runs/qq"


def test_clean_value_keeps_numbers() -> None:
    clean = Sanitizer()
    assert clean.clean_value(3) == 3 and clean.clean_value(None) is None and clean.clean_value(True) is True
    assert clean.clean_value("HF_TOKEN=abcdefgh") == f"HF_TOKEN={MASK}"
