"""Architecture facts of the models people fine-tune with GRPO, and facts of the GPUs they use.

Model parameter counts are computed from the architecture (the same arithmetic as summing
``p.numel()`` over a Hugging Face model, shared embeddings counted once), so a catalog entry and a
``config.json`` on disk give the same numbers. ``largest_layer_params`` follows DeepSpeed's
``model_to_params``: the largest single module's own parameters, which for these models is the token
embedding (or one MLP projection when the vocabulary is small).

GPU memory is the total NVML reports (``nvidia-smi --query-gpu=memory.total``), not the marketing size;
peak bf16 FLOP/s are dense tensor-core numbers; bandwidths are nominal, per direction.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from autotune.errors import UsageError

__all__ = [
    "GIB",
    "GpuSpec",
    "ModelSpec",
    "find_gpu",
    "find_model",
    "generic_gpu",
    "known_gpus",
    "known_models",
    "model_from_config",
    "model_from_facts",
    "resolve_gpu",
]

GIB = 1024**3
_MIB = 1024**2


@dataclass(frozen=True)
class ModelSpec:
    """Architecture facts of one decoder-only model (the language part of a VL model).

    Attributes:
        name: the catalog name (``Qwen2-7B``) or the folder a config came from.
        hub_id: the Hugging Face id (``Qwen/Qwen2-7B``), or a local path.
        params: total parameters, shared embeddings counted once, vision tower included.
        layers: decoder layers.
        hidden: hidden size.
        heads: attention heads.
        kv_heads: key/value heads (grouped-query attention).
        head_dim: size of one attention head.
        intermediate: MLP intermediate size.
        vocab: vocabulary size (rows of the embedding and of the LM head).
        tie_embeddings: True when the LM head shares the embedding matrix.
        max_position: ``max_position_embeddings`` (what vLLM uses when no max_model_len is given).
        largest_layer_params: the largest single module's own parameters (DeepSpeed ZeRO-3 estimate).
        is_vl: True for vision-language models.
        vision_params: parameters of the vision tower and its merger (0 for text models).
        family: architecture family (qwen2, qwen3, llama, mistral, ...).
    """

    name: str
    hub_id: str
    params: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tie_embeddings: bool
    max_position: int
    largest_layer_params: int
    is_vl: bool = False
    vision_params: int = 0
    family: str = ""

    @property
    def kv_bytes_per_token(self) -> int:
        """bf16 KV-cache bytes for one token on one GPU at tensor-parallel 1 (K and V, every layer)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


@dataclass(frozen=True)
class GpuSpec:
    """Facts of one GPU model.

    Attributes:
        name: catalog name (``A100-80G``).
        memory_bytes: total memory as NVML reports it.
        bf16_flops: peak dense bf16 tensor FLOP/s.
        hbm_bytes_s: memory bandwidth, bytes/s.
        interconnect: ``nvlink`` or ``pcie`` between GPUs of one node.
        nvlink_bytes_s: NVLink bandwidth per GPU (bytes/s, both directions), 0 without NVLink.
        pcie_bytes_s: host link bandwidth per direction (bytes/s), used for offload traffic.
        nvml_names: NVML product names that mean this GPU.
        known: False for a GPU built from a detected or declared memory size only.
    """

    name: str
    memory_bytes: int
    bf16_flops: float
    hbm_bytes_s: float
    interconnect: Literal["nvlink", "pcie"]
    nvlink_bytes_s: float = 0.0
    pcie_bytes_s: float = 32e9
    nvml_names: tuple[str, ...] = field(default=(), compare=False)
    known: bool = True

    @property
    def peer_bytes_s(self) -> float:
        """Nominal GPU-to-GPU bandwidth (NVLink when present, else PCIe)."""
        return (
            self.nvlink_bytes_s / 2
            if self.interconnect == "nvlink" and self.nvlink_bytes_s
            else self.pcie_bytes_s
        )


# ---------------------------------------------------------------------------------------------- models


