"""Does the README's quick start reproduce? The same command, N times in a row, each with a fresh --out.

Runs ``autotune search --model tiny-qwen2 --trials 4 --out <fresh dir>`` (the README's first run,
through this interpreter's installed ``autotune``) ``--runs`` times, one after the other, and prints each
run's winner (its knobs), verdict and wall time side by side, with the host's load average around each
run; each result is read from the study it wrote (``study.json``, the winner's ``result.json``). The claim it checks: every run names the same winning configuration, or every run says the speedup
is not measurable (no measurable speedup, or not measurable on this host, or the baseline is fastest).

    python bench/quickstart_repeat.py --runs 3      # as a user runs it: no OMP_NUM_THREADS
    python bench/quickstart_repeat.py --runs 3 --keep runs/repeat   # keep the three studies
    python bench/quickstart_repeat.py --summarize runs/repeat/run-*  # the table of finished ones

Exits 0 when the runs agree, 1 when they do not, 2 when a run fails to produce a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

QUICK_START = ("search", "--model", "tiny-qwen2", "--trials", "4")


@dataclass(frozen=True)
class QuickStart:
    """One quick start: how it ended, what it recommended and how long it took."""

    exit_code: int
    wall_s: float
    load_before: float | None
    load_after: float | None
    winner: int | None
    winner_knobs: str
    measurable: bool | None
    verdict: str

    @property
    def claims_a_speedup(self) -> bool:
        return self.measurable is True


def _knobs(study: Path, trial: int | None) -> str:
    result = study / "trials" / str(trial) / "result.json"
    if trial is None or not result.is_file():
        return "—"
    params = json.loads(result.read_text()).get("params") or {}
    return ", ".join(f"{k}={v}" for k, v in sorted(params.items()))


def read_study(
    out: Path,
    *,
    exit_code: int = 0,
    wall_s: float = 0.0,
    loads: tuple[float | None, float | None] = (None, None),
) -> QuickStart:
    """A finished quick start as its own ``study.json`` records it (the recommendation and its verdict)."""
    from autotune.records import Recommendation
    from autotune.studydir import StudyDir

    settings = StudyDir(out).read_settings()
    stored = settings.recommendation
    rec = Recommendation.model_validate(stored) if stored is not None else None
    detail = (settings.outcome or {}).get("detail")
    if not wall_s and settings.finished_wall_s and settings.created_wall_s:
        wall_s = float(settings.finished_wall_s - settings.created_wall_s)
    return QuickStart(
        exit_code=exit_code,
        wall_s=wall_s,
        load_before=loads[0],
        load_after=loads[1],
        winner=rec.trial if rec is not None else None,
        winner_knobs=_knobs(out, rec.trial if rec is not None else None),
        measurable=rec.measurable if rec is not None else None,
        verdict=(rec.verdict if rec is not None else None) or str(detail or "no recommendation"),
    )


def run_once(out: Path) -> QuickStart:
    """The quick start into ``out``, as a user runs it; the result read back from the study it wrote."""
    load_before = os.getloadavg()[0]
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "autotune", *QUICK_START, "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    wall_s = time.monotonic() - t0
    if not (out / "study.json").is_file():
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"quick start into {out} wrote no study.json (exit {done.returncode})")
    return read_study(out, exit_code=done.returncode, wall_s=wall_s, loads=(load_before, os.getloadavg()[0]))


def agree(runs: list[QuickStart]) -> bool:
    """Every run names the same winning configuration, or none claims a measurable speedup."""
    if not any(r.claims_a_speedup for r in runs):
        return True
    return all(r.claims_a_speedup for r in runs) and len({r.winner_knobs for r in runs}) == 1


def _load(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _table(runs: list[QuickStart]) -> None:
    print("| run | exit | wall s | load avg (1 min) before → after | winner | winner's knobs | verdict |")
    print("|---|---|---|---|---|---|---|")
    for k, r in enumerate(runs, 1):
        print(
            f"| {k} | {r.exit_code} | {r.wall_s:.0f} | {_load(r.load_before)} → {_load(r.load_after)} | {r.winner} "
            f"| {r.winner_knobs} | {r.verdict} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="quick starts in a row (default 3)")
    parser.add_argument(
        "--keep", type=Path, help="keep the studies under this folder (default: a temporary one)"
    )
    parser.add_argument(
        "--summarize",
        type=Path,
        nargs="+",
        help="run nothing: print the table of these finished quick starts",
    )
    args = parser.parse_args(argv)
    if args.summarize:
        runs = [read_study(p) for p in args.summarize]
    else:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        print(f"host: {cores} cores; command: autotune {' '.join(QUICK_START)} --out <fresh> (x{args.runs})")
        with tempfile.TemporaryDirectory(prefix="quickstart-") as tmp:
            root = args.keep or Path(tmp)
            runs = []
            for k in range(1, args.runs + 1):
                run = run_once(root / f"run-{k}")
                runs.append(run)
                print(
                    f"run {k}: exit {run.exit_code}, {run.wall_s:.0f} s; winner trial {run.winner}",
                    flush=True,
                )
    print()
    _table(runs)
    same = agree(runs)
    print(
        f"\nagree: {'yes' if same else 'NO'} (same winner everywhere, or no run claims a measurable speedup)"
    )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
