"""The model a search trains is resolved once, before trial 0: a folder without a model or a hub id that can
be neither reached nor found in the user's Hugging Face cache is one line; a hub id that is cached becomes
its local snapshot (huggingface_hub's own ``snapshot_download``, offline here: HF_HUB_OFFLINE and a cache
in huggingface_hub's layout), which every trial and the export then load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from huggingface_hub import constants

from autotune.errors import UsageError
from autotune.workload.models import fetch_model, resolve_model
from tests.hubcache import QWEN2_7B_CONFIG, cached_snapshot


@pytest.fixture
def offline_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's hub cache, empty, and no network to the hub (what HF_HUB_OFFLINE=1 sets)."""
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def _refused(name: str) -> str:
    with pytest.raises(UsageError) as caught:
        fetch_model(resolve_model(name))
    line = caught.value.one_line()
    assert "\n" not in line, line
    return line


def test_a_hub_id_neither_reachable_nor_cached_is_one_line(offline_hub: Path) -> None:
    line = _refused("acme/no-such-model")
    assert "model acme/no-such-model cannot be loaded" in line
    assert "LocalEntryNotFoundError" in line  # huggingface_hub's own word for it


def test_a_catalog_name_resolves_to_its_cached_snapshot(offline_hub: Path) -> None:
    snapshot = cached_snapshot(offline_hub, "Qwen/Qwen2-7B")
    ref = fetch_model(resolve_model("Qwen2-7B"))
    assert ref.local and Path(ref.path_or_id) == snapshot
    assert ref.name == "Qwen2-7B" and ref.facts["layers"] == 28  # the catalog's facts kept


def test_a_hub_id_outside_the_catalog_gets_its_facts_from_the_snapshot(offline_hub: Path) -> None:
    cached_snapshot(offline_hub, "acme/qwen2-like")
    ref = fetch_model(resolve_model("acme/qwen2-like"))
    assert ref.local and ref.facts["layers"] == 28 and ref.facts["hidden"] == 3584


def test_a_cache_holding_only_the_config_is_refused(offline_hub: Path) -> None:
    cached_snapshot(offline_hub, "Qwen/Qwen2-7B", weights=False)
    line = _refused("Qwen2-7B")
    assert "has no weights" in line and "hf download Qwen/Qwen2-7B" in line


def test_a_folder_without_a_model_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN2_7B_CONFIG))
    assert "has no weights" in _refused(str(folder))
    (folder / "model.safetensors").write_bytes(b"")
    assert fetch_model(resolve_model(str(folder))).path_or_id == str(folder.resolve())
