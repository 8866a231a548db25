"""Every verdict field by field, and every health message word for word: the cases where a rule's
default text, evidence line or boundary is the whole point (each assert is one a plausible slip breaks:
a default reason dropped, the evidence of another line, an off-by-one at a threshold)."""

from __future__ import annotations

import math
import signal
from typing import Any

import pytest

from autotune.backends._base import FailurePattern
from autotune.records import StepMetrics, TrialStatus
from autotune.trial.outcome import (
    Verdict,
    classify,
    health_check,
    host_oom_reason,
    live_health,
    ran_every_step,
)
from autotune.trial.runner import RunRecord

GIB = 1 << 30


def record(
    *,
    exit_code: int | None = 1,
    sig: int | None = None,
    stopped_by: str | None = None,
    stop_reason: str | None = None,
    steps: int = 0,
    stderr: str = "",
    stdout: str = "",
) -> RunRecord:
    return RunRecord(
        exit_code=exit_code,
        signal=sig,
        stopped_by=stopped_by,
        stop_reason=stop_reason,
        steps=[
            StepMetrics(step=i, t_mono_s=float(i), t_wall_s=float(i), values={}) for i in range(1, steps + 1)
        ],
        stdout_tail=stdout.splitlines(),
        stderr_tail=stderr.splitlines(),
        evidence=[],
        duration_s=1.0,
        startup_s=None,
        started_wall_s=0.0,
        pid=1,
        pgid=1,
    )


def tb(final: str, *frames: tuple[str, str]) -> str:
    """A Python traceback through ``frames`` (file, function) ending in ``final``."""
    body = ["Traceback (most recent call last):"]
    for path, func in frames:
        body += [f'  File "{path}", line 10, in {func}', "    something()"]
    return "\n".join([*body, final])


# ------------------------------------------------------------------------- rules 1-2: our stops, clean exits


@pytest.mark.parametrize(
    ("rec", "expected"),
    [
        (record(stopped_by="interrupt"), Verdict(TrialStatus.INTERRUPTED, "stopped by the user")),
        (
            record(stopped_by="early_stop", steps=3, exit_code=-15),
            Verdict(TrialStatus.COMPLETE, "stopped at steady state after 3 steps"),
        ),
        # we stopped it at its last allowed step (SIGTERM: -15): complete, not a crash at step 4
        (
            record(stopped_by="max_steps", steps=4, exit_code=-15),
            Verdict(TrialStatus.COMPLETE, "completed 4 steps"),
        ),
        (
            record(stopped_by="pruned", steps=2, exit_code=-15),
            Verdict(TrialStatus.PRUNED, "pruned by the study"),
        ),
        # one step is a step: a clean exit after it is a finished run
        (record(exit_code=0, steps=1), Verdict(TrialStatus.COMPLETE, "completed 1 steps")),
        (record(stopped_by="hang", steps=2), Verdict(TrialStatus.HANG, "no progress")),
        (record(stopped_by="timeout", steps=2), Verdict(TrialStatus.TIMEOUT, "trial wall budget ran out")),
    ],
    ids=["interrupt", "early_stop", "max_steps", "pruned", "one_step", "hang", "timeout"],
)
def test_our_stops_without_a_stated_reason_get_the_default_one(rec: RunRecord, expected: Verdict) -> None:
    assert classify(rec) == expected


@pytest.mark.parametrize("stopped_by", ["early_stop", "max_steps", "pruned"])
def test_a_run_we_stopped_with_health_problems_is_unhealthy(stopped_by: str) -> None:
    rec = record(stopped_by=stopped_by, steps=4, exit_code=-15, stop_reason="done")
    health = ["grad_norm is 0 on all 4 steps: the model is never updated.", "second problem"]
    assert classify(rec, health=health) == Verdict(
        TrialStatus.UNHEALTHY, "grad_norm is 0 on all 4 steps: the model is never updated. (and 1 more)"
    )


# ------------------------------------------------------------------- rules 3-6: failure text, kills, hangs


