"""The estimator's devices (:class:`~app.core.memory.estimate.Target`) from what FitScope knows of
hardware: a catalog device, a detected GPU, this machine's CPU, or the host memory beside GPUs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.common.units import GIB
from app.core.hardware.devices import DeviceSpec
from app.core.hardware.host_memory import DEFAULT_HOST_MEMORY, HOST_MEMORY
from app.core.memory.records import CPU_RUNTIME_OVERHEAD_BYTES, RepackProfile, Target

if TYPE_CHECKING:
    from app.core.hardware.snapshots import GpuSnapshot, HostSnapshot


def target_from_device(device: DeviceSpec) -> Target:
    # A catalog CPU's bandwidth is its memory's spec-sheet peak, not a measurement.
    cls = "host-spec"
    if device.is_gpu:
        cls = {"nvidia": "nvidia", "amd": "amd", "apple": "apple", "intel": "intel"}.get(device.vendor, "cpu")
    return Target(
        name=device.name,
        kind="gpu" if device.is_gpu else "cpu",
        capacity_bytes=device.capacity_bytes,
        bandwidth_gb_s=device.bandwidth_gb_s,
        fp16_tflops=device.fp16_tflops,
        efficiency_class=cls,  # type: ignore[arg-type]
    )


def target_from_gpu(gpu: GpuSnapshot, fallback: DeviceSpec | None = None, backend: str = "auto") -> Target:
    """A detected GPU of any vendor. Capacity is the memory free now (other processes hold the
    rest) as llama.cpp build ``backend`` sees it: an Apple GPU's wired limit, an AMD APU's carve-out
    and GTT as ROCm or Vulkan counts them ("auto": the vendor's default build)."""
    bandwidth = gpu.bandwidth_gb_s or (fallback.bandwidth_gb_s if fallback else 500.0)
    tflops = fallback.fp16_tflops if fallback else 50.0
    return Target(
        name=f"GPU {gpu.index}: {gpu.name}",
        kind="gpu",
        capacity_bytes=gpu.memory_for(backend).free_bytes,
        bandwidth_gb_s=bandwidth,
        fp16_tflops=tflops,
        efficiency_class=gpu.vendor,
    )


def cpu_flops_tflops(host: HostSnapshot) -> float:
    """Peak FP32 FMA throughput of the host: cores x 3 GHz x lanes x 2 (an order of magnitude)."""
    cores = host.physical_cores or host.logical_cores
    lanes = 16 if "avx512f" in host.cpu_flags else 8 if "avx2" in host.cpu_flags else 4
    return cores * 3.0e9 * lanes * 2 * 2 / 1e12


def repack_profile(host: HostSnapshot | None) -> RepackProfile:
    if host is None:
        return "x86-avx2"
    flags = set(host.cpu_flags)
    if "neon" in flags:
        return "arm-neon"
    if "avx512f" in flags:
        return "x86-avx512"
    if "avx2" in flags:
        return "x86-avx2"
    return "none"


def repack_of_device(device: DeviceSpec) -> RepackProfile:
    """The repacking rules of a catalog machine's CPU: Arm for Apple and NVIDIA's Grace boxes;
    AVX-512 for the rest (every x86 CPU and host platform in the catalog, Zen 4/5 and Xeon 6, has it)."""
    if device.vendor == "apple" or (device.vendor == "nvidia" and device.memory_kind == "unified"):
        return "arm-neon"
    return "x86-avx512"


def cpu_target(host: HostSnapshot | None) -> Target:
    """Host memory as a target: what is available now (plus our own overhead, counted separately)."""
    if host is None:
        return Target(
            name="CPU (unknown host)",
            kind="cpu",
            capacity_bytes=16 * 1024**3,
            bandwidth_gb_s=40.0,
            fp16_tflops=1.0,
            efficiency_class="cpu",
        )
    bandwidth = host.measured_read_bandwidth_gb_s or 30.0
    return Target(
        name=f"CPU: {host.cpu_model}",
        kind="cpu",
        capacity_bytes=host.ram_available_bytes + CPU_RUNTIME_OVERHEAD_BYTES,
        bandwidth_gb_s=bandwidth,
        fp16_tflops=cpu_flops_tflops(host),
        efficiency_class="cpu",
    )


def host_ram_target(capacity_bytes: int, bandwidth_gb_s: float | None = None, host_memory: str | None = None) -> Target:
    """Host memory beside GPUs (its size does not limit GPU memory, only spills). ``bandwidth_gb_s``
    is this machine's measured read bandwidth when the host is this machine; otherwise the
    theoretical peak of ``host_memory`` (a HOST_MEMORY key, default dual-channel DDR5), which the
    speed model discounts as a spec-sheet figure. Raises KeyError for an unknown ``host_memory``."""
    if bandwidth_gb_s:
        return Target(
            name="Host RAM",
            kind="cpu",
            capacity_bytes=capacity_bytes,
            bandwidth_gb_s=bandwidth_gb_s,
            fp16_tflops=1.0,
            efficiency_class="cpu",
        )
    label, peak = HOST_MEMORY[host_memory or DEFAULT_HOST_MEMORY]
    return Target(
        name=f"Host RAM ({label})",
        kind="cpu",
        capacity_bytes=capacity_bytes,
        bandwidth_gb_s=peak,
        fp16_tflops=1.0,
        efficiency_class="host-spec",
    )


def host_ram_beside(device: DeviceSpec, host_ram_bytes: int | None, fallback_bytes: int) -> int:
    """The host memory beside catalog GPU ``device``: for a unified-memory device, what its GPU may
    not take of the one pool (the rest of the box); otherwise ``host_ram_bytes`` when given, else
    ``fallback_bytes``."""
    if device.memory_kind == "unified":
        return int(device.memory_gib * GIB) - device.capacity_bytes
    return host_ram_bytes if host_ram_bytes is not None else fallback_bytes
