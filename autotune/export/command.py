"""``--format command``: the winning trial's own command, for studies of the command backend.

The command backend runs the user's command with the knobs substituted; autotune cannot tell its
trial-only parts from the user's job, so the export is the trial's launch plan as a script: its working
directory, the environment autotune set (secret-named variables and values left out) and its argv.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from autotune.errors import UsageError
from autotune.export._common import (
    Export,
    drop_secrets,
    flag_lines,
    is_secret_name,
    looks_secret,
    shell_script,
)
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
    env, env_notes = drop_secrets(plan.env)
    notes = [n.replace("--", "$", 1) for n in env_notes]
    lines: list[list[str]] = []
    for line in flag_lines(plan.argv, lead=1):
        flag = line[0].split("=", 1)[0]
        if flag.startswith("-") and (is_secret_name(flag) or looks_secret(line)):
            notes.append(f"{flag} left out: it holds a secret; add it by hand")
            continue
        lines.append(line)
    comments = header(w, "command")
    comments.append("The trial's own command; arguments given to this script are passed on.")
    comments += notes
    cwd = Path(plan.cwd)
    if cwd.name == str(w.number) and cwd.parent.name == "trials":
        cwd = w.trial_dir  # the study may have moved since the trial ran
    setup = [f"unset {name}" for name in plan.unset_env if _ENV_NAME.match(name)]
    setup.append(f"cd {shlex.quote(str(cwd))}")
    script = shell_script(comments, lines, env=env, setup=setup)
    return Export(
        format="command",
        files={SCRIPT: script},
        main=SCRIPT,
        trial=w.number,
        executable=frozenset({SCRIPT}),
        notes=tuple(notes),
    )
