"""Host CPU/RAM detection and the memory read-bandwidth measurement."""

from __future__ import annotations

import time

import psutil
import pytest

from app.adapters import host
from app.adapters.host import detect_host, measure_read_bandwidth_gb_s, parse_cpuinfo

X86_CPUINFO = """\
processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 97
model name\t: AMD Ryzen 9 7950X 16-Core Processor
flags\t\t: fpu vme sse2 pni ssse3 fma sse4_1 sse4_2 avx f16c avx2 avx512f avx512bw avx512vl avx512_vnni \
avx512_bf16

processor\t: 1
model name\t: AMD Ryzen 9 7950X 16-Core Processor
"""

ARM_CPUINFO = """\
processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop \
asimddp
CPU implementer\t: 0x41
CPU part\t: 0xd0b
"""


def test_ram_and_cores_match_psutil():
    snap = detect_host(measure_bandwidth=False)
    assert snap.ram_total_bytes == psutil.virtual_memory().total
    assert 0 < snap.ram_available_bytes <= snap.ram_total_bytes
    assert snap.logical_cores > 0
    assert snap.logical_cores == psutil.cpu_count(logical=True)
    if snap.physical_cores is not None:
        assert snap.physical_cores <= snap.logical_cores
    assert snap.cpu_model
    assert snap.measured_read_bandwidth_gb_s is None
    assert snap.timestamp > 0


def test_bandwidth_measurement_is_positive_and_stays_within_its_budget():
    start = time.perf_counter()
    gb_s = measure_read_bandwidth_gb_s()
    elapsed = time.perf_counter() - start
    assert gb_s > 0
    # Any machine that runs a model reads RAM faster than 0.5 GB/s and slower than 10 TB/s;
    # outside that the measurement timed something else.
    assert 0.5 < gb_s < 10_000
    assert elapsed < 3.0  # a budget of about one second; generous for a machine that is busy


def test_detect_host_includes_the_measurement():
    start = time.perf_counter()
    snap = detect_host()
    assert time.perf_counter() - start < 3.5
    assert snap.measured_read_bandwidth_gb_s is not None and snap.measured_read_bandwidth_gb_s > 0


def test_bandwidth_budget_must_be_positive():
    with pytest.raises(ValueError):
        measure_read_bandwidth_gb_s(0)


def test_parse_x86_cpuinfo():
    model, flags = parse_cpuinfo(X86_CPUINFO)
    assert model == "AMD Ryzen 9 7950X 16-Core Processor"
    assert flags == (
        "sse3",
        "ssse3",
        "sse4_1",
        "sse4_2",
        "avx",
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512_vnni",
        "avx512_bf16",
    )


def test_parse_arm_cpuinfo_maps_features_and_ignores_the_cpu_number():
    model, flags = parse_cpuinfo(ARM_CPUINFO)
    assert model is None  # "processor : 0" is a number, not a name
    assert flags == ("neon", "fp16", "dotprod")


def test_missing_proc_cpuinfo_falls_back_to_unknown_cpu(monkeypatch, tmp_path):
    monkeypatch.setattr(host.sys, "platform", "linux")
    monkeypatch.setattr(host, "_CPUINFO_PATH", tmp_path / "missing")
    monkeypatch.setattr(host.platform, "processor", lambda: "")
    snap = detect_host(measure_bandwidth=False)
    assert snap.cpu_model == "unknown CPU"
    assert snap.cpu_flags == ()
    assert snap.logical_cores > 0


def test_cpu_clocks_come_from_what_the_os_reports(monkeypatch, tmp_path):
    """(base, boost) GHz: Linux's cpufreq base_frequency and cpuinfo_max_freq (kHz), else ACPI CPPC's
    nominal_freq (MHz), else the base an Intel model name states; none where nothing tells the base."""
    assert host.parse_cpu_clocks("Intel(R) Core(TM) i7-8550U CPU @ 1.80GHz", None, 4000.0) == (1.8, 4.0)
    assert host.parse_cpu_clocks("AMD Ryzen 9 7950X 16-Core Processor", 4500.0, 5881.0) == (4.5, 5.881)
    assert host.parse_cpu_clocks("AMD Ryzen 9 7950X 16-Core Processor", None, 5881.0) is None
    # Boost off (or a maximum below the base): the base twice; a figure no CPU runs at: none.
    assert host.parse_cpu_clocks("Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz", None, None) == (2.4, 2.4)
    assert host.parse_cpu_clocks("x", 40_000.0, None) is None
    monkeypatch.setattr(host.sys, "platform", "linux")
    cpu0 = tmp_path / "cpu0"
    (cpu0 / "cpufreq").mkdir(parents=True)
    (cpu0 / "cpufreq" / "cpuinfo_max_freq").write_text("5100000\n")
    (cpu0 / "acpi_cppc").mkdir()
    (cpu0 / "acpi_cppc" / "nominal_freq").write_text("2000\n")
    assert host._cpu_clocks("AMD Ryzen AI 9 HX 370", cpu0) == (2.0, 5.1)
    (cpu0 / "cpufreq" / "base_frequency").write_text("2200000\n")
    assert host._cpu_clocks("Intel(R) Core(TM) i9-14900HX", cpu0) == (2.2, 5.1)
    assert host._cpu_clocks("AMD EPYC", tmp_path / "missing") is None


def test_the_snapshot_names_the_threads_llama_cpp_uses_here(monkeypatch):
    """llama.cpp's default thread count (a hybrid CPU's performance cores: ``cpu_topology``) travels with
    the snapshot, so that estimates for this machine assume what a run here does."""
    monkeypatch.setattr(host, "llama_math_threads", lambda: 8)
    assert detect_host(measure_bandwidth=False).llama_threads == 8


def test_real_cpu_is_named_on_linux():
    if not host.sys.platform.startswith("linux") or not host._CPUINFO_PATH.exists():
        pytest.skip("needs Linux /proc/cpuinfo")
    model, _ = parse_cpuinfo(host._CPUINFO_PATH.read_text())
    snap = detect_host(measure_bandwidth=False)
    assert snap.cpu_model == (model or snap.cpu_model)
    assert snap.cpu_model != ""
