"""How many threads llama.cpp's own tools use on this machine.

A port of ``common_cpu_get_num_math()`` (vendored llama.cpp, ``common/common.cpp``), which
llama-server and llama-bench use when no ``--threads`` is given:

- Linux: the number of distinct ``thread_siblings`` sets under ``/sys/devices/system/cpu`` (one per
  physical core); on hybrid Intel CPUs only the performance cores count (llama.cpp pins a thread to
  each CPU and skips those whose CPUID core type is Atom; the kernel lists the same split in
  ``/sys/devices/cpu_core/cpus``);
- macOS: ``hw.perflevel0.physicalcpu`` (the performance cores), else ``hw.physicalcpu``;
- elsewhere: the physical cores (psutil), or llama.cpp's fallback of all logical CPUs up to 4 and
  half of them above.

Like llama.cpp, this ignores CPU affinity and cgroup limits.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

_S = TypeVar("_S", bound=BaseModel)

_SYS_CPU = Path("/sys/devices/system/cpu")
_HYBRID_PERFORMANCE_CPUS = Path("/sys/devices/cpu_core/cpus")


def _cpu_list(text: str) -> set[int]:
    """Parses a kernel CPU list such as '0-7,16,18-19'."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _linux_physical_cores(sys_cpu: Path, only: set[int] | None) -> int | None:
    siblings: set[str] = set()
    for topology in sys_cpu.glob("cpu[0-9]*/topology/thread_siblings"):
        cpu = int(topology.parent.parent.name[3:])
        if only is not None and cpu not in only:
            continue
        with contextlib.suppress(OSError):
            siblings.add(topology.read_text().strip())
    return len(siblings) or None


def linux_math_threads(sys_cpu: Path = _SYS_CPU, hybrid_cpus: Path = _HYBRID_PERFORMANCE_CPUS) -> int | None:
    """llama.cpp's thread count from Linux's sysfs, or None when sysfs says nothing."""
    performance: set[int] | None = None
    with contextlib.suppress(OSError, ValueError):
        performance = _cpu_list(hybrid_cpus.read_text()) or None
    return _linux_physical_cores(sys_cpu, performance) or _linux_physical_cores(sys_cpu, None)


def _macos_math_threads() -> int | None:
    for key in ("hw.perflevel0.physicalcpu", "hw.physicalcpu"):
        with contextlib.suppress(OSError, ValueError, subprocess.SubprocessError):
            out = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=2, check=True)
            return int(out.stdout.strip())
    return None


def _fallback_threads() -> int:
    logical = os.cpu_count() or 0
    if logical <= 0:
        return 4
    return logical if logical <= 4 else logical // 2


@functools.cache
def llama_math_threads() -> int:
    """The thread count llama-server and llama-bench use here by default (at least 1)."""
    found: int | None = None
    if sys.platform.startswith("linux"):
        found = linux_math_threads()
    elif sys.platform == "darwin":
        found = _macos_math_threads()
    if not found:
        with contextlib.suppress(Exception):
            import psutil

            found = psutil.cpu_count(logical=False)
    return max(1, found or _fallback_threads())


def logical_cpus() -> int:
    return os.cpu_count() or 1


def with_llama_threads(settings: _S) -> _S:
    """``settings`` (any pydantic record with an ``n_threads`` field) with ``n_threads`` set to
    llama-server's count when the user left it unset; unchanged otherwise."""
    if getattr(settings, "n_threads", 0) is not None:
        return settings
    return settings.model_copy(update={"n_threads": llama_math_threads()})
