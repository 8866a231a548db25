"""Mutation testing of autotune's core: which changes to the code its own unit tests let through.

Each target module is mutated by mutmut (``pip install -e '.[dev]'``) in a scratch copy of the
repository and run against its own fast unit tests only (the table below), one module at a time so the
machine stays usable. A *surviving* mutant is a change to the code that no test notices: a missing
test, or a change that means the same thing (an equivalent mutant). The report gives, per module,
the mutants killed, survived, with no test reaching them, and timed out, and the score
killed ÷ (killed + survived + no tests).

Usage (from the repository root)::

    python bench/mutation.py                            # every target, 2 test processes
    python bench/mutation.py --targets secrets,verdict  # some of them
    python bench/mutation.py --show-survivors           # list each survivor (``mutmut show NAME`` in
                                                        # the kept scratch copy prints its diff)
    python bench/mutation.py --json results.json

The scratch copies go to ``--work`` (a temporary folder unless given; given, they are kept, so
``cd WORK/TARGET && mutmut show NAME`` works afterwards).
"""

from __future__ import annotations

import argparse
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

ROOT = Path(__file__).resolve().parent.parent
MUTMUT = Path(sys.executable).with_name("mutmut")


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


#: what ``--targets`` offers; ``estimate`` is the whole package against all its unit tests (long: about
#: 4,400 mutants), ``memory`` its memory model alone against the memory tests
TARGETS: tuple[Target, ...] = (
    Target(
        "secrets",
        ("autotune/secrets.py",),
        ("tests/test_secrets.py", "tests/test_secrets_rules.py", "tests/reports/test_report_safety.py"),
    ),
    Target("verdict", ("autotune/study/verdict.py",), ("tests/study/test_verdict.py",)),
    Target("blame", ("autotune/strategy/_blame.py",), ("tests/strategy/test_blame.py",)),
    Target("inference", ("autotune/strategy/_inference.py",), ("tests/strategy/test_inference.py",)),
    Target(
        "outcome",
        ("autotune/trial/outcome.py",),
        ("tests/trial/test_outcome.py",),
    ),
    Target(
        "memory",
        ("autotune/estimate/memory.py",),
        ("tests/estimate/test_memory_exact.py", "tests/estimate/test_memory.py"),
    ),
    Target(
        "estimate",
        ("autotune/estimate/*",),
        (
            "tests/estimate/test_memory_exact.py",
            "tests/estimate/test_memory.py",
            "tests/estimate/test_timing.py",
            "tests/estimate/test_calibrate.py",
            "tests/estimate/test_catalog.py",
            "tests/estimate/test_shape.py",
            "tests/estimate/test_planning.py",
            "tests/estimate/test_plan_columns.py",
            "tests/estimate/test_states_torch.py",
        ),
    ),
)
BY_NAME = {t.name: t for t in TARGETS}
_RESULT = re.compile(r"^\s*(?P<name>\S+): (?P<status>.+?)\s*$")


@dataclass
class TargetReport:
    """What mutmut found for one target."""

    name: str
    counts: dict[str, int]
    survivors: list[str] = field(default_factory=list)
    no_tests: list[str] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def score(self) -> float | None:
        judged = (
            self.counts.get("killed", 0) + self.counts.get("survived", 0) + self.counts.get("no tests", 0)
        )
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
        [str(MUTMUT), "results", "--all", "true"], cwd=dest, check=True, capture_output=True, text=True
    ).stdout
    found = []
    for line in out.splitlines():
        m = _RESULT.match(line)
        if m:
            found.append((m["name"], m["status"]))
    return found


def run_target(target: Target, work: Path, children: int, log: Path | None) -> TargetReport:
    """Mutate one target in a fresh copy under ``work`` and collect its mutants' fates."""
    dest = work / target.name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    _copy_repository(dest)
    _write_config(dest, target)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    with open(log or os.devnull, "a", encoding="utf-8") as sink:
        subprocess.run(
            [str(MUTMUT), "run", "--max-children", str(children)],
            cwd=dest,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            check=False,
        )
    duration_s = time.monotonic() - started
    results = _results(dest)
    counts = Counter(status for _, status in results)
    return TargetReport(
        name=target.name,
        counts=dict(counts),
        survivors=sorted(n for n, s in results if s == "survived"),
        no_tests=sorted(n for n, s in results if s == "no tests"),
        duration_s=duration_s,
    )


def _table(reports: list[TargetReport]) -> str:
    head = f"{'target':<10} {'mutants':>7} {'killed':>6} {'survived':>8} {'no tests':>8} {'timeout':>7} {'score':>6}"
    lines = [head, "-" * len(head)]
    for r in reports:
        total = sum(r.counts.values())
        score = f"{r.score:.0%}" if r.score is not None else "-"
        lines.append(
            f"{r.name:<10} {total:>7} {r.counts.get('killed', 0):>6} {r.counts.get('survived', 0):>8} "
            f"{r.counts.get('no tests', 0):>8} {r.counts.get('timeout', 0):>7} {score:>6}"
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
    ap.add_argument("--show-survivors", action="store_true", help="list every surviving mutant")
    args = ap.parse_args(argv)
    unknown = [n for n in args.targets.split(",") if n and n not in BY_NAME]
    if unknown:
        ap.error(f"unknown target {unknown[0]!r}; known: {', '.join(BY_NAME)}")
    if not MUTMUT.exists():
        ap.error(f"mutmut is not installed beside {sys.executable}: pip install -e '.[dev]'")
    targets = [BY_NAME[n] for n in args.targets.split(",") if n]
    work = args.work or Path(tempfile.mkdtemp(prefix="autotune-mutation-"))
    reports = []
    try:
        for target in targets:  # one at a time: the machine stays usable
            print(
                f"mutating {target.name} ({', '.join(target.mutate)}) against {len(target.tests)} test files"
            )
            report = run_target(target, work, args.children, work / f"{target.name}.log")
            reports.append(report)
            print(_table([report]).splitlines()[-1], f"({report.duration_s:.0f} s)", flush=True)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(_table(reports))
    if args.show_survivors:
        for r in reports:
            for name in r.survivors:
                print(f"survived  {name}")
            for name in r.no_tests:
                print(f"no tests  {name}")
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) | {"score": r.score} for r in reports], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
