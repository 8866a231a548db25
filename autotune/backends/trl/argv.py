"""A TRL job's arguments read by ``trl grpo``'s own parser, so they have the types TRL gives them.

``trl grpo`` builds its parser with ``trl.scripts.grpo.make_parser()`` (TRL's ``HfArgumentParser`` over
``GRPOScriptArguments``, ``GRPOConfig``, ``ModelConfig`` and ``DatasetMixtureConfig``), reads a YAML with
``set_defaults_with_config`` and hands what that parser leaves to ``accelerate launch`` (after
``resolve_accelerate_config_argument``). The same three steps read a study's job here:

- the flags after ``--`` (``--beta 0.04 --learning_rate 1e-5``) come back as TRL types them (floats);
- a ``--fixed`` mapping's values come back as TRL reads that YAML (``learning_rate: 1e-5`` is a float);
- a name neither TRL nor accelerate knows is refused in one line with the nearest argument of both
  (:class:`~autotune.fixed.UnknownFlag`), before any trial.

Only the names given are returned (every other default is TRL's business, not the study's).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from autotune.errors import BackendError, UsageError
from autotune.fixed import UnknownFlag

__all__ = ["parse_trl_argv", "type_trl_mapping"]

_PROG = "trl grpo"
_SCRIPT = "train.py"  # the positional `accelerate launch` needs after its own options


def _only_given(parser: argparse.ArgumentParser, place: str) -> argparse.ArgumentParser:
    """``parser`` with every default suppressed and nothing required: the namespace holds only what was
    given, and argparse's errors become one :class:`UsageError` line instead of an exit with usage text.
    Abbreviations are off: ``--learning 1e-5`` must not quietly become ``learning_rate``, and autotune's
    own ``--out`` must not read as TRL's ``--output_dir``."""
    for action in parser._actions:  # noqa: SLF001 - TRL's own set_defaults_with_config walks them too
        if action.dest != "help":
            action.default = argparse.SUPPRESS
            action.required = False
    parser.allow_abbrev = False

    def refuse(message: str) -> NoReturn:
        raise UsageError(
            f"{place}: {_PROG} refuses it: {message}", hint="Check the value against `trl grpo --help`"
        )

    parser.error = refuse  # type: ignore[method-assign]
    return parser


def _grpo_parser(place: str) -> argparse.ArgumentParser:
    try:
        from trl.scripts.grpo import make_parser
    except Exception as exc:  # noqa: BLE001 - a TRL without its CLI (or a broken install)
        raise BackendError(
            f"cannot read the TRL job's arguments: trl's parser does not import ({exc})",
            hint="Install it with: pip install 'autotune-grpo[trl]'",
        ) from None
    return _only_given(make_parser(prog=_PROG), place)


def _launch_parser(place: str) -> argparse.ArgumentParser:
    from accelerate.commands.launch import launch_command_parser

    return _only_given(launch_command_parser(), place)


def _names(parser: argparse.ArgumentParser) -> list[str]:
    return [
        opt.lstrip("-")
        for action in parser._actions  # noqa: SLF001 - the parser's option strings, for "did you mean"
        for opt in action.option_strings
        if opt.startswith("--") and opt != "--help"
    ]


def _unknown(rest: Sequence[str], grpo: argparse.ArgumentParser, place: str) -> None:
    """Refuse the first option of ``rest`` that neither TRL nor ``accelerate launch`` knows."""
    launch = _launch_parser(place)
    known = set(_names(launch)) | {"accelerate_config"}
    for item in rest:
        name = item.lstrip("-").split("=", 1)[0]
        if item.startswith("--") and name not in known:
            raise UnknownFlag(name, [*_names(grpo), *sorted(known)], framework=_PROG, place=place)
    if rest and not rest[0].startswith("--"):
        raise UsageError(
            f"{place}: {rest[0]!r} belongs to no argument of {_PROG}",
            hint="Write the job's arguments as --name value",
        )


def _launch_args(rest: Sequence[str], place: str) -> dict[str, Any]:
    """The ``accelerate launch`` options among ``rest``, typed by accelerate's parser."""
    if not rest:
        return {}
    from trl.cli.accelerate_config import resolve_accelerate_config_argument

    try:
        resolved = resolve_accelerate_config_argument(list(rest))
    except ValueError as exc:
        raise UsageError(f"{place}: {exc}", hint="Name an accelerate config file or a TRL preset") from None
    namespace, _ = _launch_parser(place).parse_known_args([*resolved, _SCRIPT])
    given = vars(namespace)
    for name in ("training_script", "training_script_args", "nondefault"):  # the launcher's own records
        given.pop(name, None)
    if "accelerate_config" in (item.lstrip("-") for item in rest):
        given["accelerate_config"] = given.pop("config_file", None)
    return given


def parse_trl_argv(argv: Sequence[str], place: str) -> dict[str, Any]:
    """The job's flags (``--beta 0.04 --learning_rate 1e-5``) as ``trl grpo`` parses them.

    Args:
        argv: the items, as the shell split them.
        place: where they were given, for messages (``your arguments after --``).

    Returns:
        name → value for each argument given: TRL's fields typed by TRL, accelerate's by accelerate.

    Raises:
        UnknownFlag: a name neither parser knows, with the nearest argument.
        UsageError: a value the parser refuses (``--beta abc``).
    """
    if not argv:
        return {}  # nothing to read: TRL (seconds to import) is not asked
    grpo = _grpo_parser(place)
    namespace, rest = grpo.parse_known_args(list(argv))
    _unknown(rest, grpo, place)
    return {**vars(namespace), **_launch_args(rest, place)}


def type_trl_mapping(args: Mapping[str, object], place: str) -> dict[str, Any]:
    """A ``trl grpo --config`` YAML's mapping as TRL reads it (``set_defaults_with_config``).

    Raises:
        UnknownFlag: a key neither TRL nor ``accelerate launch`` knows, with the nearest argument.
        UsageError: a value the parser refuses.
    """
    if not args:
        return {}
    grpo = _grpo_parser(place)
    rest = grpo.set_defaults_with_config(**args)  # type: ignore[attr-defined]  # TrlParser's
    _unknown(rest[::2], grpo, place)
    namespace, _ = grpo.parse_known_args([])
    typed = vars(namespace)
    return {name: typed.get(name, value) for name, value in args.items()}
