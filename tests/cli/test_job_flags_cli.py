"""The job's flags, typed by the framework's own parser, through the CLI.

`-- --beta 0.04 --learning_rate 1e-5` reaches TRL as floats and trains (as text, every trial crashed in
GRPOConfig); a misspelt `--fixed` key is one line naming TRL's nearest field, exit 2, before the study
directory exists; autotune's own option given after `--` is named as autotune's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.cli.app import main

pytestmark = pytest.mark.trl
pytest.importorskip("trl")


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI in-process; it must exit 2 with one line on stderr, which is returned."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    captured = capsys.readouterr()
    assert info.value.code == 2, captured.out + captured.err
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    return lines[0]


def test_a_misspelt_fixed_key_is_refused_before_the_study(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "grpo.yaml"
    job.write_text("beta: 0.04\nmax_completion_lenght: 64\n")
    out = tmp_path / "runs" / "typo"
    line = _refused(
        ["search", "--backend", "trl", "--model", "tiny-qwen2", "--trials", "1", "--fixed", str(job),
         "--out", str(out)],
        capsys,
    )  # fmt: skip
    assert "max_completion_lenght" in line and "did you mean max_completion_length?" in line
    assert "accelerate" not in line
    assert not out.exists() and not out.parent.exists()


def test_autotune_options_after_dashdash_are_named_as_autotunes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs" / "ff"
    line = _refused(
        ["search", "--backend", "trl", "--model", "tiny-qwen2", "--out", str(out), "--",
         "--beta", "0.04", "--trials", "1", "--out", "runs/ff"],
        capsys,
    )  # fmt: skip
    assert "give --trials before --" in line
    assert not out.exists()
    # a misspelt TRL flag after -- is TRL's refusal, with TRL's nearest field
    line = _refused(
        ["search", "--backend", "trl", "--model", "tiny-qwen2", "--out", str(out), "--",
         "--max_completion_lenght", "8"],
        capsys,
    )  # fmt: skip
    assert "did you mean max_completion_length?" in line and not out.exists()


@pytest.mark.e2e
def test_typed_job_flags_train(cli, tmp_path: Path) -> None:
    """The issue's check: a small-qwen2 study of 2 trials with `-- --beta 0.04 --learning_rate 1e-5`
    completes, and the trials' GRPOConfig got numbers."""
    out = tmp_path / "study"
    proc = cli(
        "search", "--backend", "trl", "--model", "small-qwen2", "--trials", "2", "--max-steps", "2",
        "--confirm-runs", "0", "--out", str(out), "--", "--beta", "0.04", "--learning_rate", "1e-5",
        cwd=tmp_path, timeout=1800,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = [json.loads(p.read_text()) for p in sorted(out.glob("trials/*/result.json"))]
    assert results and any(r["status"] == "COMPLETE" for r in results), results
    config = json.loads((out / "trials" / "0" / "trial_config.json").read_text())["grpo_config"]
    assert config["beta"] == 0.04 and config["learning_rate"] == 1e-5
