"""NvmlSampler, the query gate and the one-shot helpers, against autospec fakes of the real pynvml."""

from __future__ import annotations

import threading
import time

import pynvml
import pytest
from autotune.probes.nvml import (
    NvmlGate,
    NvmlSampler,
    NvmlUnavailable,
    detect_gpus,
    gpu_processes,
    memory_used,
)
from autotune.probes.testing import FakeGpu, FakeHandle, GiB, fake_nvml, wait_until
from autotune.probes.timeline import GPU_METRICS

POLLED = ("gpu_util_pct", "mem_util_pct", "mem_used_bytes", "mem_total_bytes", "power_w")


def _gpus() -> list[FakeGpu]:
    return [
        FakeGpu(
            uuid="GPU-a",
            gpu_util_pct=87,
            mem_util_pct=41,
            memory_used_bytes=30 * GiB,
            power_mw=412_000,
            power_limit_mw=700_000,
            sm_clock_mhz=1755,
            temperature_c=61,
            clock_event_reasons=0x4,
            pcie_tx_kb_s=1000,
            pcie_rx_kb_s=250_000,
            energy_mj=123_456,
            processes=[(101, 10 * GiB), (102, 4 * GiB), (999, 7 * GiB)],
            gpm_sm_util_pct=55.5,
            gpm_sm_occupancy_pct=22.0,
            gpm_tensor_util_pct=31.0,
        ),
        FakeGpu(
            uuid="GPU-b",
            gpu_util_pct=12,
            mem_util_pct=3,
            memory_used_bytes=5 * GiB,
            power_mw=98_000,
            power_limit_mw=350_000,
            sm_clock_mhz=1410,
            temperature_c=44,
            clock_event_reasons=0x1,
            pcie_tx_kb_s=7,
            pcie_rx_kb_s=9,
            energy_mj=5_000,
            processes=[(102, 1 * GiB)],
            gpm_sm_util_pct=9.0,
            gpm_sm_occupancy_pct=4.0,
            gpm_tensor_util_pct=1.0,
        ),
    ]


def _polled(rows: list[dict], device: int) -> list[dict]:
    """Rows of one GPU taken by the polling loop (driver sub-samples lack memory)."""
    return [r for r in rows if r["device"] == device and r["mem_total_bytes"] is not None]


def _run(sampler: NvmlSampler, until, timeout_s: float = 10.0) -> list[dict]:
    sampler.start()
    try:
        assert wait_until(lambda: until(sampler.rows()), timeout_s), "sampler never produced the rows"
    finally:
        sampler.stop()
    return sampler.rows()


def _has(rows: list[dict], device: int, column: str) -> bool:
    return any(r["device"] == device and r[column] is not None for r in rows)


def _values(rows: list[dict], device: int, column: str) -> set:
    return {r[column] for r in rows if r["device"] == device and r[column] is not None}


@pytest.mark.parametrize("full_module", [False, True], ids=["used-functions", "whole-module"])
def test_every_metric_supported_is_sampled_with_units_converted(full_module: bool) -> None:
    fake = fake_nvml(_gpus(), full_module=full_module)
    sampler = NvmlSampler(
        [0, 1], interval_s=0.01, nvml=fake.module, pids=lambda: {101, 102}, slow_interval_s=0.02
    )
    rows = _run(sampler, lambda rs: all(_has(rs, d, c) for d in (0, 1) for c in GPU_METRICS))

    assert sampler.warnings == []
    for dev in (0, 1):
        for column in GPU_METRICS:
            assert _has(rows, dev, column), (dev, column)
    expected = {
        0: {
            "gpu_util_pct": 87.0,
            "mem_util_pct": 41.0,
            "mem_used_bytes": 30.0 * GiB,
            "mem_total_bytes": 80.0 * GiB,
            "power_w": 412.0,
            "power_limit_w": 700.0,
            "sm_clock_mhz": 1755.0,
            "temperature_c": 61.0,
            "clock_event_reasons": 4.0,
            "energy_mj": 123_456.0,
            "proc_mem_bytes": 14.0 * GiB,  # pids 101 + 102, not 999
            "gpm_sm_util_pct": 55.5,
            "gpm_sm_occupancy_pct": 22.0,
            "gpm_tensor_util_pct": 31.0,
        },
        1: {
            "gpu_util_pct": 12.0,  # the device index in each row is the GPU that was read
            "power_limit_w": 350.0,
            "proc_mem_bytes": 1.0 * GiB,
            "gpm_sm_util_pct": 9.0,  # GPM metrics come from GPU 1's own samples
        },
    }
    for dev, columns in expected.items():
        for column, value in columns.items():
            assert _values(rows, dev, column) == {value}, (dev, column)
    # PCIe bytes/s from the driver's byte counters: the average between two counter reads
    for column, kb_s in (("pcie_tx_bytes_s", 1000), ("pcie_rx_bytes_s", 250_000)):
        assert all(v == pytest.approx(kb_s * 1024, rel=1e-3) for v in _values(rows, 0, column)), column
    # NVML released and GPM buffers freed
    assert fake.init_count == 0
    assert fake.gpm_live_samples == 0


