"""Fixed arguments: everything about the user's job that stays the same for every trial.

The dataset, reward functions, template, LoRA rank, beta, system prompt … are not tuned; they come from a
YAML file (a mapping of flag name → value, the layout ms-swift's own ``swift rlhf config.yaml`` uses) or
from the arguments given after ``--`` on autotune's command line (``-- --beta 0.04 --reward_funcs a b``).
Both give one plain dict, flag name → value, that every backend renders in its own way.

Names are normalised: leading dashes are dropped and ``-`` becomes ``_`` (``--max-completion-length``
and ``max_completion_length`` are the same flag). Values from a YAML file keep their YAML types; values
from argv stay text, exactly as typed (a flag given alone is ``True``, a flag with several values is a
list), so rendering them back reproduces the user's command.

The user's current flags may name knobs of the search space as well (``--per_device_train_batch_size 4``):
:func:`split_baseline` separates those, so they become trial 0 (the user's own baseline) instead of
overriding every trial.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import UsageError
from autotune.yamlfile import read_yaml

if TYPE_CHECKING:
    from autotune.space import SearchSpace

__all__ = [
    "JOB_ARGS_PLACE",
    "UnknownFlag",
    "coerce_knob_values",
    "flag_name",
    "job_words",
    "read_job_file",
    "knob_text",
    "load_fixed",
    "merge_fixed",
    "parse_flag_argv",
    "parse_pins",
    "read_fixed_file",
    "split_baseline",
]


class UnknownFlag(UsageError):
    """An argument of the user's job that the framework's own parser does not know.

    Attributes:
        name: the argument as given, normalised (``--max-len`` → ``max_len``).
        framework: the command whose parser refused it (``trl grpo``).
        place: where it was given (:data:`JOB_ARGS_PLACE`, or the ``--fixed`` file).
    """

    def __init__(self, name: str, known: Iterable[str], *, framework: str, place: str) -> None:
        import difflib

        name = name.lstrip("-").replace("-", "_")
        names = sorted({k.lstrip("-").replace("-", "_") for k in known})
        nearest = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        guess = f" (did you mean {nearest[0]}?)" if nearest else ""
        super().__init__(
            f"{place}: {name} is not an argument of {framework}{guess}",
            hint=f"Check its spelling against `{framework} --help`",
        )
        self.name = name
        self.framework = framework
        self.place = place


_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
_NUMBER_RE = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def flag_name(raw: str) -> str:
    """The normalised name of a flag: ``--max-completion-length`` → ``max_completion_length``.

    Raises:
        UsageError: when ``raw`` is not a usable flag name.
    """
    name = raw.lstrip("-").replace("-", "_")
    if not _NAME_RE.match(name):
        raise UsageError(f"{raw!r} is not a flag name", hint="Write flags as --name value")
    return name


def _is_flag(item: str) -> bool:
    # "-5" and "-1e-3" are negative numbers (values), not flags.
    return item.startswith("-") and len(item) > 1 and not _NUMBER_RE.match(item)


def parse_flag_argv(argv: Sequence[str]) -> dict[str, Any]:
    """Parse the arguments after ``--``: ``--name value``, ``--name=value``, ``--name v1 v2``, ``--name``.

    Args:
        argv: argument items, as the shell split them.

    Returns:
        name → value: text for one value, a list of text for several, ``True`` for a flag given alone.

    Raises:
        UsageError: an item that belongs to no flag, or a flag given twice.
    """
    out: dict[str, Any] = {}
    current: str | None = None
    values: list[str] = []

    def close() -> None:
        if current is None:
            return
        out[current] = True if not values else values[0] if len(values) == 1 else list(values)

    for item in argv:
        if _is_flag(item):
            close()
            raw, eq, inline = item.partition("=")
            name = flag_name(raw)
            if name in out or name == current:
                raise UsageError(f"flag --{name} is given twice", hint="Give each fixed flag once")
            current, values = name, []
            if eq:
                values.append(inline)
        elif current is None:
            raise UsageError(
                f"{item!r} after -- belongs to no flag",
                hint="Give the framework's flags after --, e.g. -- --beta 0.04",
            )
        else:
            values.append(item)
    close()
    return out


def read_fixed_file(path: Path | str) -> dict[str, Any]:
    """Read a YAML file that maps flag names to values.

    Raises:
        UsageError: missing or unreadable file, invalid YAML, not a mapping, or a key that is no flag name.
    """
    path = Path(path)
    return _fixed_mapping(read_yaml(path, what="fixed-arguments", flag="--fixed"), path)


def _fixed_mapping(data: object, path: Path) -> dict[str, Any]:
    """The flag → value mapping of a parsed ``--fixed`` YAML file (see :func:`read_fixed_file`)."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(
            f"fixed-arguments file {path} is not a mapping of flag names to values",
            hint="Write one 'flag_name: value' per line",
        )
    out: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise UsageError(
                f"{path}: key {key!r} is not a flag name", hint="Write one 'flag_name: value' per line"
            )
        if key == "ENV":
            raise UsageError(
                f"{path}: an ENV section is not supported in fixed arguments",
                hint="Export those environment variables before running autotune",
            )
        name = flag_name(key)
        if name in out:
            raise UsageError(f"{path}: flag {name!r} is given twice", hint="Give each fixed flag once")
        out[name] = value
    return out


