"""The ``fitscope`` command as a user meets it: JSON figures, verdicts, and one-line errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app import cli

REPO = Path(__file__).resolve().parents[1]
GIB = 1024**3
MIB = 1024**2

ESTIMATE_KEYS = {
    "weights_bytes",
    "repack_bytes",
    "kv_cache_bytes",
    "recurrent_state_bytes",
    "compute_bytes",
    "output_bytes",
    "overhead_bytes",
    "total_bytes",
    "devices",
    "fits",
    "largest_context_per_user_tokens",
    "users_that_fit",
    "placement",
    "decode_tokens_per_s",
    "prefill_tokens_per_s",
    "assumptions",
}


def _has_nvidia_driver() -> bool:
    return Path("/proc/driver/nvidia").exists() or shutil.which("nvidia-smi") is not None


def _cpu_has_avx2() -> bool:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    flag_lines = (line.split(":", 1)[-1].split() for line in text.splitlines() if line.startswith("flags"))
    return any("avx2" in flags for flags in flag_lines)


@pytest.fixture(autouse=True)
def _quick_bandwidth(monkeypatch):
    """--cpu estimates measure memory bandwidth (0.3 s each); the figures tested here do not depend on it."""
    from app.adapters import host

    monkeypatch.setattr(host, "measure_read_bandwidth_gb_s", lambda *a, **k: 30.0)


def run_ok(capsys, *argv: str):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert err == ""
    return json.loads(out) if "--json" in argv else out


def run_fail(capsys, *argv: str) -> str:
    """Runs a command that must fail cleanly; returns its single stderr line."""
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("fitscope: "), err
    assert out == ""
    return lines[0]


# -- estimate ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama8b_4090() -> dict:
    """The reference estimate: Llama 3.1 8B Q4_K_M, 8192 tokens, on a catalog RTX 4090."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli.main(
            ["estimate", "--model", "llama-3.1-8b", "--quant", "Q4_K_M", "-c", "8192", "--gpu", "rtx-4090", "--json"]
        )
    assert rc == 0
    return json.loads(buf.getvalue())


def test_estimate_json_has_every_key(llama8b_4090):
    r = llama8b_4090
    assert r.keys() >= ESTIMATE_KEYS
    for key in (k for k in ESTIMATE_KEYS if k.endswith("_bytes")):
        assert isinstance(r[key], int) and r[key] >= 0, key
    assert r["devices"]
    for d in r["devices"]:
        assert {"name", "capacity_bytes", "total_bytes", "fits"} <= d.keys()
    for key in ("decode_tokens_per_s", "prefill_tokens_per_s"):
        assert {"low", "high"} <= r[key].keys()
    assert isinstance(r["assumptions"], list) and r["assumptions"]
    assert all(isinstance(a, str) and a for a in r["assumptions"])


def test_estimate_figures_for_llama_8b_on_a_4090(llama8b_4090):
    r = llama8b_4090
    # 32 layers x 8 KV heads x 128 dims x 2 (K and V) x 2 bytes (f16) x 8192 cells = 1 GiB exactly.
    assert r["kv_cache_bytes"] == 32 * 8 * 128 * 2 * 2 * 8192 == GIB
    assert r["weights_bytes"] == pytest.approx(4.58 * GIB, rel=0.01)
    assert r["fits"] is True
    gpu = next(d for d in r["devices"] if d["kind"] == "gpu")
    assert gpu["capacity_bytes"] == 24 * GIB
    assert gpu["fits"] is True
    decode = r["decode_tokens_per_s"]
    assert 0 < decode["low"] < decode["high"]
    prefill = r["prefill_tokens_per_s"]
    assert 0 < prefill["low"] <= prefill["high"]
    assert r["compute_bytes"] == sum(d["compute_bytes"] for d in r["devices"])
    assert r["total_bytes"] == sum(d["total_bytes"] for d in r["devices"])
    assert r["largest_context_per_user_tokens"] >= 8192
    assert r["placement"] == "gpu" and r["users_that_fit"] >= 1


def test_long_context_does_not_fit_a_3060_and_auto_moves_layers_to_system_memory(capsys):
    args = ("estimate", "--model", "llama-3.1-8b", "-c", "131072", "--gpu", "rtx-3060-12gb", "--json")
    r = run_ok(capsys, *args, "-ngl", "all")
    assert r["fits"] is False
    assert any(d["kind"] == "gpu" and not d["fits"] for d in r["devices"])
    # As llama-server's default -ngl auto places it: layers leave the GPU, keeping 1 GiB free there.
    auto = run_ok(capsys, *args)
    assert auto["fits"] is True and auto["placement"] == "partial"
    assert 0 < auto["gpu_layers"] < 33
    gpu = next(d for d in auto["devices"] if d["kind"] == "gpu")
    assert gpu["free_bytes"] >= 1024**3
    # The largest context that keeps the model on the GPU is below the one asked for.
    assert auto["limit_scope"] == "gpu" and 0 < auto["largest_context_per_user_tokens"] < 131072


