from __future__ import annotations

from autotune.study.identity import identity_differences, study_identity

PLAIN = {
    "backend": "trl",
    "model": "tiny",
    "global_batch": 8,
    "num_generations": 4,
    "max_completion_length": 16,
    "dataset": None,
}
KNOBS = [
    {
        "name": "bs",
        "type": "int",
        "values": [1, 2],
        "default": 1,
        "when": {},
        "applies": "always",
        "help": "x",
    }
]


def test_the_same_definition_has_no_difference_and_help_text_does_not_count() -> None:
    a = study_identity(PLAIN, KNOBS, {"lr": 1e-5}, {})
    b = study_identity(PLAIN, [{**KNOBS[0], "help": "reworded"}], {"lr": 1e-5}, {})
    assert identity_differences(a, b) == []


def test_each_difference_is_named() -> None:
    a = study_identity(PLAIN, KNOBS, {"lr": 1e-5, "hf_token": "hf_secret"}, {"command": ["python", "a.py"]})
    b = study_identity(
        {**PLAIN, "global_batch": 16},
        [{**KNOBS[0], "values": [1, 4]}],
        {"lr": 2e-5, "hf_token": "hf_secret"},
        {"command": ["python", "b.py"]},
    )
    assert identity_differences(a, b) == [
        "global_batch 8, not 16",
        "a different search space (knobs: bs)",
        "different fixed arguments (lr)",
        "a different command",
    ]


def test_no_secret_is_recorded_and_an_older_identity_still_resumes() -> None:
    ident = study_identity(PLAIN, KNOBS, {"hf_token": "hf_secret"}, {"command": ["x", "--key", "sk-secret"]})
    assert "secret" not in repr(ident)
    older = {k: PLAIN[k] for k in ("backend", "global_batch", "num_generations", "max_completion_length")}
    assert identity_differences(older, ident) == []
