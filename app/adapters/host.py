"""The host CPU and RAM, and a short measurement of how fast the CPU can read memory.

Token generation on a CPU reads every weight once per token, so its speed is bound by memory
READ bandwidth rather than by FLOPs; a published DDR figure overstates what one process gets,
hence the measurement.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from app.adapters.cpu_topology import llama_math_threads
from app.adapters.drm_sysfs import read_int
from app.core.hardware.snapshots import HostSnapshot

if TYPE_CHECKING:
    import logging

__all__ = ["detect_host", "measure_read_bandwidth_gb_s", "parse_cpuinfo"]


def _log() -> logging.Logger:
    # logging is imported on the first message only: detection is on every estimate's start-up path.
    import logging

    return logging.getLogger(__name__)


UNKNOWN_CPU = "unknown CPU"

_CPUINFO_PATH = Path("/proc/cpuinfo")

# The SIMD features llama.cpp's CPU backend picks kernels by, in display order.
RELEVANT_FLAGS: tuple[str, ...] = (
    "sse3",
    "ssse3",
    "sse4_1",
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512vbmi",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "neon",
    "fp16",
    "dotprod",
    "i8mm",
    "bf16",
    "sve",
    "sve2",
)

# Linux (x86 "flags", arm64 "Features") and macOS sysctl spellings -> FitScope's names.
_FLAG_ALIASES = {
    "pni": "sse3",
    "asimd": "neon",
    "asimdhp": "fp16",
    "asimddp": "dotprod",
    "avx1.0": "avx",
    "sse4.1": "sse4_1",
    "sse4.2": "sse4_2",
    "feat_fp16": "fp16",
    "feat_dotprod": "dotprod",
    "feat_i8mm": "i8mm",
    "feat_bf16": "bf16",
}

# Keys that name the CPU in /proc/cpuinfo, best first (arm kernels often lack "model name").
_MODEL_KEYS = ("model name", "cpu model", "hardware", "processor", "model")

# The measurement buffer must dwarf the last-level cache (32-96 MiB on current desktop parts)
# or we would time the cache instead of RAM.
_TARGET_BUFFER_BYTES = 256 * 1024**2
_FILL_SLICE_BYTES = 16 * 1024**2
_MAX_THREADS = 32


def _normalise_flags(tokens: list[str]) -> tuple[str, ...]:
    found = {_FLAG_ALIASES.get(token.lower(), token.lower()) for token in tokens}
    return tuple(flag for flag in RELEVANT_FLAGS if flag in found)


def parse_cpuinfo(text: str) -> tuple[str | None, tuple[str, ...]]:
    """CPU model and relevant SIMD flags from the text of Linux's /proc/cpuinfo.

    The model is None when no line names it (the "processor" key only counts when it is not the
    bare CPU number x86 kernels put there). Flags come from "flags" (x86) or "Features" (arm).
    Never raises.
    """
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key, value = key.strip().lower(), value.strip()
        if sep and value and key not in fields:
            fields[key] = value
    model = None
    for key in _MODEL_KEYS:
        candidate = fields.get(key)
        if candidate and not candidate.isdigit():
            model = candidate
            break
    tokens = (fields.get("flags", "") + " " + fields.get("features", "")).split()
    return model, _normalise_flags(tokens)


def _sysctl(name: str) -> str | None:
    import subprocess

    try:
        result = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=2, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    value = result.stdout.strip()
    return value if result.returncode == 0 and value else None


def _macos_cpu() -> tuple[str | None, tuple[str, ...]]:
    model = _sysctl("machdep.cpu.brand_string")
    if platform.machine() == "arm64":
        tokens = ["neon"]  # every Apple Silicon core has NEON
        for feature in ("FEAT_FP16", "FEAT_DotProd", "FEAT_I8MM", "FEAT_BF16"):
            if _sysctl(f"hw.optional.arm.{feature}") == "1":
                tokens.append(feature)
        return model, _normalise_flags(tokens)
    features = " ".join(filter(None, (_sysctl("machdep.cpu.features"), _sysctl("machdep.cpu.leaf7_features"))))
    return model, _normalise_flags(features.split())


def _windows_cpu() -> tuple[str | None, tuple[str, ...]]:
    model: str | None = None
    if sys.platform != "win32":  # lets type checkers on other platforms skip winreg
        return None, ()
    with contextlib.suppress(OSError, ImportError):
        import winreg

        key = winreg.OpenKey(winreg.HKEY_LOCAL_MACHINE, r"HARDWARE\DESCRIPTION\System\CentralProcessor\0")
        model = str(winreg.QueryValueEx(key, "ProcessorNameString")[0]).strip() or None
    tokens: list[str] = []
    with contextlib.suppress(OSError, AttributeError, ImportError):
        import ctypes

        present = ctypes.windll.kernel32.IsProcessorFeaturePresent  # type: ignore[attr-defined]
        # PF_AVX_INSTRUCTIONS_AVAILABLE = 39, PF_AVX2_... = 40, PF_AVX512F_... = 41,
        # PF_ARM_NEON_INSTRUCTIONS_AVAILABLE = 19, PF_ARM_V82_DP_INSTRUCTIONS_AVAILABLE = 43.
        for code, flag in ((39, "avx"), (40, "avx2"), (41, "avx512f"), (19, "neon"), (43, "dotprod")):
            if present(code):
                tokens.append(flag)
    return model or platform.processor() or None, _normalise_flags(tokens)


_CPU0_PATH = Path("/sys/devices/system/cpu/cpu0")


def parse_cpu_clocks(
    model: str, base_mhz: float | None = None, max_mhz: float | None = None
) -> tuple[float, float] | None:
    """(base, boost) GHz of a CPU from what the OS reports: its base clock (``base_mhz``), else the one an
    Intel model name states ("... CPU @ 2.40GHz"); its highest clock (``max_mhz``, the boost where boost is
    on) where it is above the base, else the base again. None without a base clock (nor a plausible one:
    0.4-7 GHz)."""
    base = base_mhz / 1000 if base_mhz else None
    if base is None:
        m = re.search(r"@\s*(\d+(?:\.\d+)?)\s*GHz", model, re.IGNORECASE)
        base = float(m.group(1)) if m else None
    if base is None or not 0.4 <= base <= 7.0:
        return None
    top = max_mhz / 1000 if max_mhz else 0.0
    return base, round(top, 3) if base < top <= 7.0 else base


def _cpu_clocks(model: str, root: Path = _CPU0_PATH) -> tuple[float, float] | None:
    """This CPU's (base, boost) GHz (``parse_cpu_clocks``) from Linux's cpufreq (``base_frequency`` of
    intel_pstate and amd-pstate, kHz; ``cpuinfo_max_freq``, kHz) or ACPI CPPC (``nominal_freq``, MHz), from
    macOS's sysctl on Intel Macs, from psutil elsewhere (its maximum); None where none is reported."""
    base = max_mhz = None
    with contextlib.suppress(Exception):
        if sys.platform.startswith("linux"):
            khz = read_int(root / "cpufreq" / "base_frequency")
            base = khz / 1000 if khz else read_int(root / "acpi_cppc" / "nominal_freq") or None
            top = read_int(root / "cpufreq" / "cpuinfo_max_freq")
            max_mhz = top / 1000 if top else None
        elif sys.platform == "darwin":
            hz, top_hz = _sysctl("hw.cpufrequency"), _sysctl("hw.cpufrequency_max")
            base = float(hz) / 1e6 if hz else None
            max_mhz = float(top_hz) / 1e6 if top_hz else None
        if max_mhz is None:
            freq = psutil.cpu_freq()
            max_mhz = float(freq.max) if freq and freq.max else None
            base = base or (None if sys.platform.startswith("linux") else max_mhz)
    return parse_cpu_clocks(model, base, max_mhz)


