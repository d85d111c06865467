"""The estimator's devices (:class:`~app.core.memory.estimate.Target`) from what FitScope knows of
hardware: a catalog device, a detected GPU, this machine's CPU, or the host memory beside GPUs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.common.units import GIB
from app.core.hardware.devices import DeviceSpec, default_pcie
from app.core.hardware.host_memory import parse_host_memory
from app.core.memory.records import CPU_RUNTIME_OVERHEAD_BYTES, RepackProfile, Target

if TYPE_CHECKING:
    from app.core.hardware.snapshots import GpuSnapshot, HostSnapshot


def target_from_device(device: DeviceSpec, pcie: tuple[int, int] | None = None) -> Target:
    """A catalog device. ``pcie`` (generation, lanes) replaces a GPU's link as the card is sold
    (``default_pcie``)."""
    # A catalog CPU's bandwidth is its memory's spec-sheet peak, not a measurement.
    cls = "host-spec"
    if device.is_gpu:
        cls = {"nvidia": "nvidia", "amd": "amd", "apple": "apple", "intel": "intel"}.get(device.vendor, "cpu")
    link = (pcie or default_pcie(device)) if device.is_gpu else None
    return Target(
        name=device.name,
        kind="gpu" if device.is_gpu else "cpu",
        capacity_bytes=device.capacity_bytes,
        bandwidth_gb_s=device.bandwidth_gb_s,
        fp16_tflops=device.fp16_tflops,
        vector_tflops=device.fp32_tflops if device.is_gpu else None,
        prompt_tflops=kernel_tflops(device),
        efficiency_class=cls,  # type: ignore[arg-type]
        pcie_gen=link[0] if link else None,
        pcie_lanes=link[1] if link else None,
        pcie_stated=pcie is not None,
        cpu_clocks_ghz=None if device.is_gpu else device.clocks_ghz,
    )


def target_from_gpu(gpu: GpuSnapshot, fallback: DeviceSpec | None = None, backend: str = "auto") -> Target:
    """A detected GPU of any vendor. Capacity is the memory free now (other processes hold the
    rest) as llama.cpp build ``backend`` sees it: an Apple GPU's wired limit, an AMD APU's carve-out
    and GTT as ROCm or Vulkan counts them ("auto": the vendor's default build). Its PCIe link as the
    driver reports it (``GpuSnapshot.pcie_link``), else the catalog card's."""
    bandwidth = gpu.bandwidth_gb_s or (fallback.bandwidth_gb_s if fallback else 500.0)
    tflops = fallback.fp16_tflops if fallback else 50.0
    kernels = kernel_tflops(fallback) if fallback else None
    link = gpu.pcie_link or (default_pcie(fallback) if fallback else None)
    return Target(
        name=f"GPU {gpu.index}: {gpu.name}",
        kind="gpu",
        capacity_bytes=gpu.memory_for(backend).free_bytes,
        bandwidth_gb_s=bandwidth,
        fp16_tflops=tflops,
        vector_tflops=fallback.fp32_tflops if fallback else None,
        prompt_tflops=kernels,
        efficiency_class=gpu.vendor,
        pcie_gen=link[0] if link else None,
        pcie_lanes=link[1] if link else None,
        pcie_stated=gpu.pcie_link is not None,
    )


def kernel_tflops(device: DeviceSpec) -> float | None:
    """The rate llama.cpp's kernels for quantized weights are modelled at on ``device``
    (``Target.prompt_tflops``); None where they are modelled at its FP16 peak.

    A catalog CPU with known lanes: its cores at AVX2's width (``prompt_lanes``). A Radeon GPU whose
    packed rate is below its matrix peak: its shader ALUs' packed FP16 rate, twice ``fp32_tflops`` (which
    counts dual issue). RDNA 1-3's FP16 figures are that rate (RDNA 3's WMMA runs at it); RDNA 4 doubled the
    matrix rate per CU, and published runs of its quantized kernels (Radeon AI PRO R9700 on ROCm and Vulkan,
    RX 9070 XT on Vulkan; tests/data) measure at RDNA 3's share of the packed rate, not of the doubled peak;
    its float weights' GEMMs (hipBLASLt) outrun the packed rate and are modelled at the matrix peak."""
    if not device.is_gpu:
        return device.fp16_tflops * prompt_lanes(device.simd_lanes) / device.simd_lanes if device.simd_lanes else None
    if device.vendor == "amd" and device.segment != "datacenter" and device.fp32_tflops:
        packed = 2 * device.fp32_tflops
        return packed if packed < device.fp16_tflops * 0.95 else None
    return None


def simd_fp32_lanes(avx512: bool, avx2: bool = True) -> int:
    """FP32 lanes of one SIMD unit: 16 with AVX-512, 8 with AVX2, 4 otherwise (SSE, NEON)."""
    return 16 if avx512 else 8 if avx2 else 4


# The clock ``cores_flops_tflops`` counts every core at: the speed model's CPU constants are rates against it.
NOMINAL_GHZ = 3.0


def busy_clock_ghz(threads: int | None, cores: int | None, clocks: tuple[float, float] | None) -> float:
    """The clock a CPU holds with ``threads`` of its ``cores`` computing (all of them where either is None),
    from its (base, boost) ``clocks`` in GHz: the base clock with every core busy (the clock its maker rates
    at its sustained power, which an all-core AVX load is held to), rising linearly to the boost clock as
    fewer cores share that power. NOMINAL_GHZ where the clocks are not known. The speed model counts a CPU's
    arithmetic (a prompt's matrix products, a decoded token's dequantizing and dot products) at it: published
    llama-bench rates of x86 CPUs follow it (mobile chips at their low base clock, desktop ones near boost;
    tests/data, ``CPU_CLOCKS``), where 3 GHz for all left their prompt rates 0.3x-1.8x apart."""
    if not clocks:
        return NOMINAL_GHZ
    base, boost = clocks
    if not cores or not threads:
        return base
    idle = 1.0 - min(threads, cores) / cores
    return base + (max(boost, base) - base) * idle


def cores_flops_tflops(cores: int, lanes: int) -> float:
    """Peak FP32 FMA throughput of ``cores``: cores x NOMINAL_GHZ x lanes x 2 (FMA) x 2 (units), in TFLOPS
    (an order of magnitude; the speed model's CPU constants are fitted against this same rule, with the
    CPU's own clock in place of the nominal one where it is known: ``busy_clock_ghz``)."""
    return cores * NOMINAL_GHZ * 1e9 * lanes * 2 * 2 / 1e12


# llama.cpp's x86 prompt kernels for quantized weights work at AVX2's width: the dot products of the
# K-quants, Q4_0 and Q8_0 (ggml-cpu/arch/x86/quants.c) have AVX2 code only, and the AVX-512 paths of the
# repacked GEMMs run on 256-bit units on Zen 4, mobile Zen 5 and Intel's client cores. Counting 16
# lanes for AVX-512 put those CPUs' prompt rate at twice what llama-bench measures on them.
PROMPT_LANES = 8


def prompt_lanes(lanes: int) -> int:
    """The FP32 lanes a CPU with ``lanes`` of SIMD gives llama.cpp's quantized prompt kernels."""
    return min(lanes, PROMPT_LANES)


def prompt_tflops(cores: int, lanes: int) -> float:
    """``cores_flops_tflops`` at the lanes the quantized prompt kernels use (``prompt_lanes``)."""
    return cores_flops_tflops(cores, prompt_lanes(lanes))


def host_lanes(host: HostSnapshot) -> int:
    return simd_fp32_lanes("avx512f" in host.cpu_flags, "avx2" in host.cpu_flags)


def cpu_flops_tflops(host: HostSnapshot) -> float:
    """Peak FP32 FMA throughput of the host (``cores_flops_tflops`` of its physical cores)."""
    return cores_flops_tflops(host.physical_cores or host.logical_cores, host_lanes(host))


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
        prompt_tflops=prompt_tflops(host.physical_cores or host.logical_cores, host_lanes(host)),
        efficiency_class="cpu",
        cpu_cores=host.physical_cores or host.logical_cores,
        cpu_clocks_ghz=host.cpu_clocks_ghz,
        cpu_default_threads=host.llama_threads,
    )


