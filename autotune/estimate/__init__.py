"""Memory and step-time estimates for GRPO trials, and the model and GPU catalogs they use.

``catalog`` (models, GPUs) → ``shape`` (a backend's knobs as one job shape) → ``memory`` (per-GPU
bytes by component and phase, vLLM's checks) and ``timing`` (rough step time, for ordering only) →
``calibrate`` (corrections from measured peaks and OOMs) and ``plan`` (a whole space judged).
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
    known_gpus,
    known_models,
    model_from_config,
    model_from_facts,
    resolve_gpu,
)
from autotune.estimate.machine_table import (
    CalibrationPoint,
    CalibrationTable,
    build_table,
    cached_table,
    seed_calibration,
    store_table,
)
from autotune.estimate.memory import (
    COMPONENTS,
    MemoryEstimate,
    ModelStates,
    estimate_memory,
    lora_params,
    model_states,
    should_prune,
)
from autotune.estimate.plan import Candidate, PlanResult, candidate_rules, plan_space
from autotune.estimate.shape import JobShape
from autotune.estimate.timing import TimeEstimate, estimate_step_time

__all__ = [
    "COMPONENTS",
    "GIB",
    "Calibration",
    "CalibrationPoint",
    "CalibrationTable",
    "Candidate",
    "GpuSpec",
    "JobShape",
    "MemoryEstimate",
    "ModelSpec",
    "ModelStates",
    "Observation",
    "PlanResult",
    "TimeEstimate",
    "build_table",
    "cached_table",
    "candidate_rules",
    "estimate_memory",
    "estimate_step_time",
    "find_gpu",
    "find_model",
    "generic_gpu",
    "known_gpus",
    "known_models",
    "lora_params",
    "model_from_config",
    "model_from_facts",
    "model_states",
    "plan_space",
    "prediction_error",
    "resolve_gpu",
    "seed_calibration",
    "should_prune",
    "store_table",
]
