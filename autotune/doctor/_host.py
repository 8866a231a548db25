"""Checks of the host: ``/dev/shm``, the open-file limit, free disk under ``--out``, RAM against what
offload needs, and the NCCL-related environment."""

from __future__ import annotations

from autotune.doctor._base import Check, Facts, Finding, HostFacts

__all__ = [
    "ShmCheck",
    "OpenFilesCheck",
    "DiskCheck",
    "CacheCheck",
    "HostRamCheck",
    "NcclEnvCheck",
    "NCCL_ENV_PREFIXES",
]

GIB = 1024**3
MIB = 1024**2
#: NCCL keeps its intra-node buffers in /dev/shm: Docker's 64 MiB default breaks multi-GPU runs
SHM_FAIL_MULTI_GPU_BYTES = 256 * MIB
#: below this, data-loader workers (tensors passed through shared memory) fail with "bus error"
SHM_WARN_BYTES = 1 * GIB
OPEN_FILES_FAIL = 256
OPEN_FILES_WARN = 4096
#: below this a study cannot hold a few trials' logs and timelines (a CPU trial writes a few MB)
DISK_FAIL_BYTES = 64 * MIB
DISK_WARN_BYTES = 10 * GIB
RAM_WARN_AVAILABLE_BYTES = 2 * GIB
#: the environment the doctor reports: NCCL's own, torch's around it, and what changes every kernel
NCCL_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "GLOO_", "CUDA_LAUNCH_BLOCKING")
#: variables that make every collective or kernel slower than the cluster can: tuning under them
#: tunes a slower machine (NCCL's environment documentation: docs.nvidia.com/deeplearning/nccl)
SLOWING_ENV = {
    "NCCL_P2P_DISABLE": "GPU peer-to-peer transfers off",
    "NCCL_SHM_DISABLE": "shared-memory transport off",
    "NCCL_IB_DISABLE": "InfiniBand off",
    "CUDA_LAUNCH_BLOCKING": "every kernel launch waits for the previous one",
}
_FALSE = {"", "0", "false", "no", "off"}


def _gib(n: int) -> str:
    """GiB with one decimal; below 1 GiB in MiB, so a nearly full disk never reads "0.0 GiB"."""
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB"


def _host(facts: Facts) -> HostFacts | None:
    return facts.host


class ShmCheck(Check):
    """``/dev/shm``: NCCL's intra-node transport and data-loader workers live there."""

    name = "shm"
    quick = True

    def run(self, facts: Facts) -> list[Finding]:
        host = _host(facts)
        if host is None:
            return []
        fix = "Give the container more shared memory (docker run --shm-size=16g, or --ipc=host)"
        size = host.shm_total_bytes
        if size is None:
            return [
                self.warn(
                    "/dev/shm is missing",
                    "Mount a tmpfs on /dev/shm (docker run --shm-size=16g, or --ipc=host)",
                )
            ]
        if len(facts.gpus) >= 2 and size < SHM_FAIL_MULTI_GPU_BYTES:
            return [
                self.fail(
                    f"/dev/shm is {size / MIB:.0f} MiB: NCCL between {len(facts.gpus)} GPUs needs more",
                    fix,
                )
            ]
        if size < SHM_WARN_BYTES:
            return [self.warn(f"/dev/shm is {size / MIB:.0f} MiB: data-loader workers may fail", fix)]
        return [self.ok(f"/dev/shm is {_gib(size)}")]


class OpenFilesCheck(Check):
    """The open-file limit: trials open logs, sockets, shared-memory handles and many library files."""

    name = "open-files"
    quick = True

    def run(self, facts: Facts) -> list[Finding]:
        host = _host(facts)
        if host is None or host.open_files_soft is None:
            return []
        soft, hard = host.open_files_soft, host.open_files_hard
        shown = f"{soft} (hard limit {hard})" if hard is not None else str(soft)
        if hard is not None and hard > soft:
            fix = f"ulimit -n {min(hard, 65536)} in the shell that runs autotune"
        else:
            fix = "Raise nofile in /etc/security/limits.conf (or the container's --ulimit nofile=65536)"
        if soft < OPEN_FILES_FAIL:
            return [self.fail(f"open-file limit is {shown}", fix)]
        if soft < OPEN_FILES_WARN:
            return [self.warn(f"open-file limit is {shown}: multi-GPU trials can run out", fix)]
        return [self.ok(f"open-file limit is {shown}")]


