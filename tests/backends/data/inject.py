"""Make a real framework run fail inside one phase, for the failure-phase recordings (not a test).

``capture_trl.py`` / ``capture_swift.py --inject PHASE`` put the directory of a generated
``sitecustomize.py`` first on the trial's ``PYTHONPATH``; Python imports it at start-up in every process
of the run, and it replaces one function that runs only in that phase so that its first call raises
PyTorch's own out-of-memory error with the allocator's real message (copied from PyTorch 2.x):

- ``train``: ``torch.Tensor.backward`` (every trainer's backward pass goes through it);
- ``rollout``: ``transformers.GenerationMixin.generate`` (rollouts without vLLM).

Everything else in the traceback — the trainer's and the libraries' frames — is the framework's own.
There is no weight sync without vLLM, which needs a GPU: that phase is covered by the frame patterns'
unit tests only.
"""

from __future__ import annotations

import os
from pathlib import Path

PHASES = ("train", "rollout")

_SITECUSTOMIZE = """
import os

_MSG = (
    "CUDA out of memory. Tried to allocate 2.32 GiB. GPU 0 has a total capacity of 22.07 GiB of which "
    "1.02 GiB is free. Including non-PyTorch memory, this process has 21.04 GiB memory in use. Of the "
    "allocated memory 19.83 GiB is allocated by PyTorch, and 812.45 MiB is reserved by PyTorch but "
    "unallocated."
)
_PHASE = os.environ.get("AUTOTUNE_CAPTURE_INJECT")

if _PHASE == "train":
    import torch

    def backward(self, *args, **kwargs):
        raise torch.OutOfMemoryError(_MSG)

    torch.Tensor.backward = backward
elif _PHASE == "rollout":
    import torch
    import transformers.generation.utils as _gen

    def generate(self, *args, **kwargs):
        raise torch.OutOfMemoryError(_MSG)

    _gen.GenerationMixin.generate = generate
"""


def injection_env(phase: str, workdir: Path, env: dict[str, str]) -> dict[str, str]:
    """``env`` with the injector of ``phase`` on ``PYTHONPATH`` (``sitecustomize.py`` written to ``workdir``)."""
    if phase not in PHASES:
        raise SystemExit(f"--inject must be one of {', '.join(PHASES)}")
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "sitecustomize.py").write_text(_SITECUSTOMIZE, encoding="utf-8")
    path = env.get("PYTHONPATH", "")
    return {
        **env,
        "PYTHONPATH": f"{workdir}{os.pathsep}{path}" if path else str(workdir),
        "AUTOTUNE_CAPTURE_INJECT": phase,
    }
