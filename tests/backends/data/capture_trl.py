"""Capture a real TRL GRPO run on CPU as a recording for the backend tests (not a test itself).

    /work/venvs/main/bin/python tests/backends/data/capture_trl.py NAME [--nproc N] [--steps S]

Renders a trial with :class:`autotune.backends.trl.backend.TrlBackend` for the tiny model, runs it with one
torch thread per process, and writes ``NAME.events.jsonl`` next to this file: every stdout/stderr line
and every new line of the worker's ``metrics.jsonl`` and ``phases.jsonl``, each with its time since
launch, then the exit code and a ``meta`` line (versions, argv, measured times). The trial and model
directories are replaced by ``{trial_dir}`` and ``{model_dir}``. Replay it with ``replay.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

from inject import PHASES, injection_env

from autotune.backends._base import ModelRef, TrialContext
from autotune.backends.trl.backend import TrlBackend
from autotune.records import TrialSpec
from autotune.study.loop import free_port
from autotune.workload.tinymodels import ensure_model

HERE = Path(__file__).parent
Line = tuple[float, str, str]  # (seconds since launch, "stdout"|"stderr"|file name, text)


def _pump(stream: IO[str], name: str, t0: float, out: list[Line], lock: threading.Lock) -> None:
    for raw in iter(stream.readline, ""):
        with lock:
            out.append((time.monotonic() - t0, name, raw.rstrip("\n")))


def _tail(
    path: Path, name: str, t0: float, out: list[Line], lock: threading.Lock, done: threading.Event
) -> None:
    offset, partial = 0, ""
    while True:
        finished = done.is_set()
        if path.exists():
            with path.open(encoding="utf-8") as fh:
                fh.seek(offset)
                chunk = fh.read()
            offset += len(chunk.encode("utf-8"))
            *complete, partial = (partial + chunk).split("\n")
            now = time.monotonic() - t0
            with lock:
                out.extend((now, name, text) for text in complete)
        if finished:
            return
        time.sleep(0.005)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--pdbs", type=int, default=4)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--inject", choices=PHASES, help="fail inside this phase (see inject.py)")
    args = ap.parse_args()

    model_dir = ensure_model("tiny-qwen2")
    with tempfile.TemporaryDirectory(prefix="capture-trl-") as tmp:
        study = Path(tmp)
        trial = study / "trials" / "0"
        trial.mkdir(parents=True)
        backend = TrlBackend()
        info = backend.probe()
        ctx = TrialContext(
            study_dir=study,
            trial_dir=trial,
            model=ModelRef("tiny-qwen2", str(model_dir), local=True),
            global_batch=args.global_batch,
            num_generations=4,
            max_steps=args.steps,
            max_completion_length=16,
            master_port=free_port(),
            fixed={"beta": 0.04},
        )
        params = {"per_device_train_batch_size": args.pdbs, "num_processes": args.nproc}
        derived = backend.derive(params, ctx)
        plan = backend.render(TrialSpec(number=0, params=params, derived=derived), ctx)
        env = {**os.environ, **plan.env, "OMP_NUM_THREADS": "1"}
        if args.inject:
            env = injection_env(args.inject, study / "inject", env)
        lines: list[Line] = []
        lock = threading.Lock()
        done = threading.Event()
        t0 = time.monotonic()
        proc = subprocess.Popen(
            plan.argv, env=env, cwd=plan.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        threads = [
            threading.Thread(target=_pump, args=(proc.stdout, "stdout", t0, lines, lock)),
            threading.Thread(target=_pump, args=(proc.stderr, "stderr", t0, lines, lock)),
            threading.Thread(
                target=_tail, args=(trial / "metrics.jsonl", "metrics.jsonl", t0, lines, lock, done)
            ),
            threading.Thread(
                target=_tail, args=(trial / "phases.jsonl", "phases.jsonl", t0, lines, lock, done)
            ),
        ]
        for th in threads:
            th.start()
        rc = proc.wait()
        wall_s = time.monotonic() - t0
        done.set()
        for th in threads:
            th.join()

        def sub(text: str) -> str:
            return text.replace(str(trial), "{trial_dir}").replace(str(model_dir), "{model_dir}")

        events: list[dict[str, object]] = []
        first_step_t = None
        for t, where, text in sorted(lines, key=lambda x: x[0]):
            if where in ("stdout", "stderr"):
                events.append({"t": round(t, 4), "stream": where, "text": sub(text)})
            else:
                if where == "metrics.jsonl" and first_step_t is None:
                    first_step_t = t
                events.append({"t": round(t, 4), "file": where, "text": sub(text)})
        events.append({"t": round(wall_s, 4), "exit": rc})
        meta = {
            "source": "real run captured by tests/backends/data/capture_trl.py",
            "injected": args.inject,
            "trl": info.version,
            "versions": dict(info.extra),
            "argv": [sub(a) for a in plan.argv],
            "env": {k: sub(v) for k, v in plan.env.items() if k != "TORCH_EXTENSIONS_DIR"},
            "nproc": args.nproc,
            "steps": args.steps,
            "exit_code": rc,
            "wall_s": round(wall_s, 2),
            "launch_to_first_step_s": round(first_step_t, 2) if first_step_t is not None else None,
            "python": sys.version.split()[0],
        }
        out = HERE / f"{args.name}.events.jsonl"
        with out.open("w", encoding="utf-8") as fh:
            fh.write(json.dumps({"meta": meta}) + "\n")
            for event in events:
                fh.write(json.dumps(event) + "\n")
        print(f"{out}: exit {rc}, {wall_s:.1f} s, first step at {first_step_t} s, {len(events)} events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
