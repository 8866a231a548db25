"""Tiny Qwen2 models built locally, so a machine without GPUs or a hub can run real GRPO trials.

``ensure_model("tiny-qwen2")`` returns a directory any ``from_pretrained`` (transformers, TRL, ms-swift
with ``--model_type qwen2 --template qwen``) loads: ``config.json``, ``generation_config.json``,
``model.safetensors`` and a fast tokenizer with a Qwen-style chat template. The first call builds it
(seeded, so every machine builds the same weights) under the user's cache directory; later calls reuse
it. Nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autotune.cachedir import default_cache_dir
from autotune.errors import UsageError

__all__ = ["TINY_MODELS", "TinyModelSpec", "ensure_model", "is_tiny", "model_dir"]

#: bump when the recipe changes (tokenizer corpus, chat template, config fields): older builds are rebuilt.
RECIPE_VERSION = 1
_MARKER = ".autotune-model.json"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# Qwen2's own template, reduced to plain string contents: ``<|im_start|>role\ncontent<|im_end|>\n``.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class TinyModelSpec:
    """Sizes of one locally built Qwen2 model.

    Attributes:
        hidden_size: model width.
        num_hidden_layers: decoder layers.
        num_attention_heads: query heads.
        num_key_value_heads: key/value heads (grouped-query attention).
        intermediate_size: MLP width.
        vocab_size: BPE vocabulary size (specials included).
        max_position_embeddings: longest sequence the model accepts.
        approx_params: parameter count, for messages and tests.
        dtype: the torch dtype the weights are saved in (the checkpoint's ``dtype``, which the trainers
            load and train in).
    """

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int = 512
    max_position_embeddings: int = 2048
    approx_params: int = 0
    dtype: str = "float32"


TINY_MODELS: dict[str, TinyModelSpec] = {
    # head_dim = hidden / heads ≥ 32 in each: vLLM's CPU attention kernel takes 32, 64, 80 ... (not 16)
    "tiny-qwen2": TinyModelSpec(64, 2, 2, 1, 128, approx_params=107_000),
    "small-qwen2": TinyModelSpec(256, 4, 4, 2, 512, approx_params=2_500_000),
    "medium-qwen2": TinyModelSpec(512, 8, 8, 4, 1024, approx_params=19_000_000),
    # Qwen2-1.5B's layer shape (width, heads, MLP) with 14 layers: a GPU trial with real weight
    # traffic (scripts/gpu_check.sh), built in seconds, never downloaded. Saved in bf16 as the hub's
    # Qwen2 checkpoints are: TRL trains in the checkpoint's dtype, and the estimator counts bf16 states
    # (the first H200 run, with fp32 weights, measured 2.1x the memory the estimator predicted).
    "large-qwen2": TinyModelSpec(1536, 14, 12, 2, 8960, approx_params=655_000_000, dtype="bfloat16"),
}


def is_tiny(name: str) -> bool:
    """True when ``name`` is a model autotune builds locally."""
    return name in TINY_MODELS


def model_dir(name: str, cache_dir: Path | None = None) -> Path:
    """Where ``ensure_model(name, cache_dir)`` puts the model (built or not)."""
    return (cache_dir if cache_dir is not None else default_cache_dir()) / "models" / name


def _marker_payload(name: str, spec: TinyModelSpec, seed: int) -> dict[str, Any]:
    return {"name": name, "recipe_version": RECIPE_VERSION, "seed": seed, "spec": asdict(spec)}


def _is_complete(target: Path, expected: dict[str, Any]) -> bool:
    try:
        found = json.loads((target / _MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return found == expected


def ensure_model(name: str, cache_dir: Path | None = None, *, seed: int = 0) -> Path:
    """The directory of tiny model ``name``, built on first use.

    The build goes into a temporary directory next to the target, which is then renamed into place, so a
    reader never sees a half-written model and two processes building at once both end with one
    complete copy. A finished build is recognised by its marker file; a build from an older recipe is
    replaced.

    Args:
        name: one of :data:`TINY_MODELS`.
        cache_dir: cache root; default :func:`autotune.cachedir.default_cache_dir`. The model lands in
            ``<cache_dir>/models/<name>/``.
        seed: seed of the tokenizer corpus and the weights.

    Returns:
        The model directory.

    Raises:
        UsageError: ``name`` is not a tiny model, or the cache directory cannot be written.
    """
    spec = TINY_MODELS.get(name)
    if spec is None:
        raise UsageError(
            f"{name!r} is not a model autotune can build",
            hint=f"Use one of {', '.join(TINY_MODELS)}, or give a local model directory",
        )
    target = model_dir(name, cache_dir)
    expected = _marker_payload(name, spec, seed)
    if _is_complete(target, expected):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{name}.build-"))
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared like any other model folder
    except OSError as exc:
        raise UsageError(
            f"cannot write the model cache {target.parent}: {exc.strerror or exc}",
            hint="Set AUTOTUNE_CACHE_DIR to a writable directory",
        ) from None
    try:
        _build(tmp, spec, seed)
        (tmp / _MARKER).write_text(json.dumps(expected, indent=2) + "\n", encoding="utf-8")
        _install(tmp, target, expected)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _install(tmp: Path, target: Path, expected: dict[str, Any]) -> None:
    """Rename ``tmp`` to ``target``; a stale or half-written ``target`` is moved aside first."""
    for _ in range(3):
        try:
            os.replace(tmp, target)  # atomic; fails when target is a non-empty directory
            return
        except OSError:
            if _is_complete(target, expected):
                return  # another process finished the same build first
            if target.exists():
                aside = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.stale-"))
                try:
                    os.replace(target, aside / "old")
                except OSError:
                    pass  # someone else moved it; retry the rename
                shutil.rmtree(aside, ignore_errors=True)
    os.replace(tmp, target)


def _build(out: Path, spec: TinyModelSpec, seed: int) -> None:
    """Train the tokenizer, initialise the model and save both to ``out``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    from autotune.workload.datasets import corpus_lines

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    roles = ["system user assistant"] * 50  # so role names in the chat template are single tokens
    bpe.train_from_iterator([*corpus_lines(3000, seed), *roles], trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        model_max_length=spec.max_position_embeddings,
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)

    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert isinstance(pad_id, int)  # one token in, one id out
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(getattr(torch, spec.dtype))
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id, do_sample=True)
    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out)
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()