def test_an_oom_reason_quotes_the_sizes_or_nothing() -> None:
    line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.32 GiB. GPU 1 has a total capacity of 22.07 GiB of which 1.02 GiB is free."
    assert classify(record(steps=2, stderr=line)) == Verdict(
        TrialStatus.OOM,
        "CUDA out of memory: tried to allocate 2.32 GiB, GPU 1 had 1.02 GiB free of 22.07 GiB",
        line,
    )
    bare = "RuntimeError: CUDA out of memory."
    assert classify(record(steps=2, stderr=bare)) == Verdict(TrialStatus.OOM, "CUDA out of memory", bare)


def test_vllm_and_host_allocator_texts_name_their_rank() -> None:
    vllm = (
        "[rank1]: ValueError: No available memory for the cache blocks. Try increasing gpu_memory_utilization"
    )
    assert classify(record(stderr=vllm)) == Verdict(
        TrialStatus.VLLM_INIT, "vLLM could not start: no memory left for KV cache blocks on rank 1", vllm
    )
    host = (
        "[rank0]: RuntimeError: [enforce fail at alloc_cpu.cpp:83] DefaultCPUAllocator: can't allocate memory"
    )
    assert classify(record(steps=2, stderr=host)) == Verdict(
        TrialStatus.HOST_OOM, "host RAM allocation failed on rank 0", host
    )


def test_a_sigkill_nobody_here_sent_says_how_it_was_seen() -> None:
    likely = ": most likely the host ran out of RAM"
    assert classify(record(exit_code=-9, sig=signal.SIGKILL, steps=2)) == Verdict(
        TrialStatus.HOST_OOM, f"killed by SIGKILL that autotune did not send (exit -9){likely}"
    )
    assert classify(record(exit_code=137, steps=2)) == Verdict(
        TrialStatus.HOST_OOM,
        f"killed by SIGKILL that autotune did not send (exit code 137, a shell's report of SIGKILL){likely}",
    )


@pytest.mark.parametrize(
    ("exit_code", "reason"),
    [
        (128, "exit code 128 at step 2"),  # 128 + 0 is no signal
        (129, "killed by SIGHUP at step 2"),
        (192, "killed by SIGRTMAX at step 2"),  # 128 + 64, the last signal a shell reports
        (193, "exit code 193 at step 2"),
    ],
)
def test_a_shells_128_plus_n_is_a_signal_only_for_n_1_to_64(exit_code: int, reason: str) -> None:
    assert classify(record(exit_code=exit_code, steps=2)) == Verdict(TrialStatus.CRASH, reason)


def test_a_backend_pattern_for_another_status_decides_it() -> None:
    stalled = FailurePattern("TIMEOUT", r"generation stalled", "the rollout engine stalled")
    line = "WARNING generation stalled for 600 s"
    assert classify(record(steps=2, stderr=line), patterns=[stalled]) == Verdict(
        TrialStatus.TIMEOUT, "the rollout engine stalled", line
    )


# ---------------------------------------------------------------------- rule 7: rejected arguments


def test_an_argument_rejection_before_the_first_step_beats_a_crash_text() -> None:
    boom = FailurePattern("CRASH", r"worker died", "a worker died")
    final = "ValueError: num_generations must divide the batch"
    text = "worker died\n" + tb(final, ("/opt/trl/trainer/grpo_config.py", "__post_init__"))
    assert classify(record(stderr=text), patterns=[boom]) == Verdict(
        TrialStatus.INVALID, f"the framework rejected its configuration: {final}", final
    )


def test_a_backend_invalid_pattern_quotes_its_line() -> None:
    bad = FailurePattern("INVALID", r"unknown dataset field", "the framework rejected the dataset")
    line = "[rank0]: unknown dataset field 'prompt2'"
    assert classify(record(stderr=line), patterns=[bad]) == Verdict(
        TrialStatus.INVALID, "the framework rejected the dataset: unknown dataset field 'prompt2'", line
    )


def test_a_usage_error_quotes_the_error_line_or_none() -> None:
    usage = "usage: train.py [-h]\ntrain.py: oops something odd"
    assert classify(record(exit_code=2, stderr=usage)) == Verdict(
        TrialStatus.INVALID,
        "exit code 2 before the first step (usage error): train.py: oops something odd",
        "train.py: oops something odd",
    )
    assert classify(record(exit_code=2)) == Verdict(
        TrialStatus.INVALID, "exit code 2 before the first step (usage error)"
    )


