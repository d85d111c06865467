"""The host beside catalog GPUs, by what the box would have: the memory kinds ``--host-memory`` names,
the CPU that comes with each (cores, SIMD width) and the GPU's PCIe link.

Plain data, imported by the command line's parser without the records of ``app.core.hardware.snapshots``.
"""

from __future__ import annotations

import re
from typing import NamedTuple

# Theoretical peak = channels x 8 bytes x transfers/s (JEDEC speed grades), in GB/s. Decode reads
# experts and CPU layers from it.
HOST_MEMORY: dict[str, tuple[str, float]] = {
    "ddr4-3200-2ch": ("DDR4-3200, 2 channels (desktop)", 51.2),
    "ddr5-5600-2ch": ("DDR5-5600, 2 channels (desktop)", 89.6),
    "ddr5-6400-4ch": ("DDR5-6400, 4 channels (Threadripper)", 204.8),
    "ddr5-4800-8ch": ("DDR5-4800, 8 channels (Xeon, Threadripper PRO)", 307.2),
    "ddr5-6000-12ch": ("DDR5-6000, 12 channels (EPYC 9005)", 576.0),
}
DEFAULT_HOST_MEMORY = "ddr5-5600-2ch"

# The CPU a box with that memory usually has, when none is named (--host-cores replaces the cores):
# physical cores and whether it runs 512-bit SIMD (the FP32 lanes of cpu_flops_tflops: 16 with
# AVX-512, 8 with AVX2). Desktop defaults are mid-range (8 cores, AVX2: Core i7 / Ryzen 7 class).
HOST_CPU: dict[str, tuple[int, bool]] = {
    "ddr4-3200-2ch": (8, False),
    "ddr5-5600-2ch": (8, False),
    "ddr5-6400-4ch": (24, True),
    "ddr5-4800-8ch": (32, True),
    "ddr5-6000-12ch": (64, True),
}

# PCIe payload bandwidth per lane and direction, GB/s, after line encoding (8b/10b for gen 1-2,
# 128b/130b for gen 3-5, FLIT for gen 6): PCI-SIG base specifications.
PCIE_LANE_GB_S: dict[int, float] = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
PCIE_CHOICES: tuple[str, ...] = ("3x4", "3x8", "3x16", "4x4", "4x8", "4x16", "5x8", "5x16")
DEFAULT_PCIE = (4, 16)


def pcie_gb_s(gen: int, lanes: int) -> float:
    """Payload bandwidth of a PCIe link in GB/s (one direction). Raises KeyError for an unknown generation."""
    return PCIE_LANE_GB_S[gen] * lanes


def parse_pcie(text: str) -> tuple[int, int]:
    """(generation, lanes) from "4x16", "4.0 x16", "gen4x8" or "PCIe 5.0 x16". Raises ValueError with a
    sentence a person can act on."""
    m = re.fullmatch(r"\s*(?:pcie\s*)?(?:gen\s*)?([1-6])(?:\.0)?\s*x\s*(1|2|4|8|16)\s*", text.lower())
    if not m:
        raise ValueError(
            f"'{text}' is not a PCIe link: write the generation and the lanes, for example 4x16 (PCIe 4.0 x16) or 3x4."
        )
    return int(m.group(1)), int(m.group(2))


def pcie_label(gen: int, lanes: int) -> str:
    return f"PCIe {gen}.0 x{lanes}"


# A DDR generation's speeds when a box's memory is named without one: the JEDEC base grade a module
# runs at when no faster profile (XMP, EXPO) is switched on, the grade FitScope assumes (the presets'
# DDR4-3200 and DDR5-5600; DDR3-1600), and the fastest common module grade (JEDEC JESD79-3/-4/-5
# speed bins; vendors' XMP/EXPO kits).
DDR_SPEEDS: dict[int, tuple[int, int, int]] = {3: (1333, 1600, 1866), 4: (2133, 3200, 3600), 5: (4800, 5600, 6400)}
DDR_LIMITS: dict[int, tuple[int, int]] = {3: (800, 3200), 4: (1600, 5600), 5: (3200, 10000)}  # MT/s, any module
MAX_CHANNELS = 24  # two sockets of 12-channel EPYC


