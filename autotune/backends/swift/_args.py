"""Which ``swift rlhf`` flags each ms-swift version accepts, and how values become argv items.

Facts read from ms-swift's own source at its release tags (``swift/llm/argument`` in 3.x,
``swift/arguments`` + ``swift/rlhf_trainers/args_mixin.py`` in 4.x):

- ``--train_type`` (3.0 – 4.0.x) became ``--tuner_type`` (4.0.0; 4.0.x still took ``--train_type`` with a
  deprecation warning, 4.1.0 removed it).
- ``--vllm_mode``, ``--vllm_tensor_parallel_size``, ``--generation_batch_size`` and
  ``--steps_per_generation`` exist from 3.5.0; before that GRPO's vLLM used ``--vllm_device`` and
  ``--num_infer_workers`` (removed in 3.6.0). ``--tensor_parallel_size`` was removed in 3.10.0 and
  ``--gc_collect_after_offload`` in 3.10.0.
- ``--vllm_mode`` defaulted to ``colocate`` until 3.11.0; from 3.11.1 it has no default, ``--use_vllm true``
  without it raises, and ``--vllm_mode`` with ``--use_vllm false`` raises too.
- The speed key of the log changed from ``train_speed(iter/s)`` (global_step / elapsed) to
  ``train_speed(s/it)`` (elapsed / steps since start) in 3.12.5 — within 3.x, not at 4.0.

The table is what autotune *emits*; whether the installed version knows an arbitrary flag (the user's
fixed ones) is answered exactly by :func:`introspect_flag_names`, which asks the installed argument
dataclasses.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from autotune.errors import BackendError

__all__ = [
    "FLAG_HISTORY",
    "MIN_VERSION",
    "FlagSpan",
    "SwiftFlags",
    "Version",
    "flag_items",
    "introspect_flag_names",
    "parse_version",
]

Version = tuple[int, int, int]

#: the oldest ms-swift whose GRPO flags autotune can render (vllm_mode, vllm_tensor_parallel_size).
MIN_VERSION: Version = (3, 5, 0)


def parse_version(text: str) -> Version:
    """``"4.6.0"`` → ``(4, 6, 0)``; suffixes such as ``.dev0`` or ``rc1`` are ignored.

    Raises:
        BackendError: when ``text`` has no leading ``major.minor``.
    """
    m = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not m:
        raise BackendError(f"cannot read the ms-swift version {text!r}", hint="Reinstall ms-swift")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def _fmt(v: Version) -> str:
    return ".".join(str(p) for p in v)


@dataclass(frozen=True)
class FlagSpan:
    """The versions in which one flag exists: ``since`` ≤ version < ``until``.

    Attributes:
        name: flag name without dashes.
        since: first version that accepts it.
        until: first version that no longer accepts it (None: still accepted).
        replaced_by: the flag to use instead, when it was renamed.
    """

    name: str
    since: Version
    until: Version | None = None
    replaced_by: str | None = None

    def accepted(self, version: Version) -> bool:
        return self.since <= version and (self.until is None or version < self.until)


FLAG_HISTORY: tuple[FlagSpan, ...] = (
    FlagSpan("train_type", (3, 0, 0), (4, 1, 0), replaced_by="tuner_type"),
    FlagSpan("tuner_type", (4, 0, 0)),
    FlagSpan("tensor_parallel_size", (3, 0, 0), (3, 10, 0), replaced_by="vllm_tensor_parallel_size"),
    FlagSpan("gc_collect_after_offload", (3, 2, 1), (3, 10, 0)),
    FlagSpan("num_infer_workers", (3, 2, 0), (3, 6, 0)),
    FlagSpan("vllm_device", (3, 1, 1), (3, 6, 0)),
    FlagSpan("use_vllm", (3, 1, 1)),
    FlagSpan("vllm_gpu_memory_utilization", (3, 1, 1)),
    FlagSpan("external_plugins", (3, 1, 1)),
    FlagSpan("async_generate", (3, 2, 0)),
    FlagSpan("sleep_level", (3, 2, 1)),
    FlagSpan("move_model_batches", (3, 2, 1)),
    FlagSpan("offload_optimizer", (3, 2, 1)),
    FlagSpan("offload_model", (3, 2, 1)),
    FlagSpan("dataloader_num_workers", (3, 0, 0)),
    FlagSpan("vllm_server_host", (3, 3, 1)),
    FlagSpan("vllm_mode", (3, 5, 0)),
    FlagSpan("vllm_tensor_parallel_size", (3, 5, 0)),
    FlagSpan("vllm_server_base_url", (3, 5, 0)),
    FlagSpan("generation_batch_size", (3, 5, 0)),
    FlagSpan("steps_per_generation", (3, 5, 0)),
)
_BY_NAME = {span.name: span for span in FLAG_HISTORY}


@dataclass(frozen=True)
class SwiftFlags:
    """The flag vocabulary of one ms-swift version."""

    version: Version

    @classmethod
    def for_version(cls, text: str) -> SwiftFlags:
        return cls(parse_version(text))

    @property
    def label(self) -> str:
        return _fmt(self.version)

    @property
    def tuner_flag(self) -> str:
        """``tuner_type`` from 4.0, ``train_type`` before."""
        return "tuner_type" if self.version >= (4, 0, 0) else "train_type"

    @property
    def speed_key(self) -> str:
        """The log key of the training speed this version writes."""
        return "train_speed(s/it)" if self.version >= (3, 12, 5) else "train_speed(iter/s)"

    @property
    def vllm_mode_required(self) -> bool:
        """From 3.11.1 ``--use_vllm true`` needs ``--vllm_mode`` (no default any more)."""
        return self.version >= (3, 11, 1)

    def accepts(self, name: str) -> bool | None:
        """True/False when the table knows ``name``; None when it does not (ask the installed source)."""
        span = _BY_NAME.get(name)
        return None if span is None else span.accepted(self.version)

    def refusal(self, name: str) -> str | None:
        """Why this version refuses ``name`` (one sentence with what to use instead), or None."""
        span = _BY_NAME.get(name)
        if span is None or span.accepted(self.version):
            return None
        if span.until is None or self.version < span.since:
            return f"--{name} needs ms-swift {_fmt(span.since)} or newer (installed: {self.label})"
        instead = f"; use --{span.replaced_by}" if span.replaced_by else ""
        return f"--{name} was removed in ms-swift {_fmt(span.until)} (installed: {self.label}){instead}"

    def translate(self, name: str) -> str:
        """The spelling of ``name`` this version accepts (``train_type`` ↔ ``tuner_type``)."""
        if name in ("train_type", "tuner_type"):
            return self.tuner_flag
        return name


def flag_items(name: str, value: object) -> list[str]:
    """argv items for one flag: booleans as ``true``/``false``, lists as several items, dicts as JSON.

    ``None`` means "not set" and gives no items.
    """
    if value is None:
        return []
    flag = f"--{name}"
    if isinstance(value, bool):
        return [flag, "true" if value else "false"]
    if isinstance(value, (list, tuple)):
        return [flag, *(_scalar(v) for v in value)]
    if isinstance(value, Mapping):
        return [flag, json.dumps(dict(value), ensure_ascii=False)]
    return [flag, _scalar(value)]


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return format(value, ".10g")  # 0.35 rather than 0.35000000000000003 from a stepped range
    return str(value)


_INTROSPECT = """
import dataclasses, json
try:
    from swift.arguments import RLHFArguments
except ImportError:
    from swift.llm import RLHFArguments
print("AUTOTUNE_FLAGS " + json.dumps(sorted(f.name for f in dataclasses.fields(RLHFArguments))))
"""


def introspect_flag_names(python: str, *, timeout_s: float = 300.0) -> frozenset[str]:
    """Every flag ``swift rlhf`` accepts in the installation of ``python``: the fields of its
    ``RLHFArguments`` dataclass (ms-swift parses argv with HfArgumentParser over exactly these).

    Imports ms-swift in a child process (10–20 s: it imports torch and transformers).

    Raises:
        BackendError: the child fails or prints no field list.
    """
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    try:
        proc = subprocess.run(
            [python, "-c", _INTROSPECT],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendError(
            f"cannot list ms-swift's arguments with {python}: {exc}", hint="Check the ms-swift installation"
        ) from None
    for line in proc.stdout.splitlines():
        if line.startswith("AUTOTUNE_FLAGS "):
            return frozenset(json.loads(line.split(" ", 1)[1]))
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    raise BackendError(
        f"cannot list ms-swift's arguments with {python} (exit {proc.returncode}: {last})",
        hint="Check that `swift rlhf --help` works in that environment",
    )