@pytest.mark.parametrize(
    ("frames", "final", "invalid"),
    [
        # the file's name says config, the function's does not: still a config frame
        ((("/opt/trl/grpo_config.py", "__init__"),), "ValueError: bad value", True),
        # the only config frame is the first one after "Traceback"
        ((("/opt/swift/rlhf_args.py", "check"), ("/opt/swift/x.py", "run")), "ValueError: bad value", True),
        # a directory named like configuration code proves nothing: only the file's own name counts
        ((("/home/margaret/train.py", "main"),), "ValueError: bad value", False),
        ((("/srv/configs/train.py", "main"),), "ValueError: bad value", False),
        ((("/opt/app/cli_parse.py", "run"),), "argparse.ArgumentError: argument --lr: invalid float", True),
        ((("/opt/app/cli_parse.py", "run"),), "argparse.ArgumentTypeError: not a float", True),
        ((("/opt/app/cli_parse.py", "run"),), "KeyError: 'lr'", False),
        # a config class called with a name it does not have: no config frame needed
        (
            (("/opt/app/train.py", "main"),),
            "TypeError: __init__() got an unexpected keyword argument 'lr2'",
            True,
        ),
    ],
)
def test_which_tracebacks_are_configuration_rejections(
    frames: tuple[tuple[str, str], ...], final: str, invalid: bool
) -> None:
    v = classify(record(stderr=tb(final, *frames)))
    if invalid:
        assert v == Verdict(TrialStatus.INVALID, f"the framework rejected its configuration: {final}", final)
    else:
        assert v == Verdict(TrialStatus.CRASH, f"exit code 1 before the first step: {final}", final)


# --------------------------------------------------------------------- rules 8-10: no step, death, crash


def test_exit_zero_without_a_step_quotes_the_last_output() -> None:
    assert classify(record(exit_code=0, stdout="loading\nnothing to do\n")) == Verdict(
        TrialStatus.CRASH, "exited without a step (exit code 0)", "nothing to do"
    )
    assert classify(record(exit_code=0, stdout="x"), steps_required=False) == Verdict(
        TrialStatus.COMPLETE, "finished (exit code 0) without step records: the timeline covers the whole run"
    )


def test_failure_text_after_every_step_is_not_a_death_at_exit() -> None:
    # every step made, then an argument rejection's text and exit 1: a failure, never "finished"
    v = classify(record(steps=3, stderr="train.py: error: unrecognized arguments: --x"), steps_expected=3)
    assert v.status is TrialStatus.CRASH and v.note is None


def test_a_crash_names_its_signal_or_exit_code_and_keeps_the_error_as_evidence() -> None:
    err = "RuntimeError: boom"
    assert classify(record(exit_code=-11, sig=11, steps=2, stderr=err)) == Verdict(
        TrialStatus.CRASH, f"killed by SIGSEGV at step 2 ({err})", err
    )
    assert classify(record(exit_code=3, steps=2, stderr=err)) == Verdict(
        TrialStatus.CRASH, f"exit code 3 at step 2: {err}", err
    )
    # no error line: the last non-blank line, stderr's before stdout's
    assert classify(record(exit_code=3, steps=2, stderr="[rank1]: bye\n\n", stdout="out")) == Verdict(
        TrialStatus.CRASH, "exit code 3 at step 2: bye", "[rank1]: bye"
    )
    assert classify(record(exit_code=3, steps=2, stdout="out\n")) == Verdict(
        TrialStatus.CRASH, "exit code 3 at step 2: out", "out"
    )
    assert classify(record(exit_code=3, steps=2)) == Verdict(TrialStatus.CRASH, "exit code 3 at step 2")


def test_a_reason_is_cut_at_300_characters() -> None:
    for n, expected_len in ((300 - len("exit code 3 at step 2: ") - len("ValueError: "), 300), (400, 300)):
        err = "ValueError: " + "x" * n
        reason = classify(record(exit_code=3, steps=2, stderr=err)).reason
        assert len(reason) == expected_len
        full = f"exit code 3 at step 2: {err}"
        assert reason == (full if len(full) <= 300 else full[:299] + "…")


