"""The report's trials table: one row per trial (its knobs, status, speed, memory, load, files) and the
text of a knob's choice, shared by the HTML and markdown templates."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune.reports._format import DASH, gib, is_num, knob_value, pct, rate, seconds, share
from autotune.reports._load import StudyData, TrialData
from autotune.reports._safety import Sanitizer
from autotune.reports._signals import TrialSignals
from autotune.reports.limits import fraction_text

from autotune.records import TrialResult
from autotune.studydir import TrialDir
from autotune.trial.hostload import host_load

EVIDENCE_CHARS = 400  # a trial's failure evidence is cut to this many characters in the table


def trial_rows(
    data: StudyData,
    signals: Mapping[int, TrialSignals],
    winner: int | None,
    out_dir: Path,
    clean: Sanitizer,
    knob_names: list[str],
) -> list[dict[str, Any]]:
    """One row of the trials table per trial, by number."""
    return [
        _trial_row(t, data.baseline, signals.get(t.number), winner, out_dir, clean, knob_names)
        for t in data.trials
    ]


def _trial_row(
    t: TrialData,
    base: TrialData | None,
    sig: TrialSignals | None,
    winner: int | None,
    out_dir: Path,
    clean: Sanitizer,
    knob_names: list[str],
) -> dict[str, Any]:
    r = t.result
    tp = r.throughput
    ci_abs = tp * r.steady.rel_ci95 if tp is not None and r.steady is not None else None
    peaks = sig.peak_bytes if sig is not None else []
    caps = sig.capacity_bytes if sig is not None else []
    peak_known = [p for p in peaks if p is not None]
    host_peak = r.host_peak_rss_bytes
    predicted = (r.estimate or {}).get("peak_bytes") if isinstance(r.estimate, dict) else None
    pred_err = None
    if predicted is not None and is_num(predicted) and peak_known:
        pred_err = (float(predicted) - max(peak_known)) / max(peak_known)
    steady = r.steady
    if steady is not None:
        steps_text = f"{steady.steady_steps} steady of {r.steps} ({steady.warmup_steps} warm-up)"
    else:
        steps_text = f"{r.steps}" if r.steps else "0"
    util = _util_pct(r, sig)
    return {
        "number": t.number,
        "is_baseline": r.is_baseline,
        "is_winner": t.number == winner,
        "status": r.status.value,
        "status_class": status_class(r.status.value),
        "reason": clean.clean(r.reason),
        "evidence": clean.clean(_truncate(r.evidence)) if r.evidence else "",
        "health": [clean.clean(h) for h in r.health],
        "host_load": _row_load(r),
        "knobs": _knob_cells(t, base, knob_names, clean),
        "throughput": tp,
        "ci_abs": ci_abs,
        "throughput_text": (f"{tp:.3g} ± {ci_abs:.2g}" if ci_abs is not None else f"{tp:.3g}")
        if tp is not None
        else DASH,
        "tokens_text": rate(steady.tokens_per_s, " tok/s")
        if steady is not None and steady.tokens_per_s
        else "",
        "peaks_text": " / ".join(gib(p) for p in peaks)
        if peak_known
        else (gib(host_peak) + " RSS" if host_peak else DASH),
        "peak_max": max(peak_known) if peak_known else (host_peak or None),
        "headroom_text": _headroom_text(peaks, caps),
        "util_text": pct(util),
        "util": util,
        "idle_text": share(sig.idle_share if sig is not None else None),
        "steps_text": steps_text,
        "steps": r.steps,
        "predicted_text": gib(predicted) if is_num(predicted) else DASH,
        "predicted_err_text": f"{pred_err:+.0%}" if pred_err is not None else "",
        "duration_text": seconds(r.duration_s) if r.duration_s else DASH,
        "duration_s": r.duration_s,
        "links": _file_links(t, out_dir),
        "choice_text": clean.clean(choice_text(r.choice)),
        "limit_text": fraction_text(r.ceiling),
        "limit_fraction": r.ceiling.step_fraction if r.ceiling is not None else None,
    }


def _row_load(r: TrialResult) -> str:
    """The trial's host-load flag ("host loaded by other processes during this trial (...)"), or ""."""
    load = host_load(r.timeline_summary)
    return load.text() if load is not None and load.loaded else ""


