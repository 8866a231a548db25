"""Issue 41, defect 6: ``--fixed`` imports the user's job as the job sees it, or refuses in one line.

A pipe, a redirection or a ``$VARIABLE`` in a job line is handled by the shell before the job sees its
arguments: imported as values they reached every trial and the export. A file given as a pipe
(``<(cat job.sh)``) has no second reading. A verl key dotted and nested with two values is a conflict.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from autotune.backends import backend_class
from autotune.errors import UsageError

SHELL_LINES = {
    "tee": ("swift rlhf --rlhf_type grpo --temperature 0.9 2>&1 | tee train.log\n", "a redirection (>)"),
    "pipe": ("swift rlhf --temperature 0.9 | tee train.log\n", "a pipe (|)"),
    "variable": ('swift rlhf --dataset "$DATA" --beta 0.04\n', "a shell expansion ($)"),
    "braces": ("swift rlhf --dataset ${DATA}\n", "a shell expansion ($)"),
    "substitution": ("swift rlhf --dataset $(cat name)\n", "a shell expansion ($)"),
    "backticks": ("swift rlhf --dataset `cat name`\n", "a command substitution (`)"),
    "and": ("cd /work && swift rlhf --beta 0.04\n", "a background job or && (&)"),
    "second": ("swift rlhf --beta 0.04; echo done\n", "a second command (;)"),
}


@pytest.mark.parametrize("case", list(SHELL_LINES))
def test_a_line_the_shell_would_change_is_refused_in_one_line(tmp_path: Path, case: str) -> None:
    text, what = SHELL_LINES[case]
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/bash\n# my job: it | pipes $nothing in this comment\n" + text)
    with pytest.raises(UsageError) as err:
        backend_class("swift").read_job_file(job)
    line = err.value.one_line()
    assert "\n" not in line and what in line and "line 3" in line


def test_quoted_and_escaped_characters_are_values(tmp_path: Path) -> None:
    job = tmp_path / "job.sh"
    job.write_text(
        "swift rlhf --sep '|' --pattern 'a$b;c' --name \"x|y&z\" --dataset 'AI-MO/N#10' --z a\\|b  # a|b\n"
    )
    args, _ = backend_class("swift").read_job_file(job)
    assert args == {"sep": "|", "pattern": "a$b;c", "name": "x|y&z", "dataset": "AI-MO/N#10", "z": "a|b"}


def test_a_job_given_as_a_pipe_is_read_once_and_whole(tmp_path: Path) -> None:
    """``--fixed <(cat job.sh)``: the file is a pipe; read twice, the second read was empty."""
    job = "swift rlhf --rlhf_type grpo --num_generations 8 --beta 0.04\n"
    read, write = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(write, job.encode()), os.close(write)), daemon=True)
    writer.start()
    try:
        args, _ = backend_class("swift").read_job_file(f"/dev/fd/{read}")
    finally:
        os.close(read)
        writer.join(5)
    assert args == {"rlhf_type": "grpo", "num_generations": "8", "beta": "0.04"}


def test_a_fifo_with_no_writer_is_never_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "job.fifo"
    os.mkfifo(fifo)
    box: list[object] = []
    thread = threading.Thread(
        target=lambda: box.append(backend_class("swift").read_job_file(fifo)), daemon=True
    )
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "--fixed FIFO blocked"
    assert box == [({}, [])]  # no writer: an empty job


def test_a_verl_key_dotted_and_nested_with_two_values_is_a_conflict(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("actor_rollout_ref.rollout.n: 4\nactor_rollout_ref:\n  rollout:\n    n: 8\n")
    verl = backend_class("verl")
    with pytest.raises(UsageError, match=r"actor_rollout_ref.rollout.n is given twice.*4.*8"):
        verl.canonical_args(verl.read_job_file(job)[0])
    same = tmp_path / "same.yaml"
    same.write_text("actor_rollout_ref.rollout.n: 4\nactor_rollout_ref:\n  rollout:\n    n: 4\n")
    assert verl.canonical_args(verl.read_job_file(same)[0]) == {"actor_rollout_ref.rollout.n": 4}


def test_the_cli_reads_a_process_substitution(tmp_path: Path) -> None:
    """The same through bash's own ``<(...)``, as a user types it (the words only, no study)."""
    job = tmp_path / "job.sh"
    job.write_text("swift rlhf --beta 0.04\n")
    code = (
        "import sys; from autotune.backends import backend_class; "
        "print(backend_class('swift').read_job_file(sys.argv[1])[0])"
    )
    import sys

    done = subprocess.run(
        ["bash", "-c", '"$0" -c "$1" <(cat "$2")', sys.executable, code, str(job)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.strip() == "{'beta': '0.04'}", done.stderr
