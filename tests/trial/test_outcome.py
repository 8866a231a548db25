from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from autotune.backends._base import FailurePattern
from autotune.records import StepMetrics, TrialStatus
from autotune.trial.outcome import (
    COMMON_PATTERNS,
    LIVE_HEALTH_MIN_STEPS,
    classify,
    health_check,
    last_error_line,
    live_health,
    match_patterns,
    strip_rank_prefix,
)
from autotune.trial.runner import OutputLine, RunRecord

FAULT_PATH = Path(__file__).parents[1] / "fixtures" / "faults" / "fault.py"


def _load_fault() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fault_fixture", FAULT_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


fault = _load_fault()


def step(i: int, **values: float) -> StepMetrics:
    return StepMetrics(step=i, t_mono_s=float(i), t_wall_s=float(i), values=values)


def record(
    *,
    exit_code: int | None = 1,
    signal: int | None = None,
    stopped_by: str | None = None,
    stop_reason: str | None = None,
    steps: int | list[StepMetrics] = 0,
    stderr: str = "",
    stdout: str = "",
    evidence: list[str] | None = None,
) -> RunRecord:
    step_list = [step(i) for i in range(1, steps + 1)] if isinstance(steps, int) else steps
    return RunRecord(
        exit_code=exit_code,
        signal=signal,
        stopped_by=stopped_by,
        stop_reason=stop_reason,
        steps=step_list,
        stdout_tail=stdout.splitlines(),
        stderr_tail=stderr.splitlines(),
        evidence=[OutputLine("stderr", x) for x in (evidence or [])],
        duration_s=1.0,
        startup_s=None,
        started_wall_s=0.0,
        pid=1,
        pgid=1,
    )


def traceback(final: str, *, rank: int | None = None, frames: tuple[tuple[str, str], ...] = ()) -> str:
    frames = frames or (
        ("/opt/train/grpo_trainer.py", "training_step"),
        ("/usr/lib/torch/_tensor.py", "backward"),
    )
    body = ["Traceback (most recent call last):"]
    for path, func in frames:
        body += [f'  File "{path}", line 10, in {func}', "    something()"]
    body.append(final)
    prefix = f"[rank{rank}]: " if rank is not None else ""
    return "\n".join(prefix + line for line in body)


# --------------------------------------------------------------------------------------------------
# Patterns


@pytest.mark.parametrize("spelling", sorted(fault.OOM_TEXT))
def test_every_oom_spelling_is_oom(spelling: str) -> None:
    v = classify(record(steps=2, stderr=traceback(fault.OOM_TEXT[spelling])))
    assert v.status is TrialStatus.OOM
    assert v.evidence is not None and "out of memory" in v.evidence


def test_oom_reason_names_rank_and_sizes() -> None:
    v = classify(record(steps=3, stderr=traceback(fault.OOM_TEXT["current"], rank=1)))
    assert v.status is TrialStatus.OOM
    assert "rank 1" in v.reason
    assert "tried to allocate 2.32 GiB" in v.reason
    assert "1.02 GiB free of 22.07 GiB" in v.reason
    assert "\n" not in v.reason


@pytest.mark.parametrize("variant", sorted(fault.VLLM_TEXT))
def test_vllm_startup_texts(variant: str) -> None:
    v = classify(record(stderr=f"(EngineCore pid=253) {fault.VLLM_TEXT[variant]}"))
    assert v.status is TrialStatus.VLLM_INIT
    assert v.reason.startswith("vLLM could not start")


def test_oom_on_another_rank_beats_the_watchdog_hang() -> None:
    # rank 1 OOMs; rank 0 waits in a collective until our watchdog stops the job.
    rec = record(
        exit_code=-15,
        signal=15,
        stopped_by="hang",
        stop_reason="no step for 300 s after step 3",
        steps=3,
        evidence=[f"[rank1]: {fault.OOM_TEXT['current']}"],
    )
    assert classify(rec).status is TrialStatus.OOM


def test_oom_text_found_only_in_evidence_kept_from_early_output() -> None:
    rec = record(
        steps=2, stderr="\n".join(f"noise {i}" for i in range(400)), evidence=[fault.OOM_TEXT["runtime"]]
    )
    assert classify(rec).status is TrialStatus.OOM


def test_sigkill_not_sent_by_us_is_host_oom() -> None:
    assert classify(record(exit_code=-9, signal=9, steps=2)).status is TrialStatus.HOST_OOM
    shell = classify(record(exit_code=137, steps=2))
    assert shell.status is TrialStatus.HOST_OOM and "137" in shell.reason