def _decoder_params(
    *,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    intermediate: int,
    vocab: int,
    tie: bool,
    qkv_bias: bool,
    qk_norm: bool,
) -> tuple[int, int]:
    """(total parameters, largest single module's parameters) of a Llama-style decoder."""
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    attn = hidden * q_dim + 2 * hidden * kv_dim + q_dim * hidden
    if qkv_bias:
        attn += q_dim + 2 * kv_dim
    mlp = 3 * hidden * intermediate
    norms = 2 * hidden + (2 * head_dim if qk_norm else 0)
    embed = vocab * hidden
    total = layers * (attn + mlp + norms) + embed * (1 if tie else 2) + hidden
    largest = max(embed, hidden * intermediate, hidden * q_dim)
    return total, largest


def _int(cfg: dict[str, Any], *keys: str) -> int | None:
    """The first of ``keys`` that holds an integer (a boolean is not one), or None."""
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _size(cfg: dict[str, Any], *keys: str, default: int) -> int:
    """The first of ``keys`` that holds a non-zero integer, else ``default``."""
    return _int(cfg, *keys) or default


def _vision_params_from_config(vision: dict[str, Any], llm_hidden: int) -> int:
    """Vision tower + patch merger of Qwen2-VL or Qwen2.5-VL, from its ``vision_config``.

    Qwen2-VL names the tower's width ``embed_dim`` (its ``hidden_size`` is the merger's output), with
    LayerNorms and a GELU MLP of ``mlp_ratio`` times the width; Qwen2.5-VL names the width
    ``hidden_size`` (``out_hidden_size`` the output), with RMSNorms and a gated MLP of
    ``intermediate_size``. Attention is one qkv and one output projection with biases; the patch
    embedding a Conv3d without bias; the merger a norm and two linear layers over 2x2 merged patches,
    whose output feeds the language model: its width is ``llm_hidden`` in any config that runs.
    """
    qwen2_vl = "embed_dim" in vision
    depth = _int(vision, "depth", "num_hidden_layers")
    dim = _int(vision, "embed_dim" if qwen2_vl else "hidden_size")
    if not depth or not dim:
        return 0
    if qwen2_vl:
        inter = int(dim * float(vision.get("mlp_ratio", 4)))
        mlp = 2 * dim * inter + inter + dim
        norms, ln_q = 4 * dim, 2 * dim
    else:
        inter = _size(vision, "intermediate_size", default=4 * dim)
        mlp = 3 * dim * inter + 2 * inter + dim
        norms, ln_q = 2 * dim, dim
    attn = 4 * dim * dim + 4 * dim
    patch = (
        _size(vision, "in_channels", "in_chans", default=3)
        * _size(vision, "temporal_patch_size", default=2)
        * _size(vision, "patch_size", default=14) ** 2
        * dim
    )
    merge = _size(vision, "spatial_merge_size", default=2) ** 2 * dim
    merger = ln_q + merge * merge + merge + merge * llm_hidden + llm_hidden
    return depth * (attn + mlp + norms) + patch + merger


#: ``vision_config`` of the published Qwen VL checkpoints (the keys the tower's size depends on); the
#: merger's output width is the language model's hidden size
_QWEN_VISION: dict[str, dict[str, Any]] = {
    "qwen2_vl": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "in_chans": 3, "patch_size": 14},
    "qwen2_5_vl": {
        "depth": 32,
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "in_chans": 3,
        "patch_size": 14,
    },
}
#: model types whose attention projections q, k, v carry a bias (unless ``attention_bias`` says otherwise)
_QKV_BIAS_TYPES = frozenset({"qwen2", "qwen2_vl", "qwen2_5_vl", "qwen2_vl_text", "qwen2_5_vl_text"})


