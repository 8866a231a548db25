"""``autotune doctor --calibrate``: a handful of short real trials on this GPU against the estimator.

Two small studies run through the same path as ``autotune search`` (runner, probes, classifier):

1. TRL GRPO on a Qwen2-shaped model built here with random weights (``medium-qwen2`` unless ``--model``
   names another), a grid of micro-batch sizes (with vLLM colocated as well when vLLM is installed), a
   few steps each; every trial's NVML peak and steady step time is set beside the estimator's raw
   prediction for it.
2. One deliberately too large batch (a torch allocation of twice the GPU's memory in a ``command``
   trial, so the estimator cannot prune it before launch): its status must come back ``oom``.

The points become the GPU type's calibration table (:mod:`autotune.estimate.machine_table`), stored in
the cache for the studies that run here, and written as ``calibration.md`` / ``calibration.json`` in the
calibration's own directory under ``--out``.
"""

from __future__ import annotations

import datetime
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from autotune.doctor import Facts, Finding, Status
from autotune.estimate import CalibrationPoint, CalibrationTable, build_table, store_table
from autotune.jsontypes import JsonObject
from autotune.records import TrialStatus

__all__ = ["CalibrationOutcome", "run_calibration", "points_from_results", "CALIBRATION_MODEL"]

CALIBRATION_MODEL = "medium-qwen2"
BACKEND = "trl"
BATCHES = (2, 8, 32)
GLOBAL_BATCH = 64
NUM_GENERATIONS = 4
COMPLETION_TOKENS = 64
STEPS = 8
# a command trial that asks for twice the GPU's memory in one batch tensor: a real CUDA OOM
OOM_SCRIPT = (
    "import torch\n"
    "free, total = torch.cuda.mem_get_info()\n"
    "batch = int({scale} * total // (4096 * 4096 * 2))\n"
    "x = torch.randn(batch, 4096, 4096, device='cuda', dtype=torch.bfloat16)\n"
    "print(x.sum())\n"
)


@dataclass(frozen=True)
class CalibrationOutcome:
    """The table (None without a GPU or when the trials could not run), where it went, and the lines."""

    table: CalibrationTable | None
    paths: tuple[Path, ...]
    findings: tuple[Finding, ...]

    def to_dict(self) -> JsonObject:
        return {
            "table": self.table.to_dict() if self.table else None,
            "paths": [str(p) for p in self.paths],
        }


def _label(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(params.items()))


def points_from_results(
    results: list[Any], *, predict_step_s: Any, expected_oom: bool = False
) -> list[CalibrationPoint]:
    """Calibration points from finished trials (``TrialResult``): the raw memory estimate they were
    screened with, their NVML peak, and the estimator's step time beside the measured one.

    Args:
        results: the study's results.
        predict_step_s: ``(params, derived) -> seconds`` (the estimator's prediction), or None.
        expected_oom: these trials were sized to run out of memory.
    """
    from autotune.estimate import MemoryEstimate
    from autotune.recommend import needed_bytes

    points = []
    for r in results:
        if r.status is TrialStatus.PRUNED and not r.steps:  # never launched: nothing was measured
            continue
        raw = MemoryEstimate.from_dict(r.estimate).scaled(1.0).to_dict() if r.estimate else None
        # the peak the job needed: NVML's less torch's free cache (what the estimator predicts)
        peak = max((p for p in needed_bytes(r) if p is not None), default=None)
        predicted = predict_step_s(r.params, r.derived) if predict_step_s and not expected_oom else None
        points.append(
            CalibrationPoint(
                trial=r.number,
                label=_label(r.params),
                status=r.status.value,
                expected_oom=expected_oom,
                estimate=raw,
                measured_peak_bytes=peak,
                predicted_step_s=predicted,
                measured_step_s=r.steady.step_time_s if r.steady else None,
            )
        )
    return points


def _space(path: Path, with_vllm: bool) -> Path:
    """A grid over the micro-batch size (and vLLM on/off), in the backend's own knob names (its roles)."""
    import yaml

    from autotune.backends import backend_class

    roles = backend_class(BACKEND).knob_roles()
    knobs: dict[str, Any] = {
        roles["per_device_batch"]: {
            "type": "int",
            "choices": list(BATCHES),
            "default": BATCHES[1],
            "memory": "increasing",
        }
    }
    if with_vllm and "use_vllm" in roles:
        knobs[roles["use_vllm"]] = {"type": "bool", "default": False}
    path.write_text(yaml.safe_dump({"backend": BACKEND, "knobs": knobs}, sort_keys=False))
    return path


