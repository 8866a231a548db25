"""Issue 41, defect 1: a study's name (its --out folder) never runs as code in a script autotune writes.

Every text autotune writes into a script or a config comment (a name, a path, a note) goes through one
rule, :func:`autotune.plaintext.comment_line` / :func:`~autotune.plaintext.shell_name`: written on one
line with its line breaks escaped, or refused. Each exported script is run here with bash: nothing in the
name may run (the command itself fails, nothing is installed here; the header comes before it).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from autotune.app.export import export_study
from autotune.errors import UsageError
from autotune.export import EXPORT_FORMATS, write_export
from autotune.plaintext import comment_line, shell_name
from autotune.records import LaunchPlan
from tests.export.conftest import FIXTURE

#: each plants a file named PWNED* in the directory the script runs in, were any of it executed
HOSTILE_NAMES = (
    "ev\ntouch PWNED1 #",
    "ev\rtouch PWNED2\n",
    "ev$(touch PWNED3)",
    "ev`touch PWNED4`",
    "ev\u2028touch PWNED5\x85x",
    "ev\n$(touch PWNED6)\n`touch PWNED7`;touch PWNED8",
)


def _study_named(tmp_path: Path, name: str) -> Path:
    """The recorded fixture copied into a folder called ``name``, its study.json without a name (a study's
    name is then its folder's, as with ``--out``)."""
    dest = tmp_path / "runs" / name
    shutil.copytree(FIXTURE, dest)
    settings = json.loads((dest / "study.json").read_text())
    settings.pop("name", None)
    (dest / "study.json").write_text(json.dumps(settings))
    return dest


#: what the exported scripts run: stand-ins that do nothing, so only the scripts' own text can act
FRAMEWORK_COMMANDS = ("swift", "trl", "python", "python3", "accelerate", "torchrun", "deepspeed", "ray")


def _stubs(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for command in FRAMEWORK_COMMANDS:
        (bin_dir / command).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / command).chmod(0o755)
    return bin_dir


def _run_every_script(files: list[Path], cwd: Path, bin_dir: Path) -> None:
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(cwd)}
    for path in files:
        if path.suffix in (".sh", ".yaml"):
            # a YAML file run by bash is not meant to work; only its comment lines must stay comments
            subprocess.run(
                ["bash", str(path)], cwd=cwd, env=env, capture_output=True, timeout=60, check=False
            )


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=range(len(HOSTILE_NAMES)))
def test_a_hostile_study_name_runs_nothing_in_any_export(tmp_path: Path, name: str) -> None:
    study = _study_named(tmp_path, name)
    work = tmp_path / "work"
    work.mkdir()
    for fmt in EXPORT_FORMATS:
        try:
            export = export_study(study, fmt)
        except UsageError:
            continue  # a format this study cannot express: nothing written
        _run_every_script(write_export(export, work / fmt), work, _stubs(tmp_path))
    assert sorted(p.name for p in work.rglob("PWNED*")) == []


def test_the_trials_own_script_quotes_or_refuses_what_it_names(tmp_path: Path) -> None:
    plan = LaunchPlan(argv=["python", "-c", "print(1)"], env={"A": "$(touch PWNED)"}, cwd="/tmp/x\ny")
    script = tmp_path / "command.sh"
    script.write_text(plan.to_shell())
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert "export A='$(touch PWNED)'" in script.read_text()
    with pytest.raises(UsageError, match="not an environment variable name"):
        LaunchPlan(argv=["true"], env={"A;touch PWNED": "1"}, cwd="/").to_shell()
    with pytest.raises(UsageError, match="not an environment variable name"):
        LaunchPlan(argv=["true"], env={}, cwd="/", unset_env=("X\ntouch PWNED",)).to_shell()


def test_the_rule_writes_one_line() -> None:
    for name in HOSTILE_NAMES:
        line = comment_line(name)
        assert len(line.splitlines()) == 1 and line.isprintable()
    assert comment_line("plain name") == "plain name"
    assert shell_name("HF_TOKEN") == "HF_TOKEN"


def test_an_export_target_that_is_a_fifo_is_refused_never_opened(tmp_path: Path) -> None:
    """Issue 41: ``export --out`` a FIFO: reading it for autotune's marker waited for a writer forever."""
    import os
    import threading

    study = _study_named(tmp_path, "demo")
    target = tmp_path / "train.sh"
    os.mkfifo(target)
    box: list[BaseException] = []

    def run() -> None:
        try:
            write_export(export_study(study, "swift"), target)
        except UsageError as exc:
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the export blocked on a FIFO"
    assert box and "was not written by autotune export" in str(box[0])