def test_torchrun_sigkill_text_is_host_oom() -> None:
    v = classify(record(exit_code=1, steps=2, stderr=fault.TORCHRUN_SIGKILL))
    assert v.status is TrialStatus.HOST_OOM
    assert v.evidence is not None and "-9" in v.evidence


def test_sigkill_sent_by_our_watchdog_is_a_hang() -> None:
    rec = record(
        exit_code=-9, signal=9, stopped_by="hang", stop_reason="no step for 61 s after step 2", steps=2
    )
    v = classify(rec)
    assert v.status is TrialStatus.HANG
    assert v.reason == "no step for 61 s after step 2"


def test_startup_timeout_is_a_hang_and_timeout_is_timeout() -> None:
    start = classify(
        record(exit_code=-15, signal=15, stopped_by="startup_timeout", stop_reason="no step within")
    )
    assert start.status is TrialStatus.HANG
    wall = classify(record(exit_code=-15, signal=15, stopped_by="timeout", stop_reason="budget", steps=9))
    assert wall.status is TrialStatus.TIMEOUT


def test_nccl_watchdog_text_is_a_hang() -> None:
    v = classify(record(exit_code=-6, signal=6, steps=2, stderr=fault.NCCL_TEXT))
    assert v.status is TrialStatus.HANG
    assert "rank 1" in v.reason


def test_argparse_rejection_before_first_step_is_invalid() -> None:
    stderr = (
        "usage: train.py [-h] [--per_device_train_batch_size PER_DEVICE_TRAIN_BATCH_SIZE]\n"
        "train.py: error: unrecognized arguments: --bogus_flag 1"
    )
    v = classify(record(exit_code=2, stderr=stderr))
    assert v.status is TrialStatus.INVALID
    assert "--bogus_flag" in v.reason


def test_exit_code_two_before_first_step_is_invalid() -> None:
    v = classify(
        record(
            exit_code=2, stderr="python: can't open file '/x/train.py': [Errno 2] No such file or directory"
        )
    )
    assert v.status is TrialStatus.INVALID
    assert "exit code 2" in v.reason


def test_config_value_error_is_invalid() -> None:
    final = "ValueError: generation_batch_size (3) must be divisible by num_generations (4)."
    frames = (
        ("/work/train.py", "main"),
        ("<string>", "__init__"),
        ("/site-packages/trl/trainer/grpo_config.py", "__post_init__"),
    )
    v = classify(record(exit_code=1, stderr=traceback(final, frames=frames)))
    assert v.status is TrialStatus.INVALID
    assert "generation_batch_size (3)" in v.reason


def test_swift_remaining_argv_is_invalid() -> None:
    # ms-swift 4.6: swift/pipelines/base.py::_parse_args raises on flags it does not know.
    final = "ValueError: remaining_argv: ['--bogus_flag', '1']"
    frames = (
        ("/site-packages/swift/cli/rlhf.py", "<module>"),
        ("/site-packages/swift/pipelines/train/rlhf.py", "rlhf_main"),
        ("/site-packages/swift/pipelines/base.py", "_parse_args"),
    )
    v = classify(record(exit_code=1, stderr=traceback(final, frames=frames)))
    assert v.status is TrialStatus.INVALID
    assert "--bogus_flag" in v.reason


def test_unexpected_keyword_is_invalid() -> None:
    final = "TypeError: GRPOConfig.__init__() got an unexpected keyword argument 'vllm_max_model_len'"
    v = classify(record(exit_code=1, stderr=traceback(final, frames=(("/work/train.py", "main"),))))
    assert v.status is TrialStatus.INVALID


def test_value_error_outside_config_code_is_a_crash() -> None:
    final = "ValueError: Expected input batch_size (8) to match target batch_size (4)."
    frames = (("/site-packages/torch/nn/functional.py", "cross_entropy"),)
    v = classify(record(exit_code=1, stderr=traceback(final, frames=frames)))
    assert v.status is TrialStatus.CRASH
    assert "Expected input batch_size" in v.reason


def test_argument_rejection_after_steps_is_a_crash() -> None:
    v = classify(record(exit_code=2, steps=3, stderr="train.py: error: argument --x: invalid int value: 'a'"))
    assert v.status is TrialStatus.CRASH


