"""Apple Silicon detection (app.adapters.gpu_apple) against recorded outputs of real Macs
(tests/data/hw/apple, each with its source), and the real code path on this Linux machine.

What was not published, and how the tests stand in for it: no real ``system_profiler -json`` output
was found (only its text form, used here; the JSON test builds its document from the recorded M4 Max
text with the key names open-source readers use, and says so); ``sysctl hw.memsize`` is recorded for
the M5 Max 128 GB only (the others take their memory from system_profiler's "Memory: 48 GB" line or
from the report); the RAM macOS has available is never recorded and each test passes one.
"""

from __future__ import annotations

import json
import sys

import pytest
from support.recorded_hw import GIB, MIB, RecordedCommands, output, recorded

from app.adapters.gpu_apple import (
    NO_APPLE_SILICON,
    NOT_A_MAC,
    UNREADABLE,
    AppleFacts,
    AppleProbe,
    apple_snapshot,
    default_working_set_bytes,
    metal_working_set,
    parse_displays,
    parse_memory_line,
)

M4_MAX_TEXT = output(
    "apple/m4-max-48gb-macbookpro.json", "system_profiler SPHardwareDataType SPDisplaysDataType (text, as pasted)"
)
M4_TEXT = output("apple/m4-llamacpp-14966-x86-build.json", "system_profiler SPDisplaysDataType (text)")


def m4_max_probe(ram_available: int, wired_limit_mb: str | None = None) -> tuple[AppleProbe, RecordedCommands]:
    """The MacBook Pro M4 Max 48 GB of meta-llama/llama#1367: its recorded system_profiler text,
    no other command recorded (sysctl answers nothing, as if it failed)."""
    commands = RecordedCommands({"system_profiler SPDisplaysDataType SPHardwareDataType": M4_MAX_TEXT})
    if wired_limit_mb is not None:
        commands.outputs["sysctl -n iogpu.wired_limit_mb"] = wired_limit_mb
    probe = AppleProbe(commands, platform="darwin", metal=lambda: None, ram_available=lambda: ram_available)
    return probe, commands


def test_system_profiler_text_names_the_chip_its_gpu_cores_and_memory():
    # The GPU's "Total Number of Cores" (40), not the CPU's (16) printed above it.
    assert parse_displays(M4_MAX_TEXT) == ("Apple M4 Max", 40, "Metal 3")
    assert parse_memory_line(M4_MAX_TEXT) == 48 * GIB
    assert parse_displays(M4_TEXT) == ("Apple M4", 8, "Metal 3")
    assert parse_memory_line(M4_TEXT) is None  # that report did not include the hardware overview
    # An Intel Mac's graphics are not Apple's GPU.
    assert parse_displays("Chipset Model: AMD Radeon Pro 5500M\nTotal Number of Cores: 24") == (None, None, None)


def test_system_profiler_json_is_read_like_the_text():
    """No real ``system_profiler -json SPDisplaysDataType`` output was published; this document
    carries the recorded M4 Max's values under the key names open-source readers of it use."""
    document = json.dumps(
        {
            "SPDisplaysDataType": [
                {
                    "sppci_model": "Apple M4 Max",
                    "sppci_cores": "40",
                    "spdisplays_mtlgpufamilysupport": "spdisplays_metal3",
                }
            ]
        }
    )
    assert parse_displays(document) == ("Apple M4 Max", 40, "Metal 3")


@pytest.mark.parametrize(
    ("file", "memory_gib", "printed_mib"),
    [
        ("apple/m1-8gb.json", 8, 5461.34),
        ("apple/m1-macbook-air-16gb.json", 16, 10922.67),
        ("apple/m1-max-32gb.json", 32, 21845.34),
        ("apple/m2-max-32gb.json", 32, 21845.34),
        ("apple/m2-max-96gb.json", 96, 73728.00),
    ],
)
def test_the_default_share_matches_every_recorded_working_set_of_macos_13_to_15(file, memory_gib, printed_mib):
    """llama.cpp's Metal init of those years printed recommendedMaxWorkingSetSize in MiB (labelled
    MB): 2/3 of the memory up to 32 GB, 3/4 above."""
    assert recorded(file)["derived"]["recommended_working_set_printed"] == printed_mib
    assert default_working_set_bytes(memory_gib * GIB) / MIB == pytest.approx(printed_mib, abs=0.01)


def test_m4_max_48gb_wires_three_quarters_and_the_note_says_how_to_raise_it():
    probe, commands = m4_max_probe(ram_available=30 * GIB)
    status = probe.status()
    assert status.available
    gpu = status.gpus[0]
    assert (gpu.name, gpu.vendor, gpu.compute_units, gpu.driver_version) == ("Apple M4 Max", "apple", 40, "Metal 3")
    assert gpu.memory_kind == "unified" and gpu.shared_memory_bytes == 48 * GIB
    # 3/4 of 48 GiB: "on a 48GB MacBook Pro, the GPU sees about 36GB" (thinkdifferent.blog, README).
    assert gpu.memory_total_bytes == 36 * GIB
    # Free: what macOS can give up now (30 GiB available), not the whole limit.
    assert (gpu.memory_free_bytes, gpu.memory_used_bytes) == (30 * GIB, 6 * GIB)
    assert gpu.memory_for("metal").total_bytes == 36 * GIB
    # The published advice for this machine: sudo sysctl iogpu.wired_limit_mb=40960.
    assert "sudo sysctl iogpu.wired_limit_mb=40960" in gpu.memory_note
    assert "macOS 13-15's default, 3/4 of it" in gpu.memory_note
    # Facts read once: a second poll runs only the sysctls that can change.
    before = len(commands.calls)
    probe.status()
    assert all(c.startswith("sysctl") for c in commands.calls[before:])


