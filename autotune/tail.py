"""The one bounded, non-blocking reader of everything a trial writes: its stdout and stderr pipes and the
files it appends to (its metrics, its phase markers).

A trial owns these and may make them anything: a link to ``/dev/zero`` or ``/dev/urandom`` (endless
bytes), a FIFO (an ``open`` that waits for a writer forever), a line of a gigabyte, 200 MB of ``\\r``
progress bars. The tuner reads them between its own checks (the trial timeout, signals), so reading must
never block, never fall behind the writer, and never grow without bound. Three pieces, one rule each:

- :class:`LineSplitter` cuts bytes into lines and never holds more than ``line_bytes`` of an unfinished
  one: a longer line is skipped to its end (counted, never kept), at the speed of a byte search. With
  ``cr_ends`` (a pipe), a bare ``\\r`` ends a progress bar's state and the next state in the same read
  replaces it, as on a terminal.
- :class:`FileTail` reads an appended file with ``O_NONBLOCK``, only while it is a regular file (a FIFO,
  a device or a socket is given up, once), at most ``chunk_bytes`` per poll.
- :func:`pump_pipe` (one thread per pipe) copies the pipe to its log, which keeps every byte, and puts
  the lines on an :class:`OutputQueue`, bounded in bytes: a progress bar waiting there is replaced by its
  newer state, and a line that would pass the bound is dropped and counted. The pipe is thus always
  drained at the speed it is written; what the tuner could not read is said on the trial (:meth:`OutputQueue.notes`).
"""

from __future__ import annotations

import os
import queue
import stat
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "LINE_BYTES",
    "QUEUE_BYTES",
    "FileTail",
    "Line",
    "LineSplitter",
    "OutputQueue",
    "Segment",
    "close_quietly",
    "pump_pipe",
]

#: the longest line read (a step record, a log line); a longer one is skipped, counted and noted
LINE_BYTES = 1 << 20
#: the most output text waiting for the tuner (both streams of a trial); more is dropped and counted
QUEUE_BYTES = 8 << 20
_SEGMENT_OVERHEAD_BYTES = 160  # a queued segment's Python objects (tuple, str header) beside its text
_READ_BYTES = 1 << 20

# One output segment as the queue gives it: (stream, text, t_mono_s, t_wall_s); text None ends a stream.
Segment = tuple[str, str | None, float, float]


@dataclass(frozen=True)
class Line:
    """A complete line: ``text`` without its end; ``bar`` when a bare ``\\r`` ended it (a progress bar's state)."""

    text: bytes
    bar: bool = False


class LineSplitter:
    """Bytes in, complete lines out, holding at most ``line_bytes`` of the line not yet ended.

    Args:
        line_bytes: the longest line kept; a longer one is skipped to its end and counted.
        cr_ends: a bare ``\\r`` ends a line too (a pipe showing progress bars); ``\\r\\n`` is one end.
    """

    def __init__(self, line_bytes: int = LINE_BYTES, *, cr_ends: bool = False) -> None:
        self.line_bytes = line_bytes
        self.cr_ends = cr_ends
        self._pending: list[bytes] = []  # the unfinished line, as pieces (joined once, when it ends)
        self.pending_bytes = 0
        self._skipping = False  # inside a line longer than line_bytes: dropped up to its end
        #: lines skipped for their length, and the bytes skipped
        self.overlong_lines = 0
        self.overlong_bytes = 0
        #: progress-bar states replaced by a newer one read at the same time
        self.collapsed_bars = 0

    def feed(self, chunk: bytes) -> list[Line]:
        """The lines ``chunk`` completes, in order (progress-bar states collapsed within the chunk)."""
        out: list[Line] = []
        pieces = chunk.split(b"\n")
        for i, piece in enumerate(pieces):
            ended = i < len(pieces) - 1
            if self.cr_ends:
                self._feed_bars(piece, ended=ended, out=out)
            else:
                self._feed_piece(piece, ended=ended, bar=False, out=out)
        return out

    def rest(self) -> bytes:
        """The last line when it has no end (the writer is done), and forget it."""
        rest = b"" if self._skipping else b"".join(self._pending)
        self._pending, self.pending_bytes, self._skipping = [], 0, False
        return rest

    @property
    def skipping(self) -> bool:
        """Whether a line over the bound is being skipped now."""
        return self._skipping

    def _feed_bars(self, piece: bytes, *, ended: bool, out: list[Line]) -> None:
        if ended and piece.endswith(b"\r"):
            piece = piece[:-1]  # \r\n ends a line, not a bar
        parts = piece.split(b"\r")
        if len(parts) == 1:
            self._feed_piece(piece, ended=ended, bar=False, out=out)
            return
        self._feed_piece(parts[0], ended=True, bar=True, out=out)  # the bar being read ends here
        if len(parts) > 2:  # every state but the newest is overwritten within this read
            self.collapsed_bars += len(parts) - 3
            self._feed_piece(parts[-2], ended=True, bar=True, out=out)
        self._feed_piece(parts[-1], ended=ended, bar=False, out=out)

    def _feed_piece(self, piece: bytes, *, ended: bool, bar: bool, out: list[Line]) -> None:
        if self._skipping:
            self.overlong_bytes += len(piece)
            if ended:
                self._skipping = False
            return
        if piece:
            self._pending.append(piece)
            self.pending_bytes += len(piece)
        if self.pending_bytes > self.line_bytes:  # too long to keep: skipped to its end, never kept
            self.overlong_lines += 1
            self.overlong_bytes += self.pending_bytes
            self._pending, self.pending_bytes, self._skipping = [], 0, not ended
            return
        if ended:
            text = b"".join(self._pending)
            self._pending, self.pending_bytes = [], 0
            if not text:
                return
            if bar and out and out[-1].bar:  # a newer state of the same bar
                out[-1] = Line(text, bar)
                self.collapsed_bars += 1
            else:
                out.append(Line(text, bar))


