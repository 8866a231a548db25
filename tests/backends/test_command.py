from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from autotune.backends import get_backend
from autotune.backends._base import ModelRef, TrialContext
from autotune.backends.command import CommandBackend, CommandParser, knob_env_name, template_fields
from autotune.errors import BackendError, SpaceError, UsageError
from autotune.records import TrialSpec, TrialStatus
from autotune.space import load_space
from autotune.trial.outcome import classify
from autotune.trial.runner import EarlyStopConfig, WatchdogConfig, run_trial

FAULT = Path(__file__).parents[1] / "fixtures" / "faults" / "fault.py"

SPACE = """
backend: command
knobs:
  zero_stage: {type: int, choices: [0, 2, 3], default: 0}
  offload: {type: bool, default: false, when: {zero_stage: [3]}}
  per_device_train_batch_size: {type: int, choices: [2, 4, 8], default: 4}
  num_processes: {type: int, choices: [1, 2], default: 1}
  lr: {type: float, low: 0.0001, high: 0.01, default: 0.001}
"""


@pytest.fixture
def space_file(tmp_path: Path) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(SPACE)
    return path


def ctx_for(tmp_path: Path, **kw: object) -> TrialContext:
    trial_dir = tmp_path / "trials" / "3"
    trial_dir.mkdir(parents=True, exist_ok=True)
    defaults: dict[str, object] = {"global_batch": 16, "max_steps": 7, "seed": 11, "master_port": 29611}
    defaults.update(kw)
    return TrialContext(
        study_dir=tmp_path, trial_dir=trial_dir, model=ModelRef("my-model", "/models/m"), **defaults
    )  # type: ignore[arg-type]


def test_template_fields() -> None:
    assert template_fields(
        ["python", "t.py", "--zero", "{zero_stage}", "--bs={per_device_train_batch_size}", "{zero_stage}"]
    ) == [
        "zero_stage",
        "per_device_train_batch_size",
    ]
    assert template_fields(["echo", "{{literal}}", "{lr:.2e}"]) == ["lr"]


@pytest.mark.parametrize("item", ["{unclosed", "closed}", "{a.b}", "{a[0]}"])
def test_malformed_templates(item: str) -> None:
    with pytest.raises(UsageError) as info:
        CommandBackend(["python", item])
    assert "\n" not in str(info.value)


def test_empty_template() -> None:
    with pytest.raises(UsageError):
        CommandBackend([])


def test_placeholder_not_in_space_is_a_space_error(space_file: Path) -> None:
    backend = CommandBackend(["python", "train.py", "--zero", "{zero_stage}", "--mbs", "{micro_batch}"])
    space = load_space(space_file, backend="command", known_knobs=backend.knob_names)
    with pytest.raises(SpaceError) as info:
        backend.check_template(space)
    message = str(info.value)
    assert "{micro_batch}" in message and "\n" not in message
    assert info.value.exit_code == 2


def test_builtin_placeholders_are_allowed(space_file: Path) -> None:
    backend = CommandBackend(
        ["python", "t.py", "--out", "{trial_dir}", "--gbs", "{global_batch}", "--ws", "{world_size}"]
    )
    backend.check_template(load_space(space_file, backend="command"))


def test_registered_backend_and_free_knob_names() -> None:
    backend = get_backend("command", template=["python", "t.py"])
    assert isinstance(backend, CommandBackend)
    assert backend.knob_names is None


