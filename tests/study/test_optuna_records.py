"""A real study's Optuna records read as Optuna's own tools read them: ``optuna.load_study`` and
optuna-dashboard's serialiser (the JSON its web UI shows). A short real run with the ``command``
backend: a healthy trial is COMPLETE, an OOM is FAIL, a configuration never launched is PRUNED; the
metric name and the attributes are set."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import optuna
import pytest

from autotune.study.optuna_view import MachineAttrs
from tests.cli.conftest import run_cli

FAULT = str(Path(__file__).resolve().parents[1] / "fixtures" / "faults" / "fault.py")


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bs 1, 2, 4 (memory grows with it) × mode ok/oom, in grid order: the baseline (1, ok) completes,
    (1, oom) runs out of memory, so (2, oom) and (4, oom) need more memory than a configuration that
    already OOMed and are never launched."""
    tmp = tmp_path_factory.mktemp("optuna")
    space = tmp / "space.yaml"
    space.write_text(
        "backend: command\nknobs:\n"
        "  bs: {type: int, choices: [1, 2, 4], default: 1, memory: increasing}\n"
        "  mode: {type: str, choices: [ok, oom], default: ok}\n"
    )
    out = tmp / "study"
    proc = run_cli(
        "search", "--backend", "command", "--space", str(space), "--out", str(out), "--search", "grid",
        "--trials", "4", "--confirm-runs", "0", "--startup-timeout", "60s",
        "--", sys.executable, FAULT, "--mode", "{mode}", "--steps", "6", "--step-s", "0.05", "--fail-at", "1",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def _results(out: Path) -> dict[int, dict]:
    return {
        int(p.parent.name): json.loads(p.read_text())
        for p in (out / "trials").glob("*/result.json")
        if p.parent.name.isdigit()
    }


def test_optuna_load_study_sees_fail_pruned_and_complete(study: Path) -> None:
    ostudy = optuna.load_study(study_name=study.name, storage=f"sqlite:///{study / 'study.db'}")
    results = _results(study)
    by_number = {t.number: t for t in ostudy.get_trials(deepcopy=False)}
    assert set(by_number) == set(results)
    states = {}
    for number, r in results.items():
        t = by_number[number]
        assert t.user_attrs["status"] == r["status"] and t.user_attrs["reason"] == r["reason"][:500]
        states[r["status"]] = t.state
        if r["status"] == "COMPLETE":
            assert t.state is optuna.trial.TrialState.COMPLETE
            assert t.value == pytest.approx(r["steady"]["throughput"]) and t.value > 0
            assert t.user_attrs["steps"] == r["steps"] and t.user_attrs["throughput"] == t.value
        elif r["status"] == "PRUNED":
            assert r["steps"] == 0 and r["reason"].startswith("not launched")
            assert t.state is optuna.trial.TrialState.PRUNED and t.value is None
        else:
            assert t.state is optuna.trial.TrialState.FAIL and t.value is None
    # the study exercised each kind of record
    assert states == {
        "COMPLETE": optuna.trial.TrialState.COMPLETE,
        "OOM": optuna.trial.TrialState.FAIL,
        "PRUNED": optuna.trial.TrialState.PRUNED,
    }
    # nothing failed is a best trial any more
    assert ostudy.best_trial.user_attrs["status"] == "COMPLETE"
    assert ostudy.metric_names == ["completions_per_s"]
    attrs = ostudy.user_attrs  # short, for people; the full records are autotune's (MachineAttrs)
    assert attrs["backend"] == "command" and attrs["gpus"] == "cpu" and attrs["model"]
    assert attrs["study_json"] == str(study / "study.json")
    machine = MachineAttrs(ostudy)
    assert machine.get("hardware")["gpus"] == [] and machine.get("hardware")["host"]
    assert machine.get("model")["name"] and "optuna" in machine.get("versions")


def test_the_cpu_study_stores_what_it_measured(study: Path) -> None:
    ostudy = optuna.load_study(study_name=study.name, storage=f"sqlite:///{study / 'study.db'}")
    complete = [t for t in ostudy.get_trials() if t.state is optuna.trial.TrialState.COMPLETE]
    for t in complete:
        # a CPU run: the host's peak RSS, no GPU numbers
        assert t.user_attrs["host_peak_rss_bytes"] > 0
        assert "peak_mem_bytes" not in t.user_attrs and "gpu_util_mean_pct" not in t.user_attrs


def _dashboard_get(app, path: str) -> dict:
    """One GET of optuna-dashboard's JSON API, through its WSGI app (what its web UI fetches)."""
    import io
    from wsgiref.util import setup_testing_defaults

    environ: dict = {
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "REQUEST_METHOD": "GET",
        "wsgi.input": io.BytesIO(),
    }
    setup_testing_defaults(environ)
    status: list[str] = []
    body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
    assert status and status[0].startswith("200"), (path, status, body[:300])
    return json.loads(body)


def test_optuna_dashboard_shows_failures_as_fail(study: Path) -> None:
    dashboard = pytest.importorskip("optuna_dashboard._app")
    storage = optuna.storages.RDBStorage(f"sqlite:///{study / 'study.db'}")
    app = dashboard.create_app(storage)
    summaries = _dashboard_get(app, "/api/studies")["study_summaries"]
    study_id = next(s["study_id"] for s in summaries if s["study_name"] == study.name)
    detail = _dashboard_get(app, f"/api/studies/{study_id}")
    results = _results(study)
    shown = {t["number"]: t for t in detail["trials"]}
    assert set(shown) == set(results)
    dashboard_state = {"COMPLETE": "Complete", "OOM": "Fail", "PRUNED": "Pruned"}
    for number, r in results.items():
        t = shown[number]
        assert t["state"] == dashboard_state[r["status"]], (number, r["status"], t["state"])
        attrs = {a["key"]: a["value"] for a in t["user_attrs"]}
        assert attrs["status"] == r["status"]
        if r["status"] == "COMPLETE":
            assert t["values"] == [pytest.approx(r["steady"]["throughput"])]
            assert float(attrs["host_peak_rss_bytes"]) > 0
        else:
            assert "values" not in t  # nothing to plot or rank as if it had worked
    # the best trial the dashboard highlights is a healthy one
    assert [shown[b["number"]]["state"] for b in detail["best_trials"]] == ["Complete"]
    assert detail["objective_names"] == ["completions_per_s"]
    study_attrs = {a["key"]: a["value"] for a in detail["user_attrs"]}
    assert study_attrs["backend"] == "command" and study_attrs["gpus"] == "cpu"
    assert study_attrs["study_json"].endswith("study.json") and study_attrs["model"]