class HostMemory(NamedTuple):
    """Host memory as ``--host-memory`` names it: a preset (HOST_MEMORY) or any DDR generation, speed
    and count of 64-bit channels. ``slow_gb_s``/``fast_gb_s`` differ from ``peak_gb_s`` only where the
    speed was not named: the generation's slowest and fastest common grades."""

    key: str
    label: str
    peak_gb_s: float
    cores: int
    avx512: bool
    slow_gb_s: float
    fast_gb_s: float

    @property
    def speed_stated(self) -> bool:
        return self.slow_gb_s == self.fast_gb_s


def ddr_gb_s(mt_s: int, channels: int) -> float:
    """Theoretical peak of ``channels`` 64-bit DDR channels at ``mt_s`` transfers per second, GB/s."""
    return channels * 8 * mt_s / 1000


def parse_host_memory(text: str | None) -> HostMemory:
    """A HOST_MEMORY key, or a DDR generation with its speed and 64-bit channels: "ddr4-2666-2ch",
    "DDR5-6000, 2 channels", "ddr4 2ch" (speed not known: its generation's common grades, assuming
    the presets' DDR4-3200 or DDR5-5600). None is the default (dual-channel DDR5). Raises ValueError with a sentence a
    person can act on."""
    key = (text or DEFAULT_HOST_MEMORY).strip().lower()
    if key in HOST_MEMORY:
        label, peak = HOST_MEMORY[key]
        cores, avx512 = HOST_CPU[key]
        return HostMemory(key, label, peak, cores, avx512, peak, peak)
    m = re.fullmatch(
        r"ddr\s*([345])(?:\s*[-\s]\s*(\d{3,5})(?:\s*mt/s)?|\s*,?\s*speed not (?:stated|known))?"
        r"\s*[-,\s]\s*(\d{1,2})\s*(?:ch|channels?)\b.*",
        key,
    )
    if not m:
        raise ValueError(
            f"'{text}' is not a memory type: write its generation, speed and 64-bit channels, for example "
            "ddr4-2666-2ch or ddr5-6000-2ch (ddr4-2ch when the speed is not known)."
        )
    gen, speed, channels = int(m.group(1)), int(m.group(2)) if m.group(2) else None, int(m.group(3))
    slow, typical, fast = DDR_SPEEDS[gen]
    if not 1 <= channels <= MAX_CHANNELS:
        raise ValueError(f"{channels} memory channels: a box has 1 to {MAX_CHANNELS}.")
    low, high = DDR_LIMITS[gen]
    if speed is not None and not low <= speed <= high:
        raise ValueError(f"DDR{gen}-{speed} is not a DDR{gen} speed: its modules run at {low}-{high} MT/s.")
    # The CPU such a box has: a desktop's on one or two channels, the preset platform's with as many.
    by_channels = {1: (4, False), 2: (8, False), 4: (24, gen >= 5), 8: (32, gen >= 5), 12: (64, gen >= 5)}
    cores, avx512 = by_channels[max(c for c in by_channels if c <= channels)]
    plural = "s" if channels > 1 else ""
    if speed is None:
        return HostMemory(
            f"ddr{gen}-{channels}ch",
            f"DDR{gen}, speed not stated, {channels} channel{plural}",
            ddr_gb_s(typical, channels),
            cores,
            avx512,
            ddr_gb_s(slow, channels),
            ddr_gb_s(fast, channels),
        )
    key = f"ddr{gen}-{speed}-{channels}ch"
    if key in HOST_MEMORY:
        return parse_host_memory(key)
    peak = ddr_gb_s(speed, channels)
    return HostMemory(key, f"DDR{gen}-{speed}, {channels} channel{plural}", peak, cores, avx512, peak, peak)
