"""autotune.probes.phases: markers written from inside training processes, and the probes' import boundary."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from autotune.probes import phases

PROBES_DIR = Path(phases.__file__).resolve().parent


@pytest.fixture
def marker_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "phases.jsonl"
    monkeypatch.setenv(phases.ENV_FILE, str(path))
    monkeypatch.delenv("RANK", raising=False)
    return path


def test_mark_appends_one_json_line_with_the_documented_fields(marker_file: Path) -> None:
    before, wall_before = time.monotonic(), time.time()
    phases.mark("rollout", "begin", step=3)
    phases.mark("rollout", "end")
    lines = marker_file.read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert set(first) == {"phase", "event", "t_mono_s", "t_wall_s", "step", "pid", "rank"}
    assert (first["phase"], first["event"], first["step"], first["rank"]) == ("rollout", "begin", 3, 0)
    assert first["pid"] == __import__("os").getpid()
    assert before <= first["t_mono_s"] <= time.monotonic()
    assert wall_before <= first["t_wall_s"] <= time.time()
    assert json.loads(lines[1])["step"] is None


def test_no_file_without_the_variable_and_only_rank_zero_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(phases.ENV_FILE, raising=False)
    phases.mark("train", "begin")  # no-op, nowhere to write
    assert list(tmp_path.iterdir()) == []

    path = tmp_path / "p.jsonl"
    monkeypatch.setenv(phases.ENV_FILE, str(path))
    monkeypatch.setenv("RANK", "1")
    phases.mark("train", "begin")
    assert not path.exists()
    monkeypatch.setenv("RANK", "0")
    phases.mark("train", "begin")
    assert len(path.read_text().splitlines()) == 1


def test_phase_context_writes_end_even_when_the_block_raises(marker_file: Path) -> None:
    with pytest.raises(RuntimeError):
        with phases.phase("train", step=1):
            with phases.phase("weight_sync", step=1):
                raise RuntimeError("boom")
    got = [(m["phase"], m["event"]) for m in phases.read_phases(marker_file)]
    assert got == [("train", "begin"), ("weight_sync", "begin"), ("weight_sync", "end"), ("train", "end")]


@pytest.mark.parametrize(("phase", "event"), [("generate", "begin"), ("rollout", "start")])
def test_unknown_names_are_a_caller_bug(marker_file: Path, phase: str, event: str) -> None:
    with pytest.raises(ValueError, match="unknown phase"):
        phases.mark(phase, event)
    assert not marker_file.exists()


def test_an_unwritable_file_warns_and_never_breaks_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(phases.ENV_FILE, str(tmp_path / "missing-dir" / "phases.jsonl"))
    monkeypatch.delenv("RANK", raising=False)
    with pytest.warns(RuntimeWarning, match="phase marker not written"):
        with phases.phase("rollout"):
            pass


def test_read_phases_skips_partial_and_foreign_lines(tmp_path: Path) -> None:
    path = tmp_path / "phases.jsonl"
    good = {
        "phase": "train",
        "event": "begin",
        "t_mono_s": 1.0,
        "t_wall_s": 2.0,
        "step": 1,
        "pid": 1,
        "rank": 0,
    }
    path.write_text(
        json.dumps(good)
        + "\n"
        + "not json\n"
        + json.dumps({**good, "phase": "bogus"})
        + "\n"
        + json.dumps([1, 2])
        + "\n\n"
        + '{"phase": "train", "event": "end", "t_mo'  # a killed writer's last line
    )
    assert phases.read_phases(path) == [good]
    assert phases.read_phases(tmp_path / "absent.jsonl") == []


_WRITER = """
import sys
from autotune.probes import phases
for i in range(int(sys.argv[1])):
    with phases.phase("rollout", step=i):
        pass
"""


def test_concurrent_writers_never_interleave_lines(marker_file: Path) -> None:
    n = 150
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(n)]) for _ in range(3)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    raw = marker_file.read_text().splitlines()
    markers = phases.read_phases(marker_file)
    assert len(raw) == len(markers) == 3 * 2 * n
    assert len({m["pid"] for m in markers}) == 3


def test_phases_is_stdlib_only_and_probes_never_import_autotune() -> None:
    """Training processes import the phase markers: they load nothing of autotune but the probes."""
    code = (
        "import sys; import autotune.probes.phases; "
        "heavy = {'autotune', 'pandas', 'numpy', 'psutil', 'pynvml', 'torch', 'pyarrow'}; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(["autotune", "autotune.probes", "autotune.probes.phases"])
    for path in PROBES_DIR.glob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            outside = [
                n for n in names if n.split(".")[0] == "autotune" and not n.startswith("autotune.probes")
            ]
            assert not outside, f"{path.name} imports {outside}"
