"""Rendering a study (or a profiled run) into ``report.html`` and ``report.md`` + ``charts/*.png``.

The view model is built once from the study directory; every foreign string in it has passed through
the :class:`~reports._safety.Sanitizer`. The HTML template escapes it (Jinja autoescape); the markdown
template escapes it with :func:`md_cell` / :func:`md_text`; chart data is embedded as escaped JSON.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from autotune.reports import charts
from autotune.reports._format import DASH, gib, knob_value, rate, seconds, share
from autotune.reports._load import StudyData, TrialData, load_profile, load_study
from autotune.reports._meta import command_text, hours_label, meta_view, runs_on_cpu
from autotune.reports._progress import running_text
from autotune.reports._rows import knob_names, rel_link, status_class, trial_rows
from autotune.reports._safety import MASK, Sanitizer
from autotune.reports._signals import TrialSignals
from autotune.reports.diagnosis import Finding, diagnose, make_context
from autotune.reports.insight import best_so_far, param_importances, pareto_points
from autotune.reports.limits import limit_section

from autotune.errors import UsageError
from autotune.recommend import headline, speedup_text
from autotune.records import Recommendation, TrialStatus
from autotune.studydir import StudyDir, TrialDir, ensure_writable, write_text_atomic
from autotune.studysettings import StudySettings
from autotune.trial.hostload import host_load

__all__ = ["ReportPaths", "render_study", "render_profile", "pick_winner", "md_cell", "md_text"]

GIB = 2**30
MAX_TIMELINES = 30
TEMPLATES = Path(__file__).parent / "templates"


@dataclass(frozen=True)
class ReportPaths:
    """What a render wrote.

    Attributes:
        html: ``report.html`` (self-contained).
        markdown: ``report.md``; its charts are PNG files in ``charts/`` beside it.
        findings: the diagnosis, for a caller that wants to print the top of it.
        recommended_trial: the study's recommended trial (None for a profile, or nothing recommended).
        no_recommendation: why a study recommends nothing (None when it does, and for a profile).
        running: ``running: 5 of 12 trials`` while a live run is still writing the study, else None.
    """

    html: Path
    markdown: Path
    charts: tuple[Path, ...] = ()
    findings: tuple[Finding, ...] = ()
    recommended_trial: int | None = None
    no_recommendation: str | None = None
    running: str | None = None


def pick_winner(data: StudyData) -> Recommendation | None:
    """The study's recommendation, as :meth:`autotune.studydir.StudyDir.recommendation` reads it.

    A study that ended stored it in ``study.json``; one that never ended has it decided from its results
    by the study's own rule. A stored recommendation that cannot be read is noted in ``data.problems``
    and decided from the results the same way.
    """
    study_dir = StudyDir(data.root)
    try:
        return study_dir.recommendation(data.settings, data.results)
    except UsageError:  # StudyDir's guarded read: the stored one is not a recommendation
        data.problems.append(
            f"{StudyDir.SETTINGS}: the recommendation is unreadable; decided again from the trial results"
        )
    without = StudySettings.from_json({k: v for k, v in data.meta.items() if k != "recommendation"})
    return study_dir.recommendation(without, data.results)


# ------------------------------------------------------------------------------------------- escaping


def md_text(value: Any) -> str:
    """Foreign text for a markdown paragraph: no HTML, markdown emphasis and links neutralised.

    Underscores inside words (``per_device_train_batch_size``) stay as they are: GitHub does not
    emphasise them.
    """
    # the raw file stays readable ("< 5 %", not "&lt; 5 %"): only a "<" that could open a tag or an
    # autolink and an "&" that could start an entity become entities
    text = re.sub(r"([\\`*\[\]|#~])", r"\\\1", str(value))
    text = re.sub(r"&(?=#?[A-Za-z0-9]+;)", "&amp;", text)
    text = re.sub(r"<(?=[A-Za-z/!?])", "&lt;", text)
    text = re.sub(r"^>", r"\\>", text)
    text = re.sub(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", r"\\_", text)
    return text.replace("\r", " ").replace("\n", " ")


def md_cell(value: Any) -> str:
    """Foreign text for a markdown table cell (also no line breaks)."""
    return md_text(value).replace("\r", " ")


def compact_shell(text: str) -> str:
    """Join ``--flag \\`` / ``value \\`` continuation lines of a ``command.sh`` into ``--flag value \\``.

    Only the layout changes: the words and their order stay, so the command is the same.
    """
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < len(lines) else None
        if (
            nxt is not None
            and line.endswith(" \\")
            and line.lstrip().startswith("-")
            and nxt.startswith("  ")
            and not nxt.lstrip().startswith("-")
        ):
            out.append(line[:-2] + " " + nxt.lstrip())
            i += 2
            continue
        out.append(line)
        i += 1
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def md_code(text: str) -> str:
    """A fenced code block whose fence is longer than any backtick run inside."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}bash\n{text.rstrip()}\n{fence}"


