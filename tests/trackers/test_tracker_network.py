"""Issue 41, defects 7 and 8: every call into a tracker is bounded and fails as one line.

``--report-to mlflow`` at a closed port retried for 255 s, then raised a traceback; a server that
accepts and never answers hung the study before its first trial. Both are real sockets here.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.errors import UsageError
from autotune.trackers import TRACKERS, StudyPlace, Trackers

pytest.importorskip("mlflow")

TIMEOUT_S = 3.0
BOUND_S = 60.0  # far below MLflow's own 255 s of retries


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SilentServer:
    """A server that accepts connections and never answers a byte (``accepted``: the connections)."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(16)
        self.port = int(self.socket.getsockname()[1])
        self.accepted: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        self.socket.settimeout(0.2)
        while not self.stop.is_set():
            try:
                self.accepted.append(self.socket.accept()[0])
            except OSError:
                continue

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for conn in self.accepted:
            conn.close()
        self.socket.close()


@pytest.fixture
def silent_server() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


def start_against(port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    trackers = Trackers(["mlflow"], TRACKERS, timeout_s=TIMEOUT_S)
    box: list[BaseException] = []

    def run() -> None:
        try:
            trackers.start(StudyPlace(name="demo", directory=tmp_path, knob_names=("a",)))
        except BaseException as exc:  # noqa: BLE001 - the test reads whatever came out
            box.append(exc)

    began = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BOUND_S)
    assert not thread.is_alive(), f"the tracker blocked for {time.monotonic() - began:.0f} s"
    assert box and isinstance(box[0], UsageError), box
    line = str(box[0])
    assert "\n" not in line and "--report-to mlflow" in line
    return line


def test_mlflow_at_a_closed_port_is_one_line_without_minutes_of_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = start_against(closed_port(), tmp_path, monkeypatch)
    assert "opening the study's run failed" in line


def test_mlflow_that_never_answers_does_not_hang_the_study(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, silent_server: SilentServer
) -> None:
    line = start_against(silent_server.port, tmp_path, monkeypatch)
    assert f"no answer within {TIMEOUT_S:g} s" in line


def test_two_studies_named_alike_never_share_nor_delete_tensorboard_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.trackers.test_trackers import _results

    shared = tmp_path / "tb"
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(shared))
    roots = []
    for parent in ("a", "b"):
        study = tmp_path / parent / "demo"
        study.mkdir(parents=True)
        trackers = Trackers(["tensorboard"], TRACKERS)
        trackers.start(StudyPlace(name="demo", directory=study, knob_names=("per_device_train_batch_size",)))
        for result in _results():
            trackers.log(result)
        trackers.finish()
        roots.append(sorted(p.relative_to(shared) for p in shared.rglob("events.out.tfevents.*")))
    first, both = set(roots[0]), set(roots[1])
    assert first and first <= both  # the second study removed none of the first's files
    assert len({p.parts[0] for p in both}) == 2  # one folder per study


def test_an_unusable_tensorboard_dir_is_one_line_before_any_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "tb"
    blocker.write_text("a file, not a folder")
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(blocker))
    trackers = Trackers(["tensorboard"], TRACKERS)
    with pytest.raises(UsageError, match="TENSORBOARD_LOGGING_DIR"):
        trackers.start(StudyPlace(name="demo", directory=tmp_path / "study"))


def test_sigterm_while_the_tuner_waits_on_a_silent_tracker_stops_it_resumable(
    tmp_path: Path, silent_server: SilentServer
) -> None:
    """Issue 41, defect 8: SIGTERM while ``--report-to mlflow`` waited on a server that never answers
    was ignored until the tracker's time ran out (60 s), then the study ended with exit 2 and the
    tracker's error, no "resume with:" line. The first signal now ends the wait."""
    import os
    import signal
    import subprocess
    import sys

    from tests.cli.conftest import autotune_exe

    space = tmp_path / "s.yaml"
    space.write_text("backend: command\nknobs:\n  bs: {type: int, choices: [1, 2], default: 1}\n")
    fault = str(Path(__file__).resolve().parents[1] / "fixtures" / "faults" / "fault.py")
    args = [
        autotune_exe(), "search", "--backend", "command", "--space", str(space), "--out", str(tmp_path / "study"),
        "--search", "grid", "--trials", "2", "--confirm-runs", "0", "--report-to", "mlflow",
        "--", sys.executable, fault, "--mode", "ok", "--steps", "3", "--step-s", "0.01",
    ]  # fmt: skip
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{silent_server.port}",
    }
    tuner = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + BOUND_S
        while not silent_server.accepted:  # the tuner is now waiting on the tracker's answer
            assert tuner.poll() is None, tuner.communicate()
            assert time.monotonic() < deadline, "the tuner never called the tracker"
            time.sleep(0.05)
        time.sleep(0.5)
        tuner.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        stdout, stderr = tuner.communicate(timeout=BOUND_S)
    finally:
        if tuner.poll() is None:
            tuner.kill()
    waited_s = time.monotonic() - signalled
    assert waited_s < 30, f"{waited_s:.0f} s after SIGTERM (the tracker's own timeout is 60 s)"
    assert tuner.returncode == 130, stdout + stderr
    assert "Traceback" not in stdout + stderr
    assert "resume with: autotune search" in stdout
    assert "no answer within" not in stdout + stderr
    assert not (tmp_path / "study" / "trials" / "0").exists()  # stopped before any trial
