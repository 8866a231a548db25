"""Each diagnosis rule: evidence that triggers it (with the numbers quoted) and evidence that does not."""

from __future__ import annotations

from pathlib import Path

import make_fixture as mf
import pytest
from autotune.reports._load import load_study
from autotune.reports.diagnosis import (
    Context,
    Finding,
    OffloadFit,
    Severity,
    diagnose,
    make_context,
    rule_hang_pattern,
    rule_host_cpu_stall,
    rule_host_memory,
    rule_micro_batch_headroom,
    rule_offload_bottleneck,
    rule_oom_boundary,
    rule_other_failures,
    rule_rollout_idle,
    rule_unhealthy_trials,
    rule_zero3_gather_peak,
)

from autotune.records import TrialStatus

GB = 1e9


def study(tmp_path: Path, *specs: mf.TrialSpecFixture, estimator=None) -> Context:
    root = tmp_path / "study"
    mf.write_study(root, list(specs))
    return make_context(load_study(root), estimator=estimator)


def run_trial_rule(ctx: Context, rule, number: int) -> Finding | None:
    trial = ctx.data.trial(number)
    assert trial is not None
    return rule(ctx, trial, ctx.signals[number])


# ------------------------------------------------------------------------------------ rollout_idle


def test_rollout_idle_fires_with_idle_rollout_and_free_memory(tmp_path: Path) -> None:
    ctx = study(tmp_path, mf.spec(0))
    f = run_trial_rule(ctx, rule_rollout_idle, 0)
    assert f is not None and f.rule == "rollout_idle" and f.severity is Severity.WARNING and f.trial == 0
    assert "vllm_gpu_memory_utilization from 0.3 to about" in f.text
    assert "8.4 GiB of 22.5 GiB" in f.text  # the headroom that justifies it
    assert f.evidence["rollout_idle_fraction"] > 0.5
    assert f.evidence["suggested_utilization"] == pytest.approx(0.6)


def test_rollout_idle_suggestion_stays_below_a_utilization_that_failed(tmp_path: Path) -> None:
    ctx = study(tmp_path, mf.spec(0), mf.spec(5))  # trial 5: utilization 0.6 OOMed at the same batch
    f = run_trial_rule(ctx, rule_rollout_idle, 0)
    assert f is not None
    assert f.evidence["suggested_utilization"] == pytest.approx(0.55)
    assert "0.6 already failed at this batch size in trial 5" in f.text


def test_rollout_idle_quiet_when_memory_is_tight(tmp_path: Path) -> None:
    s = mf.spec(0)
    s.segs = [mf._with(seg, mem_bytes=22.6 * GB) for seg in s.segs]
    ctx = study(tmp_path, s)
    assert run_trial_rule(ctx, rule_rollout_idle, 0) is None


def test_rollout_idle_quiet_when_rollout_keeps_gpus_busy(tmp_path: Path) -> None:
    ctx = study(tmp_path, mf.spec(3))  # the winner: little idle time, mostly not in rollout
    assert run_trial_rule(ctx, rule_rollout_idle, 3) is None


# ------------------------------------------------------------------------------ offload_bottleneck


def test_offload_bottleneck_uses_the_estimate_when_no_trial_measured_it(tmp_path: Path) -> None:
    ctx = study(
        tmp_path,
        mf.spec(1),
        estimator=lambda data, trial, params: OffloadFit(True, int(19 * 2**30), mf.A10_BYTES),
    )
    f = run_trial_rule(ctx, rule_offload_bottleneck, 1)
    assert f is not None and f.rule == "offload_bottleneck"
    assert "GB/s per GPU over PCIe" in f.text and "idle 50 %" in f.text
    assert "turning offload off fits: predicted peak 19.0 GiB of 22.5 GiB" in f.text
    assert "Try: deepspeed=zero3" in f.text
    assert f.evidence["pcie_bytes_s_train"] > 2e9


def test_offload_bottleneck_says_when_no_estimate_is_available(tmp_path: Path) -> None:
    ctx = study(tmp_path, mf.spec(1), estimator=None)
    f = run_trial_rule(ctx, rule_offload_bottleneck, 1)
    assert f is not None and "the memory estimate is unavailable" in f.text
    assert f.text.endswith("Try: deepspeed=zero3, if it fits.")