# ------------------------------------------------------------------------------------------ view model
#
# The template's view is one dict, built in the order the report reads: what was tuned (meta), the
# answer (summary), every trial (rows), why trials failed or lag (findings), then the charts. Chart
# figures and PNGs are collected in the order they are drawn, which is the order the HTML embeds them.


def _view(data: StudyData, out_dir: Path, *, png: bool) -> tuple[dict[str, Any], list[Finding], list[Path]]:
    """The template's view of ``data``, the diagnosis, and the PNG charts written into ``out_dir``."""
    clean = Sanitizer.for_study(data.roots, data.env_maps, secret_names=data.secret_names)
    winner = pick_winner(data) if data.kind == "study" else None
    ctx = make_context(data, winner=winner.trial if winner else None)
    findings = diagnose(ctx)
    names = knob_names(data)
    rows = trial_rows(data, ctx.signals, winner.trial if winner else None, out_dir, clean, names)
    figures = _Figures(out_dir, png=png)
    win = _winner_summary(data, winner, ctx.signals, clean)
    throughput = _throughput_chart(data, rows, figures)
    timelines = _timeline_charts(data, winner, ctx.signals, figures)
    insight = _insight(data, ctx.signals, clean, figures)
    view = {
        **meta_view(data, clean),
        "winner": win,
        "limit": limit_section(data, winner.trial if winner else None),
        "running": (running := running_text(data)),
        "no_winner": _no_winner_text(data) if data.kind == "study" and win is None and not running else None,
        "run": _run_summary(data, rows, clean),
        "rows": rows,
        "knob_names": names,
        **throughput,
        **timelines,
        "findings": _group_findings(findings, clean),
        "insight": insight,
        "problems": [clean.clean(p) for p in data.problems],
        "svgs": figures.svgs,
    }
    return view, findings, figures.written


# --------------------------------------------------------------------------------------------- summary


def _winner_summary(
    data: StudyData,
    winner: Recommendation | None,
    signals: Mapping[int, TrialSignals],
    clean: Sanitizer,
) -> dict[str, Any] | None:
    """The recommended trial: its speed against the baseline, its headroom, its knobs and its command."""
    winner_trial = data.trial(winner.trial) if winner else None
    if winner is None or winner_trial is None:
        return None
    command, source = _command_block(data, winner_trial, clean)
    steady = winner_trial.result.steady
    ci = steady.rel_ci95 if steady else None
    return {
        "trial": winner.trial,
        "throughput_text": f"{winner.throughput:.3g} completions/s"
        + (f" ± {ci:.1%}" if ci is not None else ""),
        "tokens_text": rate(steady.tokens_per_s, " tokens/s") if steady and steady.tokens_per_s else "",
        "speedup_text": speedup_text(winner),
        "measurable": winner.measurable,
        "verdict": clean.clean(headline(winner)),
        "host_load": clean.clean(_verdict_load(data, winner) or ""),
        "equivalent": list(winner.equivalent),
        "confirmation": _confirmation_view(data, winner),
        "baseline_trial": winner.baseline_trial,
        "baseline_text": f"{winner.baseline_throughput:.3g} completions/s"
        if winner.baseline_throughput
        else "did not complete",
        "headroom": _winner_headroom(data, winner, winner_trial, signals.get(winner.trial)),
        "why": clean.clean(winner.why),
        "skipped": [(n, clean.clean(why)) for n, why in winner.skipped],
        "knobs": [(k, clean.clean(knob_value(v))) for k, v in winner_trial.params.items()],
        "command": command,
        "command_source": source,
        "masked": bool(command and MASK in command),
    }


def _verdict_load(data: StudyData, winner: Recommendation) -> str | None:
    """The host-load note next to the verdict: the re-measurement's, else (not re-measured) whether the
    search's runs of the winner or the baseline ran on a loaded host."""
    if winner.confirmation is not None:
        return winner.host_load
    loaded = []
    for n in (winner.baseline_trial, winner.trial):
        t = data.trial(n)
        load = host_load(t.result.timeline_summary) if t is not None else None
        if load is not None and load.loaded:
            loaded.append((n, load))
    if not loaded:
        return None
    worst = max(load.other_busy_cores for _, load in loaded)
    which = " and ".join(f"trial {n}" for n, _ in loaded)
    return (
        f"host loaded by other processes during {which} (up to {worst:.1f} cores busy outside the trial):"
        " the speedup includes that noise"
    )


