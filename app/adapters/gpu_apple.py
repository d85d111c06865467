"""Apple Silicon GPUs: the chip, its GPU cores and unified memory, and the share of that memory
the GPU may really wire for a model.

Metal lets a GPU allocate ``MTLDevice.recommendedMaxWorkingSetSize``, and llama.cpp's Metal build
reports exactly that as the device's memory (``ggml_metal_device_get_memory``: total = the working
set, free = the working set less what this process holds). It is a share of the unified memory:
2/3 up to 32 GB and 3/4 above on macOS 13-15 (5461 MiB of 8 GiB, 10923 of 16, 21845 of 32, 73728 of
96 in published llama.cpp logs; tests/data/hw/README.md), more on macOS 26 (107.52 of 128 GiB).
``sudo sysctl iogpu.wired_limit_mb=N`` (MiB, until restart; 0 = the default) sets it, and Metal then
reports exactly N (https://github.com/antirez/ds4/pull/893, https://github.com/AlexsJones/llmfit/pull/754).

So the GPU's capacity is: the sysctl when it is set; otherwise Metal's figure read through the
installed llama.cpp when it is a Metal build; otherwise the macOS 13-15 default share, which
understates macOS 26 (said in the note). Free is that less what the system cannot give up now
(the RAM available). The facts come from ``sysctl`` and ``system_profiler SPDisplaysDataType``
(JSON, or its text form) through a command runner that tests replace with recorded outputs.
Nothing here raises.
"""

from __future__ import annotations

import ctypes
import json
import logging
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

from app.core.common.units import GIB, MIB
from app.core.hardware.snapshots import BuildMemory, GpuSnapshot, GpuStatus

__all__ = ["AppleFacts", "AppleProbe", "default_working_set_bytes", "parse_displays", "parse_memory_line"]

_log = logging.getLogger(__name__)

CommandRunner = Callable[[Sequence[str]], "str | None"]

NOT_A_MAC = "No Apple GPU: this is not a Mac."
NO_APPLE_SILICON = "No Apple Silicon GPU: this Mac's graphics are not Apple's."
UNREADABLE = "This Mac's GPU could not be read: system_profiler and sysctl gave no answer."

# macOS 13-15: 2/3 of the memory at 32 GB and below, 3/4 above (every recorded value agrees; 36 GB is
# grouped with the smaller machines by https://www.thinkdifferent.blog/blog/the-macbook-pro-setting-that-doubles-your-ai-performance/).
SMALL_MAC_BYTES = 36 * GIB
# Left to macOS when the note suggests a higher wired limit.
RESERVE_SMALL_BYTES = 4 * GIB
RESERVE_LARGE_BYTES = 8 * GIB


def run_command(args: Sequence[str], timeout_s: float = 15.0) -> str | None:
    """A command's standard output, or None when it cannot run, fails or times out."""
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError) as error:
        _log.debug("%s failed: %r", args[0], error)
        return None
    return done.stdout if done.returncode == 0 else None


@dataclass(frozen=True)
class AppleFacts:
    """What does not change while FitScope runs: the chip, its GPU cores, the Metal version,
    the unified memory in bytes and the macOS version ("15.5")."""

    chip: str
    gpu_cores: int | None
    metal: str | None
    memory_bytes: int
    macos: str | None


def parse_displays(text: str) -> tuple[str | None, int | None, str | None]:
    """(chipset, GPU cores, Metal support) of the Apple GPU in ``system_profiler
    SPDisplaysDataType`` output, JSON (``-json``) or text ("Chipset Model: Apple M4", "Total Number
    of Cores: 8", "Metal Support: Metal 3"); Nones for what is missing."""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        for item in data.get("SPDisplaysDataType", []):
            model = str(item.get("sppci_model", ""))
            if model.startswith("Apple"):
                cores = str(item.get("sppci_cores", ""))
                metal = str(item.get("spdisplays_mtlgpufamilysupport", "")).replace("spdisplays_metal", "Metal ")
                return model, int(cores) if cores.isdigit() else None, metal.strip() or None
        return None, None, None
    # Text: the GPU's section starts at its "Chipset Model" line (a hardware overview above it has
    # its own "Total Number of Cores", the CPU's).
    start = text.find("Chipset Model:")
    if start < 0:
        return None, None, None
    section = text[start:]
    chip_line = re.match(r"Chipset Model:\s*(.+)", section)
    cores_line = re.search(r"Total Number of Cores:\s*(\d+)", section)
    metal_line = re.search(r"Metal Support:\s*(.+)", section)
    name = chip_line.group(1).strip() if chip_line else None
    if name is None or not name.startswith("Apple"):
        return None, None, None
    return (
        name,
        int(cores_line.group(1)) if cores_line else None,
        metal_line.group(1).strip() if metal_line else None,
    )


