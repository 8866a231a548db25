"""The one rule for secrets: what holds one, and how every file and line autotune writes hides it.

A secret is:

- the value of an argument whose name looks like a token, key, password or secret: ``--hf_token X``,
  ``--wandb-key=X``, hydra-style ``a.b.api_key=X``, env-like ``HF_TOKEN=X`` (names: :data:`SECRET_WORDS`,
  or ``…_KEY``; ``max_new_tokens`` and ``TOKENIZERS_PARALLELISM`` are not secret names), plus the names
  the user adds (``--secret-arg NAME``);
- a URL's password (``postgresql://user:PASSWORD@host/db``);
- a value in a well-known credential format (``hf_…``, ``sk-…``, ``ghp_…``, ``AKIA…``, JWTs);
- a value the rule was told about (the values of secret-named environment variables, of the
  arguments above once seen).

It is written two ways. In records and text (``launch.json``, ``study.json``, reports, the live view,
exported JSON and YAML, messages) as :data:`MASK`. In scripts (``trials/N/command.sh``,
``best/command.sh``, ``autotune export`` scripts, the "resume with" line) as a reference to an
environment variable the user exports first: ``--hf_token "${HF_TOKEN}"``. The variable is
:func:`env_name` of the argument's name (``--hf_token`` → ``HF_TOKEN``, ``--wandb-key`` →
``WANDB_KEY``, ``a.b.api_key`` → ``A_B_API_KEY``); a URL's password is ``<NAME>_PASSWORD``
(``--storage`` → ``STORAGE_PASSWORD``; ``URL_PASSWORD`` when no argument names it).

The process a trial runs still receives the real values: it is started from the plan in memory, never
from a written file.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MASK",
    "SECRET_WORDS",
    "Piece",
    "SecretRule",
    "env_name",
]

MASK = "***"

# A secret word ends its name or is followed by a separator: HF_TOKEN, api-key, WANDB_API_KEY, but not
# num_tokens, max_new_tokens or TOKENIZERS_PARALLELISM.
SECRET_WORDS = (
    r"(?:TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|API[_-]?KEY|ACCESS[_-]?KEY|PRIVATE[_-]?KEY|CREDENTIALS?"
    r"|AUTH[_-]?KEY|COOKIE)(?![A-Za-z])"
)
# the secret word ends the name: hf_token, wandb_api_key, but not ppo_max_token_len_per_gpu
_SECRET_NAME = re.compile(rf"{SECRET_WORDS}$|(?:^|_)KEY$", re.IGNORECASE)
# Token formats that are secret wherever they appear.
_TOKENS = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,}|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,})"
)
# scheme://user:password@host (a scheme starts a word: tried once per word, not at every letter of a long one)
_URL_CREDENTIALS = re.compile(
    r"(?P<head>(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]+):(?P<value>[^/\s@]+)@"
)
# an argv item that assigns: NAME=value, a.b.name=value, +a.b=value (hydra), --name=value
_ARG_ASSIGN = re.compile(r"^(?P<name>-{0,2}[+~]{0,2}[A-Za-z_][A-Za-z0-9_.\-]*)=(?P<value>.*)$", re.DOTALL)
# values that are flags of a boolean option, never credentials (--use_auth_token true)
_NOT_SECRET_VALUES = frozenset({"", "true", "false", "none", "null", "yes", "no", "0", "1"})
_MIN_SECRET_LEN = 6
# autotune's own option that names secrets holds a name, not a secret
_NOT_SECRET_NAMES = frozenset({"secret_arg", "secret_args"})


def env_name(name: str) -> str:
    """The environment variable a script reads a secret argument from (``--hf_token`` → ``HF_TOKEN``).

    The name without its leading dashes (or hydra ``+``/``~``), upper-cased, every run of other
    characters than letters and digits one ``_``; ``SECRET`` when nothing is left.
    """
    core = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_").upper()  # leading -, +, ~ become _, stripped
    if not core:
        return "SECRET"
    return f"_{core}" if core[0].isdigit() else core


def _normal(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


@dataclass(frozen=True)
class Piece:
    """One piece of an argv item: literal text, or a secret read from the variable ``env``."""

    text: str
    env: str | None = None

    @property
    def secret(self) -> bool:
        return self.env is not None


class SecretRule:
    """Finds secrets and writes them masked (records, text) or as variable references (scripts).

    Args:
        extra_names: argument or variable names the user declared secret (``--secret-arg``), on top of
            the built-in rule; compared without dashes and case (``--my-pass`` = ``MY_PASS``).
        values: literal secret values to mask wherever they appear (shorter than 6 characters are
            ignored: they would mask ordinary words).
    """

    def __init__(self, extra_names: Iterable[str] = (), values: Iterable[str] = ()) -> None:
        self.extra_names: tuple[str, ...] = tuple(sorted({_normal(n) for n in extra_names if _normal(n)}))
        found = {v for v in values if v and len(v) >= _MIN_SECRET_LEN and v.lower() not in _NOT_SECRET_VALUES}
        self.values: tuple[str, ...] = tuple(sorted(found, key=len, reverse=True))
        words = SECRET_WORDS
        if self.extra_names:
            extra = "|".join(
                r"[_.-]?".join(re.escape(p) for p in n.split("_")) + r"(?![A-Za-z0-9])"
                for n in self.extra_names
            )
            words = f"(?:{SECRET_WORDS}|(?<![A-Za-z0-9])(?:{extra}))"
        # NAME=value, NAME: value, "name": "value" where NAME looks secret.
        self._assignment = re.compile(
            rf"""(?P<name>\b[A-Za-z0-9_.-]*{words})(?P<q1>['"]?)(?P<sep>\s*[=:]\s*)"""
            r"""(?P<value>'[^'\n]*'|"[^"\n]*"|[^\s'",;}]+)""",
            re.IGNORECASE,
        )
        # --hub_token VALUE, --api-key=VALUE
        self._flag = re.compile(
            rf"""(?P<flag>--?[A-Za-z0-9_-]*{words})"""
            r"""(?P<sep>=|(?:[ \t]|\\\r?\n)+)(?P<value>'[^'\n]*'|"[^"\n]*"|[^\s'"]+)""",
            re.IGNORECASE,
        )

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def for_environment(
        cls,
        extra_names: Iterable[str] = (),
        env_maps: Iterable[Mapping[str, Any]] = (),
        *,
        environ: Mapping[str, str] | None = None,
    ) -> SecretRule:
        """A rule that also knows the values of the secret-named variables of ``environ`` (default: ours)
        and of ``env_maps`` (for example the trials' launch environments)."""
        names = tuple(extra_names)
        probe = cls(names)
        environ = os.environ if environ is None else environ
        values = [v for k, v in environ.items() if probe.is_secret_name(k)]
        for env in env_maps:
            values.extend(str(v) for k, v in env.items() if probe.is_secret_name(str(k)))
        return cls(names, values)

    def learning(self, argv: Sequence[str] = (), env: Mapping[str, str] | None = None) -> SecretRule:
        """This rule, also knowing the secret values found in ``argv`` and ``env`` (to mask them in any
        text: a log line, an error message)."""
        found = [p.text for item in self.pieces(argv) for p in item if p.secret]
        found += [v for k, v in (env or {}).items() if self.is_secret_name(k) or self.looks_secret(v)]
        return SecretRule(self.extra_names, (*self.values, *found))

    # -- what is secret -------------------------------------------------------------------------

    def is_secret_name(self, name: str) -> bool:
        """True when an argument or variable name looks like it holds a secret (``hub_token``,
        ``WANDB_API_KEY``, ``a.b.api_key``), or is one the user declared."""
        norm = _normal(name)
        if not norm or norm in _NOT_SECRET_NAMES:
            return False
        if _SECRET_NAME.search(norm):
            return True
        return any(norm == n or norm.endswith(f"_{n}") for n in self.extra_names)

    def looks_secret(self, value: object) -> bool:
        """True when a value (or an item of a list or mapping value) holds a credential: a known token
        format, a URL password, or a value this rule knows."""
        if isinstance(value, list | tuple):
            return any(self.looks_secret(v) for v in value)
        if isinstance(value, Mapping):
            return any(self.looks_secret(v) for v in value.values())
        if not isinstance(value, str):
            return False
        return bool(_TOKENS.search(value) or _URL_CREDENTIALS.search(value)) or any(
            v in value for v in self.values
        )

    def _secret_value(self, value: str) -> bool:
        return value.lower() not in _NOT_SECRET_VALUES

    # -- argv -----------------------------------------------------------------------------------

    def pieces(self, argv: Sequence[str]) -> list[list[Piece]]:
        """Each argv item split into literal pieces and secret pieces (with the variable each is read
        from in a script)."""
        out: list[list[Piece]] = []
        pending: str | None = None  # the previous item was a secret-named flag waiting for its value
        last_flag: str | None = None
        for item in argv:
            if pending is not None and not _is_flag(item) and self._secret_value(item):
                out.append([Piece(item, env_name(pending))])
                pending = None
                continue
            pending = None
            assign = _ARG_ASSIGN.match(item)
            if assign and self.is_secret_name(assign["name"]) and self._secret_value(assign["value"]):
                out.append([Piece(f"{assign['name']}="), Piece(assign["value"], env_name(assign["name"]))])
            elif _is_flag(item) and "=" not in item and self.is_secret_name(item):
                pending = item
                out.append([Piece(item)])
            else:
                owner = assign["name"] if assign else last_flag
                out.append(self._value_pieces(item, owner))
            if _is_flag(item):
                last_flag = item.partition("=")[0]
        return out

    def _value_pieces(self, item: str, owner: str | None) -> list[Piece]:
        """``item`` with the URL passwords, token-format values and known values in it as secret pieces."""
        spans: list[tuple[int, int, str]] = []
        base = env_name(owner) if owner else "URL"
        for m in _URL_CREDENTIALS.finditer(item):
            spans.append((m.start("value"), m.end("value"), f"{base}_PASSWORD"))
        for m in _TOKENS.finditer(item):
            spans.append((m.start(), m.end(), env_name(owner) if owner else "SECRET"))
        for value in (*self.values, MASK):  # a mask is a secret written before (a record read back)
            start = item.find(value)
            while start >= 0:
                spans.append((start, start + len(value), env_name(owner) if owner else "SECRET"))
                start = item.find(value, start + len(value))
        if not spans:
            return [Piece(item)]
        pieces: list[Piece] = []
        at = 0
        for start, end, var in sorted(spans, key=lambda span: span[0]):  # stable: URL passwords first
            if start < at:
                continue  # overlaps a span already taken
            if start > at:
                pieces.append(Piece(item[at:start]))
            pieces.append(Piece(item[start:end], var))
            at = end
        if at < len(item):
            pieces.append(Piece(item[at:]))
        return pieces

    def redact_argv(self, argv: Sequence[str]) -> tuple[str, ...]:
        """``argv`` with every secret piece replaced by :data:`MASK` (for records and text)."""
        return tuple("".join(MASK if p.secret else p.text for p in item) for item in self.pieces(argv))

    def script_words(self, argv: Sequence[str]) -> tuple[list[str], list[str]]:
        """``argv`` as shell words for a script, secrets read from variables (``"${HF_TOKEN}"``), and
        the variables used, in order."""
        words: list[str] = []
        used: list[str] = []
        for item in self.pieces(argv):
            parts = []
            for p in item:
                if p.env is None:
                    if p.text:
                        parts.append(shlex.quote(p.text))
                else:
                    parts.append(f'"${{{p.env}}}"')
                    if p.env not in used:
                        used.append(p.env)
            words.append("".join(parts) or "''")
        return words, used

    def script_line(self, argv: Sequence[str]) -> str:
        """``argv`` as one shell line with secrets read from variables (the "resume with" line)."""
        words, _ = self.script_words(argv)
        return " ".join(words)

    # -- environments, mappings, text -----------------------------------------------------------

    def redact_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """An environment with secret-named variables (and secret-looking values) masked."""
        return {
            k: MASK if self.is_secret_name(k) and self._secret_value(str(v)) else self.mask(str(v))
            for k, v in env.items()
        }

    def redact_mapping(self, args: Mapping[str, object]) -> dict[str, Any]:
        """Named arguments (``fixed:``) with the values of secret names, and secret values, masked."""
        out: dict[str, Any] = {}
        for name, value in args.items():
            if self.is_secret_name(str(name)) and not (
                isinstance(value, str) and not self._secret_value(value)
            ):
                out[name] = MASK if value is not None and not isinstance(value, bool) else value
            else:
                out[name] = self.mask_value(value)
        return out

    def mask_value(self, value: object) -> Any:
        """Like :meth:`mask` for strings, recursively through lists and mappings; other values unchanged."""
        if isinstance(value, str):
            return self.mask(value)
        if isinstance(value, list | tuple):
            return type(value)(self.mask_value(v) for v in value)
        if isinstance(value, Mapping):
            return self.redact_mapping(value)
        return value

    def mask(self, text: object) -> str:
        """``text`` as a string with every secret in it replaced by :data:`MASK`."""
        if text is None:
            return ""
        out = str(text)
        for value in self.values:
            out = out.replace(value, MASK)
        out = _URL_CREDENTIALS.sub(lambda m: f"{m['head']}:{MASK}@", out)
        out = self._flag.sub(
            lambda m: (
                m[0]
                if _normal(m["flag"]) in _NOT_SECRET_NAMES
                else f"{m['flag']}{m['sep']}{_mask_quoted(m['value'])}"
            ),
            out,
        )
        out = self._assignment.sub(
            lambda m: (
                m[0]
                if _normal(m["name"]) in _NOT_SECRET_NAMES
                else f"{m['name']}{m['q1']}{m['sep']}{_mask_quoted(m['value'])}"
            ),
            out,
        )
        return _TOKENS.sub(MASK, out)

    def redact_url(self, url: str | None) -> str | None:
        """A URL with its password masked (``postgresql://u:***@h/db``)."""
        return None if url is None else self.mask(url)


def _is_flag(item: str) -> bool:
    if not item.startswith("-") or item in ("-", "--"):
        return False
    try:
        float(item)
    except ValueError:
        return True
    return False


def _mask_quoted(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return f"{value[0]}{MASK}{value[0]}"
    if value.lower() in _NOT_SECRET_VALUES or value == MASK:
        return value
    return MASK
