"""The doctor and the search's pre-flight judge torch, its CUDA build and the frameworks in the interpreter
the trials run with, not in autotune's own: a CUDA-less autotune environment beside a CUDA framework
environment is fine, and the reverse is not. The trials' interpreter here is a real small Python script
standing in as the executable: it runs what it is given with a fake torch first on its path."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest
from autotune.probes.testing import fake_nvml

from autotune.doctor import Status, gather_facts, preflight, read_interpreter, run_checks
from autotune.errors import MachineError
from tests.doctor.conftest import recorded_host


def trials_python(tmp_path: Path, torch_version: str, cuda: str | None, **dists: str) -> Path:
    """An interpreter whose torch is ``torch_version``, its ``torch/version.py`` naming ``cuda``, with the
    distributions ``dists`` (name → version) installed beside it."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise ImportError('the doctor must not import torch')\n")
    (site / "torch" / "version.py").write_text(
        f"from typing import Optional\ncuda: Optional[str] = {cuda!r}\n"
    )
    for name, version in {"torch": torch_version, **dists}.items():
        meta = site / f"{name.replace('-', '_')}-{version}.dist-info"
        meta.mkdir()
        (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"sys.path.insert(0, {str(site)!r})\n"
        "assert sys.argv[1] == '-c', sys.argv\n"
        "code, sys.argv = sys.argv[2], ['-c', *sys.argv[3:]]\n"
        "exec(compile(code, '<string>', 'exec'), {'__name__': '__main__'})\n"
    )
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return python


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The CLI in this process, as the console script runs it (one line and exit 2 for a user error)."""
    from autotune.cli.app import main

    with pytest.raises(SystemExit) as info:
        main(list(args))
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def _torch_finding(python: str, tmp_path: Path):
    host = recorded_host(out_dir=tmp_path)
    facts = gather_facts(
        tmp_path, nvml=fake_nvml(1).module, environ={}, host=lambda *_a, **_k: host, python=python
    )
    return next(f for f in run_checks(facts, quick=True).findings if f.check == "torch-cuda")


def test_the_record_is_read_from_the_trials_interpreter(tmp_path: Path) -> None:
    python = trials_python(tmp_path, "2.6.0+cu124", "12.4")
    read = read_interpreter(str(python))
    assert read.python == str(python)
    assert read.packages["torch"] == "2.6.0+cu124"
    assert read.torch_cuda_build() == ("12.4", False)
    assert read_interpreter(sys.executable).packages["torch"] != "2.6.0+cu124"


def test_a_cuda_trials_interpreter_passes_where_autotunes_own_cpu_torch_fails(tmp_path: Path) -> None:
    own = read_interpreter(sys.executable).packages.get("torch", "")
    if "+cpu" not in own:
        pytest.skip(f"autotune's own torch is {own or 'absent'}, not a CPU build")
    assert _torch_finding(sys.executable, tmp_path).status is Status.FAIL
    cuda = trials_python(tmp_path, "2.6.0+cu124", "12.4")
    finding = _torch_finding(str(cuda), tmp_path)
    assert finding.status is Status.OK and "torch 2.6.0+cu124 built for CUDA 12.4" in finding.detail


def test_a_cpu_trials_interpreter_fails_and_the_cuda_build_is_read_from_torch_itself(tmp_path: Path) -> None:
    # no +cpu tag and no CUDA runtime wheel (a conda or source build): torch/version.py decides
    cpu = trials_python(tmp_path / "cpu", "2.6.0", None)
    assert _torch_finding(str(cpu), tmp_path).status is Status.FAIL
    cuda = trials_python(tmp_path / "cuda", "2.6.0", "12.4")
    assert _torch_finding(str(cuda), tmp_path).status is Status.OK


def test_preflight_stops_the_search_on_the_trials_interpreter(tmp_path: Path, monkeypatch) -> None:
    from autotune.doctor import _facts

    host = recorded_host(out_dir=tmp_path)
    monkeypatch.setattr(_facts, "host_facts", lambda *_a, **_k: host)
    cpu = trials_python(tmp_path, "2.6.0+cpu", None)
    with pytest.raises(MachineError, match=r"torch-cuda: torch 2\.6\.0\+cpu is a CPU-only build"):
        preflight(tmp_path, nvml=fake_nvml(1).module, python=str(cpu), python_for="the verl backend's trials")
    broken = tmp_path / "gone" / "python"
    with pytest.raises(MachineError, match="interpreter: cannot run the trials' interpreter"):
        preflight(tmp_path, nvml=fake_nvml(1).module, python=str(broken))


def test_doctor_names_the_interpreter_it_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    python = trials_python(tmp_path, "2.6.0+cu124", "12.4")
    common = ("doctor", "--quick", "--json", "--out", str(tmp_path))
    mine = run(capsys, *common)[1]
    theirs = run(capsys, *common, "--backend", "verl", "--executable", str(python))[1]
    found = {
        who: {f["check"]: f for f in json.loads(stdout)["findings"]}
        for who, stdout in (("mine", mine), ("theirs", theirs))
    }
    assert f"read {sys.executable} " in found["mine"]["interpreter"]["detail"]
    assert "the trl backend's trials" in found["mine"]["interpreter"]["detail"]
    assert f"read {python} (Python " in found["theirs"]["interpreter"]["detail"]
    assert "the verl backend's trials" in found["theirs"]["interpreter"]["detail"]
    assert "torch 2.6.0+cu124" in found["theirs"]["torch-cuda"]["detail"]
    assert "torch 2.6.0+cu124" not in found["mine"]["torch-cuda"]["detail"]
    command = {f["check"]: f for f in json.loads(run(capsys, *common, "--backend", "command")[1])["findings"]}
    assert "no Python interpreter to read" in command["interpreter"]["detail"]
    assert "torch-cuda" not in command  # the user's command decides its torch


def test_search_judges_the_interpreter_its_trials_run_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """ms-swift in its own environment (the ``swift`` command's interpreter) with a CPU torch, on a GPU
    host: the search stops before its directory, on that torch, not on autotune's."""
    from autotune.doctor import _facts

    python = trials_python(tmp_path, "2.6.0+cpu", None, **{"ms-swift": "4.6.0"})
    swift = python.with_name("swift")
    swift.write_text(f"#!{python}\n# console script\n")
    swift.chmod(swift.stat().st_mode | stat.S_IEXEC)
    host = recorded_host(out_dir=tmp_path)
    real = _facts.gather_facts
    read: list[str | None] = []

    def on_one_fake_gpu(out_dir: Path, **kw: object) -> object:
        read.append(kw["python"])  # type: ignore[arg-type]
        kw.update(nvml=fake_nvml(1).module, environ={}, host=lambda *_a, **_k: host)
        return real(out_dir, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(_facts, "gather_facts", on_one_fake_gpu)
    from autotune.records import GpuInfo, Hardware
    from autotune.study import hardware as hw

    gpu = GpuInfo(index=0, name="NVIDIA A10", memory_total_bytes=24 * 1024**3)
    monkeypatch.setattr(hw, "resolve_hardware", lambda *a, **k: Hardware(gpus=(gpu,), host=hw.host_info()))
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "study"
    code, _, err = run(
        capsys,
        "search",
        "--backend",
        "swift",
        "--executable",
        str(swift),
        "--model",
        "tiny-qwen2",
        "--out",
        str(out),
    )
    assert read == [str(python)]
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "torch 2.6.0+cpu is a CPU-only build" in lines[0], err
    assert not out.exists()
