"""What the search-efficiency bench simulates: settings (a job on some hardware) and the truth of one run.

Two kinds of surface are built for a setting:

- ``estimator`` (:mod:`_surfaces`): autotune's own memory and step-time model, distorted by seeded
  errors. A search seeded by that estimator does well there partly by construction.
- ``independent`` (:mod:`_independent`): a world with its own parameterisation, functional forms and
  randomly drawn failure regions, which never reads autotune's estimator.
- ``adversarial`` (:mod:`_adversarial`): the independent world of an independent setting, reversed on
  one or two high-impact knobs per seed (a prior that follows the usual physics is wrong there).
- ``phase-additive`` (:mod:`_phase_additive`): a world of the independent setting's table whose step
  is a sum of phases, each on its own few knobs.

All answer :class:`World`'s questions with a :class:`Truth` per configuration. This module names the
hardware and model of a setting through autotune's catalogs (constants only: memory size, bandwidths,
parameter and layer counts) and nothing of the estimator's model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol

from autotune.backends import Backend, ModelRef, TrialContext, backend_class, get_backend
from autotune.estimate.catalog import GIB, GpuSpec, ModelSpec, find_gpu, find_model
from autotune.records import GpuInfo, Hardware, HostInfo, TrialStatus
from autotune.space import Platform, SearchSpace, load_space
from autotune.study.memory_gate import EstimateMemo, EstimatorGate
from autotune.trial.outcome import LIVE_HEALTH_MIN_STEPS

__all__ = [
    "FAILED_PHASES",
    "HEADROOM",
    "LIVE_STOP",
    "REASON",
    "SETTINGS",
    "SPACES_DIR",
    "STATUS",
    "STEP_PHASES",
    "Setting",
    "table_setting",
    "Truth",
    "World",
]

SPACES_DIR = Path(__file__).resolve().parent.parent / "search_spaces"
HEADROOM = 0.95  # the recommendation wants 5 % of memory left
#: the phases of one step, as probes/timeline.summarize names them
STEP_PHASES = ("rollout", "train", "weight_sync", "other")
#: where a failure can happen (TrialResult.failed_phase)
FAILED_PHASES = ("startup", "rollout", "train", "weight_sync")

# Reasons as autotune.trial.outcome words them (the inference reads them), and the status each goes with.
REASON = {
    "oom": "CUDA out of memory",
    "startup": "vLLM could not start: free GPU memory is below the requested gpu_memory_utilization",
    "kv": "vLLM could not start: the KV cache cannot hold one sequence of max_model_len",
    "host": "a rank was killed by SIGKILL (host out of memory?)",
    "hang": "no step for too long (watchdog): the trial hung",
    "unhealthy": "does not learn: kl and grad_norm are 0 on every step",
    "gibberish": "does not learn: rollouts are degenerate (sleep level 2 weight reload)",
    # rule 9 of autotune.trial.outcome: the traceback's last error line
    "tp_heads": "exit code 1: ValueError: Total number of attention heads must be divisible by tensor "
    "parallel size",
    "crash": "exit code 1: torch.distributed.DistBackendError: NCCL error: unhandled system error",
}
STATUS = {
    "oom": TrialStatus.OOM,
    "startup": TrialStatus.VLLM_INIT,
    "kv": TrialStatus.VLLM_INIT,
    "host": TrialStatus.HOST_OOM,
    "hang": TrialStatus.HANG,
    "unhealthy": TrialStatus.UNHEALTHY,
    "gibberish": TrialStatus.UNHEALTHY,
    "tp_heads": TrialStatus.CRASH,
    "crash": TrialStatus.CRASH,
}
#: the step at which the executor's live health check stops a run (autotune.trial.outcome.live_health):
#: a model that never moves shows it from step LIVE_HEALTH_MIN_STEPS, degenerate rollouts one step later
#: (after the first weight reload)
LIVE_STOP = {"unhealthy": LIVE_HEALTH_MIN_STEPS, "gibberish": LIVE_HEALTH_MIN_STEPS + 1}


@dataclass(frozen=True)
class Setting:
    """A job on some hardware.

    Attributes:
        name: label in the bench table (unique over both kinds).
        backend: ``trl`` or ``swift`` (knob vocabulary, rules, space file).
        model: catalog model name.
        gpu: catalog GPU name.
        n_gpus: GPUs per trial.
        host_ram_gib: host memory of the node.
        fixed: job facts the same for every trial, in the framework's argument names.
        baseline: the user's own starting configuration (missing knobs take defaults).
        narrow: knob values the bench space keeps (e.g. colocated vLLM only).
        stage_knob: the ZeRO-stage knob, for the DeepSpeed-style sweep.
        stages: its values in the order DeepSpeed tries them.
        kind: which world the bench builds for it: ``estimator`` (autotune's model with errors),
            ``independent`` (a model of its own) or ``adversarial`` (that model reversed on one or two
            high-impact knobs, so that a prior built on the usual physics is wrong in direction),
            ``phase-additive`` (a sum of phases) or ``replay`` (a recorded real surface:
            ``_replay.RecordedSetting``).
    """

    name: str
    backend: str
    model: str
    gpu: str
    n_gpus: int
    host_ram_gib: float
    fixed: Mapping[str, Any]
    baseline: Mapping[str, Any]
    narrow: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    stage_knob: str = "zero_stage"
    stages: tuple[Any, ...] = (0, 2, 3)
    kind: Literal["estimator", "independent", "adversarial", "phase-additive", "replay"] = "estimator"

    @property
    def global_batch(self) -> int:
        return int(self.fixed["global_batch"])

    @property
    def num_generations(self) -> int:
        return int(self.fixed["num_generations"])

    @property
    def max_completion_length(self) -> int:
        return int(self.fixed["max_completion_length"])

    def model_spec(self) -> ModelSpec:
        spec = find_model(self.model)
        if spec is None:
            raise ValueError(f"unknown model {self.model}")
        return spec

    def gpu_spec(self) -> GpuSpec:
        spec = find_gpu(self.gpu)
        if spec is None:
            raise ValueError(f"unknown GPU {self.gpu}")
        return spec

    def space(self) -> SearchSpace:
        space = (
            load_space(SPACES_DIR / f"{self.backend}.yaml", backend=self.backend)
            .restrict(Platform.machine(gpu_present=True))
            .with_roles(backend_class(self.backend).knob_roles())
        )
        return space.narrow(self.narrow) if self.narrow else space

    def hardware(self) -> Hardware:
        gpu = self.gpu_spec()
        name = gpu.nvml_names[0] if gpu.nvml_names else gpu.name
        gpus = tuple(
            GpuInfo(index=i, name=name, memory_total_bytes=gpu.memory_bytes, declared=True)
            for i in range(self.n_gpus)
        )
        host = HostInfo(
            hostname="simulated",
            cpu_cores_logical=128,
            cpu_cores_physical=64,
            ram_total_bytes=int(self.host_ram_gib * GIB),
            platform="linux",
        )
        return Hardware(gpus=gpus, host=host)

    def model_ref(self) -> ModelRef:
        m = self.model_spec()
        return ModelRef(name=m.name, path_or_id=m.hub_id, local=False, facts=asdict(m))

    def context(self, trial_dir: Path) -> TrialContext:
        return TrialContext(
            study_dir=trial_dir.parent,
            trial_dir=trial_dir,
            model=self.model_ref(),
            gpus=self.hardware().gpus,
            global_batch=self.global_batch,
            num_generations=self.num_generations,
            max_steps=10,
            max_completion_length=self.max_completion_length,
        )

    def make_backend(self) -> Backend:
        return get_backend(self.backend)

    def memory_gate(
        self, hardware: Hardware, backend: Backend, ctx: TrialContext, memo: EstimateMemo | None
    ) -> EstimatorGate | None:
        """The pre-screen the CLI builds for this setting: the estimator's, on GPUs."""
        return EstimatorGate.build(
            hardware,
            self.model_ref(),
            self.backend,
            self.fixed,
            lambda p: backend.derive(p, ctx),
            memo=memo,
        )


@dataclass(frozen=True)
class Truth:
    """What really happens when one configuration runs.

    Attributes:
        status, reason: how the trial ends, worded as autotune's outcome module words it.
        throughput: completions/s without noise (also for a failure, as if it had run).
        step_s: seconds of one steady step without noise.
        startup_s: launch to the first step.
        peak_bytes: the highest memory on a GPU over the phases (capped at the GPU's size).
        valid: the framework's start-up rules accept the configuration.
        phases: seconds of one steady step per phase (``rollout``, ``train``, ``weight_sync``,
            ``other``), summing to ``step_s``.
        failed_phase: where a failure happens (``startup``, ``rollout``, ``train``, ``weight_sync``);
            None when the run completes.
        live_stop_step: the step at which the executor's live health check stops the run.
        fail_after_steps: steps completed before a hang or crash.
        step_noise: the log-normal noise of one step's duration, where the world knows it (a recorded
            surface: from its trial's measured spread); None: the executor's own.
    """

    status: TrialStatus
    reason: str
    throughput: float
    step_s: float
    startup_s: float
    peak_bytes: int
    valid: bool
    phases: Mapping[str, float]
    failed_phase: str | None = None
    live_stop_step: int | None = None
    fail_after_steps: int = 2
    step_noise: float | None = None


class World(Protocol):
    """What the bench asks of a surface."""

    setting: Setting
    seed: int
    capacity: float

    def truth(self, params: Mapping[str, Any]) -> Truth: ...

    def usable_throughput(self, params: Mapping[str, Any]) -> float: ...

    def optimum(self) -> tuple[dict[str, Any], float, dict[str, float]]: ...


_TRL_FIXED = {
    "global_batch": 64,
    "num_generations": 8,
    "max_completion_length": 1024,
    "max_prompt_length": 512,
    "beta": 0.0,
    "vllm_max_model_len": 2048,
}
_SWIFT_FIXED = {
    "global_batch": 64,
    "num_generations": 8,
    "max_completion_length": 1024,
    "max_prompt_length": 512,
    "beta": 0.04,
    "vllm_max_model_len": 2048,
}
# TRL's documented way to run GRPO: its defaults with colocated vLLM.
_TRL_BASELINE = {"use_vllm": True, "vllm_gpu_memory_utilization": 0.3}
# ms-swift's documented colocate example for large models (Qwen3-8B full GRPO on 8 GPUs): safe, slow.
_SWIFT_BASELINE = {
    "use_vllm": True,
    "vllm_mode": "colocate",
    "vllm_gpu_memory_utilization": 0.4,
    "sleep_level": 1,
    "offload_model": True,
    "offload_optimizer": True,
    "deepspeed": "zero3",
    "per_device_train_batch_size": 2,
}


def _swift(
    name: str,
    model: str,
    gpu: str,
    n_gpus: int,
    host_ram_gib: float,
    fixed: Mapping[str, Any],
    baseline: Mapping[str, Any],
    kind: Literal["estimator", "independent", "adversarial", "phase-additive", "replay"] = "estimator",
) -> Setting:
    """An ms-swift setting: colocated vLLM only (server mode needs a rollout server of its own), the
    DeepSpeed presets as the stages of the DeepSpeed-style sweep."""
    return Setting(
        name,
        "swift",
        model,
        gpu,
        n_gpus,
        host_ram_gib,
        fixed,
        baseline,
        narrow={"vllm_mode": ("colocate",)},
        stage_knob="deepspeed",
        stages=("zero0", "zero1", "zero2", "zero3"),
        kind=kind,
    )


SETTINGS: tuple[Setting, ...] = (
    # -- estimator-derived
    Setting("trl Qwen2.5-1.5B 4xA10", "trl", "Qwen2.5-1.5B", "A10", 4, 256, _TRL_FIXED, _TRL_BASELINE),
    Setting("trl Qwen2.5-7B 8xH100", "trl", "Qwen2.5-7B", "H100", 8, 2048, _TRL_FIXED, _TRL_BASELINE),
    _swift("swift Qwen2.5-7B 4xA100-80G", "Qwen2.5-7B", "A100-80G", 4, 1024, _SWIFT_FIXED, _SWIFT_BASELINE),
    _swift("swift Qwen2.5-14B 8xH100", "Qwen2.5-14B", "H100", 8, 2048, _SWIFT_FIXED, _SWIFT_BASELINE),
    # -- independent
    _swift(
        "swift Qwen2.5-7B LoRA 4xRTX4090",
        "Qwen2.5-7B",
        "RTX4090",
        4,
        256,
        {**_SWIFT_FIXED, "tuner_type": "lora", "lora_rank": 16},
        # ms-swift's LoRA colocate recipe on small GPUs: the model leaves the GPU while vLLM generates,
        # vLLM sleeps while the trainer trains, vLLM split over two GPUs, the ZeRO-3 sync in batches
        {
            **_SWIFT_BASELINE,
            "vllm_gpu_memory_utilization": 0.5,
            "vllm_tensor_parallel_size": 2,
            "move_model_batches": 8,
        },
        kind="independent",
    ),
    _swift(
        "swift Qwen2.5-7B full 8xH100",
        "Qwen2.5-7B",
        "H100",
        8,
        2048,
        _SWIFT_FIXED,
        _SWIFT_BASELINE,
        kind="independent",
    ),
    _swift(
        "swift Qwen2.5-7B full 4xA100-80G",
        "Qwen2.5-7B",
        "A100-80G",
        4,
        1024,
        _SWIFT_FIXED,
        _SWIFT_BASELINE,
        kind="independent",
    ),
    Setting(
        "trl Qwen2.5-3B full 4xA10",
        "trl",
        "Qwen2.5-3B",
        "A10",
        4,
        256,
        _TRL_FIXED,
        # TRL's defaults with ZeRO-3, optimizer offload and sleep mode (the full model does not fit
        # otherwise); vLLM's share raised to 0.35, the least that leaves a KV cache for the 3B model
        {
            **_TRL_BASELINE,
            "vllm_gpu_memory_utilization": 0.35,
            "zero_stage": 3,
            "offload_optimizer": True,
            "vllm_enable_sleep_mode": True,
            "per_device_train_batch_size": 4,
        },
        kind="independent",
    ),
)
ADVERSARIAL_SUFFIX = " adv"
PHASE_ADDITIVE_SUFFIX = " phase"
# -- adversarial: each independent setting again, its world reversed on high-impact knobs;
# -- phase-additive: each independent setting again, its world a sum of phases (bench/_phase_additive.py)
SETTINGS = SETTINGS + tuple(
    replace(s, name=s.name + suffix, kind=kind)
    for suffix, kind in ((ADVERSARIAL_SUFFIX, "adversarial"), (PHASE_ADDITIVE_SUFFIX, "phase-additive"))
    for s in SETTINGS
    if s.kind == "independent"
)


def table_setting(setting: Setting) -> Setting:
    """The setting whose seed-independent table a setting's surfaces read: an adversarial setting
    shares the table of its independent twin (the decoded configurations do not depend on the world), and
    so does a phase-additive one."""
    if setting.kind not in ("adversarial", "phase-additive"):
        return setting
    name = setting.name.removesuffix(ADVERSARIAL_SUFFIX).removesuffix(PHASE_ADDITIVE_SUFFIX)
    return replace(setting, name=name, kind="independent")
