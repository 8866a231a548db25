"""Reports of a study (or a profiled run): ``report.html``, ``report.md`` and ``charts/``.

Reads only what is on disk in the study directory: the records, the timelines and the recommendation the
study stored (:meth:`autotune.studydir.StudyDir.recommendation`). Never imports ``autotune.cli``.
"""

from __future__ import annotations

from autotune.reports._load import (
    StudyData,
    TrialData,
    is_profile_dir,
    is_study_dir,
    load_profile,
    load_study,
)
from autotune.reports._render import ReportPaths, render_profile, render_study
from autotune.reports.diagnosis import Finding, Severity, diagnose, make_context

__all__ = [
    "render_study",
    "render_profile",
    "ReportPaths",
    "load_study",
    "load_profile",
    "is_study_dir",
    "is_profile_dir",
    "StudyData",
    "TrialData",
    "Finding",
    "Severity",
    "diagnose",
    "make_context",
]
