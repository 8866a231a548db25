"""The callback for users' Trainer scripts and the pieces it is made of (also the TRL worker's)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from autotune.probes import phases
from autotune.probes.callback import MetricsWriter, PhaseTracker, numeric_values, watch_trainer


def test_metrics_writer_lines(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    w = MetricsWriter(path, 16)
    w.train_begin()
    w.step_end(1)
    rec = w.log(
        1, {"loss": 0.1, "completions/mean_length": 12.0, "reward": 0.4, "epoch": 0.1, "flag": True, "s": "x"}
    )
    assert rec is not None and rec["tokens"] == 12.0 * 16 and rec["samples"] == 16
    assert rec["duration_s"] is not None and rec["duration_s"] >= 0
    assert rec["values"] == {"loss": 0.1, "completions/mean_length": 12.0, "reward": 0.4, "epoch": 0.1}
    assert w.log(1, {"loss": 0.2}) is None  # one line per step
    assert w.log(1, {"train_runtime": 3.0, "train_loss": 0.1}) is None  # the end-of-training summary
    w.step_end(2)
    w.log(2, {"loss": float("nan")})
    w.close()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    assert lines[1]["tokens"] is None and math.isnan(lines[1]["values"]["loss"])
    assert lines[1]["t_mono_s"] >= lines[0]["t_mono_s"]
    other = MetricsWriter(tmp_path / "rank1.jsonl", 16, is_main=False)
    assert other.log(1, {"loss": 0.1}) is None
    assert not (tmp_path / "rank1.jsonl").exists()


def test_numeric_values_drops_bools_and_text() -> None:
    assert numeric_values({"a": 1, "b": 2.5, "c": True, "d": "3", "e": None}) == {"a": 1.0, "b": 2.5}


class FakeMarker:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, int | None]] = []

    def mark(self, phase: str, event: str, step: int | None = None) -> None:
        self.events.append((phase, event, step))


def test_phase_tracker_gives_disjoint_intervals() -> None:
    m = FakeMarker()
    t = PhaseTracker(m)
    with t.rollout(1):
        with t.weight_sync(1):
            pass
    t.train_ready(1)
    t.train_ready(1)  # a second micro-batch of the same step does not reopen train
    t.step_end(1)
    with t.rollout(2):
        pass
    t.train_ready(2)
    t.step_end(2)
    t.step_end(2)
    assert m.events == [
        ("rollout", "begin", 1),
        ("rollout", "end", 1),
        ("weight_sync", "begin", 1),
        ("weight_sync", "end", 1),
        ("rollout", "begin", 1),
        ("rollout", "end", 1),
        ("train", "begin", 1),
        ("train", "end", 1),
        ("rollout", "begin", 2),
        ("rollout", "end", 2),
        ("train", "begin", 2),
        ("train", "end", 2),
    ]
    open_phases: set[str] = set()
    for phase, event, _ in m.events:  # never two phases open at once
        if event == "begin":
            assert not open_phases
            open_phases.add(phase)
        else:
            open_phases.remove(phase)


# ------------------------------------------------------------------------------ the callback itself

USER_SCRIPT = Path(__file__).parent / "data" / "user_grpo_script.py"


class _State:
    global_step = 0


class FakeGRPOTrainer:
    """The methods of TRL 1.16's GRPOTrainer the callback wraps, called in the order its step calls them."""

    def __init__(self, marker: FakeMarker) -> None:
        self.state = _State()
        self.model = type("M", (), {"training": True})()
        self.marker = marker

    def _generate(self, prompts: list[str]) -> list[str]:
        self.marker.mark("(generating)", "", None)
        return prompts

    def _calculate_rewards(self, completions: list[str]) -> list[float]:
        self.marker.mark("(scoring)", "", None)
        return [0.0 for _ in completions]

    def _generate_and_score_completions(self, prompts: list[str]) -> list[float]:
        return self._calculate_rewards(self._generate(prompts))

    def _prepare_inputs(self, batch: list[str]) -> list[float]:
        return self._generate_and_score_completions(batch)


def test_watch_trainer_brackets_generation_and_scoring_exactly() -> None:
    m = FakeMarker()
    trainer = FakeGRPOTrainer(m)
    tracker = PhaseTracker(m)
    assert watch_trainer(trainer, tracker) == ["_generate", "_calculate_rewards", "_prepare_inputs"]
    assert watch_trainer(trainer, tracker) == []  # a second call wraps nothing more
    trainer._prepare_inputs(["a"])
    tracker.step_end(1)
    assert m.events == [
        ("rollout", "begin", 1),
        ("(generating)", "", None),
        ("rollout", "end", 1),
        ("train", "begin", 1),
        ("train", "end", 1),
        ("other", "begin", 1),
        ("(scoring)", "", None),
        ("other", "end", 1),
        ("train", "begin", 1),
        ("train", "end", 1),
    ]
    m.events.clear()
    trainer.model.training = False  # evaluation generates too: not a training phase
    trainer._prepare_inputs(["a"])
    assert [e for e in m.events if e[1]] == []
    assert FakeGRPOTrainer._generate.__name__ == "_generate"  # the class is untouched


