"""The window on a Mac, a Radeon, a Strix Halo and an Arc B580, offscreen: the hardware box's words,
the live memory bar (refreshed by the same poll as NVIDIA's) and the verdict's device and memory.

The machines are built from recorded outputs (tests/data/hw, see test_gpu_apple / test_gpu_amd /
test_gpu_intel for what each value is and what was not published); the real detectors read them
through their seams (a command runner, a sysfs root). The host each machine would report is given
to the window, as this Linux machine's own RAM is not theirs.
"""

from __future__ import annotations

import pytest
from support.recorded_hw import GIB, MIB, RecordedCommands
from test_gpu_amd import NO_IDS, rx_7900_xtx, strix_halo_z13
from test_gpu_apple import M4_MAX_TEXT
from test_gpu_intel import arc_b580
from test_gpus import host, no_nvidia
from test_window import make_services, open_window, settle

from app.adapters.gpu_amd import AmdProbe
from app.adapters.gpu_apple import AppleProbe
from app.adapters.gpu_intel import IntelProbe
from app.core.report.machine_text import gpu_label

pytestmark = pytest.mark.usefixtures("demo_gguf")


def window_with(qtbot, tmp_path, probe, here):
    services = make_services(tmp_path, probes=[no_nvidia(), probe])
    services.detect_host = lambda measure: here
    return open_window(qtbot, services)


def assert_build_hint(qtbot, window, words: str, switch: str) -> None:
    """The Run tab names the llama.cpp build this GPU needs when the installed one is CPU-only (as
    here, unless this machine's llama-cpp-python offloads to a GPU)."""
    import llama_cpp

    from app.adapters.rpc_backend import offloads_to_local_gpu

    qtbot.waitUntil(lambda: window.run_panel.gpu_offload_supported is not None, timeout=20000)
    if offloads_to_local_gpu(llama_cpp):
        return
    assert words in window.run_panel.form.gpu_note.text()
    assert switch in window.run_panel.form.gpu_command.text()


def test_m4_max_48gb_shows_its_wired_limit_and_follows_the_sysctl(qtbot, tmp_path):
    commands = RecordedCommands({"system_profiler SPDisplaysDataType SPHardwareDataType": M4_MAX_TEXT})
    available = {"bytes": 30 * GIB}  # what macOS can give up now: not published, chosen
    probe = AppleProbe(commands, platform="darwin", metal=lambda: None, ram_available=lambda: available["bytes"])
    window = window_with(qtbot, tmp_path, probe, host("Apple M4 Max", 48 * GIB, 30 * GIB))
    view = window.hardware_view
    assert view.gpu_labels[0].text() == "GPU 0: Apple M4 Max (40-core GPU, 546 GB/s per the catalog, Metal 3)"
    bar = view.bars[0]
    assert bar.value() == int(1000 * 6 / 36)
    assert bar.format() == "used 6.0 GiB · free 30.0 GiB of 36.0 GiB (the GPU's wired limit)"
    assert "macOS" in bar.toolTip()
    note = view.gpu_notes[0].text()
    assert "Unified memory 48.0 GiB; the GPU may wire 36.0 GiB" in note
    assert "sudo sysctl iogpu.wired_limit_mb=40960" in note
    # The verdict: this machine's Apple GPU, with the memory Metal will give it now.
    target = window.view.targets[0]
    assert (target.name, target.capacity_bytes) == ("GPU 0: Apple M4 Max", 30 * GIB)
    assert window.view.estimate.backend == "metal"
    assert window.view.targets[1].capacity_bytes == 12 * GIB  # the rest of the 48 GiB
    assert "the GPU may wire 36.0 GiB" in window.banner.details.text()
    # The user raises the limit and quits an app: the bar and the estimate follow within a poll.
    commands.outputs["sysctl -n iogpu.wired_limit_mb"] = "40960"
    available["bytes"] = 40 * GIB
    settle(qtbot, window, lambda v: v.targets[0].capacity_bytes == 40 * GIB)
    assert bar.format() == "used 0.0 GiB · free 40.0 GiB of 40.0 GiB (the GPU's wired limit)"
    assert "set with iogpu.wired_limit_mb=40960" in window.banner.details.text()
    assert_build_hint(qtbot, window, "For an Apple GPU, install the Metal build:", "-DGGML_METAL=on")