def test_70b_splits_across_two_4090s(capsys):
    r = run_ok(
        capsys, "estimate", "--model", "llama-3.1-70b", "-c", "8192", "--gpu", "rtx-4090", "--gpu", "rtx-4090", "--json"
    )
    gpus = [d for d in r["devices"] if d["kind"] == "gpu"]
    assert len(gpus) == 2
    assert all(d["weights_bytes"] > 0 for d in gpus)
    # Each GPU holds part, not all, of the weights.
    assert all(d["weights_bytes"] < r["weights_bytes"] for d in gpus)
    assert sum(d["weights_bytes"] for d in gpus) > 0.9 * r["weights_bytes"]
    assert all(d["fits"] for d in gpus)
    assert r["fits"] is True


def test_human_output_gives_a_verdict(capsys):
    out = run_ok(capsys, "estimate", "--model", "llama-3.1-8b", "-c", "8192", "--gpu", "rtx-4090")
    assert "Verdict: fits on the GPU." in out
    assert "llama.cpp build: CUDA, as llama-server runs it" in out
    assert "llama-server -m MODEL.gguf -c 8192 -np 1 -b 2048 -ub 512 -fa on -ctk f16 -ctv f16 -ngl 33" in out
    assert "NVIDIA GeForce RTX 4090" in out
    assert "Assumptions:" in out


def test_quantized_v_cache_without_flash_attention_is_refused(capsys):
    line = run_fail(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "-ctv", "q8_0", "-fa", "off")
    assert "flash attention" in line.lower()


# -- bad input -----------------------------------------------------------------------------------


def test_unknown_model_suggests_a_close_match(capsys):
    line = run_fail(capsys, "estimate", "--model", "llama-3.1-8", "--gpu", "rtx-4090")
    assert "llama-3.1-8'" in line
    assert "llama-3.1-8b" in line


def test_unknown_quant(capsys):
    line = run_fail(capsys, "estimate", "--model", "llama-3.1-8b", "--quant", "Q9_Z", "--gpu", "rtx-4090")
    assert "Q9_Z" in line
    assert "Q4_K_M" in line  # lists the valid presets


def test_unknown_gpu(capsys):
    line = run_fail(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "rtx-9999")
    assert "rtx-9999" in line


def test_missing_gguf_file(capsys, tmp_path):
    missing = tmp_path / "nope.gguf"
    line = run_fail(capsys, "estimate", "--gguf", str(missing), "--cpu")
    assert "nope.gguf" in line


