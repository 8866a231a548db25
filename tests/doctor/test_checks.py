"""Every check's ok / warn / fail branch, on facts read through the real gatherer from the autospec NVML
fake and a recorded CPU host; one case per fix message (the fix is what the user acts on)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
from autotune.probes.testing import FakeGpu, GiB

from autotune.doctor import CHECKS, Facts, Status, run_checks
from tests.doctor.conftest import gpu_facts, recorded_host, recorded_packages

CUDA_TORCH = {"torch": "2.6.0+cu124"}


def _with(facts: Facts, **packages: str) -> Facts:
    return dataclasses.replace(facts, packages={**facts.packages, **packages})


def _gpus(**state: object) -> list[FakeGpu]:
    return [FakeGpu(uuid="GPU-a", **state), FakeGpu(uuid="GPU-b")]  # type: ignore[arg-type]


def _cpu(**host: object) -> Facts:
    """A machine without NVML (the recorded CPU host, ``host`` changed)."""
    facts = gpu_facts(1, driver="no_library", host=recorded_host(**host))
    return facts


def _findings(facts: Facts, check: str) -> list:
    return [f for f in run_checks(facts).findings if f.check == check]


# (case id, check, facts, status, words in the detail, words in the fix)
CASES: list[tuple[str, str, Callable[[], Facts], Status, str, str]] = [
    # nvml
    ("nvml-ok", "nvml", lambda: gpu_facts(2), Status.OK, "driver 550.54.15, CUDA 12.4, 2 GPU(s)", ""),
    (
        "nvml-no-driver",
        "nvml",
        lambda: _cpu(),
        Status.WARN,
        "no GPU: NVML is unavailable",
        "nvidia-smi must work",
    ),
    ("nvml-lists-none", "nvml", lambda: gpu_facts(0), Status.WARN, "lists none", "docker run --gpus all"),
    # the interpreter the torch, framework and pin checks read
    ("interpreter-ok", "interpreter", lambda: gpu_facts(1), Status.OK, "(Python 3.", ""),
    (
        "interpreter-none-for-a-command",
        "interpreter",
        lambda: dataclasses.replace(
            gpu_facts(1), interpreter=None, interpreter_for="the command backend's trials"
        ),
        Status.OK,
        "no Python interpreter to read: the command backend's trials run your own command",
        "",
    ),
    (
        "interpreter-unreadable",
        "interpreter",
        lambda: dataclasses.replace(
            gpu_facts(1), interpreter=None, interpreter_error="cannot run the trials' interpreter /x/python"
        ),
        Status.FAIL,
        "cannot run the trials' interpreter /x/python",
        "Point --executable at the trials' interpreter",
    ),
    # torch against the driver
    ("torch-ok", "torch-cuda", lambda: _with(gpu_facts(1), torch="2.6.0+cu124"), Status.OK, "CUDA 12.4", ""),
    (
        "torch-runtime-wheel",
        "torch-cuda",
        lambda: _with(gpu_facts(1), torch="2.6.0", **{"nvidia-cuda-runtime-cu12": "12.4.127"}),
        Status.OK,
        "built for CUDA 12.4",
        "",
    ),
    (
        "torch-newer-major",
        "torch-cuda",
        lambda: _with(gpu_facts(1, cuda_driver_version=11080), torch="2.6.0+cu124"),
        Status.FAIL,
        "needs CUDA 12.4 and the driver supports CUDA 11.8",
        "Upgrade the NVIDIA driver",
    ),
    (
        "torch-newer-minor",
        "torch-cuda",
        lambda: _with(gpu_facts(1, cuda_driver_version=12020), torch="2.6.0+cu124"),
        Status.WARN,
        "minor-version compatibility",
        "if kernels fail to load",
    ),
    (
        "torch-cpu-build-on-gpus",
        "torch-cuda",
        lambda: gpu_facts(2),
        Status.FAIL,
        "CPU-only build and 2 GPU(s)",
        "download.pytorch.org/whl/cu124",
    ),
    ("torch-cpu-build-on-cpu", "torch-cuda", lambda: _cpu(), Status.OK, "CPU build; no GPU here", ""),
    (
        "torch-missing",
        "torch-cuda",
        lambda: dataclasses.replace(
            gpu_facts(1), packages={k: v for k, v in recorded_packages()[0].items() if k != "torch"}
        ),
        Status.WARN,
        "torch is not installed",
        "pip install torch",
    ),
    (
        "torch-unknown-cuda",
        "torch-cuda",
        lambda: _with(gpu_facts(1), torch="2.6.0"),
        Status.WARN,
        "cannot tell which CUDA",
        "torch.version.cuda",
    ),
    # visible GPUs
    (
        "gpus-ok",
        "gpus",
        lambda: gpu_facts(4, environ={"CUDA_VISIBLE_DEVICES": "2,3"}),
        Status.OK,
        "GPU 2,3 visible (CUDA_VISIBLE_DEVICES=2,3)",
        "",
    ),
    (
        "gpus-hidden",
        "gpus",
        lambda: gpu_facts(2, environ={"CUDA_VISIBLE_DEVICES": ""}),
        Status.WARN,
        "hides all 2 GPU(s)",
        "CUDA_VISIBLE_DEVICES=0,1",
    ),
    (
        "gpus-unknown-entry",
        "gpus",
        lambda: gpu_facts(2, environ={"CUDA_VISIBLE_DEVICES": "7"}),
        Status.FAIL,
        "names GPU '7', which NVML does not list",
        "NVML indices",
    ),
    # other processes
    ("busy-none", "gpu-busy", lambda: gpu_facts(2), Status.OK, "no other process on GPU 0,1", ""),
    (
        "busy-most-memory",
        "gpu-busy",
        lambda: gpu_facts(_gpus(processes=[(4242, 60 * GiB)], memory_used_bytes=62 * GiB)),
        Status.FAIL,
        "process(es) 4242 hold 60.0 GiB of 80.0 GiB",
        "nvidia-smi -i 0 lists them",
    ),
    (
        "busy-some-memory",
        "gpu-busy",
        lambda: gpu_facts(_gpus(processes=[(4242, 4 * GiB)], memory_used_bytes=6 * GiB)),
        Status.WARN,
        "trials share the GPU with them",
        "CUDA_VISIBLE_DEVICES",
    ),
    (
        "busy-unattributed",
        "gpu-busy",
        lambda: gpu_facts(_gpus(memory_used_bytes=20 * GiB)),
        Status.WARN,
        "no process listed",
        "Stop them or wait",
    ),
    (
        "busy-compute-only",
        "gpu-busy",
        lambda: gpu_facts(_gpus(gpu_util_pct=97)),
        Status.WARN,
        "97% busy",
        "Stop them or wait",
    ),
    # MIG
    ("mig-off", "mig", lambda: gpu_facts(2), Status.OK, "MIG off on GPU 0,1", ""),
    (
        "mig-on",
        "mig",
        lambda: gpu_facts(_gpus(mig_mode=1)),
        Status.FAIL,
        "MIG mode is on for GPU 0",
        "-mig 0",
    ),
    (
        "mig-unsupported",
        "mig",
        lambda: gpu_facts([FakeGpu(not_supported={"nvmlDeviceGetMigMode"})]),
        Status.OK,
        "not supported",
        "",
    ),
    # persistence
    ("persistence-on", "persistence", lambda: gpu_facts(2), Status.OK, "persistence mode on", ""),
    (
        "persistence-off",
        "persistence",
        lambda: gpu_facts(_gpus(persistence_mode=0)),
        Status.WARN,
        "persistence mode is off on GPU 0",
        "nvidia-smi -pm 1",
    ),
    # ECC
    ("ecc-ok", "ecc", lambda: gpu_facts(2), Status.OK, "no uncorrected ECC error", ""),
    (
        "ecc-errors",
        "ecc",
        lambda: gpu_facts(_gpus(ecc_uncorrected_volatile=3)),
        Status.FAIL,
        "GPU 0: 3",
        "nvidia-smi -r -i 0",
    ),
    ("ecc-off", "ecc", lambda: gpu_facts(_gpus(ecc_mode=0)), Status.WARN, "ECC is off on GPU 0", "-e 1"),
    # clocks
    ("clocks-idle", "clocks", lambda: gpu_facts(2), Status.OK, "no clock slowdown", ""),
    (
        "clocks-power-cap",
        "clocks",
        lambda: gpu_facts(_gpus(clock_event_reasons=0x4)),
        Status.WARN,
        "GPU 0: software power cap",
        "nvidia-smi -q -d POWER",
    ),
    (
        "clocks-hw-thermal",
        "clocks",
        lambda: gpu_facts(_gpus(clock_event_reasons=0x40 | 0x1)),
        Status.FAIL,
        "hardware thermal slowdown",
        "Check cooling and power",
    ),
    # frameworks
    ("frameworks-ok", "frameworks", lambda: _cpu(), Status.OK, "trl 1.16.0, deepspeed 0.19.8", ""),
    (
        "frameworks-none",
        "frameworks",
        lambda: dataclasses.replace(_cpu(), packages={"torch": "2.6.0"}),
        Status.WARN,
        "no GRPO trainer installed",
        "autotune-grpo[trl]",
    ),
    (
        "frameworks-broken",
        "frameworks",
        lambda: dataclasses.replace(_cpu(), importable={"trl": False}),
        Status.FAIL,
        "without their import package: trl",
        "--force-reinstall trl",
    ),
    # pins (the frameworks' own Requires-Dist)
    ("pins-ok", "pins", lambda: _cpu(), Status.OK, "pins of trl", ""),
    (
        "pins-trl-vllm-extra",
        "pins",
        lambda: _with(_cpu(), vllm="0.8.5"),
        Status.FAIL,
        "trl requires vllm<=0.31.0,>=0.22.0, installed 0.8.5",
        "pip install 'vllm<=0.31.0,>=0.22.0' (trl's own pin)",
    ),
    # /dev/shm
    ("shm-ok", "shm", lambda: _cpu(), Status.OK, "/dev/shm is 23.5 GiB", ""),
    (
        "shm-docker-default-multi-gpu",
        "shm",
        lambda: gpu_facts(2, host=recorded_host(shm_total_bytes=64 * 1024**2)),
        Status.FAIL,
        "64 MiB: NCCL between 2 GPUs",
        "--shm-size=16g",
    ),
    (
        "shm-small-one-gpu",
        "shm",
        lambda: gpu_facts(1, host=recorded_host(shm_total_bytes=64 * 1024**2)),
        Status.WARN,
        "data-loader workers may fail",
        "--ipc=host",
    ),
    (
        "shm-missing",
        "shm",
        lambda: _cpu(shm_total_bytes=None),
        Status.WARN,
        "/dev/shm is missing",
        "Mount a tmpfs",
    ),
    # open files
    ("nofile-ok", "open-files", lambda: _cpu(), Status.OK, "20000", ""),
    (
        "nofile-low-raisable",
        "open-files",
        lambda: _cpu(open_files_soft=1024, open_files_hard=1048576),
        Status.WARN,
        "1024 (hard limit 1048576)",
        "ulimit -n 65536",
    ),
    (
        "nofile-tiny-hard",
        "open-files",
        lambda: _cpu(open_files_soft=128, open_files_hard=128),
        Status.FAIL,
        "open-file limit is 128",
        "limits.conf",
    ),
    # disk
    ("disk-ok", "disk", lambda: _cpu(), Status.OK, "free under /work/runs", ""),
    (
        "disk-low",
        "disk",
        lambda: _cpu(disk_free_bytes=5 * GiB),
        Status.WARN,
        "5.0 GiB free",
        "--out on a larger disk",
    ),
    (
        "disk-full",
        "disk",
        lambda: _cpu(disk_free_bytes=GiB // 32),
        Status.FAIL,
        "32 MiB free",
        "Free space under",
    ),
    (
        "disk-unreadable",
        "disk",
        lambda: _cpu(disk_free_bytes=None),
        Status.WARN,
        "cannot read",
        "a local folder",
    ),
    (  # issue 41: a folder this user cannot write is a permission, not a full disk
        "disk-unwritable",
        "disk",
        lambda: _cpu(out_problem="/work: Permission denied", disk_free_bytes=None),
        Status.FAIL,
        "cannot write --out /work/runs (/work: Permission denied)",
        "Let this user read and write /work (chmod, chown), or pass --out a folder it can write",
    ),
    # the cache
    (
        "cache-ok",
        "cache",
        lambda: _cpu(cache_dir=Path("/c/autotune")),
        Status.OK,
        "/c/autotune can be written",
        "",
    ),
    (
        "cache-unwritable",
        "cache",
        lambda: _cpu(cache_dir=Path("/c/autotune"), cache_problem="/c: Permission denied"),
        Status.WARN,
        "cannot write the cache /c/autotune (/c: Permission denied)",
        "Set AUTOTUNE_CACHE_DIR to a folder this user can write, or let it write /c",
    ),
    # host RAM
    ("ram-no-model", "host-ram", lambda: _cpu(), Status.OK, "give --model", ""),
    (
        "ram-offload-fits",
        "host-ram",
        lambda: _cpu(offload_need_bytes=10 * GiB, model="m"),
        Status.OK,
        "offloading m (ZeRO-3",
        "",
    ),
    (
        "ram-offload-not-now",
        "host-ram",
        lambda: _cpu(offload_need_bytes=23 * GiB, model="m"),
        Status.WARN,
        "only 21.7 GiB is available now",
        "keep offload out of the search",
    ),
    (
        "ram-offload-too-big",
        "host-ram",
        lambda: _cpu(offload_need_bytes=200 * GiB, model="m"),
        Status.WARN,
        "offloaded configurations cannot run here",
        "--pin the offload knobs off",
    ),
    (
        "ram-nearly-gone",
        "host-ram",
        lambda: _cpu(ram_available_bytes=GiB),
        Status.WARN,
        "OOM killer",
        "Stop what holds the host's memory",
    ),
    # NCCL environment
    ("nccl-none", "nccl-env", lambda: _cpu(), Status.OK, "none set", ""),
    (
        "nccl-set",
        "nccl-env",
        lambda: gpu_facts(1, environ={"NCCL_SOCKET_IFNAME": "eth0", "PATH": "/bin"}),
        Status.OK,
        "set: NCCL_SOCKET_IFNAME=eth0",
        "",
    ),
    (
        "nccl-slowing",
        "nccl-env",
        lambda: gpu_facts(1, environ={"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "0"}),
        Status.WARN,
        "NCCL_P2P_DISABLE=1 (GPU peer-to-peer transfers off)",
        "Unset them",
    ),
]


@pytest.mark.parametrize(
    ("check", "facts", "status", "detail", "fix"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_each_branch_and_its_fix(
    check: str, facts: Callable[[], Facts], status: Status, detail: str, fix: str
) -> None:
    found = _findings(facts(), check)
    assert len(found) == 1, found
    f = found[0]
    assert f.status is status, f.line()
    assert detail in f.detail, f.line()
    if fix:
        assert fix in f.fix, f.line()
    else:
        assert f.fix == ""


def test_every_check_has_a_case_for_each_of_its_branches() -> None:
    covered = {(c[1], c[3]) for c in CASES}
    for cls in CHECKS:
        assert (cls.name, Status.OK) in covered, cls.name
        assert (cls.name, Status.WARN) in covered or (cls.name, Status.FAIL) in covered, cls.name
    # the fail branches there are
    fails = {
        "interpreter",
        "torch-cuda",
        "gpus",
        "gpu-busy",
        "mig",
        "ecc",
        "clocks",
        "frameworks",
        "pins",
        "shm",
    }
    assert fails | {"open-files", "disk"} == {c[1] for c in CASES if c[3] is Status.FAIL}


def test_gpu_checks_say_nothing_without_a_gpu_and_no_gpu_is_not_a_failure() -> None:
    report = run_checks(_cpu())
    assert report.exit_code == 0
    names = {f.check for f in report.findings}
    assert {"gpus", "gpu-busy", "mig", "persistence", "ecc", "clocks"}.isdisjoint(names)
    assert [f.status for f in report.findings if f.check == "nvml"] == [Status.WARN]


def test_a_failure_makes_the_exit_code_one_and_a_broken_check_is_a_warning() -> None:
    assert run_checks(gpu_facts(_gpus(mig_mode=1))).exit_code == 1

    class Broken(CHECKS[0]):  # type: ignore[misc, valid-type]
        name = "broken"

        def run(self, facts: Facts) -> list:
            raise ZeroDivisionError("oops")

    report = run_checks(_cpu(), checks=(Broken,))
    assert report.exit_code == 0
    assert report.findings[0].status is Status.WARN and "ZeroDivisionError: oops" in report.findings[0].detail


def test_own_processes_are_not_another_user() -> None:
    facts = gpu_facts(_gpus(processes=[(4242, 60 * GiB)]))
    mine = dataclasses.replace(facts, own_pids=frozenset({4242}))
    assert [f.status for f in _findings(mine, "gpu-busy")] == [Status.OK]


def test_the_quick_subset_is_what_search_runs() -> None:
    quick = {f.check for f in run_checks(gpu_facts(2), quick=True).findings}
    assert quick == {c.name for c in CHECKS if c.quick}
    assert {
        "nvml",
        "interpreter",
        "torch-cuda",
        "gpus",
        "gpu-busy",
        "mig",
        "ecc",
        "shm",
        "open-files",
        "disk",
    } == quick


def test_secret_looking_nccl_values_are_masked() -> None:
    facts = gpu_facts(1, environ={"NCCL_NET_PLUGIN_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz1234"})
    assert facts.env["NCCL_NET_PLUGIN_TOKEN"] == "***"


def test_out_dir_that_does_not_exist_yet_is_measured_on_its_parent(tmp_path: Path) -> None:
    from autotune.doctor import host_facts

    host = host_facts(tmp_path / "a" / "b")
    assert host.disk_free_bytes is not None and host.disk_free_bytes > 0
    assert host.out_problem is None and not (tmp_path / "a").exists()  # proved writable, nothing left


def test_the_folder_that_stops_a_write_is_named(tmp_path: Path) -> None:
    from autotune.writable import unwritable_reason

    (tmp_path / "file").write_text("x")
    assert unwritable_reason(tmp_path / "file" / "runs") == f"{tmp_path / 'file'}: Not a directory"
    assert unwritable_reason(tmp_path / "file") == f"{tmp_path / 'file'}: not a directory"
    assert unwritable_reason(Path("/proc/x")) == "/proc: No such file or directory"
    assert unwritable_reason(tmp_path / "new" / "deeper") is None
    assert list(tmp_path.iterdir()) == [tmp_path / "file"]


def test_offload_need_is_the_estimators_zero3_host_states() -> None:
    from autotune.doctor import offload_need_bytes
    from autotune.estimate import find_model

    spec = find_model("Qwen2-7B")
    assert spec is not None
    need = offload_need_bytes("Qwen2-7B", 8)
    assert need == int(spec.params * 18 * 1.5)  # DeepSpeed's zero_init estimate for full offload


def test_a_model_of_unknown_size_says_so() -> None:
    (finding,) = _findings(_cpu(model="org/unknown"), "host-ram")
    assert finding.status is Status.OK and "the size of org/unknown is unknown" in finding.detail