def test_a_call_with_the_wrong_signature_fails_on_the_fake_and_is_contained_by_the_gate() -> None:
    fake = fake_nvml(1)
    fake.module.nvmlInit()
    with pytest.raises(TypeError):
        fake.module.nvmlDeviceGetClockInfo(FakeHandle(0))  # the real function takes (handle, type)
    gate = NvmlGate(fake.module)
    assert gate.call(0, "sm_clock_mhz", "nvmlDeviceGetClockInfo", FakeHandle(0)) is None
    assert len(gate.warnings) == 1 and "TypeError" in gate.warnings[0]
    assert not gate.enabled(0, "sm_clock_mhz")  # a mismatch repeats: the metric is switched off


def test_not_supported_and_function_not_found_become_empty_columns_warned_once() -> None:
    gpus = _gpus()
    gpus[0].not_supported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetPcieThroughput"}
    # GPU 0's driver has no PCIe byte counters either: PCIe falls back to its own call, then stays empty
    gpus[0].unsupported_fields = {
        pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
        pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
    }
    fake = fake_nvml(gpus, missing={"nvmlDeviceGetSamples", "nvmlGpmQueryDeviceSupport"})
    sampler = NvmlSampler([0, 1], interval_s=0.01, nvml=fake.module, slow_interval_s=0.02)
    rows = _run(
        sampler,
        lambda rs: len(_polled(rs, 0)) >= 10 and _has(rs, 0, "energy_mj") and _has(rs, 1, "pcie_rx_bytes_s"),
    )

    assert not _has(rows, 0, "power_w") and not _has(rows, 0, "pcie_tx_bytes_s")
    assert _has(rows, 1, "power_w") and _has(rows, 1, "pcie_rx_bytes_s")  # GPU 1 supports them
    assert not _has(rows, 0, "gpm_sm_util_pct") and not _has(rows, 1, "gpm_sm_util_pct")
    assert _has(rows, 0, "gpu_util_pct") and _has(rows, 0, "energy_mj")  # the rest goes on
    assert len(rows) == len(_polled(rows, 0)) + len(_polled(rows, 1))  # no driver sub-samples
    warnings = sampler.warnings
    assert len([w for w in warnings if w.startswith("power_w:")]) == 1
    assert len([w for w in warnings if w.startswith("pcie_tx_bytes_s:")]) == 1
    assert any("Function Not Found" in w and w.startswith("gpu_util_pct_samples") for w in warnings)
    assert any("Function Not Found" in w and w.startswith("gpm_") for w in warnings)
    assert len(warnings) == len(set(warnings))
    # an unsupported metric is asked once, not on every tick
    power_calls_gpu0 = [c for c in fake.module.nvmlDeviceGetPowerUsage.call_args_list if c.args[0].index == 0]
    assert len(power_calls_gpu0) == 1
    # energy still comes from the counters call on GPU 0; PCIe is asked of the counters once only
    counter_calls = [
        c.args[1] for c in fake.module.nvmlDeviceGetFieldValues.call_args_list if c.args[0].index == 0
    ]
    all_ids = [
        pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
        pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
        pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
    ]
    assert len(counter_calls) >= 2 and counter_calls[0] == all_ids
    assert all(ids == [pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION] for ids in counter_calls[1:])


