"""A recorded real surface, replayed: every configuration of a small space measured once with real trials.

``bench/record_surface.py`` runs every configuration of a small TRL space with real trials (on the CPU,
with a tiny model) ``repeats`` times and writes one JSON table: the versions, the host, and per
configuration the outcome and timings of each repeat. This world answers the bench's questions from
that table alone, Zeus-style: nothing is invented. A seed picks, for each configuration, which of its
recorded repeats a study sees (the run-to-run noise is the recorded one); the truth the regret is
measured against is the median over the repeats.

The bench registers the committed table (``bench/recorded/trl-cpu.json``) as the ``replay`` family
through :class:`RecordedSetting`: the job, host and space the table was recorded with, and what the CLI
does on such a host (no GPU: no estimator pre-screen).

Table format (``schema`` 1)::

    {"schema": 1, "space": {...knob: [values]...}, "fixed": {...}, "versions": {...}, "host": {...},
     "capacity_bytes": int, "rows": [{"params": {...}, "repeats": [
         {"status": "COMPLETE", "reason": "...", "step_time_s": float | null, "throughput": float | null,
          "startup_s": float, "peak_bytes": int, "phases": {"rollout": s, ...} | null,
          "failed_phase": str | null, "steady_steps": int, "rel_ci95": float | null,
          "started_at": iso, "finished_at": iso}, ...]}, ...]}

A replayed trial's steps scatter as the recorded trial's did (its ``rel_ci95`` over ``steady_steps``
back to one step's spread), around the recorded repeat's step time.
"""

from __future__ import annotations

import json
import math
import statistics
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _settings import HEADROOM, STEP_PHASES, Setting, Truth

from autotune.backends import ModelRef, TrialContext, backend_class
from autotune.records import Hardware, HostInfo, TrialStatus
from autotune.space import Platform, SearchSpace, canonical_key, load_space

__all__ = ["RECORDED", "SCHEMA", "RecordedSetting", "RecordedTable", "ReplaySurface", "recorded_settings"]

SCHEMA = 1
HERE = Path(__file__).resolve().parent
#: the committed recordings, by the name of their bench setting
RECORDED = {"trl tiny-qwen2 CPU (recorded)": HERE / "recorded" / "trl-cpu.json"}


@dataclass(frozen=True)
class RecordedSetting(Setting):
    """The setting a table was recorded in: its job, its host (no GPU) and its space.

    ``table`` is the recording; ``space_file`` the space YAML it swept. The study the bench runs is the
    one the CLI runs on that host: the space restricted to it, no estimator pre-screen (the CLI builds
    none without GPUs), GPU time counted as the trial's wall time (one device: the host).
    """

    table: Path = RECORDED["trl tiny-qwen2 CPU (recorded)"]
    space_file: Path = HERE / "record_space_trl.yaml"
    host: Mapping[str, Any] = field(default_factory=dict)  # the table's host, read once with it

    def space(self) -> SearchSpace:
        return (
            load_space(self.space_file, backend=self.backend)
            .with_roles(backend_class(self.backend).knob_roles())
            .restrict(Platform.machine(gpu_present=False))
        )

    def hardware(self) -> Hardware:
        host = self.host
        return Hardware(
            gpus=(),
            host=HostInfo(
                hostname=str(host["hostname"]),
                cpu_cores_logical=int(host["cpu_cores_logical"]),
                cpu_cores_physical=int(host["cpu_cores_physical"] or host["cpu_cores_logical"]),
                ram_total_bytes=int(host["ram_total_bytes"]),
                platform="linux",
            ),
        )

    def model_ref(self) -> ModelRef:
        from autotune.workload.models import resolve_model

        return resolve_model(self.model, build_tiny=False)

    def context(self, trial_dir: Path) -> TrialContext:
        return TrialContext(
            study_dir=trial_dir.parent,
            trial_dir=trial_dir,
            model=self.model_ref(),
            gpus=(),
            global_batch=self.global_batch,
            num_generations=self.num_generations,
            max_steps=10,
            max_completion_length=self.max_completion_length,
        )

    def memory_gate(self, *_: Any, **__: Any) -> None:
        """No pre-screen: the CLI builds none on a host without GPUs."""
        return None


def recorded_settings() -> tuple[RecordedSetting, ...]:
    """A setting per committed recording (its job and baseline as the recording's studies had them)."""
    out = []
    for name, path in RECORDED.items():
        if not path.is_file():
            continue
        data = json.loads(path.read_text())
        space_file = HERE / Path(data.get("space_file", "record_space_trl.yaml")).name
        out.append(
            RecordedSetting(
                name=name,
                backend=str(data.get("backend", "trl")),
                model=str(data["model"]),
                gpu="none",
                n_gpus=1,  # GPU time is counted on one device: the host
                host_ram_gib=float(data["capacity_bytes"]) / 2**30,
                fixed=dict(data["fixed"]),
                baseline=dict(data["baseline"]),
                kind="replay",
                table=path,
                space_file=space_file,
                host=dict(data["host"]),
            )
        )
    return tuple(out)


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
        self.worker_values = (None,)  # every recorded row is one configuration (the bench's describe)


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
        step_noise=_step_noise(rep),
    )


def _step_noise(rep: Mapping[str, Any]) -> float | None:
    """One step's spread as the trial measured it: its steady estimate's 95 % interval back to one
    step's standard deviation (``rel_ci95 = 1.96 sd / sqrt(n)``); None when it was not recorded."""
    ci, n = rep.get("rel_ci95"), int(rep.get("steady_steps") or 0)
    if ci is None or n < 2:
        return None
    return float(ci) * math.sqrt(n) / 1.96


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
