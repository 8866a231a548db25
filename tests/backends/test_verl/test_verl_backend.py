"""The verl backend: its space, decoder, start-up rules, rendering, log reading and failure text.

verl cannot run on a CPU, so the conformance suite replays verl's output rebuilt from its own code and
from real logs (``tests/backends/data/make_verl_logs.py``, sources in each recording's ``meta`` line) and
hydra's real refusals of verl's config (``capture_verl_hydra.py``). That every override the backend
writes is accepted by verl's own config is checked with hydra in ``test_verl_compose.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from autotune.backends import backend_class, get_backend
from autotune.backends._base import ModelRef, TrialContext
from autotune.backends.verl._log import VerlLogParser, parse_console_line
from autotune.backends.verl.backend import CONTROLLED, VerlBackend, override_value, parse_overrides
from autotune.backends.verl.config import (
    DYNAMIC_BSZ,
    LOG_PROB_MICRO,
    MAX_TOKENS,
    PPO_MICRO,
    REF_LOG_PROB_MICRO,
    ROLLOUT_TP,
)
from autotune.errors import BackendError, UsageError
from autotune.records import GpuInfo, TrialSpec, TrialStatus
from autotune.space import load_space
from tests.backends.conformance import BackendConformance, Event, Recording

GIB = 1 << 30
DATA = Path(__file__).parents[1] / "data"
AR = "actor_rollout_ref"
PREFIX = "\x1b[36m(TaskRunner pid=480334)\x1b[0m "


def make_ctx(tmp_path: Path, *, gpus: int = 8, **kw: Any) -> TrialContext:
    study = tmp_path / "study"
    trial_dir = study / "trials" / "2"
    trial_dir.mkdir(parents=True, exist_ok=True)
    fields: dict[str, Any] = {
        "study_dir": study,
        "trial_dir": trial_dir,
        "model": ModelRef("Qwen2.5-7B", "Qwen/Qwen2.5-7B", facts={"heads": 28}),
        "gpus": tuple(GpuInfo(index=i, name="H100", memory_total_bytes=80 * GIB) for i in range(gpus)),
        "global_batch": 64,
        "num_generations": 8,
        "max_steps": 6,
        "max_completion_length": 1024,
        "seed": 3,
    }
    fields.update(kw)
    return TrialContext(**fields)


def baseline(backend: VerlBackend) -> dict[str, Any]:
    space = load_space(backend.default_space(), backend="verl", known_knobs=backend.knob_names)
    return space.active(backend.baseline(space.defaults(), make_ctx_dummy()))


def make_ctx_dummy() -> TrialContext:
    return TrialContext(
        study_dir=Path("/nonexistent"), trial_dir=Path("/nonexistent"), model=ModelRef("m", "m")
    )


def overrides(backend: VerlBackend, ctx: TrialContext, params: Mapping[str, Any]) -> dict[str, Any]:
    spec = TrialSpec(number=2, params=dict(params), derived=backend.derive(dict(params), ctx))
    return dict(backend.overrides(spec, ctx))


# ------------------------------------------------------------------------------------------ space


def test_registered_and_space_has_exactly_the_backend_knobs() -> None:
    backend = get_backend("verl")
    assert isinstance(backend, VerlBackend) and backend_class("verl").needs_gpu
    space = load_space(backend.default_space(), backend="verl", known_knobs=backend.knob_names)
    assert set(space.names) == set(VerlBackend.knob_names or ())
    assert space[MAX_TOKENS].when == {DYNAMIC_BSZ: (True,)}
    assert space[PPO_MICRO].when == {DYNAMIC_BSZ: (False,)}
    assert f"{AR}.ref.fsdp_config.param_offload" not in space  # a no-op in 0.9.1 (see the space file)


def test_baseline_fills_verls_null_micro_batches() -> None:
    params = baseline(VerlBackend())
    assert params[PPO_MICRO] == 1 and params[LOG_PROB_MICRO] == 1
    assert DYNAMIC_BSZ in params and MAX_TOKENS not in params  # inactive without dynamic batch size


# ------------------------------------------------------------------------------------------ describe


def test_describe_defaults_is_fsdp_full_shard_with_colocated_vllm() -> None:
    job = {"global_batch": 64, "num_generations": 8, "max_completion_length": 1024}
    k = VerlBackend.describe(baseline(VerlBackend()), {"world_size": 8}, job, 8)
    assert (k.fsdp, k.deepspeed, k.states_sharding, k.sharding_stage) == (True, False, 3, None)
    assert k.use_vllm and k.colocate and k.vllm_tp == 2 and k.vllm_util == pytest.approx(0.5)
    assert k.sleep_level == 2  # free_cache_engine true, full weights: level 2
    assert (k.per_device_batch, k.grad_accum, k.micro_batch_tokens) == (1, 8, None)
    assert k.beta == 0.0 and k.reference_offload  # verl's use_kl_loss defaults to false
    assert k.vllm_max_num_batched_tokens == 8192 and k.vllm_max_num_seqs == 256
    assert k.weight_sync == "parameter" and k.loads_before_vllm


def test_describe_reads_offload_dynamic_bsz_kl_and_lora() -> None:
    params = {
        DYNAMIC_BSZ: True,
        MAX_TOKENS: 8192,
        f"{AR}.actor.fsdp_config.param_offload": True,
        f"{AR}.actor.fsdp_config.optimizer_offload": True,
        f"{AR}.rollout.free_cache_engine": True,
    }
    fixed = {
        "global_batch": 64,
        "num_generations": 8,
        "max_completion_length": 1024,
        "actor_rollout_ref": {"actor": {"use_kl_loss": "true", "kl_loss_coef": "0.001"}},
        f"{AR}.model.lora_rank": "32",
    }
    k = VerlBackend.describe(params, {"world_size": 8}, fixed, 8)
    assert k.micro_batch_tokens == 8192
    assert k.per_device_batch == 4  # 8192 tokens hold 5 sequences of 1536; the largest divisor of 8 below
    assert k.rollout_offload_model and k.rollout_offload_optimizer
    assert k.beta == pytest.approx(0.001) and k.lora_rank == 32
    assert k.sleep_level == 1  # LoRA adapters: verl's _resolve_sleep_level gives level 1
    assert k.setting("rollout_offload_model") == f"{AR}.actor.fsdp_config.param_offload=true"


def test_describe_refuses_a_value_that_is_no_number() -> None:
    with pytest.raises(UsageError, match="not a whole number"):
        VerlBackend.describe({PPO_MICRO: "two"}, {}, {"global_batch": 16}, 8)


# ------------------------------------------------------------------------------------------ rules


def rules(tmp_path: Path, params: Mapping[str, Any], **kw: Any) -> set[str]:
    backend = VerlBackend()
    ctx = make_ctx(tmp_path, **kw)
    full = {**baseline(backend), **params}
    return {v.rule for v in backend.rules(full, backend.derive(full, ctx), ctx)}


def test_baseline_breaks_no_rule(tmp_path: Path) -> None:
    assert rules(tmp_path, {}) == set()


@pytest.mark.parametrize(
    ("params", "kw", "rule"),
    [
        ({}, {"global_batch": 12, "num_generations": 4}, "batch_divisible_by_gpus"),
        ({PPO_MICRO: 16}, {}, "micro_batch_divides_per_gpu_batch"),  # 64 / 8 GPUs = 8 per GPU
        ({LOG_PROB_MICRO: 16}, {}, "micro_batch_divides_per_gpu_batch"),
        ({PPO_MICRO: None}, {}, "micro_batch_required"),
        ({DYNAMIC_BSZ: True, MAX_TOKENS: 1024}, {}, "token_budget_holds_a_sequence"),
        ({ROLLOUT_TP: 8}, {"gpus": 4}, "rollout_tp_divides_gpus"),
        ({ROLLOUT_TP: 8}, {}, "vllm_tp_divides_heads"),  # Qwen2.5-7B has 28 heads
        ({}, {"gpus": 0}, "verl_needs_gpu"),
    ],
)
def test_each_start_up_rule(tmp_path: Path, params: dict[str, Any], kw: dict[str, Any], rule: str) -> None:
    assert rule in rules(tmp_path, params, **kw)


def test_dynamic_bsz_lifts_the_micro_batch_rules(tmp_path: Path) -> None:
    assert (
        rules(tmp_path, {DYNAMIC_BSZ: True, MAX_TOKENS: 16384, PPO_MICRO: None, LOG_PROB_MICRO: 16}) == set()
    )


# ------------------------------------------------------------------------------------------ rendering


def test_render_holds_the_batch_and_makes_a_short_quiet_trial(tmp_path: Path) -> None:
    backend = VerlBackend(python="/usr/bin/python3")
    ctx = make_ctx(tmp_path)
    params = {**baseline(backend), LOG_PROB_MICRO: 4}
    spec = TrialSpec(number=2, params=params, derived=backend.derive(params, ctx))
    plan = backend.render(spec, ctx)
    assert plan.argv[:4] == (
        "/usr/bin/python3",
        "-m",
        "verl.trainer.main_ppo",
        "algorithm.adv_estimator=grpo",
    )
    items = dict(a.split("=", 1) for a in plan.argv[3:])
    assert items["data.train_batch_size"] == "8" and items[f"{AR}.rollout.n"] == "8"  # 8 prompts × 8 = 64
    assert items[f"{AR}.actor.ppo_mini_batch_size"] == "8"
    assert items["trainer.total_training_steps"] == "6" and items["trainer.save_freq"] == "-1"
    assert items["trainer.test_freq"] == "-1" and items["trainer.val_before_train"] == "false"
    assert items["trainer.logger"] == "[console]" and items["trainer.n_gpus_per_node"] == "8"
    assert items[REF_LOG_PROB_MICRO] == "4" == items[LOG_PROB_MICRO]
    assert items[f"{AR}.model.path"] == "Qwen/Qwen2.5-7B" and items[f"{AR}.rollout.name"] == "vllm"
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7" and plan.env["RAY_DEDUP_LOGS"] == "0"
    rows = [json.loads(x) for x in Path(items["data.train_files"]).read_text().splitlines()]
    assert len(rows) >= 6 * 8 and rows[0]["prompt"][0]["role"] == "user"
    assert rows[0]["reward_model"]["ground_truth"] and rows[0]["data_source"] == "autotune"
    reward = Path(items["reward.custom_reward_function.path"]).read_text()
    assert "def compute_score(" in reward


def test_knobs_win_over_fixed_and_autotune_controls_win_over_both(tmp_path: Path) -> None:
    backend = VerlBackend()
    fixed = {
        f"{AR}.rollout.gpu_memory_utilization": 0.3,
        f"{AR}.actor.optim.lr": "1e-6",
        "trainer.save_freq": 10,
        "data.train_files": "/data/gsm8k/train.parquet",
        "reward.custom_reward_function.path": "/rewards/mine.py",
    }
    ctx = make_ctx(tmp_path, fixed=fixed)
    items = overrides(backend, ctx, {**baseline(backend), f"{AR}.rollout.gpu_memory_utilization": 0.65})
    assert items[f"{AR}.rollout.gpu_memory_utilization"] == 0.65
    assert items[f"{AR}.actor.optim.lr"] == "1e-6" and items["trainer.save_freq"] == -1
    assert items["data.train_files"] == "/data/gsm8k/train.parquet" and "data.val_files" not in items
    assert items["reward.custom_reward_function.path"] == "/rewards/mine.py"
    assert not (ctx.trial_dir / "prompts.jsonl").exists()


def test_check_flags_refuses_what_would_change_the_batch_and_notes_replaced_overrides(tmp_path: Path) -> None:
    backend = VerlBackend()
    ctx = make_ctx(tmp_path)
    with pytest.raises(BackendError, match="rollout.n=4 .* differs from the study's 8"):
        backend.check_flags({}, {f"{AR}.rollout.n": "4"}, ctx)
    with pytest.raises(BackendError, match="--model"):
        backend.check_flags({}, {f"{AR}.model.path": "/m"}, ctx)
    with pytest.raises(BackendError, match="GRPO"):
        backend.check_flags({}, {"algorithm.adv_estimator": "gae"}, ctx)
    notes = backend.check_flags(
        {PPO_MICRO: 2}, {"trainer.logger": "[console,wandb]", PPO_MICRO: "4", "data.train_batch_size": 8}, ctx
    )
    assert any("trainer.logger" in n and "replaced" in n for n in notes)
    assert any(PPO_MICRO in n and "tuned knob" in n for n in notes)
    assert set(CONTROLLED) >= {"trainer.total_training_steps", "trainer.save_freq", "trainer.test_freq"}


def test_hydra_overrides_after_the_double_dash() -> None:
    got = parse_overrides(["data.train_files=/d/train.parquet", "trainer.logger=[console]"])
    assert got == {"data.train_files": "/d/train.parquet", "trainer.logger": "[console]"}
    for bad in (["--beta", "0.1"], ["data.train_files"], ["a..b=1"]):
        with pytest.raises(UsageError, match="hydra override"):
            parse_overrides(bad)
    with pytest.raises(UsageError, match="adds or deletes"):
        parse_overrides(["+trainer.extra=1"])
    with pytest.raises(UsageError, match="twice"):
        parse_overrides(["a=1", "a=2"])
    assert [override_value(v) for v in (True, None, 0.65, ["console"], "x")] == [
        "true",
        "null",
        "0.65",
        "[console]",
        "x",
    ]


# ------------------------------------------------------------------------------------------ log


def test_console_line_formats() -> None:
    # verl 0.9.1 pformat under numpy 2, Ray's coloured prefix
    line = PREFIX + "step:3 - actor/grad_norm:np.float64(0.31) - timing_s/gen:4.12 - actor/pg_loss:-0.002"
    assert parse_console_line(line) == (
        3,
        {"actor/grad_norm": 0.31, "timing_s/gen": 4.12, "actor/pg_loss": -0.002},
    )
    # older releases' %.3f; a tqdm bar glued before it (no newline)
    glued = "Training Progress:  33%|###3      | 1/3 [00:23<00:46, 23.10s/it]step:2 - critic/score/mean:0.565"
    assert parse_console_line(glued) == (2, {"critic/score/mean": 0.565})
    for other in ("(TaskRunner pid=1) timing/step:1.25", "val/global_step:12 - x:1", "saved global_step_9"):
        assert parse_console_line(other) is None


def test_parser_adds_the_common_names_and_skips_the_validation_step() -> None:
    parser = VerlLogParser()
    assert parser.feed("stdout", PREFIX + "step:0 - val-core/openai/gsm8k/acc/mean@1:0.508", 1.0, 1.0) == []
    line = (
        "step:1 - actor/grad_norm:np.float64(0.2) - actor/kl_loss:np.float64(0.0) - actor/pg_loss:-0.1 - "
        "critic/score/mean:np.float64(0.4) - response_length/mean:np.float64(288.7) - "
        "response_length/clip_ratio:np.float64(0.05) - perf/max_memory_allocated_gb:np.float64(48.2) - "
        "perf/max_memory_reserved_gb:np.float64(61.5) - timing_s/step:21.7 - timing_s/gen:9.9"
    )
    (step,) = parser.feed("stdout", PREFIX + line, 2.0, 2.0)
    v = step.values
    assert (v["grad_norm"], v["kl"], v["loss"], v["reward"]) == (0.2, 0.0, -0.1, 0.4)
    assert v["completions/mean_length"] == 288.7 and v["completions/clipped_ratio"] == 0.05
    assert v["memory_gib"] == 61.5 and v["step_time"] == 21.7 and v["timing_s/gen"] == 9.9
    assert step.duration_s == 21.7
    assert parser.feed("stdout", PREFIX + line, 3.0, 3.0) == []  # each step once


# ------------------------------------------------------------------------------------------ conformance

_VERL_KEYS = {
    "loss": "actor/pg_loss",
    "grad_norm": "actor/grad_norm",
    "kl": "actor/kl_loss",
    "reward": "critic/score/mean",
    "completions/mean_length": "response_length/mean",
    "completions/clipped_ratio": "response_length/clip_ratio",
    "step_time": "timing_s/step",
}


class TestVerlConformance(BackendConformance):
    beta = 0.001

    def make_backend(self) -> VerlBackend:
        return VerlBackend()

    def make_context(self, tmp_path: Path) -> TrialContext:
        return make_ctx(tmp_path, gpus=2, global_batch=16, num_generations=4, max_completion_length=16)

    def step_events(
        self, step: int, max_steps: int, values: Mapping[str, float], *, elapsed_s: float
    ) -> list[Event]:
        parts = [f"step:{step}"]
        for key, value in values.items():
            name = _VERL_KEYS.get(key)
            if name is not None:
                parts.append(f"{name}:np.float64({value!r})")
        parts += ["timing_s/gen:0.2", "timing_s/update_actor:0.2"]
        return [{"stream": "stdout", "text": PREFIX + " - ".join(parts)}]

    def startup_events(self) -> list[Event]:
        return [
            {
                "stream": "stdout",
                "text": PREFIX + "[validate_config] All configuration checks passed successfully!",
            }
        ]

    def invalid_events(self) -> list[Event]:
        lines = (DATA / "verl_0.9.1_hydra_batch_not_divisible.stderr").read_text().splitlines()
        return [{"stream": "stderr", "text": x} for x in lines] + [{"exit": 1}]

    def recordings(self) -> list[Recording]:
        return [
            Recording(
                "grpo-3-steps", DATA / "verl_0.9.1_grpo_3steps.events.jsonl", TrialStatus.COMPLETE, (1, 2, 3)
            ),
            Recording(
                "oom-update-actor",
                DATA / "verl_0.9.1_oom_update_actor.events.jsonl",
                TrialStatus.OOM,
                (1,),
                failed_phase="train",
            ),
            Recording("actor-died", DATA / "verl_0.9.1_actor_died.events.jsonl", TrialStatus.CRASH, ()),
            Recording(
                "ray-memory-monitor",
                DATA / "verl_0.9.1_ray_memory_monitor.events.jsonl",
                TrialStatus.HOST_OOM,
                (),
            ),
            Recording(
                "vllm-init",
                DATA / "verl_0.9.1_vllm_init.events.jsonl",
                TrialStatus.VLLM_INIT,
                (),
                failed_phase="startup",
            ),
        ]


def test_hydra_refusal_of_an_unknown_key_is_invalid(tmp_path: Path) -> None:
    suite = TestVerlConformance()
    lines = (DATA / "verl_0.9.1_hydra_unknown_key.stderr").read_text().splitlines()
    events = [{"stream": "stderr", "text": x} for x in lines] + [{"exit": 1}]
    from autotune.trial.runner import WatchdogConfig

    _, verdict, _ = suite.run_events(
        events,
        tmp_path,
        watchdog=WatchdogConfig(startup_timeout_s=30, hang_k=2, hang_floor_s=1.0, grace_s=1.0),
    )
    assert verdict.status is TrialStatus.INVALID
    assert "gpu_memory_utilisation" in verdict.reason


def test_recorded_steps_split_into_phases_by_verls_own_timers() -> None:
    """verl 0.9.1's sync trainer times gen → reward → old_log_prob → ref → adv → update_actor inside
    ``step`` (verl/trainer/ppo/v1/trainer_base.py::_step_once) and update_weights at the step's end
    (trainer_sync.py::on_step_end): the timeline lays them out from the step records alone."""
    from probes.timeline import phase_intervals

    parser = VerlLogParser()
    events = [json.loads(x) for x in (DATA / "verl_0.9.1_grpo_3steps.events.jsonl").read_text().splitlines()]
    steps = []
    for i, ev in enumerate(e for e in events if "stream" in e):
        steps += parser.feed(ev["stream"], ev["text"], 100.0 + 30.0 * i, 0.0)
    assert [s.step for s in steps] == [1, 2, 3]
    intervals = phase_intervals(steps, [], None)
    assert {iv["source"] for iv in intervals} == {"framework"}
    by_phase: dict[str, float] = {}
    for iv in intervals:
        if iv["step"] == 3:
            by_phase[iv["phase"]] = by_phase.get(iv["phase"], 0.0) + iv["t1_mono_s"] - iv["t0_mono_s"]
    v = steps[-1].values
    assert by_phase["rollout"] == pytest.approx(v["timing_s/gen"])
    assert by_phase["train"] == pytest.approx(
        v["timing_s/old_log_prob"] + v["timing_s/ref"] + v["timing_s/update_actor"]
    )
    assert by_phase["weight_sync"] == pytest.approx(v["timing_s/update_weights"])


def test_verl_091s_actor_prefixed_memory_keys_give_the_memory() -> None:
    """verl 0.9.1's v1 trainer renames the actor's metrics with ``actor/`` (trainer_base.py rename_dict)."""
    parser = VerlLogParser()
    line = (
        "step:1 - actor/pg_loss:-0.1 - actor/perf/max_memory_allocated_gb:np.float64(48.2) - "
        "actor/perf/max_memory_reserved_gb:np.float64(61.5) - timing_s/step:21.7"
    )
    (step,) = parser.feed("stdout", PREFIX + line, 2.0, 2.0)
    assert step.values["memory_gib"] == 61.5


def test_the_probe_refuses_verl_without_its_core_extra(tmp_path: Path) -> None:
    """verl 0.9.1's trainer imports transfer_queue (the verl-core extra): refused once, before the study."""
    fake = tmp_path / "python"
    versions = {"verl": "0.9.1", "vllm": "0.24.0", "sglang": None, "ray": "2.60.0", "torch": "2.13.0"}

    def write(extra: dict[str, str | None]) -> None:
        payload = json.dumps({**versions, **extra})
        fake.write_text(f"#!/bin/sh\necho 'AUTOTUNE_VERSIONS {payload}'\n")
        fake.chmod(0o755)

    write({"TransferQueue": None, "tensordict": "0.10.0"})
    with pytest.raises(BackendError, match=r"TransferQueue missing .*verl-core"):
        VerlBackend(python=str(fake)).probe()
    write({"TransferQueue": "0.1.10", "tensordict": "0.10.0"})
    assert VerlBackend(python=str(fake)).probe().version == "0.9.1"
