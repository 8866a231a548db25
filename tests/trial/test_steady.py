from __future__ import annotations

import math
import random

import pytest

from autotune.errors import UsageError
from autotune.records import StepMetrics
from autotune.trial.steady import (
    EarlyStopConfig,
    is_stable,
    steady_estimate,
    step_durations,
    t_quantile_975,
    warmup_count,
)


def steps_from_durations(
    durations: list[float], *, own: bool = False, tokens: float | None = None
) -> list[StepMetrics]:
    """Step records whose t_mono_s advance by ``durations`` (step 1 ends after the first)."""
    out, t = [], 100.0
    for i, d in enumerate(durations, start=1):
        t += d
        out.append(StepMetrics(step=i, t_mono_s=t, t_wall_s=t, duration_s=d if own else None, tokens=tokens))
    return out


@pytest.mark.parametrize(
    ("df", "expected"),
    [(1, 12.706), (2, 4.303), (10, 2.228), (30, 2.042), (40, 2.021), (60, 2.000), (120, 1.980)],
)
def test_t_quantile_matches_tables(df: int, expected: float) -> None:
    assert t_quantile_975(df) == pytest.approx(expected, abs=1.5e-3)


def test_t_quantile_decreases_towards_normal() -> None:
    values = [t_quantile_975(df) for df in range(1, 200)]
    assert all(a > b for a, b in zip(values, values[1:], strict=False))
    assert values[-1] == pytest.approx(1.972, abs=1e-3)  # df 199
    assert t_quantile_975(100_000) == pytest.approx(1.95998, abs=1e-4)


def test_own_durations_are_used_when_every_step_has_one() -> None:
    steps = steps_from_durations([9.0, 1.0, 1.0, 1.0], own=True)
    durations, owners, boundary = step_durations(steps)
    assert durations == [9.0, 1.0, 1.0, 1.0]
    assert [s.step for s in owners] == [1, 2, 3, 4]
    assert boundary == 0


def test_monotonic_differences_when_a_duration_is_missing() -> None:
    steps = steps_from_durations([9.0, 1.0, 2.0, 3.0], own=True)
    steps[2] = steps[2].model_copy(update={"duration_s": None})
    durations, owners, boundary = step_durations(steps)
    assert durations == pytest.approx([1.0, 2.0, 3.0])
    assert [s.step for s in owners] == [2, 3, 4]
    assert boundary == 1


def test_logging_every_nth_step_gives_per_step_durations() -> None:
    # Logged at steps 5, 10, 15, 20, 25 with 0.5 s per step.
    steps = [StepMetrics(step=5 * k, t_mono_s=2.5 * k, t_wall_s=0.0) for k in range(1, 6)]
    durations, _, _ = step_durations(steps)
    assert durations == pytest.approx([0.5] * 4)


def test_repeated_and_unordered_steps() -> None:
    steps = steps_from_durations([1.0, 1.0, 1.0, 1.0])
    shuffled = [steps[2], steps[0], steps[3], steps[1], steps[1].model_copy(update={"t_mono_s": 999.0})]
    durations, _, _ = step_durations(shuffled)
    assert durations == pytest.approx([1.0, 1.0, 1.0])


def test_warmup_drops_slow_first_steps_until_they_settle() -> None:
    assert warmup_count([2.0, 1.6, 1.3, 1.1, 1.0, 1.0, 1.0, 1.0], max_warmup=5) == 3
    assert warmup_count([1.0, 1.05, 0.95, 1.0, 1.02], max_warmup=5) == 0
    assert warmup_count([5.0, 1.0, 1.0], max_warmup=5) == 1


def test_warmup_is_bounded_and_keeps_two() -> None:
    assert warmup_count([9.0, 8.0, 7.0, 6.0, 1.0, 1.0, 1.0], max_warmup=2) == 2
    assert warmup_count([9.0, 1.0], max_warmup=5) == 0
    assert warmup_count([9.0, 9.0, 9.0, 1.0], max_warmup=5) <= 2


def test_noise_within_tolerance_is_not_warmup() -> None:
    rng = random.Random(1)
    durations = [1.0 + rng.uniform(-0.1, 0.1) for _ in range(12)]
    assert warmup_count(durations, max_warmup=5) == 0


def test_estimate_excludes_warmup_and_computes_throughput() -> None:
    est = steady_estimate(steps_from_durations([6.0, 2.0, 2.0, 2.0, 2.0], own=True), global_batch=16)
    assert est is not None
    assert est.warmup_steps == 1
    assert est.steady_steps == 4
    assert est.step_time_s == pytest.approx(2.0)
    assert est.rel_ci95 == pytest.approx(0.0)
    assert est.throughput == pytest.approx(8.0)
    assert est.tokens_per_s is None


def test_interval_uses_student_t() -> None:
    durations = [1.0, 1.2, 0.8, 1.1, 0.9]
    est = steady_estimate(steps_from_durations(durations, own=True), global_batch=4, max_warmup=0)
    assert est is not None
    sd = math.sqrt(sum((d - 1.0) ** 2 for d in durations) / 4)
    assert est.rel_ci95 == pytest.approx(2.776 * sd / math.sqrt(5) / 1.0, rel=1e-3)


def test_tokens_per_second_when_every_steady_step_has_tokens() -> None:
    est = steady_estimate(steps_from_durations([1.0, 0.5, 0.5, 0.5], own=True, tokens=256.0), global_batch=16)
    assert est is not None
    assert est.tokens_per_s == pytest.approx(512.0)


def test_too_few_steps_give_no_estimate() -> None:
    assert steady_estimate([], global_batch=16) is None
    assert steady_estimate(steps_from_durations([1.0]), global_batch=16) is None
    # two records without own durations give one difference only
    assert steady_estimate(steps_from_durations([1.0, 1.0]), global_batch=16) is None
    assert steady_estimate(steps_from_durations([1.0, 1.0, 1.0]), global_batch=16) is not None


def test_zero_and_negative_durations_are_ignored() -> None:
    steps = steps_from_durations([1.0, 1.0, 1.0], own=True)
    steps.append(StepMetrics(step=4, t_mono_s=0, t_wall_s=0, duration_s=0.0))
    est = steady_estimate(steps, global_batch=2)
    assert est is not None and est.steady_steps == 3


def test_is_stable() -> None:
    cfg = EarlyStopConfig(min_steady_steps=3, target_rel_ci95=0.05)
    tight = steady_estimate(steps_from_durations([1.0, 1.01, 0.99, 1.0], own=True), global_batch=1)
    loose = steady_estimate(steps_from_durations([1.0, 1.5, 0.6, 1.2], own=True), global_batch=1)
    short = steady_estimate(steps_from_durations([1.0, 1.0], own=True), global_batch=1)
    assert is_stable(tight, cfg)
    assert not is_stable(loose, cfg)
    assert short is not None and not is_stable(short, cfg)
    assert not is_stable(None, cfg)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_steady_steps": 1},
        {"target_rel_ci95": 0},
        {"target_rel_ci95": -0.1},
        {"min_steps": -1},
        {"max_warmup_steps": -2},
    ],
)
def test_early_stop_config_rejects_bad_values(kwargs: dict[str, float]) -> None:
    with pytest.raises(UsageError) as info:
        EarlyStopConfig(**kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
