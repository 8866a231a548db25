"""Secrets passed to a study never land in a file, an export or the tool's own output, while the trial
itself still receives them (real processes through the installed CLI, command backend)."""

from __future__ import annotations

import hashlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.cli.conftest import autotune_exe

TRAIN = """
import hashlib, json, os, sys, time
args = sys.argv[1:]
def value(flag):
    for i, a in enumerate(args):
        if a == flag:
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return ""
got = value("--hf_token") + value("--wandb-key") + value("trainer.api_key") + value("--run-label")
if hashlib.sha256(got.encode()).hexdigest() != os.environ["EXPECTED_SHA"]:
    print("the secrets did not arrive", file=sys.stderr)
    sys.exit(3)
steps = int(value("--steps") or 4)
for step in range(1, steps + 1):
    time.sleep(float(value("--step-s") or 0.02))
    print(json.dumps({"step": step, "samples": 16, "t_mono_s": time.monotonic(), "loss": 1.0 / step}), flush=True)
"""


def make_secrets() -> dict[str, str]:
    return {
        "hf": "hf_" + secrets.token_hex(12),
        "wandb": "wb" + secrets.token_hex(8),
        "api": "ak" + secrets.token_hex(8),
        "label": "lbl" + secrets.token_hex(8),
        "env": "ev" + secrets.token_hex(8),
    }


def leaks(root: Path, values: dict[str, str]) -> list[str]:
    """Every file under ``root`` (binary ones too: the Optuna database, parquet) holding a value."""
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            found += [f"{path}: {k}" for k, v in values.items() if v.encode() in data]
    return found


def test_no_secret_is_written_anywhere_and_the_trial_still_gets_it(tmp_path: Path) -> None:
    s = make_secrets()
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    space = tmp_path / "s.yaml"
    space.write_text(
        "backend: command\nknobs:\n  step_s: {type: float, choices: [0.02, 0.03], default: 0.02}\n"
    )
    out = tmp_path / "study"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "WANDB_API_KEY": s["env"],  # a secret of the environment, inherited by the trials
        "EXPECTED_SHA": hashlib.sha256((s["hf"] + s["wandb"] + s["api"] + s["label"]).encode()).hexdigest(),
    }
    args = [
        autotune_exe(), "search", "--backend", "command", "--space", str(space), "--out", str(out),
        "--search", "grid", "--trials", "2", "--confirm-runs", "2", "--startup-timeout", "60s",
        "--secret-arg", "run-label",
        "--", sys.executable, str(script), "--steps", "6", "--step-s", "{step_s}",
        "--hf_token", s["hf"], f"--wandb-key={s['wandb']}", f"trainer.api_key={s['api']}", "--run-label", s["label"],
    ]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "COMPLETE" in proc.stdout  # the check in train.py passed: the real values arrived
    printed = {"stdout": proc.stdout, "stderr": proc.stderr}
    # the exports, in every format (those the command backend cannot express refuse in one line)
    exports = tmp_path / "exports"
    for fmt in ("command", "json", "swift", "trl", "verl", "deepspeed"):
        done = subprocess.run(
            [autotune_exe(), "export", str(out), "--format", fmt], capture_output=True, text=True, env=env
        )
        printed[f"export {fmt}"] = done.stdout + done.stderr
        subprocess.run(
            [autotune_exe(), "export", str(out), "--format", fmt, "--out", str(exports / fmt)],
            capture_output=True,
            env=env,
        )
    rendered = subprocess.run(
        [autotune_exe(), "report", str(out), "--no-png"], capture_output=True, text=True
    )
    assert rendered.returncode == 0, rendered.stderr
    assert leaks(out, s) == [] and leaks(exports, s) == []
    assert [name for name, text in printed.items() if any(v in text for v in s.values())] == []
    # scripts read each secret from a named variable and say what to export
    trial_script = (out / "trials" / "0" / "command.sh").read_text()
    best = (out / "best" / "command.sh").read_text()
    for script_text in (trial_script, best, printed["export command"]):
        text = script_text.replace(" \\\n  ", " ")  # one command, written over several lines
        assert '--hf_token "${HF_TOKEN}"' in text and '--wandb-key="${WANDB_KEY}"' in text, text
        assert 'trainer.api_key="${TRAINER_API_KEY}"' in text and '--run-label "${RUN_LABEL}"' in text
    assert "export HF_TOKEN WANDB_KEY TRAINER_API_KEY RUN_LABEL" in trial_script
    assert '"--hf_token",\n    "***"' in (out / "trials" / "0" / "launch.json").read_text()
    # the trial's own command.sh re-runs it once the variables are exported
    rerun_env = {
        **env,
        "HF_TOKEN": s["hf"],
        "WANDB_KEY": s["wandb"],
        "TRAINER_API_KEY": s["api"],
        "RUN_LABEL": s["label"],
    }
    rerun = subprocess.run(
        ["bash", str(out / "trials" / "0" / "command.sh")], capture_output=True, env=rerun_env
    )
    assert rerun.returncode == 0, rerun.stderr


def test_the_resume_line_of_an_interrupted_study_reads_secrets_from_variables(tmp_path: Path) -> None:
    s = make_secrets()
    space = tmp_path / "s.yaml"
    space.write_text("backend: command\nknobs:\n  bs: {type: int, choices: [1, 2], default: 1}\n")
    fault = Path(__file__).resolve().parents[1] / "fixtures" / "faults" / "fault.py"
    out = tmp_path / "study"
    args = [
        autotune_exe(), "search", "--backend", "command", "--space", str(space), "--out", str(out),
        "--trials", "2", "--startup-timeout", "60s",
        "--", sys.executable, str(fault), "--mode", "forever", "--step-s", "0.05", "--hf_token", s["hf"],
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    tuner = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while (
        not (out / "trials" / "0" / "metrics.jsonl").exists()
        or not (out / "trials" / "0" / "metrics.jsonl").read_text()
    ):
        assert time.monotonic() < deadline and tuner.poll() is None, "trial 0 never stepped"
        time.sleep(0.05)
    tuner.send_signal(signal.SIGINT)
    stdout, stderr = tuner.communicate(timeout=120)
    assert s["hf"] not in stdout + stderr
    assert leaks(out, s) == []
    resume = [line for line in stdout.splitlines() if line.startswith("resume with:")]
    assert resume and '--hf_token "${HF_TOKEN}"' in resume[0] and "(export HF_TOKEN first)" in resume[0]


def test_a_profile_keeps_its_secrets_out_of_its_files(tmp_path: Path) -> None:
    s = make_secrets()
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    out = tmp_path / "profile"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "EXPECTED_SHA": hashlib.sha256((s["hf"] + s["label"]).encode()).hexdigest(),
    }
    proc = subprocess.run(
        [
            autotune_exe(),
            "profile",
            "--out",
            str(out),
            "--secret-arg",
            "run-label",
            "--global-batch",
            "16",
            "--",
            sys.executable,
            str(script),
            "--hf_token",
            s["hf"],
            "--run-label",
            s["label"],
        ],  # fmt: skip
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr  # train.py exits 3 when the values did not arrive
    assert leaks(out, s) == [] and not any(v in proc.stdout + proc.stderr for v in s.values())