def test_functions_an_older_binding_lacks_are_contained_and_reasons_fall_back() -> None:
    fake = fake_nvml(1)
    del fake.module.nvmlDeviceGetCurrentClocksEventReasons  # nvidia-ml-py before 12.535
    del fake.module.nvmlDeviceGetTotalEnergyConsumption
    del fake.module.nvmlDeviceGetFieldValues  # and the counters call: energy and PCIe by their own calls
    fake.gpus[0].clock_event_reasons = 0x40  # HW thermal slowdown
    sampler = NvmlSampler([0], interval_s=0.01, nvml=fake.module, slow_interval_s=0.01)
    columns = ("clock_event_reasons", "sm_clock_mhz", "pcie_rx_bytes_s")
    rows = _run(sampler, lambda rs: len(_polled(rs, 0)) >= 4 and all(_has(rs, 0, c) for c in columns))
    assert _values(rows, 0, "clock_event_reasons") == {64.0}  # via ...ThrottleReasons
    assert not _has(rows, 0, "energy_mj")
    assert _values(rows, 0, "sm_clock_mhz") == {1980.0} and _values(rows, 0, "pcie_rx_bytes_s") == {0.0}
    assert any(w.startswith("counters: unexpected AttributeError") for w in sampler.warnings)
    assert [w for w in sampler.warnings if w.startswith("energy_mj")] == [
        "energy_mj: unexpected AttributeError on GPU 0 (nvmlDeviceGetTotalEnergyConsumption); the column stays empty"
    ]


def test_a_binding_mismatch_in_the_process_list_is_one_typed_error() -> None:
    fake = fake_nvml(1)

    def mismatch(handle):
        raise pynvml.NVMLLibraryMismatchError("Unversioned function called ...")

    fake.module.nvmlDeviceGetComputeRunningProcesses.side_effect = mismatch
    with pytest.raises(NvmlUnavailable, match="GPU 0: cannot list its processes"):
        gpu_processes([0], fake.module)
    assert fake.init_count == 0
    sampler = NvmlSampler([0], interval_s=0.01, nvml=fake.module, pids=lambda: {1}, slow_interval_s=0.01)
    rows = _run(sampler, lambda rs: len(_polled(rs, 0)) >= 3)
    assert not _has(rows, 0, "proc_mem_bytes") and _has(rows, 0, "energy_mj")
    assert any(w.startswith("proc_mem_bytes: unexpected NVMLLibraryMismatchError") for w in sampler.warnings)


@pytest.mark.parametrize(
    ("driver", "reason"),
    [("no_library", "NVML Shared Library Not Found"), ("not_loaded", "Driver Not Loaded")],
)
def test_no_driver_raises_one_typed_error_at_start(driver: str, reason: str) -> None:
    fake = fake_nvml(2, driver=driver)
    sampler = NvmlSampler([0], nvml=fake.module)
    with pytest.raises(NvmlUnavailable) as info:
        sampler.start()
    message = str(info.value)
    assert reason in message and "\n" not in message and "run on CPU" in message
    sampler.stop()  # harmless after a failed start
    for call in (detect_gpus, lambda nvml: gpu_processes([0], nvml), lambda nvml: memory_used([0], nvml)):
        with pytest.raises(NvmlUnavailable):
            call(fake.module)


def test_a_gpu_index_that_does_not_exist_is_refused_at_start_and_nvml_released() -> None:
    fake = fake_nvml(2)
    with pytest.raises(NvmlUnavailable, match=r"GPU 5 cannot be opened.*2 GPU\(s\)"):
        NvmlSampler([0, 5], nvml=fake.module).start()
    assert fake.init_count == 0