class FileTail:
    """The complete new lines of an appended file, read in bounded steps.

    Args:
        path: the file; it need not exist yet.
        chunk_bytes: the most read by one :meth:`lines` call.
        line_bytes: the longest line kept; a longer one is skipped to its newline.
    """

    def __init__(self, path: Path, *, chunk_bytes: int = 4 << 20, line_bytes: int = LINE_BYTES) -> None:
        self.path = Path(path)
        self.chunk_bytes = chunk_bytes
        self._offset = 0
        self._lines = LineSplitter(line_bytes)
        #: why the file was given up (not a regular file), or None while it is read
        self.refused: str | None = None

    @property
    def line_bytes(self) -> int:
        return self._lines.line_bytes

    @property
    def dropped_lines(self) -> int:
        """Lines skipped for their length."""
        return self._lines.overlong_lines

    @property
    def pending_bytes(self) -> int:
        """Bytes of the unfinished last line held in memory (at most :attr:`line_bytes`)."""
        return self._lines.pending_bytes

    def lines(self) -> list[bytes]:
        """The complete lines written since the last call (without their newlines)."""
        chunk = self._read()
        return [line.text for line in self._lines.feed(chunk)] if chunk else []

    def rest(self) -> bytes:
        """The last line when it has no newline (at the end of the trial), and forget it."""
        return self._lines.rest()

    def _read(self) -> bytes:
        if self.refused is not None:
            return b""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return b""  # not there yet, or not readable now
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                self.refused = f"{self.path} is not a regular file: not read"
                return b""
            os.lseek(fd, self._offset, os.SEEK_SET)
            chunk = os.read(fd, self.chunk_bytes)
        except OSError:
            return b""
        finally:
            os.close(fd)
        self._offset += len(chunk)
        return chunk


@dataclass
class _Dropped:
    lines: int = 0
    bytes: int = 0


