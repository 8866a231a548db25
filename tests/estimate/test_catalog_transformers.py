"""Catalog arithmetic and ``model_from_config`` checked against real transformers modules.

Models are built on the meta device: no memory, no weights, a fraction of a second each.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.estimate import find_model, model_from_config

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


def _meta_counts(config: object) -> tuple[int, int]:
    """DeepSpeed's ``model_to_params`` arithmetic on a model built on the meta device."""
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())  # shared embeddings counted once
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return total, largest


def _config_for(name: str) -> object:
    spec = find_model(name)
    assert spec is not None
    kind = {"qwen2": "qwen2", "qwen3": "qwen3", "llama": "llama", "mistral": "mistral"}[spec.family]
    return transformers.AutoConfig.for_model(
        kind,
        hidden_size=spec.hidden,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        intermediate_size=spec.intermediate,
        vocab_size=spec.vocab,
        tie_word_embeddings=spec.tie_embeddings,
        max_position_embeddings=spec.max_position,
    )


@pytest.mark.parametrize("name", ["Qwen2-7B", "Qwen2.5-0.5B", "Qwen3-8B", "Llama-3.2-1B", "Mistral-7B-v0.1"])
def test_catalog_arithmetic_equals_transformers_modules(name: str) -> None:
    spec = find_model(name)
    assert spec is not None
    total, largest = _meta_counts(_config_for(name))
    assert spec.params == total
    assert spec.largest_layer_params == largest


@pytest.mark.parametrize("name", ["Qwen2-1.5B", "Qwen3-0.6B", "Llama-3.2-3B"])
def test_model_from_config_reads_a_saved_config(tmp_path: Path, name: str) -> None:
    config = _config_for(name)
    config.save_pretrained(tmp_path)
    spec = model_from_config(tmp_path)
    total, largest = _meta_counts(config)
    assert (spec.params, spec.largest_layer_params) == (total, largest)
    assert spec.name == tmp_path.name
    assert model_from_config(tmp_path / "config.json") == spec


def test_model_from_config_vl_nested_text_config(tmp_path: Path) -> None:
    spec = find_model("Qwen2.5-VL-7B-Instruct")
    assert spec is not None
    cfg = {
        "model_type": "qwen2_5_vl",
        "tie_word_embeddings": False,
        "text_config": {
            "model_type": "qwen2_5_vl_text",
            "hidden_size": 3584,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "intermediate_size": 18944,
            "vocab_size": 152064,
            "max_position_embeddings": 128000,
        },
        "vision_config": {
            "depth": 32,
            "hidden_size": 1280,
            "intermediate_size": 3420,
            "out_hidden_size": 3584,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "in_chans": 3,
        },
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    got = model_from_config(tmp_path)
    assert got.is_vl
    assert got.params == spec.params
    assert got.vision_params == spec.vision_params


@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen2_5_vl"])
def test_model_from_config_vl_towers_equal_transformers_modules(tmp_path: Path, model_type: str) -> None:
    """A saved Qwen2-VL / Qwen2.5-VL config (small sizes) counts what transformers builds.

    Qwen2-VL's ``vision_config.hidden_size`` is the merger's output, not the tower's width (``embed_dim``).
    """
    text = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 96,
        "vocab_size": 128,
    }
    vision: dict[str, object] = {"depth": 2, "num_heads": 2, "patch_size": 4, "spatial_merge_size": 2}
    if model_type == "qwen2_vl":
        vision |= {"embed_dim": 32, "mlp_ratio": 4, "hidden_size": 64}
    else:
        vision |= {"hidden_size": 32, "intermediate_size": 48, "out_hidden_size": 64}
    config = transformers.AutoConfig.for_model(
        model_type, text_config=text, vision_config=vision, tie_word_embeddings=False
    )
    config.save_pretrained(tmp_path)
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(config)
    spec = model_from_config(tmp_path)
    assert spec.vision_params == sum(p.numel() for p in model.model.visual.parameters())
    assert spec.params == sum(p.numel() for p in model.parameters())
