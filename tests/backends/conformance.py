"""Conformance suite run against every backend: render → run an output → parse → classify.

A backend's test module subclasses :class:`BackendConformance` in a class named ``Test...`` and
provides the few things only it knows: how to build the backend and a context, and what one step of
its log looks like (:meth:`BackendConformance.step_events`). The suite then checks the calling
protocol of :mod:`autotune.backends._base` (pure and deterministic rendering, fresh parsers, valid
baseline, knobs that match the shipped space) and drives every status of the runner end to end:

    render the backend's real plan → replace argv by ``data/replay.py`` playing scripted output
    (same env, cwd and metric files) → :func:`autotune.trial.runner.run_trial` with the backend's parser
    → :func:`autotune.trial.outcome.classify` with the backend's failure patterns → expected status,
    and no process of the trial left alive.

Scenarios: COMPLETE, UNHEALTHY (grad_norm and kl stuck at 0), OOM (PyTorch's text on stderr), VLLM_INIT,
HOST_OOM (the process SIGKILLs itself), HANG (silent after 3 steps), TIMEOUT (steps keep coming past
the wall budget), INVALID (the backend's own start-up rejection), CRASH (a traceback; a SIGSEGV),
PRUNED (the observer prunes), INTERRUPTED (the stop event is set). A backend may add recordings of real
runs (:meth:`BackendConformance.recordings`), replayed the same way.

Events are the replay format documented in ``data/replay.py``.
"""

from __future__ import annotations

import json
import math
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from autotune.backends._base import Backend, TrialContext
from autotune.records import StepMetrics, TrialSpec, TrialStatus
from autotune.space import Platform, load_space
from autotune.trial.failure_phase import failure_phase
from autotune.trial.outcome import Verdict, classify, health_check
from autotune.trial.runner import EarlyStopConfig, RunRecord, WatchdogConfig, alive_pids, run_trial

__all__ = ["BackendConformance", "Event", "Recording", "Scenario", "SCENARIOS", "REPLAY", "healthy_values"]

Event = dict[str, Any]
REPLAY = Path(__file__).parent / "data" / "replay.py"
STEP_GAP_S = 0.02  # scripted time between two step records

OOM_TEXT = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.32 GiB. GPU 1 has a total capacity of "
    "22.07 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 21.04 GiB memory in "
    "use. Of the allocated memory 19.91 GiB is allocated by PyTorch, and 0.73 GiB is reserved by PyTorch but "
    "unallocated."
)
VLLM_INIT_TEXT = (
    "ValueError: Free memory on device (12.3/79.14 GiB) on startup is less than desired GPU memory "
    "utilization (0.9, 71.23 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
    "processes."
)


def healthy_values(step: int) -> dict[str, float]:
    """Metric values of a step of a run that learns (names as TRL and ms-swift log them)."""
    return {
        "loss": 1e-07 * (1 + step % 3),
        "grad_norm": 1.0 + 0.05 * step,
        "learning_rate": 1e-06,
        "completions/mean_length": 16.0,
        "completions/clipped_ratio": 1.0,
        "reward": 0.2 + 0.01 * step,
        "reward_std": 0.25,
        "kl": 0.0 if step == 1 else 1e-06 * step,
        "step_time": 0.5,
    }


def stuck_values(step: int) -> dict[str, float]:
    """A run that never updates the model: grad_norm and kl stay exactly 0."""
    return {**healthy_values(step), "grad_norm": 0.0, "kl": 0.0}


def _traceback(final: str, frames: Sequence[tuple[str, str]] = (("train.py", "main"),)) -> list[Event]:
    lines = ["Traceback (most recent call last):"]
    for file, fn in frames:
        lines += [f'  File "/opt/app/{file}", line 10, in {fn}', "    do()"]
    lines.append(final)
    return [{"stream": "stderr", "text": x} for x in lines]


@dataclass(frozen=True)
class Scenario:
    """One scripted trial and the status it must end with.

    Attributes:
        name: test id.
        expected: the status :func:`classify` must return.
        build: the suite instance → the events of the trial.
        watchdog: the runner's limits for it.
        prune_after: the observer prunes once this many steps arrived.
        interrupt_after: the stop event is set once this many steps arrived.
        min_steps: steps the parser must have produced.
    """

    name: str
    expected: TrialStatus
    build: Callable[[BackendConformance], list[Event]]
    watchdog: WatchdogConfig = field(
        default_factory=lambda: WatchdogConfig(
            startup_timeout_s=30, hang_k=2, hang_floor_s=1.0, grace_s=1.0, poll_interval_s=0.05
        )
    )
    prune_after: int | None = None
    interrupt_after: int | None = None
    min_steps: int = 0


