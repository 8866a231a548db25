"""The mutation script's bookkeeping (no mutmut run): how it reads a mutant's changed line and the
list of survivors explained as equivalent."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import mutation  # noqa: E402

DIFF = """--- autotune/study/verdict.py
+++ autotune/study/verdict.py
@@ -25,7 +25,7 @@
     means = [statistics.fmean(r.log_time for r in g) for g in groups]
-    ss = sum(x for x in y)
+    ss = sum(x for x in z)
+    more = 1
"""


def test_the_changed_lines_are_the_added_ones_without_the_header() -> None:
    assert mutation.mutated_lines(DIFF) == ["ss = sum(x for x in z)", "more = 1"]


def test_an_explanation_is_read_with_its_line_and_reason(tmp_path: Path) -> None:
    listed = tmp_path / "eq.toml"
    listed.write_text(
        '[[equivalent]]\nmutant = "autotune.secrets.x_f__mutmut_1"\nchanged = " a = 1 "\nreason = "why"\n'
    )
    assert mutation.load_equivalents(listed) == {
        "autotune.secrets.x_f__mutmut_1": mutation.Equivalent(
            "autotune.secrets.x_f__mutmut_1", "a = 1", "why"
        )
    }
    assert mutation.load_equivalents(tmp_path / "absent.toml") == {}


def test_every_listed_equivalent_names_a_target_module_and_says_why() -> None:
    modules = {
        p.removesuffix(".py").replace("/", ".").removesuffix(".*") for t in mutation.TARGETS for p in t.mutate
    }
    for name, entry in mutation.load_equivalents().items():
        assert any(name.startswith(m + ".") for m in modules), name
        assert entry.changed and len(entry.reason) > 20, name


def test_the_score_leaves_explained_survivors_out() -> None:
    report = mutation.TargetReport(
        "x", {"killed": 8, "survived": 3, "timeout": 1}, survivors=["a", "b", "c"], explained=["a", "b"]
    )
    assert report.unexplained == ["c"]
    assert report.score == 8 / 9


def test_each_explanation_sits_in_its_targets_file() -> None:
    by_name = {t.name: t for t in mutation.TARGETS}
    files = sorted(mutation.EQUIVALENT.glob("*.toml"))
    assert files
    for path in files:
        target = by_name[path.stem]
        modules = [p.removesuffix(".py").replace("/", ".") for p in target.mutate]
        for name in mutation.load_equivalents(path):
            assert any(name.startswith(m + ".") for m in modules), (path.name, name)


def test_a_folder_under_work_that_the_script_did_not_make_is_refused_and_kept(tmp_path: Path) -> None:
    users = tmp_path / "plan"
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    try:
        mutation.fresh_copy_dir(users)
    except SystemExit as exc:
        assert "not a scratch copy" in str(exc) and str(users) in str(exc)
    else:
        raise AssertionError("a folder of the user's was not refused")
    assert (users / "notes.txt").read_text() == "mine"


def test_a_scratch_copy_is_marked_and_replaced_by_the_next_run(tmp_path: Path) -> None:
    dest = tmp_path / "plan"
    mutation.fresh_copy_dir(dest)
    assert sorted(p.name for p in dest.iterdir()) == [mutation.COPY_MARK]
    (dest / "left-over").write_text("x")
    mutation.fresh_copy_dir(dest)
    assert sorted(p.name for p in dest.iterdir()) == [mutation.COPY_MARK]