def parse_memory_line(text: str) -> int | None:
    """Bytes of "Memory: 48 GB" in ``system_profiler SPHardwareDataType`` text (Apple's GB are GiB)."""
    found = re.search(r"^\s*Memory:\s*(\d+)\s*(GB|TB)\b", text, re.MULTILINE)
    if not found:
        return None
    return int(found.group(1)) * (GIB if found.group(2) == "GB" else 1024 * GIB)


def default_working_set_bytes(memory_bytes: int) -> int:
    """macOS 13-15's default GPU working set: 2/3 of the memory up to 36 GiB, 3/4 above."""
    return memory_bytes * 2 // 3 if memory_bytes <= SMALL_MAC_BYTES else memory_bytes * 3 // 4


def metal_working_set() -> int | None:
    """``recommendedMaxWorkingSetSize`` as the installed llama.cpp's Metal device reports it
    (``ggml_backend_dev_memory``: its total), or None when llama.cpp has no Metal device here (not a
    Mac, an x86_64 build under Rosetta, a CPU-only build)."""
    try:
        import llama_cpp
        from llama_cpp._ggml import libggml as g
    except Exception:
        return None
    try:
        llama_cpp.llama_supports_gpu_offload()  # registers the backends
        pointer, size = ctypes.c_void_p, ctypes.c_size_t
        for name, restype, argtypes in (
            ("ggml_backend_dev_count", size, []),
            ("ggml_backend_dev_get", pointer, [size]),
            ("ggml_backend_dev_backend_reg", pointer, [pointer]),
            ("ggml_backend_reg_name", ctypes.c_char_p, [pointer]),
            ("ggml_backend_dev_memory", None, [pointer, ctypes.POINTER(size), ctypes.POINTER(size)]),
        ):
            fn = getattr(g, name)
            fn.restype, fn.argtypes = restype, argtypes
        for i in range(g.ggml_backend_dev_count()):
            dev = g.ggml_backend_dev_get(i)
            if g.ggml_backend_reg_name(g.ggml_backend_dev_backend_reg(dev)) == b"MTL":
                free, total = size(0), size(0)
                g.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
                return int(total.value) or None
    except Exception as error:
        _log.debug("Reading Metal's working set through llama.cpp failed: %r", error)
    return None


def _available_ram() -> int:
    return int(psutil.virtual_memory().available)