def choice_text(choice: Mapping[str, Any] | None) -> str:
    """Why the search ran a trial, in one line: its move from the incumbent, predicted speed and risk."""
    if not choice:
        return ""
    mode = str(choice.get("mode", ""))
    fixed = {
        "baseline": "the baseline: the framework's defaults or your own settings",
        "sampler": "chosen by Optuna's sampler",
        "grid": "next grid point",
        "requeued": "re-run: its earlier run was interrupted, or the next untried configuration",
    }
    if mode in fixed:
        return fixed[mode]
    parts: list[str] = []
    move = choice.get("move") or {}
    incumbent = choice.get("incumbent")
    changes = ", ".join(f"{k} {knob_value(a)}→{knob_value(b)}" for k, (a, b) in move.items())
    if mode == "refine" and incumbent is not None:
        parts.append(f"refine best trial {incumbent}: {changes}")
    elif mode == "probe" and incumbent is not None:
        parts.append(
            f"test a suspect of earlier failures ({choice.get('suspect') or 'a knob value'}) on best trial "
            f"{incumbent}: {changes}; if it works, faster configurations with it are open"
        )
    elif mode in ("screen", "combine"):
        covers = ", ".join(f"{k} {knob_value(v)}" for k, v in (choice.get("covers") or {}).items())
        parts.append(
            f"screen the high-impact knobs: measure {covers or 'the design row'}"
            if mode == "screen"
            else f"combine the best screened levels: {covers or 'as measured'}"
        )
    elif incumbent is not None:
        parts.append(
            f"explore: {len(move)} knob{'s' if len(move) != 1 else ''} away from best trial {incumbent}"
        )
    else:
        parts.append("explore: the model's most promising configuration")
    for key, text in (
        ("predicted_throughput", "predicted {:.3g}/s"),
        ("expected_gain_frac", "expected gain {:+.1%}"),
        ("failure_risk", "failure risk {:.0%}"),
    ):
        value = choice.get(key)
        if is_num(value):
            parts.append(text.format(value))
    return "; ".join(parts)


def _file_links(t: TrialData, out_dir: Path) -> dict[str, str]:
    """The trial's own files, linked relative to the report."""
    links = {}
    for name in (TrialDir.COMMAND, TrialDir.STDOUT, TrialDir.STDERR, TrialDir.METRICS, TrialDir.RESULT):
        path = t.files.get(name) or (
            (t.dir / name) if t.dir is not None and (t.dir / name).is_file() else None
        )
        link = rel_link(path, out_dir) if path is not None else None
        # a report written outside the study links to nothing outside its own folder
        if link is not None and not link.startswith("../"):
            links[name] = link
    return links


def _knob_cells(
    t: TrialData, base: TrialData | None, knob_names: list[str], clean: Sanitizer
) -> list[dict[str, Any]]:
    """The trial's value of every knob of the table, marked where it differs from the baseline's."""
    knobs = []
    for k in knob_names:
        present = k in t.params
        value = t.params.get(k)
        changed = base is not None and t is not base and present and base.params.get(k, object()) != value
        knobs.append(
            {
                "name": k,
                "text": clean.clean(knob_value(value)) if present else "",
                "sort": _sort_value(value) if present else "",
                "changed": changed,
            }
        )
    return knobs


def _util_pct(r: TrialResult, sig: TrialSignals | None) -> float | None:
    """Mean GPU utilisation, else (no GPU rows) the trial's CPU use as a share of all cores."""
    util = sig.util_mean_pct if sig is not None else None
    if util is None:
        host = r.timeline_summary.host if r.timeline_summary is not None else None
        cores = host.cpu_cores if host is not None else None
        if host is not None and host.cpu_mean_pct is not None and cores:
            util = float(host.cpu_mean_pct) / cores
    return util


def status_class(status: str) -> str:
    return status.lower()


def _headroom_text(peaks: Sequence[int | None], caps: Sequence[int | None]) -> str:
    heads = [c - p for p, c in zip(peaks, caps, strict=False) if p is not None and c is not None]
    return f"min {gib(min(heads))}" if heads else DASH


def _sort_value(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if is_num(value):
        return repr(float(value))
    return "" if value is None else str(value)


def _truncate(text: str | None, limit: int = EVIDENCE_CHARS) -> str:
    if not text:
        return ""
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def knob_names(data: StudyData) -> list[str]:
    order = [k["name"] for k in data.settings.knobs if isinstance(k.get("name"), str)]
    seen = {k for t in data.trials for k in t.params}
    return [k for k in order if k in seen] + sorted(seen - set(order))


def rel_link(path: Path, out_dir: Path) -> str:
    return Path(os.path.relpath(path.resolve(), out_dir.resolve())).as_posix()
