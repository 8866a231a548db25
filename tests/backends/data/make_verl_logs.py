"""Write the verl recordings the backend tests replay (not a test itself).

    .venv/bin/python tests/backends/data/make_verl_logs.py [--verl-site PATH]

verl cannot run on a CPU (its resource pool asks Ray for GPUs), so its output is rebuilt from its own
code and from real logs, each piece cited in the recording's ``meta`` line:

- step lines: verl 0.9.1's own ``concat_dict_to_str`` (``verl/utils/logger/aggregate_logger.py``), loaded
  from the installed package and called on numpy values as the v1 trainer's ``reduce_metrics`` gives
  them (``np.float64`` under numpy 2) — the exact text ``LocalLogger.log`` prints;
- Ray's wrapping: the ``(TaskRunner pid=N)`` prefix Ray's log monitor adds to an actor's stdout, coloured
  (``ray/_private/worker.py::print_worker_logs`` colours it cyan unless ``RAY_COLOR_PREFIX`` picks
  others); a tqdm bar glued before a step line, as users report it;
- failures: ``ActorDiedError``, ``RayTaskError(OutOfMemoryError)`` and the memory monitor's kill as
  printed in real verl runs and Ray's documentation (sources in each ``meta``).

``verl_0.9.1_hydra_*.stderr`` are real: hydra 1.3.8 composing verl 0.9.1's ``ppo_trainer`` config in
``.venv-verl`` (``capture_verl_hydra.py``).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).parent
PID = 480334
PREFIX = f"\x1b[36m(TaskRunner pid={PID})\x1b[0m "
RAY_START = "2025-04-02 21:02:59,766\tINFO worker.py:1843 -- Started a local Ray instance. View the dashboard at http://127.0.0.1:8265 "


def _concat(verl_site: Path) -> Any:
    path = verl_site / "verl" / "utils" / "logger" / "aggregate_logger.py"
    spec = importlib.util.spec_from_file_location("verl_aggregate_logger", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.concat_dict_to_str


def step_metrics(step: int) -> dict[str, Any]:
    """One step's metrics with the types the v1 trainer logs (np.float64 reductions, float timings)."""
    f = np.float64
    gen, old, ref, upd, sync = 9.8 + 0.1 * step, 2.1, 1.9, 6.4, 0.7
    total = gen + 0.3 + old + ref + 0.05 + upd + sync + 0.2
    return {
        "actor/entropy": f(0.52 - 0.01 * step),
        "actor/kl_loss": f(0.0 if step == 1 else 0.0004 * step),
        "actor/pg_loss": f(-0.0021 * (1 + step % 2)),
        "actor/pg_clipfrac": f(0.0012),
        "actor/ppo_kl": f(-0.0001),
        "actor/grad_norm": f(0.21 + 0.02 * step),
        "perf/mfu/actor": f(0.31),
        "perf/max_memory_allocated_gb": f(48.2),
        "perf/max_memory_reserved_gb": f(61.5),
        "perf/cpu_memory_used_gb": f(102.4),
        "actor/lr": f(1e-06),
        "training/global_step": step,
        "training/epoch": 0,
        "critic/score/mean": f(0.40 + 0.03 * step),
        "critic/rewards/mean": f(0.40 + 0.03 * step),
        "critic/advantages/mean": f(-0.004),
        "response_length/mean": f(288.7),
        "response_length/max": f(1024.0),
        "response_length/clip_ratio": f(0.05),
        "prompt_length/mean": f(104.2),
        "timing_s/gen": gen,
        "timing_s/reward": 0.3,
        "timing_s/old_log_prob": old,
        "timing_s/ref": ref,
        "timing_s/adv": 0.05,
        "timing_s/update_actor": upd,
        "timing_s/update_weights": sync,
        "timing_s/step": total,
        "perf/total_num_tokens": 401920,
        "perf/time_per_step": total,
        "perf/throughput": 401920 / (total * 8),
    }


def _line(text: str, stream: str = "stdout") -> dict[str, Any]:
    return {"stream": stream, "text": text}


def _startup() -> list[dict[str, Any]]:
    return [
        _line(RAY_START, "stderr"),
        _line(PREFIX + "[validate_config] All configuration checks passed successfully!"),
        _line(PREFIX + "Total training steps: 3"),
    ]