def test_ran_every_step_needs_a_positive_count_and_a_run_that_ended_by_itself() -> None:
    assert ran_every_step(record(exit_code=1, steps=1), 1) is True
    assert ran_every_step(record(exit_code=1, steps=1), 0) is False
    assert ran_every_step(record(exit_code=1, steps=1), None) is False
    assert ran_every_step(record(exit_code=-15, steps=4, stopped_by="hang"), 4) is False


# ---------------------------------------------------------------------------------- host memory notes


def test_a_host_oom_reason_keeps_its_cause_only_while_the_samples_allow_it() -> None:
    reason = "killed by SIGKILL that autotune did not send (exit -9): most likely the host ran out of RAM"
    # 64 GiB of RAM: 4 GiB available is above 1 GiB but under 10 % (6.4 GiB): the host may have run out
    assert host_oom_reason(reason, 4 * GIB, 64 * GIB) == reason
    # 20 GiB of RAM: exactly 10 % (2 GiB) available at worst is ample
    assert host_oom_reason(reason, 2 * GIB, 20 * GIB) == (
        "killed by SIGKILL that autotune did not send (exit -9); yet host memory available never fell below"
        " 2.0 GiB of 20.0 GiB in the samples: a container's or cgroup's memory limit, another process, or a"
        " spike between samples sent it"
    )


# ----------------------------------------------------------------------------------- the health gate


def run_of(n: int, **series: Any) -> list[StepMetrics]:
    """n steps; each keyword is a constant or a callable of the step number."""
    return [
        StepMetrics(
            step=i,
            t_mono_s=float(i),
            t_wall_s=float(i),
            values={k: (v(i) if callable(v) else v) for k, v in series.items()},
        )
        for i in range(1, n + 1)
    ]


HEALTHY = {"grad_norm": lambda i: 0.5 + 0.1 * i, "kl": lambda i: 1e-4 * i, "reward": 0.2, "reward_std": 0.4}
NO_REWARD_STD = {k: v for k, v in HEALTHY.items() if k != "reward_std"}


def check(
    steps: list[StepMetrics], baseline: list[StepMetrics] | None = None, mcl: int | None = None
) -> list[str]:
    return health_check(steps, beta=0.04, max_completion_length=mcl, baseline=baseline)


def test_two_steps_are_enough_for_the_end_of_trial_checks() -> None:
    assert check(run_of(2, **{**HEALTHY, "grad_norm": 0.0})) == [
        "grad_norm is 0 on all 2 steps: the model is never updated."
    ]
    assert check(run_of(3, **{**HEALTHY, "kl": 0.0})) == [
        "kl is 0 on all 2 steps after the first although beta = 0.04: the policy never moves away from the"
        " reference."
    ]
    assert check(run_of(2, **{**HEALTHY, "reward_std": 0.0})) == [
        "reward_std is 0 on all 2 steps: every completion of a prompt gets the same reward, so every advantage"
        " is 0."
    ]
    assert check(run_of(4, **{**HEALTHY, "kl": lambda i: math.nan if i == 2 else 0.1})) == [
        "kl is NaN at step 2 (1 of 4 steps not finite)."
    ]


def test_clipping_thresholds_and_the_limit_text() -> None:
    base = run_of(3, **{**HEALTHY, "completions/clipped_ratio": 0.2})
    # two steps, both at 0.999 (a float that rounds a full batch): all clipped; no limit known: no "(N tokens)"
    assert check(run_of(2, **{**HEALTHY, "completions/clipped_ratio": 0.999}), base) == [
        "every completion hit the max length on all 2 steps (clipped ratio 1.0) while the baseline clipped 20%:"
        " rollouts are degenerate."
    ]
    # a baseline that clipped exactly 90 % clips as much by design
    at_90 = run_of(2, **{**HEALTHY, "completions/clipped_ratio": 0.9})
    assert check(run_of(2, **{**HEALTHY, "completions/clipped_ratio": 1.0}), at_90) == []


