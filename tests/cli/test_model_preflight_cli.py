"""A model that cannot load is refused before trial 0, in one line, exit 2, and no study directory is made
(it used to launch trial after trial with the same OSError, filed under "other failed trials"). The hub is
unreachable here: HF_HUB_OFFLINE=1 and an empty cache of the user's own, as huggingface_hub reads them."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def offline(tmp_path: Path) -> dict[str, str]:
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    return {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "AUTOTUNE_CACHE_DIR": str(tmp_path / "at")}


@pytest.mark.parametrize(
    ("model", "needle"),
    [
        ("/nonexistent/path", "/nonexistent/path"),
        ("acme/no-such-model", "model acme/no-such-model cannot be loaded"),
        (
            "Qwen2-7B",
            "model Qwen2-7B (Qwen/Qwen2-7B) cannot be loaded",
        ),  # a catalog name: its hub id, not cached
    ],
)
def test_a_model_that_cannot_load_stops_the_search_before_its_directory(
    cli, tmp_path: Path, offline: dict[str, str], model: str, needle: str
) -> None:
    out = tmp_path / "runs" / "study"
    proc = cli("search", "--model", model, "--trials", "1", "--out", str(out), env=offline)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not out.exists() and not (tmp_path / "runs").exists()
    assert not any(Path(offline["HF_HUB_CACHE"]).iterdir())  # nothing written to the user's cache either
