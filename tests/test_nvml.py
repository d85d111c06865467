"""NvmlMonitor against a fake NVML that fails the way pynvml does, and against the real pynvml."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from app.adapters.nvml import NvmlMonitor
from app.core.hardware.snapshots import NO_DRIVER_MESSAGE, cuda_version_string, memory_bandwidth_gb_s

MIB = 1024**2
GIB = 1024**3
ABSENT_PID = 4_194_304 + 17  # above Linux's pid_max ceiling: never a live process


@dataclass
class FakeGpu:
    name: str | bytes
    uuid: str | bytes
    total_bytes: int
    used_bytes: int
    bus_width_bits: int
    memory_clock_mhz: int
    capability: tuple[int, int]
    power_mw: int
    limit_mw: int
    compute: list[tuple[int, int | None]] = field(default_factory=list)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    # (generation, lanes) now and at most; an idle card steps its link down to PCIe 1.0.
    pcie_current: tuple[int, int] = (1, 16)
    pcie_max: tuple[int, int] = (4, 16)


def rtx_4090(compute: Iterable[tuple[int, int | None]] = ()) -> FakeGpu:
    return FakeGpu(
        name="NVIDIA GeForce RTX 4090",
        uuid="GPU-4090",
        total_bytes=24564 * MIB,
        used_bytes=int(1.5 * GIB),
        bus_width_bits=384,
        memory_clock_mhz=10501,
        capability=(8, 9),
        power_mw=35_500,
        limit_mw=450_000,
        compute=list(compute),
    )


def rtx_3090(uuid: bytes) -> FakeGpu:
    # Older pynvml releases return bytes; the monitor must decode them.
    return FakeGpu(
        name=b"NVIDIA GeForce RTX 3090",
        uuid=uuid,
        total_bytes=24576 * MIB,
        used_bytes=300 * MIB,
        bus_width_bits=384,
        memory_clock_mhz=9751,
        capability=(8, 6),
        power_mw=30_000,
        limit_mw=350_000,
    )


class FakeNvml:
    """The pynvml functions NvmlMonitor uses, failing with real pynvml.NVMLError subclasses."""

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        init_error: BaseException | None = None,
        unsupported: Iterable[str] = (),
        driver: str | bytes = "550.54.15",
        cuda: int = 12040,
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.unsupported = set(unsupported)
        self.driver = driver
        self.cuda = cuda
        self.init_calls = 0
        self.shutdown_calls = 0
        self._count_lock = threading.Lock()

    def _check(self, function: str) -> None:
        if function in self.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _gpu(self, handle: int) -> FakeGpu:
        return self.gpus[handle]

    def nvmlInit(self) -> None:
        with self._count_lock:
            self.init_calls += 1
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._check("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._check("nvmlSystemGetCudaDriverVersion_v2")
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return index

    def nvmlDeviceGetName(self, handle: int) -> str | bytes:
        self._check("nvmlDeviceGetName")
        return self._gpu(handle).name

    def nvmlDeviceGetUUID(self, handle: int) -> str | bytes:
        self._check("nvmlDeviceGetUUID")
        return self._gpu(handle).uuid

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        self._check("nvmlDeviceGetMemoryInfo")
        gpu = self._gpu(handle)
        return SimpleNamespace(total=gpu.total_bytes, used=gpu.used_bytes, free=gpu.total_bytes - gpu.used_bytes)

    def nvmlDeviceGetMemoryBusWidth(self, handle: int) -> int:
        self._check("nvmlDeviceGetMemoryBusWidth")
        return self._gpu(handle).bus_width_bits

    def nvmlDeviceGetMaxClockInfo(self, handle: int, clock_type: int) -> int:
        self._check("nvmlDeviceGetMaxClockInfo")
        assert clock_type == pynvml.NVML_CLOCK_MEM
        return self._gpu(handle).memory_clock_mhz

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        self._check("nvmlDeviceGetCudaComputeCapability")
        return self._gpu(handle).capability

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        self._check("nvmlDeviceGetPowerUsage")
        return self._gpu(handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int:
        self._check("nvmlDeviceGetEnforcedPowerLimit")
        return self._gpu(handle).limit_mw

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: int) -> int:
        self._check("nvmlDeviceGetCurrPcieLinkGeneration")
        return self._gpu(handle).pcie_current[0]

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: int) -> int:
        self._check("nvmlDeviceGetCurrPcieLinkWidth")
        return self._gpu(handle).pcie_current[1]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: int) -> int:
        self._check("nvmlDeviceGetMaxPcieLinkGeneration")
        return self._gpu(handle).pcie_max[0]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: int) -> int:
        self._check("nvmlDeviceGetMaxPcieLinkWidth")
        return self._gpu(handle).pcie_max[1]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        self._check("nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in self._gpu(handle).compute]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[Any]:
        self._check("nvmlDeviceGetGraphicsRunningProcesses")
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in self._gpu(handle).graphics]


# -- the derived figures -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bus_bits", "clock_mhz", "expected_gb_s"),
    [(384, 10501, 1008.1), (5120, 2619, 3352.3), (5120, 1593, 2039.0)],
    ids=["rtx-4090-gddr6x", "h100-sxm-hbm3", "a100-80gb-hbm2e"],
)
def test_bandwidth_formula_gives_the_published_figures(bus_bits: int, clock_mhz: int, expected_gb_s: float):
    assert memory_bandwidth_gb_s(bus_bits, clock_mhz) == pytest.approx(expected_gb_s, abs=0.5)


def test_bandwidth_is_unknown_without_both_inputs():
    assert memory_bandwidth_gb_s(None, 10501) is None
    assert memory_bandwidth_gb_s(384, 0) is None


def test_cuda_version_string():
    assert cuda_version_string(12040) == "12.4"
    assert cuda_version_string(11080) == "11.8"
    assert cuda_version_string(13000) == "13.0"
    assert cuda_version_string(0) is None


# -- one RTX 4090 --------------------------------------------------------------------------------


def test_rtx_4090_snapshot_has_the_figures_a_user_checks():
    me = os.getpid()
    fake = FakeNvml([rtx_4090(compute=[(me, 1200 * MIB), (ABSENT_PID, 300 * MIB)])])
    status = NvmlMonitor(fake).status()

    assert status.available is True
    assert status.message == ""
    assert status.driver_version == "550.54.15"
    (gpu,) = status.gpus
    assert gpu.index == 0
    assert gpu.name == "NVIDIA GeForce RTX 4090"
    assert gpu.uuid == "GPU-4090"
    assert gpu.memory_total_bytes == 25_757_220_864
    assert gpu.memory_used_bytes == 1_610_612_736
    assert gpu.memory_free_bytes == 25_757_220_864 - 1_610_612_736
    assert gpu.driver_version == "550.54.15"
    assert gpu.cuda_version == "12.4"
    assert gpu.memory_bus_width_bits == 384
    assert gpu.memory_clock_max_mhz == 10501
    assert gpu.bandwidth_gb_s == pytest.approx(1008, abs=0.5)
    assert gpu.compute_capability == "8.9"
    assert gpu.power_draw_w == pytest.approx(35.5)
    assert gpu.power_limit_w == pytest.approx(450.0)
    assert gpu.timestamp > 0

    by_pid = {p.pid: p for p in gpu.processes}
    assert set(by_pid) == {me, ABSENT_PID}
    assert by_pid[me].used_memory_bytes == 1200 * MIB
    assert by_pid[me].name  # psutil sees our own process
    assert by_pid[ABSENT_PID].used_memory_bytes == 300 * MIB
    assert by_pid[ABSENT_PID].name is None


def test_process_in_both_lists_is_listed_once_and_unknown_memory_stays_none():
    gpu = rtx_4090(compute=[(100, 2 * GIB), (200, None)])
    gpu.graphics = [(100, 2 * GIB), (300, 64 * MIB)]
    snap = NvmlMonitor(FakeNvml([gpu])).snapshot(0)

    assert snap is not None
    by_pid = {p.pid: p.used_memory_bytes for p in snap.processes}
    assert by_pid == {100: 2 * GIB, 200: None, 300: 64 * MIB}


# -- two GPUs ------------------------------------------------------------------------------------


def test_two_rtx_3090_give_two_snapshots_in_nvml_order():
    fake = FakeNvml([rtx_3090(b"GPU-aaaa"), rtx_3090(b"GPU-bbbb")], driver=b"535.183.01", cuda=12020)
    monitor = NvmlMonitor(fake)
    status = monitor.status()

    assert status.available
    assert status.driver_version == "535.183.01"
    assert [g.index for g in status.gpus] == [0, 1]
    assert [g.uuid for g in status.gpus] == ["GPU-aaaa", "GPU-bbbb"]
    for gpu in status.gpus:
        assert gpu.name == "NVIDIA GeForce RTX 3090"
        assert gpu.memory_total_bytes == 24 * GIB
        assert gpu.cuda_version == "12.2"
        assert gpu.bandwidth_gb_s == pytest.approx(936, abs=0.5)
        assert gpu.compute_capability == "8.6"
    assert monitor.snapshot(1).uuid == "GPU-bbbb"
    assert monitor.snapshot(2) is None


# -- no driver -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND),
        pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED),
        OSError("libnvidia-ml.so.1: cannot open shared object file"),
    ],
    ids=["library-not-found", "driver-not-loaded", "oserror"],
)
def test_missing_driver_is_a_clear_state_not_an_exception(error: BaseException):
    fake = FakeNvml([rtx_4090()], init_error=error)
    monitor = NvmlMonitor(fake)

    status = monitor.status()
    assert status.available is False
    assert status.message == NO_DRIVER_MESSAGE
    assert "No NVIDIA driver found" in status.message
    assert status.gpus == ()
    assert status.driver_version is None
    assert monitor.is_available() is False
    assert monitor.snapshot(0) is None
    assert fake.init_calls == 1  # the failure is remembered, not retried on every poll
    monitor.shutdown()
    assert fake.shutdown_calls == 0


def test_permission_denied_gets_its_own_message():
    fake = FakeNvml([rtx_4090()], init_error=pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION))
    status = NvmlMonitor(fake).status()
    assert not status.available
    assert "no permission" in status.message


def test_driver_without_gpus_is_not_available():
    status = NvmlMonitor(FakeNvml([])).status()
    assert not status.available
    assert status.driver_version == "550.54.15"
    assert "no usable GPU" in status.message


# -- failed queries ------------------------------------------------------------------------------


def test_unsupported_power_query_leaves_only_that_field_empty():
    fake = FakeNvml([rtx_4090()], unsupported={"nvmlDeviceGetPowerUsage"})
    status = NvmlMonitor(fake).status()

    assert status.available
    (gpu,) = status.gpus
    assert gpu.power_draw_w is None
    assert gpu.power_limit_w == pytest.approx(450.0)
    assert gpu.memory_total_bytes == 25_757_220_864
    assert gpu.bandwidth_gb_s == pytest.approx(1008, abs=0.5)
    assert gpu.compute_capability == "8.9"


def test_many_unsupported_queries_still_give_a_usable_snapshot():
    fake = FakeNvml(
        [rtx_4090()],
        unsupported={
            "nvmlDeviceGetUUID",
            "nvmlDeviceGetName",
            "nvmlDeviceGetMemoryBusWidth",
            "nvmlSystemGetCudaDriverVersion_v2",
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetGraphicsRunningProcesses",
        },
    )
    (gpu,) = NvmlMonitor(fake).status().gpus
    assert gpu.name == "NVIDIA GPU 0"
    assert gpu.uuid is None
    assert gpu.cuda_version is None
    assert gpu.memory_bus_width_bits is None
    assert gpu.memory_clock_max_mhz == 10501
    assert gpu.bandwidth_gb_s is None  # cannot be derived without the bus width
    assert gpu.processes == ()
    assert gpu.memory_total_bytes == 25_757_220_864


def test_gpu_whose_memory_cannot_be_read_is_left_out():
    fake = FakeNvml([rtx_4090()], unsupported={"nvmlDeviceGetMemoryInfo"})
    monitor = NvmlMonitor(fake)
    assert monitor.snapshot(0) is None
    assert not monitor.status().available


def test_unexpected_error_does_not_escape():
    class Broken(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            raise RuntimeError("driver crashed")

    monitor = NvmlMonitor(Broken([rtx_4090()]))
    status = monitor.status()
    assert not status.available
    assert "driver crashed" in status.message
    assert monitor.is_available() is False


# -- lifecycle -----------------------------------------------------------------------------------


def test_nvml_is_initialised_once_across_threads_and_shut_down_once():
    fake = FakeNvml([rtx_4090(), rtx_4090()])
    monitor = NvmlMonitor(fake)
    barrier = threading.Barrier(8)
    results: list[int] = []
    results_lock = threading.Lock()

    def poll() -> None:
        barrier.wait()
        for _ in range(20):
            count = len(monitor.status().gpus)
            with results_lock:
                results.append(count)

    threads = [threading.Thread(target=poll) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)

    assert fake.init_calls == 1
    assert results == [2] * 160
    monitor.shutdown()
    monitor.shutdown()
    assert fake.shutdown_calls == 1
    # After an explicit shutdown the next query initialises again.
    assert monitor.is_available()
    assert fake.init_calls == 2
    monitor.shutdown()


# -- the real pynvml on this machine -------------------------------------------------------------


def _nvidia_driver_present() -> bool:
    name = ctypes.util.find_library("nvidia-ml") or "libnvidia-ml.so.1"
    try:
        ctypes.CDLL(name)
    except OSError:
        return False
    return True


@pytest.mark.skipif(_nvidia_driver_present(), reason="this machine has an NVIDIA driver")
def test_real_pynvml_without_driver_reports_no_driver():
    monitor = NvmlMonitor()  # the real pynvml module
    status = monitor.status()
    assert status.available is False
    assert status.message == NO_DRIVER_MESSAGE
    assert status.gpus == ()
    assert monitor.is_available() is False
    assert monitor.snapshot(0) is None
    monitor.shutdown()


@pytest.mark.skipif(not _nvidia_driver_present(), reason="no NVIDIA driver on this machine")
def test_real_pynvml_with_driver_reports_sane_gpus():
    monitor = NvmlMonitor()
    try:
        status = monitor.status()
        assert status.available, status.message
        assert status.driver_version
        for gpu in status.gpus:
            assert gpu.memory_total_bytes >= 1 * GIB
            assert gpu.memory_used_bytes <= gpu.memory_total_bytes
            assert gpu.cuda_version and gpu.compute_capability
            if gpu.bandwidth_gb_s is not None:
                assert 100 < gpu.bandwidth_gb_s < 20_000
    finally:
        monitor.shutdown()


def test_pcie_link_is_what_card_and_slot_allow_not_the_idle_step_down():
    """An idle RTX 4090 reports its link at PCIe 1.0 now and 4.0 x16 at most: the estimate uses 4.0 x16,
    and the GPU target carries it; a card in an x4 slot reports x4 as its most, and keeps it."""
    from app.core.memory.targets import target_from_gpu

    gpu = NvmlMonitor(api=FakeNvml([rtx_4090()])).status().gpus[0]
    assert (gpu.pcie_gen_current, gpu.pcie_gen_max, gpu.pcie_width_max) == (1, 4, 16)
    assert gpu.pcie_link == (4, 16)
    target = target_from_gpu(gpu)
    # Read from the driver: the slot is known, and a hybrid prefill range need not allow for a narrower one.
    assert (target.pcie_gen, target.pcie_lanes, target.pcie_stated) == (4, 16, True)
    narrow = replace(rtx_4090(), pcie_current=(3, 4), pcie_max=(3, 4))
    assert NvmlMonitor(api=FakeNvml([narrow])).status().gpus[0].pcie_link == (3, 4)
    unsupported = FakeNvml(
        [rtx_4090()], unsupported={"nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth"}
    )
    assert NvmlMonitor(api=unsupported).status().gpus[0].pcie_link == (1, 16)
