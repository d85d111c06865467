"""What FitScope detected on this machine: its GPUs (NVIDIA through NVML, Apple Silicon, AMD and
Intel through their drivers) and the host CPU and RAM.

These records are pure data; the adapters (``app.adapters.nvml``, ``gpu_apple``, ``gpu_amd``,
``gpu_intel``, gathered by ``app.adapters.gpus``, and ``app.adapters.host``) fill them in. A field is
``None`` when the driver or OS could not tell us, never a made-up default.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Named here too: the host memory kinds live apart so that the command line's parser reads them without pydantic.
from app.core.hardware.host_memory import DEFAULT_HOST_MEMORY as DEFAULT_HOST_MEMORY
from app.core.hardware.host_memory import HOST_MEMORY as HOST_MEMORY

NO_DRIVER_MESSAGE = (
    "No NVIDIA driver found: FitScope will estimate for the CPU and for hardware picked from the catalog."
)


def memory_bandwidth_gb_s(bus_width_bits: int | None, memory_clock_max_mhz: int | None) -> float | None:
    """Peak memory bandwidth in GB/s (10^9 bytes/s) from NVML's bus width and maximum memory clock.

    bytes per transfer (bus_width_bits / 8) x memory clock (MHz) x 2 (double data rate) / 1000.
    NVML reports the memory clock such that this gives the vendor's figure for GDDR6, GDDR6X and
    HBM alike: RTX 4090 (384 bits, 10501 MHz) -> 1008 GB/s; H100 SXM (5120 bits, 2619 MHz) ->
    3352 GB/s; A100 80GB (5120 bits, 1593 MHz) -> 2039 GB/s.

    Returns None when either input is unknown or not positive (some virtual GPUs report 0).
    Never raises.
    """
    if not bus_width_bits or not memory_clock_max_mhz or bus_width_bits <= 0 or memory_clock_max_mhz <= 0:
        return None
    return bus_width_bits / 8 * memory_clock_max_mhz * 2 / 1000


def cuda_version_string(cuda_driver_version: int | None) -> str | None:
    """``"12.4"`` from NVML's integer CUDA driver version (12040); None when unknown or not positive."""
    if cuda_driver_version is None or cuda_driver_version <= 0:
        return None
    return f"{cuda_driver_version // 1000}.{(cuda_driver_version % 1000) // 10}"


class GpuProcess(BaseModel):
    """A process holding memory on one GPU.

    ``name`` is None when the process is not visible to us (another container, no permission);
    ``used_memory_bytes`` is None where the driver cannot attribute memory (Windows WDDM).
    """

    model_config = ConfigDict(frozen=True)

    pid: int = Field(ge=0)
    name: str | None = None
    used_memory_bytes: int | None = Field(default=None, ge=0)


GpuVendor = Literal["nvidia", "amd", "apple", "intel"]


class BuildMemory(BaseModel):
    """The GPU memory one llama.cpp build sees on a GPU (``ggml_backend_dev_memory``), in bytes.

    ``backend`` is a llama.cpp build as ``app.core.memory.backends`` names it (metal, rocm, vulkan,
    sycl); ``note`` says where the figure comes from when the builds differ.
    """

    model_config = ConfigDict(frozen=True)

    backend: str
    total_bytes: int = Field(ge=0)
    free_bytes: int = Field(ge=0)
    note: str = ""


