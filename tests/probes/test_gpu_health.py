"""The doctor's GPU reads go through the probes' gate: values from the autospec NVML fake, and a query
the driver refuses is None and one warning, never an exception."""

from __future__ import annotations

import pytest
from autotune.probes.gpu_health import read_gpu_health
from autotune.probes.nvml import NvmlUnavailable
from autotune.probes.testing import FakeGpu, GiB, fake_nvml


def test_reads_modes_processes_and_clock_events() -> None:
    fake = fake_nvml(
        [
            FakeGpu(uuid="GPU-a", processes=[(11, 3 * GiB)], memory_used_bytes=4 * GiB, gpu_util_pct=40),
            FakeGpu(
                uuid="GPU-b",
                mig_mode=1,
                persistence_mode=0,
                ecc_uncorrected_volatile=2,
                clock_event_reasons=0x44,
            ),
        ]
    )
    reading = read_gpu_health(fake.module)
    a, b = reading.gpus
    assert reading.driver_version == "550.54.15" and reading.cuda_driver_version == "12.4"
    assert (a.processes, a.memory_used_bytes, a.gpu_util_pct) == (((11, 3 * GiB),), 4 * GiB, 40)
    assert (a.mig_enabled, a.persistence_enabled, a.ecc_enabled, a.ecc_uncorrected_volatile) == (
        False,
        True,
        True,
        0,
    )
    assert (b.mig_enabled, b.persistence_enabled, b.ecc_uncorrected_volatile, b.clock_event_reasons) == (
        True,
        False,
        2,
        0x44,
    )
    assert reading.warnings == ()
    assert fake.init_count == 0  # every init is shut down again


def test_a_refused_query_is_none_and_one_warning() -> None:
    fake = fake_nvml(
        [FakeGpu(not_supported={"nvmlDeviceGetMigMode", "nvmlDeviceGetEccMode"})],
        missing={"nvmlDeviceGetPersistenceMode"},
    )
    gpu = read_gpu_health(fake.module).gpus[0]
    assert (gpu.mig_enabled, gpu.ecc_enabled, gpu.persistence_enabled) == (None, None, None)
    assert gpu.ecc_uncorrected_volatile is None  # not asked when ECC's mode is unknown
    warnings = read_gpu_health(fake.module).warnings
    assert len(warnings) == 3 and all("not available on GPU 0" in w for w in warnings)


def test_no_driver_raises_the_one_nvml_error() -> None:
    with pytest.raises(NvmlUnavailable, match="NVML could not start"):
        read_gpu_health(fake_nvml(1, driver="not_loaded").module)
