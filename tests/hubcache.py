"""A Hugging Face hub cache written in huggingface_hub's own layout (``models--org--name/refs/main`` naming
a commit, ``snapshots/<commit>/`` holding the files), so tests resolve hub ids offline (HF_HUB_OFFLINE=1,
HF_HUB_CACHE pointing here) through huggingface_hub's real ``snapshot_download``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

__all__ = ["QWEN2_7B_CONFIG", "cached_snapshot"]

#: Qwen/Qwen2-7B's config.json (the architecture keys), as the hub serves it
QWEN2_7B_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def cached_snapshot(
    cache: Path, repo_id: str, config: dict[str, Any] | None = None, *, weights: bool = True
) -> Path:
    """Write ``repo_id``'s snapshot into the hub cache ``cache``: its config.json, and a (tiny) weights file
    unless ``weights`` is False (a cache that only ever fetched the config). Returns the snapshot folder."""
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    (snapshot / "config.json").write_text(json.dumps(config or QWEN2_7B_CONFIG))
    if weights:
        (snapshot / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    return snapshot