def _confirmation_view(data: StudyData, winner: Recommendation) -> dict[str, Any] | None:
    """The re-measurement: every run in the order it ran, each compared trial against the winner, the cost."""
    c = winner.confirmation
    if c is None:
        return None
    runs = []
    for run in c.runs:
        runs.append(
            {
                "order": run.order,
                "trial": run.trial,
                "round": run.round,
                "role": run.role.replace("_", "-"),
                "status": run.status.value,
                "status_class": status_class(run.status.value),
                "throughput_text": f"{run.throughput:.3g}" if run.throughput else DASH,
                "step_text": (
                    f"{run.step_time_s:.3g} s ± {run.rel_ci95:.0%}"
                    if run.step_time_s and run.rel_ci95 is not None
                    else DASH
                ),
                "steps": run.steady_steps,
                "other_text": f"{run.other_busy_cores:.1f}" if run.other_busy_cores is not None else DASH,
                "loaded": run.host_loaded,
                "duration_text": seconds(run.duration_s) if run.duration_s else DASH,
            }
        )
    versus = [
        {
            "trial": t,
            "text": iv.text(),
            "equivalent": t in winner.equivalent,
            "baseline": t == winner.baseline_trial,
        }
        for t, iv in sorted(c.versus_winner.items())
    ]
    hours = hours_label(data)
    return {
        "rounds": c.rounds,
        "runs": runs,
        "versus": versus,
        "cost_text": f"{len(c.runs)} run(s), {seconds(c.duration_s)}, {c.gpu_seconds / 3600:.2f} {hours}",
        "method": c.method,
        "note": c.note or "",
        "search_speedup_text": f"{winner.search_speedup:.2f}×" if winner.search_speedup else DASH,
    }


def _winner_headroom(
    data: StudyData, winner: Recommendation, winner_trial: TrialData, sig: TrialSignals | None
) -> list[dict[str, str]]:
    """Memory left per GPU: the recommendation's own numbers, else what the trial's timeline measured."""
    headroom = []
    for pos, head in enumerate(winner.headroom_bytes):
        cap = data.capacity_bytes(pos, winner_trial)
        headroom.append(
            {
                "gpu": data.gpu_label(pos),
                "text": gib(head),
                "share": share(head / cap) if head is not None and cap else DASH,
            }
        )
    if not headroom and sig is not None:
        for pos, head in enumerate(sig.headroom_bytes):
            headroom.append({"gpu": data.gpu_label(pos), "text": gib(head), "share": DASH})
    return headroom


def _no_winner_text(data: StudyData) -> str:
    done = sum(1 for t in data.trials if t.status is TrialStatus.COMPLETE)
    return (
        "No trial can be recommended: none completed healthy with memory headroom"
        f" ({done} completed). The diagnosis below says why the trials failed."
    )


def _run_summary(data: StudyData, rows: Sequence[dict[str, Any]], clean: Sanitizer) -> dict[str, Any] | None:
    """The single run of a profile (None for a study): its row of the trials table and its command."""
    if data.kind != "profile" or not data.trials:
        return None
    row = rows[0]
    cpu = runs_on_cpu(data)
    return {
        "measured": "CPU" if cpu else "GPU",
        "util_label": "Mean CPU use (share of all cores)" if cpu else "Mean GPU utilization",
        "peak_label": "Peak RSS (process tree)" if cpu else "Peak memory per GPU",
        "status": row["status"],
        "status_class": row["status_class"],
        "reason": row["reason"],
        "throughput_text": row["throughput_text"],
        "peaks_text": row["peaks_text"],
        "headroom_text": row["headroom_text"],
        "util_text": row["util_text"],
        "idle_text": row["idle_text"],
        "steps_text": row["steps_text"],
        "command": clean.clean(command_text(data.settings.command) or (data.trials[0].command or "")),
    }


# -------------------------------------------------------------------------------------------- commands


def _command_block(
    data: StudyData, winner_trial: TrialData | None, clean: Sanitizer
) -> tuple[str | None, str | None]:
    """(the command that runs the winner, where it comes from)."""
    if data.best_command:
        return compact_shell(clean.clean(data.best_command)), f"{StudyDir.BEST}/{StudyDir.BEST_COMMAND}"
    if winner_trial is not None and winner_trial.command:
        source = f"{StudyDir.TRIALS}/{winner_trial.number}/{TrialDir.COMMAND}"
        return compact_shell(
            clean.clean(winner_trial.command)
        ), f"{source} (the trial itself: set max steps for a full run)"
    return None, None


