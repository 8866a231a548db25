"""Real faulty child processes driven through the installed CLI (command backend): each ends with the
right status and reason, leaves no process behind, and the study goes on to the next trial."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from autotune.trial.outcome import LIVE_HEALTH_MIN_STEPS
from tests.cli.conftest import autotune_exe, run_cli

FAULT = str(Path(__file__).resolve().parents[1] / "fixtures" / "faults" / "fault.py")

MODES = [
    "ok",
    "oom",
    "vllm_init",
    "hang",
    "segv",
    "sigkill",
    "kl_zero",
    "nan",
    "grandchild",
    "startup_invalid",
]
EXPECTED = {
    "ok": ("COMPLETE", None),
    "oom": ("OOM", "out of memory"),
    "vllm_init": ("VLLM_INIT", "vLLM"),
    "hang": ("HANG", "no step"),
    "segv": ("CRASH", "SIGSEGV"),
    "sigkill": ("HOST_OOM", "SIGKILL"),
    "kl_zero": ("UNHEALTHY", "grad_norm"),
    "nan": ("UNHEALTHY", "loss"),
    "grandchild": ("HANG", "no step"),
    "startup_invalid": ("INVALID", ""),
}


def trial_results(out: Path) -> list[Path]:
    """The trials' result files (numbered directories; ``confirm-*`` ones hold re-measurement runs)."""
    return sorted(p for p in (out / "trials").glob("*/result.json") if p.parent.name.isdigit())


def write_space(tmp_path: Path) -> Path:
    space = tmp_path / "faults.yaml"
    choices = ", ".join(MODES)
    space.write_text(f"backend: command\nknobs:\n  mode: {{type: str, choices: [{choices}], default: ok}}\n")
    return space


def test_every_fault_is_classified_and_cleaned_up(tmp_path: Path) -> None:
    # its own process: the faults' children, their signals and their clean-up are what is tested
    out = tmp_path / "study"
    proc = run_cli(
        "search", "--backend", "command", "--space", str(write_space(tmp_path)), "--out", str(out),
        "--search", "grid", "--trials", str(len(MODES)), "--hang-floor", "2s", "--hang-k", "3",
        "--startup-timeout", "60s", "--max-steps", "12",
        "--", sys.executable, FAULT, "--mode", "{mode}", "--steps", "8", "--fail-at", "2", "--step-s", "0.05",
        "--pid-file", "{trial_dir}/grandchild.pid",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = {}
    for rfile in trial_results(out):
        r = json.loads(rfile.read_text())
        results[r["params"]["mode"]] = r
    assert set(results) == set(MODES), sorted(results)
    # a run that cannot learn is stopped once it shows it, not run to its end (8 steps)
    assert results["kl_zero"]["steps"] <= LIVE_HEALTH_MIN_STEPS + 1, results["kl_zero"]
    assert results["nan"]["steps"] <= 2, results["nan"]
    for mode, (status, needle) in EXPECTED.items():
        r = results[mode]
        assert r["status"] == status, (mode, r["status"], r["reason"])
        if needle:
            assert needle.lower() in (r["reason"] + " " + (r.get("evidence") or "")).lower(), (
                mode,
                r["reason"],
                r.get("evidence"),
            )
        proc_json = out / "trials" / str(r["number"]) / "proc.json"
        if proc_json.exists():
            pgid = json.loads(proc_json.read_text())["pgid"]
            survivors = [p.pid for p in psutil.process_iter() if _pgid(p.pid) == pgid]
            assert survivors == [], (mode, survivors)
    grandchild_pid = int(
        (out / "trials" / str(results["grandchild"]["number"]) / "grandchild.pid").read_text()
    )
    assert (
        not psutil.pid_exists(grandchild_pid)
        or psutil.Process(grandchild_pid).status() == psutil.STATUS_ZOMBIE
    )
    assert results["ok"]["is_baseline"] is True
    assert "best: trial" in proc.stdout


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def test_a_study_killed_with_sigkill_resumes_intact_and_without_orphans(tmp_path: Path) -> None:
    space = tmp_path / "s.yaml"
    space.write_text("backend: command\nknobs:\n  bs: {type: int, choices: [1, 2, 3], default: 1}\n")
    out = tmp_path / "study"
    args = [
        autotune_exe(), "search", "--backend", "command", "--space", str(space), "--out", str(out),
        "--search", "grid", "--trials", "3", "--startup-timeout", "60s",
        "--", sys.executable, FAULT, "--mode", "ok", "--steps", "6", "--step-s", "0.05", "--startup-s", "{bs}",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    tuner = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 120
    proc_json = out / "trials" / "1" / "proc.json"
    while not proc_json.exists():
        assert time.monotonic() < deadline and tuner.poll() is None, "trial 1 never started"
        time.sleep(0.05)
    time.sleep(0.3)
    first = (out / "trials" / "0" / "result.json").read_bytes()
    assert json.loads(first)["status"] == "COMPLETE"
    orphan_pgid = json.loads(proc_json.read_text())["pgid"]
    tuner.send_signal(signal.SIGKILL)
    tuner.wait(timeout=10)
    assert any(_pgid(p.pid) == orphan_pgid for p in psutil.process_iter()), (
        "the trial should outlive a SIGKILLed tuner"
    )
    again = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (out / "trials" / "0" / "result.json").read_bytes() == first
    assert not any(_pgid(p.pid) == orphan_pgid for p in psutil.process_iter())
    results = [json.loads(p.read_text()) for p in trial_results(out)]
    interrupted = [r for r in results if r["status"] == "INTERRUPTED"]
    assert [r["number"] for r in interrupted] == [1]
    completed_bs = sorted(r["params"]["bs"] for r in results if r["status"] == "COMPLETE")
    assert completed_bs == [1, 2, 3]


@pytest.mark.parametrize("floor", ["-5", "-5s"])
def test_negative_hang_floor(cli, tmp_path: Path, floor: str) -> None:
    proc = cli(
        "search",
        "--backend",
        "command",
        "--space",
        str(write_space(tmp_path)),
        "--out",
        str(tmp_path / "o"),
        "--hang-floor",
        floor,
        "--",
        sys.executable,
        FAULT,
    )
    assert proc.returncode == 2 and "--hang-floor" in proc.stderr and "Traceback" not in proc.stderr