#: how the job's own arguments are named in messages.
JOB_ARGS_PLACE = "your arguments after --"


def merge_fixed(
    first: Mapping[str, object], first_place: str, second: Mapping[str, object], second_place: str
) -> dict[str, Any]:
    """The fixed arguments of two places (the ``--fixed`` file, the job's arguments after ``--``).

    One rule for every backend: an argument set in one place holds; set in both with the same value it
    holds once; set in both with different values it is an error naming both places.

    Raises:
        UsageError: an argument given two different values.
    """
    out = dict(first)
    for name, value in second.items():
        if name in out and _same_text(out[name]) != _same_text(value):
            raise UsageError(
                f"{name} is {out[name]!r} in {first_place} but {value!r} in {second_place}",
                hint="Give each argument in one place (or the same value in both)",
            )
        out[name] = value
    return out


def _same_text(value: object) -> Any:
    """A value as the frameworks' parsers would read it from text (``256`` and ``"256"`` agree)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return tuple(_same_text(v) for v in value)
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _same_text(v)) for k, v in value.items()))
    text = str(value).strip()
    try:
        return float(text)  # 256, "256" and "256.0" are one number to the frameworks' parsers
    except ValueError:
        return text.lower() if text.lower() in _TRUE | _FALSE | _NONE else text


def job_words(
    path: Path | str, command: Sequence[str], *, flag: str = "--fixed"
) -> tuple[list[str], list[str]]:
    """The arguments of a job's command line in a shell script or text file (a ``swift rlhf ...`` or
    ``python -m verl.trainer.main_ppo ...`` line, continued with backslashes, comments allowed).

    Args:
        path: the file.
        command: the words that start the job's command (``("swift", "rlhf")``); the arguments are the
            words after the last of them. A file of bare arguments (no command) is read whole.
        flag: the option that named the file, for messages.

    Returns:
        (the arguments, the names of the environment variables set before the command: ``NAME=value``).

    Raises:
        UsageError: an unreadable file or one that is no shell text (unbalanced quotes), in one line.
    """
    from autotune.yamlfile import read_user_file

    text = read_user_file(path, what="job", flag=flag)
    return shell_line_words(text, path, command, flag=flag)


def shell_line_words(
    text: str, path: Path | str, command: Sequence[str], *, flag: str = "--fixed"
) -> tuple[list[str], list[str]]:
    """The words of :func:`job_words` from the file's text (read once by the caller).

    Raises:
        UsageError: no shell text (unbalanced quotes), or a line that the shell would change before
            the job sees it (a pipe, a redirection, ``;``/``&&``, ``$VAR``, ``$(...)``): its arguments
            are not the job's, so it is refused, naming what to write instead.
    """
    import shlex

    _refuse_shell_constructs(text, path, flag)
    try:
        words = shlex.split(re.sub(r"\\\r?\n", " ", text), comments=True)  # line continuations
    except ValueError as exc:
        raise UsageError(
            f"{flag} file {path} is not a shell command line: {exc}", hint="Check its quotes"
        ) from None
    ends = [i for i, w in enumerate(words) if w in command or Path(w).name in command]
    env: list[str] = []
    if ends:
        env = [w.split("=", 1)[0] for w in words[: ends[0]] if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w)]
        words = words[ends[-1] + 1 :]
    return words, env


#: what the shell does to a line before a command sees it, by the first character that starts it
_SHELL_DOES = {
    "|": "a pipe (|)",
    ";": "a second command (;)",
    "&": "a background job or && (&)",
    "<": "a redirection (<)",
    ">": "a redirection (>)",
    "$": "a shell expansion ($)",
    "`": "a command substitution (`)",
}


def _refuse_shell_constructs(text: str, path: Path | str, flag: str) -> None:
    """Refuse a job line the shell would change before the job sees it (see :func:`shell_line_words`).

    A quote-aware scan: ``'...'`` is literal, ``"..."`` still expands ``$`` and backticks, ``\\x`` is
    literal, ``#`` at a word's start comments to the end of the line.
    """
    quote, escaped, word_start = "", False, True
    index = 0
    while index < len(text):
        char = text[index]
        index += 1
        if escaped:
            escaped, word_start = False, False
        elif quote == "'":
            quote = "" if char == "'" else quote
        elif char == "\\":
            escaped = True
        elif quote == '"':
            if char in "$`":
                _refuse_at(text, index - 1, char, path, flag)
            quote = "" if char == '"' else quote
        elif char in "'\"":
            quote, word_start = char, False
        elif char == "#" and word_start:
            end = text.find("\n", index)
            index = end if end >= 0 else len(text)
        elif char in _SHELL_DOES:
            _refuse_at(text, index - 1, char, path, flag)
        else:
            word_start = char.isspace()


def _refuse_at(text: str, index: int, char: str, path: Path | str, flag: str) -> None:
    line = text.count("\n", 0, index) + 1
    near = text[index : index + 12].split("\n")[0]
    raise UsageError(
        f"{flag} file {path} line {line}: {_SHELL_DOES[char]} at {near!r}, which the shell handles "
        "before the job sees it",
        hint="Keep only the job's command and its arguments there, with every value written out "
        "(no pipe, redirection or $VARIABLE)",
    )


def read_job_file(
    path: Path | str,
    command: Sequence[str],
    parse_words: Callable[[Sequence[str]], dict[str, Any]],
    type_mapping: Callable[[dict[str, Any]], dict[str, Any]] = dict,
) -> tuple[dict[str, Any], list[str]]:
    """A job's fixed arguments from the file the user has: a YAML mapping (:func:`read_fixed_file`, then
    read as the framework reads its YAML: ``type_mapping``), a YAML list of the command's arguments, or the
    job's shell line (:func:`job_words`), both read by ``parse_words``.

    Returns:
        (name → value, the environment variables the shell line set, which a study does not keep).
    """
    from autotune.yamlfile import NOT_YAML, parse_yaml, read_user_file

    # read once: a pipe (--fixed <(cat job.sh)) has no second reading
    text = read_user_file(path, what="fixed-arguments", flag="--fixed")
    data = parse_yaml(text, path, what="fixed-arguments", flag="--fixed", other_syntax=True)
    if isinstance(data, dict) or data is None:
        return type_mapping(_fixed_mapping(data, Path(path))), []
    if isinstance(data, list) and all(isinstance(w, str) for w in data):
        return parse_words(data), []
    if data is not NOT_YAML and not isinstance(data, str):
        raise UsageError(
            f"fixed-arguments file {path} is neither a mapping, a list of arguments nor a command line",
            hint="Write one 'name: value' per line, or the command line of your job",
        )
    # a shell line (YAML reads it as one string, or not at all)
    words, env = shell_line_words(text, path, command)
    return parse_words(words), env


def load_fixed(path: Path | str | None = None, argv: Sequence[str] = ()) -> dict[str, Any]:
    """The fixed arguments of a study: the YAML file's and those after ``--`` (see :func:`merge_fixed`).

    Args:
        path: a YAML file mapping flag names to values, or None.
        argv: the items after ``--`` on autotune's command line.

    Returns:
        flag name → value.

    Raises:
        UsageError: see :func:`read_fixed_file` and :func:`parse_flag_argv`.
    """
    fixed = read_fixed_file(path) if path is not None else {}
    return merge_fixed(fixed, f"--fixed {path}", parse_flag_argv(argv), JOB_ARGS_PLACE)


def split_baseline(
    fixed: Mapping[str, object], knob_names: Iterable[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Separate the user's own knob settings from the truly fixed arguments.

    Args:
        fixed: flag name → value (from :func:`load_fixed`).
        knob_names: the knobs of the search space.

    Returns:
        ``(rest, baseline)``: the arguments that stay fixed, and the knob values of the user's current
        configuration (trial 0). Values from argv are still text here; the space's types apply later.
    """
    knobs = set(knob_names)
    rest = {k: v for k, v in fixed.items() if k not in knobs}
    baseline = {k: v for k, v in fixed.items() if k in knobs}
    return rest, baseline


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}
_NONE = {"none", "null", "~", ""}


