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