@dataclass(frozen=True)
class Recording:
    """A real run's output (a replay file) and what it must give.

    Attributes:
        name: test id.
        path: the ``.events.jsonl`` file.
        expected: the status it must be classified as.
        steps: the step numbers the parser must produce, in order.
        failed_phase: the phase the failure must be placed in, from the evidence
            (:func:`autotune.trial.failure_phase.failure_phase`); None for a run that did not fail.
    """

    name: str
    path: Path
    expected: TrialStatus
    steps: tuple[int, ...]
    failed_phase: str | None = None


def _run_n(
    suite: BackendConformance, n: int, values: Callable[[int], dict[str, float]], max_steps: int | None = None
) -> list[Event]:
    total = max_steps if max_steps is not None else n
    events: list[Event] = list(suite.startup_events())
    for step in range(1, n + 1):
        events += suite.step_events(step, total, values(step), elapsed_s=0.5 * step)
        events.append({"sleep": STEP_GAP_S})
    return events


def _complete(s: BackendConformance) -> list[Event]:
    return _run_n(s, 6, healthy_values) + list(s.end_events(6)) + [{"exit": 0}]


def _unhealthy(s: BackendConformance) -> list[Event]:
    return _run_n(s, 6, stuck_values) + list(s.end_events(6)) + [{"exit": 0}]


def _oom(s: BackendConformance) -> list[Event]:
    return _run_n(s, 2, healthy_values, 6) + _traceback(OOM_TEXT) + [{"exit": 1}]


def _vllm_init(s: BackendConformance) -> list[Event]:
    return (
        list(s.startup_events())
        + _traceback(VLLM_INIT_TEXT, (("llm_engine.py", "__init__"),))
        + [{"exit": 1}]
    )


def _host_oom(s: BackendConformance) -> list[Event]:
    return _run_n(s, 2, healthy_values, 6) + [{"signal": int(signal.SIGKILL)}]


def _hang(s: BackendConformance) -> list[Event]:
    return _run_n(s, 3, healthy_values, 6) + [{"hang": True}]


def _endless(s: BackendConformance) -> list[Event]:
    events = _run_n(s, 400, healthy_values, 400)
    for ev in events:
        if "sleep" in ev:
            ev["sleep"] = 0.05
    return events + [{"exit": 0}]


def _invalid(s: BackendConformance) -> list[Event]:
    return list(s.invalid_events())


def _crash(s: BackendConformance) -> list[Event]:
    return (
        _run_n(s, 2, healthy_values, 6)
        + _traceback("RuntimeError: shape mismatch in rollout buffer")
        + [{"exit": 1}]
    )


def _segfault(s: BackendConformance) -> list[Event]:
    return _run_n(s, 2, healthy_values, 6) + [{"signal": int(signal.SIGSEGV)}]


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("complete", TrialStatus.COMPLETE, _complete, min_steps=6),
    Scenario("unhealthy", TrialStatus.UNHEALTHY, _unhealthy, min_steps=6),
    Scenario("oom", TrialStatus.OOM, _oom, min_steps=2),
    Scenario("vllm_init", TrialStatus.VLLM_INIT, _vllm_init),
    Scenario("host_oom", TrialStatus.HOST_OOM, _host_oom, min_steps=2),
    Scenario("hang", TrialStatus.HANG, _hang, min_steps=3),
    Scenario(
        "timeout",
        TrialStatus.TIMEOUT,
        _endless,
        watchdog=WatchdogConfig(
            startup_timeout_s=30,
            hang_k=5,
            hang_floor_s=5,
            trial_timeout_s=2.0,
            grace_s=1.0,
            poll_interval_s=0.05,
        ),
        min_steps=3,
    ),
    Scenario("invalid", TrialStatus.INVALID, _invalid),
    Scenario("crash", TrialStatus.CRASH, _crash, min_steps=2),
    Scenario("segfault", TrialStatus.CRASH, _segfault, min_steps=2),
    Scenario("pruned", TrialStatus.PRUNED, _endless, prune_after=3, min_steps=3),
    Scenario("interrupted", TrialStatus.INTERRUPTED, _endless, interrupt_after=2, min_steps=2),
)


class _Observer:
    def __init__(
        self, prune_after: int | None, interrupt_after: int | None, stop_event: threading.Event
    ) -> None:
        self.prune_after = prune_after
        self.interrupt_after = interrupt_after
        self.stop_event = stop_event
        self.started: tuple[int, int] | None = None
        self.steps = 0

    def on_started(self, pid: int, pgid: int) -> None:
        self.started = (pid, pgid)

    def on_step(self, step: StepMetrics, estimate: object) -> str | None:
        self.steps += 1
        if self.interrupt_after is not None and self.steps >= self.interrupt_after:
            self.stop_event.set()
        if self.prune_after is not None and self.steps >= self.prune_after:
            return "slower than the best trial so far (conformance)"
        return None


