"""Mutation testing of autotune's core: which changes to the code its own unit tests let through.

Each target module is mutated by mutmut (``pip install -e '.[dev]'``) in a scratch copy of the
repository and run against its own fast unit tests only (the table below), one module at a time so the
machine stays usable. A *surviving* mutant is a change to the code that no test notices: a missing
test, or a change that means the same thing (an equivalent mutant). The report gives, per module,
the mutants killed, survived, with no test reaching them, and timed out. A survivor listed in
``bench/mutation_equivalent/TARGET.toml`` (its mutmut name, the mutated line, and why it changes nothing) is
counted apart as *explained*, once the mutated line still matches (a stale entry explains nothing); the
score is killed ÷ (killed + unexplained survivors + no tests).

Usage (from the repository root)::

    python bench/mutation.py                            # every target, 2 test processes
    python bench/mutation.py --targets secrets,verdict  # some of them
    python bench/mutation.py --show-survivors           # each unexplained survivor and its mutated line
    python bench/mutation.py --work DIR --no-run        # report again on the copies a run kept in DIR
    python bench/mutation.py --json results.json

The scratch copies go to ``--work`` (a temporary folder unless given; given, they are kept, so
``cd WORK/TARGET && mutmut show NAME`` works afterwards). A folder
under ``--work`` named after a target that this script did not make is refused, never replaced.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
#: mutmut run by this interpreter (its console script may live in another venv that a .pth line shares)
MUTMUT = (sys.executable, "-m", "mutmut")


@dataclass(frozen=True)
class Target:
    """One module (or package) to mutate and the unit tests that are its own.

    Attributes:
        name: what ``--targets`` calls it.
        mutate: mutmut ``only_mutate`` patterns, paths from the repository root.
        tests: the test files (or ``file::test`` ids) run against each mutant.
    """

    name: str
    mutate: tuple[str, ...]
    tests: tuple[str, ...]


#: the estimator's unit tests and the few outside ``tests/estimate`` that call it through the CLI or a
#: study (mutmut runs, for each mutant, only the tests that reach the mutated function)
ESTIMATE_TESTS: tuple[str, ...] = (
    "tests/estimate",
    "tests/doctor/test_calibration_table.py",
    "tests/doctor/test_bench.py",
    "tests/cli/test_plan_ceiling.py",
    "tests/study/test_trial_ceiling.py",
)

#: what ``--targets`` offers; ``memory`` is the memory model against the memory tests, and each other
#: module of ``autotune/estimate`` (``plan`` with its columns, ``calibrate`` with the machine's table) is
#: its own target against all the estimator's tests
TARGETS: tuple[Target, ...] = (
    Target(
        "secrets",
        ("autotune/secrets.py",),
        ("tests/test_secrets.py", "tests/test_secrets_rules.py", "tests/reports/test_report_safety.py"),
    ),
    Target(
        "verdict",
        ("autotune/study/verdict.py", "autotune/recommend.py"),  # the verdict's sentences live in recommend
        (
            "tests/study/test_verdict.py",
            "tests/study/test_recommend_need.py",
            "tests/study/test_recommend_headroom.py",
        ),
    ),
    Target("blame", ("autotune/strategy/_blame.py",), ("tests/strategy/test_blame.py",)),
    Target("inference", ("autotune/strategy/_inference.py",), ("tests/strategy/test_inference.py",)),
    Target(
        "outcome",
        ("autotune/trial/outcome.py",),
        ("tests/trial/test_outcome.py", "tests/trial/test_outcome_exact.py"),
    ),
    Target(
        "memory",
        ("autotune/estimate/memory.py", "autotune/estimate/states.py"),  # states: memory's model states
        (
            "tests/estimate/test_memory_exact.py",
            "tests/estimate/test_memory.py",
            "tests/estimate/test_memory_columns.py",
            "tests/estimate/test_memory_exact_vllm.py",
        ),
    ),
    *(
        Target(name, tuple(f"autotune/estimate/{m}.py" for m in modules), ESTIMATE_TESTS)
        for name, modules in (
            ("shape", ("shape",)),
            ("vec", ("_vec",)),
            ("calibrate", ("calibrate", "machine_table")),
            ("timing", ("timing",)),
            ("peaks", ("peaks",)),
            ("ceiling", ("ceiling",)),
            ("catalog", ("catalog",)),
            ("plan", ("plan", "columns")),
        )
    ),
)
BY_NAME = {t.name: t for t in TARGETS}
_RESULT = re.compile(r"^\s*(?P<name>\S+): (?P<status>.+?)\s*$")
#: one file of explained survivors per target (``memory.toml``...), so work on one target touches one file
EQUIVALENT = ROOT / "bench" / "mutation_equivalent"
#: the mutated lines of some mutants, read by mutmut itself in the scratch copy (``mutmut show`` would
#: start one process per mutant); prints {name: diff} as JSON
_DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
print(json.dumps({n: get_diff_for_mutant(n) for n in json.load(sys.stdin)}))
"""


