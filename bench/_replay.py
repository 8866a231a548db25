"""A recorded real surface, replayed: every configuration of a small space measured once with real trials.

``bench/record_surface.py`` runs every configuration of a small TRL space with real trials (on the CPU,
with a tiny model) ``repeats`` times and writes one JSON table: the versions, the host, and per
configuration the outcome and timings of each repeat. This world answers the bench's questions from
that table alone, Zeus-style: nothing is invented. A seed picks, for each configuration, which of its
recorded repeats a study sees (the run-to-run noise is the recorded one); the truth the regret is
measured against is the median over the repeats.

Table format (``schema`` 1)::

    {"schema": 1, "space": {...knob: [values]...}, "fixed": {...}, "versions": {...}, "host": {...},
     "capacity_bytes": int, "rows": [{"params": {...}, "repeats": [
         {"status": "COMPLETE", "reason": "...", "step_time_s": float | null, "throughput": float | null,
          "startup_s": float, "peak_bytes": int, "phases": {"rollout": s, ...} | null,
          "failed_phase": str | null, "started_at": iso, "finished_at": iso}, ...]}, ...]}
"""

from __future__ import annotations

import json
import statistics
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from _settings import HEADROOM, STEP_PHASES, Setting, Truth

from autotune.records import TrialStatus
from autotune.space import canonical_key

__all__ = ["SCHEMA", "RecordedTable", "ReplaySurface"]

SCHEMA = 1


class RecordedTable:
    """A recorded surface, read from its JSON file (see the module docstring).

    Args:
        path: the table written by ``bench/record_surface.py``.
        setting: the bench setting the table was recorded for (its job and hardware).
    """

    def __init__(self, path: Path, setting: Setting) -> None:
        data = json.loads(path.read_text())
        if data.get("schema") != SCHEMA:
            raise ValueError(f"{path}: schema {data.get('schema')!r}, this bench reads schema {SCHEMA}")
        self.setting = setting
        self.path = path
        self.versions: dict[str, Any] = data["versions"]
        self.host: dict[str, Any] = data["host"]
        self.capacity = float(data["capacity_bytes"])
        self.rows: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
        for row in data["rows"]:
            if not row["repeats"]:
                raise ValueError(f"{path}: {row['params']} has no recorded repeat")
            self.rows[canonical_key(row["params"])] = (dict(row["params"]), list(row["repeats"]))
        self.n_rows = len(self.rows)


def _truth(rep: Mapping[str, Any], capacity: float) -> Truth:
    status = TrialStatus(rep["status"])
    step = float(rep.get("step_time_s") or 0.0)
    phases = rep.get("phases") or {}
    return Truth(
        status=status,
        reason=str(rep.get("reason") or ""),
        throughput=float(rep.get("throughput") or 0.0),
        step_s=step,
        startup_s=float(rep.get("startup_s") or 0.0),
        peak_bytes=int(min(float(rep.get("peak_bytes") or 0), capacity)),
        valid=True,
        phases={p: float(phases.get(p, 0.0) or 0.0) for p in STEP_PHASES}
        if phases
        else {p: step if p == "train" else 0.0 for p in STEP_PHASES},
        failed_phase=rep.get("failed_phase"),
    )


class ReplaySurface:
    """The recorded world of one seed (see the module docstring).

    Args:
        table: the recorded table.
        seed: picks the repeat each configuration shows.
    """

    def __init__(self, table: RecordedTable, seed: int) -> None:
        self.table = table
        self.setting = table.setting
        self.seed = seed
        self.capacity = table.capacity

    def _row(self, params: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        row = self.table.rows.get(canonical_key(dict(params)))
        if row is None:
            raise KeyError(f"configuration not recorded: {dict(params)}")
        return row

    def truth(self, params: Mapping[str, Any]) -> Truth:
        """What one recorded repeat of ``params`` did (the seed picks which)."""
        _, repeats = self._row(params)
        pick = zlib.crc32(f"{self.seed}:{canonical_key(dict(params))}".encode()) % len(repeats)
        return _truth(repeats[pick], self.capacity)

    def usable_throughput(self, params: Mapping[str, Any]) -> float:
        """The median recorded throughput when every repeat completed with headroom, else 0."""
        _, repeats = self._row(params)
        truths = [_truth(r, self.capacity) for r in repeats]
        if any(
            t.status is not TrialStatus.COMPLETE or t.peak_bytes > HEADROOM * self.capacity for t in truths
        ):
            return 0.0
        return statistics.median(t.throughput for t in truths)

    def optimum(self) -> tuple[dict[str, Any], float, dict[str, float]]:
        """The recorded optimum by exhaustive search over the table."""
        scored = [(self.usable_throughput(p), p) for p, _ in self.table.rows.values()]
        best_tp, best = max(scored, key=lambda item: item[0])
        if best_tp <= 0:
            raise ValueError(f"{self.table.path}: no recorded configuration is usable")
        usable = sum(tp > 0 for tp, _ in scored)
        return dict(best), best_tp, {"valid": len(scored), "usable_frac": usable / len(scored)}
