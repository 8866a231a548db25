"""Each trial's physical ceiling, and how near its measured step came to it (``result.json``'s ``ceiling``).

The study holds one :class:`TrialCeilings` (built from its settings); after a trial it attaches a
:class:`~autotune.records.TrialCeiling`: the ceiling of the trial's configuration on the study's hardware
(measured peaks where this machine has them, on the CPU measured once and cached; else the GPU
catalog's), the measured steady step time against it and, where the framework or autotune's markers
split the step into phases, each phase against its own bound.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any, Protocol

from autotune.errors import AutotuneError
from autotune.records import Hardware, ModelRef, TrialCeiling, TrialResult

__all__ = ["StudySettings", "TrialCeilings", "measured_phase_seconds"]

log = logging.getLogger(__name__)

#: seconds of host micro-benchmark when a CPU study has no cached peaks yet
HOST_BENCH_S = 2.0


def measured_phase_seconds(result: TrialResult) -> dict[str, float]:
    """Seconds per step of each timeline phase a trial measured (its framework's or markers' split,
    scaled to the steady step time); empty without a steady estimate or such a split."""
    if result.steady is None or result.timeline_summary is None:
        return {}
    phases = result.timeline_summary.phases
    if not phases.measured:
        return {}
    values = {k: float(x) for k, x in phases.time_s.items() if x is not None and math.isfinite(x)}
    total = sum(x for x in values.values() if x > 0)
    if total <= 0:
        return {}
    scale = result.steady.step_time_s / total
    return {k: x * scale for k, x in values.items() if x >= 0}


class StudySettings(Protocol):
    """What :meth:`TrialCeilings.for_study` reads of a study's settings (its ``StudyConfig``)."""

    @property
    def backend(self) -> str: ...
    @property
    def model(self) -> ModelRef: ...
    @property
    def hardware(self) -> Hardware: ...
    @property
    def global_batch(self) -> int: ...
    @property
    def num_generations(self) -> int: ...
    @property
    def max_completion_length(self) -> int: ...
    @property
    def fixed(self) -> Mapping[str, Any]: ...


