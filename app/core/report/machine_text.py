"""This machine in words: each detected GPU's line, its live memory bar and where the figures come
from, and the CPU and RAM. The window's hardware box and ``fitscope hw`` both print these, so they
say the same."""

from __future__ import annotations

import re

from app.core.common.units import GIB
from app.core.hardware.snapshots import GpuSnapshot, GpuStatus, HostSnapshot
from app.core.memory.backends import BUILD_NAMES
from app.core.report.choices import catalog_entry

_SOURCES = {
    "nvidia": "the NVIDIA driver (NVML)",
    "apple": "macOS (sysctl iogpu.wired_limit_mb and the memory it can free)",
    "amd": "the amdgpu driver (/sys/class/drm)",
    "intel": "the Intel driver (/sys/class/drm)",
}


_VENDOR = re.compile(r"^(NVIDIA|AMD|Intel|Apple)\s+(GeForce\s+|Radeon\s+|Instinct\s+)?")
_DETAIL = re.compile(r"\s*\([^)]*\)|\s+\d+\s*GB$")
_LONG_WORDS = (("Workstation Edition", ""), ("Server Edition", ""), ("Ada Generation", "Ada"), ("  ", " "))


def short_device_name(name: str) -> str:
    """A catalog device's name without the vendor and the details in parentheses: "RTX 4090",
    "M2 Ultra", "Threadripper 7980X" (the whole name goes in tooltips)."""
    short = _DETAIL.sub("", _VENDOR.sub("", name.split(" (")[0]))  # brackets (nested ones too) cut
    for long, brief in _LONG_WORDS:
        short = short.replace(long, brief)
    return short.strip()


def with_article(noun: str) -> str:
    """``noun`` after "a" or "an" as it is said aloud: "an RTX 5090 PC", "an M4 Max", "a Ryzen"."""
    word = noun.split()[0] if noun.split() else noun
    spelled = word.isupper() or any(c.isdigit() for c in word)  # said letter by letter: "R-T-X", "M4"
    vowel_sound = word[:1].upper() in "AEIOU" or (spelled and word[:1].upper() in "FHLMNRSX")
    return f"{'an' if vowel_sound else 'a'} {noun}"


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def gpu_label(gpu: GpuSnapshot) -> str:
    """'GPU 0: NVIDIA GeForce RTX 4090 (1,008 GB/s, driver 550.54.15, CUDA 12.4)', 'GPU 0: Apple M4
    Max (40-core GPU, 546 GB/s per the catalog, Metal 3)'. Bandwidth from the driver, else from the
    GPU's catalog entry."""
    parts = []
    if gpu.compute_units:
        parts.append({"apple": f"{gpu.compute_units}-core GPU", "amd": f"{gpu.compute_units} CUs"}.get(gpu.vendor, ""))
    if gpu.bandwidth_gb_s:
        parts.append(f"{gpu.bandwidth_gb_s:,.0f} GB/s")
    else:
        entry = catalog_entry(gpu)
        parts.append(f"{entry.bandwidth_gb_s:,.0f} GB/s per the catalog" if entry else "bandwidth unknown")
    if gpu.driver_version:
        parts.append(
            f"driver {gpu.driver_version}"
            if gpu.vendor == "nvidia"
            else gpu.driver_version
            if gpu.vendor == "apple"
            else f"{gpu.driver_version} driver"
        )
    if gpu.cuda_version:
        parts.append(f"CUDA {gpu.cuda_version}")
    return f"GPU {gpu.index}: {gpu.name} ({', '.join(p for p in parts if p)})"


def gpu_bar(gpu: GpuSnapshot) -> tuple[int, str]:
    """The live memory bar: (permille used, its text) of what the GPU's default llama.cpp build may
    allocate: the VRAM of a card, the wired limit of an Apple GPU, ROCm's share of an AMD APU."""
    total = max(gpu.memory_total_bytes, 1)
    text = f"used {_gib(gpu.memory_used_bytes)} · free {_gib(gpu.memory_free_bytes)} of {_gib(gpu.memory_total_bytes)}"
    if gpu.vendor == "apple":
        text += " (the GPU's wired limit)"
    elif gpu.memory_kind == "unified" and gpu.builds:
        text += f" (as llama.cpp's {BUILD_NAMES.get(gpu.builds[0].backend, gpu.builds[0].backend)} build sees it)"
    return int(1000 * gpu.memory_used_bytes / total), text


def gpu_source(gpu: GpuSnapshot) -> str:
    """Where the bar's figures come from, for its tooltip."""
    return f"Refreshed every second from {_SOURCES[gpu.vendor]}."


def host_label(host: HostSnapshot | None, measuring: bool = False) -> str:
    """'CPU: <model>, 16 cores / 32 threads' and 'RAM: 48.0 GiB free of 64.0 GiB; memory read 62 GB/s
    (measured)' on two lines."""
    if host is None:
        return "CPU: not detected"
    cores = (
        f"{host.physical_cores} cores / {host.logical_cores} threads"
        if host.physical_cores
        else f"{host.logical_cores} threads"
    )
    if host.cpu_clocks_ghz:
        base, boost = host.cpu_clocks_ghz
        cores += f", {base:.1f}–{boost:.1f} GHz" if boost > base else f", {base:.1f} GHz"
    if host.measured_read_bandwidth_gb_s:
        bandwidth = f"memory read {host.measured_read_bandwidth_gb_s:.0f} GB/s (measured)"
    else:
        bandwidth = "measuring memory bandwidth…" if measuring else "memory bandwidth not measured"
    return (
        f"CPU: {host.cpu_model}, {cores}\nRAM: {_gib(host.ram_available_bytes)} free of "
        f"{_gib(host.ram_total_bytes)}; {bandwidth}"
    )


def machine_lines(status: GpuStatus, host: HostSnapshot | None) -> list[str]:
    """What the hardware box shows, as lines: each GPU (its line, its bar's text, its memory note),
    or why there is none; then the CPU and RAM."""
    lines: list[str] = []
    if not status.available or not status.gpus:
        lines.append(status.message)
    for gpu in status.gpus:
        lines.append(gpu_label(gpu))
        lines.append(f"  memory: {gpu_bar(gpu)[1]}")
        if gpu.memory_note:
            lines.append(f"  {gpu.memory_note}")
    if status.available and status.message:
        lines.append(status.message)
    lines.extend(host_label(host).splitlines())
    return lines
