"""Recorded GPU-detection outputs (tests/data/hw, each file with its sources) turned into what the
detectors read: sysfs trees under a tmp_path for AMD and Intel, and a command runner answering
``sysctl`` / ``system_profiler`` with recorded text for Apple.

Only values a source published are written as recorded; a value a test needs that no source
published (memory in use, the RAM a system has available) is passed by the test, which says so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path

HW_DATA = Path(__file__).resolve().parents[1] / "data" / "hw"
MIB = 1024**2
GIB = 1024**3


@cache
def recorded(name: str) -> dict:
    """One recorded machine file, e.g. ``recorded("amd/rx7900xtx.json")``."""
    return json.loads((HW_DATA / name).read_text(encoding="utf-8"))


def output(name: str, label: str) -> str:
    """One recorded output's exact text."""
    return recorded(name)["outputs"][label]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n", encoding="utf-8")


def write_drm_card(
    root: Path, card: str, *, vendor: str, device: str, revision: str | None, driver: str, pci_slot: str
) -> Path:
    """``root/class/drm/<card>/device`` with its PCI ids and uevent, as the kernel lays them out;
    returns the device folder."""
    folder = root / "class" / "drm" / card / "device"
    _write(folder / "vendor", f"0x{vendor}")
    _write(folder / "device", f"0x{device}")
    if revision is not None:
        _write(folder / "revision", f"0x{revision}")
    _write(
        folder / "uevent",
        f"DRIVER={driver}\nPCI_ID={vendor.upper()}:{device.upper()}\nPCI_SLOT_NAME={pci_slot}",
    )
    (root / "class" / "drm" / f"{card}-DP-1").mkdir(parents=True, exist_ok=True)  # a connector, not a card
    return folder


def write_amd_memory(device: Path, *, vram_total: int, vram_used: int, gtt_total: int, gtt_used: int) -> None:
    """amdgpu's ``mem_info_*`` files (bytes)."""
    for name, value in (
        ("mem_info_vram_total", vram_total),
        ("mem_info_vram_used", vram_used),
        ("mem_info_gtt_total", gtt_total),
        ("mem_info_gtt_used", gtt_used),
    ):
        _write(device / name, str(value))


def write_kfd_node(
    root: Path,
    node: int,
    *,
    device_id: int,
    location_id: int,
    memory_bytes: int,
    simd_count: int,
    simd_per_cu: int = 2,
    cpu_cores: int = 0,
) -> None:
    """A GPU node of the KFD topology (``properties`` and one memory bank), in its "key value" lines;
    node 0 is the CPU node (no SIMDs), written too."""
    base = root / "class" / "kfd" / "kfd" / "topology" / "nodes"
    _write(base / "0" / "properties", "cpu_cores_count 16\nsimd_count 0\nvendor_id 0\ndevice_id 0")
    _write(
        base / str(node) / "properties",
        "\n".join(
            (
                f"cpu_cores_count {cpu_cores}",
                f"simd_count {simd_count}",
                "mem_banks_count 1",
                f"simd_per_cu {simd_per_cu}",
                "vendor_id 4098",
                f"device_id {device_id}",
                f"location_id {location_id}",
                "domain 0",
            )
        ),
    )
    _write(base / str(node) / "mem_banks" / "0" / "properties", f"heap_type 1\nsize_in_bytes {memory_bytes}\nflags 0")


def write_xe_vram(root: Path, device: Path, pci_slot: str, physical: int, vram_mm: str | None = None) -> None:
    """xe's ``tile0/physical_vram_size_bytes`` and, when given, its debugfs ``vram_mm`` text."""
    _write(device / "tile0" / "physical_vram_size_bytes", str(physical))
    if vram_mm is not None:
        _write(root / "kernel" / "debug" / "dri" / pci_slot / "tile0" / "vram_mm", vram_mm)


class RecordedCommands:
    """A command runner for AppleProbe: each command line (joined by spaces) answers its recorded
    output, anything else None (the command failed), as on a Mac where that output is unknown."""

    def __init__(self, outputs: dict[str, str]) -> None:
        self.outputs = dict(outputs)
        self.calls: list[str] = []

    def __call__(self, args: Sequence[str]) -> str | None:
        line = " ".join(args)
        self.calls.append(line)
        return self.outputs.get(line)
