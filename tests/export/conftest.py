"""Study directories for the export tests: the committed 4×A10 fixture, and small synthetic ones."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

import autotune
from autotune.export import Export

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "study"
GOLDEN = Path(__file__).resolve().parent / "golden"
SECRETS = ("hf_FixtureSecretToken0123456789", "0123456789abcdef0123456789abcdef01234567")


@pytest.fixture
def fixture_study(tmp_path: Path) -> Path:
    """A copy of tests/fixtures/study (4×A10, Qwen2-7B, ms-swift 4.6), so tests may change it."""
    dest = tmp_path / "qwen2-7b-a10"
    shutil.copytree(FIXTURE, dest)
    return dest


def edit_settings(study: Path, **changes: Any) -> None:
    """Change keys of a study's study.json (``fixed=...``, ``dataset=...``)."""
    path = study / "study.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data, indent=2))


def edit_result(study: Path, number: int, **changes: Any) -> None:
    path = study / "trials" / str(number) / "result.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data, indent=2))


def make_study(
    root: Path,
    *,
    backend: str,
    params: dict[str, Any],
    derived: dict[str, Any],
    fixed: dict[str, Any] | None = None,
    gpus: int = 4,
    gpu_name: str = "NVIDIA A100-SXM4-80GB",
    compute_capability: str = "8.0",
    model: dict[str, Any] | None = None,
    dataset: str | None = "/data/math/train.parquet",
    global_batch: int = 64,
    num_generations: int = 8,
    max_completion_length: int = 512,
    backend_version: str | None = None,
    status: str = "COMPLETE",
    number: int = 1,
) -> Path:
    """A study directory with one trial (and a slower COMPLETE baseline, trial 0)."""
    hardware = {
        "gpus": [
            {
                "index": i,
                "name": gpu_name,
                "memory_total_bytes": 85899345920,
                "uuid": None,
                "compute_capability": compute_capability,
                "declared": False,
            }
            for i in range(gpus)
        ],
        "host": {
            "hostname": "node",
            "cpu_cores_logical": 64,
            "cpu_cores_physical": 32,
            "ram_total_bytes": 2**39,
            "platform": "Linux",
        },
    }
    settings = {
        "name": root.name,
        "backend": backend,
        "backend_version": backend_version or {"trl": "1.16.0", "swift": "4.6.0"}.get(backend),
        "model": model
        or {
            "name": "Qwen2.5-1.5B",
            "path_or_id": "Qwen/Qwen2.5-1.5B-Instruct",
            "local": False,
            "facts": {"hidden": 1536},
        },
        "hardware": hardware,
        "global_batch": global_batch,
        "num_generations": num_generations,
        "max_steps": 20,
        "max_completion_length": max_completion_length,
        "fixed": fixed or {},
        "dataset": dataset,
        "seed": 0,
        "versions": {"autotune": "0.1.0", backend: backend_version or "1.16.0"},
    }
    root.mkdir(parents=True)
    (root / "study.json").write_text(json.dumps(settings, indent=2))
    steady = {
        "step_time_s": 10.0,
        "rel_ci95": 0.02,
        "steady_steps": 8,
        "warmup_steps": 2,
        "throughput": 6.4,
        "tokens_per_s": 3000.0,
    }
    base = {
        "step_time_s": 20.0,
        "rel_ci95": 0.02,
        "steady_steps": 8,
        "warmup_steps": 2,
        "throughput": 3.2,
        "tokens_per_s": 1500.0,
    }
    trials = [
        (0, {}, {"world_size": gpus or 1, "gradient_accumulation_steps": 1}, "COMPLETE", base, True),
        (number, params, derived, status, steady if status in ("COMPLETE", "UNHEALTHY") else None, False),
    ]
    for n, p, d, st, sd, is_base in trials:
        trial = root / "trials" / str(n)
        trial.mkdir(parents=True)
        result = {
            "number": n,
            "params": p,
            "derived": d,
            "is_baseline": is_base,
            "status": st,
            "reason": "completed 10 steps" if st == "COMPLETE" else f"{st.lower()} (test)",
            "steps": 10,
            "steady": sd,
            "peak_mem_bytes": [60 * 2**30] * gpus,
        }
        (trial / "result.json").write_text(json.dumps(result, indent=2))
    return root


def normalized(text: str, *roots: Path) -> str:
    """Paths that differ per run replaced by placeholders: the study, autotune's package directory."""
    out = text
    for root in roots:
        out = out.replace(str(root), "<STUDY>")
    return out.replace(str(Path(autotune.__file__).resolve().parent), "<AUTOTUNE>")


def check_golden(export: Export, name: str, *roots: Path) -> None:
    """Compare every file of ``export`` with tests/export/golden/<name>/ (AUTOTUNE_UPDATE_GOLDEN=1 rewrites)."""
    folder = GOLDEN / name
    update = os.environ.get("AUTOTUNE_UPDATE_GOLDEN") == "1"
    if update:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    expected_names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    if not update:
        assert sorted(export.files) == expected_names, f"files of {name} differ from the golden ones"
    for file_name, content in export.files.items():
        text = normalized(content, *roots)
        if update:
            (folder / file_name).write_text(text)
        else:
            assert text == (folder / file_name).read_text(), (
                f"{name}/{file_name} differs from the golden file"
            )


def python_with(module: str, env_var: str, candidates: list[Path]) -> str | None:
    """An interpreter that can import ``module``: ``$env_var``, this one, or the first candidate that exists."""
    import importlib.util
    import subprocess

    explicit = os.environ.get(env_var)
    if explicit:
        return explicit
    if importlib.util.find_spec(module) is not None:
        return sys.executable
    for candidate in candidates:
        if candidate.exists():
            probe = subprocess.run(
                [
                    str(candidate),
                    "-c",
                    f"import importlib.util,sys; sys.exit(importlib.util.find_spec('{module}') is None)",
                ],
                check=False,
            )
            if probe.returncode == 0:
                return str(candidate)
    return None


def script_command(text: str) -> list[str]:
    """The command an exported script runs, as argv (its ``"$@"`` dropped; ``$HERE`` left as text)."""
    import shlex

    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("set -euo pipefail")) + 1
    body = [line for line in lines[start:] if not line.startswith(("export ", "cd ", "HERE=", "unset "))]
    argv = shlex.split(" ".join(line.rstrip("\\").strip() for line in body))
    assert argv[-1] == "$@", "an exported script passes its own arguments on"
    return argv[:-1]


def script_env(text: str) -> dict[str, str]:
    """The variables an exported script exports."""
    import shlex

    out = {}
    for line in text.splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export ") :].partition("=")
            out[key] = shlex.split(value)[0] if value else ""
    return out


@pytest.fixture(autouse=True)
def _transformers_5_aliases(monkeypatch: pytest.MonkeyPatch) -> None:
    """The export writes the names the installed transformers accepts (it reads its deprecated aliases);
    the golden files are written against transformers 5's rename, whatever is installed here. The real
    installed class is checked by tests/backends/test_trl/test_trl_export.py."""
    import autotune.backends.trl.export as trl_export

    monkeypatch.setattr(
        trl_export, "installed_aliases", lambda: {"gradient_checkpointing": "activation_checkpointing"}
    )