def _int(text: str | None) -> int | None:
    text = (text or "").strip()
    return int(text) if text.isdigit() else None


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def apple_snapshot(
    facts: AppleFacts,
    wired_limit_mb: int,
    metal_bytes: int | None,
    ram_available_bytes: int,
    timestamp: float,
    translated: bool = False,
) -> GpuSnapshot:
    """The Apple GPU as a snapshot: capacity the wired limit (see the module's docstring), free
    that less what the system cannot give up now, and a note saying where the limit comes from and
    how to raise it."""
    memory = facts.memory_bytes
    if wired_limit_mb > 0:
        limit = wired_limit_mb * MIB
        source = f"set with iogpu.wired_limit_mb={wired_limit_mb}"
    elif metal_bytes:
        limit = metal_bytes
        source = "macOS's default, as Metal reports it"
    else:
        limit = default_working_set_bytes(memory)
        share = "2/3" if memory <= SMALL_MAC_BYTES else "3/4"
        source = f"macOS 13-15's default, {share} of it; macOS 26 allows more, which llama.cpp's Metal build reports"
    limit = min(limit, memory)
    free = max(0, min(limit, ram_available_bytes))
    reserve = RESERVE_LARGE_BYTES if memory > 32 * GIB else RESERVE_SMALL_BYTES
    suggested_mb = max(0, (memory - reserve) // MIB)
    note = f"Unified memory {_gib(memory)}; the GPU may wire {_gib(limit)} ({source})."
    if suggested_mb * MIB > limit:
        note += (
            f" To give it more: sudo sysctl iogpu.wired_limit_mb={suggested_mb} "
            f"(leaves {_gib(reserve)} to macOS; until restart)."
        )
    if translated:
        note += " This Python runs under Rosetta (x86_64): a llama.cpp built for it finds no Metal GPU."
    return GpuSnapshot(
        index=0,
        name=facts.chip,
        memory_total_bytes=limit,
        memory_used_bytes=limit - free,
        memory_free_bytes=free,
        driver_version=facts.metal,
        vendor="apple",
        memory_kind="unified",
        shared_memory_bytes=memory,
        compute_units=facts.gpu_cores,
        builds=(BuildMemory(backend="metal", total_bytes=limit, free_bytes=free, note=source),),
        memory_note=note,
        timestamp=timestamp,
    )


class AppleProbe:
    """Reads this Mac's Apple GPU. ``run`` runs a command (``sysctl``, ``system_profiler``) and
    returns its output or None; ``metal`` returns Metal's working set or None; tests replace both
    with recorded values. The facts that cannot change are read once."""

    def __init__(
        self,
        run: CommandRunner = run_command,
        *,
        platform: str = sys.platform,
        metal: Callable[[], int | None] = metal_working_set,
        ram_available: Callable[[], int] = _available_ram,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._run = run
        self._platform = platform
        self._metal = metal
        self._ram_available = ram_available
        self._clock = clock
        self._lock = threading.Lock()
        self._facts: AppleFacts | None = None

    def _read_facts(self) -> AppleFacts | None:
        displays = self._run(["system_profiler", "-json", "SPDisplaysDataType"]) or ""
        chip, cores, metal = parse_displays(displays)
        if chip is None:
            displays = self._run(["system_profiler", "SPDisplaysDataType", "SPHardwareDataType"]) or ""
            chip, cores, metal = parse_displays(displays)
        if chip is None:
            # system_profiler can fail (a sandbox, a timeout); the CPU's brand names the same chip.
            brand = (self._run(["sysctl", "-n", "machdep.cpu.brand_string"]) or "").strip()
            chip = brand if brand.startswith("Apple") else None
        if chip is None:
            return None
        memory = _int(self._run(["sysctl", "-n", "hw.memsize"]))
        if memory is None:
            hardware = displays if "Memory:" in displays else self._run(["system_profiler", "SPHardwareDataType"])
            memory = parse_memory_line(hardware or "")
        if not memory:
            return None
        version = re.search(r"ProductVersion:\s*(\S+)", self._run(["sw_vers"]) or "")
        macos = version.group(1) if version else None
        return AppleFacts(chip=chip, gpu_cores=cores, metal=metal, memory_bytes=memory, macos=macos)

    def status(self) -> GpuStatus:
        """This Mac's GPU now, or ``available=False`` with a sentence. Never raises."""
        if self._platform != "darwin":
            return GpuStatus(available=False, message=NOT_A_MAC)
        try:
            with self._lock:
                if self._facts is None:
                    self._facts = self._read_facts()
                facts = self._facts
            if facts is None:
                intel_mac = "Chipset Model:" in (self._run(["system_profiler", "SPDisplaysDataType"]) or "")
                return GpuStatus(available=False, message=NO_APPLE_SILICON if intel_mac else UNREADABLE)
            limit_mb = _int(self._run(["sysctl", "-n", "iogpu.wired_limit_mb"])) or 0
            translated = (self._run(["sysctl", "-n", "sysctl.proc_translated"]) or "").strip() == "1"
            gpu = apple_snapshot(
                facts,
                limit_mb,
                None if limit_mb else self._metal(),
                self._ram_available(),
                self._clock(),
                translated,
            )
        except Exception as error:
            _log.exception("Reading the Apple GPU failed")
            return GpuStatus(available=False, message=f"Reading this Mac's GPU failed ({error}).")
        return GpuStatus(available=True, driver_version=facts.macos and f"macOS {facts.macos}", gpus=(gpu,))