def knob_text(text: str, typ: str) -> Any:
    """A knob value typed on a command line, read as its knob's type (``"4"`` → 4, ``"on"`` → True,
    ``"none"`` → None; text for a ``str`` knob).

    Raises:
        ValueError: text that is not of that type.
    """
    text = text.strip()
    low = text.lower()
    if low in _NONE:
        return None
    if typ == "bool":
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(text)
    if typ == "int":
        return int(text)
    if typ == "float":
        return float(text)
    return text


def _coerce_text(name: str, value: object, typ: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return knob_text(value, typ)
    except ValueError:
        raise UsageError(
            f"--{name} {value!r} is not a valid {typ}", hint=f"Give --{name} a {typ} value"
        ) from None


def coerce_knob_values(values: Mapping[str, object], space: SearchSpace) -> dict[str, Any]:
    """Give the user's knob settings (text when they came from argv) the types of the space's knobs.

    ``"4"`` becomes ``4`` for an int knob, ``"true"`` becomes ``True`` for a bool knob, ``"none"`` becomes
    ``None``. Values already typed (from YAML) are kept. Knobs the space does not have are kept as given.

    Raises:
        UsageError: a value that cannot be read as its knob's type.
    """
    out: dict[str, Any] = {}
    for name, value in values.items():
        out[name] = _coerce_text(name, value, space[name].type) if name in space else value
    return out


def parse_pins(items: Sequence[str], space: SearchSpace) -> dict[str, Any]:
    """``--pin name=value`` items → knob name → value, each value read with its knob's type.

    Names the space does not have are kept as given (text) for :meth:`SearchSpace.pin` to refuse with
    the list of knobs.

    Raises:
        UsageError: an item that is not ``name=value``, a value that is not of the knob's type, or one
            knob pinned to two values.
    """
    pins: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        name = flag_name(name.strip()) if name.strip() else ""
        if not sep or not name:
            raise UsageError(f"--pin {item!r} is not name=value", hint="Write e.g. --pin zero_stage=2")
        value: Any = raw
        if name in space:
            try:
                value = knob_text(raw, space[name].type)
            except ValueError:
                raise UsageError(
                    f"--pin {name}={raw}: not a valid {space[name].type}",
                    hint=f"Allowed: {space[name].describe_values()}",
                ) from None
        if name in pins and pins[name] != value:
            raise UsageError(
                f"--pin {name} given twice ({pins[name]!r} and {value!r})", hint="Pin a knob to one value"
            )
        pins[name] = value
    return pins