class GpuSnapshot(BaseModel):
    """One GPU as its driver reported it at ``timestamp`` (seconds since the epoch, ``time.time()``).

    ``memory_total_bytes`` / ``memory_free_bytes`` are what the GPU's default llama.cpp build can
    allocate (CUDA, Metal, ROCm, SYCL): the whole VRAM of a discrete card, the wired limit
    (``recommendedMaxWorkingSetSize``) of an Apple GPU, what ROCm sees of an AMD APU.
    ``memory_used_bytes`` includes memory the driver reserves, so used + free may differ slightly
    from total. ``builds`` lists what each llama.cpp build sees when they can differ (an APU's
    carve-out and GTT); ``memory_note`` says why the usable memory is what it is and how to change
    it. ``memory_kind`` is "unified" when the GPU takes its memory from the system RAM
    (``shared_memory_bytes``: Apple's unified memory, an APU's RAM). Power is in watts.
    """

    model_config = ConfigDict(frozen=True)

    index: int = Field(ge=0)
    name: str
    uuid: str | None = None
    memory_total_bytes: int = Field(ge=0)
    memory_used_bytes: int = Field(ge=0)
    memory_free_bytes: int = Field(ge=0)
    driver_version: str | None = None
    cuda_version: str | None = None
    memory_bus_width_bits: int | None = Field(default=None, gt=0)
    memory_clock_max_mhz: int | None = Field(default=None, gt=0)
    bandwidth_gb_s: float | None = Field(default=None, gt=0)
    compute_capability: str | None = None
    power_draw_w: float | None = Field(default=None, ge=0)
    power_limit_w: float | None = Field(default=None, ge=0)
    processes: tuple[GpuProcess, ...] = ()
    pcie_gen_current: int | None = Field(default=None, ge=1, le=6, description="PCIe generation the link runs at now")
    pcie_width_current: int | None = Field(default=None, ge=1, le=32, description="PCIe lanes the link runs at now")
    pcie_gen_max: int | None = Field(default=None, ge=1, le=6, description="the best generation card and slot allow")
    pcie_width_max: int | None = Field(default=None, ge=1, le=32, description="the most lanes card and slot allow")
    timestamp: float = Field(ge=0)
    vendor: GpuVendor = "nvidia"
    memory_kind: Literal["dedicated", "unified"] = "dedicated"
    shared_memory_bytes: int | None = Field(default=None, ge=0)
    carveout_bytes: int | None = Field(default=None, ge=0, description="an APU's BIOS carve-out (VRAM)")
    gtt_bytes: int | None = Field(default=None, ge=0, description="system memory an AMD GPU may map (GTT)")
    compute_units: int | None = Field(default=None, ge=1, description="GPU cores (Apple), CUs (AMD), Xe cores")
    builds: tuple[BuildMemory, ...] = ()
    memory_note: str = ""
    catalog_id: str | None = None

    def memory_for(self, backend: str) -> BuildMemory:
        """What llama.cpp build ``backend`` sees on this GPU; the default build's figures when the
        builds do not differ or ``backend`` is not listed ("auto", "cuda" on an NVIDIA GPU...)."""
        found = next((b for b in self.builds if b.backend == backend), None)
        if found is not None:
            return found
        default = self.builds[0].backend if self.builds else "cuda"
        return BuildMemory(backend=default, total_bytes=self.memory_total_bytes, free_bytes=self.memory_free_bytes)

    def taken_from_ram_bytes(self, backend: str) -> int:
        """How much of what ``backend`` may allocate comes out of the system RAM: all of it for
        Apple's unified memory, what lies beyond the carve-out for an APU, none for a card."""
        if self.memory_kind != "unified":
            return 0
        return max(0, self.memory_for(backend).total_bytes - (self.carveout_bytes or 0))

    @property
    def pcie_link(self) -> tuple[int, int] | None:
        """(generation, lanes) the link runs at under load. An idle card steps its link down to save
        power (NVML's current generation reads 1 at the desktop), so the best the card and slot allow
        (``nvmlDeviceGetMaxPcieLinkGeneration``/``Width``, which account for the slot) is the figure
        a prompt's weight copies get; the current one where the maximum is not reported."""
        gen = self.pcie_gen_max or self.pcie_gen_current
        lanes = self.pcie_width_max or self.pcie_width_current
        return (gen, lanes) if gen and lanes else None


class GpuStatus(BaseModel):
    """Whether this machine's GPUs can be queried, and what they are.

    ``available`` is True only when at least one GPU was found; ``message`` is then empty or says
    what could not be read, and otherwise is a complete sentence for the user saying why there is
    none and what FitScope does instead.
    """

    model_config = ConfigDict(frozen=True)

    available: bool
    message: str = ""
    driver_version: str | None = None
    gpus: tuple[GpuSnapshot, ...] = ()


class HostSnapshot(BaseModel):
    """The CPU and RAM of this machine at ``timestamp`` (seconds since the epoch).

    ``cpu_flags`` lists the SIMD features llama.cpp's CPU backend cares about, lower-case
    (``avx2``, ``avx512f``, ``fma``, ``f16c``, ``neon``, ``dotprod``...), as far as the OS tells us.
    ``measured_read_bandwidth_gb_s`` is a short numpy measurement (GB/s = 10^9 bytes/s), None when
    it was not run or failed.
    """

    model_config = ConfigDict(frozen=True)

    cpu_model: str = Field(min_length=1)
    physical_cores: int | None = Field(default=None, ge=1)
    logical_cores: int = Field(ge=1)
    ram_total_bytes: int = Field(ge=0)
    ram_available_bytes: int = Field(ge=0)
    cpu_flags: tuple[str, ...] = ()
    cpu_clocks_ghz: tuple[float, float] | None = None  # (base, boost), as the OS reports them
    # The threads llama.cpp's tools use here by default: the physical cores, only the performance cores
    # of a hybrid CPU (``app.adapters.cpu_topology``); None: not known (the physical cores are assumed).
    llama_threads: int | None = Field(default=None, ge=1)
    measured_read_bandwidth_gb_s: float | None = Field(default=None, gt=0)
    timestamp: float = Field(ge=0)


def machine_key(host: HostSnapshot | None, gpus: tuple[GpuSnapshot, ...] = ()) -> str:
    """Names this machine where measured efficiencies are kept: its CPU and its GPUs (any vendor)."""
    cpu = host.cpu_model if host is not None else "unknown CPU"
    return f"{cpu}|{','.join(g.name for g in gpus)}"
