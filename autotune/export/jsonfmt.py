"""``--format json``: the winner's knobs, the study's fixed arguments, what was measured, and versions.

One file, ``knobs.json``, meant for tools and for the record. Secret arguments are left out. Keys:

``_comment``                      marker line (autotune wrote this file).
``study``, ``trial``, ``recommended``, ``why``   which trial and why.
``backend``, ``backend_version``  the framework the study ran.
``params``, ``derived``           the trial's knobs (framework names) and what autotune derived
                                  (world size, gradient accumulation).
``fixed``                         the user's fixed arguments (secrets left out).
``model``, ``dataset``, ``global_batch``, ``num_generations``, ``max_completion_length``
``hardware``                      GPU names and memory, or ``null`` on a CPU-only study.
``throughput_completions_per_s``, ``tokens_per_s``, ``step_time_s``, ``rel_ci95``
``speedup_over_baseline``, ``baseline_trial``
``speedup_low``, ``speedup_high``  the 95 % interval of the speedup (re-measured), else ``null``
``speedup_measurable``            ``true``/``false`` when re-measured (``false``: no measurable speedup)
``verdict``                       the study's sentence on the speedup
``peak_mem_bytes``, ``headroom_bytes``, ``framework_peak_mem_bytes``, ``host_peak_rss_bytes``
``versions``                      packages of the study's environment.
"""

from __future__ import annotations

from typing import Any

from autotune.export._common import MARKER, Export, json_text, mask_secrets
from autotune.export._winner import Winner

__all__ = ["KNOBS_FILE", "export_json", "summary"]

KNOBS_FILE = "knobs.json"


def summary(w: Winner) -> dict[str, Any]:
    """The JSON record of the winner (see the module docstring for its keys)."""
    from autotune.recommend import headroom_bytes
    from autotune.studydir import StudyDir

    r = w.result
    fixed, _ = mask_secrets(w.fixed, w.secrets)
    from autotune.recommend import headline

    baseline = None
    speedup = low = high = measurable = verdict = None
    rec = (
        w.recommendation if w.recommendation is not None else StudyDir(w.study_dir).recommendation(w.settings)
    )
    if rec is not None:
        baseline = rec.baseline_trial
        if rec.trial == r.number:  # the recommendation's own speedup: re-measured when the study did
            speedup, low, high, measurable = rec.speedup, rec.speedup_low, rec.speedup_high, rec.measurable
            verdict = headline(rec)
        elif rec.baseline_throughput and r.throughput:
            speedup = r.throughput / rec.baseline_throughput
    model = w.settings.model
    hardware = None
    if w.hardware is not None and w.hardware.gpus:
        hardware = {
            "gpus": [
                {"index": g.index, "name": g.name, "memory_total_bytes": g.memory_total_bytes}
                for g in w.hardware.gpus
            ]
        }
    name = w.study_name
    return {
        "_comment": f"{MARKER} from study {name}, trial {r.number}",
        "study": name,
        "trial": r.number,
        "recommended": w.recommended,
        "why": w.why,
        "backend": w.backend,
        "backend_version": w.settings.backend_version,
        "params": dict(r.params),
        "derived": dict(r.derived),
        "fixed": fixed,
        "model": model.path_or_id or model.name,
        "dataset": w.settings.dataset,
        "global_batch": w.settings.global_batch,
        "num_generations": w.settings.num_generations,
        "max_completion_length": w.settings.max_completion_length,
        "hardware": hardware,
        "throughput_completions_per_s": r.throughput,
        "tokens_per_s": r.steady.tokens_per_s if r.steady else None,
        "step_time_s": r.steady.step_time_s if r.steady else None,
        "rel_ci95": r.steady.rel_ci95 if r.steady else None,
        "speedup_over_baseline": speedup,
        "speedup_low": low,
        "speedup_high": high,
        "speedup_measurable": measurable,
        "verdict": verdict,
        "baseline_trial": baseline,
        "peak_mem_bytes": list(r.peak_mem_bytes),
        "headroom_bytes": headroom_bytes(r, w.hardware),
        "framework_peak_mem_bytes": r.framework_peak_mem_bytes,
        "host_peak_rss_bytes": r.host_peak_rss_bytes,
        "versions": dict(w.settings.versions),
    }


def export_json(w: Winner) -> Export:
    """``knobs.json`` for the winner."""
    return Export(format="json", files={KNOBS_FILE: json_text(summary(w))}, main=KNOBS_FILE, trial=w.number)