def test_crash_reports_last_exception_not_the_torchrun_wrapper() -> None:
    stderr = (
        traceback("RuntimeError: expected scalar type Float but found Half", rank=0)
        + "\n"
        + "\n".join(
            fault.TORCHRUN_SIGKILL.replace("-9 (pid: 48213) SIGKILL", "1 (pid: 48213)").splitlines()[:1]
        )
    )
    v = classify(record(exit_code=1, steps=4, stderr=stderr))
    assert v.status is TrialStatus.CRASH
    assert "RuntimeError: expected scalar type Float but found Half" in v.reason
    assert "step 4" in v.reason


def test_segfault_names_the_signal() -> None:
    v = classify(
        record(
            exit_code=-11,
            signal=11,
            steps=2,
            stderr="Fatal Python error: Segmentation fault\n\nCurrent thread 0x1:",
        )
    )
    assert v.status is TrialStatus.CRASH
    assert "SIGSEGV" in v.reason


def test_torchrun_reported_signal_names_the_signal() -> None:
    stderr = "  exitcode  : -11 (pid: 512) SIGSEGV\n  traceback : Signal 11 (SIGSEGV) received by PID 512"
    v = classify(record(exit_code=1, steps=2, stderr=stderr))
    assert v.status is TrialStatus.CRASH
    assert "SIGSEGV" in v.reason


def test_exit_zero_without_a_step_is_a_crash() -> None:
    v = classify(record(exit_code=0, stdout="nothing to do"))
    assert v.status is TrialStatus.CRASH
    assert "without a step" in v.reason


