"""The study's memory gate: the estimator, calibrated by measurements, as a pre-screen and a ranking.

It prunes only what is predicted to exceed GPU memory by more than a conservative margin, ranks the rest
by predicted throughput (ordering only), and learns from every completed or OOM trial: the NVML peak
against the prediction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from autotune.backends import ModelRef
from autotune.records import Hardware, TrialResult, TrialStatus
from autotune.space import canonical_key

if TYPE_CHECKING:
    from autotune.estimate import GpuSpec, JobShape, MemoryEstimate, ModelSpec, PeakBasis, TimeEstimate

_Kept = TypeVar("_Kept")

__all__ = ["PROBE_MARGIN", "EstimateMemo", "EstimatorGate"]

#: the most a memory probe may be predicted over capacity (a share of it) and still be launched: the
#: estimate is a prior, and a strategy that must measure a level the gate refuses everywhere (see
#: ``memory_probe`` in :class:`autotune.strategy.BaseStrategy`) tests it there, no further
PROBE_MARGIN = 0.5

#: step-time estimates a gate keeps (a candidate pool and its neighbours: a few thousand)
_TIMINGS_KEPT = 50_000


@dataclass(frozen=True)
class EstimateMemo:
    """What a gate computes once per configuration and keeps: the estimator's step times, step
    ceilings and raw (uncalibrated) memory estimates, by configuration key.

    None of them depends on what a study measures (the calibration is applied on top of the raw memory
    estimate), so gates of the same job (backend, model, GPUs, fixed arguments) may share one: a bench
    that runs many studies of one job computes each estimate once.
    """

    timings: dict[str, TimeEstimate] = field(default_factory=dict)
    ceilings: dict[str, float] = field(default_factory=dict)
    memory: dict[str, MemoryEstimate] = field(default_factory=dict)


class EstimatorGate:
    """Implements the study's ``MemoryGate`` protocol with :mod:`autotune.estimate`.

    Args:
        backend: backend name (its knob vocabulary).
        model: architecture facts (``autotune.estimate.ModelSpec``).
        gpu: the GPU's facts (``autotune.estimate.GpuSpec``).
        n_gpus: GPUs per trial.
        job: fixed job facts (global batch, num_generations, lengths, beta, LoRA, ...).
        derive: the backend's derivation (world size, gradient accumulation) for a knob assignment.
        margin: prune only above ``capacity × (1 + margin)``.
        memo: the estimates kept by configuration (default: this gate's own); share one only between
            gates of the same job.
    """

    def __init__(
        self,
        backend: str,
        model: ModelSpec,
        gpu: GpuSpec,
        n_gpus: int,
        job: Mapping[str, Any],
        derive: Callable[[dict[str, Any]], dict[str, Any]],
        *,
        margin: float = 0.15,
        memo: EstimateMemo | None = None,
    ) -> None:
        from autotune.estimate import Calibration

        self.backend = backend
        self.model = model
        self.gpu = gpu
        self.n_gpus = n_gpus
        self.job = dict(job)
        self.derive = derive
        self.margin = margin
        self.calibration = Calibration()
        self._seen: set[int] = set()
        self._basis: PeakBasis | None = None
        # estimates by configuration: rank and phase_times ask for the same candidates, and a strategy
        # re-checks its pool at every decision (they need no calibration: nothing the gate learns makes
        # them stale)
        self.memo = memo if memo is not None else EstimateMemo()

    @classmethod
    def build(
        cls,
        hardware: Hardware,
        model: ModelRef,
        backend: str,
        job: Mapping[str, Any],
        derive: Callable[[dict[str, Any]], dict[str, Any]],
        calibration: Mapping[str, Any] | None = None,
        memo: EstimateMemo | None = None,
    ) -> EstimatorGate | None:
        """A gate for this study, or None when the model's facts or the GPUs are unknown (``memo``: see
        :class:`EstimateMemo`)."""
        from autotune.estimate import Calibration, model_from_facts, resolve_gpu, seed_calibration

        if not hardware.gpus or not model.facts:
            return None
        spec = model_from_facts(dict(model.facts))
        gpu = resolve_gpu(hardware.gpus[0].name, hardware.gpus[0].memory_total_bytes)
        if spec is None or gpu is None:
            return None
        gate = cls(backend, spec, gpu, len(hardware.gpus), job, derive, memo=memo)
        if calibration:
            gate.calibration = Calibration.from_dict(dict(calibration))
        else:  # a new study starts from this GPU type's table (autotune doctor --calibrate), if any
            gate.calibration = seed_calibration(hardware.gpus[0].name, spec.params) or gate.calibration
        return gate

    def _shape(self, params: Mapping[str, Any], derived: Mapping[str, Any] | None = None) -> JobShape:
        """The job shape of ``params`` (derived here unless given)."""
        from autotune.backends import job_shape

        derived = derived if derived is not None else self.derive(dict(params))
        return job_shape(self.backend, params, derived, self.job, self.model, self.n_gpus)

    def _estimate(
        self, params: Mapping[str, Any], derived: Mapping[str, Any] | None = None
    ) -> MemoryEstimate:
        """The estimator's memory estimate of ``params`` with the calibration applied (the raw estimate
        is computed once per configuration and derivation)."""
        from autotune.estimate import estimate_memory

        raw = self._kept(
            self.memo.memory,
            {"params": dict(params), "derived": None if derived is None else dict(derived)},
            lambda: estimate_memory(self._shape(params, derived), self.gpu),
        )
        return self.calibration.adjust(raw)

    @staticmethod
    def _kept(store: dict[str, _Kept], params: Mapping[str, Any], compute: Callable[[], _Kept]) -> _Kept:
        """``compute()`` once per configuration in ``store`` (emptied when it holds ``_TIMINGS_KEPT``)."""
        key = canonical_key(params)
        if key not in store:
            if len(store) >= _TIMINGS_KEPT:
                store.clear()
            store[key] = compute()
        return store[key]

    def check(
        self, params: Mapping[str, Any], derived: Mapping[str, Any], *, margin: float | None = None
    ) -> tuple[str | None, dict[str, Any] | None]:
        """Why ``params`` is predicted not to fit (None: it may run) and the estimate's breakdown.

        ``margin``: how far over capacity a prediction may be before it is refused (default: the
        gate's own; a memory probe, which tests the gate itself, is given :data:`PROBE_MARGIN`)."""
        from autotune.estimate import should_prune

        est = self._estimate(params, derived)
        breakdown = est.to_dict()
        if should_prune(est, margin=self.margin if margin is None else margin):
            return f"predicted not to fit: {est.reason()}", breakdown
        return None, breakdown

    def _timing(self, params: Mapping[str, Any]) -> TimeEstimate:
        """The estimator's step time of ``params`` (computed once per configuration)."""
        from autotune.estimate import estimate_step_time

        return self._kept(
            self.memo.timings, params, lambda: estimate_step_time(self._shape(params), self.gpu)
        )

    def rank(self, params: Mapping[str, Any]) -> float | None:
        return float(self._timing(params).throughput)

    def phase_times(self, params: Mapping[str, Any]) -> dict[str, float]:
        """The estimator's seconds per step of each phase, named as the timeline names them (host
        transfers and CPU optimizer work are the timeline's ``other``)."""
        t = self._timing(params)
        return {"rollout": t.rollout_s, "train": t.train_s, "weight_sync": t.sync_s, "other": t.offload_s}

    def ceiling_s(self, params: Mapping[str, Any]) -> float:
        """The least seconds a step of ``params`` could take on these GPUs (:func:`autotune.estimate.
        step_ceiling_s`, catalog peaks or this machine's measured ones): no run of it can be faster, so
        a strategy may bound a predicted speed by it (and then record ``ceiling_s`` in the trial's
        ``choice``, which the report reads)."""
        from autotune.estimate import PeakBasis, cached_peaks, step_ceiling_s

        found = self._basis
        if found is None:
            names = (*self.gpu.nvml_names, self.gpu.name)
            measured = next((p for p in map(cached_peaks, names) if p is not None), None)
            found = self._basis = PeakBasis.resolve(self.gpu, measured)
        if found is None:  # only a CPU without measured peaks has none; a gate always has a GPU
            raise ValueError(f"no peaks known for {self.gpu.name}")
        basis = found
        return float(
            self._kept(self.memo.ceilings, params, lambda: step_ceiling_s(self._shape(params), basis))
        )

    def observe(self, result: TrialResult) -> None:
        """Learn from a trial's measured peak (or its OOM): finished, unhealthy, and stopped early for
        being slow after whole steps (its peak is a whole step's: a memory probe often ends so)."""
        stopped_slow = result.status is TrialStatus.PRUNED and result.steps > 0 and any(result.peak_mem_bytes)
        if result.number in self._seen or not (
            stopped_slow or result.status in (TrialStatus.COMPLETE, TrialStatus.OOM, TrialStatus.UNHEALTHY)
        ):
            return
        self._seen.add(result.number)
        est = self._estimate(result.params, result.derived or None)
        measured = max((p for p in result.peak_mem_bytes if p is not None), default=None)
        self.calibration.observe(est, measured, result.status is TrialStatus.OOM, trial=result.number)

    def state(self) -> dict[str, Any]:
        return self.calibration.to_dict()