def test_rx_7900_xtx_shows_its_vram_and_follows_its_use(qtbot, tmp_path):
    device = rx_7900_xtx(tmp_path)
    probe = AmdProbe(tmp_path, amdgpu_ids=NO_IDS)
    window = window_with(qtbot, tmp_path, probe, host("AMD Ryzen 9 7950X", 64 * GIB, 48 * GIB))
    view = window.hardware_view
    assert (
        view.gpu_labels[0].text() == "GPU 0: AMD Radeon RX 7900 XTX (96 CUs, 960 GB/s per the catalog, amdgpu driver)"
    )
    assert view.bars[0].format() == "used 0.1 GiB · free 23.8 GiB of 24.0 GiB"
    assert view.bars[0].value() == int(1000 * 149 / 24560)
    assert not view.gpu_notes[0].isVisible()  # nothing limits a card's memory but its use
    target = window.view.targets[0]
    assert (target.name, target.capacity_bytes) == ("GPU 0: AMD Radeon RX 7900 XTX", 24411 * MIB)
    assert window.view.estimate.backend == "rocm"
    # A game takes 8 GiB of VRAM.
    (device / "mem_info_vram_used").write_text(str(8 * GIB))
    settle(qtbot, window, lambda v: v.targets[0].capacity_bytes == 24560 * MIB - 8 * GIB)
    assert view.bars[0].value() == int(1000 * 8 * GIB / (24560 * MIB))


def test_strix_halo_shows_carveout_and_gtt_and_the_build_choice_moves_the_estimate(qtbot, tmp_path):
    strix_halo_z13(tmp_path)
    probe = AmdProbe(tmp_path, amdgpu_ids=NO_IDS, system_memory=lambda: (124 * GIB, 110 * GIB))
    window = window_with(qtbot, tmp_path, probe, host("AMD RYZEN AI MAX+ 395", 124 * GIB, 110 * GIB))
    view = window.hardware_view
    gpu = window.machine.gpus[0]
    assert view.gpu_labels[0].text() == gpu_label(gpu)
    assert view.gpu_labels[0].text().startswith("GPU 0: AMD Radeon 8050S/8060S Graphics (Strix Halo) (40 CUs")
    assert view.bars[0].format() == "used 1.2 GiB · free 94.8 GiB of 96.0 GiB (as llama.cpp's ROCm build sees it)"
    note = view.gpu_notes[0].text()
    assert "BIOS carve-out 4.0 GiB + GTT 96.0 GiB" in note and "its Vulkan build 100.0 GiB" in note
    rocm_free = gpu.memory_for("rocm").free_bytes
    assert window.view.targets[0].capacity_bytes == rocm_free and window.view.estimate.backend == "rocm"
    assert "counts what llama.cpp's ROCm build sees, 96.0 GiB" in window.banner.details.text()
    # The user picks the Vulkan build: the GPU now has the carve-out and the GTT.
    window.backend_combo.setCurrentIndex(window.backend_combo.findData("vulkan"))
    window.backend_combo.activated.emit(window.backend_combo.currentIndex())
    shown = settle(qtbot, window, lambda v: v.request.controls.backend == "vulkan")
    assert shown.targets[0].capacity_bytes == gpu.memory_for("vulkan").free_bytes == rocm_free + 4 * GIB
    assert shown.targets[1].capacity_bytes == 28 * GIB  # 124 GiB less the 96 GiB of GTT Vulkan may take
    assert "counts what llama.cpp's Vulkan build sees, 100.0 GiB" in window.banner.details.text()
    assert "its ROCm build 96.0 GiB" in window.banner.details.text()
    assert_build_hint(qtbot, window, "install the ROCm build (or the Vulkan build, -DGGML_VULKAN=on):", "-DGGML_HIP=on")


def test_arc_b580_shows_its_vram_and_says_when_its_use_is_unknown(qtbot, tmp_path):
    arc_b580(tmp_path)
    window = window_with(qtbot, tmp_path, IntelProbe(tmp_path), host("Intel Core Ultra 7 265K", 32 * GIB, 24 * GIB))
    view = window.hardware_view
    assert view.gpu_labels[0].text() == "GPU 0: Intel Arc B580 (456 GB/s per the catalog, xe driver)"
    assert view.bars[0].format() == "used 0.0 GiB · free 12.0 GiB of 12.0 GiB"
    assert "Memory in use unknown" in view.gpu_notes[0].text()
    target = window.view.targets[0]
    assert (target.name, target.capacity_bytes) == ("GPU 0: Intel Arc B580", 12 * GIB)
    assert window.view.estimate.backend == "sycl"
    # Run as root, the driver's debugfs tells the usable VRAM and its use, and the bar follows.
    arc_b580(tmp_path, in_use=3 * GIB)
    settle(qtbot, window, lambda v: v.targets[0].capacity_bytes == 12216 * MIB - 3 * GIB)
    assert view.bars[0].format() == "used 3.0 GiB · free 8.9 GiB of 11.9 GiB"
    assert not view.gpu_notes[0].text().startswith("Memory in use unknown")