class OutputQueue:
    """The trial's output lines waiting for the tuner, at most ``bound_bytes`` of them.

    The pump threads put (:meth:`put_lines`, :meth:`end`); the watch takes one segment at a time with
    :meth:`get` / :meth:`get_nowait` (raising :class:`queue.Empty`, as :class:`queue.SimpleQueue` does).
    A progress bar's state waiting at the back of the queue is replaced by a newer state of the same
    stream; a line that would take the queue past its bound is dropped and counted; an end is always kept.

    Args:
        bound_bytes: the most text (plus each segment's overhead) waiting at once.
    """

    def __init__(self, bound_bytes: int = QUEUE_BYTES) -> None:
        self.bound_bytes = bound_bytes
        self._items: deque[tuple[Segment, bool, int]] = deque()  # (segment, is a bar, its cost)
        self._bytes = 0
        self._ready = threading.Condition()
        self.dropped: dict[str, _Dropped] = {}
        self.splitters: dict[str, LineSplitter] = {}  # each pump's, for the notes
        #: progress-bar states replaced while waiting
        self.collapsed_bars = 0
        #: when a line over the line bound was last being read (for the watchdog: the trial wrote
        #: something line-shaped the tuner did not read, so "no step" is not evidence of a hang then)
        self.overlong_mono: float | None = None

    def put_lines(self, stream: str, lines: list[Line], t_mono_s: float, t_wall_s: float) -> None:
        """Queue ``lines`` read from ``stream`` at that moment (a bar may replace a waiting bar)."""
        with self._ready:
            for line in lines:
                text = line.text.decode("utf-8", "replace")
                cost = len(line.text) + _SEGMENT_OVERHEAD_BYTES
                back = self._items[-1] if self._items else None
                if line.bar and back is not None and back[1] and back[0][0] == stream:
                    self._items.pop()  # the waiting bar's newer state replaces it
                    self._bytes -= back[2]
                    self.collapsed_bars += 1
                if self._bytes + cost > self.bound_bytes:
                    dropped = self.dropped.setdefault(stream, _Dropped())
                    dropped.lines += 1
                    dropped.bytes += len(line.text)
                    continue
                self._items.append(((stream, text, t_mono_s, t_wall_s), line.bar, cost))
                self._bytes += cost
            self._ready.notify()

    def end(self, stream: str) -> None:
        """``stream`` is closed: its last segment (text None) is queued whatever the bound."""
        with self._ready:
            self._items.append(((stream, None, time.monotonic(), time.time()), False, 0))
            self._ready.notify()

    def get(self, timeout: float | None = None) -> Segment:
        """The oldest segment, waiting up to ``timeout`` seconds; raises :class:`queue.Empty`."""
        with self._ready:
            if not self._ready.wait_for(lambda: bool(self._items), timeout):
                raise queue.Empty
            return self._pop()

    def get_nowait(self) -> Segment:
        """The oldest segment; raises :class:`queue.Empty` when none waits."""
        with self._ready:
            if not self._items:
                raise queue.Empty
            return self._pop()

    def oldest_mono(self) -> float | None:
        """When the oldest waiting segment was read: the tuner has seen the trial's output up to then."""
        with self._ready:
            return self._items[0][0][2] if self._items else None

    def notes(self) -> list[str]:
        """What the tuner did not read of the trial's output, one line each (the logs hold every byte)."""
        notes = []
        for stream, splitter in self.splitters.items():
            if splitter.overlong_lines:
                notes.append(
                    f"{splitter.overlong_lines} {stream} line(s) longer than {splitter.line_bytes >> 20} MiB "
                    f"({splitter.overlong_bytes / 2**20:.0f} MiB) were not read (a step record among them "
                    f"would not be counted); they are in {stream}.log"
                )
        for stream, dropped in self.dropped.items():
            notes.append(
                f"the trial wrote faster than autotune reads: {dropped.lines} {stream} line(s) "
                f"({dropped.bytes / 2**20:.1f} MiB) were not read; they are in {stream}.log"
            )
        return notes

    def _pop(self) -> Segment:
        segment, _, cost = self._items.popleft()
        self._bytes -= cost
        return segment


def pump_pipe(
    fd: int,
    stream: str,
    log: BinaryIO,
    out: OutputQueue,
    failed: Callable[[OSError], None],
) -> None:
    """Copy a pipe to its log file and queue its lines (``\\n``- or ``\\r``-ended) on ``out``.

    Runs in its own thread until the pipe closes. A write to the log that fails (disk full, read-only)
    is reported once through ``failed`` and the log is given up, but the pipe is still drained to its
    end, so the trial never blocks on a full pipe.
    """
    splitter = out.splitters[stream] = LineSplitter(cr_ends=True)
    try:
        while True:
            try:
                chunk = os.read(fd, _READ_BYTES)
            except OSError:
                chunk = b""
            if not chunk:
                break
            t_mono, t_wall = time.monotonic(), time.time()
            if not log.closed:
                try:
                    log.write(chunk)
                except OSError as exc:
                    close_quietly(log)
                    failed(exc)
            skipped = splitter.overlong_bytes
            lines = splitter.feed(chunk)
            if splitter.skipping or splitter.overlong_bytes != skipped:
                out.overlong_mono = t_mono
            if lines:
                out.put_lines(stream, lines, t_mono, t_wall)
        rest = splitter.rest()
        if rest:
            out.put_lines(stream, [Line(rest)], time.monotonic(), time.time())
    finally:
        close_quietly(log)
        out.end(stream)


def close_quietly(fh: BinaryIO) -> None:
    """Close a file whose writes already failed (closing may flush and fail again)."""
    try:
        fh.close()
    except OSError:
        pass