@dataclass(frozen=True)
class Equivalent:
    """A surviving mutant that means what the code means, and why.

    Attributes:
        mutant: mutmut's name for it (``autotune.study.verdict.x_judge__mutmut_30``).
        changed: the mutated line as ``mutmut show`` prints it after ``+``, stripped; when the code moves
            and the name comes to mean another mutant, this no longer matches and the entry is stale.
        reason: one line on why no test can tell the mutant from the code.
    """

    mutant: str
    changed: str
    reason: str


def load_equivalents(path: Path = EQUIVALENT) -> dict[str, Equivalent]:
    """The explained survivors by mutant name, from one TOML file or every ``*.toml`` of a folder (empty
    when there is none)."""
    files = sorted(path.glob("*.toml")) if path.is_dir() else [path] if path.exists() else []
    entries = [e for f in files for e in tomllib.loads(f.read_text(encoding="utf-8")).get("equivalent", [])]
    return {e["mutant"]: Equivalent(e["mutant"], e["changed"].strip(), e["reason"]) for e in entries}


def mutated_lines(diff: str) -> list[str]:
    """The added lines of a mutmut diff, stripped (the ``+++`` header left out)."""
    return [ln[1:].strip() for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]


@dataclass
class TargetReport:
    """What mutmut found for one target."""

    name: str
    counts: dict[str, int]
    survivors: list[str] = field(default_factory=list)
    no_tests: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    explained: list[str] = field(default_factory=list)
    #: the mutated line of each unexplained survivor (and of each stale entry), by name
    changed: dict[str, str] = field(default_factory=dict)
    stale: list[str] = field(default_factory=list)

    @property
    def unexplained(self) -> list[str]:
        return [n for n in self.survivors if n not in self.explained]

    @property
    def score(self) -> float | None:
        judged = self.counts.get("killed", 0) + len(self.unexplained) + self.counts.get("no tests", 0)
        return self.counts.get("killed", 0) / judged if judged else None


