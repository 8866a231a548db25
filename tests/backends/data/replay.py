"""Replay a recorded (or scripted) trial: its output lines, its metric-file lines, and its end.

Run as a trial's process by the backend conformance suite (``tests/backends/conformance.py``)::

    python replay.py <recording.jsonl> <trial_dir> [--time-scale X]

Standard library only. A recording is JSON lines; each line is one event:

- ``{"meta": {...}}`` — ignored (describes where the recording came from);
- ``{"stream": "stdout"|"stderr", "text": "..."}`` — print ``text`` and a newline to that stream
  (``text`` may hold carriage returns, as tqdm writes them);
- ``{"file": "relative/path", "text": "..."}`` — append ``text`` and a newline to that file in the
  trial directory (created with its folders);
- ``{"sleep": seconds}`` — wait;
- ``{"exit": code}`` — exit with that code; ``{"signal": N}`` — kill this process with signal N;
  ``{"hang": true}`` — sleep forever, printing nothing.

``{trial_dir}`` in any text is replaced by the trial directory. Events may carry ``"t"`` (seconds since
the recorded launch); with ``--time-scale X`` the replay waits ``X`` × the recorded gaps (default 0: as
fast as possible, keeping only explicit ``sleep`` events).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recording", type=Path)
    ap.add_argument("trial_dir", type=Path)
    ap.add_argument("--time-scale", type=float, default=0.0)
    args = ap.parse_args(argv)
    trial_dir = str(args.trial_dir)
    last_t: float | None = None
    for raw in args.recording.read_text(encoding="utf-8").splitlines():
        if not raw.strip():
            continue
        event = json.loads(raw)
        if "meta" in event:
            continue
        t = event.get("t")
        if args.time_scale > 0 and t is not None:
            if last_t is not None and t > last_t:
                time.sleep((t - last_t) * args.time_scale)
            last_t = t
        text = str(event.get("text", "")).replace("{trial_dir}", trial_dir)
        if "stream" in event:
            out = sys.stdout if event["stream"] == "stdout" else sys.stderr
            out.write(text + "\n")
            out.flush()
        elif "file" in event:
            path = Path(trial_dir) / event["file"]
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as fh:
                fh.write(text + "\n")
        elif "sleep" in event:
            time.sleep(float(event["sleep"]))
        elif "exit" in event:
            return int(event["exit"])
        elif "signal" in event:
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), int(event["signal"]))
            time.sleep(5)  # a signal whose default action does not end us: fall through
        elif event.get("hang"):
            while True:
                time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
