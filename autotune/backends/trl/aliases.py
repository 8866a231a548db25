"""Argument names the installed transformers has renamed: write the current name, never the alias.

transformers marks a renamed ``TrainingArguments`` field by keeping the old name as a field whose help
says ``Deprecated alias of `new` `` (5.x: ``gradient_checkpointing`` → ``activation_checkpointing``), and
warns on every run that sets it. The TRL trials and the TRL export read the aliases from the installed
class itself, so a rename in a later release is followed without a table here, and an older release
(without the new name) keeps the old one.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["current_names", "deprecated_aliases", "installed_aliases"]

_ALIAS = re.compile(r"Deprecated alias of `([A-Za-z_][A-Za-z0-9_]*)`")


def deprecated_aliases(args_class: type) -> dict[str, str]:
    """Old name → new name of every field of the dataclass ``args_class`` whose help calls it a
    deprecated alias of another field of that class."""
    if not dataclasses.is_dataclass(args_class):
        return {}
    fields = {f.name: f for f in dataclasses.fields(args_class)}
    out: dict[str, str] = {}
    for name, f in fields.items():
        match = _ALIAS.search(str(f.metadata.get("help", "")))
        if match and match.group(1) in fields and match.group(1) != name:
            out[name] = match.group(1)
    return out


def installed_aliases() -> dict[str, str]:
    """The aliases of the installed transformers' ``TrainingArguments`` (none when it is not installed)."""
    try:
        from transformers import TrainingArguments
    except Exception:  # noqa: BLE001 - no transformers (or a broken one): nothing to rename
        return {}
    return deprecated_aliases(TrainingArguments)


def current_names(kwargs: Mapping[str, object], aliases: Mapping[str, str]) -> dict[str, Any]:
    """``kwargs`` with each deprecated name replaced by its current one (kept in place, in order); a
    value given under both names keeps the current name's."""
    out: dict[str, Any] = {}
    for name, value in kwargs.items():
        new = aliases.get(name)
        if new is None:
            out[name] = value
        elif new not in kwargs:
            out[new] = value
    return out
