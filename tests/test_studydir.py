"""The study directory's writers: atomic, never through a planted link, one-line errors on failure."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from autotune.errors import WriteError
from autotune.records import TrialResult, TrialStatus
from autotune.studydir import StudyDir, create_file, write_json_atomic, write_text_atomic


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    outside = tmp_path / "outside.txt"
    outside.write_text("the user's file")
    return outside


def test_atomic_writes_replace_a_planted_link_and_leave_its_target_alone(
    tmp_path: Path, victim: Path
) -> None:
    study = tmp_path / "study"
    study.mkdir()
    for name in ("study.json", "command.sh"):
        (study / name).symlink_to(victim)
    write_json_atomic(study / "study.json", {"a": 1})
    write_text_atomic(study / "command.sh", "#!/bin/sh\n", mode=0o755)
    assert victim.read_text() == "the user's file"
    assert (
        not (study / "study.json").is_symlink() and (study / "study.json").read_text() == '{\n  "a": 1\n}\n'
    )
    assert os.stat(study / "command.sh").st_mode & 0o777 == 0o755
    assert sorted(p.name for p in study.iterdir()) == ["command.sh", "study.json"]  # no temporary left


def test_streamed_files_are_created_fresh_never_through_a_link(tmp_path: Path, victim: Path) -> None:
    log = tmp_path / "stdout.log"
    log.symlink_to(victim)
    with create_file(log) as fh:
        fh.write(b"trial output\n")
    assert victim.read_text() == "the user's file" and log.read_bytes() == b"trial output\n"


def test_a_linked_trial_directory_is_refused_and_nothing_is_written_through_it(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    sd = StudyDir(tmp_path / "study")
    sd.trials_dir.mkdir(parents=True)
    sd.trial_dir(3).symlink_to(outside, target_is_directory=True)
    result = TrialResult(number=3, params={}, status=TrialStatus.RUNNING, reason="running")
    with pytest.raises(
        WriteError, match=r"trials/3: a symbolic link where the study keeps its own directory"
    ):
        sd.write_result(result)
    with pytest.raises(WriteError, match="symbolic link"):
        sd.own_dir(sd.trial_dir(3))
    assert list(outside.iterdir()) == []
    assert sd.own_dir(sd.trial_dir(4)).is_dir()  # an ordinary one is created


def test_a_failed_write_names_the_file_and_the_cause_and_leaves_no_partial_file(tmp_path: Path) -> None:
    target = tmp_path / "ro" / "result.json"
    target.parent.mkdir()
    if os.geteuid() == 0:  # root ignores permissions: a read-only tmpfs refuses for real
        if subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k,ro", "tmpfs", str(target.parent)]
        ).returncode:
            pytest.skip("cannot mount a tmpfs here")
    else:
        target.parent.chmod(0o555)
    try:
        with pytest.raises(WriteError) as err:
            write_json_atomic(target, {"x": 1})
        assert str(target) in err.value.one_line() and "\n" not in err.value.one_line()
        assert "(EROFS)" in err.value.one_line() or "(EACCES)" in err.value.one_line()
        assert err.value.exit_code == 74
        assert list(target.parent.iterdir()) == []
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(target.parent)], check=False)
        else:
            target.parent.chmod(0o755)


def test_a_fifo_planted_as_a_streamed_file_is_replaced_never_waited_on(tmp_path: Path) -> None:
    """Issue 41: opening a FIFO for writing waits for a reader forever (a resume hung on stdout.log)."""
    import threading

    log = tmp_path / "stdout.log"
    os.mkfifo(log)
    done: list[bool] = []

    def write() -> None:
        with create_file(log) as fh:
            fh.write(b"trial output\n")
        done.append(True)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    thread.join(30)
    assert done == [True] and log.read_bytes() == b"trial output\n"