def test_render_substitutes_argv_and_env(tmp_path: Path, space_file: Path) -> None:
    backend = CommandBackend(
        [
            "python",
            "train.py",
            "--zero",
            "{zero_stage}",
            "--bs={per_device_train_batch_size}",
            "--lr",
            "{lr:.1e}",
            "--offload",
            "{offload}",
            "--out",
            "{trial_dir}",
            "--ga",
            "{gradient_accumulation_steps}",
        ],
        cwd="/work/job",
    )
    backend.check_template(load_space(space_file, backend="command"))
    ctx = ctx_for(tmp_path)
    params = {
        "zero_stage": 3,
        "offload": True,
        "per_device_train_batch_size": 4,
        "num_processes": 2,
        "lr": 0.0005,
    }
    derived = backend.derive(params, ctx)
    assert derived == {"world_size": 2, "gradient_accumulation_steps": 2}
    plan = backend.render(TrialSpec(number=3, params=params, derived=derived), ctx)
    assert plan.argv == (
        "python",
        "train.py",
        "--zero",
        "3",
        "--bs=4",
        "--lr",
        "5.0e-04",
        "--offload",
        "true",
        "--out",
        str(ctx.trial_dir),
        "--ga",
        "2",
    )
    assert plan.cwd == "/work/job"
    assert plan.world_size == 2
    metrics = str(ctx.trial_dir / "script_metrics.jsonl")
    assert plan.metrics_paths == (metrics,)
    assert plan.env["AUTOTUNE_KNOB_ZERO_STAGE"] == "3"
    assert plan.env["AUTOTUNE_KNOB_OFFLOAD"] == "true"
    assert plan.env["AUTOTUNE_KNOB_LR"] == "0.0005"
    assert plan.env["AUTOTUNE_TRIAL_DIR"] == str(ctx.trial_dir)
    assert plan.env["AUTOTUNE_GLOBAL_BATCH"] == "16"
    assert plan.env["AUTOTUNE_WORLD_SIZE"] == "2"
    assert plan.env["AUTOTUNE_METRICS_FILE"] == metrics
    assert plan.env["AUTOTUNE_PHASES_FILE"] == str(ctx.trial_dir / "phases.jsonl")
    assert "CUDA_VISIBLE_DEVICES" not in plan.env


def test_inactive_knob_renders_its_default(tmp_path: Path, space_file: Path) -> None:
    backend = CommandBackend(["python", "t.py", "--offload", "{offload}"])
    backend.check_template(load_space(space_file, backend="command"))
    ctx = ctx_for(tmp_path)
    params = {"zero_stage": 0, "per_device_train_batch_size": 4, "num_processes": 1, "lr": 0.001}
    plan = backend.render(TrialSpec(number=0, params=params, derived=backend.derive(params, ctx)), ctx)
    assert plan.argv[-1] == "false"
    assert "AUTOTUNE_KNOB_OFFLOAD" not in plan.env


def test_render_without_check_refuses_unknown_names(tmp_path: Path) -> None:
    backend = CommandBackend(["python", "t.py", "{nope}"])
    with pytest.raises(SpaceError):
        backend.render(TrialSpec(number=0, params={}), ctx_for(tmp_path))


def test_shell_metacharacters_stay_one_argv_item(tmp_path: Path) -> None:
    backend = CommandBackend(["python", "t.py", "--name", "{run_name}"])
    ctx = ctx_for(tmp_path)
    plan = backend.render(TrialSpec(number=0, params={"run_name": "a b; rm -rf $HOME"}), ctx)
    assert plan.argv[-1] == "a b; rm -rf $HOME"
    assert "'a b; rm -rf $HOME'" in plan.to_shell()


def test_derive_and_rules(tmp_path: Path) -> None:
    backend = CommandBackend(["python", "t.py"])
    ctx = ctx_for(tmp_path, global_batch=16)
    assert backend.derive({"zero_stage": 2}, ctx) == {"world_size": 1}
    assert backend.derive({"world_size": 4}, ctx) == {"world_size": 4}
    assert backend.check_rules({"zero_stage": 2}, {"world_size": 1}, ctx) == []
    bad = {"per_device_train_batch_size": 3, "num_processes": 2}
    derived = backend.derive(bad, ctx)
    assert "gradient_accumulation_steps" not in derived
    violations = backend.check_rules(bad, derived, ctx)
    assert [v.rule for v in violations] == ["global_batch_divisible"]
    assert "16" in violations[0].message and "3" in violations[0].message


