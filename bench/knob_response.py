"""Do TRL knobs move real throughput? Real GRPO trials of a tiny local model, side by side.

Renders each configuration with :class:`~autotune.backends.trl.backend.TrlBackend` into a temporary directory,
runs the launch plan as a subprocess (one process, one torch thread), reads ``metrics.jsonl`` as it grows
and drops the first steps as warm-up. Configurations are interleaved (round 1: A B C, round 2: A B C, ...)
and every ratio is taken between neighbours of one round, then the median over rounds.

Two clocks per steady step:

- wall: the worker's own step duration → completions/s and tokens/s, what a user gets;
- CPU: the trial process's user+system CPU seconds between two step records (read by this script from
  the process while it runs). With one thread it is the step's cost without the waiting, so it stays put
  when other work shares the machine, where wall time does not.

TRL generates the whole generation batch (= the global batch) at once whatever the per-device batch, so
these knobs act on the train phase; the rollout phase does the same work in every trial, and the spread
of its wall time (from the worker's phase markers) is printed as the machine's noise.

    python bench/knob_response.py                       # small-qwen2, 3 rounds, 10 steps (≈ 3 min)
    python bench/knob_response.py --model medium-qwen2 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from autotune.backends import ModelRef, TrialContext
from autotune.backends.trl.backend import TrlBackend
from autotune.records import TrialSpec
from autotune.workload.tinymodels import ensure_model

CONFIGS: dict[str, dict[str, object]] = {
    "bs4": {"per_device_train_batch_size": 4, "gradient_checkpointing": False},
    "bs16": {"per_device_train_batch_size": 16, "gradient_checkpointing": False},
    "bs16+ckpt": {"per_device_train_batch_size": 16, "gradient_checkpointing": True},
}
POLL_S = 0.005


@dataclass(frozen=True)
class Run:
    """One trial's steady state (medians over its steady steps)."""

    name: str
    round: int
    completions_per_s: float  # wall clock
    tokens_per_s: float
    completions_per_cpu_s: float  # CPU clock
    rollout_s: float | None  # wall seconds per step in each phase (phase markers)
    train_s: float | None
    steady_steps: int
    trial_s: float


def phase_medians(path: Path, first_step: int) -> tuple[float | None, float | None]:
    """Median seconds per step spent in rollout and in train, over steps ≥ ``first_step``."""
    if not path.exists():
        return None, None
    per_step: dict[tuple[str, int], float] = {}
    opened: dict[str, float] = {}
    for line in path.read_text().splitlines():
        marker = json.loads(line)
        step, phase = marker.get("step"), marker["phase"]
        if marker["event"] == "begin":
            opened[phase] = marker["t_mono_s"]
        elif phase in opened and step is not None and step >= first_step:
            key = (phase, step)
            per_step[key] = per_step.get(key, 0.0) + marker["t_mono_s"] - opened.pop(phase)

    def median(phase: str) -> float | None:
        values = [v for (p, _), v in per_step.items() if p == phase]
        return statistics.median(values) if values else None

    return median("rollout"), median("train")


def run_one(
    backend: TrlBackend, name: str, round_: int, ctx: TrialContext, *, warmup: int, threads: int
) -> Run:
    params = dict(CONFIGS[name])
    spec = TrialSpec(number=int(ctx.trial_dir.name), params=params, derived=backend.derive(params, ctx))
    plan = backend.render(spec, ctx)
    env = {**os.environ, **plan.env, "OMP_NUM_THREADS": str(threads)}
    parser = backend.parser(spec, ctx)
    cpu_at_step: dict[int, float] = {}
    t0 = time.monotonic()
    with (ctx.trial_dir / "stdout.log").open("w") as out, (ctx.trial_dir / "stderr.log").open("w") as err:
        proc = subprocess.Popen(list(plan.argv), cwd=plan.cwd, env=env, stdout=out, stderr=err)
        ps = psutil.Process(proc.pid)
        steps = []
        while proc.poll() is None:
            new = parser.poll(time.monotonic(), time.time())
            if new:
                try:
                    cpu = ps.cpu_times()
                except psutil.NoSuchProcess:
                    break
                for step in new:
                    cpu_at_step[step.step] = cpu.user + cpu.system
                steps += new
            time.sleep(POLL_S)
        steps += parser.finish(time.monotonic(), time.time())
    trial_s = time.monotonic() - t0
    if proc.returncode != 0:
        tail = (ctx.trial_dir / "stderr.log").read_text(errors="replace")[-2000:]
        raise SystemExit(f"trial {name} failed with exit code {proc.returncode}:\n{tail}")
    steady = steps[warmup:]
    if len(steady) < 3:
        raise SystemExit(f"trial {name}: only {len(steady)} steady steps; raise --steps")
    # medians, not means: the machine may be shared, and a neighbour's burst should not decide
    step_s = statistics.median(s.duration_s for s in steady if s.duration_s)
    samples = statistics.median(s.samples or 0 for s in steady)
    tokens = statistics.median(s.tokens or 0.0 for s in steady)
    cpu_s = statistics.median(
        cpu_at_step[s.step] - cpu_at_step[s.step - 1]
        for s in steady
        if s.step in cpu_at_step and s.step - 1 in cpu_at_step
    )
    rollout_s, train_s = phase_medians(Path(plan.env["AUTOTUNE_PHASES_FILE"]), warmup + 1)
    return Run(
        name,
        round_,
        samples / step_s,
        tokens / step_s,
        samples / cpu_s,
        rollout_s,
        train_s,
        len(steady),
        trial_s,
    )


