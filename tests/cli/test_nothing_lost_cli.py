"""Nothing a user has is lost or overwritten (issue 30), driven through the installed CLI with the
command backend and real child processes: a study's identity on disk (renamed, storage deleted, another
--study-name), --out on a directory that is not a study, report at any moment, bounded trials and
launch errors, damaged files read back as one line.

Each case asserts the exit code, one line on stderr and no traceback, and that every file the user or a
finished trial had is byte-identical afterwards."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.cli.conftest import autotune_exe

FAULT = str(Path(__file__).resolve().parents[1] / "fixtures" / "faults" / "fault.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _space(tmp_path: Path) -> Path:
    space = tmp_path / "space.yaml"
    space.write_text("backend: command\nknobs:\n  bs: {type: int, choices: [1, 2, 3, 4, 5], default: 1}\n")
    return space


def _search(
    out: Path, space: Path, *extra: str, fault: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    args = [
        autotune_exe(), "search", "--backend", "command", "--space", str(space), "--out", str(out),
        "--search", "grid", "--startup-timeout", "60s", "--confirm-runs", "0", *extra,
        "--", sys.executable, FAULT, *(fault or ("--mode", "ok", "--steps", "3", "--step-s", "0.01")),
    ]  # fmt: skip
    return subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=300)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([autotune_exe(), *args], capture_output=True, text=True, env=ENV, timeout=300)


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def _digests(root: Path) -> dict[str, str]:
    """Every file under ``root`` (but the storage and its lock) → its sha256."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.name.startswith(("study.db", "study.lock")):
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _trial_digests(root: Path) -> dict[str, str]:
    return {k: v for k, v in _digests(root).items() if k.startswith("trials/")}


def _statuses(out: Path) -> dict[int, str]:
    return {
        int(p.parent.name): json.loads(p.read_text())["status"]
        for p in (out / "trials").glob("*/result.json")
        if p.parent.name.isdigit()
    }


def test_a_study_resumes_as_itself_renamed_or_with_its_storage_lost(tmp_path: Path) -> None:
    space = _space(tmp_path)
    first = tmp_path / "runs" / "a"
    done = _search(first, space, "--trials", "2")
    assert done.returncode == 0, done.stderr
    # renamed: it resumes under the name study.json recorded, numbering goes on after trial 1
    moved = tmp_path / "runs" / "b"
    first.rename(moved)
    before = _trial_digests(moved)
    renamed = _search(moved, space, "--trials", "3")
    assert renamed.returncode == 0, renamed.stderr
    after = _trial_digests(moved)
    assert {k: after[k] for k in before} == before
    assert sorted(_statuses(moved)) == [0, 1, 2]
    # study.db deleted: rebuilt from the trial directories, numbering goes on after trial 2
    (moved / "study.db").unlink()
    before = _trial_digests(moved)
    rebuilt = _search(moved, space, "--trials", "4")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "rebuilt from 3 trial directories" in rebuilt.stdout
    after = _trial_digests(moved)
    assert {k: after[k] for k in before} == before
    assert sorted(_statuses(moved)) == [0, 1, 2, 3]
    # another --study-name would open an empty Optuna study numbered from 0: refused, nothing touched
    before = _digests(moved)
    other = _search(moved, space, "--trials", "5", "--study-name", "other")
    assert other.returncode == 2
    line = _one_line(other.stderr)
    assert "'a'" in line and "other" in line
    assert _digests(moved) == before


def test_out_refuses_a_directory_that_is_not_a_study(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "charts").mkdir(parents=True)
    (project / "report.md").write_text("my own notes\n")
    (project / "charts" / "mine.png").write_bytes(b"\x89PNG mine")
    (project / "src").mkdir()
    before = _digests(project)
    proc = _search(project, _space(tmp_path), "--trials", "1")
    assert proc.returncode == 2
    line = _one_line(proc.stderr)
    assert "report.md" in line and "charts" in line and "neither empty nor a study" in line
    assert _digests(project) == before
    assert sorted(p.name for p in project.iterdir()) == ["charts", "report.md", "src"]
    # flags refused as flags (not blamed on the storage), before anything is written
    for flag, value in (("--seed", "-1"), ("--sample-interval", "nan")):
        proc = _search(tmp_path / "fresh", _space(tmp_path), "--trials", "1", flag, value)
        assert proc.returncode == 2 and flag in _one_line(proc.stderr) and "storage" not in proc.stderr
        assert not (tmp_path / "fresh").exists()


