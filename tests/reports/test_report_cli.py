"""``autotune report DIR`` through the real CLI entry point."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import make_fixture as mf
import pytest

from autotune.cli.app import main


def run(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return int(exc.value.code or 0)


def test_report_prints_the_two_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "study"
    mf.write_study(root, [mf.spec(0), mf.spec(3), mf.spec(9)])
    assert run(["report", str(root), "--no-png"]) == 0
    out = capsys.readouterr().out.split()
    assert out == [str(root / "report.html"), str(root / "report.md")]
    assert (root / "report.html").is_file() and (root / "report.md").is_file()


def test_report_out_directory_and_pngs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "study"
    mf.write_study(root, [mf.spec(0), mf.spec(3)])
    out_dir = tmp_path / "out"
    assert run(["report", str(root), "--out", str(out_dir)]) == 0
    assert capsys.readouterr().out.split() == [str(out_dir / "report.html"), str(out_dir / "report.md")]
    assert (out_dir / "charts" / "timeline-trial-3.png").is_file()


def test_report_of_a_profile_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "s"
    mf.write_study(src, [mf.spec(4)])
    prof = tmp_path / "prof"
    shutil.copytree(src / "trials" / "4", prof)
    (prof / "profile.json").write_text(json.dumps({"command": "python train.py"}))
    assert run(["report", str(prof), "--no-png"]) == 0
    assert capsys.readouterr().out.split()[0] == str(prof / "report.html")
    assert 'data-rule="host_cpu_stall"' in (prof / "report.html").read_text()


@pytest.mark.parametrize("make", ["empty", "missing", "file"])
def test_not_a_study_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: str
) -> None:
    target = tmp_path / "x"
    if make == "empty":
        target.mkdir()
    elif make == "file":
        target.write_text("hello")
    assert run(["report", str(target)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in captured.err
    assert "study directory" in lines[0] or "not a directory" in lines[0]


def _unended(root: Path, numbers: list[int], budget: int) -> None:
    mf.write_study(root, [mf.spec(n) for n in numbers])
    settings = json.loads((root / "study.json").read_text())
    settings = {k: v for k, v in settings.items() if k not in ("outcome", "recommendation")}
    (root / "study.json").write_text(json.dumps({**settings, "budget": {"trials": budget, "time_s": None}}))


def test_report_during_a_search_renders_what_is_done_and_says_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from autotune.study.lock import StudyLock

    root = tmp_path / "study"
    _unended(root, [2, 5, 7, 10, 11], budget=12)  # five trials so far, none healthy yet
    with StudyLock(root):  # a live run holds the study, as autotune search does while it runs
        assert run(["report", str(root), "--no-png"]) == 0
    captured = capsys.readouterr()
    assert "running: 5 of 12 trials" in captured.err
    md = (root / "report.md").read_text()
    assert "running: 5 of 12 trials" in md and "No trial can be recommended" not in md
    assert "running: 5 of 12 trials" in (root / "report.html").read_text()


def test_a_study_whose_run_died_is_not_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "study"
    _unended(root, [2, 5], budget=12)
    dead = {"pid": 2**22 + 7, "host": __import__("socket").gethostname(), "create_time": 1.0}
    (root / "study.lock").write_text(json.dumps(dead) + "\n")
    assert run(["report", str(root), "--no-png"]) == 3  # nothing to recommend, and nothing will come
    assert "running:" not in capsys.readouterr().err
    assert "not ended" in (root / "report.md").read_text()
