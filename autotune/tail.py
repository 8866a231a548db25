"""The one bounded, non-blocking reader of a file a trial appends to (its metrics, its phase markers).

A trial owns these files and may turn them into anything: a link to ``/dev/zero`` or ``/dev/urandom``
(endless bytes), a FIFO (an ``open`` that waits for a writer forever), a line of a gigabyte. The tuner
reads them between its own checks (the trial timeout, signals), so a read must never block and never
grow without bound:

- the file is opened with ``O_NONBLOCK`` and read only when it is a regular file (a FIFO, a device or
  a socket is given up, once, and never opened again);
- each poll reads at most :attr:`FileTail.chunk_bytes` new bytes (the rest waits for the next poll);
- a line longer than :attr:`FileTail.line_bytes` is dropped, not kept in memory.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["FileTail"]


class FileTail:
    """The complete new lines of an appended file, read in bounded steps.

    Args:
        path: the file; it need not exist yet.
        chunk_bytes: the most read by one :meth:`lines` call.
        line_bytes: the longest line kept; a longer one is skipped to its newline.
    """

    def __init__(self, path: Path, *, chunk_bytes: int = 4 << 20, line_bytes: int = 1 << 20) -> None:
        self.path = Path(path)
        self.chunk_bytes = chunk_bytes
        self.line_bytes = line_bytes
        self._offset = 0
        self._partial = b""
        self._skipping = False  # inside a line longer than line_bytes: dropped up to its newline
        #: why the file was given up (not a regular file), or None while it is read
        self.refused: str | None = None
        #: lines dropped for their length
        self.dropped_lines = 0

    def lines(self) -> list[bytes]:
        """The complete lines written since the last call (without their newlines)."""
        chunk = self._read()
        if not chunk:
            return []
        *complete, rest = (self._partial + chunk).split(b"\n")
        out: list[bytes] = []
        for raw in complete:
            if self._skipping:
                self._skipping = False  # the end of the overlong line: dropped
                continue
            if len(raw) > self.line_bytes:
                self.dropped_lines += 1
                continue
            out.append(raw)
        self._partial = rest
        if len(rest) > self.line_bytes:
            if not self._skipping:
                self.dropped_lines += 1
            self._skipping, self._partial = True, b""
        return out

    def rest(self) -> bytes:
        """The last line when it has no newline (at the end of the trial), and forget it."""
        rest, self._partial = (b"" if self._skipping else self._partial), b""
        return rest

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
