from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from autotune.errors import UsageError
from autotune.estimate import (
    GIB,
    find_gpu,
    find_model,
    generic_gpu,
    known_gpus,
    known_models,
    model_from_config,
    model_from_facts,
    resolve_gpu,
)

# Published parameter counts (model cards / safetensors index totals).
PUBLISHED = {
    "Qwen2-7B": 7.62e9,
    "Qwen2.5-0.5B": 0.494e9,
    "Qwen2.5-3B": 3.09e9,
    "Qwen2.5-14B": 14.77e9,
    "Qwen2.5-32B": 32.76e9,
    "Qwen2.5-72B": 72.71e9,
    "Qwen3-8B": 8.19e9,
    "Qwen3-32B": 32.76e9,
    "Qwen2.5-VL-7B-Instruct": 8.29e9,
    "Qwen2.5-VL-3B-Instruct": 3.75e9,
    "Llama-3.2-1B": 1.24e9,
    "Llama-3.1-8B": 8.03e9,
    "Llama-3.3-70B-Instruct": 70.55e9,
    "Mistral-7B-v0.1": 7.24e9,
    "DeepSeek-R1-Distill-Qwen-1.5B": 1.78e9,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_published_totals(name: str) -> None:
    spec = find_model(name)
    assert spec is not None
    assert spec.params == pytest.approx(PUBLISHED[name], rel=0.005)


def test_qwen2_7b_matches_deepspeed_reference_numbers() -> None:
    # cpu-trials.md: 7.6B params, 544M largest layer (the embedding).
    spec = find_model("Qwen2-7B")
    assert spec is not None
    assert spec.params == 7_615_616_512
    assert spec.largest_layer_params == 152064 * 3584
    assert spec.kv_bytes_per_token == 2 * 28 * 4 * 128 * 2


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("Qwen2-7B", "Qwen2-7B"),
        ("Qwen/Qwen2-7B", "Qwen2-7B"),
        ("qwen2-7b", "Qwen2-7B"),
        ("qwen2.5-7b-instruct", "Qwen2.5-7B-Instruct"),
        ("Qwen/Qwen2.5-VL-7B-Instruct", "Qwen2.5-VL-7B-Instruct"),
        ("Qwen2.5-VL-3B", "Qwen2.5-VL-3B-Instruct"),
        ("meta-llama/Meta-Llama-3-8B-Instruct", "Llama-3-8B-Instruct"),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "DeepSeek-R1-Distill-Qwen-32B"),
        ("mistralai/Mistral-7B-v0.1", "Mistral-7B-v0.1"),
    ],
)
def test_find_model_aliases(query: str, expected: str) -> None:
    spec = find_model(query)
    assert spec is not None and spec.name == expected


def test_unknown_model_is_none() -> None:
    assert find_model("Qwen9-1T") is None
    assert find_model("") is None


def test_catalog_covers_the_families_grpo_users_train() -> None:
    names = set(known_models())
    for size in ("0.5B", "1.5B", "7B", "72B"):
        assert f"Qwen2-{size}" in names
    for size in ("0.5B", "1.5B", "3B", "7B", "14B", "32B", "72B"):
        assert f"Qwen2.5-{size}" in names
    for size in ("0.6B", "1.7B", "4B", "8B", "14B", "32B"):
        assert f"Qwen3-{size}" in names
    assert {
        "Qwen2.5-VL-3B-Instruct",
        "Qwen2.5-VL-7B-Instruct",
        "Llama-3.2-1B",
        "Llama-3.1-8B",
        "Llama-3.1-70B",
        "Mistral-7B-v0.1",
    } <= names
    for size in ("1.5B", "7B", "14B", "32B"):
        assert f"DeepSeek-R1-Distill-Qwen-{size}" in names


def test_instruct_variants_keep_architecture_but_not_max_position() -> None:
    base, inst = find_model("Qwen2.5-7B"), find_model("Qwen2.5-7B-Instruct")
    assert base is not None and inst is not None
    assert base.params == inst.params and base.layers == inst.layers
    assert (base.max_position, inst.max_position) == (131072, 32768)


def test_model_facts_round_trip() -> None:
    spec = find_model("Qwen2.5-VL-7B-Instruct")
    assert spec is not None
    assert model_from_facts(asdict(spec)) == spec
    assert model_from_facts({"name": "x"}) is None


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "does not exist"),
        ("{not json", "cannot read"),
        ('{"hidden_size": 8}', "lacks num_hidden_layers"),
        ("[1]", "not a JSON object"),
    ],
)
def test_model_from_config_errors(tmp_path: Path, content: str | None, needle: str) -> None:
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UsageError) as info:
        model_from_config(path)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


# --- GPUs


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("A10", "A10"),
        ("a10", "A10"),
        ("NVIDIA A10", "A10"),
        ("A100", "A100-80G"),
        ("a100-80g", "A100-80G"),
        ("A100-40GB", "A100-40G"),
        ("NVIDIA A100-SXM4-80GB", "A100-80G"),
        ("NVIDIA A100-SXM4-40GB", "A100-40G"),
        ("NVIDIA A100 80GB PCIe", "A100-80G-PCIe"),
        ("NVIDIA A800-SXM4-80GB", "A800-80G"),
        ("H100", "H100"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("H800", "H800"),
        ("NVIDIA H200", "H200"),
        ("h20", "H20"),
        ("L40S", "L40S"),
        ("RTX 3090", "RTX3090"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
        ("4090", "RTX4090"),
    ],
)
def test_find_gpu_short_and_nvml_names(query: str, expected: str) -> None:
    gpu = find_gpu(query)
    assert gpu is not None and gpu.name == expected


def test_a10_and_a100_are_not_confused() -> None:
    a10, a100 = find_gpu("A10"), find_gpu("A100")
    assert a10 is not None and a100 is not None
    assert a10.memory_bytes < 24 * GIB < a100.memory_bytes
    assert a10.interconnect == "pcie" and a100.interconnect == "nvlink"


def test_gpu_facts_follow_the_reference() -> None:
    # gpu-and-memory.md: peak dense bf16
    expected = {
        "H100": 989e12,
        "H800": 989e12,
        "H200": 989e12,
        "A100-80G": 312e12,
        "A800-80G": 312e12,
        "L40S": 362e12,
        "H20": 148e12,
        "A10": 125e12,
        "RTX3090": 71e12,
        "RTX4090": 165e12,
    }
    for name, flops in expected.items():
        gpu = find_gpu(name)
        assert gpu is not None and gpu.bf16_flops == flops
    assert set(expected) <= set(known_gpus())


def test_unknown_gpu_falls_back_to_memory() -> None:
    assert find_gpu("Radeon 9000") is None
    assert resolve_gpu("Radeon 9000") is None
    gpu = resolve_gpu("Radeon 9000", 32 * GIB)
    assert gpu is not None and not gpu.known and gpu.memory_bytes == 32 * GIB
    assert generic_gpu("x", GIB).memory_bytes == GIB


def test_detected_memory_overrides_catalog_memory() -> None:
    gpu = resolve_gpu("NVIDIA A100-SXM4-80GB", 80 * GIB)
    assert gpu is not None and gpu.known and gpu.name == "A100-80G" and gpu.memory_bytes == 80 * GIB
