"""Record verl's console metric lines with verl's own formatter (not a test itself).

    .venv/bin/python tests/backends/data/capture_verl_console.py /work/main/.venv-verl > verl_0.9.1_console.stdout

verl cannot train here (no GPU, and its venv holds verl without its dependencies), so this runs the function
that prints its console lines, ``concat_dict_to_str`` of verl/utils/logger/aggregate_logger.py (called by
``LocalLogger.log``, the ``console`` backend of verl/utils/tracking.py ``Tracking``), compiled from the
installed verl's source, on metrics shaped as ``RayPPOTrainer.fit`` (verl/trainer/ppo/ray_trainer.py)
logs them: ``reduce_metrics`` (verl/utils/metric/utils.py) gives numpy scalars (``np.mean``),
``compute_data_metrics``/``compute_timing_metrics``/``compute_throughout_metrics``
(verl/trainer/ppo/metric_utils.py) Python floats and ints, and the ``timing_s/*`` keys come from the
``marked_timer`` names in ``fit``. The values are made up; the format is verl's.
"""

from __future__ import annotations

import ast
import numbers
import pprint
import sys
from pathlib import Path

import numpy as np


def verl_formatter(venv: Path) -> tuple[object, str]:
    source_path = next(venv.glob("lib/python3*/site-packages/verl/utils/logger/aggregate_logger.py"))
    tree = ast.parse(source_path.read_text())
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "concat_dict_to_str")
    namespace: dict[str, object] = {"numbers": numbers, "pprint": pprint}
    exec(compile(ast.Module(body=[func], type_ignores=[]), str(source_path), "exec"), namespace)
    version = (
        next(venv.glob("lib/python3*/site-packages/verl-*.dist-info"))
        .name.removesuffix(".dist-info")
        .split("-", 1)[1]
    )
    return namespace["concat_dict_to_str"], version


def metrics(step: int) -> dict[str, object]:
    gen, reward, old, ref, adv, actor, sync = 4.1 + 0.1 * step, 0.3, 1.2, 1.1, 0.05, 2.4, 0.6
    total = gen + reward + old + ref + adv + actor + sync + 0.2
    return {
        "actor/pg_loss": np.float64(-0.012 * step),
        "actor/kl_loss": np.float64(0.001 * step),
        "actor/entropy": np.float64(1.9),
        "actor/grad_norm": np.float64(0.41),
        "actor/lr": 1e-06,
        "critic/score/mean": 0.25 + 0.05 * step,
        "critic/rewards/mean": 0.25 + 0.05 * step,
        "response_length/mean": 211.5,
        "response_length/clip_ratio": 0.0,
        "timing_s/gen": gen,
        "timing_s/reward": reward,
        "timing_s/old_log_prob": old,
        "timing_s/ref": ref,
        "timing_s/adv": adv,
        "timing_s/update_actor": actor,
        "timing_s/update_weights": sync,
        "timing_s/step": total,
        "perf/total_num_tokens": 27072,
        "perf/time_per_step": total,
        "perf/throughput": 27072 / total / 8,
        "training/global_step": step,
        "training/epoch": 0,
    }


def main() -> int:
    concat_dict_to_str, version = verl_formatter(Path(sys.argv[1]))
    print(f"# verl {version} console lines: concat_dict_to_str (verl/utils/logger/aggregate_logger.py)")
    for step in (1, 2, 3):
        print(concat_dict_to_str(metrics(step), step=step))
    return 0


if __name__ == "__main__":
    sys.exit(main())
