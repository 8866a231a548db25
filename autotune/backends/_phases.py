"""Which phase a trial's own log shows it in: the two readers a backend's parser composes.

- :class:`LinePhases` follows a framework's own log lines (:class:`~autotune.backends._base.PhaseMark`,
  e.g. vLLM's sleep-mode wake-up lines around ms-swift's weight sync).
- :class:`MarkerPhases` tails a phase-marker file (``$AUTOTUNE_PHASES_FILE``, written by
  :mod:`autotune.probes.phases` from inside the training process: autotune's TRL worker, or a user's
  script under the command backend).

Both answer :meth:`~autotune.backends._base.StepParser.open_phase`; neither ever raises on what it reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from autotune.backends._base import OpenPhase, PhaseMark
from autotune.probes.phases import EVENTS, PHASES
from autotune.tail import FileTail

__all__ = ["LinePhases", "MarkerPhases"]

_MAX_EVIDENCE_CHARS = 300


class LinePhases:
    """The phase a framework's log lines show open, from its begin/end :class:`PhaseMark` lines.

    Every rank may print the lines, interleaved: a phase is open while more of its begin lines than end
    lines were seen since the last step, and it counts as entered when the first of those begin lines
    came. A step record closes every phase (the step that contained them finished), so a missed end
    line cannot leave a phase open across steps.

    Args:
        marks: the framework's phase lines.

    Raises:
        ValueError: a mark with an unknown phase or event (a bug in the backend).
    """

    def __init__(self, marks: Sequence[PhaseMark]) -> None:
        for mark in marks:
            if mark.phase not in PHASES or mark.event not in EVENTS:
                raise ValueError(f"phase mark {mark!r}: phase must be one of {PHASES}, event one of {EVENTS}")
        self._marks = [(mark, re.compile(mark.regex)) for mark in marks]
        self._any = re.compile("|".join(f"(?:{m.regex})" for m in marks)) if marks else None
        # phase -> [begins not yet matched by an end, entered at, the line that opened it]
        self._open: dict[str, tuple[int, float, str]] = {}

    def feed(self, line: str, t_mono_s: float) -> None:
        """Read one output line seen at ``t_mono_s``."""
        if self._any is None or not self._any.search(line):
            return
        for mark, rx in self._marks:
            if not rx.search(line):
                continue
            count, since, evidence = self._open.get(mark.phase, (0, t_mono_s, line.strip()))
            if mark.event == "begin":
                self._open[mark.phase] = (count + 1, since, evidence[:_MAX_EVIDENCE_CHARS])
            elif count <= 1:
                self._open.pop(mark.phase, None)
            else:
                self._open[mark.phase] = (count - 1, since, evidence)
            return

    def step(self) -> None:
        """A step record arrived: whatever was open finished inside it."""
        self._open.clear()

    def open(self) -> OpenPhase | None:
        """The phase open now (the one entered last, when several are)."""
        if not self._open:
            return None
        phase, (_, since, evidence) = max(self._open.items(), key=lambda kv: kv[1][1])
        return OpenPhase(phase, since, evidence)


class MarkerPhases:
    """The phase a phase-marker file shows open: the last ``begin`` not followed by its ``end``.

    The file is tailed (only new bytes are read; a partial last line waits for its newline). Markers
    are written by rank 0 only (:mod:`autotune.probes.phases`), in order, with ``time.monotonic()``
    timestamps that line up with the runner's clock.

    Args:
        path: the marker file (``$AUTOTUNE_PHASES_FILE``); it need not exist yet.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._tail = FileTail(self.path)  # bounded and non-blocking, whatever the trial makes of the file
        self._open: OpenPhase | None = None

    def poll(self) -> None:
        """Read the markers written since the last call."""
        for raw in self._tail.lines():
            self._read(raw)

    def _read(self, raw: bytes) -> None:
        try:
            marker = json.loads(raw)
        except ValueError:
            return
        if not isinstance(marker, dict):
            return
        phase, event, t_mono = marker.get("phase"), marker.get("event"), marker.get("t_mono_s")
        if phase not in PHASES or event not in EVENTS or not isinstance(t_mono, (int, float)):
            return
        if event == "begin":
            step = marker.get("step")
            at = f" at step {step}" if isinstance(step, int) else ""
            self._open = OpenPhase(str(phase), float(t_mono), f"phase marker: {phase} began{at}")
        elif self._open is not None and self._open.phase == phase:
            self._open = None

    def open(self) -> OpenPhase | None:
        """The phase open after the markers read so far."""
        return self._open
