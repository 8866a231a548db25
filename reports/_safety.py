"""What keeps foreign text safe to publish: secrets removed, absolute paths made relative.

Every string that reaches a report from a log, a command line or a settings file passes through one
:class:`Sanitizer`. What counts as a secret is :mod:`autotune.secrets` (the one rule every file autotune
writes follows); this module adds the paths. HTML escaping is the templates' job (Jinja autoescape) and, for chart data, the
JSON embedding in :mod:`reports.charts`; this module only removes what must never be shown at all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from autotune.plaintext import plain
from autotune.secrets import MASK, SecretRule

__all__ = ["Sanitizer", "is_secret_name", "MASK"]


def is_secret_name(name: str) -> bool:
    """True when an environment variable or option name looks like it holds a secret (the built-in rule)."""
    return SecretRule().is_secret_name(name)


class Sanitizer:
    """Removes secrets and makes paths relative to a study directory.

    Args:
        roots: absolute directories that stand for the study directory (where it is now, and where it
            was when its files were written); each becomes a relative path.
        secret_values: literal values that must never appear (for example the values of secret-named
            variables in the environment and in the trials' launch plans).
    """

    def __init__(
        self,
        roots: Iterable[str | Path] = (),
        secret_values: Iterable[str] = (),
        *,
        secret_names: Iterable[str] = (),
    ) -> None:
        cleaned = {str(r).rstrip("/") for r in roots if str(r).rstrip("/") not in ("", ".")}
        self._roots = sorted(cleaned, key=len, reverse=True)
        self.rule = SecretRule(secret_names, secret_values)

    @classmethod
    def for_study(
        cls,
        roots: Iterable[str | Path],
        env_maps: Iterable[Mapping[str, str]] = (),
        *,
        environ: Mapping[str, str] | None = None,
        secret_names: Iterable[str] = (),
    ) -> Sanitizer:
        """A sanitizer that also knows the secret values of ``environ`` and of the given env maps, and
        the names the study declared secret (``--secret-arg``)."""
        rule = SecretRule.for_environment(secret_names, env_maps, environ=environ)
        return cls(roots, rule.values, secret_names=rule.extra_names)

    def clean(self, text: object) -> str:
        """``text`` as a string with secrets masked and the study directory made relative."""
        if text is None:
            return ""
        out = plain(self.rule.mask(text))
        for root in self._roots:
            out = re.sub(re.escape(root) + r"""(?=/|$|[\s'"`,;:)\]}])/?""", _relative_repl, out)
        return out

    def clean_command(self, text: object) -> str:
        """A command line as the user typed it, secrets masked: its paths stay as given (the study's own
        ``--out /tmp/q7`` must not read ``--out .``)."""
        return "" if text is None else plain(self.rule.mask(text))

    def clean_value(self, value: object) -> object:
        """Like :meth:`clean` for strings; numbers, booleans and None pass unchanged."""
        if value is None or isinstance(value, bool | int | float):
            return value
        return self.clean(value)


def _relative_repl(match: re.Match[str]) -> str:
    # "<root>/trials/3" -> "trials/3"; "<root>" alone -> "."
    return "" if match.group(0).endswith("/") else "."
