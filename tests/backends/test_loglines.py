"""Logs users already print, read into step records: Hugging Face Trainer / TRL dict lines and verl's
console lines, from recorded real output (see each fixture's capture script)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from autotune.probes.timeline import summarize

from autotune.backends._loglines import (
    TrainerLogParser,
    is_trainer_step_record,
    parse_dict_literal,
    parse_verl_console_line,
)
from autotune.backends.command import CommandParser

DATA = Path(__file__).parent / "data"
#: a real TRL GRPO run of autotune's worker (tests/backends/data/capture_trl.py), 6 steps, logging_steps 1
TRL_RECORDING = DATA / "trl_1.16_cpu_1proc.events.jsonl"
#: a user's plain TRL script (tests/probes/data/user_grpo_script.py --no-callback --logging-steps 2 --steps 6),
#: stdout and stderr in one pipe as ``python script.py 2>&1 | tee log`` records it (tqdm bars included)
USER_LOG = DATA / "trl_1.16_user_script_cpu.log"
#: verl 0.9.1's own console formatter on metrics shaped as RayPPOTrainer.fit logs them
#: (tests/backends/data/capture_verl_console.py): verl/utils/logger/aggregate_logger.py::concat_dict_to_str
VERL_CONSOLE = DATA / "verl_0.9.1_console.stdout"


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _feed(parser, lines: list[tuple[str, str, float]]) -> list:
    out = []
    for stream, text, t in lines:
        for segment in text.split("\r"):  # the runner splits carriage-return segments
            out.extend(parser.feed(stream, segment, t, 1e9 + t))
    out.extend(parser.finish(1e6, 1e9))
    return out


def _stream_lines(path: Path) -> list[tuple[str, str, float]]:
    return [(e["stream"], e["text"], e["t"]) for e in _events(path) if "stream" in e]


def test_recorded_trl_dicts_parse_into_the_steps_the_worker_wrote() -> None:
    """The printed dicts (transformers 5: ``.4g`` text) give the same steps as the worker's own records."""
    steps = _feed(TrainerLogParser(samples=8), _stream_lines(TRL_RECORDING))
    written = [json.loads(e["text"]) for e in _events(TRL_RECORDING) if e.get("file") == "metrics.jsonl"]
    assert [s.step for s in steps] == [w["step"] for w in written] == [1, 2, 3, 4, 5, 6]
    for got, want in zip(steps, written, strict=True):
        for key in ("grad_norm", "reward", "reward_std", "completions/mean_length", "step_time", "epoch"):
            assert got.values[key] == pytest.approx(want["values"][key], rel=1e-3, abs=1e-7), key
        assert got.samples == 8 and got.tokens == want["tokens"]
    assert steps[0].duration_s is None  # nothing before the first record to time it from
    assert all(s.duration_s is not None and s.duration_s > 0 for s in steps[1:])
    assert "train_runtime" not in steps[-1].values  # the end-of-training summary is no step


def test_recorded_user_script_log_with_tqdm_noise_and_logging_steps() -> None:
    """A plain user TRL script, stdout and stderr in one pipe: tqdm bars share lines with the dicts."""
    text = USER_LOG.read_bytes().decode("utf-8")  # keep the carriage returns
    assert "\r" in text and "it/s]" in text  # the recording holds the progress bar's noise
    lines = [("stdout", line, float(i)) for i, line in enumerate(text.split("\n"))]
    steps = _feed(TrainerLogParser(samples=8), lines)
    # logging_steps 2 over 6 steps: three records, numbered in order (each stands for 2 optimizer steps)
    assert [s.step for s in steps] == [1, 2, 3]
    assert all({"loss", "reward", "kl", "epoch", "completions/mean_length"} <= set(s.values) for s in steps)
    assert [s.values["epoch"] for s in steps] == sorted(s.values["epoch"] for s in steps)
    assert any(k.startswith("rewards/") and k.endswith("/mean") for k in steps[0].values)


def test_printed_dicts_yield_to_the_records_a_script_writes(tmp_path: Path) -> None:
    """With the metrics file present (the callback creates it when training begins), the dicts are
    ignored: the file's full-precision records are the steps, each once."""
    metrics = tmp_path / "metrics.jsonl"
    written = [e["text"] for e in _events(TRL_RECORDING) if e.get("file") == "metrics.jsonl"]
    parser = CommandParser(metrics, printed=TrainerLogParser(samples=8))
    metrics.write_text("")
    out = []
    for stream, text, t in _stream_lines(TRL_RECORDING):
        if text.startswith("{'loss'"):  # the worker writes its line, then transformers prints the dict
            with metrics.open("a") as fh:
                fh.write(written.pop(0) + "\n")
        out.extend(parser.feed(stream, text, t, 1e9))
    out.extend(parser.finish(1e6, 1e9))
    assert [s.step for s in out] == [1, 2, 3, 4, 5, 6]
    assert out[0].values["grad_norm"] == 0.9845470190048218  # the file's value, not the printed '0.9845'


