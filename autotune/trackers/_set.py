"""The trackers one study reports to (``--report-to``, repeatable), as one object."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING

from autotune.errors import UsageError
from autotune.plaintext import plain
from autotune.trackers._base import StudyPlace, Tracker, TrialPlace, row_of

if TYPE_CHECKING:
    from autotune.records import TrialResult

__all__ = ["Trackers", "trackers_help"]

_STOP_POLL_S = 0.1  # how often a wait on a tracker looks at the study's stop


def trackers_help(registry: Mapping[str, type[Tracker]]) -> str:
    """The flag's help, from the registry."""
    names = " / ".join(registry)
    each = "; ".join(f"{name}: {cls.help}" for name, cls in registry.items())
    return (
        f"Report to an experiment tracker, repeatable ({names}): each trial's framework logs its run"
        f" there (named <study>-trial-<n>) and autotune logs the study, one row per trial. {each}."
    )


class Trackers:
    """The study's trackers: the framework's ``report_to`` names and environment for each run, and the
    study's run (each ended trial logged to every tracker). Thread-safe: workers of one process share it.

    Every call into a tracker (its network calls) goes through one gate, :meth:`_call`: it runs in a
    daemon thread that this one waits on for at most ``timeout_s`` (signals are still taken while it
    waits), and a failure or a timeout is one :class:`UsageError` line naming the tracker, never a
    traceback nor a study that hangs on a server that never answers.

    Args:
        names: the ``--report-to`` values, in order (repeats are dropped).
        registry: name → tracker class (:data:`autotune.trackers.TRACKERS`).
        timeout_s: the longest one call into a tracker may take.

    Raises:
        UsageError: a name the registry does not have, or a tracker whose package is not installed.
    """

    def __init__(
        self, names: Sequence[str], registry: Mapping[str, type[Tracker]], *, timeout_s: float = 60.0
    ) -> None:
        unknown = [n for n in names if n not in registry]
        if unknown:
            raise UsageError(
                f"--report-to {unknown[0]} is not a tracker autotune knows",
                hint=f"Use one of: {', '.join(registry)}",
            )
        self.trackers: list[Tracker] = [registry[n]() for n in dict.fromkeys(names)]
        for tracker in self.trackers:
            tracker.check_installed()
        self._lock = threading.Lock()
        self._started = False
        self.timeout_s = timeout_s

    @property
    def report_to(self) -> tuple[str, ...]:
        """The frameworks' ``report_to`` names (the same words in the Trainer and in verl)."""
        return tuple(t.name for t in self.trackers)

    def trial_env(self, place: TrialPlace) -> dict[str, str]:
        """Every tracker's variables for one run of the framework."""
        env: dict[str, str] = {}
        for tracker in self.trackers:
            env.update(tracker.trial_env(place))
        return env

    def start(self, study: StudyPlace, *, stop: threading.Event | None = None) -> None:
        """Open the study's run in every tracker (once; a second call does nothing).

        ``stop`` set while a tracker has not answered (the user's signal) gives the wait up: the run is
        left unopened, nothing is logged, and the study stops as it would between trials.
        """
        with self._lock:
            if self._started:
                return
            for tracker in self.trackers:
                if not self._call(tracker, "opening the study's run", partial(tracker.start, study), stop):
                    return
            self._started = True

    def log(self, result: TrialResult, *, stop: threading.Event | None = None) -> None:
        """Log an ended trial in every tracker (after :meth:`start`); ``stop`` as for :meth:`start`."""
        row = row_of(result)
        with self._lock:
            if not self._started:
                return
            for tracker in self.trackers:
                self._call(tracker, f"logging trial {row.number}", partial(tracker.log_trial, row), stop)

    def finish(self) -> None:
        """Close every tracker's study run (idempotent)."""
        with self._lock:
            started, self._started = self._started, False
            for tracker in self.trackers:
                if started:
                    self._call(tracker, "closing the study's run", tracker.finish)

    def _call(
        self, tracker: Tracker, what: str, call: Callable[[], None], stop: threading.Event | None = None
    ) -> bool:
        """``call()`` within :attr:`timeout_s`, or one line naming the tracker and the cause; False when
        ``stop`` was set during the wait (the call is given up; one begun after the stop, such as closing
        the run, has its whole time, and a second signal forces as anywhere).

        Raises:
            UsageError: the call failed (a closed port, a refused login) or did not return in time (a
                server that accepts and never answers); the thread left behind is a daemon.
        """
        failure: list[BaseException] = []

        def run() -> None:
            try:
                call()
            except Exception as exc:  # noqa: BLE001 - every tracker client raises its own kinds
                failure.append(exc)

        thread = threading.Thread(target=run, name=f"autotune-{tracker.name}", daemon=True)
        thread.start()
        watch = stop if stop is not None and not stop.is_set() else None
        deadline = time.monotonic() + self.timeout_s
        while thread.is_alive() and (left_s := deadline - time.monotonic()) > 0:
            thread.join(min(left_s, _STOP_POLL_S) if watch is not None else left_s)
            if watch is not None and watch.is_set() and thread.is_alive():
                return False  # the user stops the study: not waiting for the tracker any longer
        if thread.is_alive():
            cause = f"no answer within {self.timeout_s:g} s"
        elif failure:
            text = " ".join(str(failure[0]).split())[:200] or type(failure[0]).__name__
            cause = plain(text)
        else:
            return True
        raise UsageError(
            f"--report-to {tracker.name}: {what} failed: {cause}",
            hint=f"Check the tracker's server and settings ({tracker.help}), or run without "
            f"--report-to {tracker.name}; the same command resumes the study",
        )
