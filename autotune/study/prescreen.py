"""The pre-screen: what the study refuses to launch (the framework's rules, the sound OOM inference,
the memory gate) and the cheap checks it lends the strategy."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.backends import TrialContext
from autotune.recommend import headroom_bytes, required_headroom_bytes
from autotune.records import TrialResult, TrialStatus
from autotune.strategy import infer_infeasible
from autotune.study.memory_gate import PROBE_MARGIN
from autotune.study.state import StudyPart

__all__ = ["Prescreen"]


class Prescreen(StudyPart):
    """Checks a configuration before launch, against the framework's rules, what failed trials prove and
    the memory gate.

    Args:
        state: the study's shared state (settings, backend, space, memory gate, results so far).
    """

    def context(self, trial_dir: Path, master_port: int = 0) -> TrialContext:
        """What the backend knows of a trial in ``trial_dir``."""
        c = self.cfg
        return TrialContext(
            study_dir=c.study_dir,
            trial_dir=trial_dir,
            model=c.model,
            gpus=c.hardware.gpus,
            global_batch=c.global_batch,
            num_generations=c.num_generations,
            max_steps=c.max_steps,
            max_completion_length=c.max_completion_length,
            fixed=dict(c.fixed),
            master_port=master_port,
            dataset=c.dataset,
            seed=c.seed,
        )

    def valid(self, params: Mapping[str, object]) -> bool:
        """The framework's start-up rules hold (static: the same answer for the whole study)."""
        ctx = self.context(self.dir.trials_dir)
        return not self.backend.rules(dict(params), self.backend.derive(dict(params), ctx), ctx)

    def cheap_feasible(self, params: Mapping[str, object]) -> bool:
        """Whether ``params`` passes the pre-screen (without building its result)."""
        ctx = self.context(self.dir.trials_dir)
        derived = self.backend.derive(dict(params), ctx)
        if self.backend.rules(dict(params), derived, ctx):
            return False
        if infer_infeasible(self.space, params, self._results.values()):
            return False
        if self.memory_gate is not None:
            reason, _ = self.memory_gate.check(params, derived)
            return reason is None
        return True

    def memory_load(self, params: Mapping[str, object]) -> float | None:
        """Predicted peak ÷ capacity per GPU (above 1 by the deficit when vLLM's checks fail), or None."""
        if self.memory_gate is None:
            return None
        derived = self.backend.derive(dict(params), self.context(self.dir.trials_dir))
        _, breakdown = self.memory_gate.check(params, derived)
        if not breakdown:
            return None
        capacity = float(breakdown.get("capacity_bytes") or 0)
        peak = breakdown.get("peak_bytes")
        if capacity <= 0 or peak is None:
            return None
        deficit = max(
            float(breakdown.get("vllm_startup_deficit_bytes") or 0),
            float(breakdown.get("kv_deficit_bytes") or 0),
        )
        if deficit > 0:
            return max(float(peak) / capacity, 1.0 + deficit / capacity)
        return float(peak) / capacity

    def usable(self, result: TrialResult) -> bool:
        """Whether a result may be recommended: complete, with a throughput and the headroom asked for."""
        if result.status is not TrialStatus.COMPLETE or not result.throughput:
            return False
        gpus = self.cfg.hardware.gpus
        for i, room in enumerate(headroom_bytes(result, self.cfg.hardware)):
            need = required_headroom_bytes(result, gpus[i].memory_total_bytes, self.cfg.min_headroom_frac)
            if room is not None and room < need:
                return False
        return True

    def check(
        self, number: int, params: dict[str, Any], is_baseline: bool, *, memory_probe: bool = False
    ) -> TrialResult | None:
        """The PRUNED result of a configuration the study refuses to launch, with why; None to launch.

        ``memory_probe``: the strategy asks to test the memory gate itself with this configuration (its
        ``choice`` says so): the gate refuses it only beyond :data:`~autotune.study.memory_gate.PROBE_MARGIN`.
        """
        ctx = self.context(self.dir.trial_dir(number))
        derived = self.backend.derive(params, ctx)

        def refused(reason: str, estimate: dict[str, Any] | None = None) -> TrialResult:
            return TrialResult.not_launched(
                number,
                params,
                status=TrialStatus.PRUNED,
                reason=reason,
                derived=derived,
                is_baseline=is_baseline,
                estimate=estimate,
            )

        violations = self.backend.rules(params, derived, ctx)
        if violations:
            text = "; ".join(f"{v.rule}: {v.message}" for v in violations)
            return refused(f"not launched, breaks {text}")
        inferred = infer_infeasible(self.space, params, self._results.values())
        if inferred is not None:
            return refused(f"not launched: {inferred.reason}")
        if self.memory_gate is not None:
            reason, breakdown = (
                self.memory_gate.check(params, derived, margin=PROBE_MARGIN)
                if memory_probe
                else self.memory_gate.check(params, derived)
            )
            if reason is not None:
                return refused(f"not launched: {reason}", breakdown)
        return None
