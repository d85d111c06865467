"""NVIDIA GPUs through NVML (the ``pynvml`` module of nvidia-ml-py).

Following nvitop's libnvml wrapper: NVML is initialised lazily and once, under a lock, and shut
down at interpreter exit. A machine without the NVIDIA library or driver is a normal state, not
an error: ``NvmlMonitor.status()`` then says so in a sentence. A single query the GPU does not
support leaves that one field ``None``. Nothing here raises to its callers.
"""

from __future__ import annotations

import atexit
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import psutil
import pynvml

from app.core.hardware.snapshots import (
    NO_DRIVER_MESSAGE,
    GpuProcess,
    GpuSnapshot,
    GpuStatus,
    cuda_version_string,
    memory_bandwidth_gb_s,
)

__all__ = ["NvmlApi", "NvmlMonitor", "default_monitor"]

_log = logging.getLogger(__name__)

T = TypeVar("T")

# Errors one NVML query can end with. AttributeError: an older nvidia-ml-py lacks a newer function;
# NVMLLibraryMismatchError (not an NVMLError) is raised by unversioned wrappers on old drivers.
_QUERY_ERRORS: tuple[type[BaseException], ...] = (
    pynvml.NVMLError,
    getattr(pynvml, "NVMLLibraryMismatchError", pynvml.NVMLError),
    OSError,
    AttributeError,
)

# Init failures that simply mean "this machine has no usable NVIDIA driver".
_NO_DRIVER_CODES = frozenset(
    {
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    }
)

_FALLBACK = "FitScope will estimate for the CPU and for hardware picked from the catalog."


class NvmlApi(Protocol):
    """The pynvml functions NvmlMonitor calls; the real ``pynvml`` module satisfies it.

    Implementations raise ``pynvml.NVMLError`` (or a subclass) on failure, as pynvml does.
    """

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlSystemGetCudaDriverVersion_v2(self) -> int: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMemoryBusWidth(self, handle: Any) -> int: ...
    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int: ...
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int: ...
    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int: ...
    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> Sequence[Any]: ...
    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> Sequence[Any]: ...


