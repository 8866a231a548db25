"""What keeps foreign text safe to publish: secrets removed, absolute paths made relative.

Every string that reaches a report from a log, a command line or a settings file passes through one
:class:`Sanitizer`. HTML escaping is the templates' job (Jinja autoescape) and, for chart data, the
JSON embedding in :mod:`reports.charts`; this module only removes what must never be shown at all.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["Sanitizer", "is_secret_name", "MASK"]

MASK = "***"

# A secret word ends its name or is followed by a separator: HF_TOKEN, api-key, WANDB_API_KEY, but not
# num_tokens, max_new_tokens or TOKENIZERS_PARALLELISM.
_SECRET_WORDS = (
    r"(?:TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|API[_-]?KEY|ACCESS[_-]?KEY|PRIVATE[_-]?KEY|CREDENTIALS?"
    r"|AUTH[_-]?KEY|COOKIE)(?![A-Za-z])"
)
_SECRET_NAME = re.compile(rf"{_SECRET_WORDS}|(?:^|_)KEY$", re.IGNORECASE)

# NAME=value, NAME: value, "name": "value" where NAME looks secret.
_ASSIGNMENT = re.compile(
    rf"""(?P<name>\b[A-Za-z0-9_.-]*{_SECRET_WORDS}[A-Za-z0-9_.-]*)(?P<q1>['"]?)(?P<sep>\s*[=:]\s*)"""
    r"""(?P<value>'[^'\n]*'|"[^"\n]*"|[^\s'",;}]+)""",
    re.IGNORECASE,
)
# --hub_token VALUE, --api-key=VALUE
_FLAG = re.compile(
    rf"""(?P<flag>--?[A-Za-z0-9_-]*{_SECRET_WORDS}[A-Za-z0-9_-]*)"""
    r"""(?P<sep>=|(?:[ \t]|\\\r?\n)+)(?P<value>'[^'\n]*'|"[^"\n]*"|[^\s'"]+)""",
    re.IGNORECASE,
)
# Token formats that are secret wherever they appear.
_TOKENS = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,}|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,})"
)
# scheme://user:password@host
_URL_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]+):(?P<value>[^/\s@]+)@")

_MIN_SECRET_LEN = 6


def is_secret_name(name: str) -> bool:
    """True when an environment variable or option name looks like it holds a secret."""
    return bool(_SECRET_NAME.search(name))


def _mask_quoted(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return f"{value[0]}{MASK}{value[0]}"
    return MASK


class Sanitizer:
    """Removes secrets and makes paths relative to a study directory.

    Args:
        roots: absolute directories that stand for the study directory (where it is now, and where it
            was when its files were written); each becomes a relative path.
        secret_values: literal values that must never appear (for example the values of secret-named
            variables in the environment and in the trials' launch plans).
    """

    def __init__(self, roots: Iterable[str | Path] = (), secret_values: Iterable[str] = ()) -> None:
        cleaned = {str(r).rstrip("/") for r in roots if str(r).rstrip("/") not in ("", ".")}
        self._roots = sorted(cleaned, key=len, reverse=True)
        values = {v for v in secret_values if v and len(v) >= _MIN_SECRET_LEN}
        self._values = sorted(values, key=len, reverse=True)

    @classmethod
    def for_study(
        cls,
        roots: Iterable[str | Path],
        env_maps: Iterable[Mapping[str, str]] = (),
        *,
        environ: Mapping[str, str] | None = None,
    ) -> Sanitizer:
        """A sanitizer that also knows the secret values of ``environ`` and of the given env maps."""
        environ = os.environ if environ is None else environ
        values = [v for k, v in environ.items() if is_secret_name(k)]
        for env in env_maps:
            values.extend(str(v) for k, v in env.items() if is_secret_name(str(k)))
        return cls(roots, values)

    def clean(self, text: object) -> str:
        """``text`` as a string with secrets masked and the study directory made relative."""
        if text is None:
            return ""
        out = str(text)
        for value in self._values:
            out = out.replace(value, MASK)
        out = _URL_CREDENTIALS.sub(lambda m: f"{m['head']}:{MASK}@", out)
        out = _FLAG.sub(lambda m: f"{m['flag']}{m['sep']}{_mask_quoted(m['value'])}", out)
        out = _ASSIGNMENT.sub(lambda m: f"{m['name']}{m['q1']}{m['sep']}{_mask_quoted(m['value'])}", out)
        out = _TOKENS.sub(MASK, out)
        for root in self._roots:
            out = re.sub(re.escape(root) + r"""(?=/|$|[\s'"`,;:)\]}])/?""", _relative_repl, out)
        return out

    def clean_value(self, value: object) -> object:
        """Like :meth:`clean` for strings; numbers, booleans and None pass unchanged."""
        if value is None or isinstance(value, bool | int | float):
            return value
        return self.clean(value)


def _relative_repl(match: re.Match[str]) -> str:
    # "<root>/trials/3" -> "trials/3"; "<root>" alone -> "."
    return "" if match.group(0).endswith("/") else "."