# -------------------------------------------------------------------------------------------- findings


def _group_findings(findings: Sequence[Finding], clean: Sanitizer) -> list[dict[str, Any]]:
    groups: dict[str, dict[str, Any]] = {}
    for f in findings:
        item = {
            "rule": f.rule,
            "severity": f.severity.value,
            "title": f.title,
            "text": clean.clean(f.text),
            "trial": f.trial,
        }
        if f.rule not in groups:
            groups[f.rule] = {**item, "also": []}
        else:
            groups[f.rule]["also"].append(item)
    return list(groups.values())


# ---------------------------------------------------------------------------------------------- charts


@dataclass
class _Figures:
    """The charts of one render: inline SVG for the HTML, and the markdown's PNGs when asked for.

    Each chart is one drawing function (``reports.charts``) saved twice: as SVG inside the HTML, as a
    PNG file beside the markdown.

    Attributes:
        svgs: chart id → ``<svg>`` element, in the order the HTML shows them.
        written: the PNG files drawn into ``charts/``, in the order they were drawn.
    """

    out_dir: Path
    png: bool
    svgs: dict[str, str] = field(default_factory=dict)
    written: list[Path] = field(default_factory=list)

    def add(self, chart_id: str, draw: Callable[[Path], Path]) -> str:
        """Draw the chart as SVG for the HTML under ``chart_id`` and return the id."""
        self.svgs[chart_id] = charts.inline_svg(draw)
        return chart_id

    def draw(self, name: str, draw_png: Callable[[Path], Path]) -> str | None:
        """Draw the PNG ``charts/<name>`` when PNGs are asked for; its link from the report, else None."""
        if not self.png:
            return None
        # never written through a link planted as charts/ (a user's folder): refused, one line
        charts_dir = StudyDir(self.out_dir).own_dir(self.out_dir / StudyDir.CHARTS)
        path = draw_png(charts_dir / name)
        self.written.append(path)
        return rel_link(path, self.out_dir)


def _throughput_chart(data: StudyData, rows: list[dict[str, Any]], figures: _Figures) -> dict[str, Any]:
    """Throughput per trial (a study with trials only)."""
    if data.kind != "study" or not rows:
        return {"throughput_chart": None, "throughput_png": None}
    return {
        "throughput_chart": figures.add("chart-throughput", partial(charts.throughput_chart, rows)),
        "throughput_png": figures.draw("throughput.png", partial(charts.throughput_chart, rows)),
    }


def _timeline_charts(
    data: StudyData,
    winner: Recommendation | None,
    signals: Mapping[int, TrialSignals],
    figures: _Figures,
) -> dict[str, Any]:
    """One timeline per trial that recorded one, baseline and winner first and side by side.

    Returns ``pair`` (baseline and winner), ``timelines`` (the others) and ``omitted`` (the trials past
    :data:`MAX_TIMELINES`).
    """
    timelines: list[dict[str, Any]] = []
    omitted: list[int] = []
    for t in _timeline_order(data, winner):
        series = charts.timeline_series(data, t)
        if series.empty:
            continue
        if len(timelines) >= MAX_TIMELINES:
            omitted.append(t.number)
            continue
        label = (
            "baseline" if t.result.is_baseline else ("winner" if winner and t.number == winner.trial else "")
        )
        tp = t.result.throughput
        title = (
            f"Trial {t.number}"
            + (f" ({label})" if label else "")
            + f" · {t.status.value}"
            + (f" · {tp:.3g}/s" if tp else "")
        )
        if data.kind == "profile":
            title = f"Run · {t.status.value}" + (f" · {tp:.3g} completions/s" if tp else "")
        item = {
            "trial": t.number,
            "title": title,
            "label": label,
            "chart": figures.add(f"chart-timeline-{t.number}", partial(charts.timeline_chart, series, title)),
            "png": figures.draw(
                f"timeline-trial-{t.number}.png",
                partial(charts.timeline_chart, series, title),
            ),
            "phase_source": signals[t.number].phase_source,
        }
        timelines.append(item)
    pair = [x for x in timelines if x["label"] in ("baseline", "winner")]
    pair = sorted(pair, key=lambda x: 0 if x["label"] == "baseline" else 1)
    rest = [x for x in timelines if x not in pair]
    return {"pair": pair, "timelines": rest, "omitted": omitted}


def _timeline_order(data: StudyData, winner: Recommendation | None) -> list[TrialData]:
    """The baseline, the winner, then every other trial by number."""
    order: list[TrialData] = []
    for n in (
        winner.baseline_trial if winner else (data.baseline.number if data.baseline else None),
        winner.trial if winner else None,
    ):
        t = data.trial(n)
        if t is not None and t not in order:
            order.append(t)
    return order + [t for t in data.trials if t not in order]


