"""AMD GPUs on Linux through the amdgpu driver's sysfs files, and what llama.cpp's ROCm and Vulkan
builds will each see of them.

Per card (``/sys/class/drm/cardN/device``, PCI vendor 0x1002): ``mem_info_vram_total`` / ``_used``
(a card's VRAM, or only the BIOS carve-out of an APU) and ``mem_info_gtt_total`` / ``_used`` (the
system memory the GPU may map). What each llama.cpp build sees:

- **ROCm.** HIP builds ggml-cuda, whose ``ggml_backend_cuda_device_get_memory`` asks
  ``hipMemGetInfo`` (its /proc/meminfo path for integrated GPUs is compiled out for HIP). HIP reports
  the memory KFD gives the GPU: the memory banks of its node in the KFD topology
  (``/sys/class/kfd/kfd/topology/nodes/N/mem_banks/*/properties``, ``size_in_bytes``), "the same
  value HIP reports as the device total" (https://github.com/ROCm/rocm-systems/pull/8475). On a card
  that is its VRAM. On an APU it is the carve-out on older kernels (6368 MiB free of a 6 GB
  carve-out, https://github.com/ggml-org/llama.cpp/issues/19818) and the kernel's TTM limit on those
  with "drm/amdkfd: Let VRAM allocations go to GTT domain on small APUs" (98304 MiB with a 4 GiB
  carve-out and ``ttm.pages_limit=25165824``, https://github.com/noamsto/nix-amd-ai/issues/42).
- **Vulkan.** ``ggml_backend_vk_get_device_memory`` counts a card's device-local heaps (its VRAM)
  but every heap of an integrated GPU: carve-out and GTT together (53281 MiB free against ROCm's
  6368 on the same APU, llama.cpp#19818).

Free memory, not capacity: a build may allocate its total less what is in use (VRAM, and GTT on an
APU), and on an APU no more than the carve-out left plus the RAM the system has available. The
amdgpu counters see every client (the desktop's too), but on Strix Halo ``mem_info_gtt_used`` does
not count ``hipMalloc`` (https://github.com/ROCm/legacy-rocm-build/issues/5444), so another ROCm
program's memory may be missed. Nothing here raises.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from app.adapters.drm_sysfs import LIBDRM_AMDGPU_IDS, SYSFS_ROOT, DrmCard, gpu_id_name, list_cards, read_int, read_text
from app.core.common.units import GIB
from app.core.hardware.snapshots import BuildMemory, GpuSnapshot, GpuStatus

__all__ = ["AmdProbe", "NO_AMD_MESSAGE"]

_log = logging.getLogger(__name__)

NO_AMD_MESSAGE = "No AMD GPU: no card of the amdgpu driver under /sys/class/drm."
TTM_PAGE_BYTES = 4096  # ttm.pages_limit counts 4 KiB pages
SYSTEM_RESERVE_BYTES = 8 * 1024**3  # left to the system when the note suggests a larger GTT


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def _system_memory() -> tuple[int, int]:
    memory = psutil.virtual_memory()
    return int(memory.total), int(memory.available)


@dataclass(frozen=True)
class KfdNode:
    """A GPU node of the KFD topology: its memory banks' size in bytes and its compute units."""

    device_id: int
    location_id: int | None
    domain: int
    memory_bytes: int
    compute_units: int | None
    cpu_cores: int


def _properties(path: Path) -> dict[str, int]:
    values: dict[str, int] = {}
    for line in (read_text(path) or "").splitlines():
        key, _, value = line.partition(" ")
        try:
            values[key] = int(value.strip())
        except ValueError:
            continue
    return values


