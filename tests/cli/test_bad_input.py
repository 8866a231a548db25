"""Bad input: one line naming the problem and the fix, exit code 2, no traceback, nothing lost."""

from __future__ import annotations

from pathlib import Path

import pytest

SPACE_OK = "knobs:\n  bs: {type: int, choices: [1, 2], default: 1}\n"


@pytest.fixture
def existing_study(tmp_path: Path) -> Path:
    d = tmp_path / "study"
    (d / "trials" / "0").mkdir(parents=True)
    (d / "study.json").write_text('{"keep": "me"}')
    (d / "trials" / "0" / "result.json").write_text('{"keep": "this too"}')
    return d


def snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


CASES = {
    "unknown backend": (["--backend", "deepspeedy"], "unknown backend 'deepspeedy'"),
    "zero gpus": (["--gpus", "0"], "--gpus must be at least 1"),
    "too many gpus": (["--gpus", "64"], "asked for 64 GPU(s)"),
    "unknown model": (["--model", "Qwen9-1T"], "unknown model 'Qwen9-1T'"),
    "trials not a number": (["--trials", "abc"], "'--trials'"),
    "time budget nonsense": (["--time-budget", "soon"], "--time-budget 'soon' is not a duration"),
    "negative hang floor": (["--hang-floor", "-5"], "--hang-floor must not be negative"),
    "unknown search": (["--search", "bayes"], "unknown search 'bayes'"),
    "one confirmation run": (["--confirm-runs", "1"], "--confirm-runs must be 0 or at least 2"),
    "global batch not multiple": (
        ["--global-batch", "10", "--num-generations", "4"],
        "is not a multiple of num_generations",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_flags(cli, existing_study: Path, case: str) -> None:
    args, needle = CASES[case]
    before = snapshot(existing_study)
    proc = cli("search", "--out", str(existing_study), *args)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert snapshot(existing_study) == before


@pytest.mark.parametrize(
    ("space_text", "needle"),
    [
        ("knobs: [oops\n", "not valid YAML"),
        ("knobs:\n  no_such_knob: {type: int, choices: [1], default: 1}\n", "unknown knob 'no_such_knob'"),
        (
            "knobs:\n  per_device_train_batch_size: {type: int, low: 1, high: big, default: 1}\n",
            "is not a int",
        ),
    ],
)
def test_bad_space_files(cli, tmp_path: Path, existing_study: Path, space_text: str, needle: str) -> None:
    before = snapshot(existing_study)
    proc = cli("search", "--out", str(existing_study), "--space", write(tmp_path, "s.yaml", space_text))
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr
    assert snapshot(existing_study) == before


def test_command_template_naming_an_unknown_knob(cli, tmp_path: Path) -> None:
    space = write(tmp_path, "s.yaml", SPACE_OK)
    proc = cli(
        "search",
        "--backend",
        "command",
        "--space",
        space,
        "--out",
        str(tmp_path / "o"),
        "--",
        "python",
        "-c",
        "pass",
        "{nope}",
    )
    assert proc.returncode == 2, proc.stderr
    assert "nope" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o" / "study.json").exists()


def test_unwritable_out(cli, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("I am a file")
    proc = cli(
        "search",
        "--backend",
        "command",
        "--space",
        write(tmp_path, "s.yaml", SPACE_OK),
        "--out",
        str(blocker / "study"),
        "--",
        "python",
        "-c",
        "pass",
    )
    assert proc.returncode == 2, proc.stderr
    assert "cannot write to --out" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert blocker.read_text() == "I am a file"


def test_help_has_an_example_for_every_command(cli) -> None:
    for command in ("gpus", "doctor", "plan", "search", "report", "export", "profile"):
        proc = cli(command, "--help")
        assert proc.returncode == 0, (command, proc.stderr)
        assert "autotune " + command in proc.stdout or "Example" in proc.stdout, command