def _s(value: float | None) -> str:
    return f"{value:.3f} s" if value is not None else "n/a"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small-qwen2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10, help="optimizer steps per trial")
    ap.add_argument("--warmup", type=int, default=2, help="steps dropped at the start of each trial")
    ap.add_argument("--completion-tokens", type=int, default=16)
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--num-generations", type=int, default=4)
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads per trial (the machine may be shared)"
    )
    args = ap.parse_args()

    model = ensure_model(args.model)
    backend = TrlBackend()
    info = backend.probe()
    load_before = os.getloadavg()[0]
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="knob-response-") as tmp:
        study = Path(tmp)
        for rnd in range(1, args.rounds + 1):
            for name in CONFIGS:
                trial_dir = study / "trials" / str(len(runs))
                trial_dir.mkdir(parents=True)
                ctx = TrialContext(
                    study_dir=study,
                    trial_dir=trial_dir,
                    model=ModelRef(args.model, str(model), local=True),
                    global_batch=args.global_batch,
                    num_generations=args.num_generations,
                    max_steps=args.steps,
                    max_completion_length=args.completion_tokens,
                )
                run = run_one(backend, name, rnd, ctx, warmup=args.warmup, threads=args.threads)
                runs.append(run)
                print(
                    f"round {rnd} {name:10s} wall {run.completions_per_s:6.1f} completions/s "
                    f"{run.tokens_per_s:7.1f} tokens/s | cpu {run.completions_per_cpu_s:6.1f} completions/cpu-s | "
                    f"rollout {_s(run.rollout_s)} train {_s(run.train_s)} per step "
                    f"({run.steady_steps} steady steps, trial {run.trial_s:.1f} s)",
                    flush=True,
                )

    print()
    print(
        f"model {args.model}, trl {info.version}, torch {info.extra.get('torch')}, "
        f"{args.global_batch} completions × {args.completion_tokens} tokens per step, {args.rounds} rounds, "
        f"warm-up {args.warmup} of {args.steps} steps dropped, {args.threads} thread(s), "
        f"{len(os.sched_getaffinity(0))} cores, load average {load_before:.1f} → {os.getloadavg()[0]:.1f}"
    )
    for name in CONFIGS:
        mine = [r for r in runs if r.name == name]
        print(
            f"  {name:10s} wall {statistics.median(r.completions_per_s for r in mine):6.1f} completions/s "
            f"{statistics.median(r.tokens_per_s for r in mine):7.1f} tokens/s | "
            f"cpu {statistics.median(r.completions_per_cpu_s for r in mine):6.1f} completions/cpu-s (medians)"
        )

    def paired(num: str, den: str, attr: str) -> list[float]:
        """``num`` ÷ ``den`` within each round (neighbours in time share the machine's load)."""
        out = []
        for k in range(1, args.rounds + 1):
            a = getattr(next(r for r in runs if r.round == k and r.name == num), attr)
            b = getattr(next(r for r in runs if r.round == k and r.name == den), attr)
            if a and b:
                out.append(a / b)
        return out

    def show(label: str, num: str, den: str) -> None:
        wall = paired(num, den, "completions_per_s")
        cpu = paired(num, den, "completions_per_cpu_s")
        train = paired(den, num, "train_s")  # seconds inverted, so > 1 means faster like throughput
        line = (
            f"ratio {label}: wall {statistics.median(wall):.2f}x (rounds {', '.join(f'{x:.2f}' for x in wall)}), "
            f"cpu {statistics.median(cpu):.2f}x (rounds {', '.join(f'{x:.2f}' for x in cpu)})"
        )
        if train:
            line += f", train phase wall {statistics.median(train):.2f}x"
        print(line)

    show("per-device batch 16 / 4 (checkpointing off)", "bs16", "bs4")
    show("gradient checkpointing on / off (batch 16) ", "bs16+ckpt", "bs16")
    rollouts = [r.rollout_s for r in runs if r.rollout_s]
    if rollouts:
        print(
            f"noise: the rollout phase (identical work in every trial) took {min(rollouts):.3f}–"
            f"{max(rollouts):.3f} s per step ({max(rollouts) / min(rollouts):.2f}x spread in wall time)"
        )
    print("regenerate: " + shlex.join([Path(sys.executable).name, "bench/knob_response.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
