"""``--format command``: the winning trial's own command, for studies of the command backend.

The command backend runs the user's command with the knobs substituted; autotune cannot tell its
trial-only parts from the user's job, so the export is the trial's launch plan as a script: its working
directory, the environment autotune set and its argv; secrets are read from environment variables
(:func:`~autotune.export._common.shell_script`), never written.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from autotune.errors import UsageError
from autotune.export._common import Export, flag_lines, shell_script
from autotune.export._job import header
from autotune.export._winner import Winner

__all__ = ["SCRIPT", "export_command"]

SCRIPT = "command.sh"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def export_command(w: Winner) -> Export:
    """``command.sh`` re-running the winning trial's command.

    Raises:
        UsageError: the trial has no ``launch.json`` (it never launched, or the file is gone).
    """
    plan = w.launch
    if plan is None or not plan.argv:
        raise UsageError(
            f"trial {w.number} has no launch.json in {w.trial_dir}",
            hint="Export with --format json, or restore the trial directory",
        )
    rule = w.secrets
    lines = flag_lines(plan.argv, lead=1)
    _, used = rule.script_words(plan.argv)
    notes = [
        f"{name} is a secret: the script reads it from the environment; export it first" for name in used
    ]
    comments = header(w, "command")
    comments.append("The trial's own command; arguments given to this script are passed on.")
    comments += notes
    cwd = Path(plan.cwd)
    if cwd.name == str(w.number) and cwd.parent.name == "trials":
        cwd = w.trial_dir  # the study may have moved since the trial ran
    setup = [f"unset {name}" for name in plan.unset_env if _ENV_NAME.match(name)]
    setup.append(f"cd {shlex.quote(str(cwd))}")
    script = shell_script(comments, lines, env=plan.env, setup=setup, secrets=rule)
    return Export(
        format="command",
        files={SCRIPT: script},
        main=SCRIPT,
        trial=w.number,
        executable=frozenset({SCRIPT}),
        notes=tuple(notes),
    )
