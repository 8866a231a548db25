"""Charts: one matplotlib drawing (Agg, no pyplot state) per chart, saved as SVG or PNG.

The HTML report inlines each chart as SVG (no script, nothing fetched); the markdown report links the
same drawing as a PNG in ``charts/``. Both come from the same prepared series and the same function,
so the two reports show the same numbers. Chart text is made only of numbers, knob names/values and
trial numbers; log text never enters a chart.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from autotune.probes.phases import PHASES
from autotune.reports._load import StudyData, TrialData
from autotune.reports.insight import Importance, ParetoPoint, ProgressPoint

__all__ = [
    "PHASE_COLORS",
    "STATUS_COLORS",
    "TimelineSeries",
    "timeline_series",
    "inline_svg",
    "timeline_chart",
    "throughput_chart",
    "importance_chart",
    "pareto_chart",
    "progress_chart",
]

GIB = 2**30
MAX_POINTS = 600  # per series; longer timelines are binned (mean utilization, max memory)
MAX_STEP_MARKS = 60
PHASE_COLORS = {"rollout": "#4C78A8", "train": "#F58518", "weight_sync": "#E45756", "other": "#9D9D9D"}
STATUS_COLORS = {
    "COMPLETE": "#2E7D32",
    "UNHEALTHY": "#8E24AA",
    "OOM": "#C62828",
    "VLLM_INIT": "#D84315",
    "HOST_OOM": "#AD1457",
    "HANG": "#6D4C41",
    "TIMEOUT": "#EF6C00",
    "INVALID": "#546E7A",
    "CRASH": "#B71C1C",
    "PRUNED": "#90A4AE",
    "INTERRUPTED": "#78909C",
    "RUNNING": "#1565C0",
}
LINE_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


# ------------------------------------------------------------------------------------ shared data


@dataclass
class TimelineSeries:
    """What a timeline chart shows, in seconds since the trial's first sample.

    Attributes:
        kind: "gpu" (utilization %, memory GiB per GPU) or "host" (CPU %, RSS GiB) or "none".
        lines: label → (t_s, top-panel values, bottom-panel values).
        capacity_gib: memory capacity line for the bottom panel (GPU only).
        spans: (phase, t0_s, t1_s, open) for shading.
        steps: (step number, t_s) step boundaries.
    """

    kind: str
    lines: dict[str, tuple[list[float], list[float | None], list[float | None]]] = field(default_factory=dict)
    capacity_gib: float | None = None
    spans: list[tuple[str, float, float, bool]] = field(default_factory=list)
    steps: list[tuple[int, float]] = field(default_factory=list)
    top_title: str = ""
    bottom_title: str = ""

    @property
    def empty(self) -> bool:
        return not self.lines


def _bin(
    df: pd.DataFrame, t0: float, top: str, bottom: str
) -> tuple[list[float], list[float | None], list[float | None]]:
    t = df["t_mono_s"].astype(float) - t0
    frame = pd.DataFrame(
        {
            "t": t,
            "top": df[top].astype(float) if top in df else np.nan,
            "bottom": df[bottom].astype(float) if bottom in df else np.nan,
        }
    )
    frame = frame.dropna(subset=["top", "bottom"], how="all")
    if len(frame) > MAX_POINTS:
        edges = np.linspace(frame["t"].min(), frame["t"].max() + 1e-9, MAX_POINTS + 1)
        groups = frame.groupby(pd.cut(frame["t"], list(edges), include_lowest=True), observed=True)
        frame = pd.DataFrame(
            {"t": groups["t"].mean(), "top": groups["top"].mean(), "bottom": groups["bottom"].max()}
        )
    return (
        [round(float(x), 2) for x in frame["t"]],
        [None if pd.isna(x) else round(float(x), 1) for x in frame["top"]],
        [None if pd.isna(x) else round(float(x), 3) for x in frame["bottom"]],
    )


def timeline_series(data: StudyData, trial: TrialData) -> TimelineSeries:
    """Utilization and memory per GPU (or host CPU and RSS on a CPU-only run), phases and step marks."""
    t0 = trial.t0_mono_s
    gpu = trial.gpu_rows()
    host = trial.host_rows()
    if t0 is None or (gpu is None and host is None):
        return TimelineSeries(kind="none")
    if gpu is not None:
        out = TimelineSeries(kind="gpu", top_title="GPU utilization (%)", bottom_title="memory used (GiB)")
        for device in sorted(gpu["device"].dropna().unique()):
            rows = gpu[gpu["device"] == device].copy()
            rows["mem_gib"] = (
                rows["mem_used_bytes"].astype(float) / GIB if "mem_used_bytes" in rows else np.nan
            )
            out.lines[f"GPU {int(device)}"] = _bin(rows, t0, "gpu_util_pct", "mem_gib")
        caps = [data.capacity_bytes(i, trial) for i in range(max(1, data.gpu_count))]
        caps_known = [c for c in caps if c is not None]
        out.capacity_gib = round(min(caps_known) / GIB, 3) if caps_known else None
    else:
        rows = host.copy() if host is not None else pd.DataFrame()
        cores = trial.result.timeline_summary.host.cpu_cores if trial.result.timeline_summary else None
        if not cores and data.hardware is not None:
            cores = data.hardware.host.cpu_cores_logical
        # The trial's own process tree first: on a shared host the host-wide figure says little.
        if "cpu_pct" in rows and rows["cpu_pct"].notna().any():
            rows["cpu"] = rows["cpu_pct"].astype(float) / (cores or 1)
            top = "trial CPU (% of all cores)" if cores else "trial CPU (% of one core)"
        elif "host_cpu_pct" in rows:
            rows["cpu"] = rows["host_cpu_pct"].astype(float)
            top = "host CPU (% of all cores)"
        else:
            rows["cpu"] = np.nan
            top = "CPU"
        rows["rss_gib"] = rows["rss_bytes"].astype(float) / GIB if "rss_bytes" in rows else np.nan
        out = TimelineSeries(kind="host", top_title=top, bottom_title="trial RSS (GiB)")
        out.lines["host"] = _bin(rows, t0, "cpu", "rss_gib")
    out.spans = [
        (
            s.phase if s.phase in PHASES else "other",
            round(s.t0_mono_s - t0, 2),
            round(s.t1_mono_s - t0, 2),
            s.open,
        )
        for s in trial.spans
    ]
    every = max(1, -(-len(trial.steps) // MAX_STEP_MARKS))  # thin the marks of long runs
    out.steps = [
        (s.step, round(s.t_mono_s - t0, 2))
        for i, s in enumerate(trial.steps)
        if i % every == every - 1 or i == len(trial.steps) - 1
    ]
    return out


# ---------------------------------------------------------------------------------------- matplotlib


def _mpl_figure(
    width_in: float,
    height_in: float,
    nrows: int = 1,
    ncols: int = 1,
    margins: dict[str, float] | None = None,
    **kw: Any,
) -> tuple[Any, Any]:
    """A matplotlib figure on the Agg canvas (no pyplot global state), with fixed margins.

    Fixed margins instead of ``bbox_inches="tight"``: that option draws every figure twice.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, **kw)
    fig.subplots_adjust(**{"left": 0.08, "right": 0.98, "top": 0.9, "bottom": 0.14, **(margins or {})})
    return fig, axes


