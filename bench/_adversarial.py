"""Independent surfaces on which a prior is wrong in direction, for the search-efficiency bench.

The independent world (:mod:`_independent`) already owes nothing to autotune's estimator, but its
physics is the usual one: where it says a tensor-parallel size, a ZeRO stage, an offload or a sleep
level is slow, so does any model built on the same physics (the estimator included), and a search
that trusts its prior about those knobs does well. Real hardware is not always so kind (a slow
interconnect, a framework version whose offload path was rewritten, a vLLM build whose sleep mode is
cheap), and the held-out worlds of issue 29 showed what happens then: the search never measured the
optimum's values of the knobs that mattered.

An adversarial surface is an independent surface of the same seed's draw, reversed on one or two
*high-impact* knobs (the knobs that set vLLM's tensor-parallel size, the ZeRO stage, the optimizer or
model offload, the sleep level: found through the backend's knob roles):

- for each reversed knob, the independent world's own main effect of each level (the median log
  step time of its usable configurations) is turned around: the level that world finds slowest
  becomes the fastest by a random 15–60 % over each other level, so any prior that agrees with the
  ordinary physics is wrong in direction about that knob;
- the draw is repeated until the optimum is at least :data:`MIN_DISTANCE` knobs from the user's
  baseline;
- in a random share of the seeds (:data:`BASELINE_FAILS`) the baseline fails at vLLM start-up, as a
  conjunction of two of its knob values (the same conjunction fails elsewhere too).

Like the independent world it reads a configuration only through the framework's decoder and rules
(via :class:`~_independent.ConfigTable`) and never imports ``autotune.estimate``.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from _independent import ConfigTable, IndependentSurface

from autotune.space import canonical_key

__all__ = ["BASELINE_FAILS", "HIGH_IMPACT_ROLES", "MIN_DISTANCE", "AdversarialSurface"]

#: JobConfig roles whose knobs may be reversed (the backend names the knob of each)
HIGH_IMPACT_ROLES = ("vllm_tp", "zero_stage", "ds_offload_optimizer", "rollout_offload_model", "sleep_level")
#: knobs between the user's baseline and the optimum, at least
MIN_DISTANCE = 3
#: share of the seeds whose baseline fails at vLLM start-up
BASELINE_FAILS = 0.35
_DRAWS = 30  # attempts at a reversal whose optimum is far enough from the baseline


def knob_distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> int:
    """Knobs set differently in ``a`` and ``b`` (a knob absent on one side counts)."""
    return sum(
        canonical_key({"v": a.get(k)}) != canonical_key({"v": b.get(k)}) for k in dict.fromkeys([*a, *b])
    )


class AdversarialSurface(IndependentSurface):
    """An independent world reversed on one or two high-impact knobs (see the module docstring).

    Attributes:
        reversed: per reversed knob, the level made fastest (the one the plain world ranks last).
        baseline_fails: whether the user's baseline fails at start-up on this seed.

    Args:
        table: the setting's decoded configurations.
        seed: draws the independent world, the reversal and the baseline's failure.
    """

    def __init__(self, table: ConfigTable, seed: int) -> None:
        super().__init__(table, seed)
        rng = np.random.default_rng([seed, zlib.crc32(f"adversarial:{self.setting.name}".encode())])
        self._factor = np.ones(table.n_rows)
        self.reversed: dict[str, Any] = {}
        baseline = table.space.active(dict(self.setting.baseline))
        self.baseline_fails = bool(rng.uniform() < BASELINE_FAILS)
        if self.baseline_fails:
            self._fail_baseline(rng, baseline)
        plain = super()._evaluate(self._workers(baseline))
        log_step = np.log(plain["step"])
        usable = self._usable(plain)
        knobs = self._candidate_knobs(usable)
        for _ in range(_DRAWS):
            n = 1 if len(knobs) < 2 or rng.uniform() < 0.5 else 2
            chosen = [knobs[int(i)] for i in rng.choice(len(knobs), size=n, replace=False)]
            self._factor, self.reversed = self._reversal(chosen, log_step, usable, rng)
            self._cache.clear()
            best, _, _ = self.optimum()
            if knob_distance(best, baseline) >= MIN_DISTANCE:
                break

    def _workers(self, params: Mapping[str, Any]) -> int:
        return int(params.get("dataloader_num_workers", 0) or 0)

    def _candidate_knobs(self, usable: np.ndarray) -> list[str]:
        """High-impact knobs of the space with at least two levels that have usable configurations."""
        out = []
        for role in HIGH_IMPACT_ROLES:
            name = self.table.space.knob_for(role)
            if name is None or name not in self.table.knob_idx or name in out:
                continue
            idx = self.table.knob_idx[name]
            if len({int(i) for i in idx[usable] if i >= 0}) >= 2:
                out.append(name)
        return out

    def _reversal(
        self, knobs: list[str], log_step: np.ndarray, usable: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Per-row step-time factors that turn each knob's main effect around, and the promoted levels."""
        factor = np.ones(self.table.n_rows)
        promoted: dict[str, Any] = {}
        for name in knobs:
            idx = self.table.knob_idx[name]
            levels = sorted({int(i) for i in idx[usable] if i >= 0})
            median = {lv: float(np.median(log_step[usable & (idx == lv)])) for lv in levels}
            worst = max(levels, key=lambda lv: median[lv])
            promoted[name] = self.table.knob_values[name][worst]
            for lv in levels:
                if lv != worst:
                    # slower than the promoted level by 15-60 % on the median
                    gap = median[worst] - median[lv] + math.log(rng.uniform(1.15, 1.6))
                    factor = np.where(idx == lv, factor * math.exp(gap), factor)
        return factor, promoted

    def _fail_baseline(self, rng: np.random.Generator, baseline: Mapping[str, Any]) -> None:
        """A start-up failure on a conjunction of two of the baseline's knob values."""
        row = self.table.row(baseline)
        if row is None:
            return
        active = [k for k in self.table.knobs if self.table.knob_idx[k][row] >= 0]
        valid = self.table.cols["valid"] > 0
        for _ in range(50):
            pair = [active[int(i)] for i in rng.choice(len(active), size=2, replace=False)]
            terms = tuple((k, int(self.table.knob_idx[k][row])) for k in pair)
            mask = np.ones(self.table.n_rows, dtype=bool)
            for k, lv in terms:
                mask &= self.table.knob_idx[k] == lv
            if (mask & valid).sum() <= 0.2 * max(1, valid.sum()):
                self.regions.append((terms, "startup", "startup", 0))
                self._region_masks.append(mask)
                return

    def _evaluate(self, workers: int, rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
        ev = super()._evaluate(workers, rows)
        f = self._factor if rows is None else self._factor[rows]
        for name in ("rollout", "train", "weight_sync", "other", "step"):
            ev[name] = ev[name] * f
        ev["throughput"] = self.setting.global_batch / ev["step"]
        return ev
