"""The tell side of the study loop: how a finished trial is recorded in Optuna (state, value,
constraints, user attributes) and read back from it, and the pruner that stops clearly slower trials."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import optuna

from autotune.records import TrialResult, TrialStatus
from autotune.space import canonical_key
from autotune.study.optuna_view import MeasuredReports
from autotune.studydir import StudyDir

__all__ = [
    "METRIC_NAME",
    "MeasureEvery",
    "SlowerThanBest",
    "baseline_done_or",
    "counts_in_budget",
    "has_complete",
    "interrupted_result",
    "interrupted_unrun",
    "stored_attrs",
    "stored_result",
    "tell",
    "trial_attrs",
]

#: the name of the value Optuna records (``study.set_metric_names``)
METRIC_NAME = "completions_per_s"


class SlowerThanBest(optuna.pruners.BasePruner):
    """Prune a trial whose optimistic throughput is clearly below the best completed trial.

    The study reports the measured throughput after every steady step and hands the pruner
    ``throughput × (1 + rel_ci95)`` (the optimistic end of the estimate) beside it (``reports``); the
    trial is pruned once it has ``min_reports`` reports and that bound is below ``best × (1 − margin)``.
    The baseline is never pruned (its throughput defines the speedup).
    """

    def __init__(
        self, margin: float = 0.15, min_reports: int = 3, reports: MeasuredReports | None = None
    ) -> None:
        self.margin = margin
        self.min_reports = min_reports
        self.reports = reports or MeasuredReports()

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        if trial.user_attrs.get("is_baseline") or len(trial.intermediate_values) < self.min_reports:
            return False
        best = max(
            (
                t.value
                for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
                if t.value and t.user_attrs.get("status") == TrialStatus.COMPLETE.value
            ),
            default=None,
        )
        if best is None:
            return False
        bound = self.reports.bound(trial.number)
        if bound is None:  # reported by another process: its measured value is all there is
            bound = trial.intermediate_values[max(trial.intermediate_values)]
        return bound < best * (1 - self.margin)


class MeasureEvery(SlowerThanBest):
    """Prune nothing: every trial runs until its estimate is stable or its steps run out
    (``autotune search --no-prune``; what a recorded surface needs, where a pruned trial's few steps
    would stand in for a measurement)."""

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        return False


def tell(
    study: optuna.Study,
    trial: optuna.Trial,
    result: TrialResult,
    study_dir: StudyDir,
    reports: MeasuredReports | None = None,
) -> None:
    """Record a trial in Optuna as Optuna's own tools read it (optuna-dashboard, ``load_study``).

    A configuration that does not work (OOM, hang, crash, ...) is FAIL and one never launched (the
    pre-screen) or stopped early as clearly slower is PRUNED; only a healthy finished run is
    COMPLETE with its throughput as the value. How the trial ended (``status``, ``reason``) and what
    it measured (:func:`trial_attrs`) are user attributes. The search itself never reads these
    back: it learns from the study directory's results.
    """
    infeasible = result.status.is_failure or (result.status is TrialStatus.PRUNED and result.steps == 0)
    for key, value in trial_attrs(result).items():
        trial.set_user_attr(key, value)
    if result.number == trial.number:  # a duplicate is told with its twin's result, not stored again
        for key, value in stored_attrs(result, study_dir).items():
            trial.set_user_attr(key, value)
    trial.set_constraint("infeasible", 1.0 if infeasible else 0.0)
    reports = reports or MeasuredReports()
    if result.status is TrialStatus.COMPLETE and result.throughput is not None:
        reports.forget(trial.number)
        study.tell(trial, result.throughput)
    elif result.status is TrialStatus.PRUNED:
        # Optuna keeps the last reported value of a pruned trial: make it what the trial measured
        reports.finish_pruned(trial, result.throughput, result.steps)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    else:
        reports.forget(trial.number)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)


def trial_attrs(result: TrialResult) -> dict[str, Any]:
    """The user attributes a trial carries in Optuna: how it ended and what it measured.

    ``status`` and ``reason`` always; the rest when measured: ``peak_mem_bytes`` (one entry per GPU),
    ``tokens_per_s``, ``gpu_util_mean_pct`` and ``gpu_idle_share`` (means over the GPUs),
    ``host_peak_rss_bytes``, ``steps``, ``throughput`` (also for a trial that is not COMPLETE) and
    ``failed_phase``.
    """
    attrs: dict[str, Any] = {"status": result.status.value, "reason": result.reason[:500]}
    gpus = result.timeline_summary.gpus if result.timeline_summary is not None else ()
    measured: dict[str, Any] = {
        "steps": result.steps,
        "throughput": result.throughput,
        "tokens_per_s": result.steady.tokens_per_s if result.steady is not None else None,
        "peak_mem_bytes": list(result.peak_mem_bytes)
        if any(p is not None for p in result.peak_mem_bytes)
        else None,
        "gpu_util_mean_pct": _mean([g.util_mean_pct for g in gpus]),
        "gpu_idle_share": _mean([g.idle_fraction for g in gpus]),
        "host_peak_rss_bytes": result.host_peak_rss_bytes,
        "failed_phase": result.failed_phase,
    }
    attrs.update({k: v for k, v in measured.items() if v is not None})
    return attrs


def stored_attrs(result: TrialResult, study_dir: StudyDir) -> dict[str, Any]:
    """What a trial keeps in the storage so that any host can report the study and export its winner:
    its whole result and its launch plan (both as on disk: no secret in either)."""
    attrs: dict[str, Any] = {"result": result.model_dump_json()}
    launch = study_dir.trial(result.number).launch_json
    with contextlib.suppress(OSError):
        if launch.is_file() and not launch.is_symlink():
            attrs["launch"] = launch.read_text(encoding="utf-8")
    return attrs


def interrupted_result(trial: optuna.trial.FrozenTrial, params: dict[str, Any], reason: str) -> TrialResult:
    """The result of a trial that was stopped before it said anything about its configuration."""
    return TrialResult.interrupted(
        trial.number, params, reason=reason, is_baseline=bool(trial.user_attrs.get("is_baseline"))
    )


def stored_result(trial: optuna.trial.FrozenTrial) -> TrialResult | None:
    """The result a worker stored in a trial (:func:`stored_attrs`), or None."""
    raw = trial.user_attrs.get("result")
    if not isinstance(raw, str):
        return None
    try:
        result = TrialResult.from_json(raw)
    except ValueError:
        return None
    return result if result.number == trial.number else None


def _mean(numbers: list[float | None]) -> float | None:
    values = [float(x) for x in numbers if x is not None]
    return sum(values) / len(values) if values else None


def has_complete(study: optuna.Study) -> bool:
    return any(t.value for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))


def counts_in_budget(result: TrialResult) -> bool:
    """Whether a trial used a slot of the trial budget: it was launched and was not interrupted."""
    if result.status in (TrialStatus.INTERRUPTED, TrialStatus.RUNNING):  # RUNNING: counted as running
        return False
    return result.steps > 0 or result.status is not TrialStatus.PRUNED


def interrupted_unrun(results: Any) -> list[dict[str, Any]]:
    """Configurations whose last trial was interrupted and that no later trial ran, oldest first."""
    last: dict[str, TrialResult] = {}
    for r in sorted(results, key=lambda r: r.number):
        last[canonical_key(r.params)] = r
    return [
        r.params for r in sorted(last.values(), key=lambda r: r.number) if r.status is TrialStatus.INTERRUPTED
    ]


def baseline_done_or(results: Mapping[int, TrialResult]) -> bool:
    """True once the baseline has been run (or could not be)."""
    return any(r.is_baseline and r.status is not TrialStatus.INTERRUPTED for r in results.values())
