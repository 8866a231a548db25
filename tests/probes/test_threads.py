"""join_or_abandon: a stopped thread is joined; a stuck one is waited for, then left, with warnings."""

from __future__ import annotations

import threading

from autotune.probes._threads import join_or_abandon


def test_a_thread_that_ends_is_joined_without_warnings() -> None:
    thread = threading.Thread(target=lambda: None, daemon=True)
    thread.start()
    said: list[str] = []
    assert join_or_abandon(thread, interval_s=0.01, timeout_s=1.0, warn=said.append) is True
    assert said == []


def test_a_stuck_thread_is_warned_about_then_abandoned() -> None:
    release = threading.Event()
    thread = threading.Thread(target=lambda: release.wait(10), daemon=True)
    thread.start()
    said: list[str] = []
    try:
        assert join_or_abandon(thread, interval_s=0.01, timeout_s=0.05, warn=said.append) is False
        assert said == ["slow", "abandoned"]
    finally:
        release.set()
        thread.join(5)
