"""Resolving ``--model``: a tiny model built here, a catalog short name, a local path, or a hub id."""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from autotune.errors import UsageError
from autotune.records import ModelRef

__all__ = ["resolve_model"]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _facts(spec: Any) -> dict[str, Any]:
    return {k: v for k, v in asdict(spec).items() if v is not None}


def resolve_model(name: str, *, build_tiny: bool = True) -> ModelRef:
    """Turn what the user typed into something the framework can load.

    Args:
        name: ``tiny-qwen2``/``small-qwen2`` (built locally on first use), a catalog short name such as
            ``Qwen2-7B`` (resolved to its hub id), a local directory, or a hub id ``org/name``.
        build_tiny: build a tiny model now if it is not cached yet (False for planning only).

    Raises:
        UsageError: an unknown short name (one line, with the fix).
    """
    from autotune.estimate import find_model, known_models, model_from_config
    from autotune.workload import tinymodels

    if tinymodels.is_tiny(name):
        path = tinymodels.ensure_model(name) if build_tiny else tinymodels.model_dir(name)
        facts: dict[str, Any] = {}
        config = path / "config.json"
        if config.exists():
            facts = _facts(model_from_config(config))
        return ModelRef(name=name, path_or_id=str(path), local=True, facts=facts)
    local = Path(name).expanduser()
    if local.exists():
        if not (local / "config.json").exists() and local.name != "config.json":
            raise UsageError(
                f"model directory {name} has no config.json",
                hint="Point --model at a Hugging Face model folder",
            )
        return ModelRef(
            name=name, path_or_id=str(local.resolve()), local=True, facts=_facts(model_from_config(local))
        )
    spec = find_model(name)
    if spec is not None:
        return ModelRef(name=name, path_or_id=spec.hub_id, local=False, facts=_facts(spec))
    if _HUB_ID.match(name):
        return ModelRef(name=name, path_or_id=name, local=False, facts={})
    shown = ", ".join(["tiny-qwen2", "small-qwen2", *known_models()[:8]])
    raise UsageError(
        f"unknown model {name!r}",
        hint=f"Use a hub id (org/name), a local model folder, or a known name such as {shown}",
    )