# (name, hub id, family, layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, tie, max_position)
_ModelRow = tuple[str, str, str, int, int, int, int, int, int, int, bool, int]
# fmt: off
_MODEL_ROWS: tuple[_ModelRow, ...] = (
    # Qwen2 (base configs say 131072; the -Instruct configs 32768)
    ("Qwen2-0.5B", "Qwen/Qwen2-0.5B", "qwen2", 24, 896, 14, 2, 64, 4864, 151936, True, 131072),
    ("Qwen2-1.5B", "Qwen/Qwen2-1.5B", "qwen2", 28, 1536, 12, 2, 128, 8960, 151936, True, 131072),
    ("Qwen2-7B", "Qwen/Qwen2-7B", "qwen2", 28, 3584, 28, 4, 128, 18944, 152064, False, 131072),
    ("Qwen2-72B", "Qwen/Qwen2-72B", "qwen2", 80, 8192, 64, 8, 128, 29568, 152064, False, 131072),
    # Qwen2.5
    ("Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B", "qwen2", 24, 896, 14, 2, 64, 4864, 151936, True, 32768),
    ("Qwen2.5-1.5B", "Qwen/Qwen2.5-1.5B", "qwen2", 28, 1536, 12, 2, 128, 8960, 151936, True, 131072),
    ("Qwen2.5-3B", "Qwen/Qwen2.5-3B", "qwen2", 36, 2048, 16, 2, 128, 11008, 151936, True, 32768),
    ("Qwen2.5-7B", "Qwen/Qwen2.5-7B", "qwen2", 28, 3584, 28, 4, 128, 18944, 152064, False, 131072),
    ("Qwen2.5-14B", "Qwen/Qwen2.5-14B", "qwen2", 48, 5120, 40, 8, 128, 13824, 152064, False, 131072),
    ("Qwen2.5-32B", "Qwen/Qwen2.5-32B", "qwen2", 64, 5120, 40, 8, 128, 27648, 152064, False, 131072),
    ("Qwen2.5-72B", "Qwen/Qwen2.5-72B", "qwen2", 80, 8192, 64, 8, 128, 29568, 152064, False, 131072),
    # Qwen3 (dense)
    ("Qwen3-0.6B", "Qwen/Qwen3-0.6B", "qwen3", 28, 1024, 16, 8, 128, 3072, 151936, True, 40960),
    ("Qwen3-1.7B", "Qwen/Qwen3-1.7B", "qwen3", 28, 2048, 16, 8, 128, 6144, 151936, True, 40960),
    ("Qwen3-4B", "Qwen/Qwen3-4B", "qwen3", 36, 2560, 32, 8, 128, 9728, 151936, True, 40960),
    ("Qwen3-8B", "Qwen/Qwen3-8B", "qwen3", 36, 4096, 32, 8, 128, 12288, 151936, False, 40960),
    ("Qwen3-14B", "Qwen/Qwen3-14B", "qwen3", 40, 5120, 40, 8, 128, 17408, 151936, False, 40960),
    ("Qwen3-32B", "Qwen/Qwen3-32B", "qwen3", 64, 5120, 64, 8, 128, 25600, 151936, False, 40960),
    # Vision-language (language part; the vision tower is added below)
    ("Qwen2-VL-2B-Instruct", "Qwen/Qwen2-VL-2B-Instruct", "qwen2_vl", 28, 1536, 12, 2, 128, 8960, 151936, True, 32768),
    ("Qwen2-VL-7B-Instruct", "Qwen/Qwen2-VL-7B-Instruct", "qwen2_vl", 28, 3584, 28, 4, 128, 18944, 152064, False, 32768),
    ("Qwen2.5-VL-3B-Instruct", "Qwen/Qwen2.5-VL-3B-Instruct", "qwen2_5_vl", 36, 2048, 16, 2, 128, 11008, 151936, True, 128000),
    ("Qwen2.5-VL-7B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct", "qwen2_5_vl", 28, 3584, 28, 4, 128, 18944, 152064, False, 128000),
    # Llama 3.x
    ("Llama-3.2-1B", "meta-llama/Llama-3.2-1B", "llama", 16, 2048, 32, 8, 64, 8192, 128256, True, 131072),
    ("Llama-3.2-3B", "meta-llama/Llama-3.2-3B", "llama", 28, 3072, 24, 8, 128, 8192, 128256, True, 131072),
    ("Llama-3-8B", "meta-llama/Meta-Llama-3-8B", "llama", 32, 4096, 32, 8, 128, 14336, 128256, False, 8192),
    ("Llama-3.1-8B", "meta-llama/Llama-3.1-8B", "llama", 32, 4096, 32, 8, 128, 14336, 128256, False, 131072),
    ("Llama-3-70B", "meta-llama/Meta-Llama-3-70B", "llama", 80, 8192, 64, 8, 128, 28672, 128256, False, 8192),
    ("Llama-3.1-70B", "meta-llama/Llama-3.1-70B", "llama", 80, 8192, 64, 8, 128, 28672, 128256, False, 131072),
    ("Llama-3.3-70B-Instruct", "meta-llama/Llama-3.3-70B-Instruct", "llama", 80, 8192, 64, 8, 128, 28672, 128256, False, 131072),
    # Mistral
    ("Mistral-7B-v0.1", "mistralai/Mistral-7B-v0.1", "mistral", 32, 4096, 32, 8, 128, 14336, 32000, False, 32768),
    ("Mistral-7B-v0.3", "mistralai/Mistral-7B-v0.3", "mistral", 32, 4096, 32, 8, 128, 14336, 32768, False, 32768),
    # DeepSeek-R1 distills (Qwen2.5-Math-1.5B/7B, Qwen2.5-14B/32B, Llama-3.1-8B, Llama-3.3-70B bases)
    ("DeepSeek-R1-Distill-Qwen-1.5B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "qwen2", 28, 1536, 12, 2, 128, 8960, 151936, False, 131072),
    ("DeepSeek-R1-Distill-Qwen-7B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "qwen2", 28, 3584, 28, 4, 128, 18944, 152064, False, 131072),
    ("DeepSeek-R1-Distill-Qwen-14B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B", "qwen2", 48, 5120, 40, 8, 128, 13824, 152064, False, 131072),
    ("DeepSeek-R1-Distill-Qwen-32B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "qwen2", 64, 5120, 40, 8, 128, 27648, 152064, False, 131072),
    ("DeepSeek-R1-Distill-Llama-8B", "deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "llama", 32, 4096, 32, 8, 128, 14336, 128256, False, 131072),
    ("DeepSeek-R1-Distill-Llama-70B", "deepseek-ai/DeepSeek-R1-Distill-Llama-70B", "llama", 80, 8192, 64, 8, 128, 28672, 128256, False, 131072),
)
# fmt: on

# Instruct variants that differ from their base only in name (and, for Qwen2/2.5, max_position).
_INSTRUCT_OF: dict[str, int | None] = {
    "Qwen2-0.5B": 32768,
    "Qwen2-1.5B": 32768,
    "Qwen2-7B": 32768,
    "Qwen2-72B": 32768,
    "Qwen2.5-0.5B": 32768,
    "Qwen2.5-1.5B": 32768,
    "Qwen2.5-3B": 32768,
    "Qwen2.5-7B": 32768,
    "Qwen2.5-14B": 32768,
    "Qwen2.5-32B": 32768,
    "Qwen2.5-72B": 32768,
    "Llama-3.2-1B": None,
    "Llama-3.2-3B": None,
    "Llama-3-8B": None,
    "Llama-3.1-8B": None,
    "Llama-3-70B": None,
    "Llama-3.1-70B": None,
}


def _spec_from_row(row: _ModelRow) -> ModelSpec:
    name, hub_id, family, layers, hidden, heads, kv_heads, head_dim, inter, vocab, tie, max_pos = row
    total, largest = _decoder_params(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=inter,
        vocab=vocab,
        tie=tie,
        qkv_bias=family in _QKV_BIAS_TYPES,
        qk_norm=family == "qwen3",
    )
    vision_cfg = _QWEN_VISION.get(family)
    vision = _vision_params_from_config(vision_cfg, hidden) if vision_cfg else 0
    return ModelSpec(
        name=name,
        hub_id=hub_id,
        params=total + vision,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=inter,
        vocab=vocab,
        tie_embeddings=tie,
        max_position=max_pos,
        largest_layer_params=largest,
        is_vl=vision_cfg is not None,
        vision_params=vision,
        family=family,
    )


def _build_models() -> dict[str, ModelSpec]:
    out: dict[str, ModelSpec] = {}
    for row in _MODEL_ROWS:
        spec = _spec_from_row(row)
        out[spec.name] = spec
        if spec.name in _INSTRUCT_OF:
            max_pos = _INSTRUCT_OF[spec.name] or spec.max_position
            inst = replace(
                spec, name=f"{spec.name}-Instruct", hub_id=f"{spec.hub_id}-Instruct", max_position=max_pos
            )
            out[inst.name] = inst
    return out


_MODELS: dict[str, ModelSpec] = _build_models()


def _norm_model(name: str) -> str:
    text = name.strip().rstrip("/").lower()
    if "/" in text:
        text = text.rsplit("/", 1)[1]
    text = text.replace("_", "-").replace(" ", "-")
    text = re.sub(r"^meta-llama-", "llama-", text)  # Meta-Llama-3-8B → llama-3-8b
    return text


_MODEL_INDEX: dict[str, str] = {}
for _spec in _MODELS.values():
    _MODEL_INDEX[_norm_model(_spec.name)] = _spec.name
    _MODEL_INDEX.setdefault(_norm_model(_spec.hub_id), _spec.name)
    if _spec.is_vl:  # Qwen2.5-VL-7B → the only published variant, -Instruct
        _MODEL_INDEX.setdefault(_norm_model(_spec.name.removesuffix("-Instruct")), _spec.name)


def known_models() -> list[str]:
    """Catalog names, in catalog order."""
    return list(_MODELS)


def find_model(name: str) -> ModelSpec | None:
    """The catalog entry for ``name`` (case-insensitive; an ``org/`` prefix is ignored), or None.

    ``Qwen2-7B``, ``Qwen/Qwen2-7B`` and ``qwen2.5-7b-instruct`` all resolve.
    """
    key = _MODEL_INDEX.get(_norm_model(name))
    return _MODELS[key] if key is not None else None


def _read_config(file: Path) -> dict[str, Any]:
    """The JSON object of a ``config.json``; a missing, unreadable or non-object file is a UsageError."""
    try:
        data = json.loads(file.read_bytes())  # JSON bytes: UTF-8 (or the UTF-16/32 RFC 8259 allows)
    except FileNotFoundError:
        raise UsageError(
            f"model config {file} does not exist", hint="Point at a model folder holding config.json"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(
            f"cannot read model config {file}: {exc}", hint="Give a Hugging Face config.json"
        ) from None
    if not isinstance(data, dict):
        raise UsageError(f"model config {file} is not a JSON object", hint="Give a Hugging Face config.json")
    return data


#: the sizes a decoder config must give (a positive integer under the first name or one of its aliases)
_REQUIRED_SIZES: tuple[tuple[str, ...], ...] = (
    ("hidden_size", "n_embd", "d_model"),
    ("num_hidden_layers", "n_layer", "num_layers"),
    ("num_attention_heads", "n_head"),
    ("vocab_size",),
)


def _required_sizes(cfg: dict[str, Any], file: Path) -> list[int]:
    """hidden size, layers, attention heads and vocabulary of ``cfg``; any missing is a UsageError."""
    sizes = {keys[0]: _size(cfg, *keys, default=0) for keys in _REQUIRED_SIZES}
    missing = [name for name, size in sizes.items() if size <= 0]
    if missing:
        raise UsageError(
            f"model config {file} lacks {', '.join(missing)}",
            hint="Give the config.json of a decoder-only language model",
        )
    return list(sizes.values())


def model_from_config(path: Path) -> ModelSpec:
    """Architecture facts from a Hugging Face ``config.json`` (or the folder holding one).

    Multimodal configs that nest the language model under ``text_config`` are understood; a vision
    tower (``vision_config``) is counted in ``params``.

    Raises:
        UsageError: the file is missing, is not JSON, or lacks the keys of a decoder-only model.
    """
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    data = _read_config(file)
    text = data.get("text_config")
    cfg = {**data, **text} if isinstance(text, dict) else data
    hidden, layers, heads, vocab = _required_sizes(cfg, file)
    kv_heads = _size(cfg, "num_key_value_heads", default=heads)
    head_dim = _size(cfg, "head_dim", default=hidden // heads)
    inter = _size(cfg, "intermediate_size", "n_inner", default=4 * hidden)
    tie = cfg.get("tie_word_embeddings") is not False  # tied unless it says false
    model_type = str(cfg.get("model_type") or data.get("model_type") or "")
    total, largest = _decoder_params(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=inter,
        vocab=vocab,
        tie=tie,
        qkv_bias=bool(cfg.get("attention_bias", model_type in _QKV_BIAS_TYPES)),
        qk_norm=model_type.startswith("qwen3"),
    )
    vision_cfg = data.get("vision_config")
    is_vl = isinstance(vision_cfg, dict)
    vision = _vision_params_from_config(vision_cfg, hidden) if isinstance(vision_cfg, dict) else 0
    return ModelSpec(
        name=file.parent.name or str(file),
        hub_id=str(data.get("_name_or_path") or file.parent),
        params=total + vision,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=inter,
        vocab=vocab,
        tie_embeddings=tie,
        max_position=_size(cfg, "max_position_embeddings", "n_positions", "seq_length", default=4096),
        largest_layer_params=largest,
        is_vl=is_vl,
        vision_params=vision,
        family=model_type or "decoder",
    )


def model_from_facts(facts: dict[str, Any]) -> ModelSpec | None:
    """Rebuild a :class:`ModelSpec` from ``dataclasses.asdict`` output (``ModelRef.facts``), or None."""
    names = {f for f in ModelSpec.__dataclass_fields__}
    required = names - {"is_vl", "vision_params", "family"}
    if not required <= set(facts):
        return None
    return ModelSpec(**{k: v for k, v in facts.items() if k in names})


# ------------------------------------------------------------------------------------------------ GPUs

_GEN4, _GEN5 = 32e9, 64e9

_GPUS: tuple[GpuSpec, ...] = (
    GpuSpec("A10", 23028 * _MIB, 125e12, 600e9, "pcie", 0.0, _GEN4, ("NVIDIA A10",)),
    GpuSpec("A100-40G", 40960 * _MIB, 312e12, 1555e9, "nvlink", 600e9, _GEN4, ("NVIDIA A100-SXM4-40GB",)),
    GpuSpec("A100-40G-PCIe", 40960 * _MIB, 312e12, 1555e9, "pcie", 0.0, _GEN4, ("NVIDIA A100-PCIE-40GB",)),
    GpuSpec("A100-80G", 81920 * _MIB, 312e12, 2039e9, "nvlink", 600e9, _GEN4, ("NVIDIA A100-SXM4-80GB",)),
    GpuSpec(
        "A100-80G-PCIe",
        81920 * _MIB,
        312e12,
        1935e9,
        "pcie",
        0.0,
        _GEN4,
        ("NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-80GB"),
    ),
    GpuSpec("A800-80G", 81920 * _MIB, 312e12, 2039e9, "nvlink", 400e9, _GEN4, ("NVIDIA A800-SXM4-80GB",)),
    GpuSpec("A800-80G-PCIe", 81920 * _MIB, 312e12, 1935e9, "pcie", 0.0, _GEN4, ("NVIDIA A800 80GB PCIe",)),
    GpuSpec("H100", 81559 * _MIB, 989e12, 3350e9, "nvlink", 900e9, _GEN5, ("NVIDIA H100 80GB HBM3",)),
    GpuSpec("H100-PCIe", 81559 * _MIB, 756e12, 2000e9, "pcie", 0.0, _GEN5, ("NVIDIA H100 PCIe",)),
    GpuSpec("H100-NVL", 95830 * _MIB, 835e12, 3900e9, "nvlink", 600e9, _GEN5, ("NVIDIA H100 NVL",)),
    GpuSpec(
        "H800", 81559 * _MIB, 989e12, 3350e9, "nvlink", 400e9, _GEN5, ("NVIDIA H800", "NVIDIA H800 80GB HBM3")
    ),
    GpuSpec("H200", 143771 * _MIB, 989e12, 4800e9, "nvlink", 900e9, _GEN5, ("NVIDIA H200",)),
    GpuSpec("H20", 97871 * _MIB, 148e12, 4000e9, "nvlink", 900e9, _GEN5, ("NVIDIA H20",)),
    GpuSpec("L40S", 46068 * _MIB, 362e12, 864e9, "pcie", 0.0, _GEN4, ("NVIDIA L40S",)),
    GpuSpec("RTX3090", 24576 * _MIB, 71e12, 936e9, "pcie", 0.0, _GEN4, ("NVIDIA GeForce RTX 3090",)),
    GpuSpec("RTX4090", 24564 * _MIB, 165e12, 1008e9, "pcie", 0.0, _GEN4, ("NVIDIA GeForce RTX 4090",)),
)
_GPU_BY_NAME = {g.name: g for g in _GPUS}

# Short names people type → catalog name. Keys are normalised (see _norm_gpu).
_GPU_ALIASES: dict[str, str] = {
    "a100": "A100-80G",
    "a100sxm": "A100-80G",
    "a10040": "A100-40G",
    "a10080": "A100-80G",
    "a800": "A800-80G",
    "a80080": "A800-80G",
    "h100sxm": "H100",
    "h10080": "H100",
    "h100hbm3": "H100",
    "h800sxm": "H800",
    "h20096": "H20",
    "h200141": "H200",
    "3090": "RTX3090",
    "4090": "RTX4090",
    "l40s48": "L40S",
}


def _norm_gpu(name: str) -> str:
    """The lookup key of a GPU name: lower-case letters and digits, no brand, no memory unit, no SXM
    generation (``NVIDIA A100-SXM4-80GB`` → ``a100sxm80``)."""
    text = re.sub(r"[^a-z0-9]+", " ", name.lower())
    for word in ("nvidia", "geforce", "tesla"):
        text = text.replace(word, "")
    text = re.sub(r"(\d+)\s*(gb|g)\b", r"\1", text)  # 80GB / 80 g → 80
    text = re.sub(r"sxm\d", "sxm", text)  # A100-SXM4, H100-SXM5 → sxm
    return text.replace(" ", "")


_GPU_INDEX: dict[str, str] = dict(_GPU_ALIASES)
for _gpu in _GPUS:
    _GPU_INDEX[_norm_gpu(_gpu.name)] = _gpu.name
    for _nvml in _gpu.nvml_names:
        _GPU_INDEX[_norm_gpu(_nvml)] = _gpu.name
#: the index's keys of 4 characters or more, longest first: the prefixes an NVML name may carry
_GPU_PREFIXES: tuple[tuple[str, str], ...] = tuple(
    sorted(((k, n) for k, n in _GPU_INDEX.items() if len(k) >= 4), key=lambda kv: -len(kv[0]))
)


def known_gpus() -> list[str]:
    """Catalog names of GPUs, in catalog order."""
    return [g.name for g in _GPUS]


def gpu_variants(name: str) -> tuple[str, ...]:
    """The catalog GPUs a typed short name could mean when it names none of them exactly
    (``a100`` → ``A100-40G``, ``A100-40G-PCIe``, ``A100-80G``, ``A100-80G-PCIe``); empty when the name is
    a catalog name, an NVML name's prefix of one entry only, or matches none."""
    key = _norm_gpu(name)
    if not key or any(_norm_gpu(g.name) == key for g in _GPUS):
        return ()
    variants = tuple(g.name for g in _GPUS if _norm_gpu(g.name).startswith(key))
    return variants if len(variants) > 1 else ()


def find_gpu(name: str) -> GpuSpec | None:
    """The catalog entry for a short name (``A10``, ``a100-80g``, ``H100``) or an NVML name
    (``NVIDIA A100-SXM4-80GB``, ``NVIDIA GeForce RTX 4090``), or None when unknown."""
    key = _norm_gpu(name)  # an empty key matches no entry and starts with none
    # NVML names vary in suffixes ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", "NVIDIA H100 80GB HBM3e"): the
    # longest entry of 4 characters or more that starts the name (for a PCIe name a PCIe entry when one
    # starts it, since any longer entry that starts the name holds that one)
    hit = _GPU_INDEX.get(key) or next((n for k, n in _GPU_PREFIXES if key.startswith(k)), None)
    return _GPU_BY_NAME[hit] if hit is not None else None


def resolve_gpu(name: str, memory_bytes: int | None = None) -> GpuSpec | None:
    """The catalog GPU for ``name`` with the detected ``memory_bytes`` (when given) as its memory.

    Unknown names give a :func:`generic_gpu` of ``memory_bytes``, or None when that is unknown too.
    """
    spec = find_gpu(name)
    if spec is None:
        return generic_gpu(name, memory_bytes) if memory_bytes else None
    return replace(spec, memory_bytes=int(memory_bytes)) if memory_bytes else spec


def generic_gpu(name: str, memory_bytes: int) -> GpuSpec:
    """A GPU known only by its memory (unknown type, or declared with ``--gpu-memory-gib``).

    Speed facts are those of a mid-range PCIe card (A10-like: no NVLink, a PCIe 4.0 host link): they
    only order candidates.
    """
    return GpuSpec(
        name=name or "unknown GPU",
        memory_bytes=int(memory_bytes),
        bf16_flops=125e12,
        hbm_bytes_s=600e9,
        interconnect="pcie",
        known=False,
    )
