"""The Linux kernel's view of GPUs, read from sysfs: each DRM card (``/sys/class/drm/cardN``) with
its PCI vendor, device and revision, its driver, and the product name FitScope gives it. The AMD and
Intel detectors (``gpu_amd``, ``gpu_intel``) read their memory figures beside these.

Every reader takes the sysfs root as a parameter, so tests point it at a tree built from recorded
values; a file that is missing or unreadable is ``None``, never an error.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

from app.core.model.catalog import CATALOG_DIR

__all__ = ["DrmCard", "gpu_id_name", "list_cards", "read_int", "read_text"]

SYSFS_ROOT = Path("/sys")
LIBDRM_AMDGPU_IDS = Path("/usr/share/libdrm/amdgpu.ids")
GPU_IDS_PATH = CATALOG_DIR / "gpu_ids.json"

_CARD = re.compile(r"card\d+$")  # card0, not its connectors (card0-DP-1)


def read_text(path: Path) -> str | None:
    """The stripped contents of a sysfs file; None when it is missing, unreadable or empty."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    return text or None


def read_int(path: Path) -> int | None:
    """A non-negative integer sysfs file (decimal, or hex with 0x); None when absent or not a number."""
    text = read_text(path)
    if text is None:
        return None
    try:
        value = int(text, 0)
    except ValueError:
        return None
    return value if value >= 0 else None


@dataclass(frozen=True)
class DrmCard:
    """One DRM card: ``device`` is its PCI device folder (``cardN/device``); ids are lower-case hex
    without 0x ("1002", "744c", "c8")."""

    name: str
    device: Path
    vendor_id: str
    device_id: str
    revision: str | None
    driver: str | None
    pci_slot: str | None


def _hex(text: str | None) -> str | None:
    if not text:
        return None
    return text.lower().removeprefix("0x")


def _uevent(device: Path) -> dict[str, str]:
    text = read_text(device / "uevent") or ""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def list_cards(root: Path, vendor_id: str) -> list[DrmCard]:
    """The DRM cards of PCI vendor ``vendor_id`` ("1002" AMD, "8086" Intel) under ``root``
    (normally /sys), in card order. The driver comes from ``uevent`` (DRIVER=) or the ``driver`` link."""
    drm = root / "class" / "drm"
    try:
        names = sorted((p.name for p in drm.iterdir() if _CARD.match(p.name)), key=lambda n: int(n[4:]))
    except OSError:
        return []
    cards = []
    for name in names:
        device = drm / name / "device"
        uevent = _uevent(device)
        pci_id = uevent.get("PCI_ID", "")
        vendor = _hex(read_text(device / "vendor")) or _hex(pci_id.partition(":")[0])
        if vendor != vendor_id:
            continue
        device_id = _hex(read_text(device / "device")) or _hex(pci_id.partition(":")[2]) or ""
        driver = uevent.get("DRIVER")
        if driver is None:
            try:
                driver = (device / "driver").resolve(strict=True).name
            except OSError:
                driver = None
        cards.append(
            DrmCard(
                name=name,
                device=device,
                vendor_id=vendor,
                device_id=device_id,
                revision=_hex(read_text(device / "revision")),
                driver=driver,
                pci_slot=uevent.get("PCI_SLOT_NAME"),
            )
        )
    return cards


@functools.cache
def _builtin_ids() -> dict[str, dict[str, dict]]:
    try:
        raw = json.loads(GPU_IDS_PATH.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in raw.items() if isinstance(v, dict)}


@functools.cache
def _libdrm_names(path: Path) -> dict[tuple[str, str], str]:
    """libdrm's amdgpu.ids: "744C,\tC8,\tAMD Radeon RX 7900 XTX" -> {("744c", "c8"): name}."""
    names: dict[tuple[str, str], str] = {}
    text = read_text(path) or ""
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) == 3 and not line.startswith("#"):
            names[(parts[0].lower(), parts[1].lower())] = parts[2]
    return names


def gpu_id_name(card: DrmCard, amdgpu_ids: Path = LIBDRM_AMDGPU_IDS) -> tuple[str | None, bool]:
    """(product name, is an APU) for a card: libdrm's amdgpu.ids for an AMD device and revision
    when the system's copy knows it, else FitScope's table (pci.ids names; several models when one
    device ID covers them, "AMD Radeon RX 7900 XT/7900 XTX/7900 GRE"), else None."""
    entry = _builtin_ids().get(card.vendor_id, {}).get(card.device_id, {})
    apu = bool(entry.get("apu", False))
    builtin: str | None = entry.get("revisions", {}).get(card.revision or "") or entry.get("name")
    if card.vendor_id == "1002" and card.revision:
        name = _libdrm_names(amdgpu_ids).get((card.device_id, card.revision))
        if name:
            # Keep the chip's family beside libdrm's marketing name ("... (Strix Halo)"): it names
            # the speed constants of a unified-memory APU.
            family = re.search(r"\([^)]*\)$", builtin or "")
            if apu and family and family.group(0) not in name:
                name = f"{name} {family.group(0)}"
            return name, apu
    return builtin, apu
