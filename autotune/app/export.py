"""The ``autotune export`` job: the study's winner (or a trial the user names) in a format of choice.

A framework's own format is written by its backend (``autotune.backends.EXPORTERS``); the
framework-neutral ones (``deepspeed``, ``json``, ``command``) by :mod:`autotune.export`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from autotune.errors import UsageError
from autotune.export import EXPORT_FORMATS, BackendLookup, Export, Winner, load_winner

__all__ = ["default_format", "export_study", "export_winner", "load_study_winner"]


def load_study_winner(
    study_dir: Path, *, trial: int | None = None, secret_names: tuple[str, ...] = ()
) -> Winner:
    """The trial to export from ``study_dir`` (:func:`autotune.export.load_winner`), read with the
    backends' facts and formats: the exports sit a floor below the backends and are handed them here."""
    from autotune.backends import EXPORTERS, backend_class

    backends = BackendLookup(facts=backend_class, own_formats=frozenset(EXPORTERS))
    return load_winner(Path(study_dir), backends=backends, trial=trial, secret_names=secret_names)


def default_format(backend: str) -> str:
    """The format of a study's own backend (its framework's files), else ``command`` (the trial's own)."""
    from autotune.backends import EXPORTERS

    return backend if backend in EXPORTERS else "command"


def _exporter(fmt: str) -> Callable[[Winner], Export]:
    from autotune.backends import exporter

    framework = exporter(fmt)
    if framework is not None:
        return framework
    if fmt == "deepspeed":
        from autotune.export.deepspeed import export_deepspeed

        return export_deepspeed
    if fmt == "json":
        from autotune.export.jsonfmt import export_json

        return export_json
    if fmt == "command":
        from autotune.export.command import export_command

        return export_command
    raise UsageError(
        f"unknown export format {fmt!r}", hint=f"Use --format with one of: {', '.join(EXPORT_FORMATS)}"
    )


def export_winner(winner: Winner, fmt: str) -> Export:
    """Export an already loaded winner in ``fmt``.

    Raises:
        UsageError: an unknown format, or a knob / argument the format cannot express.
    """
    return _exporter(fmt)(winner)


def export_study(study_dir: Path, fmt: str, *, trial: int | None = None) -> Export:
    """The winner of the study in ``study_dir`` in format ``fmt``.

    Args:
        study_dir: a directory written by ``autotune search``.
        fmt: one of :data:`EXPORT_FORMATS`.
        trial: export this COMPLETE trial instead of the recommendation.

    Raises:
        UsageError: unknown format; not a study directory; a trial that is not COMPLETE; a knob or
            argument the format cannot express.
        NothingToRecommend: no recommendation (no healthy trial).
    """
    exporter = _exporter(fmt)  # an unknown format fails before the study is read
    return exporter(load_study_winner(Path(study_dir), trial=trial))
