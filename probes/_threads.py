"""Stopping a sampler's daemon thread without ever hanging the caller."""

from __future__ import annotations

import threading
from collections.abc import Callable


def join_or_abandon(
    thread: threading.Thread, *, interval_s: float, timeout_s: float, warn: Callable[[str], None]
) -> bool:
    """Wait for ``thread`` (already told to stop): two sampling intervals, then up to ``timeout_s``.

    ``warn("slow")`` is called before the long wait and ``warn("abandoned")`` when the thread is still
    running after it (it is a daemon: it is left to finish its current read). Returns True once the
    thread has ended.
    """
    thread.join(timeout=max(2 * interval_s, 0.2))
    if thread.is_alive():
        warn("slow")
        thread.join(timeout=timeout_s)
    if thread.is_alive():
        warn("abandoned")
        return False
    return True