def test_a_gpu_lost_mid_run_leaves_its_later_rows_empty_and_sampling_goes_on() -> None:
    fake = fake_nvml(_gpus())
    sampler = NvmlSampler([0, 1], interval_s=0.01, nvml=fake.module, slow_interval_s=0.02)
    sampler.start()
    try:
        assert wait_until(lambda: len(_polled(sampler.rows(), 1)) >= 3)
        fake.lose(1)
        assert wait_until(lambda: any("GPU 1 was lost" in w for w in sampler.warnings))
        lost_at = time.monotonic()
        calls_at_loss = fake.module.nvmlDeviceGetMemoryInfo.call_count

        def later_util0(rows: list[dict]) -> list[float]:
            return [
                r["gpu_util_pct"]
                for r in rows
                if r["device"] == 0 and r["t_mono_s"] > lost_at and r["gpu_util_pct"] is not None
            ]

        assert wait_until(
            lambda: (
                len([r for r in _polled(sampler.rows(), 0) if r["t_mono_s"] > lost_at]) >= 5
                and len(later_util0(sampler.rows())) >= 2
            )
        )
    finally:
        sampler.stop()
    rows = sampler.rows()
    later1 = [r for r in rows if r["device"] == 1 and r["t_mono_s"] > lost_at]
    assert len(later1) >= 5
    assert all(r[c] is None for r in later1 for c in GPU_METRICS)
    later0 = [r for r in _polled(rows, 0) if r["t_mono_s"] > lost_at]
    assert later0 and all(r["mem_used_bytes"] is not None for r in later0)
    # utilization comes from polling (slow ticks, while the driver buffer delivers) or the buffer
    util0 = later_util0(rows)
    assert util0 and all(u == 87.0 for u in util0)
    # the lost GPU is not asked again: only GPU 0's memory reads happened after the loss
    after = fake.module.nvmlDeviceGetMemoryInfo.call_args_list[calls_at_loss:]
    assert after and all(c.args[0].index == 0 for c in after)
    assert len([w for w in sampler.warnings if "lost" in w]) == 1


def test_transient_errors_empty_one_sample_each_and_never_stop_the_sampler() -> None:
    fake = fake_nvml(1)
    real_effect = fake.module.nvmlDeviceGetPowerUsage.side_effect
    counter = {"n": 0}

    def flaky(handle):
        counter["n"] += 1
        if counter["n"] % 2 == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return real_effect(handle)

    fake.module.nvmlDeviceGetPowerUsage.side_effect = flaky
    sampler = NvmlSampler([0], interval_s=0.01, nvml=fake.module, driver_samples=False)
    rows = _run(sampler, lambda rs: len(rs) >= 12)
    powers = [r["power_w"] for r in rows]
    assert any(p is None for p in powers) and any(p == 90.0 for p in powers)
    assert [w for w in sampler.warnings if w.startswith("power_w:")] == [
        "power_w: read failed on GPU 0 (Unknown Error); that sample is empty, sampling goes on"
    ]


def test_a_value_that_is_not_a_number_empties_only_its_cell() -> None:
    fake = fake_nvml(1)
    fake.module.nvmlDeviceGetTemperature.side_effect = lambda handle, sensor: "hot"
    sampler = NvmlSampler([0], interval_s=0.01, nvml=fake.module, slow_interval_s=0.01, gpm=False)
    temperature = fake.module.nvmlDeviceGetTemperature
    rows = _run(sampler, lambda rs: temperature.call_count >= 3 and _has(rs, 0, "sm_clock_mhz"))
    assert not _has(rows, 0, "temperature_c")
    assert _values(rows, 0, "sm_clock_mhz") == {1980.0}
    assert any("temperature_c" in w and "'hot'" in w for w in sampler.warnings)