def _text(value: object) -> str | None:
    """A str from what pynvml returned; older releases return bytes."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    text = str(value).strip()
    return text or None


def _positive_int(value: object) -> int | None:
    # NVML reports 0 (or the ULL "not available" sentinel through some paths) for unknown figures.
    if isinstance(value, int) and 0 < value < 2**63:
        return value
    return None


def _init_failure_message(error: BaseException) -> str:
    code = getattr(error, "value", None)
    if isinstance(error, OSError) or code in _NO_DRIVER_CODES:
        return NO_DRIVER_MESSAGE
    if code == pynvml.NVML_ERROR_NO_PERMISSION:
        return f"The NVIDIA driver refused access to the GPUs (no permission): {_FALLBACK}"
    if code == pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return (
            "The NVIDIA driver and its library have different versions (restart the computer "
            f"after a driver update): {_FALLBACK}"
        )
    return f"The NVIDIA driver could not be initialised ({error}): {_FALLBACK}"


def _process_name(pid: int) -> str | None:
    try:
        return psutil.Process(pid).name() or None
    except (psutil.Error, OSError, ValueError):
        # Processes in another container or of another user are invisible to us.
        return None


class NvmlMonitor:
    """Reads NVIDIA GPUs through NVML; safe to share between threads.

    ``api`` defaults to the real ``pynvml`` module; tests pass a fake with the same functions.
    NVML is initialised on the first call that needs it (one ``nvmlInit`` for the monitor's
    lifetime, even when it fails) and shut down by ``shutdown()`` or at interpreter exit.
    """

    def __init__(self, api: NvmlApi | None = None) -> None:
        self._api: NvmlApi = api if api is not None else pynvml  # type: ignore[assignment]
        # Re-entrant: status() holds it while snapshot() takes it again, and shutdown() must not
        # run between nvmlInit and the queries that depend on it.
        self._lock = threading.RLock()
        self._attempted = False
        self._initialised = False
        self._failure_message = ""

    # -- lifecycle -------------------------------------------------------------------------------

    def _ensure_init(self) -> bool:
        with self._lock:
            if self._attempted:
                return self._initialised
            self._attempted = True
            try:
                self._api.nvmlInit()
            except Exception as error:
                self._failure_message = _init_failure_message(error)
                _log.info("NVML unavailable: %r", error)
                return False
            self._initialised = True
            atexit.register(self.shutdown)
            return True

    def shutdown(self) -> None:
        """Release NVML if this monitor initialised it. Never raises; a later call re-initialises."""
        with self._lock:
            if self._initialised:
                try:
                    self._api.nvmlShutdown()
                except Exception as error:
                    _log.debug("nvmlShutdown failed: %r", error)
                atexit.unregister(self.shutdown)
            self._attempted = False
            self._initialised = False
            self._failure_message = ""

    # -- queries ---------------------------------------------------------------------------------

    def _query(self, what: str, call: Callable[[], T]) -> T | None:
        try:
            return call()
        except _QUERY_ERRORS as error:
            _log.debug("NVML query %s failed: %r", what, error)
            return None

    def _device_count(self) -> int | None:
        count = self._query("device count", self._api.nvmlDeviceGetCount)
        return count if isinstance(count, int) and count >= 0 else None

    def is_available(self) -> bool:
        """True when NVML initialised and reports at least one GPU. Never raises."""
        try:
            with self._lock:
                return self._ensure_init() and bool(self._device_count())
        except Exception:
            _log.exception("Checking for NVIDIA GPUs failed")
            return False

    def status(self) -> GpuStatus:
        """Every NVIDIA GPU now, or why there are none (``available=False`` and a message).

        Memory in bytes, power in watts, bandwidth in GB/s. Never raises: an unexpected failure
        is reported as ``available=False`` with a message.
        """
        try:
            with self._lock:
                return self._status_locked()
        except Exception as error:
            _log.exception("Reading the NVIDIA GPUs failed")
            return GpuStatus(available=False, message=f"Reading the NVIDIA GPUs failed ({error}): {_FALLBACK}")

    def _status_locked(self) -> GpuStatus:
        if not self._ensure_init():
            return GpuStatus(available=False, message=self._failure_message)
        driver = _text(self._query("driver version", self._api.nvmlSystemGetDriverVersion))
        count = self._device_count()
        if count is None:
            return GpuStatus(
                available=False,
                driver_version=driver,
                message=f"The NVIDIA driver is loaded but could not list the GPUs: {_FALLBACK}",
            )
        gpus = tuple(gpu for gpu in (self._snapshot_locked(i, driver) for i in range(count)) if gpu)
        if not gpus:
            return GpuStatus(
                available=False,
                driver_version=driver,
                message=f"The NVIDIA driver is loaded but reports no usable GPU: {_FALLBACK}",
            )
        return GpuStatus(available=True, driver_version=driver, gpus=gpus)

    def snapshot(self, index: int) -> GpuSnapshot | None:
        """GPU ``index`` (NVML order) now, or None when NVML is unavailable, the index does not exist,
        or its memory cannot be read. Memory in bytes, power in watts. Never raises.
        """
        try:
            with self._lock:
                if not self._ensure_init():
                    return None
                driver = _text(self._query("driver version", self._api.nvmlSystemGetDriverVersion))
                return self._snapshot_locked(index, driver)
        except Exception:
            _log.exception("Reading NVIDIA GPU %s failed", index)
            return None

    def _snapshot_locked(self, index: int, driver: str | None) -> GpuSnapshot | None:
        api = self._api
        handle = self._query(f"handle {index}", lambda: api.nvmlDeviceGetHandleByIndex(index))
        if handle is None:
            return None
        memory = self._query("memory info", lambda: api.nvmlDeviceGetMemoryInfo(handle))
        if memory is None:
            # Without memory figures a snapshot is useless for fitting a model.
            return None

        bus_width = _positive_int(self._query("bus width", lambda: api.nvmlDeviceGetMemoryBusWidth(handle)))
        mem_clock = _positive_int(
            self._query("max memory clock", lambda: api.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM))
        )
        capability = self._query("compute capability", lambda: api.nvmlDeviceGetCudaComputeCapability(handle))
        power_mw = _positive_int(self._query("power usage", lambda: api.nvmlDeviceGetPowerUsage(handle)))
        limit_mw = _positive_int(self._query("power limit", lambda: api.nvmlDeviceGetEnforcedPowerLimit(handle)))
        cuda = self._query("CUDA version", api.nvmlSystemGetCudaDriverVersion_v2)
        link = {
            what: _positive_int(self._query(f"PCIe {what}", functools.partial(call, handle)))
            for what, call in (
                ("gen_current", api.nvmlDeviceGetCurrPcieLinkGeneration),
                ("width_current", api.nvmlDeviceGetCurrPcieLinkWidth),
                ("gen_max", api.nvmlDeviceGetMaxPcieLinkGeneration),
                ("width_max", api.nvmlDeviceGetMaxPcieLinkWidth),
            )
        }

        return GpuSnapshot(
            index=index,
            name=_text(self._query("name", lambda: api.nvmlDeviceGetName(handle))) or f"NVIDIA GPU {index}",
            uuid=_text(self._query("uuid", lambda: api.nvmlDeviceGetUUID(handle))),
            memory_total_bytes=int(memory.total),
            memory_used_bytes=int(memory.used),
            memory_free_bytes=int(memory.free),
            driver_version=driver,
            cuda_version=cuda_version_string(cuda) if isinstance(cuda, int) else None,
            memory_bus_width_bits=bus_width,
            memory_clock_max_mhz=mem_clock,
            bandwidth_gb_s=memory_bandwidth_gb_s(bus_width, mem_clock),
            compute_capability=f"{capability[0]}.{capability[1]}" if capability else None,
            power_draw_w=power_mw / 1000 if power_mw is not None else None,
            power_limit_w=limit_mw / 1000 if limit_mw is not None else None,
            processes=self._processes(handle),
            pcie_gen_current=link["gen_current"] if (link["gen_current"] or 0) <= 6 else None,
            pcie_width_current=link["width_current"] if (link["width_current"] or 0) <= 32 else None,
            pcie_gen_max=link["gen_max"] if (link["gen_max"] or 0) <= 6 else None,
            pcie_width_max=link["width_max"] if (link["width_max"] or 0) <= 32 else None,
            timestamp=time.time(),
        )

    def _processes(self, handle: Any) -> tuple[GpuProcess, ...]:
        api = self._api
        listed: list[Any] = []
        for kind, call in (
            ("compute processes", api.nvmlDeviceGetComputeRunningProcesses),
            ("graphics processes", api.nvmlDeviceGetGraphicsRunningProcesses),
        ):
            listed.extend(self._query(kind, functools.partial(call, handle)) or ())

        # A process using CUDA and graphics appears in both lists with the same allocation.
        memory_by_pid: dict[int, int | None] = {}
        for proc in listed:
            pid = getattr(proc, "pid", None)
            if not isinstance(pid, int) or pid < 0:
                continue
            used = getattr(proc, "usedGpuMemory", None)
            used = used if isinstance(used, int) and 0 <= used < 2**63 else None
            known = memory_by_pid.get(pid)
            if known is None or (used is not None and used > known):
                memory_by_pid[pid] = used
        return tuple(
            GpuProcess(pid=pid, name=_process_name(pid), used_memory_bytes=used) for pid, used in memory_by_pid.items()
        )


_default: NvmlMonitor | None = None
_default_lock = threading.Lock()


def default_monitor() -> NvmlMonitor:
    """The process-wide monitor over the real pynvml, created on first use. Never raises."""
    global _default
    with _default_lock:
        if _default is None:
            _default = NvmlMonitor()
        return _default
