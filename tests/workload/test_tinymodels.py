from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cachedir import default_cache_dir
from autotune.errors import UsageError
from autotune.workload.tinymodels import TINY_MODELS, ensure_model, is_tiny, model_dir

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_model("tiny-qwen2", tmp_path_factory.mktemp("cache"))


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_names() -> None:
    assert is_tiny("tiny-qwen2") and is_tiny("small-qwen2") and is_tiny("medium-qwen2")
    assert not is_tiny("Qwen2-7B")
    with pytest.raises(UsageError, match="not a model autotune can build"):
        ensure_model("Qwen2-7B")


def test_default_cache_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert default_cache_dir() == tmp_path / "a"
    monkeypatch.delenv("AUTOTUNE_CACHE_DIR")
    assert default_cache_dir() == tmp_path / "x" / "autotune"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert default_cache_dir() == tmp_path / "h" / ".cache" / "autotune"
    assert model_dir("tiny-qwen2", tmp_path) == tmp_path / "models" / "tiny-qwen2"


def test_built_model_loads_with_expected_shape(tiny_dir: Path) -> None:
    spec = TINY_MODELS["tiny-qwen2"]
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2"
    assert config["hidden_size"] == spec.hidden_size
    assert config["num_hidden_layers"] == spec.num_hidden_layers
    assert config["tie_word_embeddings"] is True
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_dir)
    n_params = sum(p.numel() for p in model.parameters())
    assert abs(n_params - spec.approx_params) / spec.approx_params < 0.1
    gen = json.loads((tiny_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == config["eos_token_id"]
    assert gen["pad_token_id"] == config["pad_token_id"]


@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_every_built_in_model_has_a_head_size_vllms_cpu_kernel_takes(name: str) -> None:
    """vLLM's CPU attention takes head_dim 32, 64, 80, 96, 112, 128, 160, 192, 224, 256 or 512
    ("Unsupported CPU attention configuration: head_dim=16"); its Qwen2 reads hidden / heads."""
    spec = TINY_MODELS[name]
    assert spec.hidden_size // spec.num_attention_heads in (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
    assert spec.num_attention_heads % spec.num_key_value_heads == 0


def test_tokenizer_specials_and_chat_template(tiny_dir: Path) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(tiny_dir)
    assert tok.eos_token == "<|im_end|>"
    assert tok.pad_token == "<|endoftext|>"
    assert 400 <= len(tok) <= 512
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 3 + 4?"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok("<|im_start|>user\nWhat is 3 + 4?<|im_end|>")["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert ids[-1] == tok.eos_token_id
    assert tok.decode(tok("What is 12 + 7?")["input_ids"]) == "What is 12 + 7?"


def test_reuse_does_not_rebuild(tiny_dir: Path) -> None:
    before = (tiny_dir / "model.safetensors").stat().st_mtime_ns
    assert ensure_model("tiny-qwen2", tiny_dir.parent.parent) == tiny_dir
    assert (tiny_dir / "model.safetensors").stat().st_mtime_ns == before


def test_deterministic_and_replaces_incomplete_target(tiny_dir: Path, tmp_path: Path) -> None:
    broken = model_dir("tiny-qwen2", tmp_path)
    broken.mkdir(parents=True)
    (broken / "config.json").write_text("{}")  # a half-written folder without the marker
    rebuilt = ensure_model("tiny-qwen2", tmp_path)
    assert rebuilt == broken
    assert _digest(rebuilt / "model.safetensors") == _digest(tiny_dir / "model.safetensors")
    assert _digest(rebuilt / "tokenizer.json") == _digest(tiny_dir / "tokenizer.json")
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["tiny-qwen2"]


def test_stale_recipe_is_rebuilt(tiny_dir: Path, tmp_path: Path) -> None:
    target = ensure_model("tiny-qwen2", tmp_path)
    marker = target / ".autotune-model.json"
    data = json.loads(marker.read_text())
    data["recipe_version"] = -1
    marker.write_text(json.dumps(data))
    ensure_model("tiny-qwen2", tmp_path)
    assert json.loads(marker.read_text())["recipe_version"] != -1


def test_two_processes_building_at_once(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from autotune.workload.tinymodels import ensure_model; "
        "print('BUILT', ensure_model('tiny-qwen2', Path(sys.argv[1])))"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env
        )
        for _ in range(2)
    ]
    # the last line: importing transformers may print a DeepSpeed accelerator notice on stdout first
    outs = [p.communicate(timeout=300)[0].strip().splitlines()[-1].removeprefix("BUILT ") for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0] == outs[1] == str(model_dir("tiny-qwen2", tmp_path))
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["tiny-qwen2"]  # no temp dirs left
    transformers.AutoModelForCausalLM.from_pretrained(outs[0])
