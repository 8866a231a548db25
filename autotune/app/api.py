"""autotune from Python: what ``import autotune`` offers (``autotune.load_study``, ``autotune.search``,
``autotune.plan``).

The same jobs as the CLI, with the same options: :func:`search` takes every option of ``autotune search``
(the fields of :class:`~autotune.app.search.SearchRequest`, which the CLI builds from its flags) and
:func:`plan` every option of ``autotune plan`` (:class:`~autotune.app.plan.PlanRequest`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from autotune.app.plan import PlanRequest, plan_job
from autotune.app.search import SearchRequest, SearchSummary, search_study
from autotune.errors import UsageError
from autotune.reports.frames import StudyFrames, load_frames

__all__ = ["load_study", "search", "plan", "StudyFrames", "SearchSummary"]


def load_study(path: Path | str) -> StudyFrames:
    """A study directory as DataFrames: ``.trials`` (the report's table: status, metrics and knobs),
    ``.timelines``, ``.phases``; ``.recommendation`` and ``.settings`` (``study.json``).

    Raises:
        UsageError: ``path`` is not a study directory.
    """
    return load_frames(path)


def search(
    command: Sequence[str] = (), *, console: Console | None = None, **options: object
) -> SearchSummary:
    """Run ``autotune search`` from Python and return how it ended.

    Args:
        command: what ``autotune search`` takes after ``--`` (the command template of the command backend,
            or extra framework arguments).
        console: where notices and the summary go (default: stderr).
        **options: the options of ``autotune search``, named as :class:`SearchRequest`'s fields
            (``model``, ``backend``, ``trials``, ``out``, ``pins=["name=value"]``, ``time_budget="30m"``, ...).

    Returns:
        :class:`SearchSummary`: ``.outcome`` (every trial's result, the recommendation), ``.exit_code``,
        ``.to_dict()``; ``load_study(summary.out)`` reads the study as DataFrames.

    Raises:
        UsageError: an unknown option or bad input (before anything ran).
    """
    req = replace(
        SearchRequest(**_options(SearchRequest, options, "search")),
        command=tuple(command),
    )
    if req.command_line is None:
        shown = ", ".join(f"{k}={v!r}" for k, v in options.items())
        req = replace(req, command_line=f"autotune.search({shown})")
    return search_study(req, console or Console(stderr=True, highlight=False, soft_wrap=True), None)


def plan(model: str, **options: object) -> Any:
    """Run ``autotune plan`` from Python: every candidate of the space judged by the estimates.

    Args:
        model: as ``--model``.
        **options: the options of ``autotune plan``, named as :class:`PlanRequest`'s fields (``gpus``,
            ``gpu_type``, ``backend``, ``knobs=["zero_stage=2,3"]``, ``pins=["use_vllm=true"]``, ...).

    Returns:
        the plan (:class:`autotune.estimate.plan.PlanResult`): ``.candidates``, ``.to_dict()``; its
        ``notes`` include what the CLI prints as notes.
    """
    req = PlanRequest(model=model, **_options(PlanRequest, options, "plan"))
    result, notes = plan_job(req)
    return replace(result, notes=(*notes, *result.notes))


def _options(cls: Any, options: dict[str, Any], what: str) -> dict[str, Any]:
    """``options`` checked against the request's fields (a list of pins, knobs, trackers or secret names
    becomes a tuple)."""
    known = {f.name for f in fields(cls)} - {"command", "model" if what == "plan" else ""}
    unknown = sorted(set(options) - known)
    if unknown:
        raise UsageError(
            f"autotune.{what}() has no option {unknown[0]!r}", hint=f"Options: {', '.join(sorted(known))}"
        )
    out = dict(options)
    for key in ("pins", "knobs", "report_to", "secret_args"):
        if key in out:
            out[key] = (out[key],) if isinstance(out[key], str) else tuple(out[key])
    return out
