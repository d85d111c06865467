"""Intel Arc detection (app.adapters.gpu_intel) on sysfs/debugfs trees built in tmp_path from
recorded values (tests/data/hw/intel, each with its source), and the real path on this machine.

What was not published, and how the tests stand in for it: no raw read of xe's
``tile0/physical_vram_size_bytes`` was found for any card; a B580's is the "Actual physical size
0x300000000" its xe driver printed at probe (the same figure, ``xe_vram_probe``). xe's debugfs
``vram_mm`` is recorded for an A750 only (MangoHud#1936); for the B580 the tests write the same layout
with the B580's "usable size exclude stolen 0x2fb800000" and a use of their own choosing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.recorded_hw import GIB, MIB, output, recorded, write_drm_card, write_xe_vram

from app.adapters.gpu_intel import INTEGRATED_MESSAGE, NO_INTEL_MESSAGE, IntelProbe, parse_vram_mm

B580 = recorded("intel/arc-b580-12gb.json")["derived"]
A750_VRAM_MM = output("intel/arc-a750-8gb-xe-debugfs.json", "/sys/kernel/debug/dri/0000:03:00.0/tile0/vram_mm (head)")


def arc_b580(root: Path, in_use: int | None = None) -> Path:
    """The B580 of canonical/intel-graphics-preview#14 (xe at 0000:01:00.0, device ID e20b)."""
    device = write_drm_card(
        root, "card0", vendor="8086", device="e20b", revision=None, driver="xe", pci_slot="0000:01:00.0"
    )
    vram_mm = None
    if in_use is not None:
        usable = B580["vram_usable_bytes_excluding_stolen"]
        vram_mm = f"  use_type: 1\n  use_tt: 0\n  size: {usable}\n  usage: {in_use}\ndefault_page_size: 4KiB"
    write_xe_vram(root, device, "0000:01:00.0", B580["vram_physical_bytes"], vram_mm)
    return device


def test_the_recorded_vram_mm_reads_as_usable_and_in_use():
    assert parse_vram_mm(A750_VRAM_MM) == (8522825728, 32079872)
    assert parse_vram_mm("nothing here") == (None, None)


def test_b580_without_root_shows_its_12_gib_and_says_its_use_is_unknown(tmp_path):
    arc_b580(tmp_path)
    status = IntelProbe(tmp_path).status()
    assert status.available
    (gpu,) = status.gpus
    assert (gpu.name, gpu.vendor, gpu.driver_version, gpu.uuid) == ("Intel Arc B580", "intel", "xe", "0000:01:00.0")
    assert gpu.memory_total_bytes == 12 * GIB and gpu.memory_free_bytes == 12 * GIB
    assert "memory in use unknown" in gpu.memory_note.lower() and "root" in gpu.memory_note
    assert {b.backend for b in gpu.builds} == {"sycl", "vulkan"}


def test_b580_as_root_shows_the_usable_vram_and_its_use(tmp_path):
    arc_b580(tmp_path, in_use=2 * GIB)
    (gpu,) = IntelProbe(tmp_path).status().gpus
    assert gpu.memory_total_bytes == 12216 * MIB  # usable size exclude stolen, 0x2fb800000
    assert gpu.memory_used_bytes == 2 * GIB and gpu.memory_free_bytes == 12216 * MIB - 2 * GIB
    assert gpu.memory_for("sycl").free_bytes == gpu.memory_free_bytes
    assert "11.93 of the 12 GiB fitted are usable" in gpu.memory_note


def test_a750_with_its_recorded_debugfs(tmp_path):
    """MangoHud#1936 (xe, 0000:03:00.0): size 8522825728, usage 32079872. The card's physical size
    was not published: the box's 8 GiB."""
    device = write_drm_card(
        tmp_path, "card1", vendor="8086", device="56a1", revision=None, driver="xe", pci_slot="0000:03:00.0"
    )
    write_xe_vram(tmp_path, device, "0000:03:00.0", 8 * GIB, A750_VRAM_MM)
    (gpu,) = IntelProbe(tmp_path).status().gpus
    assert gpu.name == "Intel Arc A750"
    assert (gpu.memory_total_bytes, gpu.memory_used_bytes) == (8128 * MIB, 32079872)


def test_integrated_graphics_are_not_offered_as_a_gpu(tmp_path):
    # Meteor Lake's Arc graphics (pci.ids 7d55): no memory of its own.
    write_drm_card(
        tmp_path, "card0", vendor="8086", device="7d55", revision="08", driver="i915", pci_slot="0000:00:02.0"
    )
    status = IntelProbe(tmp_path).status()
    assert not status.available and status.message == f"{NO_INTEL_MESSAGE} {INTEGRATED_MESSAGE}"


def test_the_real_sysfs_of_this_machine():
    status = IntelProbe().status()
    if status.available:
        pytest.skip("this machine has an Intel GPU")
    assert status.message.startswith(NO_INTEL_MESSAGE)


def test_the_live_figures_follow_the_driver(tmp_path):
    arc_b580(tmp_path, in_use=GIB)
    probe = IntelProbe(tmp_path)
    assert probe.status().gpus[0].memory_used_bytes == GIB
    arc_b580(tmp_path, in_use=5 * GIB)
    assert probe.status().gpus[0].memory_used_bytes == 5 * GIB
