"""Memory and step-time estimates for GRPO trials, and the model and GPU catalogs they use.

``catalog`` (models, GPUs) → ``shape`` (a backend's knobs as one job shape) → ``states`` (model states, as
DeepSpeed counts them), ``memory`` (per-GPU bytes by component and phase, vLLM's checks) and ``timing``
(rough step time, for ordering only) →
``calibrate`` (corrections from measured peaks and OOMs) and ``plan`` (a whole space judged).
``peaks``: the machine's own measured FLOP/s and bandwidths (cached per machine), used in place of the
catalog's where present.
"""

from __future__ import annotations

from autotune.estimate.calibrate import Calibration, Observation, prediction_error
from autotune.estimate.catalog import (
    GIB,
    GpuSpec,
    ModelSpec,
    find_gpu,
    find_model,
    generic_gpu,
    gpu_variants,
    known_gpus,
    known_models,
    model_from_config,
    model_from_facts,
    resolve_gpu,
)
from autotune.estimate.ceiling import (
    CEILING_PHASES,
    TIMELINE_PHASES,
    PeakBasis,
    StepCeiling,
    StepWork,
    step_ceiling,
    step_ceiling_s,
)
from autotune.estimate.machine_table import (
    CalibrationPoint,
    CalibrationTable,
    build_table,
    cached_table,
    seed_calibration,
    store_table,
)
from autotune.estimate.memory import COMPONENTS, MemoryEstimate, estimate_memory, should_prune
from autotune.estimate.peaks import (
    CPU_DEVICE,
    MeasuredPeaks,
    cached_peaks,
    machine_id,
    measure_host_peaks,
    peaks_cache_dir,
    store_peaks,
)
from autotune.estimate.plan import Candidate, PlanResult, candidate_rules, plan_space
from autotune.estimate.shape import JobShape
from autotune.estimate.states import ModelStates, lora_params, model_states
from autotune.estimate.timing import TimeEstimate, estimate_step_time

__all__ = [
    "CEILING_PHASES",
    "COMPONENTS",
    "CPU_DEVICE",
    "GIB",
    "Calibration",
    "CalibrationPoint",
    "CalibrationTable",
    "Candidate",
    "GpuSpec",
    "JobShape",
    "MeasuredPeaks",
    "MemoryEstimate",
    "ModelSpec",
    "ModelStates",
    "Observation",
    "PeakBasis",
    "PlanResult",
    "StepCeiling",
    "StepWork",
    "TIMELINE_PHASES",
    "TimeEstimate",
    "build_table",
    "cached_table",
    "cached_peaks",
    "candidate_rules",
    "estimate_memory",
    "estimate_step_time",
    "find_gpu",
    "find_model",
    "generic_gpu",
    "gpu_variants",
    "known_gpus",
    "known_models",
    "lora_params",
    "machine_id",
    "measure_host_peaks",
    "model_from_config",
    "model_from_facts",
    "model_states",
    "peaks_cache_dir",
    "plan_space",
    "prediction_error",
    "resolve_gpu",
    "seed_calibration",
    "should_prune",
    "store_table",
    "step_ceiling",
    "step_ceiling_s",
    "store_peaks",
]
