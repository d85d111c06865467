"""What else the machine was doing while a model generated: the share of its CPUs other programs
used (everything busy, less the llama.cpp child and FitScope itself; time the hypervisor gave to
other guests counts as busy), and a temperature sensor at or above its high mark. A run measured
under such conditions does not calibrate this machine's estimates
(:func:`app.core.report.run_vs_estimate.disturbance`).

psutil reads /proc (Linux), the Mach and sysctl interfaces (macOS) and the performance counters
(Windows); a figure it cannot read is None, never an error.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import psutil

_IDLE_FIELDS = ("idle", "iowait")


def _busy_seconds() -> float:
    times = psutil.cpu_times()
    return sum(v for k, v in times._asdict().items() if k not in _IDLE_FIELDS and k not in ("guest", "guest_nice"))


def _process_seconds(process: psutil.Process) -> float:
    t = process.cpu_times()
    return t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)


@dataclass
class _Mark:
    wall_s: float
    busy_s: float
    child_s: float
    own_s: float


class CpuWatch:
    """Marks the start of generation in the llama.cpp child ``pid`` and, at its end, the share of
    the machine's CPUs other programs used in between."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._start: _Mark | None = None
        self.others_share: float | None = None

    def _mark(self) -> _Mark | None:
        try:
            return _Mark(
                time.monotonic(),
                _busy_seconds(),
                _process_seconds(psutil.Process(self._pid)),
                _process_seconds(psutil.Process()),
            )
        except (psutil.Error, OSError, AttributeError):
            return None

    def start(self) -> None:
        self._start = self._mark()

    def stop(self) -> float | None:
        """The share (0-1) of all logical CPUs others used since :meth:`start` (None: unknown)."""
        end = self._mark()
        start = self._start
        if start is None or end is None:
            return self.others_share
        wall = end.wall_s - start.wall_s
        cpus = psutil.cpu_count() or 1
        if wall <= 0.05:
            return self.others_share  # too short to tell
        others = (end.busy_s - start.busy_s) - (end.child_s - start.child_s) - (end.own_s - start.own_s)
        self.others_share = min(1.0, max(0.0, others / (wall * cpus)))
        return self.others_share


def hot_sensor() -> str | None:
    """The first temperature sensor at or above its high mark ("coretemp Package id 0 at 97 °C, its
    high mark 95 °C"), or None (none is, or none can be read here)."""
    with contextlib.suppress(AttributeError, OSError, RuntimeError):
        for chip, readings in psutil.sensors_temperatures().items():
            for r in readings:
                if r.high and r.current >= r.high:
                    name = f"{chip} {r.label}".strip()
                    return f"{name} at {r.current:.0f} °C, its high mark {r.high:.0f} °C"
    return None
