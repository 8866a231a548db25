"""Capture a real ms-swift GRPO run on CPU as a recording for the backend tests (not a test itself).

    /work/venvs/swift/bin/python tests/backends/data/capture_swift.py NAME [--nproc N] [--steps S]

Renders a trial with :class:`autotune.backends.swift.backend.SwiftBackend` for the tiny model, runs it, and
writes ``NAME.events.jsonl`` next to this file: every stdout/stderr line with its time since launch,
each ``logging.jsonl`` line placed right before the stdout line of the same record (rank 0 writes the
file before it prints), the exit code, and a ``meta`` line (versions, argv, measured times). The trial
directory and the model directory are replaced by ``{trial_dir}`` and ``{model_dir}``. Replay it with
``replay.py``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from inject import PHASES, injection_env

from autotune.backends._base import ModelRef, TrialContext
from autotune.backends._loglines import parse_dict_literal
from autotune.backends.swift._log import STEP_KEY
from autotune.backends.swift.backend import SwiftBackend
from autotune.records import TrialSpec
from autotune.workload.tinymodels import ensure_model

HERE = Path(__file__).parent


def _pump(stream, name: str, t0: float, out: list[tuple[float, str, str]], lock: threading.Lock) -> None:
    for raw in iter(stream.readline, ""):
        with lock:
            out.append((time.monotonic() - t0, name, raw.rstrip("\n")))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--pdbs", type=int, default=4)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--inject", choices=PHASES, help="fail inside this phase (see inject.py)")
    args = ap.parse_args()

    model_dir = ensure_model("tiny-qwen2")
    with tempfile.TemporaryDirectory(prefix="capture-swift-") as tmp:
        study = Path(tmp)
        trial = study / "trials" / "0"
        trial.mkdir(parents=True)
        backend = SwiftBackend(cpu_threads=1)
        info = backend.probe()
        ctx = TrialContext(
            study_dir=study,
            trial_dir=trial,
            model=ModelRef("tiny-qwen2", str(model_dir), local=True),
            global_batch=args.global_batch,
            num_generations=4,
            max_steps=args.steps,
            max_completion_length=16,
            master_port=29561,
        )
        params = {
            "per_device_train_batch_size": args.pdbs,
            "gradient_checkpointing": True,
            "dataloader_num_workers": 0,
            "num_processes": args.nproc,
        }
        derived = backend.derive(params, ctx)
        plan = backend.render(TrialSpec(number=0, params=params, derived=derived), ctx)
        env = dict(os.environ)
        for key in plan.unset_env:
            env.pop(key, None)
        env.update(plan.env)
        if args.inject:
            env = injection_env(args.inject, study / "inject", env)
        lines: list[tuple[float, str, str]] = []
        lock = threading.Lock()
        t0 = time.monotonic()
        proc = subprocess.Popen(
            plan.argv, env=env, cwd=plan.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        threads = [
            threading.Thread(target=_pump, args=(proc.stdout, "stdout", t0, lines, lock)),
            threading.Thread(target=_pump, args=(proc.stderr, "stderr", t0, lines, lock)),
        ]
        for th in threads:
            th.start()
        rc = proc.wait()
        for th in threads:
            th.join()
        wall_s = time.monotonic() - t0
        jsonl = [
            json.loads(x) for x in (trial / "output" / "logging.jsonl").read_text().splitlines() if x.strip()
        ]

        def sub(text: str) -> str:
            return text.replace(str(trial), "{trial_dir}").replace(str(model_dir), "{model_dir}")

        events: list[dict] = []
        placed: set[int] = set()
        first_step_t = None
        for t, stream, text in sorted(lines, key=lambda x: x[0]):
            record = parse_dict_literal(text) if STEP_KEY in text else None
            if record is not None:
                first_step_t = first_step_t if first_step_t is not None else t
                for i, rec in enumerate(jsonl):
                    same = rec.get(STEP_KEY) == record.get(STEP_KEY) and ("train_runtime" in rec) == (
                        "train_runtime" in record
                    )
                    if i not in placed and same:
                        events.append(
                            {"t": round(t, 4), "file": "output/logging.jsonl", "text": sub(json.dumps(rec))}
                        )
                        placed.add(i)
                        break
            events.append({"t": round(t, 4), "stream": stream, "text": sub(text)})
        last_t = events[-1]["t"] if events else 0.0
        for i, rec in enumerate(jsonl):
            if i not in placed:  # the end-of-run summary, written before the process exits
                events.append({"t": last_t, "file": "output/logging.jsonl", "text": sub(json.dumps(rec))})
        events.append({"t": round(wall_s, 4), "exit": rc})
        meta = {
            "source": "real run captured by tests/backends/data/capture_swift.py",
            "injected": args.inject,
            "ms_swift": info.version,
            "versions": {k: v for k, v in info.extra.items() if k != "python"},
            "torch": importlib.metadata.version("torch"),
            "argv": [sub(a) for a in plan.argv],
            "env": plan.env | {"MODELSCOPE_CACHE": "{study_dir}/cache/modelscope"},
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
            for ev in events:
                fh.write(json.dumps(ev, ensure_ascii=False) + "\n")
        print(json.dumps(meta, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