def _copy_repository(dest: Path) -> None:
    """The repository's tracked and unignored files (what a clean clone plus this work tree holds)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for raw in listed:
        if not raw:
            continue
        rel = Path(os.fsdecode(raw))
        src = ROOT / rel
        if not src.is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)


#: the file that marks a folder as this script's scratch copy: only a folder holding it is ever replaced
COPY_MARK = ".autotune-mutation-copy"


def fresh_copy_dir(dest: Path) -> None:
    """An empty ``dest`` for a scratch copy, marked as one; a ``dest`` that holds something else (a
    folder of the user's under ``--work``) is refused and left as it is (SystemExit with the fix)."""
    if dest.exists():
        if not (dest / COPY_MARK).is_file():
            raise SystemExit(
                f"{dest} exists and is not a scratch copy this script made: give another --work folder"
            )
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    (dest / COPY_MARK).write_text("a scratch copy of bench/mutation.py; its next run replaces it\n")


def _write_config(dest: Path, target: Target) -> None:
    def block(key: str, values: tuple[str, ...]) -> str:
        return f"{key}=" + "\n    ".join(values) + "\n"

    # everything else the tests read (search spaces, fixtures, the other top-level packages) beside
    # the mutated copy mutmut runs them in
    others = tuple(sorted(p.name for p in dest.iterdir() if p.name not in ("autotune", "tests", "setup.cfg")))
    (dest / "setup.cfg").write_text(
        "[mutmut]\n"
        + block("source_paths", ("autotune",))
        + block("also_copy", others)
        + block("only_mutate", target.mutate)
        + block("pytest_add_cli_args_test_selection", target.tests)
        + block("pytest_add_cli_args", ("-q", "-p", "no:cacheprovider", "-x"))
    )


def _results(dest: Path) -> list[tuple[str, str]]:
    out = subprocess.run(
        [*MUTMUT, "results", "--all", "true"], cwd=dest, check=True, capture_output=True, text=True
    ).stdout
    found = []
    for line in out.splitlines():
        m = _RESULT.match(line)
        if m:
            found.append((m["name"], m["status"]))
    return found


def _diffs(dest: Path, names: list[str]) -> dict[str, str]:
    if not names:
        return {}
    out = subprocess.run(
        [sys.executable, "-c", _DIFFS],
        cwd=dest,
        input=json.dumps(names),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    diffs: dict[str, str] = json.loads(out)
    return diffs


def run_target(
    target: Target, work: Path, children: int, log: Path | None, *, run: bool = True, show: bool = False
) -> TargetReport:
    """Mutate one target in a fresh copy under ``work`` and collect its mutants' fates.

    Args:
        run: False to only read the results a previous run left in ``work``.
        show: read the mutated line of every unexplained survivor too (not only of the listed ones).
    """
    dest = work / target.name
    duration_s = 0.0
    if run:
        fresh_copy_dir(dest)
        _copy_repository(dest)
        _write_config(dest, target)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        started = time.monotonic()
        with open(log or os.devnull, "a", encoding="utf-8") as sink:
            subprocess.run(
                [*MUTMUT, "run", "--max-children", str(children)],
                cwd=dest,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                check=False,
            )
        duration_s = time.monotonic() - started
    results = _results(dest)
    counts = Counter(status for _, status in results)
    survivors = sorted(n for n, s in results if s == "survived")
    listed = load_equivalents()
    wanted = [n for n in survivors if show or n in listed]
    changed = {n: " | ".join(mutated_lines(d)) for n, d in _diffs(dest, wanted).items()}
    explained = [n for n in survivors if n in listed and changed.get(n) == listed[n].changed]
    return TargetReport(
        name=target.name,
        counts=dict(counts),
        survivors=survivors,
        no_tests=sorted(n for n, s in results if s == "no tests"),
        duration_s=duration_s,
        explained=explained,
        changed={n: c for n, c in changed.items() if n not in explained},
        stale=[n for n in survivors if n in listed and n not in explained],
    )


def _table(reports: list[TargetReport]) -> str:
    head = (
        f"{'target':<10} {'mutants':>7} {'killed':>6} {'survived: explained':>19} {'unexplained':>11}"
        f" {'no tests':>8} {'timeout':>7} {'score':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in reports:
        total = sum(r.counts.values())
        score = f"{r.score:.1%}" if r.score is not None else "-"
        lines.append(
            f"{r.name:<10} {total:>7} {r.counts.get('killed', 0):>6} {len(r.explained):>19}"
            f" {len(r.unexplained):>11} {r.counts.get('no tests', 0):>8} {r.counts.get('timeout', 0):>7}"
            f" {score:>7}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--targets",
        default=",".join(BY_NAME),
        help=f"comma-separated, of: {', '.join(BY_NAME)} (default: all)",
    )
    ap.add_argument("--children", type=int, default=2, help="test processes mutmut runs at once")
    ap.add_argument("--work", type=Path, default=None, help="where the scratch copies go (kept when given)")
    ap.add_argument("--json", type=Path, default=None, help="write the counts and survivors here")
    ap.add_argument(
        "--show-survivors", action="store_true", help="list every unexplained survivor and its mutated line"
    )
    ap.add_argument(
        "--no-run", action="store_true", help="only report on the copies an earlier run kept in --work"
    )
    args = ap.parse_args(argv)
    unknown = [n for n in args.targets.split(",") if n and n not in BY_NAME]
    if unknown:
        ap.error(f"unknown target {unknown[0]!r}; known: {', '.join(BY_NAME)}")
    if importlib.util.find_spec("mutmut") is None:
        ap.error(f"mutmut is not importable by {sys.executable}: pip install -e '.[dev]'")
    if args.no_run and args.work is None:
        ap.error("--no-run reads the copies of an earlier run: give its --work DIR")
    targets = [BY_NAME[n] for n in args.targets.split(",") if n]
    work = args.work or Path(tempfile.mkdtemp(prefix="autotune-mutation-"))
    reports = []
    try:
        for target in targets:  # one at a time: the machine stays usable
            print(
                f"mutating {target.name} ({', '.join(target.mutate)}) against {len(target.tests)} test files"
            )
            report = run_target(
                target,
                work,
                args.children,
                work / f"{target.name}.log",
                run=not args.no_run,
                show=args.show_survivors,
            )
            reports.append(report)
            print(_table([report]).splitlines()[-1], f"({report.duration_s:.0f} s)", flush=True)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(_table(reports))
    for r in reports:
        for name in r.stale:
            print(f"stale entry in {EQUIVALENT.name}/: {name} now changes {r.changed.get(name, '?')!r}")
    if args.show_survivors:
        for r in reports:
            for name in r.unexplained:
                print(f"survived  {name}  {r.changed.get(name, '')}")
            for name in r.no_tests:
                print(f"no tests  {name}")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                [asdict(r) | {"score": r.score, "unexplained": r.unexplained} for r in reports], indent=2
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
