"""``autotune export DIR``: the winner of a study in a framework's own format."""

from __future__ import annotations

from pathlib import Path

import typer

from autotune.cli import _options as o
from autotune.export import EXPORT_FORMATS


def register(app: typer.Typer) -> None:
    """Add the ``export`` command to the app."""

    @app.command("export", cls=o.PanelledCommand)
    def export(
        directory: Path = typer.Argument(
            ..., help="A study directory (runs/<study>) written by autotune search."
        ),
        storage: o.StorageToRead = None,
        study_name: o.StudyNameToRead = None,
        fmt: str | None = typer.Option(
            None,
            "--format",
            "-f",
            help=f"{', '.join(EXPORT_FORMATS)}. Default: the study's own backend.",
        ),
        trial: int | None = typer.Option(
            None, "--trial", help="Export this COMPLETE trial instead of the recommendation."
        ),
        out: Path | None = typer.Option(
            None,
            "--out",
            "-o",
            help="Write the files here (a directory for multi-file formats) instead of printing the main file.",
        ),
        secret_arg: o.SecretArg = None,
        as_json: bool = typer.Option(
            False,
            "--json",
            help="Print JSON: the format, the trial, the files (their text, or where --out wrote them) and notes.",
        ),
    ) -> None:
        """Write the recommended configuration as a runnable script or config file.

        Exits 3 when the study has nothing to recommend (and no --trial is given)."""
        import json

        from autotune.app.export import default_format, export_winner, load_study_winner
        from autotune.cli._console import notice, say
        from autotune.errors import UsageError
        from autotune.export import EXPORT_FORMATS, write_export

        if fmt is not None and fmt not in EXPORT_FORMATS:
            raise UsageError(
                f"unknown export format {fmt!r}",
                hint=f"Use --format with one of: {', '.join(EXPORT_FORMATS)}",
            )
        from autotune.app.pull import pull_if_asked

        pull_if_asked(directory, storage, study_name)
        if not directory.is_dir():
            raise UsageError(
                f"{directory} is not a directory",
                hint="Pass the runs/<study> directory autotune search wrote",
            )
        winner = load_study_winner(directory, trial=trial, secret_names=tuple(secret_arg or ()))
        result = export_winner(winner, fmt or default_format(winner.backend))
        if as_json:
            written = [str(p) for p in write_export(result, out)] if out is not None else None
            data = {
                "format": result.format,
                "trial": winner.result.number,
                "recommended": winner.recommended,
                "main": result.main,
                "files": dict(result.files) if out is None else None,
                "written": written,
                "notes": list(result.notes),
            }
            say(json.dumps(data, indent=2))
            return
        for note in result.notes:
            notice(note)
        if out is None:
            say(result.files[result.main].rstrip("\n"))
            if result.others:
                notice(f"--out DIR would also write: {', '.join(result.others)}")
            return
        for path in write_export(result, out):
            say(str(path))
