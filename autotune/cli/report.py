"""``autotune report DIR``: re-render ``report.html`` and ``report.md`` from what is on disk."""

from __future__ import annotations

from pathlib import Path

import typer

from autotune.cli import _options as o


def register(app: typer.Typer) -> None:
    """Add the ``report`` command to the app."""

    @app.command("report", cls=o.PanelledCommand)
    def report(
        directory: Path = typer.Argument(
            ..., help="A study directory (runs/<study>) or an autotune profile directory."
        ),
        storage: o.StorageToRead = None,
        study_name: o.StudyNameToRead = None,
        out: Path | None = typer.Option(None, "--out", help="Write the reports here instead of into DIR."),
        no_png: bool = typer.Option(False, "--no-png", help="Skip the markdown's PNG charts (faster)."),
        as_json: bool = typer.Option(
            False, "--json", help="Print the written paths and the recommendation as JSON."
        ),
    ) -> None:
        """Render report.html (self-contained, interactive) and report.md (+ charts/*.png) from DIR.

        Works while a search is still running: the report shows the trials finished so far and says
        "running: 5 of 12 trials" (exit 0). Exits 3 (after writing the reports) when DIR is a study that
        ended with nothing to recommend."""
        import json

        from autotune.app.pull import pull_if_asked
        from autotune.cli._console import notice, say
        from autotune.errors import EXIT_NOTHING_TO_RECOMMEND, UsageError
        from autotune.reports import is_profile_dir, is_study_dir, render_profile, render_study

        pull_if_asked(directory, storage, study_name)
        if not directory.is_dir():
            raise UsageError(
                f"{directory} is not a directory",
                hint="Pass the runs/<study> directory that autotune search wrote",
            )
        if is_study_dir(directory):
            paths = render_study(directory, out_dir=out, png=not no_png)
        elif is_profile_dir(directory):
            if out is not None:
                raise UsageError(
                    "--out applies to study directories only",
                    hint="Drop --out; a profile report is written into its own directory",
                )
            paths = render_profile(directory, png=not no_png)
        else:
            raise UsageError(
                f"{directory} is not a study directory (no study.json or trials/) nor a profile directory (no profile.json)",
                hint="Pass the runs/<study> directory that autotune search wrote",
            )
        if as_json:
            data = {
                "html": str(paths.html),
                "markdown": str(paths.markdown),
                "kind": "study" if is_study_dir(directory) else "profile",
                "recommended_trial": paths.recommended_trial,
                "no_recommendation": paths.no_recommendation,
                "running": paths.running,
            }
            say(json.dumps(data, indent=2))
        else:
            say(str(paths.html))
            say(str(paths.markdown))
        if paths.running is not None:
            notice(paths.running)
        if paths.no_recommendation is not None:
            notice(paths.no_recommendation)
            raise typer.Exit(EXIT_NOTHING_TO_RECOMMEND)
