"""The measured table beside the estimator's prediction, from what scripts/gpu_check.sh brought back.

    python scripts/gpu_table.py docs/gpu/h200-2026-11-28

Reads ``plan.json`` / ``plan-calibrated.json`` (the estimator, before and after the calibration) and the
TRL study's ``trl-study/timelines/trial-N-result.json``; prints one Markdown row per configuration.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GIB = 2**30


def _key(params: dict) -> tuple:
    return tuple(sorted(params.items()))


def main(folder: str) -> None:
    root = Path(folder)
    plans = {
        name: {_key(c["params"]): c for c in json.loads((root / f"{name}.json").read_text())["candidates"]}
        for name in ("plan", "plan-calibrated")
    }
    measured = {}
    for f in sorted((root / "trl-study" / "timelines").glob("trial-*-result.json")):
        r = json.loads(f.read_text())
        measured[_key(r["params"])] = r
    print(
        "| configuration | predicted peak GiB (raw / calibrated) | NVML peak GiB | predicted step s | "
        "measured step s | measured / predicted step |"
    )
    print("|---|---|---|---|---|---|")
    for key, cand in plans["plan"].items():
        cal = plans["plan-calibrated"].get(key, {})
        r = measured.get(key)
        peak = cand["memory"]["peak_bytes"] / GIB
        peak_cal = cal.get("memory", {}).get("peak_bytes", 0) / GIB
        step = cand["time"]["total_s"]
        label = " ".join(f"{k}={v}" for k, v in key)
        if r is None:
            print(f"| {label} | {peak:.1f} / {peak_cal:.1f} | not launched (gate) | {step:.2f} | — | — |")
            continue
        nvml = max(p for p in r["peak_mem_bytes"] if p is not None) / GIB
        got = r["steady"]["step_time_s"]
        print(
            f"| {label} | {peak:.1f} / {peak_cal:.1f} | {nvml:.1f} | {step:.2f} | {got:.2f} | {got / step:.2f} |"
        )


if __name__ == "__main__":
    main(sys.argv[1])
