"""The job's training semantics through the installed CLI: a study tunes the user's job, not a demo.

A 7B study with no semantics options launches its trials with the framework's own defaults (TRL's
GRPOConfig, ms-swift's GRPO arguments), one rule decides for both backends when a value comes from
``--fixed``, the job's arguments or an option, and two places that disagree are one line, exit 2, naming
both. ms-swift runs from a fake install (a ``swift`` script whose interpreter answers the version probe,
its accepted flags in autotune's cache) on declared GPUs: only what autotune launches is checked; TRL's
trials are cut by a one-second start-up timeout once launched.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from autotune.backends.swift.backend import CONTROLLED_FLAGS, SwiftBackend
from autotune.space import load_space
from tests.hubcache import cached_snapshot

DECLARED = ("--gpus", "4", "--gpu-type", "A10")
SHORT = ("--trials", "1", "--max-steps", "2", "--confirm-runs", "0", "--startup-timeout", "1s")


def _fake_swift(tmp_path: Path, cache: Path) -> Path:
    """A ``swift`` whose interpreter says it is ms-swift 4.6.0, with the flags it accepts cached."""
    python = tmp_path / "fakepy" / "python"
    python.parent.mkdir(parents=True)
    versions = {"ms-swift": "4.6.0", "deepspeed": "0.19.8", "vllm": None}
    # the doctor's record of the same interpreter (the search's pre-flight reads torch there)
    record = {"python": str(python), "python_version": "3.11.7", "packages": {"ms-swift": "4.6.0"}}
    python.write_text(
        f"#!/bin/sh\necho 'AUTOTUNE_VERSIONS {json.dumps(versions)}'\n"
        f"echo 'AUTOTUNE_INTERPRETER {json.dumps(record)}'\n"
    )
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    swift = tmp_path / "bin" / "swift"
    swift.parent.mkdir(parents=True)
    swift.write_text(f"#!{python}\n# console script\n")
    swift.chmod(swift.stat().st_mode | stat.S_IEXEC)
    # every flag a trial can pass: the space's knobs, the flags autotune controls, the job's own
    space = load_space(SwiftBackend().default_space())
    accepted = {k.name for k in space.knobs} | set(CONTROLLED_FLAGS)
    accepted |= {"rlhf_type", "model", "num_generations", "max_completion_length", "vllm_mode", "beta"}
    accepted |= {"dataset", "reward_funcs", "external_plugins", "tuner_type", "train_type", "torch_dtype"}
    import hashlib

    key = hashlib.sha1(str(python.resolve()).encode()).hexdigest()[:12]
    (cache / "swift").mkdir(parents=True, exist_ok=True)
    (cache / "swift" / f"flags-4.6.0-{key}.json").write_text(json.dumps(sorted(accepted)))
    return swift


def _argv_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _first_launch(out: Path) -> dict:
    launched = sorted(out.glob("trials/*/launch.json"), key=lambda p: int(p.parent.name))
    assert launched, f"no trial was launched in {out}"
    return json.loads(launched[0].read_text())


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """No hub; Qwen/Qwen2-7B in the user's Hugging Face cache (the search resolves it before trial 0)."""
    hub = tmp_path / "hf-cache"
    cached_snapshot(hub, "Qwen/Qwen2-7B")
    return {"AUTOTUNE_CACHE_DIR": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub)}


