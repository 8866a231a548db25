"""Reading the machine once, for every check: NVML through the probes' gate, the trials' interpreter
(package metadata, nothing imported), the host's limits and free space. Each source is a parameter, so tests pass fakes."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType

import psutil

from autotune.doctor._base import Facts, HostFacts, InterpreterFacts
from autotune.doctor._host import NCCL_ENV_PREFIXES
from autotune.doctor._interpreter import read_interpreter
from autotune.errors import HardwareError, MachineError
from autotune.probes.gpu_health import GpuHealth, HealthReading, read_gpu_health
from autotune.probes.nvml import NvmlUnavailable
from autotune.secrets import MASK, SecretRule
from autotune.study.hardware import visible_devices
from autotune.workload.tinymodels import default_cache_dir
from autotune.writable import unwritable_reason

__all__ = ["gather_facts", "host_facts", "offload_need_bytes"]


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing parent (``--out`` need not exist yet)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def offload_need_bytes(model: str, n_gpus: int) -> int | None:
    """Host RAM a fully offloaded ZeRO-3 run of ``model`` keeps there (the estimator's model states, which
    follow DeepSpeed's ``estimate_zero3_model_states_mem_needs``); None when its size is unknown."""
    from autotune.estimate import model_from_facts, model_states
    from autotune.workload.models import resolve_model

    ref = resolve_model(model, build_tiny=False)
    spec = model_from_facts(dict(ref.facts)) if ref.facts else None
    if spec is None:
        return None
    states = model_states(
        params=spec.params,
        largest_layer_params=spec.largest_layer_params,
        n_gpus=max(1, n_gpus),
        zero_stage=3,
        deepspeed=True,
        offload_optimizer=True,
        offload_param=True,
    )
    return int(states.host_bytes)


def host_facts(
    out_dir: Path, *, model: str | None = None, n_gpus: int = 1, shm: Path = Path("/dev/shm")
) -> HostFacts:
    """The host's shared memory, open-file limit, free disk under ``out_dir``, RAM and offload need."""
    import resource

    try:
        shm_total: int | None = shutil.disk_usage(shm).total if shm.is_dir() else None
    except OSError:
        shm_total = None
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        soft, hard = -1, -1
    try:
        free: int | None = shutil.disk_usage(_existing(out_dir.absolute())).free
    except OSError:
        free = None
    cache_dir = default_cache_dir()
    vm = psutil.virtual_memory()
    return HostFacts(
        shm_total_bytes=shm_total,
        open_files_soft=soft if soft >= 0 else None,
        open_files_hard=hard if hard >= 0 else None,
        out_dir=out_dir,
        disk_free_bytes=free,
        ram_total_bytes=int(vm.total),
        ram_available_bytes=int(vm.available),
        offload_need_bytes=offload_need_bytes(model, n_gpus) if model else None,
        model=model,
        out_problem=unwritable_reason(out_dir),
        cache_dir=cache_dir,
        cache_problem=unwritable_reason(cache_dir),
    )


def _own_pids() -> frozenset[int]:
    pids = {os.getpid()}
    try:
        pids.update(p.pid for p in psutil.Process().parents())
    except psutil.Error:
        pass
    return frozenset(pids)


def _relevant_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``CUDA_VISIBLE_DEVICES`` and the NCCL-related variables, a secret-looking value masked."""
    rule = SecretRule()
    out: dict[str, str] = {}
    for key, value in environ.items():
        if key == "CUDA_VISIBLE_DEVICES" or key.startswith(NCCL_ENV_PREFIXES):
            secret = rule.is_secret_name(key) or rule.looks_secret(value)
            out[key] = MASK if secret else value
    return out


def gather_facts(
    out_dir: Path,
    *,
    model: str | None = None,
    nvml: ModuleType | None = None,
    environ: Mapping[str, str] | None = None,
    reader: Callable[[ModuleType | None], HealthReading] = read_gpu_health,
    host: Callable[..., HostFacts] = host_facts,
    python: str | None = sys.executable,
    python_for: str = "autotune itself",
    interpreter: Callable[[str], InterpreterFacts] = read_interpreter,
) -> Facts:
    """Read everything the checks need, once.

    Args:
        out_dir: where studies are written (``--out``): free disk is measured there.
        model: ``--model``, to say what offloading it needs of host RAM.
        nvml: the ``pynvml`` module (tests pass the autospec fake).
        environ: the environment (default: this process's).
        reader: the GPU reader (the probes' gated NVML reads).
        host: the host reader.
        python: the interpreter the trials run with, whose torch and frameworks are judged (default
            autotune's own; None: the trials run the user's own command, there is none to read).
        python_for: whose interpreter it is, for the doctor's line (``"the swift backend's trials"``).
        interpreter: the interpreter reader (one subprocess per interpreter).
    """
    environ = os.environ if environ is None else environ
    nvml_error: str | None = None
    reading: HealthReading | None = None
    try:
        reading = reader(nvml)
    except NvmlUnavailable as exc:
        nvml_error = str(exc)
    gpus = reading.gpus if reading else ()
    visible_error: str | None = None
    visible: tuple[GpuHealth, ...] = ()
    if reading is not None:  # without NVML there is nothing CUDA_VISIBLE_DEVICES could name
        try:
            visible = visible_devices(gpus, environ.get("CUDA_VISIBLE_DEVICES"))
        except HardwareError as exc:
            visible_error = exc.message
    read: InterpreterFacts | None = None
    read_error: str | None = None
    if python is not None:
        try:
            read = interpreter(python)
        except MachineError as exc:
            read_error = exc.message
    return Facts(
        driver_version=reading.driver_version if reading else None,
        cuda_driver_version=reading.cuda_driver_version if reading else None,
        nvml_error=nvml_error,
        gpus=tuple(visible),
        gpus_listed=len(gpus),
        visible_error=visible_error,
        nvml_warnings=reading.warnings if reading else (),
        own_pids=_own_pids(),
        packages=dict(read.packages) if read else {},
        requirements=dict(read.requirements) if read else {},
        importable=dict(read.importable) if read else {},
        env=_relevant_env(environ),
        host=host(out_dir, model=model, n_gpus=max(1, len(visible))),
        interpreter=read,
        interpreter_for=python_for,
        interpreter_error=read_error,
    )