def complete(concat: Any) -> list[dict[str, Any]]:
    events = [
        {
            "meta": {
                "what": "verl 0.9.1 GRPO, 3 steps, console logger, as Ray forwards the TaskRunner's stdout",
                "step_lines": "verl 0.9.1 verl/utils/logger/aggregate_logger.py::concat_dict_to_str on np.float64",
                "prefix": "ray/_private/worker.py::print_worker_logs (cyan '(TaskRunner pid=N)')",
                "tqdm_glue": "a tqdm bar without newline before step 2, as reported for verl's LocalLogger",
            }
        },
        *_startup(),
    ]
    for step in (1, 2, 3):
        text = concat(step_metrics(step), step=step)
        if step == 2:
            bar = "Training Progress:  33%|###3      | 1/3 [00:23<00:46, 23.10s/it]"
            events.append(_line(PREFIX + bar + text))
        else:
            events.append(_line(PREFIX + text))
    events.append(_line(PREFIX + "Final validation metrics: None"))
    events.append({"exit": 0})
    return events


def train_oom(concat: Any) -> list[dict[str, Any]]:
    """A CUDA OOM in the actor update, wrapped by Ray (text of a real verl run, paths shortened)."""
    events = [
        {
            "meta": {
                "what": "CUDA OOM in update_actor at step 2, RayTaskError(OutOfMemoryError) around torch's error",
                "source": "a verl GRPO run's log (code-r1, verl/trainer/ppo/ray_trainer.py fit → "
                "fsdp_workers.update_actor → dp_actor.update_policy → loss.backward) and torch's OOM text",
            }
        },
        *_startup(),
        _line(PREFIX + concat(step_metrics(1), step=1)),
    ]
    tb = [
        "Error executing job with overrides: ['algorithm.adv_estimator=grpo']",
        "Traceback (most recent call last):",
        '  File "/opt/verl/verl/trainer/main_ppo.py", line 42, in main',
        "    run_ppo(config)",
        '  File "/opt/conda/lib/python3.10/site-packages/ray/_private/worker.py", line 906, in get_objects',
        "    raise value.as_instanceof_cause()",
        "ray.exceptions.RayTaskError(OutOfMemoryError): ray::TaskRunner.run() (pid=399789, ip=10.128.0.9)",
        '  File "/opt/verl/verl/trainer/ppo/ray_trainer.py", line 1004, in fit',
        "    actor_output = self.actor_rollout_wg.update_actor(batch)",
        '  File "/opt/verl/verl/single_controller/ray/base.py", line 42, in func',
        "    output = ray.get(output)",
        "ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict.actor_rollout_update_actor() "
        "(pid=400862, ip=10.128.0.9, actor_id=87523c02ec964b128fbc710001000000, "
        "repr=<verl.single_controller.ray.base.WorkerDict object at 0x7edde69d7850>)",
        '  File "/opt/verl/verl/single_controller/ray/base.py", line 399, in func',
        "    return getattr(self.worker_dict[key], name)(*args, **kwargs)",
        '  File "/opt/verl/verl/workers/fsdp_workers.py", line 435, in update_actor',
        "    metrics = self.actor.update_policy(data=data)",
        '  File "/opt/verl/verl/workers/actor/dp_actor.py", line 313, in update_policy',
        "    loss.backward()",
        '  File "/opt/conda/lib/python3.10/site-packages/torch/_tensor.py", line 521, in backward',
        "    torch.autograd.backward(",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.64 GiB. GPU 0 has a total capacity "
        "of 79.11 GiB of which 2.11 GiB is free. Including non-PyTorch memory, this process has 76.99 GiB "
        "memory in use.",
        "",
        "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.",
    ]
    return events + [_line(x, "stderr") for x in tb] + [{"exit": 1}]


