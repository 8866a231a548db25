"""A user's own TRL GRPO script, as the README shows it: the tiny local Qwen2 model on CPU, a few steps.

    python user_grpo_script.py MODEL_DIR OUTPUT_DIR [--steps N] [--logging-steps L] [--no-callback]

With the callback (default) it adds :class:`autotune.probes.callback.AutotuneCallback`; without it, it
is a plain TRL script whose only step records are the trainer's printed log dicts.
"""

from __future__ import annotations

import argparse
import os

import torch
from datasets import Dataset
from transformers import AutoTokenizer
from trl import GRPOConfig, GRPOTrainer


def digits_reward(completions: list[str], **_: object) -> list[float]:
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("output_dir")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--logging-steps", type=int, default=1)
    ap.add_argument("--no-callback", action="store_true")
    opts = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dataset = Dataset.from_list([{"prompt": f"What is {i} + {i}?"} for i in range(32)])
    args = GRPOConfig(
        output_dir=opts.output_dir,
        max_steps=opts.steps,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        logging_steps=opts.logging_steps,
        beta=0.04,  # a reference model, so kl is logged
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=opts.model,
        reward_funcs=[digits_reward],
        args=args,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(opts.model),
    )
    if not opts.no_callback:
        from autotune.probes.callback import AutotuneCallback

        trainer.add_callback(AutotuneCallback(trainer))
    trainer.train()


if __name__ == "__main__":
    main()