def kfd_nodes(root: Path) -> list[KfdNode]:
    """The GPU nodes of the KFD topology under ``root`` (CPU nodes have no SIMDs), in node order."""
    base = root / "class" / "kfd" / "kfd" / "topology" / "nodes"
    try:
        folders = sorted((p for p in base.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    except OSError:
        return []
    nodes = []
    for folder in folders:
        props = _properties(folder / "properties")
        if not props.get("simd_count"):
            continue
        banks = 0
        try:
            bank_dirs = list((folder / "mem_banks").iterdir())
        except OSError:
            bank_dirs = []
        for bank in bank_dirs:
            banks += _properties(bank / "properties").get("size_in_bytes", 0)
        per_cu = props.get("simd_per_cu") or 0
        nodes.append(
            KfdNode(
                device_id=props.get("device_id", 0),
                location_id=props.get("location_id"),
                domain=props.get("domain", 0),
                memory_bytes=banks,
                compute_units=props["simd_count"] // per_cu if per_cu else None,
                cpu_cores=props.get("cpu_cores_count", 0),
            )
        )
    return nodes


def _location(pci_slot: str | None) -> tuple[int, int] | None:
    """(domain, KFD location_id) of a PCI slot "0000:c5:00.0": bus << 8 | device << 3 | function."""
    if not pci_slot:
        return None
    try:
        domain, bus, rest = pci_slot.split(":")
        device, function = rest.split(".")
        return int(domain, 16), int(bus, 16) << 8 | int(device, 16) << 3 | int(function, 16)
    except ValueError:
        return None


def _node_for(card: DrmCard, nodes: list[KfdNode]) -> KfdNode | None:
    location = _location(card.pci_slot)
    if location is not None:
        for node in nodes:
            if (node.domain, node.location_id) == location:
                return node
    same = [n for n in nodes if n.device_id == int(card.device_id or "0", 16)]
    return same[0] if len(same) == 1 else None


class AmdProbe:
    """Reads AMD GPUs from sysfs under ``root`` (``/sys``; tests pass a tree built from recorded
    values). ``system_memory`` returns (total, available) bytes of the system RAM (psutil's by
    default): an APU's GPU memory comes out of it."""

    def __init__(
        self,
        root: Path = SYSFS_ROOT,
        *,
        amdgpu_ids: Path = LIBDRM_AMDGPU_IDS,
        system_memory: Callable[[], tuple[int, int]] = _system_memory,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._root = root
        self._amdgpu_ids = amdgpu_ids
        self._system_memory = system_memory
        self._clock = clock

    def status(self) -> GpuStatus:
        """Every AMD GPU now, or ``available=False`` with NO_AMD_MESSAGE. Never raises."""
        try:
            cards = list_cards(self._root, "1002")
            nodes = kfd_nodes(self._root) if cards else []
            gpus = tuple(g for g in (self._snapshot(i, c, nodes) for i, c in enumerate(cards)) if g is not None)
        except Exception as error:
            _log.exception("Reading the AMD GPUs failed")
            return GpuStatus(available=False, message=f"Reading the AMD GPUs failed ({error}).")
        if not gpus:
            return GpuStatus(available=False, message=NO_AMD_MESSAGE)
        return GpuStatus(available=True, driver_version=gpus[0].driver_version, gpus=gpus)

    def _snapshot(self, index: int, card: DrmCard, nodes: list[KfdNode]) -> GpuSnapshot | None:
        device = card.device
        vram_total = read_int(device / "mem_info_vram_total")
        if vram_total is None:  # not amdgpu (radeon), or a driver too old to say
            return None
        vram_used = min(read_int(device / "mem_info_vram_used") or 0, vram_total)
        gtt_total = read_int(device / "mem_info_gtt_total")
        gtt_used = read_int(device / "mem_info_gtt_used") or 0
        name, apu = gpu_id_name(card, self._amdgpu_ids)
        node = _node_for(card, nodes)
        apu = apu or (node is not None and node.cpu_cores > 0)
        common: dict[str, Any] = {
            "index": index,
            "name": name or f"AMD GPU 0x{card.device_id}",
            "uuid": card.pci_slot,
            "driver_version": card.driver,
            "vendor": "amd",
            "compute_units": node.compute_units if node else None,
            "timestamp": self._clock(),
        }
        if not apu:
            free = vram_total - vram_used
            same = "the card's VRAM, as ROCm's KFD reports it" if node else "the card's VRAM"
            builds = (
                BuildMemory(backend="rocm", total_bytes=vram_total, free_bytes=free, note=same),
                BuildMemory(backend="vulkan", total_bytes=vram_total, free_bytes=free, note="its device-local heap"),
            )
            return GpuSnapshot(
                **common,
                memory_total_bytes=vram_total,
                memory_used_bytes=vram_used,
                memory_free_bytes=free,
                builds=builds,
            )
        return self._apu_snapshot(common, vram_total, vram_used, gtt_total or 0, gtt_used, node)

    def _apu_snapshot(
        self, common: dict[str, Any], carveout: int, carveout_used: int, gtt: int, gtt_used: int, node: KfdNode | None
    ) -> GpuSnapshot:
        ram_total, ram_available = self._system_memory()
        # What the GPU may still take: the carve-out left, plus the RAM the system can give up now.
        headroom = carveout - carveout_used + ram_available
        used = carveout_used + gtt_used
        if node is None:
            rocm_total, why = carveout, "KFD unreadable: the carve-out, as older kernels give ROCm"
        elif node.memory_bytes > carveout:
            rocm_total, why = node.memory_bytes, "the system memory KFD lets it map"
        else:
            rocm_total, why = node.memory_bytes or carveout, "the carve-out only: this kernel gives ROCm no GTT"
        if rocm_total > carveout:
            rocm_free = min(max(0, rocm_total - used), headroom)
        else:
            rocm_free = max(0, rocm_total - carveout_used)
        vulkan_total = carveout + gtt
        vulkan_free = min(max(0, vulkan_total - used), headroom)
        builds = (
            BuildMemory(backend="rocm", total_bytes=rocm_total, free_bytes=rocm_free, note=why),
            BuildMemory(backend="vulkan", total_bytes=vulkan_total, free_bytes=vulkan_free, note="carve-out + GTT"),
        )
        # The OS sees the RAM outside the carve-out; the box holds both.
        shared = ram_total + carveout
        note = (
            f"Shares the {_gib(shared)} of system memory: BIOS carve-out {_gib(carveout)} + GTT {_gib(gtt)}. "
            f"llama.cpp's ROCm build sees {_gib(rocm_total)} ({why}), its Vulkan build {_gib(vulkan_total)} "
            "(carve-out + GTT); choose the build under Advanced."
        )
        wanted = shared - SYSTEM_RESERVE_BYTES  # a larger GTT, leaving the system its share
        if wanted > max(gtt, rocm_total):
            note += (
                f" To give the GPU more: the kernel parameter ttm.pages_limit={wanted // TTM_PAGE_BYTES} "
                f"({_gib(wanted)} of GTT in 4 KiB pages, leaving {_gib(SYSTEM_RESERVE_BYTES)}), then restart."
            )
        return GpuSnapshot(
            **common,
            memory_total_bytes=rocm_total,
            memory_used_bytes=rocm_total - rocm_free,
            memory_free_bytes=rocm_free,
            memory_kind="unified",
            shared_memory_bytes=shared,
            carveout_bytes=carveout,
            gtt_bytes=gtt,
            builds=builds,
            memory_note=note,
        )
