"""Intel Arc GPUs on Linux through the xe and i915 drivers' files, and what llama.cpp's SYCL and
Vulkan builds will see of them.

Per card (``/sys/class/drm/cardN/device``, PCI vendor 0x8086):

- **Size.** xe: ``tileN/physical_vram_size_bytes`` (the VRAM fitted, kernel ``xe_tile_sysfs``);
  i915 builds that publish local memory: ``lmem_total_bytes`` (both as read by
  https://github.com/AlexsJones/llmfit/pull/733). The driver keeps a little of it ("usable size
  exclude stolen", ``xe_vram_probe``): 12216 of a B580's 12288 MiB.
- **Use.** xe publishes no VRAM use in sysfs; its TTM manager in debugfs does
  (``/sys/kernel/debug/dri/<PCI slot>/tile0/vram_mm``: ``size`` usable, ``usage`` in use), readable
  by root only (https://github.com/flightlessmango/MangoHud/issues/1936). i915's ``lmem_avail_bytes``
  where present. Otherwise the use is unknown and said so; the estimate then takes the card as idle.
- **llama.cpp.** The SYCL build sees Level Zero's global memory (``ggml_backend_sycl_device_get_memory``),
  a little under the physical size (an A770 16 GB reports 15474 MiB, llama.cpp#6036); Vulkan sees its
  device-local heap. Both are taken as the usable VRAM: no B580 figure of either was published.

Integrated Intel graphics (no memory of their own) are not offered as GPUs. Nothing here raises.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from app.adapters.drm_sysfs import SYSFS_ROOT, DrmCard, gpu_id_name, list_cards, read_int, read_text
from app.core.common.units import GIB
from app.core.hardware.snapshots import BuildMemory, GpuSnapshot, GpuStatus

__all__ = ["NO_INTEL_MESSAGE", "IntelProbe", "parse_vram_mm"]

_log = logging.getLogger(__name__)

NO_INTEL_MESSAGE = "No Intel Arc GPU: no card of the xe or i915 driver with its own memory under /sys/class/drm."
INTEGRATED_MESSAGE = "Intel integrated graphics (no memory of its own) are not used for estimates."


def parse_vram_mm(text: str) -> tuple[int | None, int | None]:
    """(usable bytes, bytes in use) from xe's debugfs ``vram_mm`` ("  size: 8522825728",
    "  usage: 32079872"); None for a figure that is missing."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition(":")
        if sep and key in ("size", "usage") and value.strip().isdigit():
            values.setdefault(key, int(value.strip()))
    return values.get("size"), values.get("usage")


def _tiles_vram(device: Path) -> int | None:
    sizes = []
    for tile in sorted(device.glob("tile*")):
        size = read_int(tile / "physical_vram_size_bytes")
        if size:
            sizes.append(size)
    return sum(sizes) if sizes else None


class IntelProbe:
    """Reads Intel Arc GPUs from sysfs (and debugfs where readable) under ``root`` (``/sys``;
    tests pass a tree built from recorded values)."""

    def __init__(self, root: Path = SYSFS_ROOT, *, clock: Callable[[], float] = time.time) -> None:
        self._root = root
        self._clock = clock

    def status(self) -> GpuStatus:
        """Every Intel GPU with memory of its own now, or ``available=False`` with a sentence.
        Never raises."""
        try:
            cards = list_cards(self._root, "8086")
            gpus = tuple(g for g in (self._snapshot(i, c) for i, c in enumerate(cards)) if g is not None)
        except Exception as error:
            _log.exception("Reading the Intel GPUs failed")
            return GpuStatus(available=False, message=f"Reading the Intel GPUs failed ({error}).")
        if not gpus:
            message = f"{NO_INTEL_MESSAGE} {INTEGRATED_MESSAGE}" if cards else NO_INTEL_MESSAGE
            return GpuStatus(available=False, message=message)
        return GpuStatus(available=True, driver_version=gpus[0].driver_version, gpus=gpus)

    def _snapshot(self, index: int, card: DrmCard) -> GpuSnapshot | None:
        device = card.device
        physical = (
            _tiles_vram(device) or read_int(device / "lmem_total_bytes") or read_int(device.parent / "lmem_total_bytes")
        )
        if not physical:
            return None  # integrated graphics: the system RAM, not a card
        usable, in_use = None, None
        if card.pci_slot:
            debug = read_text(self._root / "kernel" / "debug" / "dri" / card.pci_slot / "tile0" / "vram_mm")
            if debug:
                usable, in_use = parse_vram_mm(debug)
        if in_use is None:
            available = read_int(device / "lmem_avail_bytes") or read_int(device.parent / "lmem_avail_bytes")
            if available is not None:
                in_use = max(0, physical - available)
        total = usable or physical
        used = min(in_use or 0, total)
        free = total - used
        notes = []
        if usable:
            notes.append(f"{total / GIB:.2f} of the {physical / GIB:.0f} GiB fitted are usable (the driver keeps some)")
        if in_use is None:
            notes.append("memory in use unknown: the xe driver tells only root (debugfs), so the card is taken as idle")
        note = "; ".join(notes)
        name, _ = gpu_id_name(card)
        builds = (
            BuildMemory(backend="sycl", total_bytes=total, free_bytes=free, note="Level Zero's device memory"),
            BuildMemory(backend="vulkan", total_bytes=total, free_bytes=free, note="its device-local heap"),
        )
        return GpuSnapshot(
            index=index,
            name=name or f"Intel GPU 0x{card.device_id}",
            uuid=card.pci_slot,
            memory_total_bytes=total,
            memory_used_bytes=used,
            memory_free_bytes=free,
            driver_version=card.driver,
            vendor="intel",
            builds=builds,
            memory_note=f"{note[:1].upper()}{note[1:]}." if note else "",
            timestamp=self._clock(),
        )