def host_ram_target(
    capacity_bytes: int,
    bandwidth_gb_s: float | None = None,
    host_memory: str | None = None,
    host: HostSnapshot | None = None,
    cores: int | None = None,
) -> Target:
    """Host memory beside GPUs (its size does not limit GPU memory, only spills), and the CPU that
    computes what stays there. ``bandwidth_gb_s`` is this machine's measured read bandwidth when the
    host is this machine (``host`` then gives its cores and SIMD); otherwise the theoretical peak of
    ``host_memory`` (``parse_host_memory``: a preset or any DDR generation, speed and channels; default
    dual-channel DDR5), which the speed model discounts as a spec-sheet figure, with the CPU such a
    box has or ``cores`` of it. Raises ValueError for memory ``parse_host_memory`` does not read."""
    if bandwidth_gb_s:
        n_cores = cores or (host.physical_cores or host.logical_cores if host else 8)
        avx512 = host is not None and "avx512f" in host.cpu_flags
        avx2 = host is None or "avx2" in host.cpu_flags
        return Target(
            name="Host RAM",
            kind="cpu",
            capacity_bytes=capacity_bytes,
            bandwidth_gb_s=bandwidth_gb_s,
            fp16_tflops=cores_flops_tflops(n_cores, simd_fp32_lanes(avx512, avx2)),
            prompt_tflops=prompt_tflops(n_cores, simd_fp32_lanes(avx512, avx2)),
            efficiency_class="cpu",
            cpu_cores=n_cores,
            cpu_clocks_ghz=host.cpu_clocks_ghz if host is not None else None,
            cpu_default_threads=host.llama_threads if host is not None and not cores else None,
        )
    memory = parse_host_memory(host_memory)
    avx512 = memory.avx512
    n_cores = cores or memory.cores
    return Target(
        name=f"Host RAM ({memory.label})",
        kind="cpu",
        capacity_bytes=capacity_bytes,
        bandwidth_gb_s=memory.peak_gb_s,
        bandwidth_span_gb_s=None if memory.speed_stated else (memory.slow_gb_s, memory.fast_gb_s),
        fp16_tflops=cores_flops_tflops(n_cores, simd_fp32_lanes(avx512)),
        prompt_tflops=prompt_tflops(n_cores, simd_fp32_lanes(avx512)),
        efficiency_class="host-spec",
        cpu_cores=n_cores,
    )


def host_ram_beside(device: DeviceSpec, host_ram_bytes: int | None, fallback_bytes: int) -> int:
    """The host memory beside catalog GPU ``device``: for a unified-memory device, what its GPU may
    not take of the one pool (the rest of the box); otherwise ``host_ram_bytes`` when given, else
    ``fallback_bytes``."""
    if device.memory_kind == "unified":
        return int(device.memory_gib * GIB) - device.capacity_bytes
    return host_ram_bytes if host_ram_bytes is not None else fallback_bytes
