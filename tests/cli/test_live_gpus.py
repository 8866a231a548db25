"""The running trials' GPU rows in the live view: under a pseudo-terminal the rows appear under the
trials table and are redrawn in place as the samples change; without a terminal, one line per running
trial every few seconds. A child process drives the real view with samplers on a fake NVML."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

CHILD = str(Path(__file__).with_name("live_gpus_child.py"))
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _env() -> dict[str, str]:
    env = dict(os.environ, COLUMNS="160", LINES="50", TERM="xterm-256color")
    env.pop("NO_COLOR", None)
    env.pop("TERM_PROGRAM", None)
    return env


def _read_until(fd: int, seen: list[str], pattern: str, timeout_s: float = 30.0) -> bool:
    """Read the terminal until the text (escape codes removed) read so far matches ``pattern``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if re.search(pattern, ANSI.sub("", "".join(seen))):
            return True
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                seen.append(os.read(fd, 65536).decode(errors="replace"))
            except OSError:  # the child closed the terminal
                break
    return bool(re.search(pattern, ANSI.sub("", "".join(seen))))


def test_gpu_rows_appear_under_the_trials_and_update_in_place(tmp_path: Path) -> None:
    switch, done = tmp_path / "switch", tmp_path / "done"
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, CHILD, str(switch), str(done)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=_env(),
        close_fds=True,
    )
    os.close(slave)
    seen: list[str] = []
    try:
        row = r"trial 1\s*│\s*{gpu}\s*│\s*{util} %\s*│\s*2\.0 / 80\.0 GiB\s*│\s*{power} / 700 W\s*│\s*{phase}"
        assert _read_until(master, seen, row.format(gpu=0, util=10, power=100, phase="starting")), seen[-3:]
        assert _read_until(master, seen, row.format(gpu=1, util=10, power=120, phase="starting")), seen[-3:]
        assert "trials + 4 re-measurement runs" in ANSI.sub("", "".join(seen))
        first = len("".join(seen))
        switch.touch()
        assert _read_until(master, seen, row.format(gpu=0, util=90, power=100, phase=r"rollout, step 1"))
        later = "".join(seen)[first:]
        # redrawn in place: the cursor moves back up over the previous frame instead of scrolling on
        assert re.search(r"\x1b\[\d*A", later), later[-500:]
    finally:
        done.touch()
        proc.wait(timeout=30)
        os.close(master)
    assert proc.returncode == 0, ANSI.sub("", "".join(seen))[-2000:]


def test_without_a_terminal_each_running_trial_gets_a_line_every_few_seconds(tmp_path: Path) -> None:
    switch, done = tmp_path / "switch", tmp_path / "done"
    proc = subprocess.Popen(
        [sys.executable, CHILD, str(switch), str(done)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=_env(),
        text=True,
    )
    lines: list[str] = []
    assert proc.stdout is not None
    # each GPU's figures arrive at their own pace (the power limit on a slow read): a line shows what
    # has been measured so far, and the later lines every figure
    before = (
        "trial 1 (starting): GPU 0 10 % 2.0 / 80.0 GiB 100 / 700 W; GPU 1 10 % 2.0 / 80.0 GiB 120 / 700 W"
    )
    after = "trial 1 (rollout, step 1): GPU 0 90 % 2.0 / 80.0 GiB 100 / 700 W; GPU 1 90 % 2.0 / 80.0 GiB 120 / 700 W"
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if before in lines and not switch.exists():
                switch.touch()
            if after in lines:
                break
    finally:
        done.touch()
        proc.wait(timeout=30)
    gpu_lines = [x for x in lines if x.startswith("trial 1 (")]
    assert before in gpu_lines and after in gpu_lines, gpu_lines
    assert gpu_lines.index(before) < gpu_lines.index(after)
    assert all(
        re.fullmatch(r"trial 1 \((starting|rollout, step 1)\): GPU 0 .*; GPU 1 .*", x) for x in gpu_lines
    )
    assert not any("\x1b[" in x for x in lines)  # no escape codes in a log
    assert "the ETA counts 4 re-measurement runs after the trials (--confirm-runs)" in lines
    assert any(x.startswith("trial 1: ") for x in lines)  # the trial's own line, as before
    assert proc.returncode == 0
