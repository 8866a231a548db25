"""The CLI's documented exit codes (0 recommended, 2 usage, 3 nothing to recommend, 130 interrupted),
``--json`` on search, report and export, ``--pin`` on real studies, and shell completion — all through
the installed console script with real trials of the ``command`` backend."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.conftest import autotune_exe, run_cli

FAULT = str(Path(__file__).resolve().parents[1] / "fixtures" / "faults" / "fault.py")


def _space(tmp: Path, text: str) -> str:
    path = tmp / "space.yaml"
    path.write_text("backend: command\nknobs:\n" + text)
    return str(path)


def _search(tmp: Path, space: str, *extra: str, trials: int = 3) -> subprocess.CompletedProcess[str]:
    return run_cli(
        "search", "--backend", "command", "--space", space, "--out", str(tmp / "study"), "--search", "grid",
        "--trials", str(trials), "--confirm-runs", "0", "--startup-timeout", "60s", *extra,
        "--", sys.executable, FAULT, "--mode", "{mode}", "--steps", "5", "--step-s", "{wait}", "--fail-at", "1",
    )  # fmt: skip


@pytest.fixture(scope="module")
def pinned_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("pinned")
    space = _space(
        tmp,
        "  bs: {type: int, choices: [1, 2, 4], default: 1}\n"
        "  wait: {type: float, choices: [0.02, 0.04], default: 0.04}\n"
        "  mode: {type: str, choices: [ok], default: ok}\n",
    )
    proc = _search(tmp, space, "--pin", "bs=2", "--json", trials=4)
    return tmp / "study", proc


def test_a_pinned_knob_never_varies_and_the_summary_says_so(pinned_study) -> None:
    out, proc = pinned_study
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout)  # --json: stdout holds the summary alone
    assert summary["exit_code"] == 0 and summary["recommendation"] is not None
    assert summary["knobs"] == {"searched": ["wait"], "pinned": {"bs": 2}}
    results = [json.loads(p.read_text()) for p in (out / "trials").glob("[0-9]*/result.json")]
    assert len(results) == 2  # every configuration with bs=2: the grid is exhausted
    assert {r["params"]["bs"] for r in results} == {2}
    assert {r["params"]["wait"] for r in results} == {0.02, 0.04}
    assert any(r["is_baseline"] for r in results)  # the baseline holds the pin too
    space = {k["name"]: k for k in json.loads((out / "study.json").read_text())["space"]}
    assert space["bs"]["pinned"] is True and space["bs"]["values"] == [2]
    assert space["wait"]["pinned"] is False
    assert "knobs searched: wait; pinned: bs=2" in proc.stderr  # the human summary, on stderr with --json


def test_export_and_report_json_on_a_study_with_a_winner(pinned_study) -> None:
    out, _ = pinned_study
    proc = run_cli("export", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["recommended"] is True and data["main"] in data["files"] and data["written"] is None
    assert "--step-s" in data["files"][data["main"]]
    written = run_cli("export", str(out), "--json", "--out", str(out / "exported"))
    assert written.returncode == 0, written.stderr
    assert all(Path(p).is_file() for p in json.loads(written.stdout)["written"])
    report = run_cli("report", str(out), "--json", "--no-png")
    assert report.returncode == 0, report.stderr
    rdata = json.loads(report.stdout)
    assert Path(rdata["html"]).is_file() and Path(rdata["markdown"]).is_file()
    assert rdata["recommended_trial"] == data["trial"] and rdata["no_recommendation"] is None
    assert "| Knobs pinned | bs=2 (--pin: the same in every trial) |" in Path(rdata["markdown"]).read_text()


def test_nothing_to_recommend_exits_3_with_the_reason(tmp_path: Path) -> None:
    space = _space(
        tmp_path,
        "  wait: {type: float, choices: [0.02], default: 0.02}\n  mode: {type: str, choices: [oom], default: oom}\n",
    )
    proc = _search(tmp_path, space, trials=1)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "nothing to recommend" in proc.stdout
    out = tmp_path / "study"
    export = run_cli("export", str(out))
    assert export.returncode == 3
    assert (
        export.stderr.count("\n") == 1
        and "has no recommendation" in export.stderr
        and "1 OOM" in export.stderr
    )
    report = run_cli("report", str(out), "--no-png", "--json")
    assert report.returncode == 3
    assert json.loads(report.stdout)["no_recommendation"].startswith("No trial can be recommended")
    assert (out / "report.md").is_file()  # the reports are still written
    assert "No trial can be recommended" in report.stderr


@pytest.mark.parametrize(
    ("pin", "needle"),
    [
        ("nope=1", "cannot pin 'nope': no such knob. Knobs: bs, mode"),
        ("bs=3", "cannot pin 'bs' to 3: not one of its values. Allowed: 1, 2"),
        ("bs=two", "--pin bs=two: not a valid int. Allowed: 1, 2"),
        ("bs", "--pin 'bs' is not name=value"),
    ],
)
def test_a_bad_pin_is_a_usage_error(tmp_path: Path, pin: str, needle: str) -> None:
    space = _space(
        tmp_path,
        "  bs: {type: int, choices: [1, 2], default: 1}\n  mode: {type: str, choices: [ok], default: ok}\n",
    )
    proc = run_cli(
        "search", "--backend", "command", "--space", space, "--out", str(tmp_path / "s"), "--pin", pin,
        "--", sys.executable, FAULT, "--mode", "{mode}",
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and needle in proc.stderr, proc.stderr
    assert not (tmp_path / "s").exists()  # refused before anything was written


def test_ctrl_c_exits_130_and_says_how_to_resume(tmp_path: Path) -> None:
    space = _space(
        tmp_path,
        "  wait: {type: float, choices: [0.5], default: 0.5}\n  mode: {type: str, choices: [ok], default: ok}\n",
    )
    out = tmp_path / "study"
    args = [
        autotune_exe(), "search", "--backend", "command", "--space", space, "--out", str(out),
        "--trials", "2", "--confirm-runs", "0", "--startup-timeout", "60s",
        "--", sys.executable, FAULT, "--mode", "{mode}", "--steps", "40", "--step-s", "{wait}",
    ]  # fmt: skip
    tuner = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    deadline = time.monotonic() + 120
    while not (out / "trials" / "0" / "metrics.jsonl").exists():
        assert time.monotonic() < deadline and tuner.poll() is None, "trial 0 never started"
        time.sleep(0.05)
    tuner.send_signal(signal.SIGINT)
    stdout, stderr = tuner.communicate(timeout=120)
    assert tuner.returncode == 130, stdout + stderr
    assert "resume with:" in stdout


def test_show_completion_prints_a_script_for_the_shell_given() -> None:
    # typer detects the user's shell; its own switch for tests makes the shell an argument instead
    env = {"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    bash = run_cli("--show-completion", "bash", env=env)
    assert bash.returncode == 0, bash.stderr
    assert "_AUTOTUNE_COMPLETE=complete_bash" in bash.stdout and "complete -o default" in bash.stdout
    zsh = run_cli("--show-completion", "zsh", env=env)
    assert zsh.returncode == 0, zsh.stderr
    assert "#compdef autotune" in zsh.stdout and "_AUTOTUNE_COMPLETE=complete_zsh" in zsh.stdout
    assert "--install-completion" in run_cli("-h").stdout
    # and the script's call completes: a command, then one of its options
    words = run_cli(
        env={"_AUTOTUNE_COMPLETE": "complete_bash", "COMP_WORDS": "autotune se", "COMP_CWORD": "1"}
    )
    assert words.returncode == 0 and words.stdout.split() == ["search"]
    flags = run_cli(
        env={"_AUTOTUNE_COMPLETE": "complete_bash", "COMP_WORDS": "autotune search --pi", "COMP_CWORD": "2"}
    )
    assert flags.stdout.split() == ["--pin"]


def test_a_pin_that_contradicts_the_baseline_is_refused(tmp_path: Path) -> None:
    space = _space(
        tmp_path,
        "  bs: {type: int, choices: [1, 2], default: 1}\n  mode: {type: str, choices: [ok], default: ok}\n",
    )
    baseline = tmp_path / "base.yaml"
    baseline.write_text("bs: 1\n")
    proc = run_cli(
        "search", "--backend", "command", "--space", space, "--out", str(tmp_path / "s"), "--pin", "bs=2",
        "--baseline", str(baseline), "--", sys.executable, FAULT, "--mode", "{mode}",
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--pin bs=2 contradicts --baseline, which set bs=1" in proc.stderr and proc.stderr.count("\n") == 1
