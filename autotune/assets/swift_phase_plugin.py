"""Phase markers for ms-swift GRPO trials, loaded with ``--external_plugins <this file>``.

ms-swift times its rollout and its weight sync with ``profiling_context`` (``swift/rlhf_trainers/utils.py``;
``RolloutTrainerMixin._move_model_to_vllm`` through ``profiling_decorator``, the vLLM call in
``_engine_infer`` as ``'generate'``) but reports the durations to wandb and swanlab only. This plugin wraps
that context so each of those phases also appends begin/end markers to ``$AUTOTUNE_PHASES_FILE`` (the format
of :mod:`autotune.probes.phases`; rank 0 only), which the trial's timeline reads.

It runs inside ms-swift's interpreter, which may not have autotune installed: standard library and
ms-swift only. Nothing happens when the variable is unset or ms-swift has no such context.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator

#: ms-swift's profiling names → the timeline's phases
PHASE_OF = {"_move_model_to_vllm": "weight_sync", "generate": "rollout"}


def _mark(path: str, phase: str, event: str) -> None:
    line = {
        "phase": phase,
        "event": event,
        "t_mono_s": time.monotonic(),
        "t_wall_s": time.time(),
        "step": None,
        "pid": os.getpid(),
        "rank": 0,
    }
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")
    except OSError:
        pass  # a marker never breaks training


def _install(path: str) -> None:
    try:
        from swift.rlhf_trainers import rollout_mixin, utils
    except ImportError:
        return
    original = getattr(utils, "profiling_context", None)
    if original is None or getattr(original, "_autotune_phases", False):
        return

    @contextlib.contextmanager
    def profiling_context(trainer: object, name: str) -> Iterator[None]:
        phase = PHASE_OF.get(name)
        if phase is not None:
            _mark(path, phase, "begin")
        try:
            with original(trainer, name):
                yield
        finally:
            if phase is not None:
                _mark(path, phase, "end")

    profiling_context._autotune_phases = True  # type: ignore[attr-defined]
    for module in (utils, rollout_mixin):
        if getattr(module, "profiling_context", None) is original:
            module.profiling_context = profiling_context


if os.environ.get("AUTOTUNE_PHASES_FILE") and os.environ.get("RANK", "").strip() in ("", "0"):
    _install(os.environ["AUTOTUNE_PHASES_FILE"])
