"""Hardware a model can run on: catalog GPUs, Apple machines, and the host CPU."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.core.common.units import GIB

Vendor = Literal["nvidia", "amd", "apple", "intel", "cpu"]
Segment = Literal["consumer", "workstation", "datacenter", "apple", "cpu"]
Backend = Literal["cuda", "rocm", "metal", "vulkan", "sycl", "cpu"]


class DeviceSpec(BaseModel):
    """One device's published figures.

    ``memory_gib`` is what the vendor sells as "24 GB" (GPU memory is binary: 24 GiB).
    ``gpu_usable_fraction`` is the share of that memory a GPU may allocate: 1.0 for dedicated
    memory, about 0.67-0.75 for Apple's unified memory (macOS's recommended working set).
    ``fp16_tflops`` is dense FP16 tensor throughput with FP32 accumulate, no sparsity.
    ``fp32_tflops`` is a GPU's vendor-published FP32 peak on its shader ALUs: the rate of llama.cpp's
    small-batch decode kernels, which do not use the tensor units.
    ``aliases`` are other names a driver gives the device (an APU's graphics, "Radeon 8060S").
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    name: str
    vendor: Vendor
    segment: Segment
    backend: Backend
    memory_kind: Literal["dedicated", "unified", "system"] = "dedicated"
    memory_gib: float = Field(gt=0, le=4096)
    gpu_usable_fraction: float = Field(default=1.0, gt=0, le=1)
    bandwidth_gb_s: float = Field(gt=0, le=20000)
    fp16_tflops: float = Field(gt=0, le=10000)
    fp32_tflops: float | None = Field(
        default=None, gt=0, le=10000, description="a GPU's FP32 peak on its shader ALUs (no tensor or matrix units)"
    )
    simd_lanes: int | None = Field(default=None, ge=4, le=16)  # a CPU's FP32 lanes: 16 with AVX-512, 8 with AVX2
    clocks_ghz: tuple[float, float] | None = Field(
        default=None, description="a CPU's (base, boost) clocks in GHz, from its maker's spec page"
    )
    price_usd: float | None = Field(default=None, gt=0)
    release_year: int | None = Field(default=None, ge=2010, le=2030)
    compute_capability: str | None = None
    aliases: tuple[str, ...] = ()
    source: str = ""

    @property
    def capacity_bytes(self) -> int:
        """Bytes a llama.cpp backend on this device may allocate."""
        return int(self.memory_gib * self.gpu_usable_fraction * GIB)

    @property
    def is_gpu(self) -> bool:
        return self.backend != "cpu"


# The host link of catalog cards that differ from their generation's x16 (vendor spec pages: the
# RTX 4060 family and the RTX 5060 Ti are x8 cards; Turing and Volta cards are PCIe 3.0).
_PCIE_EXCEPTIONS: dict[str, tuple[int, int]] = {
    "rtx-2080-ti": (3, 16),
    "t4": (3, 16),
    "v100-32gb": (3, 16),
    "rtx-4060": (4, 8),
    "rtx-4060-ti-8gb": (4, 8),
    "rtx-4060-ti-16gb": (4, 8),
    "rtx-5060-ti-16gb": (5, 8),
    "h100-pcie": (5, 16),
    "h100-sxm": (5, 16),
    "h100-nvl": (5, 16),
    "h200": (5, 16),
    "b200": (5, 16),
    "mi300x": (5, 16),
    "mi325x": (5, 16),
}


def default_pcie(device: DeviceSpec) -> tuple[int, int] | None:
    """(generation, lanes) of a catalog GPU's link to the host, as the card is sold; None for devices
    whose memory is the host's (Apple, unified boxes, CPUs). Cards released from 2025 are PCIe 5.0,
    from 2020 PCIe 4.0, older ones PCIe 3.0, all x16 unless listed otherwise."""
    if not device.is_gpu or device.memory_kind != "dedicated":
        return None
    if device.id in _PCIE_EXCEPTIONS:
        return _PCIE_EXCEPTIONS[device.id]
    year = device.release_year or 2022
    return (5 if year >= 2025 else 4 if year >= 2020 else 3), 16
