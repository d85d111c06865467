"""One detector for every vendor (app.adapters.gpus), and what the estimate does with what it finds:
the verdict's device and memory on recorded Macs, Radeons, a Strix Halo and an Arc B580 (built as in
test_gpu_apple / test_gpu_amd / test_gpu_intel, from tests/data/hw), the words ``fitscope hw`` prints,
and the real detection path of this machine.
"""

from __future__ import annotations

import json
import sys
import time

import pytest
from support.recorded_hw import GIB, MIB, write_amd_memory, write_drm_card
from test_gpu_amd import NO_IDS, rx_7900_xtx, strix_halo_z13
from test_gpu_intel import arc_b580
from test_nvml import FakeNvml, rtx_4090

from app import cli
from app.adapters.gpu_amd import AmdProbe
from app.adapters.gpu_apple import AppleFacts, apple_snapshot
from app.adapters.gpu_intel import IntelProbe
from app.adapters.gpus import GpuDetector
from app.adapters.nvml import NvmlMonitor
from app.core.hardware.snapshots import GpuSnapshot, GpuStatus, HostSnapshot, machine_key
from app.core.model.catalog import find_device
from app.core.report.choices import Controls, HardwareChoice, Machine, ModelChoice, match_catalog_device
from app.core.report.machine_text import gpu_bar, gpu_label, machine_lines
from app.services.view import Evaluator, Request


class Fixed:
    """A probe that answers one status (another vendor's GPUs, or their absence)."""

    def __init__(self, status: GpuStatus) -> None:
        self._status = status

    def status(self) -> GpuStatus:
        return self._status


def no_nvidia() -> NvmlMonitor:
    import pynvml

    return NvmlMonitor(api=FakeNvml([], init_error=pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)))


def host(name: str, total: int, available: int) -> HostSnapshot:
    return HostSnapshot(
        cpu_model=name,
        physical_cores=16,
        logical_cores=16,
        ram_total_bytes=total,
        ram_available_bytes=available,
        cpu_flags=("neon", "dotprod") if name.startswith("Apple") else ("avx2", "avx512f", "fma", "f16c"),
        measured_read_bandwidth_gb_s=100.0,
        timestamp=time.time(),
    )


def detected(*probes) -> GpuStatus:
    return GpuDetector([no_nvidia(), *probes], platform="linux").status()


def view_of(machine: Machine, model: str, quant: str = "Q4_K_M", **controls):
    request = Request(
        ModelChoice(kind="catalog", ref=model, quant=quant), HardwareChoice(), Controls(**controls), machine
    )
    return Evaluator().evaluate(request)


# -- the detector -----------------------------------------------------------------------------


def test_every_vendors_gpus_in_one_list_matched_to_the_catalog(tmp_path):
    amd_root, intel_root = tmp_path / "amd", tmp_path / "intel"
    rx_7900_xtx(amd_root)
    arc_b580(intel_root)
    status = GpuDetector(
        [
            NvmlMonitor(api=FakeNvml([rtx_4090()])),
            AmdProbe(amd_root, amdgpu_ids=NO_IDS),
            IntelProbe(intel_root),
        ],
        platform="linux",
    ).status()
    assert status.available and status.message == ""
    assert [(g.index, g.vendor, g.catalog_id) for g in status.gpus] == [
        (0, "nvidia", "rtx-4090"),
        (1, "amd", "rx-7900-xtx"),
        (2, "intel", "arc-b580"),
    ]
    # Calibration and the run history are kept per machine: its CPU and every GPU.
    key = machine_key(host("AMD Ryzen 9 7950X", 64 * GIB, 48 * GIB), status.gpus)
    assert key == "AMD Ryzen 9 7950X|NVIDIA GeForce RTX 4090,AMD Radeon RX 7900 XTX,Intel Arc B580"


def test_one_device_id_for_several_cards_is_told_apart_by_memory(tmp_path):
    # 0x744c without a known revision: "RX 7900 XT/7900 XTX/7900 GRE"; 24 GiB is the XTX, 20 the XT.
    for card, vram, expected in (("card0", 24560 * MIB, "rx-7900-xtx"), ("card1", 20464 * MIB, "rx-7900-xt")):
        device = write_drm_card(
            tmp_path / card, card, vendor="1002", device="744c", revision="ff", driver="amdgpu", pci_slot="0000:03:00.0"
        )
        write_amd_memory(device, vram_total=vram, vram_used=0, gtt_total=8 * GIB, gtt_used=0)
        (gpu,) = detected(AmdProbe(tmp_path / card, amdgpu_ids=NO_IDS)).gpus
        assert gpu.name == "AMD Radeon RX 7900 XT/7900 XTX/7900 GRE" and gpu.catalog_id == expected


