"""AMD detection (app.adapters.gpu_amd) on sysfs trees built in tmp_path from recorded values of
real machines (tests/data/hw/amd, each with its source), and the real path on this machine.

What was not published, and how the tests stand in for it: no raw read of ``mem_info_*`` for an RX
7900 XTX was found: its VRAM is LACT's "VRAM Size: 24560 MiB" (LACT reads the amdgpu driver), its
use the 149 MiB llama.cpp's "24411 MiB free" line implies (a Windows host). KFD topology files were
not published for any of these machines: a card's memory bank is its VRAM, an APU's is the total HIP
printed on the same machine (ROCm/rocm-systems#8475 shows the two are equal). The memory in use of the
Strix Halo boxes and the RAM a system has available were not published: the tests pass their own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.recorded_hw import GIB, MIB, recorded, write_amd_memory, write_drm_card, write_kfd_node

from app.adapters.drm_sysfs import LIBDRM_AMDGPU_IDS
from app.adapters.gpu_amd import NO_AMD_MESSAGE, AmdProbe

NO_IDS = Path("/nonexistent/amdgpu.ids")  # FitScope's own table only


def rx_7900_xtx(root: Path, used_bytes: int = 149 * MIB) -> Path:
    """An RX 7900 XTX as LACT (0x1002:0x744C:0xC8, 24560 MiB, 96 CUs) and rocminfo (BDFID 2304 =
    PCI 09:00.0, 96 CUs x 2 SIMDs) recorded it."""
    device = write_drm_card(
        root, "card1", vendor="1002", device="744c", revision="c8", driver="amdgpu", pci_slot="0000:09:00.0"
    )
    vram = recorded("amd/rx7900xtx.json")["derived"]["vram_bytes"]
    write_amd_memory(device, vram_total=vram, vram_used=used_bytes, gtt_total=16 * GIB, gtt_used=20 * MIB)
    write_kfd_node(root, 1, device_id=0x744C, location_id=2304, memory_bytes=vram, simd_count=192)
    return device


def strix_halo_z13(root: Path) -> Path:
    """The ROG Flow Z13 of noamsto/nix-amd-ai#42 (kernel 7.1): mem_info_vram_total 4294967296,
    mem_info_gtt_total 103079215104 (ttm.pages_limit=25165824), HIP "Total VRAM: 98304 MiB".
    In use (not published): 256 MiB of the carve-out and 1 GiB of GTT."""
    data = recorded("amd/strix-halo-128gb-gtt96-ttm.json")["derived"]
    device = write_drm_card(
        root, "card1", vendor="1002", device="1586", revision="c1", driver="amdgpu", pci_slot="0000:c5:00.0"
    )
    write_amd_memory(
        device, vram_total=data["vram_bytes"], vram_used=256 * MIB, gtt_total=data["gtt_bytes"], gtt_used=GIB
    )
    write_kfd_node(
        root, 1, device_id=0x1586, location_id=0xC500, memory_bytes=data["hip_total_vram_mib"] * MIB, simd_count=80
    )
    return device


def test_rx_7900_xtx_is_named_by_its_revision_and_both_builds_see_its_vram(tmp_path):
    rx_7900_xtx(tmp_path)
    status = AmdProbe(tmp_path, amdgpu_ids=NO_IDS, system_memory=lambda: (64 * GIB, 50 * GIB)).status()
    assert status.available
    (gpu,) = status.gpus
    assert (gpu.name, gpu.vendor, gpu.compute_units, gpu.driver_version) == (
        "AMD Radeon RX 7900 XTX",
        "amd",
        96,
        "amdgpu",
    )
    assert gpu.memory_kind == "dedicated" and gpu.uuid == "0000:09:00.0"
    assert gpu.memory_total_bytes == 24560 * MIB
    # 24411 MiB free, as llama.cpp's ROCm build printed for this card.
    assert gpu.memory_free_bytes == 24411 * MIB and gpu.memory_used_bytes == 149 * MIB
    assert {b.backend: b.total_bytes for b in gpu.builds} == {"rocm": 24560 * MIB, "vulkan": 24560 * MIB}
    assert gpu.taken_from_ram_bytes("rocm") == 0 and gpu.memory_note == ""


def test_rx_7900_xt_from_rocm_smis_figures(tmp_path):
    """marimo#9237: rocm-smi (which reads mem_info_vram_*) printed VRAM Total 21458059264, Used
    27856896, Device Rev 0xcc, Card Model 0x744c."""
    data = recorded("amd/rx7900xt.json")["derived"]
    device = write_drm_card(
        tmp_path, "card0", vendor="1002", device="744c", revision="cc", driver="amdgpu", pci_slot="0000:03:00.0"
    )
    write_amd_memory(
        device, vram_total=data["vram_bytes"], vram_used=data["vram_used_bytes"], gtt_total=8 * GIB, gtt_used=0
    )
    (gpu,) = AmdProbe(tmp_path, amdgpu_ids=NO_IDS).status().gpus
    assert gpu.name == "AMD Radeon RX 7900 XT"
    assert gpu.memory_free_bytes == 21458059264 - 27856896
    assert gpu.compute_units is None  # no KFD node: nothing to count them from


def test_the_systems_libdrm_names_come_first(tmp_path):
    """The real /usr/share/libdrm/amdgpu.ids of this machine names 73BF revision C1."""
    if "73BF,\tC1," not in (LIBDRM_AMDGPU_IDS.read_text() if LIBDRM_AMDGPU_IDS.exists() else ""):
        pytest.skip("this machine's libdrm has no amdgpu.ids naming 73BF C1")
    device = write_drm_card(
        tmp_path, "card0", vendor="1002", device="73bf", revision="c1", driver="amdgpu", pci_slot="0000:03:00.0"
    )
    write_amd_memory(device, vram_total=16 * GIB, vram_used=0, gtt_total=8 * GIB, gtt_used=0)
    assert AmdProbe(tmp_path).status().gpus[0].name == "AMD Radeon RX 6800 XT"


def test_strix_halo_shows_carveout_gtt_and_what_rocm_and_vulkan_each_see(tmp_path):
    strix_halo_z13(tmp_path)
    # The OS sees the 128 GiB less the 4 GiB carve-out; 110 GiB of it available now (chosen).
    probe = AmdProbe(tmp_path, amdgpu_ids=NO_IDS, system_memory=lambda: (124 * GIB, 110 * GIB))
    (gpu,) = probe.status().gpus
    assert gpu.name == "AMD Radeon 8050S/8060S Graphics (Strix Halo)"
    assert gpu.memory_kind == "unified" and gpu.compute_units == 40  # rocminfo: Compute Unit 40
    assert (gpu.carveout_bytes, gpu.gtt_bytes, gpu.shared_memory_bytes) == (4 * GIB, 96 * GIB, 128 * GIB)
    rocm, vulkan = gpu.memory_for("rocm"), gpu.memory_for("vulkan")
    assert rocm.total_bytes == 96 * GIB  # KFD's, = HIP's 98304 MiB
    assert vulkan.total_bytes == 100 * GIB  # carve-out + GTT
    in_use = 256 * MIB + GIB
    assert rocm.free_bytes == 96 * GIB - in_use and vulkan.free_bytes == 100 * GIB - in_use
    # The default build is ROCm: the bar and the record's totals are its view.
    assert (gpu.memory_total_bytes, gpu.memory_free_bytes) == (rocm.total_bytes, rocm.free_bytes)
    # What each takes out of the system RAM (beyond the carve-out).
    assert gpu.taken_from_ram_bytes("rocm") == 92 * GIB and gpu.taken_from_ram_bytes("vulkan") == 96 * GIB
    for words in (
        "BIOS carve-out 4.0 GiB + GTT 96.0 GiB",
        "ROCm build sees 96.0 GiB",
        "Vulkan build 100.0 GiB",
        "ttm.pages_limit=31457280",  # 120 GiB of GTT in 4 KiB pages, leaving the system 8 GiB
    ):
        assert words in gpu.memory_note


def test_strix_halo_free_memory_is_capped_by_what_the_system_can_give(tmp_path):
    strix_halo_z13(tmp_path)
    probe = AmdProbe(tmp_path, amdgpu_ids=NO_IDS, system_memory=lambda: (124 * GIB, 20 * GIB))
    (gpu,) = probe.status().gpus
    # The carve-out left (4 GiB - 256 MiB) plus the 20 GiB the system has available.
    assert gpu.memory_for("vulkan").free_bytes == 4 * GIB - 256 * MIB + 20 * GIB
    assert gpu.memory_for("rocm").free_bytes == 4 * GIB - 256 * MIB + 20 * GIB


def test_beelink_strix_halo_rocm_sees_the_default_ttm_limit(tmp_path):
    """ROCm/legacy-rocm-build#6004 (Linux 7.0, 512 MB carve-out, amdgpu.gttsize=131072): sysfs
    VRAM 536870912 and GTT 137438953472, HIP total 62.47 GiB (half the 124.92 GiB the OS sees, the
    TTM default). Carve-out use: rocm-smi's 368111616 of another 512 MB Strix Halo
    (lemonade-sdk/llamacpp-rocm#9)."""
    beelink = recorded("amd/strix-halo-128gb-beelink-gtr9-pro.json")["derived"]
    device = write_drm_card(
        tmp_path, "card0", vendor="1002", device="1586", revision=None, driver="amdgpu", pci_slot="0000:c5:00.0"
    )
    used = recorded("amd/strix-halo-rocm-smi-512mb.json")["derived"]["vram_used_bytes"]
    write_amd_memory(
        device, vram_total=beelink["vram_bytes"], vram_used=used, gtt_total=beelink["gtt_bytes"], gtt_used=0
    )
    hip_total = int(beelink["hip_total_memory_gib"] * GIB)
    write_kfd_node(tmp_path, 1, device_id=0x1586, location_id=0xC500, memory_bytes=hip_total, simd_count=80)
    host_ram = int(beelink["host_ram_visible_gib"] * GIB)
    (gpu,) = AmdProbe(tmp_path, amdgpu_ids=NO_IDS, system_memory=lambda: (host_ram, 100 * GIB)).status().gpus
    assert gpu.memory_for("rocm").total_bytes == hip_total
    vulkan = gpu.memory_for("vulkan")
    assert vulkan.total_bytes == 128 * GIB + 512 * MIB
    # More than the box has: what is free is bounded by the system's available RAM.
    assert vulkan.free_bytes == 512 * MIB - used + 100 * GIB


def test_strix_point_on_an_older_kernel_gives_rocm_only_the_carveout(tmp_path):
    """llama.cpp#19818 (Ryzen AI 9 HX 370, 96 GB, 6 GB BIOS carve-out, Debian 13): ROCm saw 6368
    MiB free (the carve-out only), Vulkan 53281 MiB (carve-out + GTT; ttm.pages_limit=14680064 =
    56 GiB). KFD's bank is taken as the carve-out, which is what that ROCm saw."""
    data = recorded("amd/strix-point-hx370-96gb.json")["derived"]
    device = write_drm_card(
        tmp_path, "card0", vendor="1002", device="150e", revision=None, driver="amdgpu", pci_slot="0000:c4:00.0"
    )
    carve = data["vram_bytes_bios"]
    write_amd_memory(device, vram_total=carve, vram_used=0, gtt_total=data["ttm_pages_limit_bytes"], gtt_used=0)
    write_kfd_node(tmp_path, 1, device_id=0x150E, location_id=0xC400, memory_bytes=carve, simd_count=32)
    ram = data["total_memory_bytes"] - carve
    (gpu,) = AmdProbe(tmp_path, amdgpu_ids=NO_IDS, system_memory=lambda: (ram, 80 * GIB)).status().gpus
    assert gpu.name == "AMD Radeon 880M/890M Graphics (Strix Point)"
    assert gpu.memory_for("rocm").total_bytes == 6 * GIB
    assert gpu.memory_for("rocm").note == "the carve-out only: this kernel gives ROCm no GTT"
    assert gpu.memory_for("vulkan").total_bytes == 62 * GIB
    # llama.cpp's Vulkan printed 53281 MiB free: more than ROCm's carve-out, less than carve-out + GTT.
    assert 6 * GIB < 53281 * MIB < gpu.memory_for("vulkan").total_bytes
    assert gpu.taken_from_ram_bytes("rocm") == 0


def test_no_amd_card_and_cards_without_amdgpu_memory_say_so(tmp_path):
    assert AmdProbe(tmp_path).status().message == NO_AMD_MESSAGE
    write_drm_card(
        tmp_path, "card0", vendor="1002", device="6798", revision="00", driver="radeon", pci_slot="0000:01:00.0"
    )
    write_drm_card(
        tmp_path, "card1", vendor="10de", device="2684", revision="a1", driver="nvidia", pci_slot="0000:02:00.0"
    )
    status = AmdProbe(tmp_path).status()
    assert not status.available and status.message == NO_AMD_MESSAGE


def test_the_real_sysfs_of_this_machine():
    status = AmdProbe().status()
    if status.available:
        pytest.skip("this machine has an AMD GPU")
    assert status.message == NO_AMD_MESSAGE


def test_the_live_figures_follow_the_driver(tmp_path):
    device = rx_7900_xtx(tmp_path)
    probe = AmdProbe(tmp_path, amdgpu_ids=NO_IDS)
    assert probe.status().gpus[0].memory_used_bytes == 149 * MIB
    (device / "mem_info_vram_used").write_text(str(8 * GIB))
    assert probe.status().gpus[0].memory_free_bytes == 24560 * MIB - 8 * GIB
