"""The trial's output pump: each of the runner's two reader threads copies one pipe to its log file and
queues every output segment for the watch (:class:`autotune.trial.runner.TrialRun`), which handles
them in the calling thread.
"""

from __future__ import annotations

import os
import queue
import re
import time
from collections.abc import Callable
from typing import Any, BinaryIO

__all__ = ["MAX_SEGMENT_BYTES", "Segment", "close_quietly", "pump"]

MAX_SEGMENT_BYTES = 1 << 20  # a segment without any newline is cut at 1 MiB
SPLIT = re.compile(rb"[\r\n]")

# One output segment as the readers queue it: (stream, text, t_mono_s, t_wall_s); text None ends a stream.
Segment = tuple[str, str | None, float, float]


def pump(
    fd: int,
    stream: str,
    log: BinaryIO,
    out: queue.SimpleQueue[Segment],
    failed: Callable[[OSError], None],
) -> None:
    """Copy a pipe to its log file and put every \\n- or \\r-separated segment on ``out``.

    A write to the log that fails (disk full, read-only) is reported once through ``failed`` and the
    log is given up, but the pipe is still drained to its end, so the trial never blocks on a full pipe.
    """
    # the segment being read (no separator yet), kept as pieces: joining once when it ends keeps a long
    # line linear in its length (a 1 GiB line without newline was copied again on every 64 KiB read)
    pending: list[bytes] = []
    pending_bytes = 0
    try:
        while True:
            try:
                chunk = os.read(fd, 1 << 20)
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
            parts = SPLIT.split(chunk)
            if len(parts) > 1:
                parts[0] = b"".join([*pending, parts[0]])
                pending, pending_bytes = [], 0
                for part in parts[:-1]:
                    if part:
                        out.put((stream, part.decode("utf-8", "replace"), t_mono, t_wall))
            if parts[-1]:
                pending.append(parts[-1])
                pending_bytes += len(parts[-1])
                if pending_bytes > MAX_SEGMENT_BYTES:  # a segment without any separator is cut
                    out.put((stream, b"".join(pending).decode("utf-8", "replace"), t_mono, t_wall))
                    pending, pending_bytes = [], 0
        if pending:
            out.put((stream, b"".join(pending).decode("utf-8", "replace"), time.monotonic(), time.time()))
    finally:
        close_quietly(log)
        out.put((stream, None, time.monotonic(), time.time()))


def close_quietly(fh: Any) -> None:
    """Close a file whose writes already failed (closing may flush and fail again)."""
    try:
        fh.close()
    except OSError:
        pass
