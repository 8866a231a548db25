"""Record a real CPU training run into ``cpu_trial/`` (timeline.parquet, metrics.jsonl, phases.jsonl).

The child process trains a tiny GRU language model with a GRPO-shaped loop - sample completions
without gradients (rollout), copy the weights into a separate "inference" model first (weight sync),
score them in Python (other), one policy-gradient step (train) - and brackets the phases with
``probes.phases`` exactly as the TRL trial worker does: ``train`` around the whole training step,
``rollout`` nested inside it, ``weight_sync`` nested inside the rollout. It appends one step record
per step to metrics.jsonl. The parent samples the child's process tree with ``HostSampler`` at 10 Hz.

Run: ``OMP_NUM_THREADS=1 python tests/probes/data/record_cpu_trial.py`` (about 20 s; the committed
files are one such recording, so the test answers are fixed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

N_STEPS = 6


def child(metrics_path: str) -> None:
    import torch
    from autotune.probes import phases

    torch.set_num_threads(1)
    torch.manual_seed(0)
    vocab, hidden, batch, length = 64, 128, 32, 48

    class TinyLM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, hidden)
            self.rnn = torch.nn.GRU(hidden, hidden, batch_first=True)
            self.out = torch.nn.Linear(hidden, vocab)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            h, _ = self.rnn(self.emb(tokens))
            return self.out(h)

    policy, sampler = TinyLM(), TinyLM()
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    with open(metrics_path, "a", encoding="utf-8") as metrics:
        for step in range(1, N_STEPS + 1):
            t_start = time.monotonic()
            # "other": build prompts and reward bookkeeping on the CPU, outside the training step
            prompts = torch.randint(0, vocab, (batch, 4))
            _ = sum(i * i for i in range(600_000))
            with phases.phase("train", step=step):
                with phases.phase("rollout", step=step):
                    with phases.phase("weight_sync", step=step):
                        sampler.load_state_dict(policy.state_dict())
                    tokens = prompts
                    with torch.no_grad():
                        for _ in range(length):
                            logits = sampler(tokens)[:, -1]
                            nxt = torch.multinomial(torch.softmax(logits, -1), 1)
                            tokens = torch.cat([tokens, nxt], dim=1)
                reward = (tokens[:, 4:] % 2 == 0).float().mean(dim=1)
                advantage = (reward - reward.mean()) / (reward.std() + 1e-6)
                for _ in range(4):
                    logp = torch.log_softmax(policy(tokens[:, :-1]), -1)
                    taken = logp.gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)[:, 3:]
                    loss = -(advantage.unsqueeze(1) * taken).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            record = {
                "step": step,
                "t_mono_s": time.monotonic(),
                "t_wall_s": time.time(),
                "duration_s": time.monotonic() - t_start,
                "samples": batch,
                "tokens": float(batch * length),
                "values": {"loss": float(loss.detach()), "reward": float(reward.mean())},
            }
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()


def main(out_dir: Path) -> None:
    from autotune.probes.host import HostSampler
    from autotune.probes.timeline import write_timeline

    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("metrics.jsonl", "phases.jsonl"):
        (out_dir / name).unlink(missing_ok=True)
    env = dict(os.environ, AUTOTUNE_PHASES_FILE=str(out_dir / "phases.jsonl"), OMP_NUM_THREADS="1")
    env.pop("RANK", None)
    argv = [sys.executable, __file__, "--child", str(out_dir / "metrics.jsonl")]
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    sampler = HostSampler(proc.pid, interval_s=0.1)
    sampler.start()
    try:
        proc.wait(timeout=120)
        time.sleep(0.3)
    finally:
        sampler.stop()
    write_timeline(out_dir / "timeline.parquet", sampler.rows())
    print(f"exit {proc.returncode}, {len(sampler.rows())} host rows, warnings: {sampler.warnings}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        main(Path(__file__).resolve().parent / "cpu_trial")
