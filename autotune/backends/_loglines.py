"""Step records in the console formats trainers already print: Hugging Face Trainer / TRL log dicts and
verl's console metrics. Shared by the ``command`` backend, ``autotune profile`` and the backends whose
framework prints them (ms-swift's dicts are the Trainer's, extended; verl's console is verl's).

Hugging Face Trainer (and TRL, which logs through it) prints each ``Trainer.log`` record on rank 0's
stdout as a Python dict literal:

- transformers ≥ 5 formats floats with ``.4g`` as text (``ProgressCallback.on_log`` and
  ``PrinterCallback.on_log`` in transformers/trainer_callback.py): ``{'loss': '0', 'grad_norm':
  '0.9845', 'learning_rate': '1e-06', ..., 'reward': '0.2585', 'kl': '0', 'epoch': '0.03125'}``;
- transformers 4 prints the numbers themselves, and with numpy ≥ 2 a numpy scalar prints as
  ``np.float64(0.1)``.

The record carries no step number (``Trainer.log`` adds ``step`` only to ``state.log_history``), so the
records are numbered 1, 2, 3 in order; with ``logging_steps`` L > 1 each record stands for L optimizer
steps. A record with its own integer ``step`` keeps it. The end-of-training summary (``train_runtime``)
and evaluation records (``eval_*``) are not steps.

verl's console logger prints ``step:N - key:value - key:value ...`` (``concat_dict_to_str`` in
verl/utils/logger/aggregate_logger.py, called by ``LocalLogger.log``; values through ``pprint.pformat``,
so numpy scalars print as ``np.float64(0.1)``).
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from autotune.backends._base import StepParser
from autotune.records import StepMetrics
from autotune.values import as_number

__all__ = [
    "TrainerLogParser",
    "completion_tokens",
    "is_trainer_step_record",
    "parse_dict_literal",
    "parse_verl_console_line",
]

_NAMES = {"nan": math.nan, "inf": math.inf, "None": None, "True": True, "False": False}
#: numpy's scalar reprs (numpy ≥ 2): ``np.float64(0.5)``, ``np.int64(3)``, ``np.True_`` is not a number.
_NUMPY_MODULES = ("np", "numpy")


def _numpy_scalar(node: ast.Call) -> Any:
    func = node.func
    if (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id in _NUMPY_MODULES
        and re.fullmatch(r"(float|int|uint)\d*", func.attr)
        and len(node.args) == 1
        and not node.keywords
    ):
        inner = _node_value(node.args[0])
        if isinstance(inner, (int, float)) and not isinstance(inner, bool):
            return inner
        if isinstance(inner, str):  # np.float64('nan') is how some versions print a NaN
            num = as_number(inner)
            if num is not None:
                return num
    raise ValueError("not a numpy scalar")


def _node_value(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _node_value(node.operand)
        if isinstance(inner, (int, float)) and not isinstance(inner, bool):
            return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_node_value(e) for e in node.elts]
    if isinstance(node, ast.Call):
        return _numpy_scalar(node)
    raise ValueError("not a literal")


def parse_dict_literal(text: str) -> dict[str, Any] | None:
    """The dict printed in ``text`` (a Python literal; ``nan``/``inf`` and numpy scalars allowed), or None.

    A value that is no literal (an object's repr) is left out rather than losing the record.
    """
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        tree = ast.parse(text[start : end + 1], mode="eval")
    except (SyntaxError, ValueError):
        return None
    if not isinstance(tree.body, ast.Dict):
        return None
    out: dict[str, Any] = {}
    for key, value in zip(tree.body.keys, tree.body.values, strict=True):
        if not isinstance(key, ast.Constant) or not isinstance(key.value, str):
            return None
        try:
            out[key.value] = _node_value(value)
        except ValueError:
            continue
    return out


def _value(text: str) -> float | None:
    """One printed number: ``0.12``, ``nan``, ``np.float64(0.12)``."""
    text = text.strip().rstrip(",")
    num = as_number(text)
    if num is not None:
        return num
    try:
        tree = ast.parse(text, mode="eval")
        value = _node_value(tree.body)
    except (SyntaxError, ValueError):
        return None
    return as_number(value)


# "step:N - " not inside a longer key ("val/global_step:3", "timing/step:1.2").
_VERL_STEP = re.compile(r"(?<![\w/])step:(\d+)\s+-\s+(.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # Ray colours its "(TaskRunner pid=N)" prefix


def parse_verl_console_line(line: str) -> tuple[int, dict[str, float]] | None:
    """``(TaskRunner pid=7) step:3 - actor/loss:0.12 - timing_s/gen:np.float64(4.1)`` → ``(3, {...})``;
    None for other lines. A tqdm bar glued before ``step:`` and Ray's coloured prefix are skipped."""
    m = _VERL_STEP.search(_ANSI.sub("", line))
    if not m:
        return None
    values: dict[str, float] = {}
    for part in m.group(2).split(" - "):
        key, sep, raw = part.rpartition(":")
        if not sep or not key.strip():
            continue
        value = _value(raw)
        if value is not None:
            values[key.strip()] = value
    return int(m.group(1)), values


def completion_tokens(values: Mapping[str, float], samples: int | None) -> float | None:
    """Completion tokens of a step: TRL's / ms-swift's ``completions/mean_length`` × completions per step."""
    mean_len = values.get("completions/mean_length")
    if mean_len is None or not samples or not math.isfinite(mean_len):
        return None
    return mean_len * samples


def is_trainer_step_record(record: Mapping[str, object]) -> bool:
    """A Trainer log record of a training step: it has ``loss`` or (TRL) ``reward``, and is neither the
    end-of-training summary nor an evaluation record."""
    if "loss" not in record and "reward" not in record:
        return False
    return "train_runtime" not in record and not any(k.startswith("eval_") for k in record)


class TrainerLogParser(StepParser):
    """Step records from Hugging Face Trainer / TRL dict lines and verl console lines on stdout.

    Args:
        samples: completions (samples) per step, for :attr:`StepMetrics.samples` and ``tokens``
            (``completions/mean_length`` × samples), when known.
        dicts: read Trainer dict lines.
        verl: read verl console lines.
        skip: records another reader owns (``autotune profile`` leaves ms-swift's to its own parser).

    ``duration_s`` of a dict record is the time since the previous record was read, per step between
    them (None for the first): the trainer prints no step time of its own (TRL's ``step_time`` is the
    ``training_step`` call alone, kept as a value). verl's records take ``timing_s/step``.
    """

    def __init__(
        self,
        samples: int | None = None,
        *,
        dicts: bool = True,
        verl: bool = True,
        skip: Callable[[Mapping[str, Any]], bool] | None = None,
    ) -> None:
        self.samples = samples
        self.dicts = dicts
        self.verl = verl
        self.skip = skip
        self._seen: set[int] = set()
        self._count = 0
        self._last: tuple[int, float] | None = None  # (step, t_mono_s) of the last dict record

    def _dict_step(self, segment: str, t_mono_s: float, t_wall_s: float) -> StepMetrics | None:
        if "{" not in segment or ("loss" not in segment and "reward" not in segment):
            return None
        record = parse_dict_literal(segment)
        if (
            record is None
            or not is_trainer_step_record(record)
            or (self.skip is not None and self.skip(record))
        ):
            return None
        own = record.get("step")
        step = own if isinstance(own, int) and not isinstance(own, bool) else self._count + 1
        if step in self._seen:
            return None
        self._count = max(self._count, step)
        values = {k: v for k, v in ((k, as_number(raw)) for k, raw in record.items()) if v is not None}
        values.pop("step", None)
        duration = None
        if self._last is not None and step > self._last[0] and t_mono_s >= self._last[1]:
            duration = (t_mono_s - self._last[1]) / (step - self._last[0])
        self._last = (step, t_mono_s)
        return self._make(step, values, t_mono_s, t_wall_s, duration)

    def _make(
        self, step: int, values: dict[str, float], t_mono_s: float, t_wall_s: float, duration: float | None
    ) -> StepMetrics:
        self._seen.add(step)
        return StepMetrics(
            step=step,
            t_mono_s=t_mono_s,
            t_wall_s=t_wall_s,
            duration_s=duration,
            samples=self.samples,
            tokens=completion_tokens(values, self.samples),
            values=values,
        )

    def feed(self, stream: str, line: str, t_mono_s: float, t_wall_s: float) -> list[StepMetrics]:
        if stream != "stdout":
            return []
        out: list[StepMetrics] = []
        for segment in line.split("\r"):  # a tqdm bar may share the line
            if self.verl:
                parsed = parse_verl_console_line(segment)
                if parsed is not None:
                    step, values = parsed
                    if step not in self._seen:
                        out.append(self._make(step, values, t_mono_s, t_wall_s, values.get("timing_s/step")))
                    continue
            if self.dicts:
                rec = self._dict_step(segment, t_mono_s, t_wall_s)
                if rec is not None:
                    out.append(rec)
        return out