def _snapshot(root: Path, skip: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for p in root.rglob("*"):
        if skip == p or skip in p.parents:
            continue
        out[str(p)] = p.stat().st_mtime if p.is_file() else 0.0
    return out


class BackendConformance:
    """Base class of a backend's conformance tests (see the module docstring). Not collected itself."""

    #: the ``beta`` the health gate assumes for the scripted runs (kl must move when > 0).
    beta: float | None = 0.04

    # ---------------------------------------------------------------- what a backend provides
    def make_backend(self) -> Backend:
        raise NotImplementedError

    def make_context(self, tmp_path: Path) -> TrialContext:
        raise NotImplementedError

    def step_events(
        self, step: int, max_steps: int, values: Mapping[str, float], *, elapsed_s: float
    ) -> list[Event]:
        """The output (lines and metric-file lines) of one logged step, as the framework writes it."""
        raise NotImplementedError

    def startup_events(self) -> list[Event]:
        """Output before the first step (banners, the metric file's announcement)."""
        return []

    def end_events(self, max_steps: int) -> list[Event]:
        """Output after the last step of a run that ends well (summaries that are not steps)."""
        return []

    def invalid_events(self) -> list[Event]:
        """A start-up rejection of the arguments, ending the process (default: a config ValueError)."""
        return _traceback(
            "ValueError: generation_batch_size (3) must be divisible by num_generations (4).",
            (("train.py", "main"), ("grpo_config.py", "__post_init__")),
        ) + [{"exit": 1}]

    def recordings(self) -> list[Recording]:
        """Real runs to replay (default: none)."""
        return []

    def trial_params(self, backend: Backend, ctx: TrialContext) -> dict[str, Any]:
        """A valid knob assignment: the backend's baseline over its shipped space's defaults."""
        space = load_space(backend.default_space(), backend=backend.name, known_knobs=backend.knob_names)
        space = space.restrict(Platform.machine(gpu_present=not ctx.cpu_only))
        return space.active(backend.baseline(space.defaults(), ctx))

    # ---------------------------------------------------------------- machinery
    def run_events(
        self,
        events: Sequence[Event],
        tmp_path: Path,
        *,
        watchdog: WatchdogConfig,
        prune_after: int | None = None,
        interrupt_after: int | None = None,
    ) -> tuple[RunRecord, Verdict, TrialContext]:
        """Render the backend's plan, replay ``events`` as its process, parse, and classify."""
        backend = self.make_backend()
        ctx = self.make_context(tmp_path)
        params = self.trial_params(backend, ctx)
        derived = backend.derive(params, ctx)
        spec = TrialSpec(number=ctx_number(ctx), params=params, derived=derived)
        plan = backend.render(spec, ctx)
        recording = ctx.trial_dir / "replay.events.jsonl"
        recording.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
        plan = plan.model_copy(
            update={"argv": (sys.executable, str(REPLAY), str(recording), str(ctx.trial_dir))}
        )
        stop_event = threading.Event()
        observer = _Observer(prune_after, interrupt_after, stop_event)
        record = run_trial(
            plan,
            backend.parser(spec, ctx),
            ctx.trial_dir,
            global_batch=ctx.global_batch,
            watchdog=watchdog,
            early_stop=EarlyStopConfig(enabled=False),
            observer=observer,
            stop_event=stop_event,
            patterns=backend.failure_patterns(),
        )
        ended_well = record.stopped_by in ("early_stop", "pruned") or (
            record.stopped_by is None and record.exit_code == 0
        )
        health = (
            health_check(
                record.steps, beta=self.beta, max_completion_length=ctx.max_completion_length, baseline=None
            )
            if ended_well and record.steps
            else []
        )
        verdict = classify(record, patterns=backend.failure_patterns(), health=health)
        assert observer.started is not None and observer.started[0] == record.pid
        return record, verdict, ctx

    # ---------------------------------------------------------------- the tests
    def test_knob_names_cover_the_shipped_space(self) -> None:
        backend = self.make_backend()
        space = load_space(backend.default_space(), backend=backend.name, known_knobs=backend.knob_names)
        assert space.knobs, "the shipped space has no knobs"
        if backend.knob_names is not None:
            assert set(space.names) <= backend.knob_names

    def test_baseline_is_valid(self, tmp_path: Path) -> None:
        backend = self.make_backend()
        ctx = self.make_context(tmp_path)
        params = self.trial_params(backend, ctx)
        derived = backend.derive(params, ctx)
        assert int(derived["world_size"]) >= 1
        assert backend.check_rules(params, derived, ctx) == []

    def test_render_is_pure_and_deterministic(self, tmp_path: Path) -> None:
        backend = self.make_backend()
        ctx = self.make_context(tmp_path)
        params = self.trial_params(backend, ctx)
        spec = TrialSpec(number=ctx_number(ctx), params=params, derived=backend.derive(params, ctx))
        before = _snapshot(ctx.study_dir, ctx.trial_dir)
        first = backend.render(spec, ctx)
        second = backend.render(spec, ctx)
        assert _snapshot(ctx.study_dir, ctx.trial_dir) == before, "render wrote outside the trial directory"
        assert first == second
        assert first.argv and all(isinstance(a, str) for a in first.argv)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in first.env.items())
        assert Path(first.cwd).is_dir()
        assert first.world_size == int(spec.derived["world_size"])
        shell = first.to_shell()
        assert shell.startswith("#!/usr/bin/env bash") and Path(first.argv[0]).name in shell

    def test_parsers_are_independent(self, tmp_path: Path) -> None:
        backend = self.make_backend()
        ctx = self.make_context(tmp_path)
        params = self.trial_params(backend, ctx)
        spec = TrialSpec(number=ctx_number(ctx), params=params, derived=backend.derive(params, ctx))
        a, b = backend.parser(spec, ctx), backend.parser(spec, ctx)
        assert a is not b
        got: list[StepMetrics] = []
        for ev in self.step_events(1, 4, healthy_values(1), elapsed_s=0.5):
            if "file" in ev:
                path = ctx.trial_dir / ev["file"]
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("a", encoding="utf-8") as fh:
                    fh.write(ev["text"].replace("{trial_dir}", str(ctx.trial_dir)) + "\n")
            elif "stream" in ev:
                got += a.feed(ev["stream"], ev["text"].replace("{trial_dir}", str(ctx.trial_dir)), 1.0, 1.0)
        got += a.finish(2.0, 2.0)
        assert [s.step for s in got] == [1]
        assert math.isclose(got[0].values["grad_norm"], healthy_values(1)["grad_norm"], rel_tol=1e-3)
        assert b.feed("stdout", "an unrelated line", 3.0, 3.0) == []  # b has its own state
        assert b.open_phase() is None  # a fresh parser shows no phase

    @pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
    def test_status(self, scenario: Scenario, tmp_path: Path) -> None:
        record, verdict, _ = self.run_events(
            scenario.build(self),
            tmp_path,
            watchdog=scenario.watchdog,
            prune_after=scenario.prune_after,
            interrupt_after=scenario.interrupt_after,
        )
        assert verdict.status is scenario.expected, (
            f"{scenario.name}: {verdict.reason} (stopped_by={record.stopped_by}, exit={record.exit_code})"
        )
        assert verdict.reason
        numbers = [s.step for s in record.steps]
        assert len(numbers) >= scenario.min_steps
        assert numbers == sorted(set(numbers)), "steps repeated or out of order"
        assert alive_pids(record.pids_seen) == [], "a process of the trial survived"

    def test_recordings(self, tmp_path: Path) -> None:
        for rec in self.recordings():
            events = [json.loads(x) for x in rec.path.read_text(encoding="utf-8").splitlines() if x.strip()]
            record, verdict, _ = self.run_events(
                events,
                tmp_path / rec.name,
                watchdog=WatchdogConfig(
                    startup_timeout_s=60, hang_k=5, hang_floor_s=10, grace_s=1.0, poll_interval_s=0.05
                ),
            )
            assert verdict.status is rec.expected, f"{rec.name}: {verdict.reason}"
            assert tuple(s.step for s in record.steps) == rec.steps, rec.name
            assert alive_pids(record.pids_seen) == []
            lines = [x.text for x in record.evidence] + record.stderr_tail + record.stdout_tail
            frames = self.make_backend().phase_frames()
            assert failure_phase(verdict.status, lines, frames) == rec.failed_phase, rec.name
            if rec.failed_phase is not None:
                # the trainer's own frames place it too, without the common ones (backward, generate)
                assert failure_phase(verdict.status, lines, frames, common=False) == rec.failed_phase, (
                    rec.name
                )


def ctx_number(ctx: TrialContext) -> int:
    """The trial number of a context whose trial directory is ``.../trials/<n>`` (else 0)."""
    name = ctx.trial_dir.name
    return int(name) if name.isdigit() else 0