@pytest.mark.parametrize(
    ("name", "memory_gib", "vendor", "expected"),
    [
        ("Apple M3 Max", 128, "apple", "m3-max-128gb"),
        ("Apple M3 Max", 64, "apple", "m3-max-64gb"),
        ("Apple M3", 24, "apple", "m3-24gb"),
        ("Apple M2 Ultra", 192, "apple", "m2-ultra-192gb"),
        ("Apple M3 Ultra", 512, "apple", "m3-ultra-512gb"),
        ("AMD Radeon RX 7900 XTX", 24, "amd", "rx-7900-xtx"),
        ("AMD Radeon 8050S/8060S Graphics (Strix Halo)", 128, "amd", "ryzen-ai-max-395-128gb"),
        ("AMD Radeon 8060S Graphics", 128, "amd", "ryzen-ai-max-395-128gb"),
        ("Intel(R) Arc(TM) B580 Graphics", 12, "intel", "arc-b580"),
        ("Intel Arc A770", 16, "intel", None),  # not in the catalog
        ("Apple M5 Max", 128, "apple", None),
    ],
)
def test_catalog_matching_for_amd_apple_and_intel_names(name, memory_gib, vendor, expected):
    found = match_catalog_device(name, memory_gib * GIB, vendor)
    assert (found.id if found else None) == expected


def test_a_failing_vendor_does_not_hide_the_others(tmp_path):
    class Broken:
        def status(self) -> GpuStatus:
            raise RuntimeError("driver exploded")

    rx_7900_xtx(tmp_path)
    status = detected(Broken(), AmdProbe(tmp_path, amdgpu_ids=NO_IDS))
    assert status.available and [g.name for g in status.gpus] == ["AMD Radeon RX 7900 XTX"]
    assert status.message == "A GPU detector failed (driver exploded)."


@pytest.mark.parametrize(
    ("platform", "words"),
    [
        ("linux", "No GPU found: no NVIDIA driver, and no AMD or Intel Arc card under /sys/class/drm."),
        ("darwin", "No Apple Silicon GPU found"),
        ("win32", "No NVIDIA driver found, and AMD and Intel GPUs are not detected on Windows yet"),
    ],
)
def test_no_gpu_is_one_sentence_per_platform(tmp_path, platform, words):
    status = GpuDetector([no_nvidia(), AmdProbe(tmp_path), IntelProbe(tmp_path)], platform=platform).status()
    assert not status.available and status.message.startswith(words)
    assert status.message.endswith("FitScope will estimate for the CPU and for hardware picked from the catalog.")


def test_the_real_detection_path_on_this_machine():
    status = GpuDetector().status()
    if status.available:
        pytest.skip("this machine has a GPU")
    expected = {"linux": "No GPU found", "darwin": "No Apple Silicon GPU"}.get(sys.platform, "No NVIDIA driver")
    assert status.message.startswith(expected)


# -- the verdict's device and memory ------------------------------------------------------------


def apple_machine(
    chip: str, memory: int, metal: int | None, available: int, wired_limit_mb: int = 0, cores: int | None = None
) -> Machine:
    facts = AppleFacts(chip=chip, gpu_cores=cores, metal="Metal 3", memory_bytes=memory, macos="15.5")
    gpu = apple_snapshot(facts, wired_limit_mb, metal, available, time.time())
    (gpu,) = detected(Fixed(GpuStatus(available=True, gpus=(gpu,)))).gpus
    return Machine(gpus=(gpu,), host=host(chip, memory, available))


@pytest.mark.parametrize(
    ("chip", "memory", "metal", "limit_gib"),
    [
        ("Apple M4", 16 * GIB, None, 10.67),  # exo#1672, macOS 15.6
        ("Apple M4 Max", 48 * GIB, None, 36.0),  # meta-llama/llama#1367 (the default share)
        ("Apple M2 Max", 96 * GIB, 73728 * MIB, 72.0),  # llama.cpp#3213
        ("Apple M5 Max", 128 * GIB, 115448720916, 107.52),  # antirez/ds4#893, macOS 26
        ("Apple M2 Ultra", 192 * GIB, None, 144.0),  # ollama#12847 (the default share)
        ("Apple M3 Ultra", 512 * GIB, 498216210000, 464.0),  # jan#6961, sbc-reviews#95
    ],
)
def test_a_mac_is_estimated_on_its_wired_limit_not_its_whole_memory(chip, memory, metal, limit_gib):
    machine = apple_machine(chip, memory, metal, available=memory - 4 * GIB)
    view = view_of(machine, "qwen2.5-7b", context_per_user_tokens=8192)
    gpu_target, ram_target = view.targets
    limit = machine.gpus[0].memory_total_bytes
    assert limit / GIB == pytest.approx(limit_gib, abs=0.01)
    assert gpu_target.name == f"GPU 0: {chip}" and gpu_target.capacity_bytes == limit
    # The rest of the unified memory is host RAM for what does not go on the GPU.
    assert ram_target.capacity_bytes == memory - limit
    assert view.estimate.backend == "metal"
    assert view.estimate.devices[0].capacity_bytes == limit
    assert f"the GPU may wire {limit / GIB:.1f} GiB" in view.verdict.text


