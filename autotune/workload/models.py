"""Resolving ``--model``: a tiny model built here, a catalog short name, a local path, or a hub id."""

from __future__ import annotations

import os
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from autotune.errors import UsageError
from autotune.records import ModelRef

__all__ = ["resolve_model", "fetch_model"]

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


#: weight files a framework loads a model from (transformers, vLLM)
_WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json", "*.pt", "*.pth")
#: files of other runtimes a hub repository may carry, never read by a PyTorch trainer (vLLM leaves
#: ``original/`` out the same way): not downloaded
_NOT_LOADED = ("*.h5", "*.msgpack", "*.ot", "*.onnx", "*.onnx_data", "*.tflite", "*.gguf", "original/*")


def _has_weights(folder: Path) -> bool:
    return any(next(folder.glob(pattern), None) is not None for pattern in _WEIGHT_GLOBS)


def _loadable_folder(folder: Path, name: str, fix: str) -> None:
    """Refuse a folder a framework cannot load a model from: no ``config.json``, or no weights."""
    if not folder.is_dir():
        raise UsageError(f"model {name}: {folder} is not a model folder", hint=fix)
    if not (folder / "config.json").is_file():
        raise UsageError(f"model {name}: {folder} has no config.json", hint=fix)
    if not _has_weights(folder):
        raise UsageError(f"model {name}: {folder} has no weights ({', '.join(_WEIGHT_GLOBS[:2])})", hint=fix)


def _named(name: str, hub_id: str) -> str:
    return name if name == hub_id else f"{name} ({hub_id})"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _hub_settings() -> tuple[str, bool]:
    """The Hugging Face cache and offline mode as the environment says now: huggingface_hub reads
    ``HF_HUB_CACHE`` / ``HF_HOME`` / ``HF_HUB_OFFLINE`` once, at its import, and a Python caller (or a CLI
    run in-process) may set them after that."""
    from huggingface_hub import constants

    env = os.environ
    home = env.get("HF_HOME")
    cache = env.get("HF_HUB_CACHE") or (os.path.join(home, "hub") if home else constants.HF_HUB_CACHE)
    said = env.get("HF_HUB_OFFLINE")
    offline = (
        said.strip().upper() in {"1", "ON", "YES", "TRUE"} if said is not None else constants.HF_HUB_OFFLINE
    )
    return cache, bool(offline)


def _snapshot(name: str, hub_id: str) -> Path:
    """The local snapshot of ``hub_id`` in the user's own Hugging Face cache, downloaded there the first
    time (huggingface_hub's ``snapshot_download``: ``HF_HOME`` / ``HF_HUB_CACHE``, ``HF_TOKEN`` and
    ``HF_HUB_OFFLINE`` apply as they do for the frameworks).

    Raises:
        UsageError: the hub cannot be reached and the model is not cached, or the hub refuses it.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, HFValidationError, RepositoryNotFoundError

    fix = (
        f"Download it once where the hub can be reached (hf download {hub_id}), "
        "or point --model at a local model folder"
    )
    cache_dir, offline = _hub_settings()
    try:
        return Path(
            snapshot_download(
                hub_id, ignore_patterns=list(_NOT_LOADED), cache_dir=cache_dir, local_files_only=offline
            )
        )
    except GatedRepoError as exc:
        raise UsageError(
            f"model {_named(name, hub_id)} is gated on the Hugging Face hub ({_first_line(exc)})",
            hint="Accept its licence on the hub and log in (hf auth login), or set HF_TOKEN",
        ) from None
    except RepositoryNotFoundError:
        raise UsageError(
            f"model {_named(name, hub_id)} is not on the Hugging Face hub",
            hint="Check the id (org/name) or log in for a private one (hf auth login)",
        ) from None
    except (OSError, HFValidationError) as exc:  # not cached and no hub (offline, no network), disk
        raise UsageError(
            f"model {_named(name, hub_id)} cannot be loaded: {_first_line(exc)}", hint=fix
        ) from None


def fetch_model(ref: ModelRef) -> ModelRef:
    """The model every trial and the export load: a local folder checked to hold one, or a hub id's
    local snapshot (downloaded once, to the user's Hugging Face cache; never into a study).

    Called once, before a study's directory is touched, so a model that cannot load is one line, not a
    failed trial after another.

    Raises:
        UsageError: no model at the path, or a hub id that cannot be reached and is not cached.
    """
    if ref.local:
        _loadable_folder(Path(ref.path_or_id), ref.name, "Point --model at a Hugging Face model folder")
        return ref
    folder = _snapshot(ref.name, ref.path_or_id)
    _loadable_folder(
        folder,
        ref.name,
        f"Complete the download where the hub can be reached (hf download {ref.path_or_id})",
    )
    return ModelRef(
        name=ref.name, path_or_id=str(folder), local=True, facts=ref.facts or _folder_facts(folder)
    )


def _folder_facts(folder: Path) -> dict[str, Any]:
    """A snapshot's architecture facts from its ``config.json`` (empty for a model the catalog's reader
    does not understand: the study then runs without the memory gate, as for any unknown model)."""
    from autotune.estimate import model_from_config

    try:
        return _facts(model_from_config(folder))
    except UsageError:
        return {}
