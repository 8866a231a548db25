"""Where in the step a failure happened, from its evidence (``TrialResult.failed_phase``).

The search blames a failure on the knobs that govern its phase (:mod:`autotune.strategy._blame`), so
the phase must come from what the trial showed, not from a guess:

- vLLM refusing to start and a framework rejecting its arguments are start-up failures;
- otherwise the traceback decides: its frames are read innermost first (tracebacks later in the output
  first, so a launcher's ``ChildFailedError`` does not hide the rank's own), and the first frame that
  runs in one phase alone names it — a trainer's weight-sync method, ``backward``, ``generate``, vLLM's
  KV-cache sizing at start-up. Helpers several phases share (a forward pass, vLLM's
  ``execute_model``, a log-prob computation) name none, so the search is sent to the next frame out.

The frames common to every framework are below, each from its project's source; a backend adds its
trainer's own (:meth:`~autotune.backends.Backend.phase_frames`).

:func:`trial_failure_phase` puts the traceback together with what the runner saw while the trial ran
(:mod:`autotune.trial.early`): a hang called on a weight sync the log showed never ending, the phase the
framework's log showed open when the trial ended, and whether any step was made.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from autotune.backends._base import PhaseFrame
from autotune.records import TrialStatus
from autotune.trial.evidence import strip_rank_prefix
from autotune.trial.run_record import RunRecord

__all__ = ["COMMON_PHASE_FRAMES", "PHASES", "failure_phase", "traceback_frames", "trial_failure_phase"]

PHASES = ("startup", "rollout", "train", "weight_sync")

COMMON_PHASE_FRAMES: tuple[PhaseFrame, ...] = (
    # PyTorch: Tensor.backward (torch/_tensor.py) → torch.autograd.backward (torch/autograd/__init__.py);
    # every optimizer's step (torch/optim/*.py); DeepSpeed's engine backward/step (runtime/engine.py)
    PhaseFrame("train", r":backward$"),
    PhaseFrame("train", r"torch/optim/[^:]*:step$"),
    PhaseFrame("train", r"deepspeed/runtime/[^:]*:(step|allreduce_gradients|reduce_gradients)$"),
    # Hugging Face generation (transformers/generation/utils.py GenerationMixin.generate) and vLLM's
    # offline entry point (vllm/entrypoints/llm.py LLM.generate) run only to roll out
    PhaseFrame("rollout", r":generate$"),
    # vLLM sizing the KV cache and capturing graphs when the engine starts
    # (vllm/v1/worker/gpu_worker.py determine_available_memory, initialize_from_config,
    # compile_or_warm_up_model; vllm/v1/engine/core.py _initialize_kv_caches)
    PhaseFrame(
        "startup",
        r"vllm/[^:]*:(determine_available_memory|_initialize_kv_caches|initialize_from_config|"
        r"compile_or_warm_up_model|profile_run)$",
    ),
    # loading a model from disk (transformers' PreTrainedModel.from_pretrained)
    PhaseFrame("startup", r":from_pretrained$"),
)

_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line \d+, in (?P<func>\S+)')
_TRACEBACK = re.compile(r"^Traceback \(most recent call last\):")
_STARTUP_STATUSES = (TrialStatus.VLLM_INIT, TrialStatus.INVALID)


def traceback_frames(lines: Iterable[str]) -> list[list[str]]:
    """The ``"path:function"`` of every frame, per traceback, in output order (outermost first)."""
    blocks: list[list[str]] = []
    for raw in lines:
        line = strip_rank_prefix(raw)
        if _TRACEBACK.match(line.strip()):
            blocks.append([])
            continue
        m = _FRAME.match(line)
        if m:
            if not blocks:
                blocks.append([])
            blocks[-1].append(f"{m.group('path').replace(chr(92), '/')}:{m.group('func')}")
    return [b for b in blocks if b]


def failure_phase(
    status: TrialStatus,
    lines: Sequence[str],
    frames: Sequence[PhaseFrame] = (),
    *,
    signal_phase: str | None = None,
    common: bool = True,
) -> str | None:
    """The phase a failure happened in, or None when the evidence does not say.

    Args:
        status: the trial's classified status (None is returned for one that did not fail).
        lines: the trial's output (evidence lines, then the stderr and stdout tails).
        frames: the backend's own phase frames (searched before the common ones).
        signal_phase: the phase the runner's own evidence named (e.g. a hang called while the
            framework's log said it was syncing weights); it wins over the traceback.
        common: also search :data:`COMMON_PHASE_FRAMES` (after the backend's).
    """
    if not status.is_failure:
        return None
    if signal_phase in PHASES:
        return signal_phase
    if status in _STARTUP_STATUSES:
        return "startup"
    compiled = [(f.phase, re.compile(f.regex)) for f in (*frames, *(COMMON_PHASE_FRAMES if common else ()))]
    for block in reversed(traceback_frames(lines)):
        for frame in reversed(block):
            for phase, rx in compiled:
                if rx.search(frame):
                    return phase
    return None


def trial_failure_phase(
    record: RunRecord, status: TrialStatus, frames: Sequence[PhaseFrame] = ()
) -> str | None:
    """The phase of a finished trial's failure (``TrialResult.failed_phase``), first that applies:

    1. A hang the runner called because the framework's log showed a weight sync that never ended
       (``record.hang_signal == "weight_sync_log"``) → ``weight_sync``, over any traceback.
    2. :func:`failure_phase` over the trial's output (evidence lines, stderr tail, stdout tail):
       vLLM's refusal or rejected arguments → ``startup``, else the traceback's innermost phase frame.
    3. For a failure other than UNHEALTHY whose output names no phase: the phase the framework's log
       or the worker's phase markers showed open when it ended (``record.open_phase``: a rollout, a
       weight sync, training), else ``startup`` when it never made a step (a start-up hang, a fatal
       line before the first step), else None (e.g. GPUs spinning between steps: the GPUs show that a
       collective waits, not which one).

    Args:
        record: what the runner observed.
        status: the trial's classified status.
        frames: the backend's own phase frames (:meth:`~autotune.backends.Backend.phase_frames`).
    """
    signal_phase = "weight_sync" if record.hang_signal == "weight_sync_log" else None
    lines = [x.text for x in record.evidence] + list(record.stderr_tail) + list(record.stdout_tail)
    phase = failure_phase(status, lines, frames, signal_phase=signal_phase)
    if phase is not None or not status.is_failure or status is TrialStatus.UNHEALTHY:
        return phase
    if record.open_phase in PHASES:
        return record.open_phase
    return None if record.steps else "startup"