def _trl_points(out: Path, model: str, facts: Facts, console: Console) -> tuple[list[CalibrationPoint], Any]:
    from autotune.app.search import SearchRequest, search_study
    from autotune.backends import job_shape
    from autotune.estimate import estimate_step_time, model_from_facts, resolve_gpu

    with_vllm = "vllm" in facts.packages
    space = _space(out / "space-trl.yaml", with_vllm)
    req = SearchRequest(
        model=model,
        backend=BACKEND,
        gpus=1 if facts.gpus else None,  # the CPU only when trying the calibration's path here
        out=str(out / BACKEND),
        space=str(space),
        search="grid",
        trials=len(BATCHES) * (2 if with_vllm else 1),
        global_batch=GLOBAL_BATCH,
        num_generations=NUM_GENERATIONS,
        max_steps=STEPS,
        max_completion_length=COMPLETION_TOKENS,
        confirm_runs=0,
        early_stop=False,
    )
    summary = search_study(req, console)
    results = list(summary.outcome.results)
    from autotune.workload.models import resolve_model

    ref = resolve_model(model)
    spec = model_from_facts(dict(ref.facts))
    gpu = resolve_gpu(facts.gpus[0].name, facts.gpus[0].memory_total_bytes) if facts.gpus else None
    job = {
        "global_batch": GLOBAL_BATCH,
        "num_generations": NUM_GENERATIONS,
        "max_completion_length": COMPLETION_TOKENS,
    }

    def predict(params: dict[str, Any], derived: dict[str, Any]) -> float | None:
        if spec is None or gpu is None:
            return None
        return float(estimate_step_time(job_shape(BACKEND, params, derived, job, spec, 1), gpu).total_s)

    return points_from_results(results, predict_step_s=predict), spec


def _oom_points(out: Path, console: Console) -> list[CalibrationPoint]:
    import yaml

    from autotune.app.search import SearchRequest, search_study

    space = out / "space-oom.yaml"
    space.write_text(
        yaml.safe_dump({"knobs": {"scale": {"type": "int", "choices": [2], "default": 2}}}, sort_keys=False)
    )
    req = SearchRequest(
        command=(sys.executable, "-c", OOM_SCRIPT),
        backend="command",
        gpus=1,
        out=str(out / "oom"),
        space=str(space),
        search="grid",
        trials=1,
        max_steps=1,
        confirm_runs=0,
    )
    summary = search_study(req, console)
    return points_from_results(list(summary.outcome.results), predict_step_s=None, expected_oom=True)


def run_calibration(
    facts: Facts, *, out_dir: Path, model: str | None = None, console: Console | None = None
) -> CalibrationOutcome:
    """Run the calibration trials on this machine's first visible GPU and store the table.

    Without a GPU: one ``warn`` line saying it needs one (nothing runs).
    """
    if not facts.gpus:
        return CalibrationOutcome(
            None,
            (),
            (
                Finding(
                    "calibrate",
                    Status.WARN,
                    "--calibrate needs a GPU and this machine has none (nothing was run)",
                    "Run autotune doctor --calibrate on the GPU host you will tune on",
                ),
            ),
        )
    console = console or Console(stderr=True, highlight=False)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = (out_dir / f"doctor-calibrate-{stamp}").absolute()
    out.mkdir(parents=True, exist_ok=True)
    name = model or CALIBRATION_MODEL
    try:
        points, spec = _trl_points(out, name, facts, console)
        points += _oom_points(out, console)
    except Exception as exc:  # noqa: BLE001 - reported as the doctor's line, the rest of its report stands
        return CalibrationOutcome(
            None,
            (),
            (
                Finding(
                    "calibrate",
                    Status.FAIL,
                    f"the calibration trials could not run ({type(exc).__name__}: {exc})",
                    f"Read the trials' logs under {out}; fix what `autotune doctor` reports and run again",
                ),
            ),
        )
    table = build_table(
        facts.gpus[0].name,
        name,
        int(spec.params) if spec is not None else 0,
        points,
        datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )
    return _finish(table, out)


def _finish(table: CalibrationTable, out: Path) -> CalibrationOutcome:
    import json

    from autotune.studydir import write_text_atomic

    md, js = out / "calibration.md", out / "calibration.json"
    write_text_atomic(md, table.to_markdown())
    write_text_atomic(js, json.dumps(table.to_dict(), indent=2))
    cached = store_table(table)
    status = Status.OK if table.oom_classified is not False else Status.FAIL
    detail = (
        f"{len(table.points)} trial(s) on {table.device}: memory factor {table.calibration().factor:.2f}, "
        f"step time measured/predicted {table.step_time_ratio if table.step_time_ratio is not None else '—'}, "
        f"deliberate OOM classified OOM: {table.oom_classified}; table {md}, cached in {cached}"
    )
    fix = (
        ""
        if status is Status.OK
        else "Report it: a real CUDA OOM was not classified OOM (see the trial's log)"
    )
    return CalibrationOutcome(table, (md, js, cached), (Finding("calibrate", status, detail, fix),))