def test_a_profile_needs_no_step_but_still_reads_the_evidence() -> None:
    """``autotune profile``: a clean exit without step records is a finished run, profiled as a whole;
    a non-zero exit or failure text is judged as in a trial."""
    v = classify(record(exit_code=0, stdout="nothing to do"), steps_required=False)
    assert v.status is TrialStatus.COMPLETE and "timeline covers the whole run" in v.reason
    failed = classify(record(exit_code=1, stderr="ValueError: bad"), steps_required=False)
    assert failed.status is not TrialStatus.COMPLETE
    oom = classify(
        record(exit_code=0, stderr="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
        steps_required=False,
    )
    assert oom.status is TrialStatus.OOM


def test_the_word_error_decides_nothing() -> None:
    noisy = "0 errors\nerror_rate=0.0\nERROR: this line is only a log level\nerror: almost an argparse line"
    assert classify(record(exit_code=0, steps=5, stderr=noisy)).status is TrialStatus.COMPLETE
    crash = classify(record(exit_code=1, steps=5, stderr=noisy))
    assert crash.status is TrialStatus.CRASH
    assert "exit code 1" in crash.reason


def test_exit_code_counts_even_without_text() -> None:
    v = classify(record(exit_code=3, steps=5))
    assert v.status is TrialStatus.CRASH
    assert v.reason == "exit code 3 at step 5"


# A run that finished its work and died at exit (gloo's threads: std::terminate, SIGABRT)

TERMINATE = "terminate called without an active exception"


def torchrun_child_failed(*, rank: int, exitcode: int) -> str:
    """What torchrun prints when one child ended badly (its "Root Cause" block), for ``rank``."""
    name = {-6: "SIGABRT", -11: "SIGSEGV"}.get(exitcode, "")
    return (
        fault.TORCHRUN_SIGKILL.replace(
            "rank      : 1 (local_rank: 1)", f"rank      : {rank} (local_rank: {rank})"
        )
        .replace("exitcode  : -9 (pid: 48213) SIGKILL", f"exitcode  : {exitcode} (pid: 48213) {name}")
        .replace("Signal 9 (SIGKILL)", f"Signal {-exitcode} ({name})")
    )


# torchrun 2.13's report when rank 1 aborted at exit and torchrun then stopped rank 0 (a real run's)
TORCHRUN_RANK1_ABORTED = """terminate called without an active exception
W1123 20:28:11.059000 16935 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 17083 closing signal SIGTERM
E1123 20:28:11.124000 16935 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -6) local_rank: 1 (pid: 17084) of binary: /venv/bin/python
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=======================================================
autotune.backends.trl_worker FAILED
-------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-23_20:28:11
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 17083)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 17083
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_20:28:11
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -6 (pid: 17084)  (SIGABRT)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 17084
======================================================="""


def test_the_rank_named_is_torchruns_root_cause_not_the_rank_it_stopped() -> None:
    v = classify(record(exit_code=1, steps=3, stderr=TORCHRUN_RANK1_ABORTED), steps_expected=3)
    assert v.status is TrialStatus.COMPLETE
    assert v.reason == "finished all 3 steps; rank 1 then aborted at exit (SIGABRT)"
    crashed = classify(record(exit_code=1, steps=2, stderr=TORCHRUN_RANK1_ABORTED), steps_expected=3)
    assert crashed.status is TrialStatus.CRASH and crashed.reason.startswith("killed by SIGABRT at step 2")


def test_every_step_then_sigabrt_at_exit_is_complete_with_a_note() -> None:
    v = classify(record(exit_code=-6, signal=6, steps=4, stderr=TERMINATE), steps_expected=4)
    assert v.status is TrialStatus.COMPLETE
    assert v.reason == "finished all 4 steps; the process then aborted at exit (SIGABRT)"
    assert v.note is not None and v.note.startswith(v.reason)


def test_every_step_then_a_rank_aborted_under_torchrun_names_the_rank() -> None:
    stderr = f"[rank1]: {TERMINATE}\n" + torchrun_child_failed(rank=1, exitcode=-6)
    v = classify(record(exit_code=1, steps=5, stderr=stderr), steps_expected=5)
    assert v.status is TrialStatus.COMPLETE
    assert v.reason == "finished all 5 steps; rank 1 then aborted at exit (SIGABRT)"


def test_every_step_then_another_death_at_exit_says_which() -> None:
    segv = classify(record(exit_code=-11, signal=11, steps=3), steps_expected=3)
    assert (segv.status, segv.reason) == (
        TrialStatus.COMPLETE,
        "finished all 3 steps; the process then died at exit (SIGSEGV)",
    )
    code = classify(record(exit_code=1, steps=3), steps_expected=3)
    assert (code.status, code.reason) == (
        TrialStatus.COMPLETE,
        "finished all 3 steps; the process then exited with code 1",
    )


def test_every_step_then_failure_text_keeps_the_failure() -> None:
    oom = record(exit_code=-6, signal=6, steps=4, stderr=traceback(fault.OOM_TEXT["current"], rank=1))
    assert classify(oom, steps_expected=4).status is TrialStatus.OOM
    nccl = record(exit_code=-6, signal=6, steps=4, stderr=fault.NCCL_TEXT)
    assert classify(nccl, steps_expected=4).status is TrialStatus.HANG
    vllm = record(exit_code=1, steps=4, stderr=fault.VLLM_TEXT["blocks"])
    assert classify(vllm, steps_expected=4).status is TrialStatus.VLLM_INIT
    killed = record(exit_code=-9, signal=9, steps=4)
    assert classify(killed, steps_expected=4).status is TrialStatus.HOST_OOM
    own = FailurePattern("CRASH", r"Segment fault in reward server", "the reward server crashed")
    crash = record(exit_code=-6, signal=6, steps=4, stderr="Segment fault in reward server")
    assert classify(crash, patterns=[own], steps_expected=4).reason == "the reward server crashed"


def test_every_step_then_an_exception_the_program_raised_is_a_crash() -> None:
    stderr = (
        traceback("RuntimeError: could not save the model", rank=0)
        + "\n"
        + torchrun_child_failed(rank=0, exitcode=1)
    )
    v = classify(record(exit_code=1, steps=4, stderr=stderr), steps_expected=4)
    assert v.status is TrialStatus.CRASH
    assert "RuntimeError: could not save the model" in v.reason and v.note is None


def test_a_fatal_python_error_at_exit_is_not_an_exception_of_the_program() -> None:
    stderr = f"{TERMINATE}\nFatal Python error: Aborted\n\nCurrent thread 0x1 (most recent call first):"
    v = classify(record(exit_code=-6, signal=6, steps=4, stderr=stderr), steps_expected=4)
    assert v.status is TrialStatus.COMPLETE


def test_fewer_steps_then_sigabrt_stays_a_crash() -> None:
    v = classify(record(exit_code=-6, signal=6, steps=3, stderr=TERMINATE), steps_expected=4)
    assert v.status is TrialStatus.CRASH
    assert v.reason == "killed by SIGABRT at step 3" and v.note is None


def test_a_repeated_step_record_is_not_a_step_made() -> None:
    steps = [step(1), step(2), step(3), step(3)]
    v = classify(record(exit_code=-6, signal=6, steps=steps), steps_expected=4)
    assert v.status is TrialStatus.CRASH


def test_without_an_expected_step_count_a_death_at_exit_is_a_crash() -> None:
    """A profile (``steps_expected`` None) cannot tell a finished run from one that died early."""
    assert classify(record(exit_code=-6, signal=6, steps=4)).status is TrialStatus.CRASH


def test_a_run_we_stopped_is_not_finished_by_its_step_count() -> None:
    hang = record(exit_code=-15, signal=15, stopped_by="hang", stop_reason="no step for 60 s", steps=4)
    assert classify(hang, steps_expected=4).status is TrialStatus.HANG


def test_health_still_applies_to_a_run_that_died_at_exit() -> None:
    problems = ["grad_norm is 0 on all 4 steps: the model is never updated."]
    v = classify(record(exit_code=-6, signal=6, steps=4), health=problems, steps_expected=4)
    assert v.status is TrialStatus.UNHEALTHY and v.reason == problems[0]
    assert v.note is not None and "aborted at exit (SIGABRT)" in v.note


def test_our_stops_and_the_users() -> None:
    early = classify(
        record(exit_code=-15, signal=15, stopped_by="early_stop", stop_reason="steady after 7 steps", steps=7)
    )
    assert early.status is TrialStatus.COMPLETE and early.reason == "steady after 7 steps"
    pruned = classify(
        record(exit_code=-15, signal=15, stopped_by="pruned", stop_reason="slower than best", steps=4)
    )
    assert pruned.status is TrialStatus.PRUNED and pruned.reason == "slower than best"
    stopped = classify(
        record(exit_code=-15, signal=15, stopped_by="interrupt", stop_reason="stopped by the user", steps=4)
    )
    assert stopped.status is TrialStatus.INTERRUPTED


def test_health_problems_turn_complete_into_unhealthy() -> None:
    problems = ["grad_norm is 0 on all 5 steps: the model is never updated.", "second"]
    v = classify(record(exit_code=0, steps=5), health=problems)
    assert v.status is TrialStatus.UNHEALTHY
    assert v.reason.startswith("grad_norm is 0") and "1 more" in v.reason
    # failures stay failures
    assert classify(record(exit_code=-9, signal=9, steps=2), health=problems).status is TrialStatus.HOST_OOM


def test_backend_patterns_come_first() -> None:
    mine = FailurePattern("OOM", r"DeepSpeed ran out of pinned memory", "pinned host memory exhausted")
    v = classify(record(exit_code=1, steps=1, stderr="DeepSpeed ran out of pinned memory"), patterns=[mine])
    assert v.status is TrialStatus.OOM and v.reason.startswith("pinned host memory exhausted")
    crash = FailurePattern("CRASH", r"Reward server unreachable", "the reward server is down")
    v2 = classify(record(exit_code=1, steps=1, stderr="Reward server unreachable at :8000"), patterns=[crash])
    assert v2.status is TrialStatus.CRASH and v2.reason == "the reward server is down"


# One real line per common pattern (the frameworks' own wording), keyed by the pattern's regex: a new
# pattern without a sample fails the test below, and so does a pattern that stops matching its text.
PATTERN_SAMPLES = {
    r"(?i:CUDA out of memory)": f"[rank2]: {fault.OOM_TEXT['current']}",
    # vLLM's sleep-mode wake-up: "CUDA Error" with a capital E
    r"(?i:CUDA error: out of memory)": fault.OOM_TEXT["cumem"],
    r"(?i:Cuda failure \d* ?'out of memory')": (
        "node-3:48213:48301 [1] NCCL INFO include/alloc.h:125 NCCL WARN Cuda failure 2 'out of memory'"
    ),
    r"server socket has failed to listen on any local network address.*EADDRINUSE": (
        fault.PORT_IN_USE_TEXT.splitlines()[-1]
    ),
    r"Error in memory profiling": f"(EngineCore pid=253) {fault.VLLM_TEXT['profiling']}",
    r"HIP out of memory": "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB.",
    r"CUBLAS_STATUS_ALLOC_FAILED": (
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
    ),
    r"Free memory on device .*on startup is less than desired GPU memory utilization": (
        f"(EngineCore pid=253) {fault.VLLM_TEXT['free']}"
    ),
    r"on startup is less than desired CPU memory utilization": fault.VLLM_TEXT["cpu_startup"],
    r"on kv cache allocation is less than requested memory for kv": f"[rank0]: {fault.VLLM_TEXT['cpu_kv']}",
    r"No available memory for the cache blocks": fault.VLLM_TEXT["blocks"],
    r"KV cache is needed, which is larger than the available KV cache memory": fault.VLLM_TEXT["max_len"],
    r"is larger than the maximum number of tokens that can be stored in KV cache": (
        "ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be "
        "stored in KV cache (20000). Try increasing `gpu_memory_utilization` or decreasing `max_model_len`"
    ),
    r"exitcode\s*:\s*-9\b": "  exitcode  : -9 (pid: 48213) SIGKILL",
    r"Signal 9 \(SIGKILL\) received by PID": "  traceback : Signal 9 (SIGKILL) received by PID 48213",
    r"DefaultCPUAllocator: can't allocate memory": (
        "RuntimeError: [enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: can't allocate memory: "
        "you tried to allocate 17179869184 bytes."
    ),
    r"ProcessGroup\w*'s watchdog got stuck for \d+ seconds": fault.NCCL_TEXT,
    r"Watchdog caught collective operation timeout": (
        "[rank0]:[E1111 17:10:53] [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out."
    ),
    r": error: (?:unrecognized arguments|argument |the following arguments are required|invalid choice)": (
        "train.py: error: unrecognized arguments: --bogus_flag 3"
    ),
    r"Some specified arguments are not used by the HfArgumentParser": (
        "ValueError: Some specified arguments are not used by the HfArgumentParser: ['--bogus_flag', '3']"
    ),
    r"^Error: (?:No such option|Invalid value for|Missing option|Got unexpected extra argument)": (
        "Error: No such option: --bogus-flag"
    ),
}


def test_common_patterns_compile_and_name_real_statuses() -> None:
    import re

    for p in COMMON_PATTERNS:
        re.compile(p.regex)
        TrialStatus(p.status)


@pytest.mark.parametrize("pattern", COMMON_PATTERNS, ids=lambda p: p.regex[:40])
def test_each_common_pattern_finds_its_framework_text(pattern: FailurePattern) -> None:
    sample = PATTERN_SAMPLES[pattern.regex]
    found = match_patterns(["step 3 loss 0.12", sample], [pattern])
    assert found == {pattern.status: (pattern, sample.strip())}
    # among all the common patterns too, the text is read as the status this pattern names
    assert match_patterns([sample], COMMON_PATTERNS)[pattern.status][1] == sample.strip()


def test_common_patterns_leave_ordinary_output_alone() -> None:
    ordinary = [
        "{'loss': 0.0123, 'grad_norm': 0.5, 'learning_rate': 1e-06, 'epoch': 0.01}",
        "INFO 11-11 17:01:37 gpu_memory_utilization=0.9 max_model_len=4096 KV cache usage 12.5%",
        "usage: train.py [-h] [--model MODEL]",
        "Warning: the watchdog timeout is 600 seconds",
    ]
    assert match_patterns(ordinary, COMMON_PATTERNS) == {}


def test_helpers() -> None:
    assert strip_rank_prefix("[rank3]: ValueError: x") == "ValueError: x"
    assert strip_rank_prefix("[rank1]:[E1111 17:01:37] text").startswith("[E1111")
    assert strip_rank_prefix("(EngineCore pid=253) ValueError: y") == "ValueError: y"
    assert (
        last_error_line(
            ["a", "KeyError: 'x'", "b", "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"]
        )
        == "KeyError: 'x'"
    )
    assert last_error_line(["INFO: starting", "Warning: something"]) is None
    found = match_patterns(["fine", f"[rank2]: {fault.OOM_TEXT['cuda']}"], COMMON_PATTERNS)
    assert set(found) == {"OOM"}


# --------------------------------------------------------------------------------------------------
# Health gate


def run_of(n: int, **series: Any) -> list[StepMetrics]:
    """n steps; each keyword is a constant or a callable of the step number."""
    out = []
    for i in range(1, n + 1):
        values = {k: (v(i) if callable(v) else v) for k, v in series.items()}
        out.append(step(i, **values))
    return out


HEALTHY = {
    "loss": lambda i: 0.001 * i,
    "grad_norm": lambda i: 0.5 + 0.1 * i,
    "kl": lambda i: 0.0 if i == 1 else 1e-4 * i,
    "reward": 0.2,
    "reward_std": 0.4,
}


def test_healthy_run_has_no_problems() -> None:
    assert health_check(run_of(6, **HEALTHY), beta=0.04, max_completion_length=16, baseline=None) == []


def test_loss_zero_alone_is_healthy() -> None:
    steps = run_of(6, **{**HEALTHY, "loss": 0.0})
    assert health_check(steps, beta=0.04, max_completion_length=16, baseline=None) == []


def test_nan_and_inf() -> None:
    problems = health_check(
        run_of(4, **{**HEALTHY, "loss": math.nan}), beta=None, max_completion_length=None, baseline=None
    )
    assert problems == ["loss is NaN at step 1 (4 of 4 steps not finite)."]
    inf = health_check(
        run_of(4, **{**HEALTHY, "grad_norm": lambda i: math.inf if i == 3 else 1.0}),
        beta=None,
        max_completion_length=None,
        baseline=None,
    )
    assert inf == ["grad_norm is infinite at step 3 (1 of 4 steps not finite)."]


def test_grad_norm_and_kl_zero_on_every_step() -> None:
    steps = run_of(5, **{**HEALTHY, "grad_norm": 0.0, "kl": 0.0})
    problems = health_check(steps, beta=0.04, max_completion_length=None, baseline=None)
    assert any(p.startswith("grad_norm is 0 on all 5 steps") for p in problems)
    assert any(p.startswith("kl is 0 on all 4 steps after the first although beta = 0.04") for p in problems)


def test_kl_zero_is_fine_without_beta_and_grad_norm_zero_once_is_fine() -> None:
    steps = run_of(5, **{**HEALTHY, "kl": 0.0, "grad_norm": lambda i: 0.0 if i == 1 else 1.0})
    assert health_check(steps, beta=0.0, max_completion_length=None, baseline=None) == []
    assert health_check(steps, beta=None, max_completion_length=None, baseline=None) == []


def test_reward_std_zero_on_every_step() -> None:
    problems = health_check(
        run_of(4, **{**HEALTHY, "reward_std": 0.0}), beta=None, max_completion_length=None, baseline=None
    )
    assert len(problems) == 1 and problems[0].startswith("reward_std is 0 on all 4 steps")


def test_clipping_is_judged_against_the_baseline() -> None:
    clipped = run_of(5, **{**HEALTHY, "completions/clipped_ratio": 1.0})
    # fixed-length completions: the baseline is clipped too, so this is by design
    same = run_of(5, **{**HEALTHY, "completions/clipped_ratio": 1.0})
    assert health_check(clipped, beta=None, max_completion_length=16, baseline=same) == []
    assert health_check(clipped, beta=None, max_completion_length=16, baseline=None) == []
    base = run_of(5, **{**HEALTHY, "completions/clipped_ratio": 0.2})
    problems = health_check(clipped, beta=None, max_completion_length=16, baseline=base)
    assert problems == [
        "every completion hit the max length (16 tokens) on all 5 steps (clipped ratio 1.0) while the baseline "
        "clipped 20%: rollouts are degenerate."
    ]


def test_mean_length_at_the_limit_when_no_clipped_ratio() -> None:
    long = run_of(4, **{**HEALTHY, "completions/mean_length": 512.0})
    base = run_of(4, **{**HEALTHY, "completions/mean_length": 200.0})
    problems = health_check(long, beta=None, max_completion_length=512, baseline=base)
    assert len(problems) == 1 and "mean completion length is the max (512 tokens)" in problems[0]


def test_reward_collapse_against_the_baseline() -> None:
    base = run_of(6, **{**HEALTHY, "reward": 0.5, "reward_std": 0.2})
    collapsing = run_of(6, **{**HEALTHY, "reward": lambda i: 0.5 - 0.12 * i, "reward_std": 0.2})
    problems = health_check(collapsing, beta=None, max_completion_length=None, baseline=base)
    assert len(problems) == 1 and "rewards are collapsing" in problems[0]
    similar = run_of(6, **{**HEALTHY, "reward": lambda i: 0.5 - 0.01 * i, "reward_std": 0.2})
    assert health_check(similar, beta=None, max_completion_length=None, baseline=base) == []
    improving = run_of(6, **{**HEALTHY, "reward": lambda i: 0.1 + 0.01 * i, "reward_std": 0.2})
    assert health_check(improving, beta=None, max_completion_length=None, baseline=base) == []


def test_live_health_stops_only_what_never_recovers() -> None:
    zero = {"grad_norm": 0.0, "kl": 0.0, "loss": 0.0}
    assert live_health(run_of(LIVE_HEALTH_MIN_STEPS - 1, **zero), beta=0.04) == []  # too early to tell
    problems = live_health(run_of(LIVE_HEALTH_MIN_STEPS, **zero), beta=0.04)
    assert len(problems) == 1 and problems[0].startswith("grad_norm is 0 on all 4 steps")
    kl_only = {**HEALTHY, "kl": 0.0}
    assert live_health(run_of(LIVE_HEALTH_MIN_STEPS, **kl_only), beta=0.04) == []  # kl: after the first
    assert "kl is 0" in live_health(run_of(LIVE_HEALTH_MIN_STEPS + 1, **kl_only), beta=0.04)[0]
    assert live_health(run_of(LIVE_HEALTH_MIN_STEPS + 1, **kl_only), beta=0.0) == []  # no KL term
    assert "loss is NaN at step 1" in live_health(run_of(1, **{**HEALTHY, "loss": math.nan}), beta=0.0)[0]
    # reward_std 0 may still change: left to the end-of-trial check
    assert live_health(run_of(8, **{**HEALTHY, "reward_std": 0.0}), beta=0.04) == []
    assert live_health(run_of(8, **HEALTHY), beta=0.04) == []


def test_a_trial_stopped_for_its_health_is_unhealthy_not_pruned() -> None:
    stopped = record(
        exit_code=-15, signal=15, steps=4, stopped_by="pruned", stop_reason="stopped: grad_norm is 0"
    )
    problems = ["grad_norm is 0 on all 4 steps: the model is never updated."]
    assert classify(stopped, health=problems).status is TrialStatus.UNHEALTHY
    assert classify(stopped).status is TrialStatus.PRUNED


def test_live_health_sees_degenerate_rollouts_against_the_baseline() -> None:
    baseline = run_of(6, **{**HEALTHY, "completions/clipped_ratio": 0.25})
    clipped = {**HEALTHY, "completions/clipped_ratio": lambda i: 0.3 if i == 1 else 1.0}
    n = LIVE_HEALTH_MIN_STEPS
    assert live_health(run_of(n, **clipped), beta=0.0, baseline=baseline) == []  # step 1 was fine
    problems = live_health(run_of(n + 1, **clipped), beta=0.0, baseline=baseline)
    assert len(problems) == 1 and "rollouts are degenerate" in problems[0]
    assert live_health(run_of(n + 1, **clipped), beta=0.0, baseline=None) == []  # nothing to compare
    fixed_length = run_of(6, **{**HEALTHY, "completions/clipped_ratio": 1.0})  # clipped by design
    assert live_health(run_of(n + 1, **clipped), beta=0.0, baseline=fixed_length) == []


# --------------------------------------------------------------------------------------------------
# Early calls: what the outcome reads from them


def test_a_sigkill_we_sent_after_a_fatal_line_is_not_a_host_oom() -> None:
    # the group ignored SIGTERM after NCCL's watchdog text and needed our SIGKILL
    rec = record(
        exit_code=-9,
        signal=9,
        stopped_by="fatal_output",
        stop_reason="still running 5.0 s after a fatal line",
        steps=2,
        stderr=fault.NCCL_TEXT,
    )
    verdict = classify(rec)
    assert verdict.status is TrialStatus.HANG
    assert "watchdog" in verdict.reason
    # the same SIGKILL not sent by us stays what it was
    assert classify(record(exit_code=-9, signal=9, steps=2)).status is TrialStatus.HOST_OOM


def test_a_hang_called_from_evidence_keeps_its_evidence() -> None:
    rec = replace(
        record(exit_code=-15, signal=15, stopped_by="hang", stop_reason="in weight sync for 61 s", steps=3),
        hang_signal="weight_sync_log",
        stop_evidence="weight_sync_log: weight_sync entered and not left for 61.0 s (phase marker)",
    )
    verdict = classify(rec)
    assert verdict.status is TrialStatus.HANG
    assert verdict.evidence is not None and verdict.evidence.startswith("weight_sync_log: ")
    plain = record(exit_code=-15, signal=15, stopped_by="hang", stop_reason="no step for 61 s", steps=3)
    assert classify(plain).evidence is None  # the plain watchdog's call stays as it was


def test_a_host_oom_reason_agrees_with_the_host_figures() -> None:
    from autotune.trial.outcome import host_oom_reason

    reason = "killed by SIGKILL that autotune did not send (exit -9): most likely the host ran out of RAM"
    gib = 1 << 30
    assert host_oom_reason(reason, int(0.3 * gib), 64 * gib) == reason  # memory did run out: as it was
    assert host_oom_reason(reason, None, 64 * gib) == reason  # nothing known: as it was
    amended = host_oom_reason(reason, 22 * gib, 64 * gib)
    assert "most likely the host ran out of RAM" not in amended
    assert "never fell below 22.0 GiB of 64.0 GiB" in amended and amended.startswith("killed by SIGKILL")