def actor_died() -> list[dict[str, Any]]:
    """A worker that died without a word (SIGKILL, segfault): Ray's ActorDiedError at init_model."""
    tb = [
        "Error executing job with overrides: ['algorithm.adv_estimator=grpo']",
        "Traceback (most recent call last):",
        '  File "/opt/verl/verl/trainer/main_ppo.py", line 308, in run',
        "    trainer.init_workers()",
        '  File "/opt/verl/verl/trainer/ppo/ray_trainer.py", line 737, in init_workers',
        "    self.actor_rollout_wg.init_model()",
        '  File "/opt/verl/verl/single_controller/ray/base.py", line 52, in __call__',
        "    output = ray.get(output)",
        "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
        "\tclass_name: create_colocated_worker_cls.<locals>.WorkerDict",
        "\tactor_id: 7a7e28706e933f93da5fe49701000000",
        "\tpid: 26103",
        "\tname: WQ0HJEWorkerDict_0:0",
        "\tnamespace: 00e278ee-52c1-4f18-85b6-8be135bdb1b6",
        "\tip: 10.80.8.181",
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit "
        "detail: Worker unexpectedly exits with a connection error code 2. End of file. There are some "
        "potential root causes. (1) The process is killed by SIGKILL by OOM killer due to high memory usage. "
        "(2) ray stop --force is called. (3) The worker is crashed unexpectedly due to SIGSEGV or other "
        "unexpected errors.",
        "",
        "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.",
    ]
    return [
        {
            "meta": {
                "what": "a WorkerDict actor died during init_model; Ray reports ActorDiedError",
                "source": "a verl run's log (verl/trainer/ppo/ray_trainer.py init_workers, Ray 2.4x text of "
                "python/ray/exceptions.py ActorDiedError)",
            }
        },
        *_startup(),
        *[_line(x, "stderr") for x in tb],
        {"exit": 1},
    ]


def ray_memory_monitor() -> list[dict[str, Any]]:
    text = (
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
        "Memory on the node (IP: 10.0.62.231, ID: e5d953ef03e55e26f13973ea1b5a0fd0ecc729cd820bc89e4aa50451) "
        "where the task (task ID: 43534ce9375fa8e4cd0d0ec285d9974a6a95897401000000, name=WorkerDict.__init__, "
        "pid=11362, memory used=61.25GB) was running was 240.71GB / 251.80GB (0.956), which exceeds the "
        "memory usage threshold of 0.95. Ray killed this worker (ID: 6f2ec5c8b0d5f5a66572859faf192d36743536c2e"
        "9702ea58084b037) because it was the most recently scheduled task",
    )
    return [
        {
            "meta": {
                "what": "Ray's memory monitor kills a verl worker (host RAM)",
                "source": "ray-project/ray doc/source/ray-core/scheduling/ray-oom-prevention.rst (the error text)",
            }
        },
        *_startup(),
        *[_line(x, "stderr") for x in text],
        {"exit": 1},
    ]


def vllm_init() -> list[dict[str, Any]]:
    lines = [
        "(vLLMHttpServer pid=5521) ValueError: Free memory on device (30.1/79.11 GiB) on startup is less "
        "than desired GPU memory utilization (0.6, 47.47 GiB). Decrease GPU memory utilization or reduce "
        "GPU memory used by other processes.",
        "ray.exceptions.ActorDiedError: The actor died because of an error raised in its creation task, "
        "ray::vLLMHttpServer.__init__() (pid=5521, ip=10.0.0.3)",
    ]
    return [
        {
            "meta": {
                "what": "vLLM refuses to start inside verl's rollout server actor (free memory below the budget)",
                "source": "vllm/v1/worker/gpu_worker.py::Worker.init_device (vllm/v1/worker/utils.py::request_memory in newer releases) raises the ValueError; Ray forwards the actor's line",
            }
        },
        *_startup(),
        *[_line(x, "stderr") for x in lines],
        {"exit": 1},
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    found = glob.glob(str(HERE.parents[2] / ".venv-verl/lib/python*/site-packages"))
    found += glob.glob("/work/main/.venv-verl/lib/python*/site-packages")
    ap.add_argument("--verl-site", type=Path, default=Path(found[0]) if found else None)
    args = ap.parse_args()
    concat = _concat(args.verl_site)
    for name, events in (
        ("verl_0.9.1_grpo_3steps", complete(concat)),
        ("verl_0.9.1_oom_update_actor", train_oom(concat)),
        ("verl_0.9.1_actor_died", actor_died()),
        ("verl_0.9.1_ray_memory_monitor", ray_memory_monitor()),
        ("verl_0.9.1_vllm_init", vllm_init()),
    ):
        path = HERE / f"{name}.events.jsonl"
        path.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in events), encoding="utf-8")
        print(path)


if __name__ == "__main__":
    main()