def test_a_70b_the_whole_48_gb_would_hold_does_not_fit_the_wired_limit_until_it_is_raised():
    machine = apple_machine("Apple M4 Max", 48 * GIB, None, available=44 * GIB)
    # Placed automatically, 68 layers go on the GPU and the rest run from system memory (their
    # repacked copy resident, the mapped pages it was read from reclaimable); asked for every layer
    # on the GPU (-ngl all), the wired limit is what stops it.
    auto = view_of(machine, "llama-3.1-70b", context_per_user_tokens=4096)
    assert auto.verdict.headline.startswith("Runs partly in system memory")
    assert auto.estimate.devices[-1].reclaimable_bytes > 0 and auto.estimate.fits
    view = view_of(machine, "llama-3.1-70b", context_per_user_tokens=4096, gpu_layers="all")
    # More than the GPU may wire, less than the Mac has: counting the whole memory would say "fits".
    assert 36 * GIB < view.estimate.devices[0].total_bytes < 48 * GIB
    assert view.verdict.headline.startswith("Does not fit: GPU 0: Apple M4 Max needs ")
    assert "but has 36.0 GiB" in view.verdict.headline
    assert "sudo sysctl iogpu.wired_limit_mb=40960" in view.verdict.text
    # With iogpu.wired_limit_mb=45056 (44 GiB, 4 GiB left to macOS) the same model fits on the GPU.
    raised = view_of(
        apple_machine("Apple M4 Max", 48 * GIB, None, 44 * GIB, 45056),
        "llama-3.1-70b",
        context_per_user_tokens=4096,
        gpu_layers="all",
    )
    assert raised.targets[0].capacity_bytes == 44 * GIB
    assert raised.verdict.headline.startswith("Fits")


def test_rx_7900_xtx_is_estimated_on_its_free_vram_with_the_catalogs_speed(tmp_path):
    rx_7900_xtx(tmp_path)
    machine = Machine(
        gpus=detected(AmdProbe(tmp_path, amdgpu_ids=NO_IDS)).gpus, host=host("AMD Ryzen 9 7950X", 64 * GIB, 48 * GIB)
    )
    view = view_of(machine, "qwen2.5-32b", context_per_user_tokens=8192)
    gpu = view.targets[0]
    assert (gpu.name, gpu.capacity_bytes) == ("GPU 0: AMD Radeon RX 7900 XTX", 24411 * MIB)
    assert gpu.bandwidth_gb_s == find_device("rx-7900-xtx").bandwidth_gb_s and gpu.efficiency_class == "amd"
    assert view.estimate.backend == "rocm"
    assert view.targets[1].capacity_bytes == 64 * GIB  # a card takes nothing from the RAM


def test_strix_halo_is_estimated_on_what_the_chosen_build_sees(tmp_path):
    strix_halo_z13(tmp_path)
    probe = AmdProbe(tmp_path, amdgpu_ids=NO_IDS, system_memory=lambda: (124 * GIB, 110 * GIB))
    machine = Machine(gpus=detected(probe).gpus, host=host("AMD RYZEN AI MAX+ 395", 124 * GIB, 110 * GIB))
    (gpu,) = machine.gpus
    assert gpu.catalog_id == "ryzen-ai-max-395-128gb"
    rocm = view_of(machine, "llama-3.3-70b", context_per_user_tokens=8192)
    vulkan = view_of(machine, "llama-3.3-70b", context_per_user_tokens=8192, backend="vulkan")
    assert rocm.estimate.backend == "rocm" and vulkan.estimate.backend == "vulkan"
    assert rocm.targets[0].capacity_bytes == gpu.memory_for("rocm").free_bytes
    assert vulkan.targets[0].capacity_bytes == gpu.memory_for("vulkan").free_bytes
    assert vulkan.targets[0].capacity_bytes - rocm.targets[0].capacity_bytes == 4 * GIB
    # Host RAM: what the GPU leaves of the 124 GiB the system sees.
    assert (rocm.targets[1].capacity_bytes, vulkan.targets[1].capacity_bytes) == (32 * GIB, 28 * GIB)
    assert "counts what llama.cpp's ROCm build sees, 96.0 GiB" in rocm.verdict.text
    assert "its Vulkan build 100.0 GiB" in rocm.verdict.text
    assert "counts what llama.cpp's Vulkan build sees, 100.0 GiB" in vulkan.verdict.text