def _save(fig: Any, path: Path) -> Path:
    """Write ``fig`` as PNG, or as SVG when ``path`` ends in ``.svg`` (text kept as text); atomically,
    never through a link planted in charts/."""
    import io

    from matplotlib import rc_context

    from autotune.studydir import write_bytes_atomic

    buf = io.BytesIO()
    if path.suffix == ".svg":
        with rc_context({"svg.fonttype": "none"}):
            fig.savefig(buf, format="svg", metadata={"Date": None})
    else:
        fig.savefig(buf, format="png")
    write_bytes_atomic(path, buf.getvalue())
    return path


def inline_svg(draw: Callable[[Path], Path]) -> str:
    """A chart drawn by ``draw`` (one of the functions below, given a path) as an ``<svg>`` element."""
    with tempfile.TemporaryDirectory(prefix="autotune-chart-") as tmp:
        text = draw(Path(tmp) / "chart.svg").read_text(encoding="utf-8")
    return text[text.index("<svg") :]


def timeline_chart(series: TimelineSeries, title: str, path: Path) -> Path:
    fig, (top, bottom) = _mpl_figure(
        9, 4.6, 2, 1, margins={"left": 0.08, "top": 0.93, "bottom": 0.1, "hspace": 0.12}, sharex=True
    )
    for i, (label, (t, a, b)) in enumerate(series.lines.items()):
        color = LINE_COLORS[i % len(LINE_COLORS)]
        top.plot(t, [np.nan if v is None else v for v in a], lw=0.9, color=color, label=label)
        bottom.plot(t, [np.nan if v is None else v for v in b], lw=0.9, color=color)
    for phase, a0, a1, is_open in series.spans:
        for ax in (top, bottom):
            ax.axvspan(a0, a1, color=PHASE_COLORS[phase], alpha=0.28 if is_open else 0.13, lw=0)
    for _, step_t in series.steps:
        for ax in (top, bottom):
            ax.axvline(step_t, color="#555", lw=0.6, ls=":")
    if series.capacity_gib is not None:
        bottom.axhline(series.capacity_gib, color="#C62828", lw=0.8, ls="--")
    top.set_ylim(0, 105)
    top.set_ylabel(series.top_title, fontsize=8)
    bottom.set_ylabel(series.bottom_title, fontsize=8)
    bottom.set_xlabel("seconds since start", fontsize=8)
    top.set_title(title, fontsize=10, loc="left")
    from matplotlib.patches import Patch

    handles, labels = top.get_legend_handles_labels()
    for phase in PHASES:
        if any(s[0] == phase for s in series.spans):
            handles.append(Patch(color=PHASE_COLORS[phase], alpha=0.4))
            labels.append(phase)
    if handles:
        top.legend(
            handles,
            labels,
            fontsize=7,
            ncol=min(8, len(labels)),
            loc="lower right",
            bbox_to_anchor=(1.0, 1.0),
            frameon=False,
        )
    for ax in (top, bottom):
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.25)
    return _save(fig, path)


