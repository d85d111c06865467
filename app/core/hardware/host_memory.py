"""The host beside catalog GPUs, by what the box would have: the memory kinds ``--host-memory`` names,
the CPU that comes with each (cores, SIMD width) and the GPU's PCIe link.

Plain data, imported by the command line's parser without the records of ``app.core.hardware.snapshots``.
"""

from __future__ import annotations

import re

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
