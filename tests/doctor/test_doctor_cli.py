"""``autotune doctor`` through the installed CLI, and the quick subset stopping a search before its first
trial with the doctor's line."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
from autotune.probes.testing import FakeGpu

from autotune.doctor import CHECKS, Status
from autotune.errors import MachineError
from tests.cli.conftest import run_cli
from tests.doctor.conftest import gpu_facts, recorded_host

FAULT = str(Path(__file__).resolve().parents[1] / "fixtures" / "faults" / "fault.py")


def test_doctor_prints_one_line_per_finding_and_json_says_the_same(tmp_path: Path) -> None:
    text = run_cli("doctor", "--out", str(tmp_path / "runs"))
    as_json = run_cli("doctor", "--out", str(tmp_path / "runs"), "--json")
    data = json.loads(as_json.stdout)
    assert text.returncode == as_json.returncode == data["exit_code"], text.stderr
    lines = text.stdout.strip().splitlines()
    assert len(lines) == len(data["findings"])
    for line, finding in zip(lines, data["findings"], strict=True):
        assert line.startswith(f"{finding['status']:<4} {finding['check']}: ")
    names = {f["check"] for f in data["findings"]}
    host_checks = {c.name for c in CHECKS} - {"gpus", "gpu-busy", "mig", "persistence", "ecc", "clocks"}
    assert host_checks <= names
    if any(f["check"] == "nvml" and "no GPU" in f["detail"] for f in data["findings"]):
        assert data["exit_code"] == 0 or data["counts"]["fail"] > 0  # no GPU alone never fails


def test_quick_and_calibrate_on_a_machine_without_gpu(tmp_path: Path) -> None:
    proc = run_cli("doctor", "--quick", "--calibrate", "--json", "--out", str(tmp_path))
    data = json.loads(proc.stdout)
    quick = {c.name for c in CHECKS if c.quick} | {"calibrate"}
    assert {f["check"] for f in data["findings"]} <= quick
    if not any(f["check"] == "gpus" for f in data["findings"]):  # no GPU here: calibrate is a warning
        cal = [f for f in data["findings"] if f["check"] == "calibrate"]
        assert cal[0]["status"] == "warn" and "needs a GPU" in cal[0]["detail"]
        assert data["calibrate"] == {"table": None, "paths": []}


def test_bad_seconds_is_one_line(tmp_path: Path) -> None:
    proc = run_cli("doctor", "--bench", "--seconds", "0", "--out", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --seconds must be positive, got 0. For example --seconds 3"
    ]


def test_search_stops_before_its_first_trial_with_the_doctors_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import autotune
    from autotune.doctor import _facts

    full = gpu_facts(1, driver="no_library", host=recorded_host(disk_free_bytes=40 * 1024**2))
    monkeypatch.setattr(_facts, "gather_facts", lambda *a, **k: full)
    space = tmp_path / "space.yaml"
    space.write_text("backend: command\nknobs:\n  bs: {type: int, choices: [1, 2], default: 1}\n")
    out = tmp_path / "study"
    with pytest.raises(MachineError) as caught:
        autotune.search(
            [sys.executable, FAULT, "--mode", "ok", "--steps", "3"],
            backend="command",
            space=str(space),
            out=str(out),
            trials=2,
            confirm_runs=0,
        )
    line = caught.value.one_line()
    assert line.startswith("autotune doctor: disk: 40 MiB free under /work/runs")
    assert "--out on a larger disk" in line and "`autotune doctor` lists every check" in line
    assert caught.value.exit_code == 2
    assert not out.exists()  # nothing touched


def test_preflight_looks_only_at_the_gpus_the_search_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.doctor import _facts, preflight

    facts = gpu_facts([FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b", mig_mode=1)])
    facts = dataclasses.replace(facts, packages={**facts.packages, "torch": "2.6.0+cu124"})
    monkeypatch.setattr(_facts, "gather_facts", lambda *a, **k: facts)
    assert preflight(Path("runs"), gpu_indices=[0]).exit_code == 0  # GPU 1 is not the search's
    with pytest.raises(MachineError, match="autotune doctor: mig: MIG mode is on for GPU 1"):
        preflight(Path("runs"))


def test_preflight_passes_warnings_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.doctor import _facts, preflight

    monkeypatch.setattr(_facts, "gather_facts", lambda *a, **k: gpu_facts(1, driver="no_library"))
    report = preflight(tmp_path)
    assert report.exit_code == 0
    assert [f.status for f in report.findings if f.check == "nvml"] == [Status.WARN]


def test_preflight_that_cannot_read_the_machine_lets_the_search_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autotune.doctor import _facts, preflight

    def broken(*_a: object, **_k: object) -> None:
        raise PermissionError("/proc is not mounted")

    monkeypatch.setattr(_facts, "gather_facts", broken)
    report = preflight(tmp_path)
    assert report.exit_code == 0 and "PermissionError: /proc is not mounted" in report.findings[0].detail


def _as_a_user(args: list[str]) -> list[str]:
    """``args`` run by an unprivileged user: modes stop it, as they stop every user but root."""
    import os
    import shutil

    if os.geteuid() != 0:
        return args
    if shutil.which("setpriv") is None:
        pytest.skip("root, and no setpriv to run the doctor as another user")
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *args]


def test_an_unreadable_folder_and_an_unwritable_cache_are_named_with_their_fix() -> None:
    """Issue 41, defect 9: ``--out`` under a folder this user cannot enter was "cannot read the free
    space … Fix: Free space under …", and a cache it cannot write said nothing (or, with --bench, "the
    host benchmark failed … run `autotune doctor` without --bench")."""
    import os
    import shutil
    import subprocess
    import tempfile

    from tests.cli.conftest import autotune_exe

    place = Path(tempfile.mkdtemp(prefix="autotune-doctor-", dir="/tmp"))  # reachable by any user
    try:
        place.chmod(0o755)
        shut, cache = place / "shut", place / "cache"
        shut.mkdir(mode=0o000)
        cache.mkdir(mode=0o555)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HOME": str(place), "AUTOTUNE_CACHE_DIR": str(cache)}
        args = _as_a_user([autotune_exe(), "doctor", "--json", "--out", str(shut / "runs")])
        proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300, cwd=place)
        found = {f["check"]: f for f in json.loads(proc.stdout)["findings"]}
        disk, cached = found["disk"], found["cache"]
        assert (
            disk["status"] == "fail"
            and disk["detail"] == f"cannot write --out {shut}/runs ({shut}: Permission denied)"
        )
        assert disk["fix"].startswith(f"Let this user read and write {shut} (chmod, chown)")
        assert "Free space" not in disk["fix"]
        assert cached["status"] == "warn" and cached["detail"].startswith(
            f"cannot write the cache {cache} ({cache}: Permission denied)"
        )
        assert cached["fix"].startswith("Set AUTOTUNE_CACHE_DIR to a folder this user can write")
    finally:
        (place / "shut").chmod(0o755)
        shutil.rmtree(place)
