"""``--report-to``: each framework is told in its own option (the Trainer's ``report_to`` and
``run_name`` in TRL and ms-swift, verl's ``trainer.logger``, ``project_name`` and ``experiment_name``);
without trackers the trial reports nowhere, as before. The executor adds the trackers' variables."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from autotune.backends.swift.backend import SwiftBackend
from autotune.backends.trl.backend import TrlBackend
from autotune.backends.verl.backend import VerlBackend
from autotune.records import TrialSpec
from tests.backends.test_swift import test_swift_backend as swift_tests
from tests.backends.test_trl import test_trl_backend as trl_tests
from tests.backends.test_verl import test_verl_backend as verl_tests

TRACKED = {"report_to": ("tensorboard", "wandb"), "run_name": "study-trial-3", "project": "study"}


def _swift_argv(tmp_path: Path, **kw: Any) -> list[str]:
    b = SwiftBackend(
        "/opt/swift/bin/swift",
        version="4.6.0",
        flag_names=swift_tests.ACCEPTED_46 | {"run_name"},
        cpu_threads=1,
        environ={},
    )
    ctx = swift_tests.make_ctx(tmp_path, **kw)
    return list(swift_tests.render(b, dict(swift_tests.CPU_KNOBS), ctx).argv)


def _value(argv: list[str], flag: str) -> list[str]:
    i = argv.index(flag)
    out = []
    for a in argv[i + 1 :]:
        if a.startswith("--"):
            break
        out.append(a)
    return out


def test_trl_reports_to_the_trackers_under_the_trials_name(tmp_path: Path) -> None:
    b = TrlBackend()
    _, quiet = trl_tests.render(b, trl_tests.make_ctx(tmp_path / "a"), {"per_device_train_batch_size": 4})
    assert quiet["grpo_config"]["report_to"] == "none" and "run_name" not in quiet["grpo_config"]
    _, tracked = trl_tests.render(
        b, trl_tests.make_ctx(tmp_path / "b", **TRACKED), {"per_device_train_batch_size": 4}
    )
    assert tracked["grpo_config"]["report_to"] == ["tensorboard", "wandb"]
    assert tracked["grpo_config"]["run_name"] == "study-trial-3"


def test_swift_reports_to_the_trackers_under_the_trials_name(tmp_path: Path) -> None:
    quiet = _swift_argv(tmp_path / "a")
    assert _value(quiet, "--report_to") == ["none"] and "--run_name" not in quiet
    tracked = _swift_argv(tmp_path / "b", **TRACKED)
    assert _value(tracked, "--report_to") == ["tensorboard", "wandb"]
    assert _value(tracked, "--run_name") == ["study-trial-3"]


def test_verl_logs_to_the_trackers_under_the_studys_project(tmp_path: Path) -> None:
    backend = VerlBackend(python=sys.executable)

    def items(ctx: Any) -> dict[str, str]:
        params = {**verl_tests.baseline(backend), verl_tests.LOG_PROB_MICRO: 4}
        plan = backend.render(TrialSpec(number=3, params=params, derived=backend.derive(params, ctx)), ctx)
        return dict(a.split("=", 1) for a in plan.argv[3:])

    quiet = items(verl_tests.make_ctx(tmp_path / "a"))
    assert quiet["trainer.logger"] == "[console]" and "trainer.experiment_name" not in quiet
    tracked = items(verl_tests.make_ctx(tmp_path / "b", **TRACKED))
    assert tracked["trainer.logger"] == "[console,tensorboard,wandb]"
    assert (
        tracked["trainer.project_name"] == "study" and tracked["trainer.experiment_name"] == "study-trial-3"
    )


def test_the_executor_names_the_run_and_adds_the_trackers_variables(tmp_path: Path, monkeypatch: Any) -> None:
    from autotune.trackers import TRACKERS, Trackers
    from autotune.trial.execute import _tracked

    for name in ("TENSORBOARD_LOGGING_DIR", "TENSORBOARD_DIR", "WANDB_PROJECT", "WANDB_DIR"):
        monkeypatch.delenv(name, raising=False)
    ctx = trl_tests.make_ctx(tmp_path)
    tracked, env = _tracked(ctx, Trackers(["tensorboard", "wandb"], TRACKERS))
    assert dataclasses.asdict(tracked) | {} == dataclasses.asdict(ctx) | {
        "report_to": ("tensorboard", "wandb"),
        "run_name": "study-trial-1",
        "project": "study",
    }
    assert env["TENSORBOARD_LOGGING_DIR"] == str(ctx.trial_dir / "tensorboard")
    assert env["WANDB_NAME"] == "study-trial-1" and env["WANDB_PROJECT"] == "study"
