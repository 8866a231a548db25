from __future__ import annotations

from unittest import mock

import pynvml
import pytest
from autotune.probes.nvml import detect_gpus

from autotune.errors import HardwareError
from autotune.study.hardware import resolve_hardware


def fake_nvml(n: int, memory_gib: int = 24) -> mock.MagicMock:
    nvml = mock.create_autospec(pynvml, spec_set=False)
    nvml.NVMLError = pynvml.NVMLError
    nvml.nvmlDeviceGetCount.return_value = n
    nvml.nvmlDeviceGetHandleByIndex.side_effect = lambda i: f"h{i}"
    nvml.nvmlDeviceGetName.side_effect = lambda h: "NVIDIA A10"
    nvml.nvmlDeviceGetUUID.side_effect = lambda h: f"GPU-{h}"
    nvml.nvmlDeviceGetMemoryInfo.side_effect = lambda h: mock.Mock(
        total=memory_gib * 2**30, used=0, free=memory_gib * 2**30
    )
    nvml.nvmlDeviceGetCudaComputeCapability.side_effect = lambda h: (8, 6)
    nvml.nvmlSystemGetDriverVersion.return_value = "550.54"
    nvml.nvmlSystemGetCudaDriverVersion_v2.return_value = 12040
    return nvml


def no_driver() -> mock.MagicMock:
    nvml = mock.create_autospec(pynvml, spec_set=False)
    nvml.NVMLError = pynvml.NVMLError
    nvml.nvmlInit.side_effect = pynvml.NVMLError_LibraryNotFound()
    return nvml


def test_detects_gpus_through_the_real_api_signatures() -> None:
    nvml = fake_nvml(4)
    hw = resolve_hardware(2, detector=lambda: detect_gpus(nvml))
    assert [g.index for g in hw.gpus] == [0, 1]
    assert hw.gpus[0].name == "NVIDIA A10" and hw.gpus[0].compute_capability == "8.6"
    assert hw.driver_version == "550.54" and hw.cuda_driver_version == "12.4"
    assert hw.visible
    nvml.nvmlShutdown.assert_called_once_with()


def test_all_detected_by_default_and_cpu_when_none() -> None:
    assert len(resolve_hardware(None, detector=lambda: detect_gpus(fake_nvml(3))).gpus) == 3
    hw = resolve_hardware(None, detector=lambda: detect_gpus(no_driver()))
    assert hw.cpu_only and "NVML could not start" in (hw.nvml_note or "")


def test_more_gpus_than_detected_is_an_error_naming_the_fix() -> None:
    with pytest.raises(HardwareError) as info:
        resolve_hardware(4, detector=lambda: detect_gpus(no_driver()))
    assert "asked for 4 GPU(s)" in info.value.one_line() and "--gpu-type" in info.value.one_line()
    with pytest.raises(HardwareError, match="NVML sees 2"):
        resolve_hardware(4, detector=lambda: detect_gpus(fake_nvml(2)))


def test_declared_gpus_by_memory() -> None:
    hw = resolve_hardware(4, gpu_memory_gib=24, detector=lambda: detect_gpus(no_driver()))
    assert len(hw.gpus) == 4 and all(g.declared and g.memory_total_bytes == 24 * 2**30 for g in hw.gpus)
    assert not hw.visible


@pytest.mark.parametrize("n", [0, -1])
def test_zero_gpus_is_an_error(n: int) -> None:
    with pytest.raises(HardwareError, match="at least 1"):
        resolve_hardware(n, detector=lambda: detect_gpus(no_driver()))


def test_cuda_visible_devices_selects_the_gpus_a_worker_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    hw = resolve_hardware(None, detector=lambda: detect_gpus(fake_nvml(8)))
    assert [g.index for g in hw.gpus] == [4, 5, 6, 7]
    assert [g.index for g in resolve_hardware(2, detector=lambda: detect_gpus(fake_nvml(8))).gpus] == [4, 5]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-h3,1")  # UUIDs (or their prefix) too, in that order
    assert [g.index for g in resolve_hardware(None, detector=lambda: detect_gpus(fake_nvml(8))).gpus] == [
        3,
        1,
    ]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert resolve_hardware(None, detector=lambda: detect_gpus(fake_nvml(8))).gpus == ()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "9")
    with pytest.raises(HardwareError, match="names GPU '9'"):
        resolve_hardware(None, detector=lambda: detect_gpus(fake_nvml(8)))


def test_a_command_that_runs_trials_is_never_told_to_declare_gpus_it_lacks() -> None:
    """Declared GPUs are fine for plan; for search on a CPU host they lead to trials that crash, so its
    hint says where the search can run instead (and plan's keeps the declaration)."""
    with pytest.raises(HardwareError) as cpu_host:
        resolve_hardware(4, detector=lambda: detect_gpus(no_driver()), runs_trials=True)
    assert "--gpu-type A10 or" not in str(cpu_host.value.hint) and "autotune plan --gpus 4" in str(
        cpu_host.value.hint
    )
    with pytest.raises(HardwareError) as two:
        resolve_hardware(4, detector=lambda: detect_gpus(fake_nvml(2)), runs_trials=True)
    assert "Use --gpus 2 or fewer" in str(two.value.hint)
    with pytest.raises(HardwareError) as plan:
        resolve_hardware(4, detector=lambda: detect_gpus(no_driver()))
    assert "--gpu-type A10" in str(plan.value.hint)
