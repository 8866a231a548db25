"""Reading the machine once, for every check: NVML through the probes' gate, package metadata (nothing
imported), the host's limits and free space. Each source is a parameter, so tests pass fakes."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path
from types import ModuleType

import psutil

from autotune.doctor._base import Facts, HostFacts
from autotune.doctor._frameworks import FRAMEWORKS, WATCHED
from autotune.doctor._gpu import CUDA_RUNTIME_DISTS
from autotune.doctor._host import NCCL_ENV_PREFIXES
from autotune.errors import HardwareError
from autotune.probes.gpu_health import GpuHealth, HealthReading, read_gpu_health
from autotune.probes.nvml import NvmlUnavailable
from autotune.secrets import MASK, SecretRule
from autotune.study.hardware import visible_devices

__all__ = ["gather_facts", "installed_packages", "host_facts", "offload_need_bytes"]


def installed_packages(
    dists: tuple[str, ...] = (*WATCHED, *CUDA_RUNTIME_DISTS),
) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """Versions and ``Requires-Dist`` lines of the installed distributions among ``dists``."""
    versions: dict[str, str] = {}
    requires: dict[str, tuple[str, ...]] = {}
    for dist in dists:
        try:
            found = metadata.distribution(dist)
        except metadata.PackageNotFoundError:
            continue
        versions[dist] = found.version
        if dist in WATCHED:
            requires[dist] = tuple(found.requires or ())
    return versions, requires


def _importable(packages: Mapping[str, str]) -> dict[str, bool]:
    """Whether each installed framework's import package is found (``find_spec``: nothing is run)."""
    out: dict[str, bool] = {}
    for dist, module in FRAMEWORKS.items():
        if dist in packages:
            try:
                out[dist] = find_spec(module) is not None
            except (ImportError, ValueError):
                out[dist] = False
    return out


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
) -> Facts:
    """Read everything the checks need, once.

    Args:
        out_dir: where studies are written (``--out``): free disk is measured there.
        model: ``--model``, to say what offloading it needs of host RAM.
        nvml: the ``pynvml`` module (tests pass the autospec fake).
        environ: the environment (default: this process's).
        reader: the GPU reader (the probes' gated NVML reads).
        host: the host reader.
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
    packages, requirements = installed_packages()
    return Facts(
        driver_version=reading.driver_version if reading else None,
        cuda_driver_version=reading.cuda_driver_version if reading else None,
        nvml_error=nvml_error,
        gpus=tuple(visible),
        gpus_listed=len(gpus),
        visible_error=visible_error,
        nvml_warnings=reading.warnings if reading else (),
        own_pids=_own_pids(),
        packages=packages,
        requirements=requirements,
        importable=_importable(packages),
        env=_relevant_env(environ),
        host=host(out_dir, model=model, n_gpus=max(1, len(visible))),
    )