def test_gpus_set_cuda_visible_devices(tmp_path: Path) -> None:
    from autotune.records import GpuInfo

    gpus = (
        GpuInfo(index=2, name="A100", memory_total_bytes=1),
        GpuInfo(index=5, name="A100", memory_total_bytes=1),
    )
    plan = CommandBackend(["python", "t.py"]).render(
        TrialSpec(number=0, params={}), ctx_for(tmp_path, gpus=gpus)
    )
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "2,5"


def test_probe_and_default_space(tmp_path: Path) -> None:
    assert CommandBackend([sys.executable, "t.py"]).probe().executable == sys.executable
    with pytest.raises(BackendError):
        CommandBackend(["no-such-program-xyz", "t.py"]).probe()
    with pytest.raises(UsageError):
        CommandBackend(["python"]).default_space()


def test_knob_env_name() -> None:
    assert knob_env_name("per_device_train_batch_size") == "AUTOTUNE_KNOB_PER_DEVICE_TRAIN_BATCH_SIZE"
    assert knob_env_name("vllm.gpu-util") == "AUTOTUNE_KNOB_VLLM_GPU_UTIL"


# --------------------------------------------------------------------------------------------------
# Parser


def test_parser_reads_json_step_lines_from_stdout_only() -> None:
    p = CommandParser(None)
    assert p.feed("stdout", "not json", 1.0, 2.0) == []
    assert p.feed("stdout", '{"no_step": 1}', 1.0, 2.0) == []
    assert p.feed("stdout", '{"step": true}', 1.0, 2.0) == []
    assert p.feed("stdout", '{"step": "3"}', 1.0, 2.0) == []
    assert p.feed("stdout", "[1, 2]", 1.0, 2.0) == []
    assert p.feed("stderr", '{"step": 1, "loss": 0.5}', 1.0, 2.0) == []
    (rec,) = p.feed(
        "stdout",
        '{"step": 1, "samples": 64, "tokens": 1024, "loss": "6e-08", "grad_norm": 1.5, "note": "x", '
        '"values": {"kl": 0.001}, "global_step/max_steps": "1/5"}',
        10.0,
        20.0,
    )
    assert rec.step == 1 and rec.samples == 64 and rec.tokens == 1024
    assert rec.t_mono_s == 10.0 and rec.t_wall_s == 20.0
    assert rec.values == {"loss": 6e-08, "grad_norm": 1.5, "kl": 0.001}
    assert p.feed("stdout", '{"step": 1, "loss": 9}', 11.0, 21.0) == []  # repeated step: first record wins


def test_parser_uses_the_scripts_own_times() -> None:
    (rec,) = CommandParser(None).feed("stdout", '{"step": 2, "t_mono_s": 5.5, "duration_s": 0.25}', 9.0, 9.0)
    assert rec.t_mono_s == 5.5 and rec.duration_s == 0.25