def test_a_7b_swift_study_launches_with_ms_swifts_defaults(cli, tmp_path: Path, env: dict[str, str]) -> None:
    swift = _fake_swift(tmp_path, Path(env["AUTOTUNE_CACHE_DIR"]))
    out = tmp_path / "runs" / "swift7b"
    proc = cli(
        "search", "--backend", "swift", "--executable", str(swift), "--model", "Qwen2-7B", *DECLARED, *SHORT,
        "--out", str(out), env=env,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    launch = _first_launch(out)
    argv = launch["argv"]
    # the model's local snapshot in the user's cache, resolved once
    snapshot = str(Path(env["HF_HUB_CACHE"]) / "models--Qwen--Qwen2-7B" / "snapshots")
    assert _argv_value(argv, "--model").startswith(snapshot)
    assert "--use_hf" not in argv  # a local model: the user's dataset ids keep ms-swift's meaning
    assert "MODELSCOPE_CACHE" not in launch.get("env", {}) and not (out / "cache").exists()
    assert _argv_value(argv, "--max_completion_length") == "512"
    assert _argv_value(argv, "--num_generations") == "8"
    settings = json.loads((out / "study.json").read_text())
    assert settings["max_completion_length"] == 512 and settings["num_generations"] == 8
    # 1 per device x 4 GPUs = 4, which ms-swift refuses with 8 generations: the smallest it accepts
    assert settings["global_batch"] == 8
    assert {v["source"] for v in settings["semantics"].values()} == {"framework"}
    assert "ms-swift's GRPO default" in proc.stdout


@pytest.mark.e2e  # launches TRL's worker under torch.distributed.run (cut by the start-up timeout)
def test_a_7b_trl_study_launches_with_grpoconfigs_defaults(cli, tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "runs" / "trl7b"
    proc = cli("search", "--model", "Qwen2-7B", *DECLARED, *SHORT, "--out", str(out), env=env)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    launched = sorted(out.glob("trials/*/trial_config.json"))
    assert launched, proc.stdout + proc.stderr
    trial_config = json.loads(launched[0].read_text())
    snapshot = str(Path(env["HF_HUB_CACHE"]) / "models--Qwen--Qwen2-7B" / "snapshots")
    assert trial_config["model"].startswith(snapshot)  # the local snapshot, resolved once
    config = trial_config["grpo_config"]
    assert config["max_completion_length"] == 512 and config["num_generations"] == 8
    # TRL's default batch: 8 completions per device on 4 GPUs
    assert config["per_device_train_batch_size"] * 4 * config["gradient_accumulation_steps"] == 32
    settings = json.loads((out / "study.json").read_text())
    assert settings["semantics"]["max_completion_length"]["where"] == "TRL's GRPOConfig default"


# TRL's trials start its worker (cut by the one-second start-up timeout): a framework process, e2e
@pytest.mark.parametrize("backend", [pytest.param("trl", marks=pytest.mark.e2e), "swift"])
def test_both_backends_honour_a_fixed_value_and_refuse_a_conflict_alike(
    cli, tmp_path: Path, env: dict[str, str], backend: str
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("max_completion_length: 24\nbeta: 0.04\n")
    extra = (
        ("--executable", str(_fake_swift(tmp_path, Path(env["AUTOTUNE_CACHE_DIR"]))))
        if backend == "swift"
        else ()
    )
    model = ("--model", "Qwen2-7B", *DECLARED) if backend == "swift" else ("--model", "tiny-qwen2")
    base = ("search", "--backend", backend, *extra, *model, *SHORT, "--fixed", str(job))

    # an option that disagrees with the file: one line, exit 2, both places named, nothing written
    conflict = tmp_path / "runs" / "conflict"
    proc = cli(*base, "--max-completion-length", "16", "--out", str(conflict), env=env)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "max_completion_length is 16 in --max-completion-length but 24 in --fixed" in lines[0]
    assert not conflict.exists()

    # the job's own arguments after -- that disagree with the file: the same rule
    flag = ["--max_completion_length", "32"]
    proc = cli(*base, "--out", str(conflict), "--", *flag, env=env)
    assert proc.returncode == 2 and "your arguments after --" in proc.stderr, proc.stderr

    # the file alone: its value holds in the trial's launch and in study.json, as its source
    out = tmp_path / "runs" / "honoured"
    proc = cli(*base, "--out", str(out), env=env)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    if backend == "swift":
        assert _argv_value(_first_launch(out)["argv"], "--max_completion_length") == "24"
    else:
        config = json.loads(next(out.glob("trials/*/trial_config.json")).read_text())["grpo_config"]
        assert config["max_completion_length"] == 24
    semantics = json.loads((out / "study.json").read_text())["semantics"]
    assert semantics["max_completion_length"] == {
        "value": 24,
        "source": "fixed",
        "where": f"--fixed {job} (max_completion_length)",
    }


@pytest.mark.e2e
def test_a_trl_grpo_config_yaml_is_read_as_trl_reads_it(cli, tmp_path: Path, env: dict[str, str]) -> None:
    """`--fixed` takes the YAML of `trl grpo --config` as it is: GRPOConfig and ModelConfig fields are kept
    (LoRA through use_peft, which GRPOConfig alone rejects), what autotune sets and accelerate's keys are
    named in one line, and a model of its own is refused."""
    job = tmp_path / "grpo.yaml"
    job.write_text(
        "use_peft: true\nlora_r: 8\nlora_target_modules: [q_proj, v_proj]\nbeta: 0.04\n"
        "output_dir: /elsewhere\nlogging_steps: 5\naccelerate_config: zero2\nmax_completion_length: 12\n"
    )
    out = tmp_path / "runs" / "trljob"
    short = ("--trials", "1", "--max-steps", "2", "--confirm-runs", "0")
    proc = cli("search", "--model", "tiny-qwen2", *short, "--fixed", str(job), "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    note = next(line for line in proc.stdout.splitlines() if "not kept from your TRL job" in line)
    assert (
        "logging_steps, output_dir (autotune sets them" in note and "accelerate_config (accelerate's" in note
    )
    assert "max_completion_length" not in note  # honoured: the job's semantics
    result = json.loads((out / "trials" / "0" / "result.json").read_text())
    assert result["status"] == "COMPLETE", result["reason"]
    config = json.loads((out / "trials" / "0" / "trial_config.json").read_text())["grpo_config"]
    assert config["use_peft"] is True and config["lora_r"] == 8 and config["max_completion_length"] == 12
    assert "accelerate_config" not in config and config["logging_steps"] == 1

    job.write_text("model_name_or_path: Qwen/Qwen2-0.5B\nbeta: 0.04\n")
    refused = cli(
        "search", "--model", "tiny-qwen2", *short, "--fixed", str(job), "--out", str(tmp_path / "r"), env=env
    )
    assert refused.returncode == 2 and "give the model with autotune's --model" in refused.stderr.lower()
    assert len([line for line in refused.stderr.splitlines() if line.strip()]) == 1