def test_without_a_metrics_file_the_command_parser_reads_the_dicts(tmp_path: Path) -> None:
    parser = CommandParser(tmp_path / "never.jsonl", printed=TrainerLogParser())
    steps = _feed(parser, _stream_lines(TRL_RECORDING))
    assert [s.step for s in steps] == [1, 2, 3, 4, 5, 6]
    assert CommandParser(tmp_path / "never.jsonl").feed("stdout", "{'loss': 0.1, 'epoch': 0.5}", 0, 0) == []


def test_transformers_4_numbers_and_numpy_scalars() -> None:
    """transformers 4 prints the numbers themselves; with numpy ≥ 2 a numpy scalar's repr is a call."""
    line = "{'loss': 0.1234, 'grad_norm': np.float64(1.25), 'learning_rate': 1e-05, 'epoch': 0.5, 'n': np.int64(3)}"
    record = parse_dict_literal(line)
    assert record == {"loss": 0.1234, "grad_norm": 1.25, "learning_rate": 1e-05, "epoch": 0.5, "n": 3}
    assert parse_dict_literal("{'loss': os.system('x'), 'kl': 0.1}") == {"kl": 0.1}  # never evaluated
    (step,) = TrainerLogParser().feed("stdout", line, 1.0, 2.0)
    assert step.step == 1 and step.values["grad_norm"] == 1.25 and step.tokens is None


def test_what_is_not_a_step() -> None:
    assert not is_trainer_step_record({"train_runtime": 2.0, "train_loss": 0.1, "epoch": 1.0})
    assert not is_trainer_step_record({"eval_loss": 0.3, "loss": 0.2})
    assert not is_trainer_step_record({"learning_rate": 1e-5, "epoch": 0.1})
    assert is_trainer_step_record({"reward": 0.3, "kl": 0.0})
    parser = TrainerLogParser()
    assert parser.feed("stderr", "{'loss': 0.1}", 0, 0) == []  # dicts are read from stdout
    assert parser.feed("stdout", "{'eval_loss': 0.1, 'loss': 0.1}", 0, 0) == []
    (own,) = parser.feed("stdout", "{'loss': 0.1, 'step': 40}", 0, 0)  # a record with its own step keeps it
    (nxt,) = parser.feed("stdout", "{'loss': 0.1}", 1, 1)
    assert (own.step, nxt.step) == (40, 41)


def test_recorded_verl_console_lines() -> None:
    lines = [("stdout", line, float(i)) for i, line in enumerate(VERL_CONSOLE.read_text().splitlines())]
    steps = _feed(TrainerLogParser(), lines)
    assert [s.step for s in steps] == [1, 2, 3]
    first = steps[0]
    assert first.values["actor/pg_loss"] == pytest.approx(-0.012)  # printed as np.float64(-0.012)
    assert first.values["actor/grad_norm"] == 0.41 and first.values["perf/total_num_tokens"] == 27072
    assert first.duration_s == first.values["timing_s/step"]
    step, values = parse_verl_console_line(lines[1][1]) or (0, {})
    assert step == 1 and values == first.values
    # verl's phase timers split the steps (probes.timeline reads the timing_s/* keys)
    summary = summarize(
        None,
        [
            {"step": s.step, "t_mono_s": 100.0 * s.step, "duration_s": s.duration_s, "values": s.values}
            for s in steps
        ],
        [],
    )
    assert summary.phases.source == "framework" and summary.phases.measured
    assert (summary.phases.time_s["rollout"] or 0) > 0 and (summary.phases.time_s["weight_sync"] or 0) > 0


def test_a_verl_line_is_not_read_twice_and_nan_survives() -> None:
    parser = TrainerLogParser()
    line = "step:2 - actor/loss:nan - timing_s/step:3.5 - note:text"
    (s,) = parser.feed("stdout", line, 0, 0)
    assert math.isnan(s.values["actor/loss"]) and "note" not in s.values and s.duration_s == 3.5
    assert parser.feed("stdout", line, 1, 1) == []