def test_offload_bottleneck_when_the_estimate_says_it_does_not_fit(tmp_path: Path) -> None:
    ctx = study(
        tmp_path,
        mf.spec(1),
        estimator=lambda data, trial, params: OffloadFit(False, int(32 * 2**30), mf.A10_BYTES),
    )
    f = run_trial_rule(ctx, rule_offload_bottleneck, 1)
    assert f is not None and "turning offload off does not fit: predicted peak 32.0 GiB of 22.5 GiB" in f.text
    assert "Try: free memory first" in f.text


def test_offload_bottleneck_with_the_real_estimator_never_crashes(tmp_path: Path) -> None:
    from autotune.reports.diagnosis import estimate_without_offload

    ctx = study(tmp_path, mf.spec(1), estimator=estimate_without_offload)
    f = run_trial_rule(ctx, rule_offload_bottleneck, 1)
    assert f is not None
    assert (
        "The memory estimate says turning offload off" in f.text
        or "Whether it fits without offload is unknown" in f.text
    )


def test_offload_bottleneck_prefers_a_measured_trial_without_offload(tmp_path: Path) -> None:
    ctx = study(tmp_path, mf.spec(1), mf.spec(4))  # trial 4: same memory knobs, no offload, completed
    f = run_trial_rule(ctx, rule_offload_bottleneck, 1)
    assert f is not None and "Without offload it fits: trial 4" in f.text
    assert f.evidence["measured_without_offload"] == 4


def test_offload_bottleneck_quiet_without_offload(tmp_path: Path) -> None:
    s = mf.spec(1)
    s.knobs = mf.knobs(deepspeed="zero3", vllm_gpu_memory_utilization=0.5)
    ctx = study(tmp_path, s)
    assert run_trial_rule(ctx, rule_offload_bottleneck, 1) is None


def test_offload_bottleneck_quiet_when_pcie_is_quiet(tmp_path: Path) -> None:
    s = mf.spec(1)
    s.segs = [mf._with(seg, pcie_bytes_s=0.3e9) for seg in s.segs]
    ctx = study(tmp_path, s)
    assert run_trial_rule(ctx, rule_offload_bottleneck, 1) is None


# ------------------------------------------------------------------------------- host_cpu_stall


def test_host_cpu_stall_fires_when_gpus_wait_on_a_busy_host(tmp_path: Path) -> None:
    ctx = study(tmp_path, mf.spec(4))
    f = run_trial_rule(ctx, rule_host_cpu_stall, 4)
    assert f is not None and f.rule == "host_cpu_stall"
    assert "raise dataloader_num_workers from 0 to 2" in f.text
    assert f.evidence["host_busy_idle_share"] > 0.9
    assert f.evidence["host_cpu_idle_mean_pct"] == pytest.approx(97, abs=2)


def test_host_cpu_stall_quiet_when_the_host_is_not_busy(tmp_path: Path) -> None:
    s = mf.spec(4)
    s.segs = [mf._with(seg, host_cpu_pct=20.0) for seg in s.segs]
    ctx = study(tmp_path, s)
    assert run_trial_rule(ctx, rule_host_cpu_stall, 4) is None


def test_host_cpu_stall_ignores_start_up(tmp_path: Path) -> None:
    # Start-up (model loading) keeps the host busy with the GPUs idle: it is not a dataloader stall.
    s = mf.spec(3)
    s.segs = [mf._with(s.segs[0], host_cpu_pct=99.0, duration_s=90)] + s.segs[1:]
    ctx = study(tmp_path, s)
    assert run_trial_rule(ctx, rule_host_cpu_stall, 3) is None


# --------------------------------------------------------------------------- micro_batch_headroom


def test_micro_batch_headroom_fires_with_a_third_of_memory_free(tmp_path: Path) -> None:
    ctx = study(tmp_path, mf.spec(0))
    f = run_trial_rule(ctx, rule_micro_batch_headroom, 0)
    assert f is not None and f.severity is Severity.INFO
    assert "per_device_train_batch_size 4 (from 2)" in f.text
    assert "8.4 GiB (37 %)" in f.text


def test_micro_batch_headroom_quiet_with_little_memory_free(tmp_path: Path) -> None:
    ctx = study(tmp_path, mf.spec(3))
    assert run_trial_rule(ctx, rule_micro_batch_headroom, 3) is None


def test_micro_batch_headroom_quiet_when_the_larger_batch_already_failed(tmp_path: Path) -> None:
    bigger = mf.spec(2)
    bigger.knobs = mf.knobs(per_device_train_batch_size=4)  # baseline knobs with batch 4: OOM
    ctx = study(tmp_path, mf.spec(0), bigger)
    assert run_trial_rule(ctx, rule_micro_batch_headroom, 0) is None