def test_arc_b580_is_estimated_with_the_sycl_build(tmp_path):
    arc_b580(tmp_path, in_use=GIB)
    machine = Machine(
        gpus=detected(IntelProbe(tmp_path)).gpus, host=host("Intel Core Ultra 7 265K", 32 * GIB, 24 * GIB)
    )
    view = view_of(machine, "qwen2.5-14b", context_per_user_tokens=4096)
    gpu = view.targets[0]
    assert (gpu.name, gpu.capacity_bytes, gpu.efficiency_class) == ("GPU 0: Intel Arc B580", 12216 * MIB - GIB, "intel")
    assert gpu.bandwidth_gb_s == 456
    assert view.estimate.backend == "sycl"
    # SYCL has a pinned host buffer type: weights left on the CPU are not repacked (backends.py).
    assert view.estimate.repack_bytes == 0
    assert view.estimate.devices[0].name == "GPU 0: Intel Arc B580"
    vulkan = view_of(machine, "qwen2.5-14b", context_per_user_tokens=4096, backend="vulkan")
    assert vulkan.targets[0].capacity_bytes == gpu.capacity_bytes  # both see the same VRAM


# -- the words ----------------------------------------------------------------------------------


def test_labels_and_bars_name_each_vendors_figures(tmp_path):
    strix_halo_z13(tmp_path / "strix")
    (strix,) = detected(
        AmdProbe(tmp_path / "strix", amdgpu_ids=NO_IDS, system_memory=lambda: (124 * GIB, 110 * GIB))
    ).gpus
    assert (
        gpu_label(strix)
        == "GPU 0: AMD Radeon 8050S/8060S Graphics (Strix Halo) (40 CUs, 256 GB/s per the catalog, amdgpu driver)"
    )
    value, text = gpu_bar(strix)
    assert value == int(1000 * (256 * MIB + GIB) / (96 * GIB))
    assert text == "used 1.2 GiB · free 94.8 GiB of 96.0 GiB (as llama.cpp's ROCm build sees it)"
    # meta-llama/llama#1367's M4 Max: 40-core GPU, so the 40-core chip's 546 GB/s (not the 32-core's 410).
    mac = apple_machine("Apple M4 Max", 48 * GIB, None, available=30 * GIB, cores=40).gpus[0]
    assert mac.catalog_id == "m4-max-64gb"
    assert gpu_label(mac) == "GPU 0: Apple M4 Max (40-core GPU, 546 GB/s per the catalog, Metal 3)"
    assert gpu_bar(mac) == (int(1000 * 6 / 36), "used 6.0 GiB · free 30.0 GiB of 36.0 GiB (the GPU's wired limit)")


def test_fitscope_hw_prints_what_the_window_shows(tmp_path, capsys, monkeypatch):
    from app.adapters import gpus
    from app.adapters import host as host_module

    strix_halo_z13(tmp_path)
    status = detected(AmdProbe(tmp_path, amdgpu_ids=NO_IDS, system_memory=lambda: (124 * GIB, 110 * GIB)))
    # The clocks Linux reports for it (ACPI CPPC's nominal, cpufreq's maximum).
    here = host("AMD RYZEN AI MAX+ 395", 124 * GIB, 110 * GIB).model_copy(update={"cpu_clocks_ghz": (3.0, 5.1)})
    monkeypatch.setattr(gpus, "detect_gpus", lambda: status)
    monkeypatch.setattr(host_module, "detect_host", lambda measure_bandwidth: here)
    assert cli.main(["hw"]) == 0
    out = capsys.readouterr().out.splitlines()
    gpu = status.gpus[0]
    assert out == machine_lines(status, here)
    assert out[:3] == [gpu_label(gpu), f"  memory: {gpu_bar(gpu)[1]}", f"  {gpu.memory_note}"]
    assert out[-2:] == [
        "CPU: AMD RYZEN AI MAX+ 395, 16 cores / 16 threads, 3.0–5.1 GHz",
        "RAM: 110.0 GiB free of 124.0 GiB; memory read 100 GB/s (measured)",
    ]
    assert cli.main(["hw", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (shown,) = data["gpus"]["gpus"]
    assert shown["vendor"] == "amd" and shown["carveout_bytes"] == 4 * GIB and shown["gtt_bytes"] == 96 * GIB
    assert {b["backend"]: b["total_bytes"] for b in shown["builds"]} == {"rocm": 96 * GIB, "vulkan": 100 * GIB}


def test_an_nvidia_record_keeps_its_meaning():
    gpu = GpuSnapshot(
        index=0,
        name="NVIDIA GeForce RTX 4090",
        memory_total_bytes=24 * GIB,
        memory_used_bytes=GIB,
        memory_free_bytes=23 * GIB,
        timestamp=1.0,
    )
    assert gpu.memory_for("cuda").free_bytes == 23 * GIB and gpu.memory_for("auto").backend == "cuda"
    assert gpu.taken_from_ram_bytes("cuda") == 0