def test_parser_tails_the_metrics_file_keeping_partial_lines(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    p = CommandParser(path)
    assert p.poll(0, 0) == []  # not there yet
    path.write_text('{"step": 1, "loss": 1}\n{"step": 2, "lo')
    assert [s.step for s in p.poll(1, 1)] == [1]
    with path.open("a") as fh:
        fh.write('ss": 2}\n{"step": 3}')
    assert [(s.step, s.values) for s in p.poll(2, 2)] == [(2, {"loss": 2.0})]
    assert [s.step for s in p.finish(3, 3)] == [3]  # the last line without its newline
    assert p.feed("stdout", '{"step": 2}', 4, 4) == []  # already read from the file


# --------------------------------------------------------------------------------------------------
# End to end: render → run a real script → parse → classify


def run_command(tmp_path: Path, template: list[str], params: dict[str, object]) -> tuple[object, object]:
    backend = CommandBackend(template, cwd=str(tmp_path))
    ctx = ctx_for(tmp_path)
    spec = TrialSpec(number=3, params=params, derived=backend.derive(params, ctx))
    plan = backend.render(spec, ctx)
    watchdog = WatchdogConfig(
        startup_timeout_s=20, hang_floor_s=0.6, hang_k=3, grace_s=0.5, poll_interval_s=0.05
    )
    rec = run_trial(
        plan,
        backend.parser(spec, ctx),
        ctx.trial_dir,
        global_batch=ctx.global_batch,
        watchdog=watchdog,
        early_stop=EarlyStopConfig(enabled=False),
    )
    return rec, classify(rec, patterns=backend.failure_patterns())


def test_end_to_end_stdout_and_environment(tmp_path: Path) -> None:
    template = [
        sys.executable,
        str(FAULT),
        "--mode",
        "ok",
        "--steps",
        "{steps}",
        "--echo",
        "--bs",
        "{per_device_train_batch_size}",
    ]
    rec, verdict = run_command(tmp_path, template, {"steps": 4, "per_device_train_batch_size": 8})
    assert verdict.status is TrialStatus.COMPLETE  # type: ignore[attr-defined]
    assert [s.step for s in rec.steps] == [1, 2, 3, 4]  # type: ignore[attr-defined]
    assert all(s.samples == 16 for s in rec.steps)  # type: ignore[attr-defined]
    echo = json.loads(next(x for x in rec.stdout_tail if x.startswith('{"argv"')))  # type: ignore[attr-defined]
    assert echo["extra"] == ["--bs", "8"]
    assert echo["env"]["AUTOTUNE_KNOB_PER_DEVICE_TRAIN_BATCH_SIZE"] == "8"
    assert echo["env"]["AUTOTUNE_GLOBAL_BATCH"] == "16"
    assert echo["env"]["AUTOTUNE_WORLD_SIZE"] == "1"


def test_end_to_end_metrics_file(tmp_path: Path) -> None:
    template = [sys.executable, str(FAULT), "--mode", "ok", "--to-file", "--steps", "3"]
    rec, verdict = run_command(tmp_path, template, {})
    assert verdict.status is TrialStatus.COMPLETE  # type: ignore[attr-defined]
    assert [s.step for s in rec.steps] == [1, 2, 3]  # type: ignore[attr-defined]


def test_end_to_end_oom(tmp_path: Path) -> None:
    template = [sys.executable, str(FAULT), "--mode", "{mode}", "--rank", "0"]
    rec, verdict = run_command(tmp_path, template, {"mode": "oom"})
    assert verdict.status is TrialStatus.OOM  # type: ignore[attr-defined]
    assert "rank 0" in verdict.reason  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("recording", "steps"),
    [("trl_1.16_user_script_cpu.log", [1, 2, 3]), ("verl_0.9.1_console.stdout", [1, 2, 3])],
)
def test_end_to_end_a_script_that_prints_trainer_logs(
    tmp_path: Path, recording: str, steps: list[int]
) -> None:
    """A script printing Hugging Face Trainer / TRL dicts (tqdm noise included) or verl's console lines,
    replayed from a recorded run, is a completed trial with its steps: no JSON lines needed."""
    path = Path(__file__).parent / "data" / recording
    code = "import sys; sys.stdout.buffer.write(open(sys.argv[1], 'rb').read())"
    rec, verdict = run_command(tmp_path, [sys.executable, "-c", code, str(path)], {})
    assert verdict.status is TrialStatus.COMPLETE, verdict  # type: ignore[attr-defined]
    assert [s.step for s in rec.steps] == steps  # type: ignore[attr-defined]
    assert all(s.samples == 16 for s in rec.steps)  # type: ignore[attr-defined]  # the study's global batch
    if recording.startswith("trl"):
        assert all(s.tokens == 16 * s.values["completions/mean_length"] for s in rec.steps)  # type: ignore[attr-defined]
    else:
        assert all(s.duration_s == s.values["timing_s/step"] for s in rec.steps)  # type: ignore[attr-defined]
