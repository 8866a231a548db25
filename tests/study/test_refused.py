"""Configurations the pre-screen refuses in a row: a strategy with nothing to propose (``auto``) leaves
Optuna's sampler drawing, and where nearly all of the space is predicted not to fit, nearly every draw is
refused (each after a whole decision of the strategy). For such a strategy the loop queues a configuration
that passes the pre-check after ``requeue_after_refusals`` refusals in a row, and stops after
``max_refused_in_a_row``: it never spins. Optuna's samplers learn from their refusals: left alone."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.backends import ModelRef
from autotune.records import Hardware, HostInfo
from autotune.space import load_space
from autotune.strategy import BaseStrategy, Collaborators
from autotune.strategy._random import RandomStrategy
from autotune.study.loop import Study, StudyConfig
from tests.study.test_loop import FakeBackend, FakeExecutor

# 5 x 2 x 60 = 600 configurations
WORKERS = ", ".join(str(i) for i in range(60))
SPACE = f"""
backend: fake
knobs:
  per_device_train_batch_size: {{type: int, choices: [1, 2, 4, 8, 16], default: 2, memory: increasing}}
  gradient_checkpointing: {{type: bool, default: true, memory: decreasing}}
  dataloader_num_workers: {{type: int, choices: [{WORKERS}], default: 0}}
"""


class OneFits:
    """A memory gate that refuses every configuration but ``fits`` (all of them when None)."""

    def __init__(self, fits: Mapping[str, Any] | None) -> None:
        self.fits = dict(fits) if fits is not None else None
        self.checked = 0

    def check(
        self, params: Mapping[str, object], derived: Mapping[str, object], *, margin: float | None = None
    ):  # noqa: ANN201
        self.checked += 1
        if self.fits is not None and dict(params) == self.fits:
            return None, None
        return "predicted not to fit: needs 99 GiB of 24 GiB per GPU", None

    def rank(self, params: Mapping[str, object]) -> float | None:
        return None

    def observe(self, result: object) -> None:
        pass

    def state(self) -> dict[str, Any]:
        return {}


class NothingToPropose(RandomStrategy):
    """Proposes nothing, as ``auto`` when its pool holds nothing that passes the pre-check, and says so."""

    requeue_after_refusals = 2


def _study(
    tmp_path: Path, gate: OneFits, strategy: type[BaseStrategy] = NothingToPropose, **more: Any
) -> tuple[Study, FakeExecutor]:
    space_file = tmp_path / "space.yaml"
    space_file.write_text(SPACE)
    host = HostInfo(
        hostname="h", cpu_cores_logical=2, cpu_cores_physical=1, ram_total_bytes=1 << 30, platform="x"
    )
    cfg = StudyConfig(
        study_dir=tmp_path / "s",
        backend="fake",
        model=ModelRef(name="m", path_or_id="m"),
        hardware=Hardware(host=host),
        global_batch=16,
        num_generations=4,
        max_steps=5,
        max_completion_length=8,
        search="random",
        seed=3,
        **{"n_trials": 3, **more},
    )
    ex = FakeExecutor()
    space = load_space(space_file, backend="fake")
    # the pre-check the study would hand the strategy: the gate's verdict
    collab = Collaborators(feasible=lambda p: gate.check(p, {})[0] is None)
    policy = strategy(space, collab, seed=3)
    return Study(cfg, FakeBackend(), space, ex, memory_gate=gate, strategy=policy), ex


def _refused_before_the_first_launch(results: list) -> int:
    ordered = sorted(results, key=lambda r: r.number)
    return next(i for i, r in enumerate(ordered) if r.steps > 0)


def test_after_two_refusals_in_a_row_a_configuration_that_passes_the_pre_check_runs(tmp_path: Path) -> None:
    fits = {"per_device_train_batch_size": 16, "gradient_checkpointing": True, "dataloader_num_workers": 37}
    study, ex = _study(tmp_path, OneFits(fits))
    outcome = study.run()
    # the one configuration of 600 that fits runs after the baseline and one draw were refused, not
    # after some 300 draws; then nothing else fits, and the study stops after 50 refusals in a row
    assert ex.ran == [fits]
    assert _refused_before_the_first_launch(outcome.results) == 2
    assert outcome.stopped == "exhausted" and "50 configurations in a row" in outcome.detail


def test_a_space_the_pre_screen_refuses_whole_stops_the_study(tmp_path: Path) -> None:
    study, ex = _study(tmp_path, OneFits(None), max_refused_in_a_row=10)
    outcome = study.run()
    assert ex.ran == [] and outcome.stopped == "exhausted"
    assert "10 configurations in a row were refused before launch" in outcome.detail
    assert len(outcome.results) == 10


def test_a_sampler_that_learns_from_its_refusals_is_left_alone(tmp_path: Path) -> None:
    fits = {"per_device_train_batch_size": 16, "gradient_checkpointing": True, "dataloader_num_workers": 37}
    study, ex = _study(tmp_path, OneFits(fits), strategy=RandomStrategy, n_trials=1)
    outcome = study.run()
    assert RandomStrategy.requeue_after_refusals is None
    # Optuna's random sampler drew until it found the one configuration that fits: many refusals
    assert ex.ran == [fits] and _refused_before_the_first_launch(outcome.results) > 10


def test_auto_asks_for_the_requeue() -> None:
    from autotune.strategy._auto import AutoStrategy
    from autotune.strategy._grid import GridStrategy

    assert AutoStrategy.requeue_after_refusals == 2 and GridStrategy.requeue_after_refusals is None