def test_driver_samples_become_rows_at_their_own_time_on_the_monotonic_clock() -> None:
    util_buffer: list[tuple[int, int]] = []  # the driver's buffers, empty until filled below
    power_buffer: list[tuple[int, int]] = []
    gpu = FakeGpu(
        sample_period_s=None,
        driver_samples={
            pynvml.NVML_GPU_UTILIZATION_SAMPLES: util_buffer,
            pynvml.NVML_TOTAL_POWER_SAMPLES: power_buffer,
        },
    )
    fake = fake_nvml([gpu])
    sampler = NvmlSampler([0], interval_s=0.01, nvml=fake.module, slow_interval_s=0.01, gpm=False)
    before_us = int(time.time() * 1e6) - 5_000_000
    wall_before, mono_before = time.time(), time.monotonic()
    sampler.start()
    try:
        now_us = int(time.time() * 1e6)
        util_ts = [now_us + 1000, now_us + 2000, now_us + 3000]
        util_buffer.extend([(before_us, 11), *[(ts, 70 + k) for k, ts in enumerate(util_ts)]])
        power_buffer.append((now_us + 1500, 250_000))
        assert wait_until(lambda: len([r for r in sampler.rows() if r["mem_total_bytes"] is None]) >= 4)
        ticks = len(sampler.ticks)  # a few more reads: the same driver samples must not come back
        assert wait_until(lambda: len(sampler.ticks) >= ticks + 5)
    finally:
        sampler.stop()
    mono_after, wall_after = time.monotonic(), time.time()
    subs = [r for r in sampler.rows() if r["mem_total_bytes"] is None]
    util = sorted((r["t_wall_s"], r["gpu_util_pct"]) for r in subs if r["gpu_util_pct"] is not None)
    assert util == [(ts / 1e6, 70.0 + k) for k, ts in enumerate(util_ts)]  # pre-start sample dropped
    power = [r for r in subs if r["power_w"] is not None]
    assert (
        len(power) == 1 and power[0]["power_w"] == pytest.approx(250.0) and power[0]["gpu_util_pct"] is None
    )
    assert sampler.warnings == []  # an empty buffer (Not Found) is not a problem
    # one clock pair for every row: a tick row reads the monotonic clock inside this run (and its wall
    # time is the wall clock of the same run); a driver sample's wall time is moved by the same offset
    ticks_rows = [r for r in sampler.rows() if r["mem_total_bytes"] is not None]
    for r in ticks_rows:
        assert mono_before <= r["t_mono_s"] <= mono_after and wall_before <= r["t_wall_s"] <= wall_after
    offset_s = ticks_rows[0]["t_wall_s"] - ticks_rows[0]["t_mono_s"]
    for r in ticks_rows + subs:
        assert r["t_wall_s"] - r["t_mono_s"] == pytest.approx(offset_s, abs=1e-6)  # float rounding only
    for r in subs:
        assert r["mem_used_bytes"] is None and r["sm_clock_mhz"] is None


class _FreshOnEveryRead:
    """A driver power buffer holding one sample newer than the last on every read (not on a clock)."""

    def __init__(self) -> None:
        self.ts_us = 0

    def __iter__(self):  # noqa: ANN204 - the fake driver only iterates (timestamp, value) pairs
        self.ts_us = max(self.ts_us + 1, int(time.time() * 1e6))
        return iter([(self.ts_us, 300_000)])


def test_power_is_polled_only_while_the_driver_buffer_delivers_nothing() -> None:
    gpu = FakeGpu(
        power_mw=300_000, sample_period_s=None, driver_samples={pynvml.NVML_TOTAL_POWER_SAMPLES: []}
    )
    fake = fake_nvml([gpu])
    polls = fake.module.nvmlDeviceGetPowerUsage
    sampler = NvmlSampler([0], interval_s=0.01, nvml=fake.module, slow_interval_s=0.05, gpm=False)
    sampler.start()
    try:
        assert wait_until(lambda: polls.call_count >= 8)  # empty buffer: power polled every tick
        # from now on every read of the driver's buffer finds a new sample, however the ticks fall
        gpu.driver_samples = {pynvml.NVML_TOTAL_POWER_SAMPLES: _FreshOnEveryRead()}  # type: ignore[dict-item]
        assert wait_until(
            lambda: any(r["power_w"] is not None and r["mem_total_bytes"] is None for r in sampler.rows())
        )
        calls, ticks = polls.call_count, len(sampler.ticks)
        assert wait_until(lambda: len(sampler.ticks) >= ticks + 20)
        assert polls.call_count <= calls + 1  # at most the tick in flight; then no polling
        gpu.driver_samples = {}  # the buffer stops delivering (Not Supported): polling resumes
        assert wait_until(lambda: polls.call_count >= calls + 5)
    finally:
        sampler.stop()
    assert [w for w in sampler.warnings if w.startswith("power_w")] == [
        "power_w_samples: not available on GPU 0 (Not Supported); only polled values are recorded"
    ]


