"""How much faster one fixed-budget study ends with 1, 2 and 4 workers sharing it, and what it costs.

Each study is the real study loop (:class:`autotune.study.loop.Study`) run by N workers exactly as
``autotune search --gpus-per-trial`` runs them: N ``Study`` objects on one Optuna storage (a fresh
SQLite file per study, or the PostgreSQL server of ``--storage``), each in its own thread
(``autotune.app.workers.run_workers``), with ``shared=True`` and a worker slot each. The trials are the
search bench's simulated ones (``bench/search_efficiency.py``'s ``SimulatedExecutor`` on the
estimator-derived surfaces of ``bench/_surfaces.py`` and the independent ones of
``bench/_independent.py``), paced so they take wall time: a simulated hour of a trial lasts
``--hour-s`` seconds, start-up and each step arriving when they would, so concurrent trials overlap
and a worker's pruning callback sees the others' results as they land.

Every worker count gets the same budget (``--trials``), surface and seeds, one after the other in the
same run. Printed per surface (medians over seeds): wall time; speedup (the median over seeds of
wall(1 worker) / wall(N workers), so 1 worker is 1.00x); the share of the workers' wall time spent in
trials (the rest is the tuner and waiting); the regret of the recommendation (1 - its true usable
throughput / the surface's true optimum); trials launched; simulated GPU-hours of all trials (the cost
of parallelism: workers choose with less history); and, summed over seeds, configurations run twice
(by more than one non-duplicate trial) and trials lost (left RUNNING or WAITING in the storage, or
RUNNING on disk), and studies a worker's error ended. The last three must be 0: the bench exits 1
otherwise.

A worker's sampler seed mixes in its host, pid and slot (workers of one study must draw apart), so
the search differs between runs of the bench even for the same ``--first-seed``.

    OMP_NUM_THREADS=1 python bench/parallel_speedup.py       # 2 surfaces x 3 seeds x 1/2/4 workers
    python bench/parallel_speedup.py --storage postgresql://user@127.0.0.1/autotune --seeds 1
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _settings import SETTINGS, Setting  # noqa: E402
from search_efficiency import (  # noqa: E402
    _TITLE,
    KINDS,
    SimulatedExecutor,
    Table,
    bench_config,
    load_table,
    make_surface,
    select_settings,
)

from autotune.app.workers import run_workers as _run_workers  # noqa: E402
from autotune.backends import TrialContext  # noqa: E402
from autotune.records import TrialResult, TrialSpec, TrialStatus  # noqa: E402
from autotune.secrets import SecretRule  # noqa: E402
from autotune.space import SearchSpace, canonical_key  # noqa: E402
from autotune.strategy import launched  # noqa: E402
from autotune.study.loop import Study  # noqa: E402
from autotune.study.memory_gate import EstimatorGate  # noqa: E402
from autotune.studydir import StudyDir  # noqa: E402

WORKERS = (1, 2, 4)
# one estimator-derived and one independent surface, both small enough to build in seconds
DEFAULT_SURFACES = "trl Qwen2.5-1.5B 4xA10,trl Qwen2.5-3B full 4xA10"


# ------------------------------------------------------------------------------------------ trials
class PacedExecutor:
    """A simulated trial that takes wall time: its start-up and steps arrive when they would, a
    simulated hour lasting ``hour_s`` seconds.

    Args:
        inner: the simulated trial (what it reports).
        hour_s: wall seconds per simulated hour of a trial.
        stop: set when the study is stopped: a paced trial stops waiting at once.
        clock: the wall clock (monotonic seconds).
    """

    def __init__(
        self,
        inner: SimulatedExecutor,
        hour_s: float,
        stop: threading.Event,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self.scale = hour_s / 3600
        self.stop = stop
        self.clock = clock

    def _wait_until(self, deadline: float) -> None:
        left = deadline - self.clock()
        if left > 0:
            self.stop.wait(left)

    def execute(
        self,
        spec: TrialSpec,
        ctx: TrialContext,
        *,
        on_step: Callable[[int, float | None, float], str | None],
        time_left_s: float | None,
    ) -> TrialResult:
        t0 = self.clock()
        truth = self.inner.surface.truth(spec.params)

        def paced(step: int, throughput: float | None, optimistic: float) -> str | None:
            # the first step runs 1.5x long (the simulated executor's warm-up)
            self._wait_until(t0 + (truth.startup_s + (step + 0.5) * truth.step_s) * self.scale)
            return on_step(step, throughput, optimistic)

        result = self.inner.execute(spec, ctx, on_step=paced, time_left_s=time_left_s)
        self._wait_until(t0 + result.duration_s * self.scale)
        return result


# ------------------------------------------------------------------------------------------ runs
@dataclass(frozen=True)
class ParRun:
    """One study of one surface and seed, run by ``workers`` workers."""

    setting: str
    kind: str
    seed: int
    workers: int
    wall_s: float
    busy_share: float  # the workers' wall time spent in (paced) trials
    regret: float
    trials_run: int
    gpu_h: float  # simulated GPU-hours of every trial
    run_twice: int
    lost: int
    stopped: str
    error: str | None = None  # what ended the study when a worker raised (the product's bug)


def runs_twice(results: Sequence[TrialResult]) -> int:
    """Trials beyond the first that ran (or were pre-screened on) a configuration another trial of the
    study already had; interrupted trials say nothing and may run again."""
    done = [r for r in results if r.status not in (TrialStatus.INTERRUPTED, TrialStatus.RUNNING)]
    return sum(n - 1 for n in Counter(canonical_key(r.params) for r in done).values())


def lost_trials(results: Sequence[TrialResult], stored_states: Sequence[str]) -> int:
    """Trials a finished study left behind: RUNNING or WAITING in the storage, RUNNING on disk."""
    left = sum(1 for s in stored_states if s in ("RUNNING", "WAITING"))
    return left + sum(1 for r in results if r.status is TrialStatus.RUNNING)


def run_study(
    setting: Setting,
    space: SearchSpace,
    table: Table,
    seed: int,
    workers: int,
    budget: int,
    hour_s: float,
    workdir: Path,
    storage_url: str | None = None,
) -> ParRun:
    """One study of ``budget`` trials on the surface of ``table`` and ``seed``, run by ``workers``
    workers sharing one storage (a new SQLite file in ``workdir`` unless ``storage_url``)."""
    import optuna

    surface = make_surface(table, seed)
    _, optimum, _ = surface.optimum()
    name = f"parbench-{uuid.uuid4().hex[:12]}"
    study_dir = workdir / name
    url = storage_url or f"sqlite:///{workdir / name}.db"
    backend = setting.make_backend()
    hardware = setting.hardware()
    ctx = setting.context(study_dir / "trials" / "0")
    stop = threading.Event()
    cfg = bench_config(
        setting, study_dir, hardware, seed, "auto", budget, storage_url=url, study_name=name, shared=True
    )

    def worker(slot: int) -> Study:
        """One worker as the search job makes it: its own executor and memory gate, the study shared."""
        gate = EstimatorGate.build(
            hardware, setting.model_ref(), setting.backend, setting.fixed, lambda p: backend.derive(p, ctx)
        )
        return Study(
            dataclasses.replace(cfg, worker_slot=slot),
            backend,
            space,
            PacedExecutor(SimulatedExecutor(surface, setting.n_gpus), hour_s, stop),
            memory_gate=gate,
            interrupted=stop.is_set,
        )

    studies = [worker(slot) for slot in range(workers)]
    t0 = time.perf_counter()
    error: str | None = None
    try:
        outcome = _run_workers(studies, stop)
    except Exception as exc:  # noqa: BLE001 - a worker's failure is a finding: counted, not fatal
        outcome, error = None, f"{type(exc).__name__}: {exc}"
    wall = time.perf_counter() - t0

    results = StudyDir(study_dir).results()  # every worker's trials: they share the study directory
    stored = optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False)
    states = [t.state.name for t in stored]
    if storage_url is not None:  # a shared server keeps nothing of the bench
        optuna.delete_study(study_name=name, storage=url)
    regret = 1.0
    rec = outcome.recommendation if outcome is not None else None
    if rec is not None:
        chosen = next(r for r in results if r.number == rec.trial)
        regret = 1 - surface.usable_throughput(chosen.params) / optimum
    trial_s = sum(r.duration_s for r in results) * hour_s / 3600
    return ParRun(
        setting=setting.name,
        kind=setting.kind,
        seed=seed,
        workers=workers,
        wall_s=wall,
        busy_share=trial_s / (wall * workers) if wall > 0 else 0.0,
        regret=regret,
        trials_run=len(launched(results)),
        gpu_h=sum(r.gpu_seconds for r in results) / 3600,
        run_twice=runs_twice(results),
        lost=lost_trials(results, states),
        stopped=outcome.stopped if outcome is not None else "error",
        error=error,
    )


# ------------------------------------------------------------------------------------------ table
def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def speedups(runs: Sequence[ParRun]) -> dict[tuple[str, int], float]:
    """Per (surface, workers): the median over seeds of wall(1 worker) / wall(workers), paired by seed."""
    single = {(r.setting, r.seed): r.wall_s for r in runs if r.workers == 1}
    ratios: dict[tuple[str, int], list[float]] = {}
    for r in runs:
        base = single.get((r.setting, r.seed))
        if base is not None and r.wall_s > 0:
            ratios.setdefault((r.setting, r.workers), []).append(base / r.wall_s)
    return {key: _median(values) for key, values in ratios.items()}


def render(runs: Sequence[ParRun], budget: int, seeds: Sequence[int], hour_s: float, storage: str) -> str:
    """One table per kind of surface: medians over seeds, the run-twice and lost counts summed."""
    ratio = speedups(runs)
    lines = [
        f"parallel speedup: one study of {budget} trials run by 1, 2, 4 workers sharing one {storage} storage; "
        f"a simulated trial hour lasts {hour_s:g}s; median over {len(seeds)} seeds ({seeds[0]}..{seeds[-1]}); "
        "speedup = median over seeds of wall(1 worker) / wall(N)",
    ]
    for kind in KINDS:
        of_kind = [r for r in runs if r.kind == kind]
        if not of_kind:
            continue
        lines += [
            "",
            _TITLE[kind],
            "",
            f"| {'surface':<32} | {'workers':>7} | {'wall s':>6} | {'speedup':>7} | {'in trials':>9} | "
            f"{'regret':>6} | {'trials run':>10} | {'GPU-h (sim)':>11} | {'run twice':>9} | {'lost':>4} | {'errors':>6} |",
            f"|{'-' * 34}|{'-' * 9}|{'-' * 8}|{'-' * 9}|{'-' * 11}|{'-' * 8}|{'-' * 12}|{'-' * 13}|{'-' * 11}|{'-' * 6}|{'-' * 8}|",
        ]
        for setting in dict.fromkeys(r.setting for r in of_kind):
            for workers in sorted({r.workers for r in of_kind if r.setting == setting}):
                rows = [r for r in of_kind if r.setting == setting and r.workers == workers]
                speedup = ratio.get((setting, workers), math.nan)
                lines.append(
                    f"| {setting:<32} | {workers:>7} | {_median([r.wall_s for r in rows]):>6.1f} | "
                    f"{speedup:>6.2f}x | {_median([r.busy_share for r in rows]):>9.0%} | "
                    f"{_median([r.regret for r in rows]):>6.1%} | "
                    f"{_median([float(r.trials_run) for r in rows]):>10g} | "
                    f"{_median([r.gpu_h for r in rows]):>11.1f} | {sum(r.run_twice for r in rows):>9} | "
                    f"{sum(r.lost for r in rows):>4} | {sum(r.error is not None for r in rows):>6} |"
                )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds per surface (default 3)")
    parser.add_argument("--first-seed", type=int, default=100, help="first seed (default 100)")
    parser.add_argument("--trials", type=int, default=16, help="trial budget of every study (default 16)")
    parser.add_argument(
        "--workers", default=",".join(map(str, WORKERS)), help="comma-separated worker counts (default 1,2,4)"
    )
    parser.add_argument(
        "--hour-s",
        type=float,
        default=2.0,
        help="wall seconds a simulated hour of a trial lasts (default 2.0)",
    )
    parser.add_argument(
        "--surfaces",
        default=DEFAULT_SURFACES,
        help="comma-separated substrings of surface names, or a kind (estimator, independent); "
        f"default: {DEFAULT_SURFACES}",
    )
    parser.add_argument(
        "--storage",
        default=None,
        help="an Optuna storage URL every study goes to (e.g. postgresql://…; each study gets a new name "
        "and is deleted after it is measured); default: a new SQLite file per study",
    )
    parser.add_argument(
        "--cache", default=None, help="directory to keep the surface tables in between runs (default: none)"
    )
    parser.add_argument("--verbose", action="store_true", help="print every study")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        counts = sorted({int(w) for w in args.workers.split(",") if w.strip()})
    except ValueError:
        parser.error(f"--workers takes comma-separated integers, not {args.workers!r}")
    if not counts or counts[0] < 1:
        parser.error("--workers needs counts of at least 1")
    if 1 not in counts:
        counts.insert(0, 1)  # the speedup's reference
    if args.trials < 1 or args.seeds < 1 or args.hour_s <= 0:
        parser.error("--trials and --seeds must be at least 1, --hour-s positive")
    chosen = select_settings(args.surfaces)
    if not chosen:
        parser.error(f"no surface matches {args.surfaces!r}")
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    storage = (
        "SQLite" if args.storage is None else (SecretRule().redact_url(args.storage) or "").split(":")[0]
    )
    t_start = time.perf_counter()
    runs: list[ParRun] = []
    shm = Path("/dev/shm")  # SQLite commits on tmpfs cost no disk flush, as in the search bench
    with tempfile.TemporaryDirectory(prefix="autotune-parbench-", dir=shm if shm.is_dir() else None) as tmp:
        for index in chosen:
            setting = SETTINGS[index]
            space = setting.space()
            t0 = time.perf_counter()
            table = load_table(setting, space, Path(tmp), Path(args.cache) if args.cache else None)
            print(
                f"# {setting.name} ({setting.kind}): table in {time.perf_counter() - t0:.1f}s",
                file=sys.stderr,
            )
            for seed in seeds:
                for workers in counts:  # side by side: every count of a seed one after the other
                    run = run_study(
                        setting,
                        space,
                        table,
                        seed,
                        workers,
                        args.trials,
                        args.hour_s,
                        Path(tmp),
                        args.storage,
                    )
                    runs.append(run)
                    if args.verbose:
                        print(
                            f"  {run.setting} seed {seed} x{workers}: {run.wall_s:.1f}s regret={run.regret:.1%} "
                            f"run={run.trials_run} twice={run.run_twice} lost={run.lost} stopped={run.stopped} error={run.error}",
                            file=sys.stderr,
                            flush=True,
                        )
    print(render(runs, args.trials, seeds, args.hour_s, storage))
    for r in runs:
        if r.error is not None:
            print(f"error: {r.setting} seed {r.seed} x{r.workers}: {r.error}", file=sys.stderr)
    twice, lost = sum(r.run_twice for r in runs), sum(r.lost for r in runs)
    errors = sum(r.error is not None for r in runs)
    print(f"\n(bench wall time {time.perf_counter() - t_start:.0f}s, {len(runs)} studies)")
    if twice or lost or errors:
        print(
            f"FAILED: {twice} configuration(s) run twice, {lost} trial(s) lost, {errors} study(ies) ended by "
            "a worker's error",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
