"""Does the README's quick start reproduce? The same command, N times in a row, each with a fresh --out.

Runs ``autotune search --model tiny-qwen2 --trials 4 --out <fresh dir> --json`` (the README's first run,
through this interpreter's installed ``autotune``) ``--runs`` times, one after the other, and prints each
run's winner (its knobs), verdict and wall time side by side, with the host's load average around each
run. The claim it checks: every run names the same winning configuration, or every run says the speedup
is not measurable (no measurable speedup, or not measurable on this host, or the baseline is fastest).

    python bench/quickstart_repeat.py --runs 3      # as a user runs it: no OMP_NUM_THREADS
    python bench/quickstart_repeat.py --runs 3 --keep runs/repeat   # keep the three studies

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
from typing import Any

QUICK_START = ("search", "--model", "tiny-qwen2", "--trials", "4")


@dataclass(frozen=True)
class QuickStart:
    """One quick start: how it ended, what it recommended and how long it took."""

    exit_code: int
    wall_s: float
    load_before: float
    load_after: float
    winner: int | None
    winner_knobs: str
    measurable: bool | None
    verdict: str

    @property
    def claims_a_speedup(self) -> bool:
        return self.measurable is True


def _knobs(summary: dict[str, Any], trial: int | None) -> str:
    for row in summary.get("trials", []):
        if row.get("number") == trial:
            return ", ".join(f"{k}={v}" for k, v in sorted((row.get("params") or {}).items()))
    return "—"


def run_once(out: Path) -> QuickStart:
    """The quick start into ``out``; its ``--json`` summary read back."""
    load_before = os.getloadavg()[0]
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "autotune", *QUICK_START, "--out", str(out), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    wall_s = time.monotonic() - t0
    try:
        summary = json.loads(done.stdout)
    except json.JSONDecodeError:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"quick start into {out} printed no JSON summary (exit {done.returncode})") from None
    rec = summary.get("recommendation") or {}
    winner = rec.get("trial")
    return QuickStart(
        exit_code=done.returncode,
        wall_s=wall_s,
        load_before=load_before,
        load_after=os.getloadavg()[0],
        winner=winner,
        winner_knobs=_knobs(summary, winner),
        measurable=rec.get("measurable"),
        verdict=rec.get("verdict") or summary.get("summary") or "",
    )


def agree(runs: list[QuickStart]) -> bool:
    """Every run names the same winning configuration, or none claims a measurable speedup."""
    if not any(r.claims_a_speedup for r in runs):
        return True
    return all(r.claims_a_speedup for r in runs) and len({r.winner_knobs for r in runs}) == 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="quick starts in a row (default 3)")
    parser.add_argument(
        "--keep", type=Path, help="keep the studies under this folder (default: a temporary one)"
    )
    args = parser.parse_args(argv)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"host: {cores} cores; command: autotune {' '.join(QUICK_START)} --out <fresh> (x{args.runs})")
    with tempfile.TemporaryDirectory(prefix="quickstart-") as tmp:
        root = args.keep or Path(tmp)
        runs = []
        for k in range(1, args.runs + 1):
            run = run_once(root / f"run-{k}")
            runs.append(run)
            print(
                f"run {k}: exit {run.exit_code}, {run.wall_s:.0f} s, load {run.load_before:.1f} -> "
                f"{run.load_after:.1f}; winner trial {run.winner} ({run.winner_knobs})\n  verdict: {run.verdict}",
                flush=True,
            )
    print()
    print("| run | exit | wall s | load avg (1 min) before → after | winner | winner's knobs | verdict |")
    print("|---|---|---|---|---|---|---|")
    for k, r in enumerate(runs, 1):
        print(
            f"| {k} | {r.exit_code} | {r.wall_s:.0f} | {r.load_before:.1f} → {r.load_after:.1f} | {r.winner} "
            f"| {r.winner_knobs} | {r.verdict} |"
        )
    same = agree(runs)
    print(
        f"\nagree: {'yes' if same else 'NO'} (same winner everywhere, or no run claims a measurable speedup)"
    )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