def test_a_pre_hopper_gpu_has_no_gpm_columns_and_one_warning() -> None:
    fake = fake_nvml(
        [FakeGpu(name="NVIDIA A10", gpm_supported=False), FakeGpu(name="NVIDIA A10", gpm_supported=False)]
    )
    sampler = NvmlSampler([0, 1], interval_s=0.01, nvml=fake.module, slow_interval_s=0.01)
    rows = _run(sampler, lambda rs: _has(rs, 1, "energy_mj"))
    assert not any(r["gpm_sm_util_pct"] is not None for r in rows)
    gpm_warnings = [w for w in sampler.warnings if "GPM" in w]
    assert len(gpm_warnings) == 1 and "Hopper" in gpm_warnings[0]
    assert fake.gpm_live_samples == 0
    assert fake.module.nvmlGpmSampleGet.call_count == 0


def test_process_memory_none_under_mig_and_a_failing_pid_callback_is_contained() -> None:
    gpus = [FakeGpu(processes=[(7, None)]), FakeGpu(processes=[(7, GiB)])]
    fake = fake_nvml(gpus)
    sampler = NvmlSampler([0, 1], interval_s=0.01, nvml=fake.module, pids=lambda: {7}, slow_interval_s=0.01)
    rows = _run(sampler, lambda rs: _has(rs, 1, "proc_mem_bytes"))
    assert not _has(rows, 0, "proc_mem_bytes") and _has(rows, 1, "proc_mem_bytes")

    def broken() -> set[int]:
        raise OSError("no /proc")

    fake2 = fake_nvml(1)
    sampler2 = NvmlSampler([0], interval_s=0.01, nvml=fake2.module, pids=broken, slow_interval_s=0.01)
    rows2 = _run(sampler2, lambda rs: len(_polled(rs, 0)) >= 5)
    assert not _has(rows2, 0, "proc_mem_bytes") and _has(rows2, 0, "energy_mj")
    assert len([w for w in sampler2.warnings if "pid list" in w]) == 1


def test_stop_is_idempotent_and_a_sampler_starts_once() -> None:
    fake = fake_nvml(1)
    sampler = NvmlSampler([0], interval_s=0.01, nvml=fake.module)
    sampler.stop()  # before start: nothing to do
    fresh = NvmlSampler([0], interval_s=0.01, nvml=fake.module)
    with fresh:
        assert wait_until(lambda: len(fresh.rows()) >= 2)
    fresh.stop()
    fresh.stop()
    assert fake.init_count == 0
    with pytest.raises(RuntimeError, match="started once"):
        fresh.start()


def test_stop_escalates_then_abandons_a_thread_stuck_in_the_driver() -> None:
    fake = fake_nvml(1)
    release = threading.Event()
    entered = threading.Event()
    real_effect = fake.module.nvmlDeviceGetUtilizationRates.side_effect

    def hung(handle):
        entered.set()
        release.wait(10)
        return real_effect(handle)

    fake.module.nvmlDeviceGetUtilizationRates.side_effect = hung
    sampler = NvmlSampler([0], interval_s=0.01, nvml=fake.module)
    sampler.start()
    try:
        assert entered.wait(5)
        sampler.stop(timeout_s=0.05)
        assert any("slow to stop" in w for w in sampler.warnings)
        assert any("abandoned" in w for w in sampler.warnings)
        assert fake.init_count == 1  # NVML is not shut down under a call in flight
    finally:
        release.set()
    assert sampler._thread is not None
    sampler._thread.join(5)
    assert not sampler._thread.is_alive()  # once the call returns, the thread sees the stop flag