def test_importing_the_callback_module_needs_no_transformers() -> None:
    code = (
        "import sys\n"
        "import autotune.probes.callback as c\n"
        "assert 'transformers' not in sys.modules, 'imported transformers'\n"
        "assert not any(m.startswith('autotune.') and not m.startswith('autotune.probes') for m in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.trl
def test_the_callback_is_a_trainer_callback(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    from autotune.probes.callback import AutotuneCallback
    from transformers import TrainerCallback

    monkeypatch.delenv("AUTOTUNE_METRICS_FILE", raising=False)
    cb = AutotuneCallback()
    assert isinstance(cb, TrainerCallback) and cb.metrics_path is None and cb.watched == []
    monkeypatch.setenv("AUTOTUNE_METRICS_FILE", "/tmp/m.jsonl")
    assert AutotuneCallback().metrics_path == Path("/tmp/m.jsonl")


@pytest.mark.trl
def test_without_the_trainer_only_step_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The step's edges alone cannot tell generation from training: no marker; samples from the args."""
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from autotune.probes.callback import AutotuneCallback

    monkeypatch.delenv("RANK", raising=False)
    m = FakeMarker()
    cb = AutotuneCallback(metrics_path=tmp_path / "m.jsonl", marker=m)
    args = SimpleNamespace(per_device_train_batch_size=4, gradient_accumulation_steps=2, world_size=1)
    state = SimpleNamespace(global_step=0, is_world_process_zero=True)
    cb.on_train_begin(args, state, None)
    assert (tmp_path / "m.jsonl").exists()  # created when training begins: readers prefer it to printed dicts
    state.global_step = 1
    cb.on_step_end(args, state, None)
    cb.on_log(args, state, None, logs={"loss": 0.5, "epoch": 0.1})
    cb.on_train_end(args, state, None)
    assert m.events == []
    (rec,) = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert rec["step"] == 1 and rec["samples"] == 8 and rec["values"] == {"loss": 0.5, "epoch": 0.1}


def test_a_plain_trainer_trains_from_its_inputs_to_the_step_end() -> None:
    m = FakeMarker()

    class PlainTrainer:
        state = _State()
        model = type("M", (), {"training": True})()

        def _prepare_inputs(self, batch: list[str]) -> list[str]:
            return batch

    trainer = PlainTrainer()
    tracker = PhaseTracker(m)
    assert watch_trainer(trainer, tracker) == ["_prepare_inputs"]
    trainer._prepare_inputs(["a"])
    trainer._prepare_inputs(["b"])  # a second micro-batch of the same step
    tracker.step_end(1)
    assert m.events == [("train", "begin", 1), ("train", "end", 1)]


@pytest.mark.e2e
@pytest.mark.trl
def test_the_callback_writes_phases_and_steps_in_a_real_trl_run(tmp_path: Path) -> None:
    """A user's TRL GRPO script on CPU (tiny Qwen2) with the callback: every step has its generation,
    scoring and training phase, disjoint and in order, and its step record."""
    pytest.importorskip("trl")
    from autotune.workload.tinymodels import ensure_model

    model = ensure_model("tiny-qwen2", tmp_path / "models")
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "AUTOTUNE_PHASES_FILE": str(tmp_path / "phases.jsonl"),
        "AUTOTUNE_METRICS_FILE": str(tmp_path / "metrics.jsonl"),
    }
    env.pop("RANK", None)
    proc = subprocess.run(
        [sys.executable, str(USER_SCRIPT), str(model), str(tmp_path / "out"), "--steps", "3"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(
        r["samples"] == 8 and r["tokens"] == 8 * r["values"]["completions/mean_length"] for r in records
    )
    assert all(r["duration_s"] > 0 and "kl" in r["values"] for r in records)
    markers = phases.read_phases(tmp_path / "phases.jsonl")
    for step in (1, 2, 3):
        seq = [(m["phase"], m["event"]) for m in markers if m["step"] == step]
        assert seq[:2] == [("rollout", "begin"), ("rollout", "end")], seq
        assert ("other", "begin") in seq and seq[-1] == ("train", "end"), seq
    open_phase = None
    last_t = 0.0
    for m in markers:  # disjoint, in time order
        assert m["t_mono_s"] >= last_t
        last_t = m["t_mono_s"]
        if m["event"] == "begin":
            assert open_phase is None, m
            open_phase = m["phase"]
        else:
            assert open_phase == m["phase"], m
            open_phase = None
    step_end = {r["step"]: r["t_mono_s"] for r in records}
    train_end = {m["step"]: m["t_mono_s"] for m in markers if m["phase"] == "train" and m["event"] == "end"}
    assert all(train_end[s] <= step_end[s] for s in (1, 2, 3))  # train closes at on_step_end