def test_text_file_is_not_a_gguf(capsys, tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("These are my notes, not a model.\n" * 10, encoding="utf-8")
    line = run_fail(capsys, "estimate", "--gguf", str(text), "--cpu")
    assert "not a GGUF file" in line


def test_no_model_given(capsys):
    line = run_fail(capsys, "estimate", "--cpu")
    assert "Name one model" in line


def test_two_models_given(capsys, tmp_path):
    config = tmp_path / "config.json"
    config.write_text("{}", encoding="utf-8")
    line = run_fail(capsys, "estimate", "--model", "llama-3.1-8b", "--hf-config", str(config), "--cpu")
    assert "Name one model" in line


def test_cpu_and_gpu_together(capsys):
    line = run_fail(capsys, "estimate", "--model", "llama-3.1-8b", "--cpu", "--gpu", "rtx-4090")
    assert "--cpu or --gpu" in line


@pytest.mark.skipif(_has_nvidia_driver(), reason="this machine has an NVIDIA driver")
def test_local_gpu_without_a_driver(capsys):
    line = run_fail(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "local")
    assert "no NVIDIA driver" in line
    assert "--cpu" in line


def test_this_machines_gpus_resolve_as_in_the_window(capsys, monkeypatch):
    """--gpu local takes the window's targets: NVML reports no bandwidth for this RTX 4090, so the
    catalog's 1008 GB/s is used (not a guess); catalog GPUs join after it, host RAM last."""
    from types import SimpleNamespace

    from app.adapters import nvml
    from app.core.hardware.snapshots import GpuSnapshot, GpuStatus

    gpu = GpuSnapshot(
        index=0,
        name="NVIDIA GeForce RTX 4090",
        memory_total_bytes=24 * GIB,
        memory_used_bytes=GIB,
        memory_free_bytes=23 * GIB,
        timestamp=1.0,
    )
    status = GpuStatus(available=True, driver_version="550.54", gpus=(gpu,))
    monkeypatch.setattr(nvml, "NvmlMonitor", lambda: SimpleNamespace(status=lambda: status))

    alone = run_ok(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "local", "--json")
    assert [d["name"] for d in alone["devices"]] == ["GPU 0: NVIDIA GeForce RTX 4090", "Host RAM"]
    assert any(
        a.startswith("GPU 0: NVIDIA GeForce RTX 4090: reads") and "at 1008 GB/s" in a for a in alone["assumptions"]
    )

    mixed_gpus = ("--gpu", "local", "--gpu", "rtx-3090", "--host-ram-gib", "100")
    mixed = run_ok(capsys, "estimate", "--model", "llama-3.1-8b", *mixed_gpus, "--json")
    names = [d["name"] for d in mixed["devices"]]
    assert names == ["GPU 0: NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 3090", "Host RAM"]
    assert mixed["devices"][0]["capacity_bytes"] == 23 * GIB
    assert mixed["devices"][-1]["capacity_bytes"] == 100 * GIB


@pytest.mark.parametrize(
    ("ctx", "expected"),
    [
        ("0", "-c"),
        ("-5", "-c"),
        ("999999999", "-c"),  # beyond llama.cpp's ceiling: refused by the settings, not attempted
        ("16777216", "trained"),  # within the ceiling but far beyond the model's training context
    ],
)
def test_impossible_context(capsys, ctx, expected):
    line = run_fail(capsys, "estimate", "--model", "llama-3.1-8b", "--cpu", "-c", ctx)
    assert expected in line


# -- catalogs and hardware -----------------------------------------------------------------------


def test_models_json(capsys):
    models = run_ok(capsys, "models", "--json")
    ids = {m["id"] for m in models}
    assert len(models) >= 30
    assert {"llama-3.1-8b", "gemma-3-270m", "deepseek-v2-lite", "gpt-oss-20b"} <= ids


def test_gpus_json(capsys):
    devices = run_ok(capsys, "gpus", "--json")
    ids = {d["id"] for d in devices}
    assert len(devices) >= 40
    assert {"rtx-4090", "h100-sxm", "m2-ultra-192gb", "mi300x"} <= ids
    assert all(d["capacity_bytes"] > 0 for d in devices)


def test_models_and_gpus_tables(capsys):
    assert "llama-3.1-8b" in run_ok(capsys, "models")
    assert "rtx-4090" in run_ok(capsys, "gpus")


@pytest.mark.skipif(_has_nvidia_driver(), reason="this machine has an NVIDIA driver")
def test_hw_json_without_a_driver(capsys):
    r = run_ok(capsys, "hw", "--json")
    assert r["gpus"]["available"] is False
    assert r["gpus"]["message"]
    assert r["host"]["ram_total_bytes"] > 0


# -- CPU: the demo model and weight repacking -----------------------------------------------------


@pytest.fixture(scope="module")
def demo_path() -> Path:
    from app.adapters.demo_model import demo_model_path
    from app.core.common.errors import FitScopeError

    try:
        return demo_model_path()
    except FitScopeError as exc:
        pytest.skip(str(exc))


def test_demo_gguf_weights_are_its_real_tensor_bytes(capsys, demo_path):
    r = run_ok(capsys, "estimate", "--gguf", str(demo_path), "--cpu", "--json")
    assert r["weights_bytes"] == 246587904
    assert r["kv_cache_bytes"] > 0
    assert r["fits"] is True


@pytest.mark.skipif(not _cpu_has_avx2(), reason="repacking figures are for x86 CPUs with AVX2")
def test_cpu_repack_matches_a_real_llama_cpp_load(capsys):
    r = run_ok(capsys, "estimate", "--model", "llama-3.1-8b", "--quant", "Q4_K_M", "--cpu", "--json")
    assert r["repack_bytes"] > 0
    # Measured from a real llama.cpp load of Llama 3.1 8B Q4_K_M on an AVX2 CPU.
    assert r["repack_bytes"] == 3204 * MIB
    assert [d["kind"] for d in r["devices"]] == ["cpu"]


# -- a real process ------------------------------------------------------------------------------


def test_exit_codes_through_a_real_process():
    ok = subprocess.run(
        [sys.executable, "-m", "app.cli", "gpus", "--json"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)
    bad = subprocess.run(
        [sys.executable, "-m", "app.cli", "estimate", "--model", "no-such-model", "--gpu", "rtx-4090"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert bad.stderr.startswith("fitscope: ")
    assert len(bad.stderr.strip().splitlines()) == 1
    assert "Traceback" not in bad.stderr


def test_no_arguments_opens_the_window_or_says_why_it_cannot(capsys, monkeypatch):
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    from app.cli import main

    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fitscope: No display found") and "xvfb-run fitscope" in err


def test_auto_layers_for_a_70b_on_one_rtx_4090_run_partly_mapped_in_ram(capsys):
    out = run_ok(
        capsys,
        "estimate",
        "--model",
        "llama-3.1-70b",
        "-c",
        "8192",
        "--gpu",
        "rtx-4090",
        "--host-ram-gib",
        "32",
        "-ngl",
        "auto",
        "--json",
    )
    r = out
    plan = r["auto_fit"]
    # llama.cpp's --fit: 1 GiB kept free, about 40 of 81 layers on the GPU, nothing repacked.
    assert 38 <= plan["gpu_layers"] <= 46 and plan["margin_bytes"] == 1024**3
    gpu, host = r["devices"]
    assert gpu["capacity_bytes"] - gpu["total_bytes"] >= 1024**3 and host["fits"]
    assert r["repack_bytes"] == 0 and host["weights_bytes"] > 15 * 1024**3
    assert r["llama_server_command"].endswith(f"-ngl {plan['gpu_layers']}")


def test_gpt_oss_120b_keeps_its_mxfp4_experts_in_ram_with_attention_on_the_gpu(capsys):
    box = ("estimate", "--model", "gpt-oss-120b", "-c", "16384", "--gpu", "rtx-4090", "--host-ram-gib", "96")
    r = run_ok(capsys, *box, "-ngl", "auto", "--json")
    assert r["quant"] == "MXFP4_MOE" and 62e9 < r["model_bytes"] < 65e9  # the published 63 GB file
    plan = r["auto_fit"]
    assert plan["gpu_layers"] == 37 and 0 < plan["n_cpu_moe"] <= 36
    assert f"--n-cpu-moe {plan['n_cpu_moe']}" in r["llama_server_command"] or "--cpu-moe" in r["llama_server_command"]
    assert r["decode_tokens_per_s"]["low"] > 5
    explicit = run_ok(capsys, *box, "--cpu-moe", "--json")
    gpu, host = explicit["devices"]
    assert gpu["weights_bytes"] < 4 * 1024**3 < host["weights_bytes"]


def test_cpu_servers_and_unified_boxes_from_the_catalog(capsys):
    # The same 70B model on a DGX Spark, an EPYC server and a desktop CPU: where it runs and how fast.
    spark = run_ok(capsys, "estimate", "--model", "llama-3.3-70b", "-c", "16384", "--gpu", "dgx-spark", "--json")
    epyc = run_ok(capsys, "estimate", "--model", "llama-3.3-70b", "-c", "16384", "--gpu", "epyc-9655", "--json")
    desk = run_ok(capsys, "estimate", "--model", "llama-3.3-70b", "-c", "16384", "--gpu", "ryzen-9-9950x", "--json")
    assert spark["fits"] and [d["kind"] for d in spark["devices"]] == ["gpu", "cpu"]
    assert [d["kind"] for d in epyc["devices"]] == ["cpu"] and epyc["fits"]
    # 12 channels of DDR5 and 96 cores against 2 channels and 16: several times faster (range for
    # range: the ranges are held-out residuals of whole sources, wider than one device's spread).
    assert epyc["decode_tokens_per_s"]["low"] > 3 * desk["decode_tokens_per_s"]["low"]
    assert epyc["decode_tokens_per_s"]["high"] > 3 * desk["decode_tokens_per_s"]["high"]
    assert 2 < spark["decode_tokens_per_s"]["low"] < spark["decode_tokens_per_s"]["high"] < 10


def test_a_unified_memory_box_keeps_the_rest_of_its_own_memory_beside_its_gpu(capsys):
    # The host side of a Mac Studio is the part of its one pool the GPU may not take, as in the
    # window, not the RAM of the machine FitScope runs on.
    from app.core.model.catalog import find_device
    from app.core.report.choices import HardwareChoice, Machine, resolve_targets

    mac = find_device("m2-ultra-192gb")
    r = run_ok(capsys, "estimate", "--model", "llama-3.3-70b", "-c", "16384", "--gpu", "m2-ultra-192gb", "--json")
    host = next(d for d in r["devices"] if d["kind"] == "cpu")
    rest = int(mac.memory_gib * GIB) - mac.capacity_bytes
    assert host["capacity_bytes"] == rest == 48 * GIB
    window = resolve_targets(HardwareChoice(kind="catalog", device_id="m2-ultra-192gb"), Machine())
    assert window[-1].capacity_bytes == rest
    # --host-ram-gib describes separate host memory: a unified box has none to add.
    args = ("estimate", "--model", "llama-3.3-70b", "--gpu", "m2-ultra-192gb", "--host-ram-gib", "8", "--json")
    r = run_ok(capsys, *args)
    assert next(d for d in r["devices"] if d["kind"] == "cpu")["capacity_bytes"] == rest
