"""Placing a failure in a phase of the step from its traceback.

Real tracebacks of TRL and ms-swift failing in training and in rollout are replayed by the backends'
conformance suites (``Recording.failed_phase``); weight sync needs vLLM, hence a GPU, so its frames are
written here from the frameworks' source (TRL 1.16 ``trl/generation/vllm_generation.py``
``VLLMGeneration.sync_weights`` called from ``GRPOTrainer._generate_single_turn``; ms-swift 4.x
``swift/rlhf_trainers/rollout_mixin.py`` ``_move_model_to_vllm``).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from autotune.backends.swift.backend import SwiftBackend
from autotune.backends.trl.backend import TrlBackend
from autotune.records import StepMetrics, TrialStatus
from autotune.trial.failure_phase import failure_phase, traceback_frames, trial_failure_phase
from autotune.trial.runner import OutputLine, RunRecord

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.32 GiB."
SITE = "/venv/lib/python3.11/site-packages"


def _tb(*frames: tuple[str, str], error: str = OOM, prefix: str = "") -> list[str]:
    lines = [f"{prefix}Traceback (most recent call last):"]
    for path, func in frames:
        lines += [f'{prefix}  File "{path}", line 10, in {func}', f"{prefix}    x = f()"]
    return [*lines, f"{prefix}{error}"]


TRL_SYNC = _tb(
    (f"{SITE}/transformers/trainer.py", "_inner_training_loop"),
    (f"{SITE}/trl/trainer/grpo_trainer.py", "training_step"),
    (f"{SITE}/trl/trainer/grpo_trainer.py", "_generate_and_score_completions"),
    (f"{SITE}/trl/trainer/grpo_trainer.py", "_generate"),
    (f"{SITE}/trl/trainer/grpo_trainer.py", "_generate_single_turn"),
    (f"{SITE}/trl/generation/vllm_generation.py", "sync_weights"),
    (f"{SITE}/deepspeed/runtime/zero/partition_parameters.py", "__enter__"),
    (f"{SITE}/vllm/model_executor/models/qwen2.py", "load_weights"),
)


def test_weight_sync_is_the_innermost_phase_frame_not_the_rollout_around_it() -> None:
    assert failure_phase(TrialStatus.OOM, TRL_SYNC, TrlBackend().phase_frames()) == "weight_sync"
    # without the trainer's own frames, vLLM's load_weights (start-up and sync alike) names nothing
    # and the common frames know no phase of this traceback
    assert failure_phase(TrialStatus.OOM, TRL_SYNC, ()) is None


def test_swift_weight_sync_hang_with_rank_prefixes() -> None:
    lines = _tb(
        (f"{SITE}/swift/rlhf_trainers/grpo_trainer.py", "training_step"),
        (f"{SITE}/swift/rlhf_trainers/rollout_mixin.py", "_generate_and_score_completions"),
        (f"{SITE}/swift/rlhf_trainers/rollout_mixin.py", "_move_model_to_vllm"),
        (f"{SITE}/torch/distributed/distributed_c10d.py", "all_gather"),
        error="torch.distributed.DistBackendError: Watchdog caught collective operation timeout",
        prefix="[rank1]: ",
    )
    assert failure_phase(TrialStatus.HANG, lines, SwiftBackend().phase_frames()) == "weight_sync"


def test_a_launcher_traceback_after_the_rank_does_not_hide_the_phase() -> None:
    rank = _tb(
        (f"{SITE}/trl/trainer/grpo_trainer.py", "training_step"),
        (f"{SITE}/accelerate/accelerator.py", "backward"),
        (f"{SITE}/torch/_tensor.py", "backward"),
    )
    launcher = _tb(
        (f"{SITE}/torch/distributed/run.py", "main"),
        (f"{SITE}/torch/distributed/elastic/multiprocessing/errors/__init__.py", "wrapper"),
        error="torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    )
    assert [f.split(":")[-1] for f in traceback_frames(rank)[0]] == ["training_step", "backward", "backward"]
    assert failure_phase(TrialStatus.OOM, rank + launcher) == "train"


def test_shared_helpers_name_no_phase_so_the_next_frame_out_decides() -> None:
    # reference log-probs run in the rollout and in training: TRL's training_step is the fallback
    lines = _tb(
        (f"{SITE}/trl/trainer/grpo_trainer.py", "training_step"),
        (f"{SITE}/trl/trainer/grpo_trainer.py", "_generate_and_score_completions"),
        (f"{SITE}/trl/trainer/grpo_trainer.py", "_get_per_token_logps_and_entropies"),
        (f"{SITE}/torch/nn/modules/module.py", "forward"),
    )
    assert failure_phase(TrialStatus.OOM, lines, TrlBackend().phase_frames()) == "train"


def test_startup_statuses_and_what_the_evidence_cannot_place() -> None:
    vllm = ["ValueError: No available memory for the cache blocks."]
    assert failure_phase(TrialStatus.VLLM_INIT, vllm) == "startup"
    assert failure_phase(TrialStatus.INVALID, []) == "startup"
    vllm_start = _tb(
        (f"{SITE}/trl/trainer/grpo_trainer.py", "__init__"),
        (f"{SITE}/vllm/v1/engine/core.py", "_initialize_kv_caches"),
        (f"{SITE}/vllm/v1/worker/gpu_worker.py", "determine_available_memory"),
    )
    assert failure_phase(TrialStatus.OOM, vllm_start, TrlBackend().phase_frames()) == "startup"
    assert failure_phase(TrialStatus.HANG, ["no step for 600 s"]) is None  # no traceback: unknown
    assert failure_phase(TrialStatus.COMPLETE, TRL_SYNC) is None  # not a failure
    # the runner's own signal (a hang called while the log said "syncing weights") wins
    assert failure_phase(TrialStatus.HANG, [], signal_phase="weight_sync") == "weight_sync"


# --------------------------------------------------------------------------------------------------
# With what the runner saw (autotune.trial.early)


def _record(
    steps: int, *, stderr: Sequence[str] = (), hang_signal: str | None = None, open_phase: str | None = None
) -> RunRecord:
    return RunRecord(
        exit_code=-15,
        signal=15,
        stopped_by=None,
        stop_reason=None,
        steps=[StepMetrics(step=i, t_mono_s=float(i), t_wall_s=float(i)) for i in range(1, steps + 1)],
        stdout_tail=[],
        stderr_tail=list(stderr),
        evidence=[OutputLine("stderr", x) for x in stderr if "Error" in x],
        duration_s=1.0,
        startup_s=None,
        started_wall_s=0.0,
        pid=1,
        pgid=1,
        hang_signal=hang_signal,
        open_phase=open_phase,
    )


TRAIN_OOM = _tb((f"{SITE}/torch/_tensor.py", "backward"))


@pytest.mark.parametrize(
    ("status", "steps", "stderr", "hang_signal", "open_phase", "phase"),
    [
        # the runner's weight-sync call wins over everything
        (TrialStatus.HANG, 3, (), "weight_sync_log", "weight_sync", "weight_sync"),
        (TrialStatus.HANG, 0, TRAIN_OOM, "weight_sync_log", None, "weight_sync"),
        # then the output: start-up statuses, the traceback
        (TrialStatus.VLLM_INIT, 0, (), None, "rollout", "startup"),
        (TrialStatus.OOM, 0, TRAIN_OOM, None, "rollout", "train"),
        # then the phase the log showed open, then "no step at all"
        (TrialStatus.OOM, 3, (OOM,), None, "rollout", "rollout"),
        (TrialStatus.HANG, 0, (), "gpu_spin", None, "startup"),
        (TrialStatus.HANG, 0, (), "no_step", None, "startup"),
        (TrialStatus.CRASH, 0, ("RuntimeError: boom",), None, None, "startup"),
        (TrialStatus.HANG, 3, (), "gpu_spin", None, None),  # the GPUs do not say which collective
        (TrialStatus.HANG, 3, (), "no_step", "other", None),  # not a phase of the step
        # not failures, or a run that did not fail in a phase
        (TrialStatus.COMPLETE, 0, (), None, "train", None),
        (TrialStatus.INTERRUPTED, 0, (), None, None, None),
        (TrialStatus.UNHEALTHY, 3, (), None, "train", None),
    ],
)
def test_the_runners_evidence_around_the_traceback(
    status: TrialStatus,
    steps: int,
    stderr: Sequence[str],
    hang_signal: str | None,
    open_phase: str | None,
    phase: str | None,
) -> None:
    rec = _record(steps, stderr=stderr, hang_signal=hang_signal, open_phase=open_phase)
    assert trial_failure_phase(rec, status) == phase
