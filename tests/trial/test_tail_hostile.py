"""Issue 41, defects 3 and 8: what a trial writes is read by one bounded, non-blocking reader
(:class:`autotune.tail.FileTail`), whatever the trial turns the file into.

A metrics file linked to /dev/zero or /dev/urandom grew the tuner to 23 GB; one turned into a FIFO
blocked it forever (the trial timeout never fired). Each case runs in a thread with a bound, so a
regression fails instead of hanging the suite.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from autotune.backends._phases import MarkerPhases
from autotune.backends.command import CommandParser
from autotune.backends.swift._log import SwiftLogParser
from autotune.backends.trl.backend import TrlMetricsParser
from autotune.backends.verl._log import VerlLogParser
from autotune.tail import FileTail

BOUND_S = 30.0


def bounded(call: Callable[[], Any]) -> Any:
    """``call()`` in a thread; fails when it has not returned within BOUND_S (it blocked)."""
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(call()), daemon=True)
    thread.start()
    thread.join(BOUND_S)
    assert not thread.is_alive(), "the reader blocked"
    return box[0]


def plant(path: Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(f"/dev/{kind}")


READERS: dict[str, Callable[[Path], Callable[[], Any]]] = {
    "command": lambda p: (lambda parser: lambda: parser.poll(0.0, 0.0))(CommandParser(p)),
    "trl": lambda p: (lambda parser: lambda: parser.poll(0.0, 0.0))(TrlMetricsParser(p)),
    "swift": lambda p: (lambda parser: lambda: parser.poll(0.0, 0.0))(SwiftLogParser(jsonl_path=p)),
    "verl": lambda p: (lambda parser: lambda: parser.poll(0.0, 0.0))(VerlLogParser(p)),
    "phases": lambda p: MarkerPhases(p).poll,
}


@pytest.mark.parametrize("kind", ["zero", "urandom", "fifo"])
@pytest.mark.parametrize("reader", list(READERS))
def test_a_metrics_file_made_endless_or_a_fifo_never_blocks_nor_fills_the_tuner(
    tmp_path: Path, kind: str, reader: str
) -> None:
    path = tmp_path / "metrics.jsonl"
    plant(path, kind)
    poll = READERS[reader](path)
    for _ in range(50):  # 50 polls of /dev/zero read nothing: it is not a regular file
        assert not bounded(poll)


def test_the_tail_refuses_special_files_once_and_says_why(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    plant(path, "zero")
    tail = FileTail(path)
    assert bounded(tail.lines) == [] and tail.refused is not None and "not a regular file" in tail.refused


def test_an_endless_line_is_dropped_in_bounded_steps(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    tail = FileTail(path, chunk_bytes=1 << 16, line_bytes=1 << 12)
    with path.open("wb") as fh:
        fh.write(b'{"step": 1}\n')
        fh.write(b"x" * (1 << 20))  # a MiB without a newline
        fh.write(b'\n{"step": 2}\n')
    got: list[bytes] = []
    for _ in range(40):
        got += tail.lines()
        assert tail.pending_bytes <= tail.line_bytes  # memory stays bounded between reads
    assert got == [b'{"step": 1}', b'{"step": 2}'] and tail.dropped_lines == 1


def test_a_regular_metrics_file_is_read_line_by_line(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    tail = FileTail(path)
    assert tail.lines() == []  # not there yet
    path.write_bytes(b"a\nb")
    assert tail.lines() == [b"a"]
    with path.open("ab") as fh:
        fh.write(b"c\n")
    assert tail.lines() == [b"bc"] and tail.rest() == b""


def test_the_stdout_pump_skips_overlong_lines_and_splits_on_both_separators() -> None:
    """The pump never keeps a line over the line bound (it is skipped to its end, counted); ``\\r`` and
    ``\\n`` both end a line, ``\\r\\n`` is one end (bench/pump_drain.py gives the drain rate)."""
    from autotune.tail import LINE_BYTES, OutputQueue, pump_pipe

    class Log:
        closed = False

        def write(self, data: bytes) -> int:
            return len(data)

        def close(self) -> None:
            self.closed = True

    read_fd, write_fd = os.pipe()
    segments = OutputQueue()
    pump = threading.Thread(target=pump_pipe, args=(read_fd, "stdout", Log(), segments, print), daemon=True)
    pump.start()
    payload = b"a\rb\r\nc\n" + b"x" * (3 * LINE_BYTES + 5) + b"\nend"
    view = memoryview(payload)
    while view:
        view = view[os.write(write_fd, view[: 1 << 16]) :]
    os.close(write_fd)
    texts = []
    while (item := segments.get(timeout=BOUND_S))[1] is not None:
        texts.append(item[1])
    pump.join(BOUND_S)
    os.close(read_fd)
    assert texts == ["a", "b", "c", "end"]
    assert segments.splitters["stdout"].overlong_lines == 1
    (note,) = segments.notes()
    assert note.startswith("1 stdout line(s) longer than 1 MiB (3 MiB) were not read")


def test_the_output_queue_is_bounded_in_bytes_and_a_waiting_bar_gives_way_to_its_newer_state() -> None:
    import queue

    from autotune.tail import Line, OutputQueue

    out = OutputQueue(bound_bytes=4096)
    out.put_lines("stderr", [Line(b"10%", bar=True)], 1.0, 1.0)
    out.put_lines("stderr", [Line(b"20%", bar=True)], 2.0, 2.0)  # replaces the 10% state still waiting
    out.put_lines("stdout", [Line(b"a" * 1000) for _ in range(10)], 3.0, 3.0)  # only 3 fit the bound
    out.end("stdout")
    got = []
    while True:
        try:
            got.append(out.get_nowait())
        except queue.Empty:
            break
    assert [(s, t if t is None else t[:3]) for s, t, _, _ in got] == [
        ("stderr", "20%"),
        ("stdout", "aaa"),
        ("stdout", "aaa"),
        ("stdout", "aaa"),
        ("stdout", None),
    ]
    assert out.collapsed_bars == 1 and out.oldest_mono() is None
    assert out.notes() == [
        "the trial wrote faster than autotune reads: 7 stdout line(s) (0.0 MiB) were not read; they are in stdout.log"
    ]