def test_micro_batch_headroom_quiet_for_failed_trials(tmp_path: Path) -> None:
    ctx = study(tmp_path, mf.spec(15))  # interrupted during start-up, lots of free memory
    assert run_trial_rule(ctx, rule_micro_batch_headroom, 15) is None


# ---------------------------------------------------------------------------- zero3_gather_peak


def test_zero3_gather_peak_fires_on_an_oom_inside_the_weight_sync(tmp_path: Path) -> None:
    ctx = study(tmp_path, mf.spec(5))
    f = run_trial_rule(ctx, rule_zero3_gather_peak, 5)
    assert f is not None and f.rule == "zero3_gather_peak"
    assert "move_model_batches 8 (it was not set)" in f.text
    assert f.evidence["oom_in_sync"] is True
    assert f.evidence["excess_bytes"] > 3 * 2**30


def test_zero3_gather_peak_quiet_when_the_oom_is_in_training(tmp_path: Path) -> None:
    ctx = study(tmp_path, mf.spec(2))
    assert run_trial_rule(ctx, rule_zero3_gather_peak, 2) is None


def test_zero3_gather_peak_quiet_without_zero3(tmp_path: Path) -> None:
    s = mf.spec(5)
    s.knobs = mf.knobs(deepspeed="zero2", vllm_gpu_memory_utilization=0.6)
    ctx = study(tmp_path, s)
    assert run_trial_rule(ctx, rule_zero3_gather_peak, 5) is None


def test_zero3_gather_peak_doubles_an_existing_setting(tmp_path: Path) -> None:
    s = mf.spec(5)
    s.knobs = mf.knobs(vllm_gpu_memory_utilization=0.6, move_model_batches=4)
    ctx = study(tmp_path, s)
    f = run_trial_rule(ctx, rule_zero3_gather_peak, 5)
    assert f is not None and "move_model_batches 8 (from 4)" in f.text


# ----------------------------------------------------------------------------------- study rules


def test_oom_boundary_finds_utilization_at_batch_4(tmp_path: Path) -> None:
    ctx = study(
        tmp_path, mf.spec(2), mf.spec(3), mf.spec(6)
    )  # 0.7 OOMs at batch 4; 0.5 fits; 0.7 fits at batch 1
    f = rule_oom_boundary(ctx)
    assert f is not None and f.rule == "oom_boundary"
    assert "vllm_gpu_memory_utilization ≥ 0.7 fails for memory at per_device_train_batch_size 4" in f.text
    assert "0.5 fits: trial 3" in f.text
    # The same failure read along the other knob is just as true, and shown too.
    assert "per_device_train_batch_size ≥ 4 fails for memory at vllm_gpu_memory_utilization 0.7" in f.text
    assert ["per_device_train_batch_size", 4] in [b["given"] for b in f.evidence["boundaries"]]


def test_oom_boundary_on_the_fixture_prefers_the_pair_that_explains_every_failure(
    fixture_study: Path,
) -> None:
    f = rule_oom_boundary(make_context(load_study(fixture_study)))
    assert f is not None
    assert "vllm_gpu_memory_utilization ≥ 0.7 fails for memory at per_device_train_batch_size 4" in f.text
    assert "vllm_gpu_memory_utilization ≥ 0.6 fails for memory at per_device_train_batch_size 2" in f.text
    assert "per_device_train_batch_size ≥" not in f.text


def test_oom_boundary_quiet_without_memory_failures(tmp_path: Path) -> None:
    ctx = study(tmp_path, mf.spec(0), mf.spec(3))
    assert rule_oom_boundary(ctx) is None


def test_oom_boundary_says_when_nothing_separates_the_failures(tmp_path: Path) -> None:
    fits = mf.spec(3)
    fits.knobs = mf.knobs(
        vllm_gpu_memory_utilization=0.7, per_device_train_batch_size=4, gradient_checkpointing=False
    )
    ctx = study(tmp_path, mf.spec(2), fits)  # same utilization and batch: one OOMed, one fit
    f = rule_oom_boundary(ctx)
    assert f is not None and "no single knob separates them" in f.text and "trial 2 (OOM" in f.text


def test_hang_pattern_reports_where_and_how(tmp_path: Path) -> None:
    ctx = study(tmp_path, mf.spec(7), mf.spec(0), mf.spec(3))
    f = rule_hang_pattern(ctx)
    assert f is not None and f.severity is Severity.CRITICAL
    assert "trial 7 made 2 step(s), then nothing for" in f.text and "inside weight_sync" in f.text
    assert "NCCL" in f.text  # busy GPUs at low power
    assert "Only the hung trials have vllm_tensor_parallel_size=2" in f.text


