"""Checks of the GPUs and their driver: NVML, torch's CUDA against the driver, which GPUs this process
may use and who else is on them, MIG, persistence, ECC and clock-event reasons.

A machine without a GPU is a warning (``nvml``), never a failure: the other GPU checks then have
nothing to say.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from autotune.doctor._base import Check, Facts, Finding
from autotune.probes.gpu_health import CLOCK_EVENT_NAMES, GpuHealth

__all__ = [
    "NvmlCheck",
    "TorchCudaCheck",
    "VisibleGpusCheck",
    "BusyGpusCheck",
    "MigCheck",
    "PersistenceCheck",
    "EccCheck",
    "ClockEventsCheck",
    "torch_cuda_version",
]

GIB = 1024**3
#: others holding this share of a GPU's memory leave a trial sized for the whole GPU no room: a fail
BUSY_FAIL_SHARE = 0.5
#: memory in use with no process listed (another container's) above this is worth a warning
UNATTRIBUTED_WARN_BYTES = 2 * GIB
#: clock-event bits that mean the hardware protects itself (cooling, power delivery): a fail
HARDWARE_EVENTS = 0x8 | 0x40 | 0x80
#: the CUDA runtime wheels torch depends on when its version has no ``+cuXYZ`` tag (PyPI's Linux builds)
CUDA_RUNTIME_DISTS = ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu11", "nvidia-cuda-runtime")


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def _indices(gpus: tuple[GpuHealth, ...]) -> str:
    return ",".join(str(g.index) for g in gpus)


class NvmlCheck(Check):
    """The driver answers through NVML and lists GPUs. No GPU is a warning: ``plan`` works without one."""

    name = "nvml"
    quick = True

    def run(self, facts: Facts) -> list[Finding]:
        if facts.nvml_error is not None:
            return [
                self.warn(
                    f"no GPU: NVML is unavailable ({facts.nvml_error})",
                    "On a GPU host install or load the NVIDIA driver (nvidia-smi must work); "
                    "on a CPU machine autotune plan works and search runs CPU trials",
                )
            ]
        if facts.gpus_listed == 0:
            return [
                self.warn(
                    f"no GPU: NVML (driver {facts.driver_version}) lists none",
                    "Check that the GPUs are passed to this container (docker run --gpus all) and nvidia-smi lists them",
                )
            ]
        return [
            self.ok(
                f"driver {facts.driver_version}, CUDA {facts.cuda_driver_version or '?'}, "
                f"{facts.gpus_listed} GPU(s) listed"
            )
        ]


def torch_cuda_version(packages: Mapping[str, str]) -> tuple[str | None, bool]:
    """The CUDA version the installed torch was built for, read from package metadata (torch is not
    imported), and whether it is a CPU-only build: ``("12.4", False)``, ``(None, True)``.

    A ``+cu124`` local version says it; a version without one (PyPI's Linux wheels) runs on the CUDA
    runtime wheel it depends on (``nvidia-cuda-runtime-cu12 12.4.127``). ``+cpu``: CPU only.
    """
    pkgs = packages
    torch = pkgs.get("torch")
    if torch is None:
        return None, False
    local = torch.partition("+")[2]
    if local.startswith("cpu"):
        return None, True
    tag = re.fullmatch(r"cu(\d+)(\d)", local)
    if tag:
        return f"{int(tag.group(1))}.{tag.group(2)}", False
    for dist in CUDA_RUNTIME_DISTS:
        runtime = pkgs.get(dist)
        if runtime:
            major, _, rest = runtime.partition(".")
            return f"{major}.{rest.partition('.')[0]}", False
    return None, False


def _version_tuple(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor.partition(".")[0] or 0)


class TorchCudaCheck(Check):
    """The installed torch's CUDA against what the driver supports.

    NVIDIA's CUDA compatibility rules (docs.nvidia.com/deploy/cuda-compatibility, "Minor Version
    Compatibility"): a runtime of a newer *major* version than the driver does not start; a newer
    *minor* version of the same major runs with limited features (no PTX JIT of newer code), so it is a
    warning. A CPU build of torch on a host with GPUs trains on the CPU: a failure.
    """

    name = "torch-cuda"
    quick = True

    def run(self, facts: Facts) -> list[Finding]:
        if facts.interpreter is None:  # none to read, or unreadable: the interpreter check says which
            return []
        torch = facts.packages.get("torch")
        has_gpus = bool(facts.gpus)
        if torch is None:
            return [
                self.warn(
                    "torch is not installed (the trl and ms-swift backends need it)",
                    "pip install torch, a build for CUDA no newer than the driver's "
                    f"({facts.cuda_driver_version or 'see nvidia-smi'})",
                )
            ]
        cuda, cpu_only = torch_cuda_version(facts.packages)
        built = facts.interpreter.torch_cuda_build()
        if (
            cuda is None
            and not cpu_only
            and built is not None
            and facts.interpreter.packages.get("torch") == torch
        ):
            cuda, cpu_only = (
                built  # no tag nor runtime wheel (a conda or source build): torch/version.py says
            )
        driver = facts.cuda_driver_version
        if cpu_only:
            if has_gpus:
                return [
                    self.fail(
                        f"torch {torch} is a CPU-only build and {len(facts.gpus)} GPU(s) are visible",
                        f"pip install torch --index-url https://download.pytorch.org/whl/cu{(driver or '12.4').replace('.', '')} "
                        "(a CUDA build no newer than the driver's CUDA)",
                    )
                ]
            return [self.ok(f"torch {torch} (CPU build; no GPU here)")]
        if cuda is None:
            return [
                self.warn(
                    f"torch {torch}: cannot tell which CUDA it was built for",
                    "Check python -c 'import torch; print(torch.version.cuda)' against nvidia-smi's CUDA Version",
                )
            ]
        if driver is None:
            return [self.ok(f"torch {torch} built for CUDA {cuda}; no driver here to compare with")]
        if _version_tuple(cuda)[0] > _version_tuple(driver)[0]:
            return [
                self.fail(
                    f"torch {torch} needs CUDA {cuda} and the driver supports CUDA {driver} at most",
                    f"Upgrade the NVIDIA driver to one for CUDA {cuda}, or install a torch built for CUDA "
                    f"{driver} (pip install torch --index-url https://download.pytorch.org/whl/cu{driver.replace('.', '')})",
                )
            ]
        if _version_tuple(cuda) > _version_tuple(driver):
            return [
                self.warn(
                    f"torch {torch} is built for CUDA {cuda}, newer than the driver's {driver}: it runs under "
                    "CUDA minor-version compatibility, without PTX JIT of newer kernels",
                    f"Upgrade the NVIDIA driver to one for CUDA {cuda} if kernels fail to load",
                )
            ]
        return [self.ok(f"torch {torch} built for CUDA {cuda}; the driver supports CUDA {driver}")]


class VisibleGpusCheck(Check):
    """The GPUs this process may use: every GPU NVML lists, or those ``CUDA_VISIBLE_DEVICES`` names."""

    name = "gpus"
    quick = True

    def run(self, facts: Facts) -> list[Finding]:
        if facts.visible_error is not None:
            return [
                self.fail(
                    facts.visible_error,
                    "Set CUDA_VISIBLE_DEVICES to NVML indices (nvidia-smi's numbers) or GPU UUIDs, or unset it",
                )
            ]
        if facts.nvml_error is not None or facts.gpus_listed == 0:
            return []
        chosen = facts.env.get("CUDA_VISIBLE_DEVICES")
        if not facts.gpus:
            return [
                self.warn(
                    f"CUDA_VISIBLE_DEVICES={chosen!r} hides all {facts.gpus_listed} GPU(s)",
                    "Unset CUDA_VISIBLE_DEVICES or list the GPUs to use, e.g. CUDA_VISIBLE_DEVICES=0,1",
                )
            ]
        names = sorted({g.name for g in facts.gpus})
        how = f" (CUDA_VISIBLE_DEVICES={chosen})" if chosen is not None else ""
        return [self.ok(f"GPU {_indices(facts.gpus)} visible{how}: {', '.join(names)}")]


class BusyGpusCheck(Check):
    """Other processes on the visible GPUs: their memory is not the trial's, and their kernels slow it.

    Fails when others hold half a GPU's memory or more (a trial sized for the GPU cannot fit); a smaller
    share, compute without a listed process, or memory no process accounts for (another container's) is
    a warning.
    """

    name = "gpu-busy"
    quick = True

    def run(self, facts: Facts) -> list[Finding]:
        out: list[Finding] = []
        for g in facts.gpus:
            out.extend(self._one(g, facts.own_pids))
        if facts.gpus and not out:
            out.append(self.ok(f"no other process on GPU {_indices(facts.gpus)}"))
        return out

    def _one(self, g: GpuHealth, own: frozenset[int]) -> list[Finding]:
        others = [(pid, used) for pid, used in (g.processes or ()) if pid not in own]
        held = sum(used or 0 for _, used in others)
        fix = (
            f"Stop them or wait for them to end (nvidia-smi -i {g.index} lists them), "
            "or choose other GPUs with CUDA_VISIBLE_DEVICES"
        )
        if others:
            pids = ", ".join(str(pid) for pid, _ in others[:5]) + (" …" if len(others) > 5 else "")
            detail = f"GPU {g.index}: process(es) {pids} hold {_gib(held)} of {_gib(g.memory_total_bytes)}"
            if held >= BUSY_FAIL_SHARE * g.memory_total_bytes:
                return [self.fail(detail, fix)]
            return [self.warn(detail + "; trials share the GPU with them", fix)]
        if g.processes is not None and (g.memory_used_bytes or 0) > UNATTRIBUTED_WARN_BYTES:
            return [
                self.warn(
                    f"GPU {g.index}: {_gib(g.memory_used_bytes or 0)} in use and no process listed "
                    "(another container's, or processes NVML cannot attribute)",
                    fix,
                )
            ]
        if (g.gpu_util_pct or 0) > 0:
            return [
                self.warn(f"GPU {g.index}: {g.gpu_util_pct}% busy with no process of this host listed", fix)
            ]
        return []


class MigCheck(Check):
    """MIG mode: CUDA then sees GPU instances (slices), not the GPU autotune sizes trials for."""

    name = "mig"
    quick = True

    def run(self, facts: Facts) -> list[Finding]:
        on = [g for g in facts.gpus if g.mig_enabled]
        if on:
            return [
                self.fail(
                    f"MIG mode is on for GPU {_indices(tuple(on))}: a process gets one slice, not the GPU",
                    "Turn MIG off while tuning (sudo nvidia-smi -i N -mig 0 with the GPU idle; "
                    "some GPUs need a reset), or use GPUs without MIG",
                )
            ]
        known = [g for g in facts.gpus if g.mig_enabled is not None]
        if not facts.gpus:
            return []
        if not known:
            return [self.ok("MIG not supported by these GPUs")]
        return [self.ok(f"MIG off on GPU {_indices(tuple(known))}")]


class PersistenceCheck(Check):
    """Persistence mode off: the driver tears the GPU down after each process, so every trial's start
    pays the GPU's initialisation again and start-up times vary."""

    name = "persistence"

    def run(self, facts: Facts) -> list[Finding]:
        off = [g for g in facts.gpus if g.persistence_enabled is False]
        if off:
            return [
                self.warn(
                    f"persistence mode is off on GPU {_indices(tuple(off))}: each trial re-initialises the GPU",
                    "sudo nvidia-smi -pm 1 (or run nvidia-persistenced)",
                )
            ]
        if not facts.gpus:
            return []
        return [self.ok(f"persistence mode on (or not reported) on GPU {_indices(facts.gpus)}")]


class EccCheck(Check):
    """Uncorrected ECC errors since the driver loaded fail the GPU; ECC off is a warning."""

    name = "ecc"
    quick = True

    def run(self, facts: Facts) -> list[Finding]:
        bad = [g for g in facts.gpus if (g.ecc_uncorrected_volatile or 0) > 0]
        if bad:
            counts = ", ".join(f"GPU {g.index}: {g.ecc_uncorrected_volatile}" for g in bad)
            return [
                self.fail(
                    f"uncorrected ECC errors since the driver loaded ({counts})",
                    f"Drain and reset the GPU (sudo nvidia-smi -r -i {bad[0].index}) or have it serviced; "
                    "meanwhile leave it out with CUDA_VISIBLE_DEVICES",
                )
            ]
        off = [g for g in facts.gpus if g.ecc_enabled is False]
        if off:
            return [
                self.warn(
                    f"ECC is off on GPU {_indices(tuple(off))}: memory errors go undetected",
                    "sudo nvidia-smi -i N -e 1 and reboot, unless it is off on purpose",
                )
            ]
        if not facts.gpus:
            return []
        return [self.ok(f"no uncorrected ECC error on GPU {_indices(facts.gpus)}")]


class ClockEventsCheck(Check):
    """Clock-event (throttle) reasons active now. Hardware slowdown, hardware thermal slowdown and the
    power brake mean the GPU protects itself (cooling, power delivery): a fail. A software power cap or
    software thermal slowdown on a GPU at rest is a warning: trials measured now run slower than the
    GPU can."""

    name = "clocks"

    def run(self, facts: Facts) -> list[Finding]:
        hard: list[str] = []
        soft: list[str] = []
        for g in facts.gpus:
            bits = g.clock_event_reasons or 0
            for bit, what in CLOCK_EVENT_NAMES.items():
                if bits & bit:
                    (hard if bit & HARDWARE_EVENTS else soft).append(f"GPU {g.index}: {what}")
        if hard:
            return [
                self.fail(
                    "clocks slowed by the hardware (" + "; ".join(hard + soft) + ")",
                    "Check cooling and power (nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER) before tuning",
                )
            ]
        if soft:
            return [
                self.warn(
                    "clocks slowed (" + "; ".join(soft) + ")",
                    "Wait for other work on the GPU to end, and check the power limit (nvidia-smi -q -d POWER)",
                )
            ]
        if not facts.gpus:
            return []
        return [self.ok(f"no clock slowdown on GPU {_indices(facts.gpus)}")]