class _WaitSpy(threading.Event):
    """The sampler's stop flag, recording the waits made on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return super().wait(timeout)


@pytest.mark.parametrize("interval_s", [0.05, 1.0], ids=["sleeps-between-ticks", "waits-on-the-stop-flag"])
def test_stop_ends_the_thread_at_its_next_tick_whichever_way_it_waits(interval_s: float) -> None:
    # short waits are a plain sleep (stop takes effect at the next tick); long ones wait on the stop
    # flag (stop takes effect at once). Checked by events, not by how long stop() took.
    fake = fake_nvml(1)
    sampler = NvmlSampler([0], interval_s=interval_s, nvml=fake.module)
    spy = sampler._stop_event = _WaitSpy()
    sampler.start()
    assert wait_until(lambda: len(sampler.ticks) >= 2 if interval_s < 1 else len(sampler.ticks) >= 1)
    assert wait_until(lambda: bool(spy.waits)) if interval_s > 0.1 else spy.waits == []
    requested_mono = time.monotonic()
    sampler.stop()
    assert sampler._thread is not None and not sampler._thread.is_alive()
    # no tick began after the stop was asked for, but the one in flight
    assert len([t for t in sampler.ticks if t > requested_mono]) <= 1
    assert not any("abandoned" in w for w in sampler.warnings)
    assert fake.init_count == 0


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_a_bad_interval_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="interval_s"):
        NvmlSampler([0], interval_s=bad)


def test_detect_gpus_reads_the_fake_like_the_real_binding() -> None:
    fake = fake_nvml(
        [FakeGpu(name="NVIDIA A10", uuid="GPU-x", compute_capability=(8, 6), memory_total_bytes=24 * GiB)]
    )
    found = detect_gpus(fake.module)
    assert found.driver_version == "550.54.15" and found.cuda_driver_version == "12.4"
    (dev,) = found.devices
    assert (dev.index, dev.name, dev.uuid, dev.memory_total_bytes, dev.compute_capability) == (
        0,
        "NVIDIA A10",
        "GPU-x",
        24 * GiB,
        "8.6",
    )
    assert fake.init_count == 0


def test_gpu_processes_and_memory_used_for_the_hygiene_check() -> None:
    gpus = [FakeGpu(processes=[(11, 3 * GiB), (12, None)], memory_used_bytes=5 * GiB), FakeGpu()]
    fake = fake_nvml(gpus)
    assert gpu_processes([0, 1], fake.module) == {0: [(11, 3 * GiB), (12, None)], 1: []}
    assert memory_used([0, 1], fake.module) == {0: 5 * GiB, 1: 2 * GiB}
    assert fake.init_count == 0
    fake.lose(1)
    with pytest.raises(NvmlUnavailable, match="GPU 1: cannot list its processes"):
        gpu_processes([0, 1], fake.module)
    with pytest.raises(NvmlUnavailable, match="GPU 1: cannot read its memory"):
        memory_used([1], fake.module)
    assert fake.init_count == 0


def test_utilization_is_polled_every_tick_only_while_the_driver_buffer_is_silent() -> None:
    def util_calls_per_tick(missing: tuple[str, ...]) -> float:
        fake = fake_nvml(1, missing=missing)
        sampler = NvmlSampler([0], interval_s=0.01, nvml=fake.module, slow_interval_s=0.05)
        sampler.start()
        try:
            assert wait_until(lambda: len(sampler.ticks) >= 120)
        finally:
            sampler.stop()
        return fake.module.nvmlDeviceGetUtilizationRates.call_count / len(sampler.ticks)

    # the buffer delivers utilization: polled on slow ticks only (1 in 5 here, plus the first)
    assert util_calls_per_tick(()) < 0.5
    # no buffer (a driver without nvmlDeviceGetSamples): polled on every tick
    assert util_calls_per_tick(("nvmlDeviceGetSamples",)) > 0.9


def test_pcie_rates_come_from_the_byte_counters_and_a_wrapped_counter_gives_no_rate() -> None:
    gpu = FakeGpu(pcie_tx_kb_s=2_000, pcie_rx_kb_s=0)
    # a counter far above what it reaches again after the wrap below (at 2 MB/s): a read after the
    # wrap is always below the one before it, however the reads fall around the wrap
    gpu.pcie_counters["tx"] = 1e12
    fake = fake_nvml([gpu])
    sampler = NvmlSampler([0], interval_s=0.01, nvml=fake.module, slow_interval_s=0.01, gpm=False)
    sampler.start()
    try:
        assert wait_until(lambda: len(_values(sampler.rows(), 0, "pcie_tx_bytes_s")) >= 1)
        n_before = len([r for r in sampler.rows() if r["pcie_tx_bytes_s"] is not None])
        gpu.pcie_counters["tx"] = 0.0  # the counter wraps around
        assert wait_until(
            lambda: len([r for r in sampler.rows() if r["pcie_tx_bytes_s"] is not None]) >= n_before + 3
        )
    finally:
        sampler.stop()
    rates = [r["pcie_tx_bytes_s"] for r in sampler.rows() if r["pcie_tx_bytes_s"] is not None]
    assert all(rate == pytest.approx(2_000 * 1024, rel=1e-2) for rate in rates)  # never negative or huge
    assert fake.module.nvmlDeviceGetPcieThroughput.call_count == 0  # counters delivered: no 20 ms calls
    assert _values(sampler.rows(), 0, "pcie_rx_bytes_s") == {0.0}


def test_state_reads_rotate_one_per_slow_read() -> None:
    fake = fake_nvml(1)
    sampler = NvmlSampler([0], interval_s=0.005, nvml=fake.module, pids=lambda: {1}, slow_interval_s=0.005)
    m = fake.module
    rows = _run(sampler, lambda rs: m.nvmlDeviceGetFieldValues.call_count >= 35)
    slow_reads = 2 * m.nvmlDeviceGetFieldValues.call_count  # the counters: every second slow read
    # utilization (the buffer delivers GPU utilization), process memory, GPM, SM clock, temperature,
    # clock-event reasons, power limit: seven slots, one read per slow read
    rotated = [
        m.nvmlDeviceGetComputeRunningProcesses,
        m.nvmlGpmMetricsGet,
        m.nvmlDeviceGetClockInfo,
        m.nvmlDeviceGetTemperature,
        m.nvmlDeviceGetCurrentClocksEventReasons,
        m.nvmlDeviceGetEnforcedPowerLimit,
    ]
    for fn in rotated:
        assert abs(fn.call_count - slow_reads / 7) <= 3, fn
    assert m.nvmlDeviceGetPowerUsage.call_count == 0  # the power buffer delivered from the start
    assert _has(rows, 0, "temperature_c") and _has(rows, 0, "gpm_sm_util_pct")


def test_a_driver_buffer_shorter_than_the_reading_interval_is_read_every_slow_read() -> None:
    def samples_per_counters_read(buffer_len: int) -> float:
        gpu = FakeGpu(sample_period_s=0.002, sample_buffer_len=buffer_len)
        fake = fake_nvml([gpu])
        sampler = NvmlSampler([0], interval_s=0.01, nvml=fake.module, slow_interval_s=0.01, gpm=False)
        _run(sampler, lambda rs: fake.module.nvmlDeviceGetFieldValues.call_count >= 20)
        return fake.module.nvmlDeviceGetSamples.call_count / fake.module.nvmlDeviceGetFieldValues.call_count

    # per counters read (every second slow read): a deep buffer (100 samples = 200 ms) is drained
    # every second slow read too (2 kinds); one of 3 samples (6 ms) overflows between reads 20 ms
    # apart: read on every slow read from then on (4 calls per counters read)
    assert samples_per_counters_read(100) < 2.6
    assert samples_per_counters_read(3) > 3.4


def test_process_memory_is_unknown_when_no_trial_pid_is_among_the_gpus_processes() -> None:
    """In a container NVML lists host pids: a GPU in use by no pid of the trial is unknown, not 0 bytes;
    an idle GPU holds 0."""
    gpus = [FakeGpu(processes=[(40001, 20 * GiB)]), FakeGpu(processes=[]), FakeGpu(processes=[(7, GiB)])]
    fake = fake_nvml(gpus)
    sampler = NvmlSampler(
        [0, 1, 2], interval_s=0.01, nvml=fake.module, pids=lambda: {7}, slow_interval_s=0.01
    )
    rows = _run(sampler, lambda rs: _has(rs, 2, "proc_mem_bytes") and _has(rs, 1, "proc_mem_bytes"))
    assert not _has(rows, 0, "proc_mem_bytes")
    assert _values(rows, 1, "proc_mem_bytes") == {0.0}
    assert _values(rows, 2, "proc_mem_bytes") == {float(GiB)}