def test_mean_length_at_the_limit_thresholds() -> None:
    base = run_of(3, **{**HEALTHY, "completions/mean_length": 200.0})

    def lengths(*v: float) -> list[StepMetrics]:
        return run_of(len(v), **{**HEALTHY, "completions/mean_length": lambda i: v[i - 1]})

    # two steps within half a token of 512 count as at the limit
    assert check(lengths(511.5, 512.0), base, mcl=512) == [
        "mean completion length is the max (512 tokens) on all 2 steps while the baseline's was 200: rollouts"
        " are degenerate."
    ]
    assert check(lengths(511.0, 512.0), base, mcl=512) == []  # a token short of it is not
    assert check(lengths(300.0, 310.0), base, mcl=512) == []  # far from it
    # a baseline at 90 % of the limit (450 of 500) or more was long by design
    assert (
        check(lengths(500.0, 500.0), run_of(2, **{**HEALTHY, "completions/mean_length": 450.0}), mcl=500)
        == []
    )
    assert (
        check(lengths(500.0, 500.0), run_of(2, **{**HEALTHY, "completions/mean_length": 460.0}), mcl=500)
        == []
    )
    # no known limit: lengths say nothing
    assert check(lengths(512.0, 512.0), base, mcl=None) == []


@pytest.mark.parametrize(
    ("base_series", "scale_text"),
    [
        ({"reward": 0.5, "reward_std": 0.2}, "0.2"),  # the baseline's mean reward_std
        (
            {"reward": lambda i: 0.5 + (0.1 if i % 2 else -0.1)},
            "0.1155",
        ),  # no reward_std: stdev of 0.6, 0.4, 0.6, 0.4
        ({"reward": 0.5}, "0.05"),  # constant baseline reward: 10 % of it
        ({"reward": 0.5, "reward_std": 0.0}, "0.05"),  # reward_std logged as 0: the same fallback
    ],
)
def test_a_collapsing_reward_names_the_scale_it_fell_by(base_series: dict[str, Any], scale_text: str) -> None:
    # rewards 0.5, 0.5, 0.5, 0.1, 0.1, 0.1: the last 3 steps average 0.1 against the baseline's 0.5
    collapsing = run_of(6, **{**HEALTHY, "reward": lambda i: 0.5 if i <= 3 else 0.1})
    assert check(collapsing, run_of(4, **{**NO_REWARD_STD, **base_series})) == [
        f"reward fell to 0.1 over the last 3 steps against 0.5 in the baseline (more than one reward_std,"
        f" {scale_text}, below): rewards are collapsing."
    ]


def test_reward_collapse_boundaries() -> None:
    def rewards(*v: float) -> list[StepMetrics]:
        return run_of(len(v), **{**HEALTHY, "reward": lambda i: v[i - 1]})

    base = run_of(2, **{**HEALTHY, "reward": 0.5, "reward_std": 0.25})  # two steps are enough of a baseline
    # two steps are enough of a trial: 0.5 then 0.2, below 0.5 - 0.25
    assert check(rewards(0.5, 0.2), base) == [
        "reward fell to 0.2 over the last 1 steps against 0.5 in the baseline (more than one reward_std, 0.25,"
        " below): rewards are collapsing."
    ]
    assert check(rewards(0.5, 0.5, 0.25, 0.25), base) == []  # exactly one reward_std below: not more
    assert check(rewards(0.1, 0.1, 0.1, 0.1), base) == []  # lower all along, not falling
    assert check(rewards(0.1), base) == []  # one step shows no trend
    # a zero baseline reward with no spread at all still gives a scale (1e-9), not a division by nothing
    flat_zero = run_of(2, **{**NO_REWARD_STD, "reward": 0.0})
    assert check(rewards(0.0, -1.0), flat_zero) == [
        "reward fell to -1 over the last 1 steps against 0 in the baseline (more than one reward_std, 1e-09,"
        " below): rewards are collapsing."
    ]


def test_live_health_reports_every_conclusive_problem_word_for_word() -> None:
    base = run_of(4, **{**HEALTHY, "completions/clipped_ratio": 0.1})
    steps = run_of(
        4, **{**HEALTHY, "loss": lambda i: math.inf if i == 4 else 0.1, "completions/clipped_ratio": 1.0}
    )
    assert live_health(steps, beta=0.04, baseline=base) == [
        "loss is infinite at step 4 (1 of 4 steps not finite).",
        "every completion hit the max length on the last 4 steps (clipped ratio 1.0) while the baseline clipped"
        " 10%: rollouts are degenerate.",
    ]