def test_hang_pattern_quiet_without_hangs(tmp_path: Path) -> None:
    assert rule_hang_pattern(study(tmp_path, mf.spec(3))) is None


def test_unhealthy_trials_quote_the_health_gate(tmp_path: Path) -> None:
    ctx = study(tmp_path, mf.spec(8), mf.spec(0), mf.spec(3))
    f = rule_unhealthy_trials(ctx)
    assert f is not None and "every completion clipped at max_completion_length" in f.text
    assert "Only unhealthy trials have sleep_level=2" in f.text


def test_unhealthy_trials_quiet_when_all_learn(tmp_path: Path) -> None:
    assert rule_unhealthy_trials(study(tmp_path, mf.spec(3))) is None


def test_host_memory_quotes_available_memory(tmp_path: Path) -> None:
    ctx = study(tmp_path, mf.spec(11))
    f = rule_host_memory(ctx)
    assert f is not None and "host memory available fell to 0.37 GiB" in f.text and "sleep_level=1" in f.text
    assert rule_host_memory(study(tmp_path, mf.spec(3))) is None


def test_other_failures_mask_secrets_in_evidence(tmp_path: Path) -> None:
    ctx = study(tmp_path, mf.spec(14), mf.spec(13))
    f = rule_other_failures(ctx)
    assert f is not None and "trial 14 CRASH" in f.text and "trial 13 INVALID" in f.text
    assert mf.SECRET_TOKEN not in f.text
    assert rule_other_failures(study(tmp_path, mf.spec(3))) is None


# ------------------------------------------------------------------------------------- diagnose


EXPECTED_FIXTURE_FINDINGS = {
    ("hang_pattern", None),
    ("unhealthy_trials", None),
    ("rollout_idle", 0),
    ("host_memory", None),
    ("offload_bottleneck", 1),
    ("host_cpu_stall", 4),
    ("zero3_gather_peak", 5),
    ("micro_batch_headroom", 0),
    ("oom_boundary", None),
    ("other_failures", None),
}


def test_fixture_study_triggers_exactly_the_expected_findings(fixture_study: Path) -> None:
    ctx = make_context(load_study(fixture_study), winner=3)
    findings = diagnose(ctx)
    assert {(f.rule, f.trial) for f in findings} == EXPECTED_FIXTURE_FINDINGS
    # Critical first; among warnings the baseline (trial 0) before other trials.
    severities = [f.severity for f in findings]
    assert severities == sorted(severities, key=[Severity.CRITICAL, Severity.WARNING, Severity.INFO].index)
    warnings = [f for f in findings if f.severity is Severity.WARNING and f.trial is not None]
    assert warnings[0].trial == 0
    # Nothing fires about the winner: it is the configuration to run.
    assert not [f for f in findings if f.trial == 3]


def test_every_finding_quotes_numbers(fixture_study: Path) -> None:
    for f in diagnose(make_context(load_study(fixture_study), winner=3)):
        assert any(ch.isdigit() for ch in f.text), f.rule
        assert f.evidence, f.rule


def test_trials_without_timelines_are_diagnosed_without_error(tmp_path: Path) -> None:
    ctx = study(tmp_path, mf.spec(9), mf.spec(13))  # pruned before launch; rejected at start-up
    findings = diagnose(ctx)
    assert {f.rule for f in findings} == {"other_failures"}
    assert ctx.data.trial(9).status is TrialStatus.PRUNED


def test_host_memory_never_says_the_host_ran_out_when_its_figures_show_plenty(tmp_path: Path) -> None:
    """A SIGKILL nobody in autotune sent, while the host kept 60 GB of its 192 GiB available throughout."""
    import dataclasses

    plenty = [
        dataclasses.replace(seg, host_available_bytes=60e9) if seg.host_available_bytes < 60e9 else seg
        for seg in mf.spec(11).segs
    ]
    f = rule_host_memory(study(tmp_path, dataclasses.replace(mf.spec(11), segs=plenty)))
    assert f is not None and f.title == "Killed by SIGKILL with host memory to spare"
    assert "Killed by the kernel for host memory" not in f.text
    assert "never fell below 55.9 GiB of 192.0 GiB" in f.text and "cgroup" in f.text
    assert f.evidence["memory_to_spare"] == [11]
