"""Step records from verl: the console line ``step:N - key:value - key:value ...`` and the JSON lines
``{"step": N, "data": {...}}`` its file logger writes to ``$VERL_FILE_LOGGER_PATH``.

verl logs phase timings (``timing_s/gen``, ``timing_s/update_actor`` ...) that the probes' phase split uses.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from autotune.backends._base import StepParser
from autotune.records import StepMetrics

__all__ = ["VerlLogParser", "parse_console_line"]

_STEP = re.compile(r"(?:^|\s)step:(\d+)\s+-\s+(.*)$")


def _number(text: str) -> float | None:
    try:
        return float(text.strip().rstrip(","))
    except ValueError:
        return None


def parse_console_line(line: str) -> tuple[int, dict[str, float]] | None:
    """``step:3 - actor/loss:0.12 - timing_s/gen:4.1`` → ``(3, {...})``; None for other lines."""
    m = _STEP.search(line)
    if not m:
        return None
    values: dict[str, float] = {}
    for part in m.group(2).split(" - "):
        key, sep, raw = part.rpartition(":")
        if not sep or not key.strip():
            continue
        value = _number(raw)
        if value is not None:
            values[key.strip()] = value
    return int(m.group(1)), values


class VerlLogParser(StepParser):
    """Parser of a verl run's console lines, or of its JSON-lines file when one is given."""

    def __init__(self, jsonl_path: Path | None = None) -> None:
        self.jsonl_path = jsonl_path
        self._offset = 0
        self._partial = b""
        self._seen: set[int] = set()

    def _make(
        self, step: int, values: dict[str, float], t_mono_s: float, t_wall_s: float
    ) -> list[StepMetrics]:
        if step in self._seen:
            return []
        self._seen.add(step)
        duration = values.get("timing_s/step")
        return [
            StepMetrics(step=step, t_mono_s=t_mono_s, t_wall_s=t_wall_s, duration_s=duration, values=values)
        ]

    def feed(self, stream: str, line: str, t_mono_s: float, t_wall_s: float) -> list[StepMetrics]:
        parsed = parse_console_line(line)
        return self._make(parsed[0], parsed[1], t_mono_s, t_wall_s) if parsed else []

    def poll(self, t_mono_s: float, t_wall_s: float) -> list[StepMetrics]:
        if self.jsonl_path is None or not self.jsonl_path.exists():
            return []
        with self.jsonl_path.open("rb") as fh:
            fh.seek(self._offset)
            chunk = fh.read()
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        out: list[StepMetrics] = []
        for raw in lines:
            try:
                record = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if (
                isinstance(record, dict)
                and isinstance(record.get("step"), int)
                and isinstance(record.get("data"), dict)
            ):
                values = {
                    k: float(v)
                    for k, v in record["data"].items()
                    if isinstance(v, (int, float)) and not isinstance(v, bool)
                }
                out.extend(self._make(record["step"], values, t_mono_s, t_wall_s))
        return out
