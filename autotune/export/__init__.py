"""Export a study's winner in each framework's own format (``autotune export``).

``export_study(study_dir, fmt)`` reads the study, picks the recommended trial (or ``trial=N``, which must
be COMPLETE) and returns an :class:`Export` (file name → content, and the main file);
``write_export(export, out)`` writes it without overwriting the user's own files. Formats:

Each framework's own format is written by its backend; the framework-neutral ones live here.

- ``swift``: a runnable ``swift rlhf --rlhf_type grpo`` script (:mod:`autotune.backends.swift.export`).
- ``trl``: ``grpo.yaml`` for ``trl grpo --config`` + accelerate / DeepSpeed configs (:mod:`autotune.backends.trl.export`).
- ``verl``: the hydra overrides of ``verl.trainer.main_ppo`` as a script (:mod:`autotune.backends.verl.export`).
- ``deepspeed``: the ``ds_config.json`` of the ZeRO stage and offload (:mod:`autotune.export.deepspeed`).
- ``json``: knobs, fixed arguments, measurements, versions (:mod:`autotune.export.jsonfmt`).
- ``command``: the winning trial's own command (:mod:`autotune.export.command`).

A winner whose knobs a format cannot express is refused with a one-line
:class:`~autotune.errors.UsageError` naming the knob.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from autotune.errors import UsageError
from autotune.export._common import EXPORT_FORMATS, MARKER, Export, write_export
from autotune.export._winner import Winner, load_winner

__all__ = [
    "EXPORT_FORMATS",
    "MARKER",
    "Export",
    "Winner",
    "default_format",
    "export_study",
    "export_winner",
    "load_winner",
    "write_export",
]


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
        UsageError: unknown format; not a study directory; no recommendation (no healthy trial); a trial
            that is not COMPLETE; a knob or argument the format cannot express.
    """
    exporter = _exporter(fmt)  # an unknown format fails before the study is read
    return exporter(load_winner(Path(study_dir), trial=trial))
