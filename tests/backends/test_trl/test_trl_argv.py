"""A TRL job's flags and ``--fixed`` YAML read by ``trl grpo``'s own parser (TRL's ``make_parser``, then
``accelerate launch``'s for what TRL leaves): values get TRL's types, a misspelt name is refused with the
nearest argument, a value TRL refuses is one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.errors import UsageError
from autotune.fixed import JOB_ARGS_PLACE, UnknownFlag

pytestmark = pytest.mark.trl
pytest.importorskip("trl")
pytest.importorskip("accelerate")

from autotune.backends.trl.backend import TrlBackend  # noqa: E402 - after the skips


def test_flags_after_dashdash_get_trls_types() -> None:
    """`-- --beta 0.04 --learning_rate 1e-5` are floats (as text they crashed every trial in GRPOConfig)."""
    args = TrlBackend.parse_fixed_argv(
        [
            "--beta",
            "0.04",
            "--learning_rate=1e-5",
            "--no_gradient_checkpointing",
            "--use_peft",
            "--lora_r",
            "8",
        ]
    )
    assert args == {
        "beta": 0.04,
        "learning_rate": 1e-5,
        "gradient_checkpointing": False,
        "use_peft": True,
        "lora_r": 8,
    }
    assert isinstance(args["beta"], float) and isinstance(args["lora_r"], int)


def test_accelerate_keys_are_typed_by_accelerate() -> None:
    """`trl grpo` hands what its parser leaves to `accelerate launch`: those keys are accelerate's."""
    args = TrlBackend.parse_fixed_argv(["--num_processes", "2", "--beta", "0"])
    assert args == {"num_processes": 2, "beta": 0.0}


def test_a_yaml_mapping_is_read_as_trl_reads_its_config(tmp_path: Path) -> None:
    """PyYAML reads `1e-5` as text; TRL's parser makes it a float, and so does the study."""
    job = tmp_path / "grpo.yaml"
    job.write_text("learning_rate: 1e-5\nbeta: '0.1'\nnum_processes: 2\nuse_peft: true\n")
    args, env = TrlBackend.read_job_file(job)
    assert args == {"learning_rate": 1e-5, "beta": 0.1, "num_processes": 2, "use_peft": True}
    assert env == []


@pytest.mark.parametrize(
    ("given", "nearest"),
    [
        (["--max_completion_lenght", "64"], "max_completion_length"),
        (["--beta", "0.1", "--learning-rat", "1e-5"], "learning_rate"),
        (["--learning", "1e-5"], "learning_rate"),  # no abbreviation read as another argument
    ],
)
def test_a_misspelt_flag_is_refused_with_the_nearest_argument(given: list[str], nearest: str) -> None:
    with pytest.raises(UnknownFlag, match=f"did you mean {nearest}") as info:
        TrlBackend.parse_fixed_argv(given)
    assert info.value.place == JOB_ARGS_PLACE and info.value.exit_code == 2
    assert "\n" not in info.value.one_line()


def test_a_misspelt_key_in_a_fixed_yaml_is_refused_not_called_accelerates(tmp_path: Path) -> None:
    job = tmp_path / "grpo.yaml"
    job.write_text("beta: 0.04\nmax_completion_lenght: 64\n")
    with pytest.raises(UnknownFlag) as info:
        TrlBackend.read_job_file(job)
    line = info.value.one_line()
    assert "max_completion_lenght" in line and "did you mean max_completion_length?" in line
    assert str(job) in line and "accelerate" not in line


def test_a_value_trl_refuses_is_one_line() -> None:
    with pytest.raises(UsageError, match=r"--beta: invalid float value: 'abc'") as info:
        TrlBackend.parse_fixed_argv(["--beta", "abc"])
    assert "\n" not in info.value.one_line()