def _cpu_model_and_flags() -> tuple[str, tuple[str, ...]]:
    model: str | None = None
    flags: tuple[str, ...] = ()
    try:
        if sys.platform.startswith("linux"):
            # Containers and sandboxes may hide /proc.
            with contextlib.suppress(OSError):
                model, flags = parse_cpuinfo(_CPUINFO_PATH.read_text(encoding="utf-8", errors="replace"))
        elif sys.platform == "darwin":
            model, flags = _macos_cpu()
        elif sys.platform == "win32":
            model, flags = _windows_cpu()
    except Exception:
        _log().exception("CPU detection failed")
    if not model:
        with contextlib.suppress(Exception):
            model = platform.processor().strip() or None
    return model or UNKNOWN_CPU, flags


def _measurement_threads() -> int:
    # llama.cpp decodes on the physical cores; one numpy thread alone cannot saturate DDR channels.
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    physical = psutil.cpu_count(logical=False) or usable
    return max(1, min(physical, usable, _MAX_THREADS))


def measure_read_bandwidth_gb_s(budget_s: float = 1.0) -> float:
    """Memory read bandwidth of this machine in GB/s (10^9 bytes/s), measured with numpy.

    Fills a buffer far larger than the last-level cache (256 MiB, less if RAM is short or the OS
    is slow to hand out pages), then times reductions over it on one thread per physical core
    (numpy releases the GIL inside them) and returns the best pass. Everything, allocation
    included, stays within ``budget_s`` seconds plus at most one pass (a few ms to tens of ms).

    Raises ValueError when ``budget_s`` is not positive and MemoryError when not even a small
    buffer can be allocated.
    """
    if not budget_s > 0:
        raise ValueError(f"budget_s must be positive, got {budget_s!r}")
    # numpy takes longer to import than a catalog estimate takes to compute: imported only to measure.
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    start = time.perf_counter()
    deadline = start + budget_s

    available = psutil.virtual_memory().available
    # Leave the user's RAM alone: use at most an eighth of what is free.
    target_bytes = max(_FILL_SLICE_BYTES, min(_TARGET_BUFFER_BYTES, available // 8))
    buffer = np.empty(target_bytes // 8, dtype=np.float64)

    # np.empty only reserves address space; untouched pages all map to one zero page, which would
    # read at cache speed. Touch them in slices so a slow page-fault path (VMs) cannot eat the budget.
    slice_items = _FILL_SLICE_BYTES // 8
    filled = 0
    fill_deadline = start + budget_s * 0.5
    while filled < buffer.size and (filled == 0 or time.perf_counter() < fill_deadline):
        buffer[filled : filled + slice_items] = 1.0
        filled = min(buffer.size, filled + slice_items)
    data = buffer[:filled]

    threads = _measurement_threads()
    chunks = [chunk for chunk in np.array_split(data, threads) if chunk.size]
    # maximum.reduce has a higher in-cache ceiling than add.reduce's pairwise sum, so the pass is
    # bound by memory even on machines with few, fast cores.
    reduce = np.maximum.reduce
    best = 0.0
    with ThreadPoolExecutor(max_workers=len(chunks)) as pool:
        last_pass = 0.0
        passes = 0
        while passes == 0 or (passes < 50 and time.perf_counter() + last_pass < deadline):
            t0 = time.perf_counter()
            if len(chunks) == 1:
                reduce(chunks[0])
            else:
                list(pool.map(reduce, chunks))
            last_pass = time.perf_counter() - t0
            passes += 1
            if last_pass > 0:
                best = max(best, data.nbytes / last_pass / 1e9)
    del data, buffer, chunks
    return best if best > 0 else float("nan")


def detect_host(measure_bandwidth: bool = True) -> HostSnapshot:
    """The CPU model, cores, RAM (bytes) and SIMD flags of this machine, now.

    With ``measure_bandwidth`` the snapshot includes ``measure_read_bandwidth_gb_s()`` (about one
    second); a failed measurement leaves it None. Never raises for missing /proc files or tools:
    the model falls back to platform.processor() and then to "unknown CPU".
    """
    model, flags = _cpu_model_and_flags()
    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    physical = psutil.cpu_count(logical=False) or None
    memory = psutil.virtual_memory()

    bandwidth: float | None = None
    if measure_bandwidth:
        try:
            bandwidth = measure_read_bandwidth_gb_s()
        except (MemoryError, ValueError, RuntimeError) as error:
            _log().warning("Memory bandwidth measurement failed: %r", error)
        if bandwidth is not None and not bandwidth > 0:
            bandwidth = None

    return HostSnapshot(
        cpu_model=model,
        physical_cores=physical,
        logical_cores=logical,
        ram_total_bytes=memory.total,
        ram_available_bytes=memory.available,
        cpu_flags=flags,
        cpu_clocks_ghz=_cpu_clocks(model),
        llama_threads=llama_math_threads(),
        measured_read_bandwidth_gb_s=bandwidth,
        timestamp=time.time(),
    )
