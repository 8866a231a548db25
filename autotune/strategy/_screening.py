"""Screening: measure every level of the knobs that matter most before trusting the prior about them.

A prior (the estimator) that is wrong in direction about a high-impact knob keeps a search away from
that knob's better values for good: the phase model corrects what it has measured, and a knob value
that was never measured healthy is never corrected. So ``auto`` spends the first part of its budget on
a small *screening design* over the high-impact knobs, and only then exploits.

1. **Which knobs** (:func:`screened_knobs`): the knobs the framework's documentation names as the
   high-impact ones (through the backend's knob roles: vLLM's tensor-parallel size, the ZeRO stage,
   optimizer and model offload, the sleep level), ranked by how much the estimator itself says each
   moves the step time, then the estimator's other most sensitive knobs up to ``max_knobs``; only
   knobs of a few discrete levels (``max_levels``).
2. **The design** (:func:`balanced_design`): one row per screening run, each knob's levels balanced
   (every level as often as the run count allows) and the columns arranged so that pairs of levels
   meet as evenly as possible (a randomized near-orthogonal array: main effects are not aliased with
   one another).
3. **Runs** (:meth:`Screening.order`): each run first covers levels not yet measured healthy (a level
   that failed twice without a healthy run is given up), then matches the design row — whose columns
   also spread the levels of every *other* discrete knob (``balance_others``), so that a prior wrong
   about a knob outside the screened set is measured too — then follows the model's score (expected
   improvement × P(ok)). The caller checks candidates in that order against the validity rules, the
   OOM inference and the memory gate, so the other knobs are chosen to keep each run healthy
   (feasibility repair).
4. **Memory probe** (:meth:`Screening._memory_probe`): the memory gate is an estimate as well; a level
   no candidate reaches within it is tested once (``max_memory_probes``) at the most promising
   candidate predicted at most ``memory_probe_load`` × capacity, which the study launches within its
   probe margin. Its measured peak (or its OOM) calibrates the gate.
5. **Combine** (:meth:`Screening.best_levels`, off by default, ``combine``): one run that sets every
   screened knob to its best measured level (the level of its best healthy run), the rest by the model.

Screening ends when every reachable level was measured healthy and the design's share of the budget
is spent (``design_share``), or at ``cover_share`` of the budget at the latest. Everything is a function
of the trial history, so a resumed study screens the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune.records import TrialResult
from autotune.space import SearchSpace, canonical_key

__all__ = [
    "HIGH_IMPACT_ROLES",
    "SCREEN_MODES",
    "ScreenPick",
    "ScreenPlan",
    "ScreenState",
    "Screening",
    "ScreeningSettings",
    "balanced_design",
    "screened_knobs",
]

#: the JobConfig roles whose knobs the frameworks' documentation names as the ones that move a GRPO
#: step most (vLLM's engine split, ZeRO sharding, offload, vLLM's sleep between phases)
HIGH_IMPACT_ROLES = (
    "vllm_tp",
    "zero_stage",
    "ds_offload_optimizer",
    "rollout_offload_model",
    "rollout_offload_optimizer",
    "sleep_level",
)
#: the ``mode`` of a screening run and of the combination run, in ``TrialResult.choice``
SCREEN_MODES = ("screen", "combine")


@dataclass(frozen=True)
class ScreeningSettings:
    """How ``auto`` screens (see the module docstring).

    Attributes:
        max_knobs: knobs in the design at most.
        max_levels: a knob with more discrete values than this is not screened (a numeric range is
            the phase model's to learn).
        design_share: the share of the trial budget the design's runs may take.
        cover_share: the share of the trial budget by which every reachable level must have been
            measured (coverage runs go on past ``design_share`` until then).
        give_up_failures: failed runs after which a level never measured healthy is given up.
        budget_without_limit: the budget assumed without a trial budget (a time budget only).
        max_checks: candidates the caller checks against the pre-screen per run at most.
        memory_probe_load: a level no candidate reaches within the memory gate is tested at its
            most promising candidate whose predicted load (peak ÷ capacity) is at most this: the gate is an estimate too, and a level it misjudges may hold the optimum (the study
            launches such a *memory probe* up to its own probe margin).
        max_memory_probes: memory probes per study at most.
        combine: end screening with one run that sets every screened knob to its best measured level.
            Off by default: that level is the one of its best run, whose other knobs were not its own
            choice, and the model, which weighs every run against the prior, chose better on the
            bench's tuning seeds (0-3, 8 surfaces: median regret@12 12.8 % against 16.6 %).
        balance_others: spread the levels of the other discrete knobs (2 to ``max_levels`` values)
            over the design's runs as well, so that a knob the prior misjudges outside the screened
            set is measured at more than its default before the search exploits.
        match_weight: the weight of one design-row match against one newly covered level.
    """

    max_knobs: int = 5
    max_levels: int = 8
    design_share: float = 0.5
    cover_share: float = 0.75
    give_up_failures: int = 2
    budget_without_limit: int = 20
    max_checks: int = 400
    balance_others: bool = True
    match_weight: float = 0.25
    memory_probe_load: float = 1.3
    max_memory_probes: int = 1
    combine: bool = False


@dataclass(frozen=True)
class ScreenPlan:
    """The knobs screened, their levels, and the design's rows (level indices per knob).

    ``balanced`` and ``balanced_levels``: the other discrete knobs, whose levels the design spreads
    over the same rows (their columns follow the screened ones in ``design``) without requiring each
    level measured: the runs then teach the model those knobs' main effects too.
    """

    knobs: tuple[str, ...]
    levels: tuple[tuple[Any, ...], ...]
    design: tuple[tuple[int, ...], ...]
    balanced: tuple[str, ...] = ()
    balanced_levels: tuple[tuple[Any, ...], ...] = ()

    def row_keys(self, row: Sequence[int]) -> set[tuple[str, str]]:
        """The (knob, value key) pairs a design row asks for, screened and balanced knobs alike."""
        names = (*self.knobs, *self.balanced)
        values = (*self.levels, *self.balanced_levels)
        return {
            (k, canonical_key({"v": values[j][i]})) for j, (k, i) in enumerate(zip(names, row, strict=True))
        }

    def level_keys(self) -> list[tuple[str, str]]:
        """Every (knob, value key) the plan covers."""
        return [
            (k, canonical_key({"v": v}))
            for k, values in zip(self.knobs, self.levels, strict=True)
            for v in values
        ]


@dataclass(frozen=True)
class ScreenState:
    """What the history says of a plan.

    Attributes:
        healthy: (knob, value key) pairs measured healthy at least once.
        given_up: pairs that failed ``give_up_failures`` times without a healthy run.
        screened: screening runs launched so far.
        combined: whether the combination run was proposed.
        launched: launched trials so far.
    """

    healthy: frozenset[tuple[str, str]]
    given_up: frozenset[tuple[str, str]]
    screened: int
    combined: bool
    launched: int

    def uncovered(self, plan: ScreenPlan) -> list[tuple[str, str]]:
        """Levels of the plan neither measured healthy nor given up."""
        return [p for p in plan.level_keys() if p not in self.healthy and p not in self.given_up]


@dataclass(frozen=True)
class ScreenPick:
    """The run screening chose: the candidate's index, ``screen`` or ``combine``, and the screened
    knobs' values it was chosen for (new levels of a screening run; the best levels of the combination)."""

    index: int
    mode: str
    covers: dict[str, Any]
    memory_probe: bool = False


def _healthy(result: TrialResult) -> bool:
    return bool(result.throughput) and not result.status.is_failure


def balanced_design(n_levels: Sequence[int], n_runs: int, seed: int = 0, draws: int = 200) -> np.ndarray:
    """A design of ``n_runs`` rows over knobs of ``n_levels`` levels (level indices, one column a knob).

    Every column is balanced: each level appears ``n_runs // L`` or one more times (the levels of a
    random order get the extra runs in turn). Columns are added one at a time, each the best of
    ``draws`` random balanced columns: the one that meets the columns before it most evenly (least
    squared deviation from ``n_runs / (Li × Lj)`` per pair of levels), so main effects are aliased as
    little as the run count allows (three 3-level knobs in 9 runs: an orthogonal array).
    """
    rng = np.random.default_rng(seed)
    columns: list[np.ndarray] = []
    for j, n in enumerate(n_levels):
        best, best_cost = None, math.inf
        for _ in range(max(1, draws) if columns else 1):
            column = rng.permutation(np.resize(rng.permutation(n), max(0, n_runs)))
            cost = _aliasing(np.stack([*columns, column], axis=1), n_levels[: j + 1]) if columns else 0.0
            if cost < best_cost:
                best, best_cost = column, cost
                if cost == 0.0:
                    break
        columns.append(best if best is not None else np.zeros(max(0, n_runs), dtype=int))
    if not columns:
        return np.zeros((max(0, n_runs), 0), dtype=int)
    return np.stack(columns, axis=1).astype(int)


def _aliasing(design: np.ndarray, n_levels: Sequence[int]) -> float:
    """Squared deviation of the pairwise level counts from an even spread, summed over column pairs."""
    n_runs, n_cols = design.shape
    cost = 0.0
    for i in range(n_cols):
        for j in range(i + 1, n_cols):
            counts = np.zeros((n_levels[i], n_levels[j]))
            np.add.at(counts, (design[:, i], design[:, j]), 1)
            cost += float(((counts - n_runs / (n_levels[i] * n_levels[j])) ** 2).sum())
    return cost


def screened_knobs(
    space: SearchSpace,
    levels: Mapping[str, Sequence[Any]],
    spreads: Mapping[str, float] | None,
    settings: ScreeningSettings,
) -> tuple[str, ...]:
    """The knobs to screen: the documented high-impact ones by the estimator's sensitivity, then the
    estimator's most sensitive others, up to ``settings.max_knobs``.

    ``levels``: the values each knob takes among the valid configurations (knobs with one value or more
    than ``max_levels`` are left out). ``spreads``: how much the estimator says each knob moves the
    step time (None without an estimator: the documented knobs in the space's order).
    """
    eligible = [k for k, values in levels.items() if 2 <= len(values) <= settings.max_levels]
    spread = dict(spreads or {})
    documented = {space.knob_for(role) for role in HIGH_IMPACT_ROLES} - {None}
    order = sorted(eligible, key=lambda k: (k not in documented, -spread.get(k, 0.0), space.names.index(k)))
    chosen = [k for k in order if k in documented or spread.get(k, 0.0) > 0][: settings.max_knobs]
    return tuple(chosen)


class Screening:
    """The screening phase of ``auto`` (see the module docstring). Holds no history: every answer is
    a function of the plan and the trials passed in.

    Args:
        space: the search space.
        settings: how to screen.
        seed: seed of the design's arrangement.
    """

    def __init__(self, space: SearchSpace, settings: ScreeningSettings, seed: int = 0) -> None:
        self.space = space
        self.settings = settings
        self.seed = seed
        self._plan: ScreenPlan | None = None

    def plan(self, pool: Sequence[Mapping[str, Any]], spreads: Mapping[str, float] | None) -> ScreenPlan:
        """The plan over the levels found in ``pool`` (valid configurations), made once."""
        if self._plan is None:
            seen: dict[str, dict[str, Any]] = {}
            for params in pool:
                for name, value in params.items():
                    seen.setdefault(name, {})[canonical_key({"v": value})] = value
            levels = {
                k.name: tuple(v for v in k.values() if canonical_key({"v": v}) in seen.get(k.name, {}))
                for k in self.space.knobs
            }
            knobs = screened_knobs(self.space, levels, spreads, self.settings)
            balanced = self._balanced(levels, knobs)
            n_levels = [len(levels[k]) for k in knobs]
            n_runs = 1 + sum(n - 1 for n in n_levels)  # a saturated main-effects design
            design = balanced_design([*n_levels, *(len(levels[k]) for k in balanced)], n_runs, self.seed)
            self._plan = ScreenPlan(
                knobs=knobs,
                levels=tuple(levels[k] for k in knobs),
                design=tuple(tuple(int(x) for x in row) for row in design),
                balanced=balanced,
                balanced_levels=tuple(levels[k] for k in balanced),
            )
        return self._plan

    def _balanced(self, levels: Mapping[str, Sequence[Any]], screened: Sequence[str]) -> tuple[str, ...]:
        """The other discrete knobs the design spreads (none unless ``balance_others``)."""
        if not screened or not self.settings.balance_others:
            return ()
        return tuple(
            k
            for k, values in levels.items()
            if k not in screened and 2 <= len(values) <= self.settings.max_levels
        )

    def state(self, plan: ScreenPlan, runs: Sequence[TrialResult]) -> ScreenState:
        """What ``runs`` (the launched trials) measured of the plan's levels."""
        healthy: set[tuple[str, str]] = set()
        failed: dict[tuple[str, str], int] = {}
        for r in runs:
            for knob in plan.knobs:
                if knob not in r.params:
                    continue
                pair = (knob, canonical_key({"v": r.params[knob]}))
                if _healthy(r):
                    healthy.add(pair)
                elif r.status.is_failure:
                    failed[pair] = failed.get(pair, 0) + 1
        given_up = {p for p, n in failed.items() if n >= self.settings.give_up_failures and p not in healthy}
        modes = [(r.choice or {}).get("mode") for r in runs]
        return ScreenState(
            healthy=frozenset(healthy),
            given_up=frozenset(given_up),
            screened=modes.count("screen"),
            combined="combine" in modes,
            launched=len(runs),
        )

    def budget(self, launched: int, budget_left: int | None) -> int:
        """The study's trial budget (launched + left; an assumed one without a trial budget)."""
        if budget_left is None:
            return max(self.settings.budget_without_limit, launched)
        return launched + budget_left

    def mode(self, plan: ScreenPlan, state: ScreenState, budget_left: int | None) -> str | None:
        """``screen``, ``combine`` or None (screening is over) for the next run."""
        if not plan.knobs or (budget_left is not None and budget_left <= 0):
            return None
        total = self.budget(state.launched, budget_left)
        covering = bool(state.uncovered(plan)) and state.launched < math.ceil(
            self.settings.cover_share * total
        )
        if covering or self.designing(plan, state, budget_left):
            return "screen"
        if (
            self.settings.combine
            and not state.combined
            and state.screened > 0
            and (budget_left is None or budget_left > 1)
        ):
            return "combine"
        return None

    def designing(self, plan: ScreenPlan, state: ScreenState, budget_left: int | None) -> bool:
        """Whether the design still has rows within its share of the budget."""
        total = self.budget(state.launched, budget_left)
        return state.screened < min(len(plan.design), int(self.settings.design_share * total))

    def complete(self, plan: ScreenPlan, state: ScreenState) -> bool:
        """Whether every level of the plan was measured healthy or given up (the prior may be trusted)."""
        return not state.uncovered(plan)

    def order(
        self,
        plan: ScreenPlan,
        state: ScreenState,
        cands: Sequence[Mapping[str, Any]],
        p_ok: np.ndarray,
        score: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The candidates in the order a screening run should try them, and each one's count of
        uncovered levels: expected new levels (uncovered levels it sets × P(ok)) plus ``match_weight``
        per value matching the design's next row (screened and balanced knobs), then ``score``."""
        uncovered = set(state.uncovered(plan))
        wanted = plan.row_keys(plan.design[state.screened % len(plan.design)]) if plan.design else set()
        names = (*plan.knobs, *plan.balanced)
        cover = np.zeros(len(cands))
        match = np.zeros(len(cands))
        for n, params in enumerate(cands):
            pairs = {(k, canonical_key({"v": params[k]})) for k in names if k in params}
            cover[n] = len(pairs & uncovered)
            match[n] = len(pairs & wanted)
        value = p_ok * (cover + self.settings.match_weight * match)
        order = np.lexsort((-score, -np.round(value, 6)))
        return order, cover

    def best_levels(self, plan: ScreenPlan, runs: Sequence[TrialResult]) -> dict[str, Any]:
        """Each screened knob's level with the best healthy run (a level is as good as the best
        configuration it was measured in: the other knobs of a screening run are not its own choice)."""
        out: dict[str, Any] = {}
        for knob, values in zip(plan.knobs, plan.levels, strict=True):
            means: list[tuple[float, Any]] = []
            for value in values:
                key = canonical_key({"v": value})
                logs = [
                    math.log(r.throughput or 1.0)
                    for r in runs
                    if _healthy(r) and knob in r.params and canonical_key({"v": r.params[knob]}) == key
                ]
                if logs:
                    means.append((max(logs), value))
            if means:
                out[knob] = max(means, key=lambda m: m[0])[1]
        return out

    def next_run(
        self,
        plan: ScreenPlan,
        runs: Sequence[TrialResult],
        cands: Sequence[Mapping[str, Any]],
        p_ok: np.ndarray,
        score: np.ndarray,
        check: Callable[[Mapping[str, Any]], bool],
        budget_left: int | None,
        probe_load: Callable[[Mapping[str, Any]], float | None] | None = None,
    ) -> ScreenPick | None:
        """The screening or combination run among ``cands`` (untried, valid), or None when screening is
        over. ``p_ok`` and ``score``: the model's P(ok) and choice score of each candidate; ``check``:
        the pre-screen (rules, OOM inference, memory gate), asked in order until a candidate passes;
        ``probe_load``: the predicted memory load of a candidate that passes all of it but the memory
        gate (None: not even that), for a memory probe."""
        state = self.state(plan, runs)
        mode = self.mode(plan, state, budget_left)
        if mode is None or not cands:
            return None
        if mode == "screen":
            probes_left = self.settings.max_memory_probes - sum(
                bool((r.choice or {}).get("memory_probe")) for r in runs
            )
            pick = self._screen_run(
                plan, state, cands, p_ok, score, check, budget_left, probe_load if probes_left > 0 else None
            )
            if (
                pick is not None
                or state.combined
                or not self.settings.combine
                or (budget_left is not None and budget_left <= 1)
            ):
                return pick
            # the levels left are out of reach of every candidate that passes: on to the combination
        return self._combine_run(plan, runs, cands, score, check)

    def _screen_run(
        self,
        plan: ScreenPlan,
        state: ScreenState,
        cands: Sequence[Mapping[str, Any]],
        p_ok: np.ndarray,
        score: np.ndarray,
        check: Callable[[Mapping[str, Any]], bool],
        budget_left: int | None,
        probe_load: Callable[[Mapping[str, Any]], float | None] | None = None,
    ) -> ScreenPick | None:
        """The first candidate in :meth:`order` that passes ``check`` (once the design is done: only
        those that cover a new level); else a memory probe (:meth:`_memory_probe`); else None."""
        order, cover = self.order(plan, state, cands, p_ok, score)
        designing = self.designing(plan, state, budget_left)
        uncovered = set(state.uncovered(plan))

        def pick(i: int, memory_probe: bool = False) -> ScreenPick:
            params = cands[i]
            covers = {
                k: params[k]
                for k in plan.knobs
                if k in params and (k, canonical_key({"v": params[k]})) in uncovered
            }
            return ScreenPick(index=i, mode="screen", covers=covers, memory_probe=memory_probe)

        for i in order[: self.settings.max_checks]:
            if cover[i] == 0 and not designing:
                break
            if check(cands[int(i)]):
                return pick(int(i))
        probe = self._memory_probe(order, cover, cands, probe_load) if probe_load is not None else None
        return pick(probe, memory_probe=True) if probe is not None else None

    def _memory_probe(
        self,
        order: np.ndarray,
        cover: np.ndarray,
        cands: Sequence[Mapping[str, Any]],
        probe_load: Callable[[Mapping[str, Any]], float | None],
    ) -> int | None:
        """The first candidate in ``order`` (most new levels × P(ok), then the model's score: the one
        likeliest to be worth having measured) that covers a new level with a predicted memory load of
        at most ``memory_probe_load``; None if no such candidate."""
        for i in order[: self.settings.max_checks]:
            if cover[i] == 0:
                continue
            load = probe_load(cands[int(i)])
            if load is not None and load <= self.settings.memory_probe_load:
                return int(i)
        return None

    def _combine_run(
        self,
        plan: ScreenPlan,
        runs: Sequence[TrialResult],
        cands: Sequence[Mapping[str, Any]],
        score: np.ndarray,
        check: Callable[[Mapping[str, Any]], bool],
    ) -> ScreenPick | None:
        """The candidate that sets most screened knobs to their best measured level (the model's score
        breaks ties) and passes ``check``."""
        best = self.best_levels(plan, runs)
        if not best:
            return None
        keys = {k: canonical_key({"v": v}) for k, v in best.items()}
        matches = np.array([sum(canonical_key({"v": p.get(k)}) == v for k, v in keys.items()) for p in cands])
        for i in np.lexsort((-score, -matches))[: self.settings.max_checks]:
            params = cands[int(i)]
            if check(params):
                covers = {k: best[k] for k, v in keys.items() if canonical_key({"v": params.get(k)}) == v}
                return ScreenPick(index=int(i), mode="combine", covers=covers)
        return None
