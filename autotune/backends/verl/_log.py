"""Step records from verl: the console line ``step:N - key:value - key:value ...`` and the JSON lines
``{"step": N, "data": {...}}`` its file logger writes to ``$VERL_FILE_LOGGER_PATH``.

The console format is read by :func:`autotune.backends._loglines.parse_verl_console_line` (shared with
the ``command`` backend and ``autotune profile``). verl logs phase timings (``timing_s/gen``, ``timing_s/update_actor`` ...) that the probes' phase split uses.
"""

from __future__ import annotations

import json
from pathlib import Path

from autotune.backends._base import StepParser
from autotune.backends._loglines import parse_verl_console_line
from autotune.records import StepMetrics

__all__ = ["VerlLogParser"]


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
        parsed = parse_verl_console_line(line)
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
