"""Real ms-swift GRPO trials on CPU (slow: minutes). Run with ``pytest -m e2e`` in the ms-swift venv.

They need ms-swift's ``swift`` command (on PATH, or beside the running interpreter) and the tiny model,
which autotune builds locally on first use.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.backends._base import ModelRef, TrialContext
from autotune.backends.swift.backend import SwiftBackend
from autotune.errors import UsageError
from autotune.records import TrialSpec, TrialStatus
from autotune.trial.outcome import classify, health_check
from autotune.trial.runner import EarlyStopConfig, WatchdogConfig, alive_pids, run_trial

pytestmark = [pytest.mark.e2e, pytest.mark.swift]


def _swift() -> Path:
    found = shutil.which("swift")
    beside = Path(sys.executable).parent / "swift"
    if found:
        return Path(found)
    if beside.exists():
        return beside
    pytest.skip("ms-swift's `swift` command is not installed here")


def test_search_cli_runs_three_real_swift_trials(tmp_path: Path) -> None:
    swift = _swift()
    autotune = swift.parent / "autotune"
    if not autotune.exists():
        pytest.skip("autotune is not installed beside ms-swift")
    out = tmp_path / "study"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [
            str(autotune),
            "search",
            "--backend",
            "swift",
            "--model",
            "tiny-qwen2",
            "--executable",
            str(swift),
            "--trials",
            "3",
            "--global-batch",
            "8",
            "--num-generations",
            "4",
            "--max-steps",
            "6",
            "--no-early-stop",  # the baseline's six steps are checked below: a steady run may stop at 5
            "--confirm-runs",
            "0",  # the re-measurement is the TRL end-to-end tests' subject; here it would double the time
            "--out",
            str(out),
            "--",
            "--temperature",
            "1.0",
            "--beta",
            "0.04",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=1500,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # numbered directories are trials; confirm-* ones would be re-measurement runs (off here)
    results = [
        json.loads(p.read_text())
        for p in sorted((out / "trials").glob("*/result.json"))
        if p.parent.name.isdigit()
    ]
    # candidates refused before launch (a broken rule, a predicted OOM) are recorded but cost no budget
    launched = [r for r in results if not r["reason"].startswith("not launched")]
    assert len(launched) == 3, [(r["status"], r["reason"]) for r in results]
    baseline = next(r for r in results if r["is_baseline"])
    assert baseline["status"] == "COMPLETE" and baseline["steps"] == 6
    assert baseline["params"]["per_device_train_batch_size"] == 1  # ms-swift's own default
    complete = [r for r in results if r["status"] == "COMPLETE"]
    assert all(r["status"] in ("COMPLETE", "PRUNED") for r in results), [
        (r["status"], r["reason"]) for r in results
    ]
    for r in complete:
        assert r["steady"]["throughput"] > 0
    trial0 = out / "trials" / "0"
    command = (trial0 / "command.sh").read_text()
    assert "rlhf" in command and "--temperature" in command and "--logging_steps" in command
    steps = [json.loads(x) for x in (trial0 / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, 7))
    assert any(s["values"]["reward_std"] > 0 for s in steps)  # the demo reward varies
    assert all(s["duration_s"] and s["duration_s"] > 0 for s in steps)
    assert (out / "report.md").exists()


def test_two_process_trial(tmp_path: Path) -> None:
    from autotune.workload.tinymodels import ensure_model

    swift = _swift()
    backend = SwiftBackend(str(swift))
    backend.probe()
    study = tmp_path / "study"
    trial_dir = study / "trials" / "0"
    trial_dir.mkdir(parents=True)
    ctx = TrialContext(
        study_dir=study,
        trial_dir=trial_dir,
        model=ModelRef("tiny-qwen2", str(ensure_model("tiny-qwen2")), local=True),
        global_batch=8,
        num_generations=4,
        max_steps=5,
        max_completion_length=16,
        master_port=29577,
    )
    params = {
        "per_device_train_batch_size": 2,
        "gradient_checkpointing": True,
        "dataloader_num_workers": 0,
        "num_processes": 2,
    }
    assert backend.check_flags(params, ctx.fixed, ctx) == []
    derived = backend.derive(params, ctx)
    assert derived == {"world_size": 2, "gradient_accumulation_steps": 2}
    assert backend.check_rules(params, derived, ctx) == []
    spec = TrialSpec(number=0, params=params, derived=derived)
    plan = backend.render(spec, ctx)
    assert plan.env["NPROC_PER_NODE"] == "2"
    record = run_trial(
        plan,
        backend.parser(spec, ctx),
        trial_dir,
        global_batch=ctx.global_batch,
        watchdog=WatchdogConfig(startup_timeout_s=600, hang_floor_s=120),
        early_stop=EarlyStopConfig(enabled=False),
        patterns=backend.failure_patterns(),
    )
    health = health_check(record.steps, beta=0.04, max_completion_length=16, baseline=None)
    # judged as the executor judges a trial: a rank that dies at exit after the last step does not crash it
    verdict = classify(
        record, patterns=backend.failure_patterns(), health=health, steps_expected=ctx.max_steps
    )
    print(f"\ntwo-process ms-swift trial: exit {record.exit_code}: {verdict.reason}")
    assert verdict.status is TrialStatus.COMPLETE, verdict.reason
    assert [s.step for s in record.steps] == [1, 2, 3, 4, 5]
    stdout = (trial_dir / "stdout.log").read_text()
    assert "--nproc_per_node 2" in stdout  # torchrun started two
    # ... which train as one group (--use_cpu true): rank 0 alone logs each step; a rank that does not see
    # the group logs its own steps too
    assert sum(line.startswith("{'loss'") for line in stdout.splitlines()) == 5, stdout[-2000:]
    assert alive_pids(record.pids_seen) == []


def test_installed_flags_are_read_from_ms_swift(tmp_path: Path) -> None:
    from tests.backends.test_swift.test_swift_backend import ACCEPTED_46

    backend = SwiftBackend(str(_swift()), flag_cache_dir=tmp_path)
    info = backend.probe()
    names = backend.accepted_flag_names()
    assert ACCEPTED_46 <= names  # the list the unit tests use is the real one
    if info.version and info.version.startswith("4.6"):
        assert "train_type" not in names and "gc_collect_after_offload" not in names
    with pytest.raises(UsageError, match="not_a_flag is not an argument of swift rlhf"):
        backend.check_flags({}, {"not_a_flag": 1})
