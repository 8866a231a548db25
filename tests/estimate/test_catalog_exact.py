"""Exact values of the model and GPU catalog, worked out by hand (the arithmetic is in the comments).

Parameter counts follow a Hugging Face model's ``sum(p.numel())``: per decoder layer q, k, v, o
projections (q, k, v with a bias for Qwen2), gate/up/down MLP projections and two RMSNorms (plus the
q/k norms of Qwen3); then the embedding (once more for an untied LM head) and the final norm. The
vision towers were checked against transformers' Qwen2-VL / Qwen2.5-VL modules built on the meta
device (``test_catalog_transformers.py`` does that where transformers is installed); the numbers
below need no optional package.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from autotune.errors import UsageError
from autotune.estimate import (
    GIB,
    GpuSpec,
    ModelSpec,
    find_gpu,
    find_model,
    generic_gpu,
    model_from_config,
    model_from_facts,
    resolve_gpu,
)
from autotune.estimate.catalog import _build_models

# Qwen2-7B (config.json of Qwen/Qwen2-7B): hidden 3584, 28 layers, 28 heads, 4 KV heads of 128,
# MLP 18944, vocabulary 152064, untied head, q/k/v biases.
QWEN2_7B: dict[str, Any] = {
    "_name_or_path": "Qwen/Qwen2-7B",
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "intermediate_size": 18944,
    "vocab_size": 152064,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
}
# q_dim = 28 * 128 = 3584, kv_dim = 4 * 128 = 512
# attention: 3584*3584 (q) + 2 * 3584*512 (k, v) + 3584*3584 (o) = 12_845_056 + 3_670_016 + 12_845_056
#            = 29_360_128, biases 3584 + 2*512 = 4_608 -> 29_364_736
# MLP: 3 * 3584 * 18944 = 203_685_888; norms: 2 * 3584 = 7_168; one layer: 233_057_792
# 28 layers: 6_525_618_176; embedding 152064 * 3584 = 544_997_376, twice (untied): 1_089_994_752
# final norm 3584 -> 6_525_618_176 + 1_089_994_752 + 3_584 = 7_615_616_512 (model card: 7.62 B)
QWEN2_7B_PARAMS = 7_615_616_512
QWEN2_7B_EMBED = 544_997_376
QWEN2_7B_BIASES = 28 * 4_608  # 129_024

# Qwen3-0.6B: hidden 1024, 28 layers, 16 heads of 128 (head_dim is not hidden / heads = 64), 8 KV heads,
# MLP 3072, vocabulary 151936, tied, q/k RMSNorms of 128, no biases.
QWEN3_0_6B: dict[str, Any] = {
    "model_type": "qwen3",
    "hidden_size": 1024,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 3072,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": True,
    "attention_bias": False,
}
# q_dim = 16 * 128 = 2048, kv_dim = 8 * 128 = 1024
# attention: 1024*2048 + 2 * 1024*1024 + 2048*1024 = 2_097_152 * 3 = 6_291_456
# MLP: 3 * 1024 * 3072 = 9_437_184; norms: 2 * 1024 + 2 * 128 = 2_304; one layer: 15_730_944
# 28 layers: 440_466_432; embedding once: 151936 * 1024 = 155_582_464; final norm 1024
# -> 596_049_920
QWEN3_0_6B_PARAMS = 596_049_920

# Llama-3.2-1B: hidden 2048, 16 layers, 32 heads of 64, 8 KV heads, MLP 8192, vocabulary 128256, tied.
LLAMA_3_2_1B: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "intermediate_size": 8192,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
}
# q_dim = 2048, kv_dim = 512; attention: 2048*2048 * 2 + 2 * 2048*512 = 8_388_608 + 2_097_152 = 10_485_760
# MLP: 3 * 2048 * 8192 = 50_331_648; norms 4096; one layer: 60_821_504; 16 layers: 973_144_064
# embedding once: 128256 * 2048 = 262_668_288; final norm 2048 -> 1_235_814_400 (model card: 1.24 B)
LLAMA_3_2_1B_PARAMS = 1_235_814_400
LLAMA_3_2_1B_BIASES = 16 * (2048 + 2 * 512)  # 49_152 when attention_bias is set

# Vision towers, width 1280, 32 blocks, 14x14 patches over 2 frames of 3 channels, 2x2 merge:
# attention: qkv 1280 -> 3840 with bias, proj 1280 -> 1280 with bias: 4 * 1280^2 + 4 * 1280 = 6_558_720
# patch embedding (Conv3d, no bias): 3 * 2 * 14 * 14 * 1280 = 1_505_280
# merger over 4 * 1280 = 5120: 5120*5120 + 5120 = 26_219_520, then 5120 * out + out
# Qwen2-VL-7B: GELU MLP 1280 -> 5120 -> 1280 with biases: 2 * 1280 * 5120 + 5120 + 1280 = 13_113_600;
#   two LayerNorms with bias 4 * 1280 = 5_120; block 19_677_440, 32 blocks 629_678_080;
#   merger LayerNorm 2 * 1280 + 26_219_520 + 5120 * 3584 + 3584 = 2_560 + 26_219_520 + 18_353_664
#   = 44_575_744 -> 629_678_080 + 1_505_280 + 44_575_744 = 675_759_104
QWEN2_VL_7B_VISION = 675_759_104
# Qwen2.5-VL-7B: gated MLP of 3420 with biases: 3 * 1280 * 3420 + 2 * 3420 + 1280 = 13_140_920;
#   two RMSNorms 2 * 1280; block 19_702_200, 32 blocks 630_470_400;
#   merger RMSNorm 1280 + 26_219_520 + 18_353_664 = 44_574_464
#   -> 630_470_400 + 1_505_280 + 44_574_464 = 676_550_144
QWEN2_5_VL_7B_VISION = 676_550_144
# Qwen2.5-VL-7B tower without intermediate_size (4 * 1280 = 5120): 3 * 1280 * 5120 + 2 * 5120 + 1280
#   = 19_672_320; block 6_558_720 + 19_672_320 + 2_560 = 26_233_600; 32 blocks 839_475_200
#   -> 839_475_200 + 1_505_280 + 44_574_464 = 885_554_944
QWEN2_5_VL_DEFAULT_MLP_VISION = 885_554_944


def _write(folder: Path, cfg: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return folder


def _from(tmp_path: Path, cfg: dict[str, Any], folder: str = "m") -> ModelSpec:
    return model_from_config(_write(tmp_path / folder, cfg))


# --- model_from_config: every field of a real config


def test_qwen2_7b_config_gives_every_field(tmp_path: Path) -> None:
    folder = _write(tmp_path / "qwen2-7b", QWEN2_7B)
    expected = ModelSpec(
        name="qwen2-7b",
        hub_id="Qwen/Qwen2-7B",
        params=QWEN2_7B_PARAMS,
        layers=28,
        hidden=3584,
        heads=28,
        kv_heads=4,
        head_dim=128,
        intermediate=18944,
        vocab=152064,
        tie_embeddings=False,
        max_position=131072,
        largest_layer_params=QWEN2_7B_EMBED,
        is_vl=False,
        vision_params=0,
        family="qwen2",
    )
    assert model_from_config(folder) == expected
    assert model_from_config(folder / "config.json") == expected


def test_qwen3_config_counts_qk_norms_and_its_own_head_dim(tmp_path: Path) -> None:
    spec = _from(tmp_path, QWEN3_0_6B)
    assert (spec.params, spec.head_dim, spec.tie_embeddings, spec.family) == (
        QWEN3_0_6B_PARAMS,
        128,
        True,
        "qwen3",
    )
    # the embedding 155_582_464 outweighs the MLP (1024 * 3072) and q (1024 * 2048) projections
    assert spec.largest_layer_params == 155_582_464


def test_llama_config_has_no_biases_unless_attention_bias_says_so(tmp_path: Path) -> None:
    assert _from(tmp_path, LLAMA_3_2_1B, "plain").params == LLAMA_3_2_1B_PARAMS
    biased = _from(tmp_path, {**LLAMA_3_2_1B, "attention_bias": True}, "biased")
    assert biased.params == LLAMA_3_2_1B_PARAMS + LLAMA_3_2_1B_BIASES
    unbiased = _from(tmp_path, {**QWEN2_7B, "attention_bias": False}, "unbiased")
    assert unbiased.params == QWEN2_7B_PARAMS - QWEN2_7B_BIASES


@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen2_5_vl", "qwen2_vl_text", "qwen2_5_vl_text"])
def test_every_qwen2_text_type_has_qkv_biases(tmp_path: Path, model_type: str) -> None:
    assert _from(tmp_path, {**QWEN2_7B, "model_type": model_type}).params == QWEN2_7B_PARAMS


def test_largest_layer_is_the_mlp_or_the_q_projection_when_the_vocabulary_is_small(tmp_path: Path) -> None:
    base = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "head_dim": 32}
    # embedding 32 * 64 = 2_048 < q projection 64 * 128 = 8_192 < MLP projection 64 * 256 = 16_384
    mlp = _from(tmp_path, {**base, "vocab_size": 32, "intermediate_size": 256}, "mlp")
    assert mlp.largest_layer_params == 16_384
    # embedding 100 * 64 = 6_400 and MLP projection 64 * 96 = 6_144 < q projection 64 * 128 = 8_192
    q = _from(tmp_path, {**base, "vocab_size": 100, "intermediate_size": 96}, "q")
    assert q.largest_layer_params == 8_192


# --- model_from_config: defaults and alternative key names


def test_minimal_config_takes_the_documented_defaults(tmp_path: Path) -> None:
    cfg = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100}
    spec = _from(tmp_path, cfg)
    # KV heads = heads, head_dim = 64 / 4 = 16, MLP 4 * 64 = 256, tied, 4096 positions, no bias
    assert (spec.kv_heads, spec.head_dim, spec.intermediate) == (4, 16, 256)
    assert (spec.tie_embeddings, spec.max_position, spec.family, spec.is_vl) == (True, 4096, "decoder", False)
    # one layer: attention 4 * 64*64 = 16_384, MLP 3 * 64*256 = 49_152, norms 128 -> 65_664;
    # 2 layers 131_328 + embedding 100 * 64 = 6_400 (tied) + final norm 64 = 137_792
    assert spec.params == 137_792
    assert spec.largest_layer_params == 64 * 256  # the MLP projection outweighs the 6_400 embedding
    assert spec.hub_id == str(tmp_path / "m")


def test_a_config_given_without_its_folder_is_named_after_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path, QWEN2_7B)
    monkeypatch.chdir(tmp_path)
    spec = model_from_config(Path("config.json"))  # no folder in the path: the file's own name
    assert (spec.name, spec.params) == ("config.json", QWEN2_7B_PARAMS)


def test_zero_sizes_fall_back_like_missing_ones(tmp_path: Path) -> None:
    cfg = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100}
    zeros = {"num_key_value_heads": 0, "head_dim": 0, "intermediate_size": 0, "max_position_embeddings": 0}
    assert _from(tmp_path, {**cfg, **zeros}, "zeros") == _from(tmp_path, cfg, "zeros")


def test_untied_flag_doubles_the_embedding(tmp_path: Path) -> None:
    cfg = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100}
    spec = _from(tmp_path, {**cfg, "tie_word_embeddings": False})
    assert (spec.tie_embeddings, spec.params) == (False, 137_792 + 6_400)
    # a value that is not a boolean is not read as "untied"
    assert _from(tmp_path, {**cfg, "tie_word_embeddings": 0}, "odd").tie_embeddings is True


@pytest.mark.parametrize(
    "renamed",
    [
        {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_inner": 96, "n_positions": 1024},
        {"d_model": 64, "num_layers": 2, "n_head": 4, "intermediate_size": 96, "seq_length": 1024},
    ],
)
def test_gpt_style_key_names_mean_the_same(tmp_path: Path, renamed: dict[str, int]) -> None:
    canonical = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 96,  # not the default 4 * 64
        "max_position_embeddings": 1024,
    }
    assert _from(tmp_path, {**renamed, "vocab_size": 100}) == _from(
        tmp_path, {**canonical, "vocab_size": 100}
    )


def test_head_dim_defaults_to_the_floor_of_hidden_over_heads(tmp_path: Path) -> None:
    # transformers' default: hidden_size // num_attention_heads = 100 // 8 = 12
    cfg = {"hidden_size": 100, "num_hidden_layers": 1, "num_attention_heads": 8, "vocab_size": 10}
    spec = _from(tmp_path, cfg)
    assert spec.head_dim == 12
    # q_dim = kv_dim = 8 * 12 = 96: attention 4 * 100 * 96 = 38_400, MLP 3 * 100 * 400 = 120_000,
    # norms 200 -> 158_600; embedding 10 * 100 = 1_000 (tied), final norm 100 -> 159_700
    assert spec.params == 159_700


def test_a_boolean_is_not_a_size(tmp_path: Path) -> None:
    cfg = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100}
    # True would read as 1 KV head; a boolean is skipped, so the default (all 4 heads) holds
    assert _from(tmp_path, {**cfg, "num_key_value_heads": True}).kv_heads == 4


def test_nested_text_config_wins_and_the_outer_model_type_is_kept(tmp_path: Path) -> None:
    text = {k: v for k, v in QWEN2_7B.items() if k != "model_type"}
    spec = _from(tmp_path, {"model_type": "qwen2", "hidden_size": 8, "vocab_size": 8, "text_config": text})
    # the text config's sizes, the outer "qwen2" type (so the q/k/v biases are counted)
    assert (spec.params, spec.family, spec.hidden) == (QWEN2_7B_PARAMS, "qwen2", 3584)


def test_text_model_type_names_the_family_and_an_empty_one_falls_back(tmp_path: Path) -> None:
    text = {**QWEN2_7B, "model_type": "qwen2_5_vl_text"}
    spec = _from(tmp_path, {"model_type": "qwen2_5_vl", "text_config": text}, "typed")
    assert (spec.family, spec.params) == ("qwen2_5_vl_text", QWEN2_7B_PARAMS)
    untyped = _from(
        tmp_path, {"model_type": "qwen2", "text_config": {**QWEN2_7B, "model_type": None}}, "none"
    )
    assert (untyped.family, untyped.params) == ("qwen2", QWEN2_7B_PARAMS)


@pytest.mark.parametrize(
    ("cfg", "missing"),
    [
        ({}, "lacks hidden_size, num_hidden_layers, num_attention_heads, vocab_size"),
        ({"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100}, "lacks num_attention_heads"),
        (
            {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 0, "vocab_size": 100},
            "lacks num_attention_heads",
        ),
        (
            {"hidden_size": 64, "num_hidden_layers": -2, "num_attention_heads": 4, "vocab_size": 100},
            "lacks num_hidden_layers",
        ),
    ],
)
def test_config_without_a_required_size_names_it(tmp_path: Path, cfg: dict[str, Any], missing: str) -> None:
    folder = _write(tmp_path / "m", cfg)
    with pytest.raises(UsageError) as info:
        model_from_config(folder)
    assert info.value.message == f"model config {folder / 'config.json'} {missing}"
    assert info.value.hint == "Give the config.json of a decoder-only language model"


@pytest.mark.parametrize(
    ("content", "message", "hint"),
    [
        (None, "model config {file} does not exist", "Point at a model folder holding config.json"),
        ("[1, 2]", "model config {file} is not a JSON object", "Give a Hugging Face config.json"),
        (b"\xff\xfe{", "cannot read model config {file}: ", "Give a Hugging Face config.json"),
    ],
)
def test_unreadable_config_errors(
    tmp_path: Path, content: str | bytes | None, message: str, hint: str
) -> None:
    file = tmp_path / "config.json"
    if isinstance(content, bytes):
        file.write_bytes(content)
    elif content is not None:
        file.write_text(content, encoding="utf-8")
    with pytest.raises(UsageError) as info:
        model_from_config(file)
    assert info.value.message.startswith(message.format(file=file))
    assert info.value.hint == hint


# --- vision towers read from a config


QWEN2_VL_VISION: dict[str, Any] = {  # vision_config of Qwen/Qwen2-VL-7B-Instruct
    "depth": 32,
    "embed_dim": 1280,
    "mlp_ratio": 4,
    "num_heads": 16,
    "in_chans": 3,
    "hidden_size": 3584,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "spatial_patch_size": 14,
    "temporal_patch_size": 2,
}
QWEN2_5_VL_VISION: dict[str, Any] = {  # vision_config of Qwen/Qwen2.5-VL-7B-Instruct
    "depth": 32,
    "hidden_act": "silu",
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "in_chans": 3,
    "out_hidden_size": 3584,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "spatial_patch_size": 14,
    "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31],
    "tokens_per_second": 2,
    "temporal_patch_size": 2,
}


def _vl(tmp_path: Path, vision: dict[str, Any], folder: str = "vl") -> ModelSpec:
    return _from(tmp_path, {**QWEN2_7B, "model_type": "qwen2_vl", "vision_config": vision}, folder)


def test_qwen2_vl_tower_is_sized_by_embed_dim_not_hidden_size(tmp_path: Path) -> None:
    spec = _vl(tmp_path, QWEN2_VL_VISION)
    assert (spec.is_vl, spec.vision_params) == (True, QWEN2_VL_7B_VISION)
    assert spec.params == QWEN2_7B_PARAMS + QWEN2_VL_7B_VISION
    # without hidden_size (nor mlp_ratio) the merger feeds the language model's 3584 and the MLP is 4x
    bare = {k: v for k, v in QWEN2_VL_VISION.items() if k not in ("hidden_size", "mlp_ratio")}
    assert _vl(tmp_path, bare, "bare").vision_params == QWEN2_VL_7B_VISION


def test_qwen2_5_vl_tower(tmp_path: Path) -> None:
    assert _vl(tmp_path, QWEN2_5_VL_VISION).vision_params == QWEN2_5_VL_7B_VISION
    # the sizes the code defaults (3 channels, 2 frames, 14x14 patches, 2x2 merge, the LLM's width)
    bare = {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420}
    assert _vl(tmp_path, bare, "bare").vision_params == QWEN2_5_VL_7B_VISION
    renamed = {"num_hidden_layers": 32, "hidden_size": 1280, "intermediate_size": 3420}
    assert _vl(tmp_path, renamed, "renamed").vision_params == QWEN2_5_VL_7B_VISION
    no_mlp = {k: v for k, v in QWEN2_5_VL_VISION.items() if k != "intermediate_size"}
    assert _vl(tmp_path, no_mlp, "no-mlp").vision_params == QWEN2_5_VL_DEFAULT_MLP_VISION


# Small towers with every size away from its default (checked against transformers' modules):
# width 32, 2 blocks, 1 channel, 1 frame, 4x4 patches, 3x3 merge, language model width 64.
# attention 4 * 32^2 + 4 * 32 = 4_224; patch embedding 1 * 1 * 4 * 4 * 32 = 512;
# merged width 9 * 32 = 288: merger norm + 288*288 + 288 + 288*64 + 64 = norm + 101_728
SMALL_TEXT = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 16}
SMALL_SIZES = {"depth": 2, "temporal_patch_size": 1, "patch_size": 4, "spatial_merge_size": 3}


@pytest.mark.parametrize(
    ("vision", "expected"),
    [
        # Qwen2-VL, MLP ratio 2 (32 -> 64 -> 32 with biases): 2 * 32 * 64 + 64 + 32 = 4_192;
        # LayerNorms 4 * 32 = 128; block 8_544, 2 blocks 17_088; merger LayerNorm 64 -> 101_792
        # -> 17_088 + 512 + 101_792 = 119_392
        ({"embed_dim": 32, "mlp_ratio": 2, "in_chans": 1, "hidden_size": 64}, 119_392),
        # Qwen2.5-VL, gated MLP of 48: 3 * 32 * 48 + 2 * 48 + 32 = 4_736; RMSNorms 64; block 9_024,
        # 2 blocks 18_048; merger RMSNorm 32 -> 101_760 -> 18_048 + 512 + 101_760 = 120_320
        ({"hidden_size": 32, "intermediate_size": 48, "in_channels": 1, "out_hidden_size": 64}, 120_320),
    ],
)
def test_small_towers_read_every_size(tmp_path: Path, vision: dict[str, Any], expected: int) -> None:
    spec = _from(tmp_path, {**SMALL_TEXT, "vision_config": {**SMALL_SIZES, **vision}})
    assert spec.vision_params == expected


def test_vision_config_without_depth_or_width_counts_nothing(tmp_path: Path) -> None:
    for folder, vision in (("no-depth", {"hidden_size": 1280}), ("no-width", {"depth": 32})):
        spec = _vl(tmp_path, vision, folder)
        assert (spec.is_vl, spec.vision_params, spec.params) == (True, 0, QWEN2_7B_PARAMS)


# --- the catalog's own rows (built again here: the module builds them once, at import)


def _qwen2_7b(name: str, hub_id: str, **changes: Any) -> ModelSpec:
    base = ModelSpec(
        name=name,
        hub_id=hub_id,
        params=QWEN2_7B_PARAMS,
        layers=28,
        hidden=3584,
        heads=28,
        kv_heads=4,
        head_dim=128,
        intermediate=18944,
        vocab=152064,
        tie_embeddings=False,
        max_position=131072,
        largest_layer_params=QWEN2_7B_EMBED,
        family="qwen2",
    )
    return replace(base, **changes)


def test_catalog_rows_give_every_field() -> None:
    models = _build_models()
    assert models["Qwen2-7B"] == _qwen2_7b("Qwen2-7B", "Qwen/Qwen2-7B")
    # the Qwen2 -Instruct configs say 32768 positions where the base says 131072
    assert models["Qwen2-7B-Instruct"] == _qwen2_7b(
        "Qwen2-7B-Instruct", "Qwen/Qwen2-7B-Instruct", max_position=32768
    )
    assert models["Qwen3-0.6B"] == ModelSpec(
        name="Qwen3-0.6B",
        hub_id="Qwen/Qwen3-0.6B",
        params=QWEN3_0_6B_PARAMS,
        layers=28,
        hidden=1024,
        heads=16,
        kv_heads=8,
        head_dim=128,
        intermediate=3072,
        vocab=151936,
        tie_embeddings=True,
        max_position=40960,
        largest_layer_params=155_582_464,
        family="qwen3",
    )
    assert "Qwen3-0.6B-Instruct" not in models  # Qwen3 is published without an -Instruct name
    llama = models["Llama-3.2-1B-Instruct"]  # Llama's instruct variant keeps the base's positions
    assert (llama.hub_id, llama.params, llama.max_position) == (
        "meta-llama/Llama-3.2-1B-Instruct",
        LLAMA_3_2_1B_PARAMS,
        131072,
    )


@pytest.mark.parametrize(
    ("name", "family", "vision", "max_position"),
    [
        ("Qwen2-VL-7B-Instruct", "qwen2_vl", QWEN2_VL_7B_VISION, 32768),
        ("Qwen2.5-VL-7B-Instruct", "qwen2_5_vl", QWEN2_5_VL_7B_VISION, 128000),
    ],
)
def test_catalog_vl_rows_add_the_vision_tower(name: str, family: str, vision: int, max_position: int) -> None:
    # the language part is Qwen2-7B's; the tower is counted in params (model cards: 8.29 B)
    expected = _qwen2_7b(
        name,
        f"Qwen/{name}",
        params=QWEN2_7B_PARAMS + vision,
        max_position=max_position,
        is_vl=True,
        vision_params=vision,
        family=family,
    )
    assert _build_models()[name] == expected


def test_facts_of_an_older_record_take_the_newer_fields_defaults() -> None:
    # a record written before is_vl, vision_params and family existed still rebuilds, with their defaults
    old = {
        "name": "Qwen2-7B",
        "hub_id": "Qwen/Qwen2-7B",
        "params": QWEN2_7B_PARAMS,
        "layers": 28,
        "hidden": 3584,
        "heads": 28,
        "kv_heads": 4,
        "head_dim": 128,
        "intermediate": 18944,
        "vocab": 152064,
        "tie_embeddings": False,
        "max_position": 131072,
        "largest_layer_params": QWEN2_7B_EMBED,
    }
    assert model_from_facts(old) == _qwen2_7b("Qwen2-7B", "Qwen/Qwen2-7B", family="")
    assert model_from_facts({**old, "unknown_key": 1}) == _qwen2_7b("Qwen2-7B", "Qwen/Qwen2-7B", family="")
    assert model_from_facts({k: v for k, v in old.items() if k != "vocab"}) is None


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (" Qwen/Qwen2-7B/ ", "Qwen2-7B"),  # spaces around, a trailing slash
        ("/models/Qwen/Qwen2.5-7B-Instruct", "Qwen2.5-7B-Instruct"),  # a local path: its last folder
        ("qwen2.5_7b instruct", "Qwen2.5-7B-Instruct"),  # underscores and spaces for dashes
    ],
)
def test_find_model_reads_paths_and_loose_spelling(query: str, expected: str) -> None:
    spec = find_model(query)
    assert spec is not None and spec.name == expected


@pytest.mark.parametrize("query", ["Qwen2-7BX", "Qwen2-7B-Chat", "Qwen/Qwen2-7B/extra"])
def test_a_name_that_only_starts_like_a_catalog_name_is_unknown(query: str) -> None:
    # unlike GPU names, model names are matched whole (a suffix can mean another model)
    assert find_model(query) is None


# --- GPUs: NVML names with suffixes, brands and form factors


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        # MIG slices and memory variants carry suffixes: the longest entry that starts the name
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "A100-40G"),  # not "a100" (A100-80G), a shorter prefix
        ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", "A100-80G"),
        ("NVIDIA H100 80GB HBM3e", "H100"),
        ("NVIDIA H200 NVL", "H200"),  # "h200": a 4-character entry is long enough
        # a PCIe name goes to a PCIe entry, never to the SXM card that a shorter prefix names
        ("NVIDIA A100-PCIE-40GB MIG 1g.5gb", "A100-40G-PCIe"),
        ("NVIDIA A100 80GB PCIe MIG 3g.40gb", "A100-80G-PCIe"),
        # brand words and the SXM generation are left out
        ("Tesla A100-SXM4-40GB", "A100-40G"),
        ("H100-SXM5-80GB", "H100"),
        ("a100 sxm 40 g", "A100-40G"),
    ],
)
def test_find_gpu_reads_nvml_suffixes(query: str, expected: str) -> None:
    gpu = find_gpu(query)
    assert gpu is not None and gpu.name == expected


@pytest.mark.parametrize("query", ["", "NVIDIA", "A10M", "A16", "H20 SXM5 96GB", "Radeon 9000"])
def test_find_gpu_leaves_short_and_foreign_names_unknown(query: str) -> None:
    # "a10" and "h20" are too short (3 characters) to stand for a longer name
    assert find_gpu(query) is None


def test_resolve_gpu_keeps_catalog_memory_unless_one_is_detected() -> None:
    a10 = find_gpu("A10")
    assert a10 is not None and a10.memory_bytes == 23028 * 1024**2  # NVML's total for an A10
    assert resolve_gpu("NVIDIA A10") == a10
    assert resolve_gpu("NVIDIA A10", 0) == a10  # 0: memory not detected
    assert resolve_gpu("NVIDIA A10", 22 * GIB) == replace(a10, memory_bytes=22 * GIB)
    assert resolve_gpu("Radeon 9000", 0) is None


def test_generic_gpu_is_an_a10_like_pcie_card() -> None:
    # peak bf16 125 TFLOP/s, 600 GB/s HBM, no NVLink, PCIe 4.0 x16 (32 GB/s a direction)
    expected = GpuSpec("unknown GPU", 16 * GIB, 125e12, 600e9, "pcie", 0.0, 32e9, known=False)
    assert generic_gpu("", 16 * GIB) == expected
    named = resolve_gpu("Radeon 9000", 16 * GIB)
    assert named == replace(expected, name="Radeon 9000")
    assert named is not None and named.peer_bytes_s == 32e9
