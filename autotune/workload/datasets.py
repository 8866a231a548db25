"""Small prompt datasets generated locally, so a CPU study needs nothing from a hub.

The tasks are short arithmetic and counting questions with a known answer (``solution``). A random tiny
model never solves them, so :func:`score_completion` also gives a partial, varying score (the share of
digits in the completion): rewards then differ within a group and GRPO has a non-zero advantage to learn
from. The same rows serve TRL (``prompt`` key) and ms-swift (``messages`` key).
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from autotune.errors import UsageError

__all__ = [
    "PromptStyle",
    "Task",
    "corpus_lines",
    "generate_tasks",
    "read_rows",
    "score_completion",
    "write_prompts",
]

#: the row format: a conversational ``prompt`` (TRL) or ``messages`` (ms-swift).
PromptStyle = Literal["prompt", "messages"]

_WORDS = (
    "apple", "river", "stone", "cloud", "green", "quick", "table", "light", "music", "paper",
    "train", "water", "house", "field", "smile", "bread", "chair", "dream", "earth", "flame",
)  # fmt: skip


@dataclass(frozen=True)
class Task:
    """One question with its expected answer.

    Attributes:
        question: the user message.
        solution: the exact answer text.
    """

    question: str
    solution: str

    def row(self, style: PromptStyle) -> dict[str, Any]:
        """The dataset row of ``style``: its conversation under the key ``style`` names."""
        key = style
        return {key: [{"role": "user", "content": self.question}], "solution": self.solution}


def _task(rng: random.Random) -> Task:
    kind = rng.randrange(4)
    if kind == 0:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        return Task(f"What is {a} + {b}? Reply with the number only.", str(a + b))
    if kind == 1:
        a, b = rng.randint(10, 99), rng.randint(0, 9)
        return Task(f"What is {a} - {b}? Reply with the number only.", str(a - b))
    if kind == 2:
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        return Task(f"Multiply {a} by {b}. Give just the result.", str(a * b))
    word = rng.choice(_WORDS)
    return Task(f"How many letters are in the word '{word}'? Answer with a digit.", str(len(word)))


def generate_tasks(n: int, seed: int = 0) -> list[Task]:
    """``n`` tasks, the same for the same seed.

    Raises:
        UsageError: when ``n`` is not positive.
    """
    if n <= 0:
        raise UsageError(f"cannot generate {n} prompts", hint="Ask for at least one prompt")
    rng = random.Random(seed)
    return [_task(rng) for _ in range(n)]


def corpus_lines(n: int, seed: int = 0) -> Iterator[str]:
    """Text lines resembling the prompts and answers (tokenizer training material)."""
    rng = random.Random(seed)
    for _ in range(n):
        task = _task(rng)
        yield task.question
        yield f"The answer is {task.solution}."
        yield " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 9)))


def write_prompts(path: Path, n: int, seed: int = 0, style: PromptStyle = "prompt") -> Path:
    """Write ``n`` generated prompts as JSON lines, atomically.

    Args:
        path: the ``.jsonl`` file to write (its directory is created).
        n: number of rows.
        seed: the same seed gives the same file.
        style: ``"prompt"`` rows carry ``prompt`` (TRL's form); ``"messages"`` rows carry ``messages``
            (ms-swift's). Both carry ``solution``.

    Returns:
        ``path``.

    Raises:
        UsageError: for an unknown style or a non-positive ``n``.
    """
    if style not in ("prompt", "messages"):
        raise UsageError(f"unknown prompt style {style!r}", hint="Use style 'prompt' or 'messages'")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(t.row(style), ensure_ascii=False) + "\n" for t in generate_tasks(n, seed))
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a ``.jsonl`` file (one object a line) or a ``.json`` file holding a list of objects.

    Raises:
        UsageError: the file is missing or is not rows of JSON objects.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(
            f"cannot read dataset {path}: {exc.strerror or exc}", hint="Check the --dataset path"
        ) from None
    rows = _parse_json(text) if path.suffix == ".json" else _parse_jsonl(text, path)
    if rows is None:
        raise UsageError(f"dataset {path} is not valid JSON", hint="Give a .jsonl file, one object per line")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise UsageError(
            f"dataset {path} holds no rows of JSON objects", hint="Give a .jsonl file, one object per line"
        )
    return rows


def _parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _parse_jsonl(text: str, path: Path) -> list[Any]:
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            raise UsageError(
                f"dataset {path} is not valid JSON at line {lineno}",
                hint="Give a .jsonl file, one object per line",
            ) from None
    return rows


def score_completion(text: str, solution: str | None) -> float:
    """Reward of one completion: 1.0 when it contains the solution, plus the share of digit characters.

    The digit share makes rewards vary inside a group even when no completion is right, so the reward's
    standard deviation (and GRPO's advantage) is not zero for a random model.
    """
    stripped = text.strip()
    digits = sum(ch.isdigit() for ch in stripped)
    share = digits / len(stripped) if stripped else 0.0
    hit = 1.0 if solution and solution in stripped else 0.0
    return hit + share
