"""Checks of the installed frameworks: which are there (versions from package metadata, nothing
imported) and whether the installed versions meet each other's own pins.

The pins are the frameworks' own: each installed distribution's ``Requires-Dist`` metadata (what its
``setup.py`` / ``pyproject.toml`` declares), read with ``importlib.metadata``, so the source of every
conflict reported is the installed package itself and the table never goes stale. For example TRL
1.16.0's METADATA declares ``vllm<=0.31.0,>=0.22.0; extra == "vllm"`` and ``transformers!=5.1.0;
extra == "deepspeed"``; vLLM's pins the exact ``torch==`` its kernels were built against; ms-swift's
and verl's bound the ``trl`` / ``transformers`` / ``vllm`` they were tested with. An extra of a framework
counts when the package it is named after is installed (TRL's ``[vllm]`` requirements bind once vLLM is
there).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from autotune.doctor._base import Check, Facts, Finding

__all__ = ["FrameworksCheck", "PinsCheck", "FRAMEWORKS", "WATCHED", "Conflict", "conflicts"]

#: the frameworks the doctor reports: distribution → the import package found without importing it
FRAMEWORKS: dict[str, str] = {
    "trl": "trl",
    "ms-swift": "swift",
    "verl": "verl",
    "vllm": "vllm",
    "deepspeed": "deepspeed",
    "flash-attn": "flash_attn",
}
#: distributions whose versions are read and whose pins on each other are checked
WATCHED: tuple[str, ...] = (*FRAMEWORKS, "torch", "transformers", "accelerate", "peft")
TRAINERS = ("trl", "ms-swift", "verl")


class FrameworksCheck(Check):
    """The frameworks installed, their versions, and whether their import package is there."""

    name = "frameworks"

    def run(self, facts: Facts) -> list[Finding]:
        if facts.interpreter is None:  # none to read, or unreadable: the interpreter check says which
            return []
        installed = {d: v for d, v in facts.packages.items() if d in FRAMEWORKS}
        broken = [d for d in installed if not facts.importable.get(d, True)]
        absent = [d for d in FRAMEWORKS if d not in installed]
        listed = ", ".join(f"{d} {v}" for d, v in installed.items()) or "none"
        missing = f"; not installed: {', '.join(absent)}" if absent else ""
        if broken:
            return [
                self.fail(
                    f"installed but without their import package: {', '.join(broken)} ({listed})",
                    f"Reinstall them: pip install --force-reinstall {' '.join(broken)}",
                )
            ]
        if not any(d in installed for d in TRAINERS):
            return [
                self.warn(
                    f"no GRPO trainer installed ({listed}{missing})",
                    "pip install 'autotune-grpo[trl]' (or [swift], [verl]); a --backend command search needs none",
                )
            ]
        return [self.ok(f"{listed}{missing}")]


@dataclass(frozen=True)
class Conflict:
    """One unmet pin: ``owner`` requires ``requirement`` and ``installed`` is what is there."""

    owner: str
    requirement: Requirement
    installed: str

    def __str__(self) -> str:
        return f"{self.owner} requires {self.requirement.name}{self.requirement.specifier}, installed {self.installed}"


def _binding(req: Requirement, installed: Iterable[str]) -> bool:
    """Whether a requirement applies here: its marker holds with no extra or with an extra named after
    an installed distribution."""
    if req.marker is None:
        return True
    extras = ["", *installed]
    return any(req.marker.evaluate({"extra": e}) for e in extras)


def conflicts(packages: Mapping[str, str], requirements: Mapping[str, tuple[str, ...]]) -> list[Conflict]:
    """Every pin of an installed watched distribution on another installed one that the installed
    version does not meet (local versions such as ``+cu124`` are compared without their tag)."""
    installed = {canonicalize_name(d): v for d, v in packages.items()}
    out: list[Conflict] = []
    for owner, lines in requirements.items():
        for line in lines:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            target = canonicalize_name(req.name)
            if target not in installed or target == canonicalize_name(owner) or not req.specifier:
                continue
            if not _binding(req, installed):
                continue
            try:
                version = Version(installed[target])
            except InvalidVersion:
                continue
            if not req.specifier.contains(version.public, prereleases=True):
                out.append(Conflict(owner, req, installed[target]))
    return out


class PinsCheck(Check):
    """Installed frameworks that do not meet each other's own pins (their ``Requires-Dist``)."""

    name = "pins"

    def run(self, facts: Facts) -> list[Finding]:
        if facts.interpreter is None:
            return []
        found = conflicts(facts.packages, facts.requirements)
        if found:
            first = found[0]
            return [
                self.fail(
                    "; ".join(str(c) for c in found),
                    f"pip install '{first.requirement.name}{first.requirement.specifier}' "
                    f"({first.owner}'s own pin), or a {first.owner} release made for {first.requirement.name} "
                    f"{first.installed}",
                )
            ]
        checked = [d for d in facts.requirements if d in facts.packages]
        return [self.ok(f"the pins of {', '.join(checked) or 'no framework'} hold")]