def test_report_at_any_moment_and_damaged_files_in_one_line(tmp_path: Path) -> None:
    space = _space(tmp_path)
    out = tmp_path / "study"
    # during a search: trial 0 is still starting (its RUNNING placeholder is on disk)
    args = [
        autotune_exe(), "search", "--backend", "command", "--space", str(space), "--out", str(out),
        "--search", "grid", "--trials", "2", "--startup-timeout", "60s", "--confirm-runs", "0",
        "--", sys.executable, FAULT, "--mode", "ok", "--steps", "3", "--step-s", "0.01", "--startup-s", "3",
    ]  # fmt: skip
    tuner = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    deadline = time.monotonic() + 120
    while not (out / "trials" / "0" / "result.json").exists():
        assert tuner.poll() is None and time.monotonic() < deadline, "the search never started trial 0"
        time.sleep(0.05)
    live = _cli("report", str(out), "--no-png", "--out", str(tmp_path / "live-report"))
    assert tuner.wait(timeout=120) == 0
    assert live.returncode in (0, 3) and "Traceback" not in live.stderr, live.stderr
    assert "running: 0 of 2 trials" in (tmp_path / "live-report" / "report.md").read_text()
    # a study with no outcome (killed), then with an empty study.json: the report says what is missing
    settings = json.loads((out / "study.json").read_text())
    for text in (
        json.dumps({k: v for k, v in settings.items() if k not in ("outcome", "recommendation")}),
        "{}",
    ):
        (out / "study.json").write_text(text)
        trials = _trial_digests(out)
        proc = _cli("report", str(out), "--no-png")
        assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr
        assert "not ended" in (out / "report.md").read_text()
        assert _trial_digests(out) == trials
    # study.json that is not an object, a bad recommendation, a missing winner: one line each, exit 2
    cases = [
        ("[]", "does not hold a JSON object (it holds a list)"),
        ("null", "(it holds null)"),
        (json.dumps({**settings, "recommendation": {"trial": "x"}}), "its recommendation is not one"),
    ]
    for text, expected in cases:
        (out / "study.json").write_text(text)
        before = _digests(out)
        runs = [_cli("export", str(out), "--out", str(tmp_path / "x"))]
        if text == "[]":  # search reads the same file through the same guard
            runs.append(_search(out, space, "--trials", "3"))
        for proc in runs:
            assert proc.returncode == 2, (text, proc.stdout, proc.stderr)
            assert expected in _one_line(proc.stderr)
        assert _digests(out) == before
    (out / "study.json").write_text(json.dumps(settings))
    # an export name the filesystem refuses: one line
    proc = _cli("export", str(out), "--out", str(tmp_path / ("n" * 300)))
    assert proc.returncode == 2 and "File name too long" in _one_line(proc.stderr)
    winner = settings["recommendation"]["trial"]
    shutil.rmtree(out / "trials" / str(winner))
    proc = _cli("export", str(out), "--out", str(tmp_path / "y"))
    assert proc.returncode == 2
    assert f"recommends trial {winner}" in _one_line(proc.stderr)


def test_trials_are_bounded_and_launch_errors_are_invalid(tmp_path: Path) -> None:
    # a script that ignores AUTOTUNE_MAX_STEPS (it would make 100000 steps) ends after step 4, done
    out = tmp_path / "bounded"
    proc = _search(
        out, _space(tmp_path), "--trials", "1", "--max-steps", "4", "--no-early-stop",
        fault=("--mode", "ok", "--steps", "100000", "--step-s", "0.01"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "trials" / "0" / "result.json").read_text())
    assert (result["status"], result["steps"]) == ("COMPLETE", 4)
    assert "--max-steps" in result["reason"]
    # an argument the kernel refuses (E2BIG: 200 KB in one argument) is an INVALID trial; the study goes on
    space = tmp_path / "long.yaml"
    long_value = "x" * 200_000
    space.write_text(
        f"backend: command\nknobs:\n  s: {{type: str, choices: [a, {long_value}], default: a}}\n"
    )
    out = tmp_path / "e2big"
    proc = _search(
        out, space, "--trials", "2",
        fault=("--mode", "ok", "--steps", "3", "--step-s", "0.01", "--x", "{s}"),
    )  # fmt: skip
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert sorted(_statuses(out).values()) == ["COMPLETE", "INVALID"]
    invalid = next(
        json.loads(p.read_text()) for p in (out / "trials").glob("*/result.json") if "E2BIG" in p.read_text()
    )
    assert invalid["status"] == "INVALID" and len(invalid["reason"]) < 400
    # a format that cannot be rendered, or passes a repr: refused before anything is written
    for template in ("{bs:>20000000}", "{bs:>99999999999}", "{bs!r}"):
        out = tmp_path / "fmt"
        proc = _search(out, _space(tmp_path), "--trials", "1", fault=("--mode", "ok", "--x", template))
        assert proc.returncode == 2
        assert "{bs" in _one_line(proc.stderr)
        assert not out.exists()
