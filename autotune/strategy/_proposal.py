"""What ``auto`` proposes, and why (:class:`ScoredProposal`), and the move from the incumbent."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autotune.space import canonical_key
from autotune.strategy._base import Proposal

__all__ = ["ScoredProposal", "move_from"]


@dataclass(frozen=True)
class ScoredProposal(Proposal):
    """The configuration ``auto`` would run next, and why.

    Attributes:
        params: the configuration.
        mode: ``explore`` (the best candidate of the whole space), ``refine`` (a one- or two-knob
            change of the incumbent) or ``probe`` (a move onto a suspect value).
        predicted_throughput: the model's median throughput for it (completions/s), when known.
        expected_gain_frac: expected improvement over the best usable trial × probability of success,
            as a fraction of the best; None while no trial is usable.
        failure_risk: the model's probability that it fails or cannot be recommended.
        incumbent: the best usable trial's number when it was chosen.
        move: the knobs it sets differently from the incumbent: name → (incumbent's value, new value).
        suspect: the suspect values a probe tests.
        covers: the screened knobs' values a screening run was chosen for.
        memory_probe: a screening run that tests the memory gate itself (the only way to a level the
            gate refuses everywhere): the study launches it up to its probe margin.
    """

    mode: str = "explore"
    predicted_throughput: float | None = None
    expected_gain_frac: float | None = None
    failure_risk: float = 0.0
    incumbent: int | None = None
    move: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    suspect: str | None = None
    covers: dict[str, Any] = field(default_factory=dict)
    memory_probe: bool = False

    def choice(self) -> dict[str, Any]:
        """Why this configuration was chosen, as stored with its trial (``TrialResult.choice``)."""
        return {
            "mode": self.mode,
            "predicted_throughput": self.predicted_throughput,
            "expected_gain_frac": self.expected_gain_frac,
            "failure_risk": round(self.failure_risk, 4),
            "incumbent": self.incumbent,
            "move": {k: [a, b] for k, (a, b) in self.move.items()},
            **({"suspect": self.suspect} if self.suspect else {}),
            **({"covers": self.covers} if self.covers else {}),
            **({"memory_probe": True} if self.memory_probe else {}),
        }


def move_from(incumbent: Mapping[str, object], params: Mapping[str, object]) -> dict[str, tuple[Any, Any]]:
    """The knobs ``params`` sets differently from ``incumbent``: name → (incumbent's value, new value)."""
    out: dict[str, tuple[Any, Any]] = {}
    for name in dict.fromkeys([*incumbent, *params]):
        a, b = incumbent.get(name), params.get(name)
        if canonical_key({"v": a}) != canonical_key({"v": b}):
            out[name] = (a, b)
    return out
