"""Capture hydra's real refusals of verl 0.9.1 overrides (not a test itself).

    /work/main/.venv-verl/bin/python tests/backends/data/capture_verl_hydra.py

verl's ``main_ppo`` cannot be imported without its GPU stack, but the refusals happen in hydra before or
around its main: this app composes the installed verl's own ``ppo_trainer`` config with the same
``@hydra.main`` as ``verl/trainer/main_ppo.py``, and its main raises verl's batch check with verl's message
(``verl/utils/config.py::validate_config``). Writes ``verl_0.9.1_hydra_unknown_key.stderr`` (a misspelt key)
and ``verl_0.9.1_hydra_batch_not_divisible.stderr`` next to this file.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import hydra

spec = importlib.util.find_spec("verl")
assert spec is not None and spec.submodule_search_locations
CONFIG = os.path.join(spec.submodule_search_locations[0], "trainer", "config")
HERE = Path(__file__).parent


@hydra.main(config_path=CONFIG, config_name="ppo_trainer", version_base=None)
def main(config) -> None:  # noqa: ANN001
    n_gpus = config.trainer.n_gpus_per_node * config.trainer.nnodes
    real = config.data.train_batch_size * config.actor_rollout_ref.rollout.n
    # verl/utils/config.py::validate_config, verl 0.9.1 (the check and its message)
    assert real % n_gpus == 0, (
        f"real_train_batch_size ({real}) must be divisible by minimal possible batch size ({n_gpus})"
    )


def capture() -> None:
    for name, overrides in (
        (
            "unknown_key",
            ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.gpu_memory_utilisation=0.5"],
        ),
        (
            "batch_not_divisible",
            [
                "algorithm.adv_estimator=grpo",
                "data.train_batch_size=3",
                "actor_rollout_ref.rollout.n=4",
                "trainer.n_gpus_per_node=8",
            ],
        ),
    ):
        with tempfile.TemporaryDirectory() as cwd:  # hydra writes its outputs/ folder there
            proc = subprocess.run(
                [sys.executable, __file__, *overrides], capture_output=True, text=True, check=False, cwd=cwd
            )
        text = proc.stderr.replace(__file__, "capture_verl_hydra.py")  # no local paths in the fixture
        (HERE / f"verl_0.9.1_hydra_{name}.stderr").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    if len(sys.argv) == 1:
        capture()
    else:
        main()
