"""``--format command``: the winning trial's own command, for studies of the command backend.

The command backend runs the user's command with the knobs substituted; autotune cannot tell its
trial-only parts from the user's job, so the export is the trial's launch plan as a script: its working
directory, the environment autotune set and its argv; secrets are read from environment variables
(:func:`~autotune.export._common.shell_script`), never written.

Running the export never touches the study it came from: every path of the trial's directory in the
launch plan (its metrics and phases files, its output folder, the configuration files its command
reads) is moved beside the script (``$HERE``, the script's own directory, wherever it is copied). The
input files the command reads from the trial's directory (a trial's ``trial_config.json``, its generated
prompts, its DeepSpeed config) are copied into the export, with the trial directory's paths in them
made relative to the script's directory; a trial that ran in its own directory runs in the script's.
What the trial wrote (logs, metrics, results, checkpoints) is never copied.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from autotune.errors import UsageError
from autotune.export._common import MANIFEST, Export, ShellWord, flag_lines, shell_script
from autotune.export._job import header
from autotune.export._winner import Winner
from autotune.studydir import TrialDir, read_text_guarded, regular_file

__all__ = ["SCRIPT", "export_command"]

SCRIPT = "command.sh"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: a relative path that can stand inside double quotes after ``$HERE/`` as it is
_SAFE_REL = re.compile(r"^[A-Za-z0-9._+-][A-Za-z0-9._+/-]*$")
#: what a trial writes: never copied into an export (a later run of the export writes its own)
_WRITTEN = TrialDir.RECORDS
_COPY_LIMIT_BYTES = 16 * 2**20


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
    moved = _Relocation(w, plan.cwd)
    argv = [moved.word(item) for item in plan.argv]
    _, used = rule.script_words([a for a in argv if isinstance(a, str)])
    notes = [
        f"{name} is a secret: the script reads it from the environment; export it first" for name in used
    ]
    comments = header(w, "command")
    comments.append("The trial's own command; arguments given to this script are passed on.")
    comments.append("It writes its metrics and outputs beside this script, never into the study.")
    if moved.copies():
        comments.append(MANIFEST + " ".join(sorted(moved.copies())))
    comments += notes
    env = {k: v for k, v in plan.env.items() if not moved.inside(v)}
    setup = [f"unset {name}" for name in plan.unset_env if _ENV_NAME.match(name)]
    setup.append('HERE="$(cd "$(dirname "$0")" && pwd)"')
    setup += [
        f"export {k}={_text(moved.word(v))}"
        for k, v in plan.env.items()
        if moved.inside(v) and _ENV_NAME.match(k)
    ]
    setup.append('cd "$HERE"' if moved.ran_inside else f"cd {shlex.quote(plan.cwd)}")
    script = shell_script(comments, _lines(argv), env=env, setup=setup, secrets=rule)
    files = {**moved.copies(), SCRIPT: script}  # the script last: its copies are never newer than it
    notes += [
        f"{name} (copied from the trial) names files of the study's trial directory: edit it before running"
        for name in moved.unrelocated
    ]
    return Export(
        format="command",
        files=files,
        main=SCRIPT,
        trial=w.number,
        executable=frozenset({SCRIPT}),
        notes=tuple(notes),
    )


def _text(word: str | ShellWord) -> str:
    return word.text if isinstance(word, ShellWord) else shlex.quote(word)


def _lines(argv: list[str | ShellWord]) -> list[list[str | ShellWord]]:
    """The argv as script lines (:func:`flag_lines`), relocated words kept as they are."""
    texts = [a.text if isinstance(a, ShellWord) else a for a in argv]
    grouped = flag_lines(texts, lead=1)
    it = iter(argv)
    return [[next(it) for _ in line] for line in grouped]


class _Relocation:
    """The trial directory's paths moved beside the script (see the module docstring).

    A path recorded in the launch plan may name the trial directory where it was when the trial ran
    (the study may have moved since): both that and where it is now count as the trial's.
    """

    def __init__(self, w: Winner, cwd: str) -> None:
        self.trial_dir = w.trial_dir
        recorded = Path(cwd)
        roots = {str(w.trial_dir)}
        if recorded.name == str(w.number) and recorded.parent.name == "trials":
            roots.add(str(recorded))
        roots |= {str(Path(p).parent) for p in (w.launch.metrics_paths if w.launch else ())}
        self.roots = sorted((r for r in roots if Path(r).name == str(w.number)), key=len, reverse=True)
        self.ran_inside = any(cwd == r for r in self.roots)
        self._copies: dict[str, str] = {}
        # what the trial writes: its metrics files and the files autotune's variables name
        launch = w.launch
        outputs = (
            [*launch.metrics_paths, *(v for k, v in launch.env.items() if k.startswith("AUTOTUNE_"))]
            if launch
            else []
        )
        self._written = _WRITTEN | {rel for p in outputs if (rel := self._relative(p))}
        self.unrelocated: list[str] = []

    def _relative(self, text: str) -> str | None:
        for root in self.roots:
            if text == root:
                return ""
            if text.startswith(root + "/"):
                return text[len(root) + 1 :]
        return None

    def inside(self, text: str) -> bool:
        """Whether ``text`` is a path in the trial's directory."""
        rel = self._relative(text)
        return rel is not None and (rel == "" or bool(_SAFE_REL.match(rel)))

    def word(self, text: str) -> str | ShellWord:
        """``text`` as a script word: a trial path becomes ``"$HERE/…"`` (its input file copied)."""
        rel = self._relative(text)
        if rel is None or not (rel == "" or _SAFE_REL.match(rel)):
            return text
        self._copy(rel)
        return ShellWord(f'"$HERE/{rel}"' if rel else '"$HERE"')

    def _copy(self, rel: str, depth: int = 0) -> None:
        """Copy an input file of the trial's (and the trial files it names) into the export."""
        if (
            not rel
            or rel in self._copies
            or rel in self._written
            or rel.split("/")[0] in _WRITTEN
            or depth > 3
        ):
            return
        path = self.trial_dir / rel
        try:
            if not regular_file(path):
                return
            text = read_text_guarded(path, fix="", max_bytes=_COPY_LIMIT_BYTES)
        except UsageError:
            return  # a binary or unreadable file: the command reads it from the study, as the trial did
        named: list[str] = []
        for root in self.roots:
            found = [m.group(1) for m in re.finditer(re.escape(root) + r"/([A-Za-z0-9._+/-]+)", text)]
            named += found
            if found and not self.ran_inside:
                self.unrelocated.append(rel)  # the command runs elsewhere: relative paths would miss
            elif self.ran_inside:  # relative to the script's directory, where the command runs
                text = text.replace(root + "/", "./").replace(root, ".")
        self._copies[rel] = text
        for other in named:
            self._copy(other, depth + 1)

    def copies(self) -> dict[str, str]:
        """Relative name → content of every input file copied."""
        return dict(self._copies)