class DiskCheck(Check):
    """``--out`` can be written by this user, and has free disk: every trial writes its logs and
    timeline there."""

    name = "disk"
    quick = True

    def run(self, facts: Facts) -> list[Finding]:
        host = _host(facts)
        if host is None:
            return []
        if host.out_problem is not None:  # a permission, not space: say which folder and how to fix it
            return [
                self.fail(
                    f"cannot write --out {host.out_dir} ({host.out_problem})",
                    f"Let this user read and write {_blocking(host.out_problem)} (chmod, chown), or pass "
                    "--out a folder it can write",
                )
            ]
        free = host.disk_free_bytes
        fix = f"Free space under {host.out_dir}, or pass --out on a larger disk"
        if free is None:
            return [
                self.warn(f"cannot read the free space under {host.out_dir}", "Pass --out a local folder")
            ]
        if free < DISK_FAIL_BYTES:
            return [self.fail(f"{_gib(free)} free under {host.out_dir}", fix)]
        if free < DISK_WARN_BYTES:
            return [self.warn(f"{_gib(free)} free under {host.out_dir}: a long study may fill it", fix)]
        return [self.ok(f"{_gib(free)} free under {host.out_dir}")]


class CacheCheck(Check):
    """autotune's cache can be written: the built-in models are built there, ``--bench`` and
    ``--calibrate`` store what they measure there."""

    name = "cache"

    def run(self, facts: Facts) -> list[Finding]:
        host = _host(facts)
        if host is None or host.cache_dir is None:
            return []
        if host.cache_problem is not None:
            return [
                self.warn(
                    f"cannot write the cache {host.cache_dir} ({host.cache_problem}): the built-in models "
                    "cannot be built, nor --bench and --calibrate results kept",
                    f"Set AUTOTUNE_CACHE_DIR to a folder this user can write, or let it write "
                    f"{_blocking(host.cache_problem)}",
                )
            ]
        return [self.ok(f"{host.cache_dir} can be written")]


def _blocking(problem: str) -> str:
    """The folder named by a writability problem (``"/data: Permission denied"`` → ``/data``)."""
    return problem.rsplit(": ", 1)[0]


class HostRamCheck(Check):
    """Host RAM against what a fully offloaded ZeRO-3 run of ``--model`` keeps there (DeepSpeed's own
    estimate, ``estimate_zero3_model_states_mem_needs``: 18 bytes per parameter × 1.5). Never a failure:
    a search without offload still runs; the warning says which configurations cannot."""

    name = "host-ram"

    def run(self, facts: Facts) -> list[Finding]:
        host = _host(facts)
        if host is None:
            return []
        have = f"{_gib(host.ram_total_bytes)} RAM, {_gib(host.ram_available_bytes)} available"
        need = host.offload_need_bytes
        if need is not None:
            what = f"offloading {host.model} (ZeRO-3, parameters and optimizer) needs {_gib(need)}"
            if need > host.ram_total_bytes:  # a warning: the search still runs without offload
                return [
                    self.warn(
                        f"{what}; the host has {have}: offloaded configurations cannot run here",
                        "Leave offload out of the search (--pin the offload knobs off), use LoRA, or more nodes",
                    )
                ]
            if need > host.ram_available_bytes:
                return [
                    self.warn(
                        f"{what}; only {_gib(host.ram_available_bytes)} is available now",
                        "Stop what holds the host's memory, or keep offload out of the search",
                    )
                ]
            return [self.ok(f"{have}; {what}")]
        if host.ram_available_bytes < RAM_WARN_AVAILABLE_BYTES:
            return [
                self.warn(
                    f"{have}: trials may be killed by the kernel's OOM killer",
                    "Stop what holds the host's memory",
                )
            ]
        if host.model:
            return [
                self.ok(
                    f"{have}; the size of {host.model} is unknown here (a catalog name or a local folder says it)"
                )
            ]
        return [self.ok(f"{have} (give --model to check what offload would need)")]


class NcclEnvCheck(Check):
    """The NCCL-related environment that is set, shown as set; settings that slow every collective or
    kernel are warnings (a tuned configuration would be tuned for a slower machine)."""

    name = "nccl-env"

    def run(self, facts: Facts) -> list[Finding]:
        set_ = {k: v for k, v in sorted(facts.env.items()) if k.startswith(NCCL_ENV_PREFIXES)}
        slowing = [
            f"{k}={v} ({SLOWING_ENV[k]})"
            for k, v in set_.items()
            if k in SLOWING_ENV and v.strip().lower() not in _FALSE
        ]
        if slowing:
            return [
                self.warn(
                    "set: " + "; ".join(slowing),
                    "Unset them unless this cluster needs them: trials would tune a slower machine",
                )
            ]
        if not set_:
            return [self.ok("none set")]
        return [self.ok("set: " + ", ".join(f"{k}={v}" for k, v in set_.items()))]
