"""Reading a user's YAML file with one-line errors (a missing or unreadable file, invalid YAML), bounded.

The one bounded YAML reader: a file larger than :data:`MAX_BYTES`, or whose aliases would expand it to
more than :data:`MAX_VALUES` values (a "billion laughs" bomb: each alias repeats a list of aliases), or
that nests deeper than Python can follow, is refused with one line before anything walks it. The
expanded size is counted on the composed node graph, where an alias is the node it names, so counting
costs as little as the file is long.
"""

from __future__ import annotations

from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from autotune.errors import UsageError

__all__ = ["MAX_BYTES", "MAX_VALUES", "NOT_YAML", "parse_yaml", "read_user_file", "read_yaml"]

#: what :func:`read_yaml` returns for a file that is not YAML when the caller accepts other syntaxes
NOT_YAML = object()

MAX_BYTES = 1 << 20  # 1 MiB: a search space or a job's fixed arguments is a few KiB
MAX_VALUES = 100_000  # scalars, lists and mappings once every alias is expanded


def read_yaml(
    source: Path | Traversable | str,
    *,
    what: str,
    flag: str,
    error: type[UsageError] = UsageError,
    other_syntax: bool = False,
) -> Any:
    """The parsed content of a YAML file (None for an empty one).

    Args:
        source: the file (a path, or a packaged resource).
        what: what the file is, for the message ("search-space", "--baseline").
        flag: the flag that named it, for the fix ("--space").
        error: the error class raised (a :class:`UsageError`).
        other_syntax: the file may be in another syntax (a shell line): invalid YAML returns
            :data:`NOT_YAML` instead of raising (every other refusal still raises).

    Raises:
        UsageError: (``error``) the file is missing or unreadable, is not valid YAML (with the line), is
            larger than :data:`MAX_BYTES`, or expands to more than :data:`MAX_VALUES` values.
    """
    text = read_user_file(source, what=what, flag=flag, error=error)
    return parse_yaml(text, source, what=what, flag=flag, error=error, other_syntax=other_syntax)


#: how long a pipe (``--fixed <(cat job.sh)``) may take to deliver its text
PIPE_WAIT_S = 10.0


def read_user_file(
    source: Path | Traversable | str, *, what: str, flag: str, error: type[UsageError] = UsageError
) -> str:
    """The UTF-8 text of a file the user named, read once, bounded (:data:`MAX_BYTES`), never blocking.

    A regular file is read as it is; a pipe (``<(cat job.sh)``) is read to its end within
    :data:`PIPE_WAIT_S`; a FIFO with no writer is empty, never waited on; a device is bounded like a file.

    Raises:
        UsageError: (``error``) missing, unreadable, not UTF-8, larger than :data:`MAX_BYTES`, or a pipe
            that delivers nothing within :data:`PIPE_WAIT_S`.
    """
    try:
        if isinstance(source, str | Path):
            raw = _read_path(Path(source), MAX_BYTES + 1)
        else:
            with source.open("rb") as fh:
                raw = fh.read(MAX_BYTES + 1)
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise error(f"{what} file {source} does not exist", hint=f"Check the {flag} path") from None
    except TimeoutError:
        raise error(
            f"{what} file {source} is a pipe that sent nothing within {PIPE_WAIT_S:g} s",
            hint=f"Pass a regular file with {flag}",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise error(f"cannot read {what} file {source}: {reason}", hint=f"Check the {flag} path") from None
    if len(raw) > MAX_BYTES:
        raise error(
            f"{what} file {source} is larger than {MAX_BYTES // (1 << 20)} MiB",
            hint=f"Pass a {what} file of a few KiB with {flag}",
        )
    return text


def _read_path(path: Path, limit: int) -> bytes:
    """At most ``limit`` bytes of ``path``; a pipe read to its end without ever blocking past a deadline."""
    import os
    import select
    import stat
    import time

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.set_blocking(fd, True)
            return os.read(fd, limit) if limit else b""
        chunks: list[bytes] = []
        size, deadline = 0, time.monotonic() + PIPE_WAIT_S
        while size < limit:
            try:
                chunk = os.read(fd, limit - size)
            except BlockingIOError:  # a writer that has not written yet: wait for it, to the deadline
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    raise TimeoutError from None
                continue
            if not chunk:
                break  # the writer closed it (or a FIFO had none: empty, never waited on)
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def parse_yaml(
    text: str,
    source: object,
    *,
    what: str,
    flag: str,
    error: type[UsageError] = UsageError,
    other_syntax: bool = False,
) -> Any:
    """``text`` (read by :func:`read_user_file` from ``source``) parsed as YAML, bounded; see :func:`read_yaml`."""
    import yaml

    try:
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError:  # a control character: the reader refuses the text before parsing
        raise error(
            f"{what} file {source} holds a control character ({_first_control(text)})",
            hint="Remove it (a YAML file is printable text)",
        ) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_duplicate_keys(node, source, what, error)
        values = _expanded_values(node)
        if values > MAX_VALUES:
            raise error(
                f"{what} file {source} expands to more than {MAX_VALUES} values through its aliases",
                hint="Write the values out instead of nesting aliases (&name / *name)",
            )
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        if other_syntax:
            return NOT_YAML
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise error(f"{what} file {source} is not valid YAML{at}", hint="Fix the YAML syntax") from None
    except RecursionError:
        raise error(
            f"{what} file {source} nests too deeply (or an alias contains itself)",
            hint="Flatten the YAML",
        ) from None
    finally:
        loader.dispose()


def _first_control(text: str) -> str:
    """Where the first character YAML refuses is, as ``U+0001 at line 3``."""
    import yaml

    found = yaml.reader.Reader.NON_PRINTABLE.search(text)
    if found is None:
        return "a character YAML cannot read"
    return f"U+{ord(found.group()[0]):04X} at line {text.count(chr(10), 0, found.start()) + 1}"


def _refuse_duplicate_keys(root: object, source: object, what: str, error: type[UsageError]) -> None:
    """Refuse a mapping that names one key twice (YAML would keep the last silently).

    Each node is visited once, so aliases cost nothing more.
    """
    import yaml

    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: set[str] = set()
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode):
                    if k.value in keys:
                        raise error(
                            f"{what} file {source} names {k.value[:80]!r} twice in one mapping "
                            f"(line {k.start_mark.line + 1})",
                            hint="Keep one of them: YAML would silently use the last",
                        )
                    keys.add(k.value)
                stack.extend((k, v))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)


def _expanded_values(root: object) -> int:
    """How many nodes the document has once every alias is expanded (stops counting past the bound).

    Raises:
        RecursionError: an alias that contains itself (its expansion never ends), or nesting deeper
            than Python's recursion limit.
    """
    import yaml

    memo: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: object) -> int:
        key = id(node)
        if key in memo:
            return memo[key]
        if key in open_nodes:
            raise RecursionError("an alias contains itself")
        open_nodes.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            for child in node.value:
                total += size(child)
                if total > MAX_VALUES:
                    break
        elif isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                total += size(k) + size(v)
                if total > MAX_VALUES:
                    break
        open_nodes.discard(key)
        memo[key] = total
        return total

    return size(root)
