"""A study directory as pandas DataFrames, for notebooks and scripts (``autotune.load_study``).

The trials frame holds the rows of the report's trials table (the same rows, built by the same code,
:func:`autotune.reports._render.trial_rows`), with numbers instead of text and the knobs in their own
types; the timelines and phases frames hold every trial's sampled timeline and phase spans.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd
from autotune.reports._load import StudyData, load_study
from autotune.reports._render import pick_winner
from autotune.reports._rows import knob_names, trial_rows
from autotune.reports._safety import Sanitizer
from autotune.reports._signals import signals

from autotune.records import Recommendation
from autotune.studysettings import StudySettings

__all__ = ["StudyFrames", "load_frames", "TRIAL_COLUMNS"]

#: the trials frame's columns before the knobs (index: ``number``)
TRIAL_COLUMNS = (
    "status",
    "is_baseline",
    "is_winner",
    "reason",
    "chosen_because",
    "throughput",
    "throughput_ci95",
    "tokens_per_s",
    "peak_mem_bytes",
    "min_headroom_bytes",
    "util_mean_pct",
    "idle_share",
    "steps",
    "steady_steps",
    "limit_fraction",
    "predicted_peak_bytes",
    "duration_s",
    "evidence",
)


@dataclass
class StudyFrames:
    """One study as DataFrames.

    Attributes:
        path: the study directory.
        settings: ``study.json`` as written (backend, model, hardware, space, budget, outcome, ...).
        recommendation: the study's recommendation, or None.
        knobs: the knob columns of :attr:`trials`, in the space's order.
        pinned: knobs the user pinned (``--pin``), name → value.
        problems: files that could not be read, one line each.
    """

    path: Path
    settings: dict[str, Any]
    recommendation: Recommendation | None
    knobs: list[str]
    pinned: dict[str, Any]
    problems: list[str] = field(default_factory=list)
    _data: StudyData | None = field(default=None, repr=False)

    @cached_property
    def trials(self) -> pd.DataFrame:
        """One row per trial (index ``number``): status, metrics and knobs, as the report's table.

        ``util_mean_pct`` is the mean GPU utilisation, or on a CPU-only study the trials' CPU use as a
        share of all cores (as the report's column); ``peak_mem_bytes`` is the highest GPU's peak, else
        the host's peak RSS; ``peak_mem_bytes_gpuN`` give each GPU's.
        """
        assert self._data is not None
        return trials_frame(self._data, self.recommendation)

    @cached_property
    def timelines(self) -> pd.DataFrame:
        """Every trial's sampled timeline (GPU and host rows), with a ``trial`` column."""
        assert self._data is not None
        parts = [t.timeline.assign(trial=t.number) for t in self._data.trials if t.timeline is not None]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["trial"])

    @cached_property
    def phases(self) -> pd.DataFrame:
        """Every trial's phase spans: trial, phase, step, start and end (monotonic s), duration, source."""
        assert self._data is not None
        rows = [
            {
                "trial": t.number,
                "phase": s.phase,
                "step": s.step,
                "t0_mono_s": s.t0_mono_s,
                "t1_mono_s": s.t1_mono_s,
                "duration_s": s.duration_s,
                "open": s.open,
                "source": s.source,
            }
            for t in self._data.trials
            for s in t.spans
        ]
        columns = ["trial", "phase", "step", "t0_mono_s", "t1_mono_s", "duration_s", "open", "source"]
        return pd.DataFrame(rows, columns=columns)

    def __repr__(self) -> str:
        rec = f"trial {self.recommendation.trial}" if self.recommendation else "nothing"
        return f"<autotune study {self.path}: {len(self.trials)} trials, recommends {rec}>"

    def _repr_html_(self) -> str:
        """Jupyter's rich display: the study's headline and its trials table."""
        settings = StudySettings.from_json(self.settings)
        model = settings.model.name or "?"
        rec = self.recommendation
        headline = (
            f"recommends trial {rec.trial} at {rec.throughput:.3g} completions/s"
            if rec is not None
            else "nothing to recommend"
        )
        pinned = ", ".join(f"{k}={v!r}" for k, v in self.pinned.items())
        lines = [
            f"<b>autotune study</b> <code>{html.escape(str(self.path))}</code><br>",
            html.escape(f"{settings.backend or '?'} · {model} · {len(self.trials)} trials · {headline}"),
        ]
        if pinned:
            lines.append(f"<br>pinned: {html.escape(pinned)}")
        shown = self.trials[
            [c for c in ("status", "throughput", "peak_mem_bytes", *self.knobs) if c in self.trials]
        ]
        return "".join(lines) + shown.to_html(na_rep="—", float_format=lambda v: f"{v:.3g}")


def load_frames(study_dir: Path | str) -> StudyFrames:
    """Read a study directory (``runs/<study>``) as :class:`StudyFrames`.

    Raises:
        UsageError: ``study_dir`` is not a study directory.
    """
    data = load_study(Path(study_dir))
    pinned = {k["name"]: k["default"] for k in data.settings.knobs if k.get("pinned") and "name" in k}
    return StudyFrames(
        path=data.root,
        settings=data.meta,
        recommendation=pick_winner(data),
        knobs=knob_names(data),
        pinned=pinned,
        problems=list(data.problems),
        _data=data,
    )


def trials_frame(data: StudyData, winner: Recommendation | None) -> pd.DataFrame:
    """The report's trials table as a DataFrame (see :attr:`StudyFrames.trials`)."""
    clean = Sanitizer.for_study(data.roots, data.env_maps)
    sigs = {t.number: signals(data, t) for t in data.trials}
    names = knob_names(data)
    rows = trial_rows(data, sigs, winner.trial if winner else None, data.root, clean, names)
    gpus = max((len(s.peak_bytes) for s in sigs.values()), default=0)
    records = []
    for t, row in zip(data.trials, rows, strict=True):
        r, sig = t.result, sigs[t.number]
        steady = r.steady
        heads = [h for h in sig.headroom_bytes if h is not None]
        record: dict[str, Any] = {
            "number": t.number,
            "status": row["status"],
            "is_baseline": row["is_baseline"],
            "is_winner": row["is_winner"],
            "reason": row["reason"],
            "chosen_because": row["choice_text"],
            "throughput": row["throughput"],
            "throughput_ci95": row["ci_abs"],
            "tokens_per_s": steady.tokens_per_s if steady is not None else None,
            "peak_mem_bytes": row["peak_max"],
            "min_headroom_bytes": min(heads) if heads else None,
            "util_mean_pct": row["util"],
            "idle_share": sig.idle_share,
            "steps": row["steps"],
            "steady_steps": steady.steady_steps if steady is not None else None,
            "limit_fraction": row["limit_fraction"],  # the step's physical ceiling ÷ its measured time
            "predicted_peak_bytes": (r.estimate or {}).get("peak_bytes"),
            "duration_s": row["duration_s"],
            "evidence": row["evidence"],
        }
        records.append(record)
    frame = pd.DataFrame.from_records(records, columns=["number", *TRIAL_COLUMNS])
    for name in names:
        # the knob in its own type (nullable: a conditional knob is missing where it does not apply)
        column = pd.Series([t.params.get(name) for t in data.trials], dtype=object).convert_dtypes()
        frame[name if name not in frame else f"knob_{name}"] = column
    for pos in range(gpus):
        frame[f"peak_mem_bytes_gpu{pos}"] = [
            s.peak_bytes[pos] if pos < len(s.peak_bytes) else None for s in sigs.values()
        ]
    return frame.set_index("number")
