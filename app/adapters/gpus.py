"""This machine's GPUs, whatever their maker: one detector that asks each vendor's in turn (NVIDIA
through NVML, Apple Silicon, AMD and Intel Arc through their drivers' files) and gives one
``GpuStatus``: every GPU found, numbered in that order and matched to its catalog entry, or one
sentence saying why there is none and what FitScope does instead. Windows: NVML only (AMD and Intel
GPUs are not detected there yet, and the sentence says so). Nothing here raises.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from typing import Protocol

from app.adapters import gpu_amd, gpu_apple, gpu_intel, nvml
from app.core.hardware.snapshots import NO_DRIVER_MESSAGE, GpuSnapshot, GpuStatus

__all__ = ["GpuDetector", "GpuProbe", "default_detector", "detect_gpus"]

FALLBACK = "FitScope will estimate for the CPU and for hardware picked from the catalog."

# What each vendor's detector says when its GPUs are simply not in this machine (anything else it
# says is a problem worth showing).
_ABSENT = frozenset(
    {
        NO_DRIVER_MESSAGE,
        gpu_apple.NOT_A_MAC,
        gpu_apple.NO_APPLE_SILICON,
        gpu_amd.NO_AMD_MESSAGE,
        gpu_intel.NO_INTEL_MESSAGE,
        f"{gpu_intel.NO_INTEL_MESSAGE} {gpu_intel.INTEGRATED_MESSAGE}",
    }
)


class GpuProbe(Protocol):
    """One vendor's detector: its GPUs now, or why there are none. Never raises."""

    def status(self) -> GpuStatus: ...


def _none_found(platform: str) -> str:
    if platform == "darwin":
        return f"No Apple Silicon GPU found: {FALLBACK}"
    if platform.startswith("win"):
        return (
            "No NVIDIA driver found, and AMD and Intel GPUs are not detected on Windows yet (pick yours "
            f"from the catalog): {FALLBACK}"
        )
    return f"No GPU found: no NVIDIA driver, and no AMD or Intel Arc card under /sys/class/drm. {FALLBACK}"


def _with_catalog(gpu: GpuSnapshot, index: int) -> GpuSnapshot:
    # Imported here: the catalog and its matching are needed only once a GPU was found.
    from app.core.report.choices import catalog_entry

    entry = catalog_entry(gpu)
    return gpu.model_copy(update={"index": index, "catalog_id": entry.id if entry else None})


class GpuDetector:
    """Asks each probe in turn; the default probes are this machine's (NVML, Apple, AMD, Intel)."""

    def __init__(self, probes: Sequence[GpuProbe] | None = None, platform: str = sys.platform) -> None:
        if probes is None:
            probes = [nvml.NvmlMonitor(), gpu_apple.AppleProbe(platform=platform)]
            if platform.startswith("linux"):
                probes += [gpu_amd.AmdProbe(), gpu_intel.IntelProbe()]
        self._probes = list(probes)
        self._platform = platform

    def status(self) -> GpuStatus:
        """Every GPU now (bytes, watts, GB/s), or ``available=False`` with one sentence. Never raises."""
        gpus: list[GpuSnapshot] = []
        problems: list[str] = []
        driver: str | None = None
        for probe in self._probes:
            try:
                found = probe.status()
            except Exception as error:
                found = GpuStatus(available=False, message=f"A GPU detector failed ({error}).")
            if found.available:
                driver = driver or found.driver_version
                gpus.extend(found.gpus)
            if found.message and found.message not in _ABSENT:
                problems.append(found.message)
        if not gpus:
            message = " ".join(problems) if problems else _none_found(self._platform)
            return GpuStatus(available=False, message=message)
        numbered = tuple(_with_catalog(g, i) for i, g in enumerate(gpus))
        return GpuStatus(available=True, message=" ".join(problems), driver_version=driver, gpus=numbered)


def detect_gpus() -> GpuStatus:
    """This machine's GPUs now, through a fresh detector (the CLI's one-off question)."""
    return GpuDetector().status()


_default: GpuDetector | None = None
_default_lock = threading.Lock()


def default_detector() -> GpuDetector:
    """The process-wide detector over the real drivers, created on first use. Never raises."""
    global _default
    with _default_lock:
        if _default is None:
            _default = GpuDetector()
        return _default