class TrialCeilings:
    """The ceiling of every trial of one study.

    Args:
        backend: the backend's name (its decoder reads a trial's knobs).
        model: architecture facts (an :class:`autotune.estimate.ModelSpec`).
        n_gpus: GPUs per trial (0 on the CPU).
        job: the job facts every trial shares (fixed arguments, global batch, lengths).
        basis: the peak rates (an :class:`autotune.estimate.PeakBasis`), or None to find them on first use.
        gpu: the GPU's catalog facts (None on the CPU), for finding the basis.
        device: the GPU's name as NVML gives it (what measured peaks are stored under).
    """

    def __init__(
        self,
        backend: str,
        model: Any,
        n_gpus: int,
        job: Mapping[str, Any],
        *,
        basis: Any = None,
        gpu: Any = None,
        device: str | None = None,
    ) -> None:
        self.backend = backend
        self.model = model
        self.n_gpus = n_gpus
        self.job = dict(job)
        self._basis = basis
        self._gpu = gpu
        self._device = device

    @classmethod
    def for_study(cls, cfg: StudySettings) -> TrialCeilings | None:
        """The study's ceilings, or None when the model's architecture or the GPU is unknown."""
        from autotune.estimate import cached_peaks, model_from_facts, resolve_gpu

        model, hardware = cfg.model, cfg.hardware
        job = {
            **cfg.fixed,
            "global_batch": cfg.global_batch,
            "num_generations": cfg.num_generations,
            "max_completion_length": cfg.max_completion_length,
        }
        spec = model_from_facts(dict(model.facts)) if model.facts else None
        if spec is None:
            return None
        gpu = None
        device = hardware.gpus[0].name if hardware.gpus else None
        if device is not None:
            gpu = resolve_gpu(device, hardware.gpus[0].memory_total_bytes)
            # a GPU the catalog does not know has guessed peaks: no bound, unless this machine measured it
            if gpu is None or (not gpu.known and cached_peaks(device) is None):
                return None
        return cls(cfg.backend, spec, len(hardware.gpus), job, gpu=gpu, device=device)

    @property
    def basis(self) -> Any:
        """The peak rates: this machine's measured peaks of the device where cached (the CPU's are
        measured now, once, and cached), else the catalog's."""
        if self._basis is None:
            from autotune.estimate import PeakBasis, cached_peaks

            if self._gpu is not None:
                peaks = cached_peaks(self._device) if self._device else None
                self._basis = PeakBasis.resolve(self._gpu, peaks)
            else:
                self._basis = PeakBasis.resolve(None, self._host_peaks())
        return self._basis

    @staticmethod
    def _host_peaks() -> Any:
        from autotune.estimate import CPU_DEVICE, cached_peaks, measure_host_peaks, store_peaks

        peaks = cached_peaks(CPU_DEVICE)
        if peaks is None:
            peaks = measure_host_peaks(HOST_BENCH_S)
            try:
                store_peaks(peaks)
            except AutotuneError as exc:  # an unwritable cache costs a re-measurement, nothing more
                log.warning("host peaks not cached: %s", exc.one_line())
        return peaks

    def attach(self, result: TrialResult) -> TrialResult:
        """``result`` with its ceiling (unchanged when it never measured a step, or the shape cannot be
        read)."""
        if result.steady is None or result.steady.step_time_s <= 0:
            return result
        try:
            ceiling = self.ceiling_of(result)
        except AutotuneError as exc:
            log.warning("trial %d: no ceiling (%s)", result.number, exc.one_line())
            return result
        except Exception as exc:  # the ceiling annotates a result: it never costs the study a trial
            log.warning("trial %d: no ceiling (%s: %s)", result.number, type(exc).__name__, exc)
            return result
        return result.model_copy(update={"ceiling": ceiling})

    def ceiling_of(self, result: TrialResult) -> TrialCeiling:
        """The ceiling of a trial that measured a steady step time."""
        from autotune.backends import job_shape
        from autotune.estimate import StepWork, step_ceiling

        if result.steady is None:
            raise ValueError(f"trial {result.number} measured no steady step time")
        shape = job_shape(self.backend, result.params, result.derived, self.job, self.model, self.n_gpus)
        work = StepWork(
            prompt_tokens_per_sample=0.0, completion_tokens_per_sample=self._completion_tokens(result)
        )
        ceiling = step_ceiling(shape, self.basis, work)
        step_s = result.steady.step_time_s
        measured = {p: s for p, s in measured_phase_seconds(result).items() if p in ceiling.timeline_s()}
        fractions = {
            p: ceiling.timeline_s()[p] / s
            for p, s in measured.items()
            if s > 0 and ceiling.timeline_s()[p] > 0
        }
        return TrialCeiling(
            basis=self.basis.text(),
            basis_source=self.basis.source,
            work=_work_text(work, shape.max_completion_length),
            phase_ceiling_s=ceiling.phase_s(),
            step_ceiling_s=ceiling.step_s,
            step_measured_s=step_s,
            step_fraction=ceiling.step_s / step_s,
            phase_measured_s=measured,
            phase_fraction=fractions,
        )

    def _completion_tokens(self, result: TrialResult) -> float | None:
        """Mean completion tokens per sample the trial measured (None: not logged)."""
        steady = result.steady
        batch = self.job.get("global_batch")
        if steady is None or not steady.tokens_per_s or not batch:
            return None
        declared = self.job.get("max_completion_length")
        tokens = steady.tokens_per_s * steady.step_time_s / float(batch)
        return min(tokens, float(declared)) if declared else tokens


def _work_text(work: Any, declared_completion: int) -> str:
    completion = work.completion_tokens_per_sample
    said = (
        f"{completion:.4g} completion tokens per sample (measured)"
        if completion is not None
        else f"{declared_completion} completion tokens per sample (the declared maximum: none logged)"
    )
    return f"{said}; prompt tokens not counted (no prompt length is logged)"