def throughput_chart(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    fig, ax = _mpl_figure(9, 3.2, margins={"left": 0.07})
    x = np.arange(len(rows))
    y = [r["throughput"] or 0.0 for r in rows]
    ax.bar(
        x,
        y,
        color=[STATUS_COLORS.get(r["status"], "#777") for r in rows],
        yerr=[r["ci_abs"] or 0.0 for r in rows],
        capsize=2,
    )
    top = max(y + [1e-9])
    for xi, yi, r in zip(x, y, rows, strict=True):
        if r["status"] != "COMPLETE":
            ax.text(xi, yi + top * 0.02, r["status"], rotation=90, ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, [f"#{r['number']}" for r in rows], fontsize=7)
    ax.set_ylabel("completions/s", fontsize=8)
    # never a negative axis; a study where nothing completed shows 0 to 1, not matplotlib's ±0.05
    ax.set_ylim(bottom=0.0, top=None if top > 1e-9 else 1.0)
    ax.set_title("Throughput per trial", fontsize=10, loc="left")
    ax.grid(axis="y", alpha=0.25)
    return _save(fig, path)


def importance_chart(imp: Importance, path: Path) -> Path:
    """The knobs' importance for throughput, the method named in the title."""
    names = list(imp.values)[::-1]
    longest = max((len(n) for n in names), default=10)
    height_in = max(1.8, 0.7 + 0.35 * len(names))
    fig, ax = _mpl_figure(
        7,
        height_in,
        margins={
            "left": min(0.55, 0.04 + 0.0105 * longest),
            "bottom": 0.5 / height_in,
            "top": 1 - 0.35 / height_in,
        },
    )
    ax.barh(names, [imp.values[n] for n in names], color="#4C78A8")
    ax.set_xlabel("share of importance", fontsize=8)
    ax.set_title(f"Parameter importance for throughput ({imp.method})", fontsize=10, loc="left")
    ax.tick_params(labelsize=8)
    return _save(fig, path)


def pareto_chart(
    points: Sequence[ParetoPoint],
    failed: Sequence[tuple[int, str, float]],
    capacity_gib: float | None,
    memory_label: str,
    path: Path,
) -> Path:
    fig, ax = _mpl_figure(7, 4, margins={"left": 0.1, "bottom": 0.12})
    front = [p for p in points if p.on_front]
    rest = [p for p in points if not p.on_front]
    ax.plot(
        [p.peak_bytes / GIB for p in front],
        [p.throughput for p in front],
        "o-",
        color="#2E7D32",
        label="Pareto front",
    )
    if rest:
        ax.plot(
            [p.peak_bytes / GIB for p in rest],
            [p.throughput for p in rest],
            "o",
            color="#9E9E9E",
            label="dominated",
        )
    for p in points:
        ax.annotate(
            f"#{p.trial}",
            (p.peak_bytes / GIB, p.throughput),
            textcoords="offset points",
            xytext=(0, 6),
            ha="center",
            fontsize=7,
        )
    if failed:
        ax.plot(
            [f[2] for f in failed],
            [0.0] * len(failed),
            "x",
            color="#C62828",
            ms=8,
            clip_on=False,  # on the axis line (a failed trial has no throughput), not below it
            label="out of memory: " + ", ".join(f"#{n}" for n, _, _ in failed),
        )
    if capacity_gib:
        ax.axvline(capacity_gib, color="#C62828", lw=0.8, ls="--")
    ax.set_xlabel(memory_label, fontsize=8)
    ax.set_ylabel("completions/s", fontsize=8)
    ax.set_title("Throughput against peak memory", fontsize=10, loc="left")
    ax.set_ylim(bottom=0.0, top=1.18 * max((p.throughput for p in points), default=1.0))
    ax.legend(fontsize=7)
    ax.grid(alpha=0.25)
    return _save(fig, path)


def progress_chart(points: Sequence[ProgressPoint], path: Path, *, hours_label: str = "GPU-hours") -> Path:
    """Best throughput so far against the trial number (whole trials: integer ticks) and against the
    device-hours spent (``CPU-hours`` for a CPU-only study)."""
    from matplotlib.ticker import MaxNLocator

    fig, (a, b) = _mpl_figure(9, 3.2, 1, 2, margins={"wspace": 0.05}, sharey=True)
    a.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax, xs, label in (
        (a, [p.trial for p in points], "trial"),
        (b, [p.gpu_hours for p in points], hours_label),
    ):
        ax.step(
            xs,
            [np.nan if p.best is None else p.best for p in points],
            where="post",
            color="#2E7D32",
            lw=2,
            label="best so far",
        )
        ax.plot(
            xs,
            [np.nan if p.throughput is None else p.throughput for p in points],
            "o",
            color="#4C78A8",
            ms=4,
            label="completed trial",
        )
        ax.set_xlabel(label, fontsize=8)
        ax.grid(alpha=0.25)
        ax.tick_params(labelsize=7)
    a.set_ylabel("completions/s", fontsize=8)
    # a throughput is never negative; when no trial completed there is nothing for matplotlib to scale
    # to, so the axes span the trials and the hours spent rather than ±0.05 around 0
    if all(p.throughput is None for p in points):
        a.set_ylim(0.0, 1.0)
        a.set_xlim(points[0].trial - 0.5, points[-1].trial + 0.5)
        b.set_xlim(0.0, max(p.gpu_hours for p in points) * 1.05 or 1.0)
    else:
        a.set_ylim(bottom=0.0)
    a.set_title("Best throughput so far", fontsize=10, loc="left")
    a.legend(fontsize=7)
    return _save(fig, path)