def _insight(
    data: StudyData, signals: Mapping[int, TrialSignals], clean: Sanitizer, figures: _Figures
) -> dict[str, Any] | None:
    """What the search learned (a study only): knob importance, throughput against memory, progress."""
    if data.kind != "study":
        return None
    imp = param_importances(data.results)
    points = pareto_points(data.results)
    progress = best_so_far(data.results)
    failed = []
    for t in data.trials:
        if t.status in (TrialStatus.OOM, TrialStatus.VLLM_INIT):
            peaks = [p for p in signals[t.number].peak_bytes if p is not None]
            if peaks:
                failed.append((t.number, t.status.value, max(peaks) / GIB))
    caps = [data.capacity_bytes(i) for i in range(data.gpu_count)]
    cap_gib = min(c for c in caps if c is not None) / GIB if any(c is not None for c in caps) else None
    mem_label = "peak memory on the fullest GPU (GiB)" if not runs_on_cpu(data) else "peak RSS (GiB)"
    draw_progress = partial(charts.progress_chart, progress, hours_label=hours_label(data))
    insight = {
        "importance": [(clean.clean(k), v) for k, v in imp.values.items()],
        # optuna-dashboard's fANOVA beside it, in the same knob order, where the two methods disagree
        "fanova": [imp.fanova.get(k, 0.0) for k in imp.values] if imp.fanova else [],
        "importance_note": clean.clean(imp.note),
        "importance_method": imp.method,
        "importance_chart": figures.add("chart-importance", partial(charts.importance_chart, imp))
        if imp.values
        else None,
        "pareto_chart": figures.add(
            "chart-pareto", partial(charts.pareto_chart, points, failed, cap_gib, mem_label)
        )
        if points
        else None,
        "front": [p.trial for p in points if p.on_front],
        "progress_chart": figures.add("chart-progress", draw_progress) if progress else None,
        "importance_png": None,
        "pareto_png": None,
        "progress_png": None,
    }
    if imp.values:
        insight["importance_png"] = figures.draw("importance.png", partial(charts.importance_chart, imp))
    if points:
        insight["pareto_png"] = figures.draw(
            "pareto.png", partial(charts.pareto_chart, points, failed, cap_gib, mem_label)
        )
    if progress:
        insight["progress_png"] = figures.draw("progress.png", draw_progress)
    return insight


def _env() -> Any:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html", "html.j2"), default_for_string=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def _write(data: StudyData, out_dir: Path, *, png: bool) -> ReportPaths:
    ensure_writable(out_dir, flag="--out")  # one line (exit 2) for a report path that cannot be written
    view, findings, written = _view(data, out_dir, png=png)
    env = _env()
    env.filters["md"] = md_cell
    env.filters["mdtext"] = md_text
    env.filters["mdcode"] = md_code
    html_path = out_dir / StudyDir.REPORT_HTML
    md_path = out_dir / StudyDir.REPORT_MD
    html_text = env.get_template("report.html.j2").render(r=view)
    md_text_out = env.get_template("report.md.j2").render(r=view)
    write_text_atomic(html_path, html_text)
    write_text_atomic(md_path, md_text_out)
    winner = view["winner"]
    return ReportPaths(
        html=html_path,
        markdown=md_path,
        charts=tuple(written),
        findings=tuple(findings),
        recommended_trial=winner["trial"] if winner else None,
        no_recommendation=view["no_winner"],
        running=view["running"],
    )


def render_study(
    study_dir: Path | str, *, out_dir: Path | str | None = None, png: bool = True
) -> ReportPaths:
    """Render ``report.html``, ``report.md`` and ``charts/`` for a study directory.

    Args:
        study_dir: ``runs/<study>`` as written by ``autotune search``.
        out_dir: where to write (default: the study directory itself).
        png: also draw the markdown's PNG charts (the HTML charts are always embedded).

    Raises:
        UsageError: ``study_dir`` is not a study directory.
    """
    data = load_study(Path(study_dir))
    return _write(data, Path(out_dir) if out_dir is not None else Path(study_dir), png=png)


def render_profile(out_dir: Path | str, *, png: bool = True) -> ReportPaths:
    """Render the report of an ``autotune profile`` run directory (same charts and diagnosis, no search).

    Raises:
        UsageError: ``out_dir`` is not a profile directory.
    """
    data = load_profile(Path(out_dir))
    return _write(data, Path(out_dir), png=png)