def test_the_sysctl_sets_the_limit_exactly():
    """llmfit#754: iogpu.wired_limit_mb 12000 / 14000 on a 16 GB M3 made Metal report exactly those
    values; on the M4 Max, 40960 gives 40 GiB."""
    probe, _ = m4_max_probe(ram_available=45 * GIB, wired_limit_mb="40960\n")
    gpu = probe.status().gpus[0]
    assert gpu.memory_total_bytes == 40960 * MIB
    assert "set with iogpu.wired_limit_mb=40960" in gpu.memory_note
    assert "To give it more" not in gpu.memory_note  # already at the suggestion
    m3 = AppleFacts(chip="Apple M3", gpu_cores=None, metal=None, memory_bytes=16 * GIB, macos=None)
    for limit in (12000, 14000):
        assert apple_snapshot(m3, limit, None, 15 * GIB, 1.0).memory_total_bytes == limit * MIB


def test_m5_max_128gb_on_macos_26_takes_metals_figure_then_the_override():
    """antirez/ds4#893 and osaurus#1958: hw.memsize=137438953472, iogpu.wired_limit_mb=0, Metal's
    working set 107.52 GiB stock and 112.00 GiB with iogpu.wired_limit_mb = 114688. The chip name
    is the reports' ("Apple M5 Max"), as ``sysctl machdep.cpu.brand_string`` prints it; no
    system_profiler output of this Mac was published."""
    data = recorded("apple/m5-max-128gb.json")["derived"]
    commands = RecordedCommands(
        {
            "sysctl -n hw.memsize": "137438953472\n",
            "sysctl -n iogpu.wired_limit_mb": "0\n",
            "sysctl -n machdep.cpu.brand_string": "Apple M5 Max\n",
        }
    )
    stock = data["recommended_working_set_bytes_stock_approx"]
    probe = AppleProbe(commands, platform="darwin", metal=lambda: stock, ram_available=lambda: 120 * GIB)
    gpu = probe.status().gpus[0]
    assert gpu.name == "Apple M5 Max" and gpu.shared_memory_bytes == data["total_memory_bytes"]
    assert gpu.memory_total_bytes == stock and gpu.memory_total_bytes / GIB == pytest.approx(107.52, abs=0.01)
    assert "macOS's default, as Metal reports it" in gpu.memory_note
    commands.outputs["sysctl -n iogpu.wired_limit_mb"] = str(data["iogpu_wired_limit_mb_override"])
    raised = probe.status().gpus[0]
    assert raised.memory_total_bytes == data["recommended_working_set_bytes_with_override"]  # 112.00 GiB
    assert raised.memory_free_bytes == 112 * GIB


@pytest.mark.parametrize(
    ("chip", "memory_bytes", "metal_bytes", "expected_gib"),
    [
        # M4 Mac mini 16 GB, macOS 15.6 (exo#1672): "~10.67 GB" max recommended working set.
        ("Apple M4", 16 * GIB, None, 10.67),
        # M2 Max 96 GB (llama.cpp#3213): 73728 MiB from Metal.
        ("Apple M2 Max", 96 * GIB, 73728 * MIB, 72.0),
        # M2 Ultra 192 GB (ollama#12847): its working-set line was cut off; the default share gives
        # 144 GiB, Rapid-MLX#183's table lists "M2 Ultra 192GB 144 GB".
        ("Apple M2 Ultra", 192 * GIB, None, 144.0),
        # M3 Ultra (jan#6961): 498216.21 MB (1e6 bytes) from Metal on a 512 GB Mac Studio
        # (sbc-reviews#95: RAM 524288 MiB); above the default share (override status unknown).
        ("Apple M3 Ultra", 524288 * MIB, 498216210000, 464.0),
    ],
)
def test_recorded_macs_from_16_to_512_gb(chip, memory_bytes, metal_bytes, expected_gib):
    facts = AppleFacts(chip=chip, gpu_cores=None, metal=None, memory_bytes=memory_bytes, macos=None)
    gpu = apple_snapshot(facts, 0, metal_bytes, memory_bytes, 1.0)
    assert gpu.memory_total_bytes / GIB == pytest.approx(expected_gib, abs=0.01)
    assert gpu.memory_total_bytes < memory_bytes  # never the whole unified memory


def test_not_a_mac_says_so_on_the_real_path():
    status = AppleProbe().status()
    if sys.platform == "darwin":
        pytest.skip("this is a Mac")
    assert not status.available and status.message == NOT_A_MAC


def test_metal_through_the_installed_llama_cpp_is_absent_here():
    """The real llama.cpp of this machine (a CPU build on Linux) lists no Metal device."""
    if sys.platform == "darwin":
        pytest.skip("this is a Mac")
    assert metal_working_set() is None


def test_a_mac_whose_system_profiler_and_sysctl_fail_is_said_in_a_sentence():
    probe = AppleProbe(RecordedCommands({}), platform="darwin", metal=lambda: None, ram_available=lambda: GIB)
    status = probe.status()
    assert not status.available and status.message == UNREADABLE
    intel_mac = RecordedCommands({"system_profiler SPDisplaysDataType": "Chipset Model: AMD Radeon Pro 5500M"})
    status = AppleProbe(intel_mac, platform="darwin", metal=lambda: None, ram_available=lambda: GIB).status()
    assert status.message == NO_APPLE_SILICON
