"""The desktop window, offscreen: every control drives the charts and the verdict to the
estimator's own numbers; bad files leave it usable; settings come back after a restart; exports
hold the numbers on screen.

NVIDIA GPUs cannot exist on this machine, so GPU tests feed the real NvmlMonitor a fake pynvml
(the same seam as tests/test_nvml.py) with an RTX 4090's values; one test runs the real detection
path (every vendor). Apple, AMD and Intel GPUs in the window: tests/test_gpu_vendors_window.py.
"""

from __future__ import annotations

import atexit
import csv
import io
import json
from concurrent.futures import Executor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence
from test_nvml import FakeNvml, rtx_4090

from app.adapters.demo_model import demo_model_path
from app.adapters.gpus import GpuDetector
from app.adapters.host import detect_host
from app.adapters.nvml import NvmlMonitor
from app.core.common.units import GIB
from app.core.memory.estimate import estimate
from app.core.memory.records import Settings
from app.core.memory.targets import host_ram_target, target_from_device
from app.core.model.catalog import find_device
from app.core.model.quant import find_preset, quantize_layout
from app.core.model.source import model_from_catalog, model_from_gguf
from app.core.report.choices import Controls, HardwareChoice, ModelChoice
from app.core.report.prefs import Preferences, load_preferences
from app.ui.app import create_window
from app.ui.jobs import process_pool
from app.ui.window import MainWindow, Services

pytestmark = pytest.mark.usefixtures("demo_gguf")


class SharedEstimatePool(Executor):
    """One estimator process for every window the tests open (a process start costs a second or
    two on a small machine): a window's close leaves it running; a killed one is replaced."""

    def __init__(self) -> None:
        self._pool: Executor | None = None

    def submit(self, fn, /, *args, **kwargs):
        if self._pool is None:
            self._pool = process_pool()
        try:
            return self._pool.submit(fn, *args, **kwargs)
        except BrokenProcessPool:
            self._pool = process_pool()
            return self._pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        pass  # shared: closed when the test session ends

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


SHARED_ESTIMATE_POOL = SharedEstimatePool()
atexit.register(SHARED_ESTIMATE_POOL.close)


def make_services(tmp_path: Path, nvml=None, probes=None) -> Services:
    """The window's services with a fake NVML (no driver unless ``nvml``), or with ``probes`` as
    this machine's GPU detectors."""
    monitor = NvmlMonitor(api=nvml if nvml is not None else FakeNvml([], init_error=_no_driver()))
    return Services(
        make_estimate_pool=lambda: SHARED_ESTIMATE_POOL,
        gpu_status=GpuDetector(probes if probes is not None else [monitor], platform="linux").status,
        detect_host=lambda measure: detect_host(measure_bandwidth=False),
        demo_path=demo_model_path,
        prefs_path=tmp_path / "config" / "settings.json",
        history_path=tmp_path / "data" / "runs.sqlite3",
        first_run_guide=False,
        poll_interval_ms=100,
        measure_bandwidth=False,
    )


def _no_driver() -> BaseException:
    import pynvml

    return pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)


def open_window(qtbot, services: Services) -> MainWindow:
    window = create_window(services)
    qtbot.addWidget(window)
    window.show()
    settle(qtbot, window)
    return window


def settle(qtbot, window: MainWindow, predicate=lambda v: True, timeout: int = 15000):
    """Wait until the newest request's view is on screen and satisfies ``predicate``."""
    qtbot.waitUntil(
        lambda: window.view is not None and not window.busy and bool(predicate(window.view)), timeout=timeout
    )
    return window.view


def split_totals(window: MainWindow) -> dict[str, int]:
    return {d.name: d.total_bytes for d in window.split_chart.shown}


def bar_heights_gib(window: MainWindow, index: int) -> float:
    """What the stacked bar of device ``index`` reaches on screen (GiB)."""
    bars = window.split_chart.bars
    return sum(float(bars[k].opts["height"][index]) for k in ("weights", "kv", "compute", "overhead"))


def catalog_targets(device_id: str, host_bytes: int) -> list:
    return [target_from_device(find_device(device_id)), host_ram_target(host_bytes)]


# -- start-up --------------------------------------------------------------------------------


def test_first_launch_opens_on_the_demo_model_on_this_cpu(qtbot, tmp_path, demo_gguf):
    window = open_window(qtbot, make_services(tmp_path))
    view = window.view
    assert view.request.model.kind == "demo"
    assert "Gemma 3 270M" in window.model_info.text() and "License" in window.model_info.text()
    # No GPU here: said in plain words, and the CPU carries on.
    assert "no NVIDIA driver" in window.hardware_view.gpu_message.text()
    assert [t.kind for t in view.targets] == ["cpu"]
    # The split chart holds the estimator's numbers for the real file.
    model = model_from_gguf(demo_gguf)
    est = estimate(
        model.arch,
        model.tensors,
        Controls(context_per_user_tokens=4096).settings(view.estimate.settings.repack),
        list(view.targets),
    )
    assert split_totals(window) == {est.devices[0].name: est.devices[0].total_bytes}
    assert bar_heights_gib(window, 0) == pytest.approx(est.devices[0].total_bytes / GIB, rel=1e-9)
    assert window.banner.level == "green"
    assert window.banner.headline.text().startswith("Fits, with ")


def test_real_gpu_detection_without_a_gpu_says_so(qtbot, tmp_path):
    services = make_services(tmp_path)
    services.gpu_status = GpuDetector().status  # the real NVML, sysfs and platform: no GPU on this machine
    window = open_window(qtbot, services)
    status = GpuDetector().status()
    if status.available:
        pytest.skip("this machine has a GPU")
    assert window.hardware_view.gpu_message.text() == status.message
    assert window.view.targets[0].kind == "cpu"


# -- every control drives the charts and the verdict ----------------------------------------


def test_context_slider_moves_every_chart_and_the_verdict(qtbot, tmp_path):
    window = open_window(qtbot, make_services(tmp_path))
    window.choose_model(ModelChoice(kind="catalog", ref="llama-3.1-8b", quant="Q4_K_M"))
    window.choose_hardware(HardwareChoice(kind="catalog", device_id="rtx-4090", host_ram_gib=64))
    settle(qtbot, window, lambda v: v.request.model.ref == "llama-3.1-8b" and v.estimate.devices[0].kind == "gpu")
    slider = window.context_control.slider
    position = window.context_control.position_of(16384)
    slider.setValue(position)
    view = settle(qtbot, window, lambda v: v.request.controls.context_per_user_tokens == 16384)
    assert window.context_control.spin.value() == 16384
    arch = view.model.arch
    targets = catalog_targets("rtx-4090", 64 * GIB)
    tensors = model_from_catalog("llama-3.1-8b", "Q4_K_M").tensors
    settings = Controls(context_per_user_tokens=16384).settings(view.estimate.settings.repack)
    est = estimate(arch, tensors, settings, targets)
    # Llama 3.1 8B, f16 cache: 32 layers x 2 x 1024 x 2 bytes x 16384 cells = 2 GiB exactly.
    assert est.kv_cache_bytes == 2 * GIB
    gpu_bar = window.split_chart.shown[0]
    assert gpu_bar.kv_cache_bytes == est.devices[0].kv_cache_bytes
    assert gpu_bar.total_bytes == est.devices[0].total_bytes
    assert window.context_chart.chosen.value() == pytest.approx(14.0)  # log2(16384)
    assert window.concurrency_chart.chosen_point == (16384, 1)
    assert "(16,384 tokens)" in window.banner.details.text()
    free = est.devices[0].capacity_bytes - est.devices[0].total_bytes
    assert window.banner.headline.text() == f"Fits, with {free / GIB:,.1f} GiB to spare."
    # The ladder's current bar is this model at this context.
    current = next(r for r in window.ladder_chart.shown if r.current)
    assert current.preset == "Q4_K_M" and current.budget_bytes == est.devices[0].total_bytes


def test_typed_context_beyond_the_slider_is_kept_and_explained(qtbot, tmp_path):
    window = open_window(qtbot, make_services(tmp_path))
    window.context_control.spin.setValue(65536)  # the demo model was trained on 32,768
    settle(qtbot, window, lambda v: v.request.controls.context_per_user_tokens == 65536)
    assert "longer than the 32,768 tokens the model was trained on" in window.banner.details.text()
    assert window.context_control.slider.value() == window.context_control.slider.maximum()


def test_users_cache_types_quantization_and_gpu_layers(qtbot, tmp_path):
    window = open_window(qtbot, make_services(tmp_path))
    window.choose_model(ModelChoice(kind="catalog", ref="qwen2.5-7b", quant="Q4_K_M"))
    window.choose_hardware(HardwareChoice(kind="catalog", device_id="rtx-4090", host_ram_gib=64))
    view = settle(qtbot, window, lambda v: v.request.model.ref == "qwen2.5-7b" and v.estimate is not None)
    targets = catalog_targets("rtx-4090", 64 * GIB)
    repack = view.estimate.settings.repack
    tensors = model_from_catalog("qwen2.5-7b", "Q4_K_M").tensors
    arch = view.model.arch

    window.users_spin.setValue(4)
    view = settle(qtbot, window, lambda v: v.request.controls.users == 4)
    s = Settings(context_tokens=4 * 4096, parallel_sequences=4, repack=repack)
    assert view.estimate.kv_cache_bytes == estimate(arch, tensors, s, targets).kv_cache_bytes
    assert window.concurrency_chart.chosen_point == (4096, 4)
    assert "remembering 4 conversations of 4,096 tokens each" in window.banner.details.text()

    window.ctk_combo.setCurrentIndex(window.ctk_combo.findData("q8_0"))
    window.ctk_combo.activated.emit(window.ctk_combo.currentIndex())
    view = settle(qtbot, window, lambda v: v.request.controls.cache_type_k == "q8_0")
    s = s.model_copy(update={"cache_type_k": "q8_0"})
    assert window.split_chart.shown[0].kv_cache_bytes == estimate(arch, tensors, s, targets).devices[0].kv_cache_bytes

    window.quant_combo.setCurrentIndex(window.quant_combo.findData("Q8_0"))
    window.quant_combo.activated.emit(window.quant_combo.currentIndex())
    view = settle(qtbot, window, lambda v: v.request.model.quant == "Q8_0")
    q8 = quantize_layout(arch, find_preset("Q8_0"))
    assert view.estimate.model_bytes == sum(t.n_bytes for t in q8)
    assert next(r for r in window.ladder_chart.shown if r.current).preset == "Q8_0"

    window.ngl_spin.setValue(10)
    view = settle(qtbot, window, lambda v: v.request.controls.gpu_layers == 10)
    assert view.estimate.gpu_layers == 10
    assert window.split_chart.shown[0].weights_bytes == view.estimate.devices[0].weights_bytes
    # Layers as the model card counts them (28), the output layer said apart.
    assert window.banner.level == "amber"
    assert "as chosen, 10 of the model's 28 layers are on the graphics card; the other 18 and the output layer" in (
        window.banner.headline.text()
    )


def test_quantized_v_cache_without_flash_attention_is_explained_not_changed(qtbot, tmp_path):
    window = open_window(qtbot, make_services(tmp_path))
    window.ctv_combo.setCurrentIndex(window.ctv_combo.findData("q8_0"))
    window.ctv_combo.activated.emit(window.ctv_combo.currentIndex())
    settle(qtbot, window, lambda v: v.request.controls.cache_type_v == "q8_0")
    window.fa_check.setChecked(False)
    view = settle(qtbot, window, lambda v: not v.request.controls.flash_attn)
    assert view.error and window.banner.level == "red"
    assert "needs flash attention" in window.banner.details.text()
    # The user's choices stay as they set them.
    assert window.ctv_combo.currentData() == "q8_0" and not window.fa_check.isChecked()
    window.fa_check.setChecked(True)
    settle(qtbot, window, lambda v: v.request.controls.flash_attn and not v.error)
    assert window.banner.level == "green"


def test_a_model_that_does_not_fit_is_red_and_the_ladder_greys_what_does_not_fit(qtbot, tmp_path):
    window = open_window(qtbot, make_services(tmp_path))
    window.choose_hardware(HardwareChoice(kind="catalog", device_id="rtx-4090", host_ram_gib=32))
    window.choose_model(ModelChoice(kind="catalog", ref="llama-3.1-70b", quant="Q4_K_M"))
    window.set_controls(Controls(context_per_user_tokens=8192, gpu_layers=81))
    view = settle(qtbot, window, lambda v: v.request.model.ref == "llama-3.1-70b" and v.request.controls.gpu_layers)
    assert not view.estimate.fits and window.banner.level == "red"
    gpu = view.estimate.devices[0]
    assert window.banner.headline.text() == (
        f"Does not fit: {gpu.name} needs {gpu.total_bytes / GIB:,.1f} GiB but has {gpu.capacity_bytes / GIB:,.1f} GiB "
        f"({-gpu.free_bytes / GIB:,.1f} GiB short)."
    )
    rows = window.ladder_chart.shown
    assert any(r.fits for r in rows) and any(not r.fits for r in rows)
    brushes = window.ladder_chart.bars.opts["brushes"]
    for r, brush in zip(rows, brushes, strict=True):
        expected = "#d6336c" if r.current else ("#4e79a7" if r.fits else "#b8b8b8")
        assert brush == expected
    # The verdict names a preset that fits, and that preset's bar is under the capacity line.
    suggested = next(r for r in rows if r.preset in window.banner.details.text() and r.fits)
    assert suggested.budget_bytes <= suggested.capacity_bytes


def test_two_catalog_gpus_get_two_bars_and_the_comparison_table(qtbot, tmp_path):
    window = open_window(qtbot, make_services(tmp_path))
    window.choose_model(ModelChoice(kind="catalog", ref="llama-3.1-70b", quant="Q4_K_M"))
    window.choose_hardware(HardwareChoice(kind="catalog", device_id="rtx-3090", count=2, host_ram_gib=64))
    window.compare_combos[0].setCurrentIndex(window.compare_combos[0].findData("catalog:a100-80gb"))
    window.compare_combos[0].activated.emit(window.compare_combos[0].currentIndex())
    view = settle(qtbot, window, lambda v: len(v.comparison) == 1 and v.request.hardware.count == 2)
    names = [d.name for d in window.split_chart.shown]
    assert names[:2] == ["NVIDIA GeForce RTX 3090 #1", "NVIDIA GeForce RTX 3090 #2"]
    assert window.compare_table.rowCount() == 2
    row = view.comparison[0]
    assert window.compare_table.item(1, 0).text() == "NVIDIA A100 80GB SXM" or "A100" in row.label
    assert window.compare_table.item(1, 1).text() == f"{row.budget_bytes / GIB:.1f} GiB"
    price = find_device("a100-80gb").price_usd
    assert window.compare_table.item(1, 5).text() == (f"${price:,.0f}" if price else "not listed")


def test_detected_gpu_shows_a_live_memory_bar_and_is_the_default_target(qtbot, tmp_path):
    nvml = FakeNvml([rtx_4090()])
    window = open_window(qtbot, make_services(tmp_path, nvml))
    bar = window.hardware_view.bars[0]
    gpu = nvml.gpus[0]
    assert bar.value() == int(1000 * gpu.used_bytes / gpu.total_bytes)
    assert "free 22.5 GiB of 24.0 GiB" in bar.format()
    assert (
        window.hardware_view.gpu_labels[0].text()
    ) == "GPU 0: NVIDIA GeForce RTX 4090 (1,008 GB/s, driver 550.54.15, CUDA 12.4)"
    view = window.view
    assert view.targets[0].name == "GPU 0: NVIDIA GeForce RTX 4090"
    assert view.targets[0].capacity_bytes == gpu.total_bytes - gpu.used_bytes
    # Another program takes 8 GiB: the bar follows within a poll and the estimate re-runs.
    gpu.used_bytes += 8 * GIB
    settle(qtbot, window, lambda v: v.targets[0].capacity_bytes == gpu.total_bytes - gpu.used_bytes)
    assert bar.value() == int(1000 * gpu.used_bytes / gpu.total_bytes)


# -- files -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [b"this is not a model at all" * 10, b"GGUF\x03\x00\x00\x00" + b"\xff" * 40],
    ids=["not-gguf", "corrupt-header"],
)
def test_a_bad_file_shows_a_message_and_keeps_the_window_usable(qtbot, tmp_path, content):
    window = open_window(qtbot, make_services(tmp_path))
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(content)
    with qtbot.waitSignal(window.error_shown, timeout=10000) as blocker:
        window.open_gguf(str(bad))
    assert "broken.gguf" in blocker.args[0]
    view = settle(qtbot, window, lambda v: v.request.model.kind == "demo")
    assert window.preferences.model.kind == "demo"
    # Still usable: the next control change produces a new estimate.
    window.users_spin.setValue(2)
    settle(qtbot, window, lambda v: v.request.controls.users == 2 and v is not view)


def test_a_truncated_copy_of_the_demo_model_is_refused_clearly(qtbot, tmp_path, demo_gguf):
    window = open_window(qtbot, make_services(tmp_path))
    cut = tmp_path / "cut.gguf"
    with open(demo_gguf, "rb") as f:
        cut.write_bytes(f.read(64 * 1024))
    with qtbot.waitSignal(window.error_shown, timeout=10000) as blocker:
        window.open_gguf(str(cut))
    assert "cut.gguf" in blocker.args[0]
    assert window.preferences.model.kind == "demo"


def test_a_real_gguf_file_opens_and_drops_work(qtbot, tmp_path, demo_gguf):
    window = open_window(qtbot, make_services(tmp_path))
    window.open_path(str(demo_gguf))
    view = settle(qtbot, window, lambda v: v.request.model.kind == "gguf")
    assert (
        view.model.quant == "Q4_K_M" and f"File: {demo_gguf.name} (in {demo_gguf.parent})" in window.model_info.text()
    )
    assert not window.quant_combo.isEnabled()
    with qtbot.waitSignal(window.error_shown, timeout=5000) as blocker:
        window.open_path(str(tmp_path / "notes.txt"))
    assert "neither a .gguf model nor a config.json" in blocker.args[0]


def test_import_config_json(qtbot, tmp_path):
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    window = open_window(qtbot, make_services(tmp_path))
    window.import_config(str(path))
    view = settle(qtbot, window, lambda v: v.request.model.kind == "hf_config")
    assert view.model.arch.n_layer == 16 and view.model.quant == "Q4_K_M"
    assert window.quant_combo.isEnabled()
    assert "16 layers; 8 KV heads; trained context 131,072 tokens" in window.model_info.text()


# -- memory between launches ----------------------------------------------------------------


def test_settings_and_geometry_come_back_after_a_restart(qtbot, tmp_path):
    services = make_services(tmp_path)
    window = open_window(qtbot, services)
    window.choose_model(ModelChoice(kind="catalog", ref="qwen3-8b", quant="Q5_K_M"))
    window.choose_hardware(HardwareChoice(kind="catalog", device_id="l40s"))
    window.context_control.spin.setValue(20480)
    window.users_spin.setValue(3)
    settle(
        qtbot, window, lambda v: v.request.controls.users == 3 and v.request.controls.context_per_user_tokens == 20480
    )
    window.resize(781, 641)  # inside the offscreen screen (800 x 800)
    window.close()
    saved, note = load_preferences(services.prefs_path)
    assert note == ""
    assert saved.model == ModelChoice(kind="catalog", ref="qwen3-8b", quant="Q5_K_M")
    assert saved.hardware.device_id == "l40s"

    again = open_window(qtbot, services)
    view = again.view
    assert view.request.model.ref == "qwen3-8b" and view.request.model.quant == "Q5_K_M"
    assert again.context_control.spin.value() == 20480 and again.users_spin.value() == 3
    assert again.target_combo.currentData() == "catalog:l40s"
    assert again.quant_combo.currentData() == "Q5_K_M"
    assert again.model_list.currentItem().data(Qt.ItemDataRole.UserRole) == ("catalog", "qwen3-8b")
    assert (again.width(), again.height()) == (781, 641)


def test_unreadable_saved_settings_fall_back_to_defaults_with_a_message(qtbot, tmp_path):
    services = make_services(tmp_path)
    services.prefs_path.parent.mkdir(parents=True)
    services.prefs_path.write_text('{"schema_version": 1, "controls": {"users": "many"}}')
    window = create_window(services)
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.error_shown, timeout=5000) as blocker:
        window.show()
    assert "could not be read" in blocker.args[0]
    assert window.preferences == Preferences()
    assert services.prefs_path.with_name("settings.json.bad").exists()


def test_a_saved_model_file_that_vanished_falls_back_to_the_demo(qtbot, tmp_path, demo_gguf):
    services = make_services(tmp_path)
    gone = tmp_path / "gone.gguf"
    prefs = Preferences(model=ModelChoice(kind="gguf", ref=str(gone)))
    services.prefs_path.parent.mkdir(parents=True)
    services.prefs_path.write_text(prefs.model_dump_json())
    window = create_window(services)
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.error_shown, timeout=10000) as blocker:
        window.show()
    assert "gone.gguf" in blocker.args[0]
    settle(qtbot, window, lambda v: v.request.model.kind == "demo")


# -- export, presentation, keyboard ----------------------------------------------------------


def test_exports_hold_the_numbers_on_screen(qtbot, tmp_path):
    window = open_window(qtbot, make_services(tmp_path))
    window.choose_model(ModelChoice(kind="catalog", ref="llama-3.1-8b", quant="Q4_K_M"))
    window.choose_hardware(HardwareChoice(kind="catalog", device_id="rtx-4090", host_ram_gib=64))
    window.context_control.spin.setValue(8192)
    view = settle(
        qtbot, window, lambda v: v.request.controls.context_per_user_tokens == 8192 and v.request.hardware.device_id
    )
    out = tmp_path / "out"
    out.mkdir()
    (json_path,) = window.export("json", out / "e.json")
    data = json.loads(json_path.read_text())
    assert data["kv_cache_bytes"] == 1073741824 == view.estimate.kv_cache_bytes
    assert data["total_bytes"] == view.estimate.total_bytes
    assert data["verdict"]["headline"] == window.banner.headline.text()
    (csv_path,) = window.export("csv", out / "e.csv")
    first = csv_path.read_text().split("\n\n")[0]
    rows = list(csv.DictReader(io.StringIO(first)))
    assert {r["device"]: int(r["total_bytes"]) for r in rows} == {d.name: d.total_bytes for d in view.estimate.devices}
    pngs = window.export("png", out / "charts")
    assert len(pngs) == 4
    for p in pngs:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 2000
    (html_path,) = window.export("html", out / "r.html")
    html = html_path.read_text()
    assert html.count("data:image/png;base64,") == 4
    assert window.banner.headline.text() in html
    text = window.copy_command()
    assert "llama-server" in text and "-c 8192" in text and "-ngl 33" in text
    from PySide6.QtGui import QGuiApplication

    assert QGuiApplication.clipboard().text() == text


def test_export_to_an_unwritable_place_says_so(qtbot, tmp_path):
    window = open_window(qtbot, make_services(tmp_path))
    from app.core.common.errors import FitScopeError

    with pytest.raises(FitScopeError, match="Could not write"):
        window.export("json", tmp_path / "no-such-dir" / "e.json")


def test_presentation_mode_enlarges_type_hides_advanced_controls_and_is_remembered(qtbot, tmp_path):
    services = make_services(tmp_path)
    window = open_window(qtbot, services)
    normal = window.centralWidget().font().pointSizeF()
    assert window.advanced.isVisible()
    window.presentation_action.trigger()
    assert window.presentation and not window.advanced.isVisible() and not window.hardware_view.isVisible()
    assert window.centralWidget().font().pointSizeF() == pytest.approx(normal * 1.6)
    assert window.split_chart.plotItem.titleLabel.opts["size"] == "17pt"
    window.close()
    again = open_window(qtbot, services)
    assert again.presentation and not again.advanced.isVisible()


def test_hover_shows_exact_figures(qtbot, tmp_path):
    window = open_window(qtbot, make_services(tmp_path))
    d = window.split_chart.shown[0]
    text = window.split_chart.hover_text(0.0, 0.1)
    assert f"Total: {d.total_bytes / GIB:.2f} of {d.capacity_bytes / GIB:.2f} GiB" in text
    assert window.split_chart.hover_text(3.0, 0.1) is None
    row = window.ladder_chart.shown[0]
    assert window.ladder_chart.hover_text(0.1, 0.0).startswith(f"{row.preset}: ")
    curve = window.context_chart.shown
    assert window.context_chart.hover_text(9.0, 0).startswith("512 tokens per user")
    assert f"Largest context that fits: {curve.max_context_tokens:,} tokens" in window.context_chart.hover_text(9, 0)


def test_standard_shortcuts_are_bound(qtbot, tmp_path):
    window = open_window(qtbot, make_services(tmp_path))
    actions = [a for m in window.menuBar().actions() for a in m.menu().actions()]
    shortcuts = {a.text().replace("&", ""): a.shortcut() for a in actions}
    assert shortcuts["Open GGUF…"] == QKeySequence(QKeySequence.StandardKey.Open)
    assert shortcuts["Quit"] == QKeySequence(QKeySequence.StandardKey.Quit)
    assert shortcuts["Presentation mode"] == QKeySequence("F5")
    assert shortcuts["Export report (HTML)…"] == QKeySequence("Ctrl+E")
    assert shortcuts["Full screen"] == QKeySequence(QKeySequence.StandardKey.FullScreen)
    # Every control can take keyboard focus.
    for widget in (
        window.target_combo,
        window.model_list,
        window.context_control.slider,
        window.users_spin,
        window.quant_combo,
        window.ctk_combo,
        window.ctv_combo,
        window.fa_check,
        window.ngl_spin,
    ):
        assert widget.focusPolicy() & Qt.FocusPolicy.TabFocus


def test_dropping_a_gguf_file_opens_it(qtbot, tmp_path, demo_gguf):
    from PySide6.QtCore import QMimeData, QPointF, QUrl
    from PySide6.QtGui import QDragEnterEvent, QDropEvent

    window = open_window(qtbot, make_services(tmp_path))
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(demo_gguf))])
    enter = QDragEnterEvent(
        QPointF(10, 10).toPoint(),
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    window.dragEnterEvent(enter)
    assert enter.isAccepted()
    drop = QDropEvent(
        QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
    )
    window.dropEvent(drop)
    view = settle(qtbot, window, lambda v: v.request.model.kind == "gguf")
    assert view.request.model.ref == str(demo_gguf)


def test_charts_follow_a_dark_palette(qtbot, tmp_path):
    from PySide6.QtGui import QColor, QPalette

    window = open_window(qtbot, make_services(tmp_path))
    dark = QPalette()
    dark.setColor(QPalette.ColorRole.Base, QColor("#1e1e1e"))
    dark.setColor(QPalette.ColorRole.Text, QColor("#e6e6e6"))
    window.setPalette(dark)  # what a switch to the system's dark theme does
    for chart in window.charts.values():
        assert chart.backgroundBrush().color().name() == "#1e1e1e"
        assert chart.plotItem.getAxis("left").textPen().color().name() == "#e6e6e6"


def test_build_program_and_experts_controls_change_the_estimate(qtbot, tmp_path):
    window = open_window(qtbot, make_services(tmp_path))
    window.choose_model(ModelChoice(kind="catalog", ref="llama-3.1-70b", quant="Q4_K_M"))
    window.choose_hardware(HardwareChoice(kind="catalog", device_id="rtx-4090", host_ram_gib=64))
    view = settle(qtbot, window, lambda v: v.request.model.ref == "llama-3.1-70b" and v.estimate is not None)
    # A CUDA build by default: the layers left in RAM are mapped, nothing repacked, and the verdict
    # says the model runs partly in system memory, with its speed.
    assert view.estimate.backend == "cuda" and view.estimate.repack_bytes == 0
    assert window.banner.headline.text().startswith("Runs partly in system memory, at about ")
    window.backend_combo.setCurrentIndex(window.backend_combo.findData("cpu"))
    window.backend_combo.activated.emit(window.backend_combo.currentIndex())
    view = settle(qtbot, window, lambda v: v.request.controls.backend == "cpu")
    assert view.estimate.backend == "cpu" and view.estimate.repack_bytes > 0
    # A mixture of experts: the experts control is enabled, and N layers' experts move to RAM.
    window.choose_model(ModelChoice(kind="catalog", ref="qwen3-30b-a3b", quant="Q4_K_M"))
    window.backend_combo.setCurrentIndex(window.backend_combo.findData("auto"))
    window.backend_combo.activated.emit(window.backend_combo.currentIndex())
    settle(qtbot, window, lambda v: v.request.model.ref == "qwen3-30b-a3b" and v.request.controls.backend == "auto")
    assert window.cpu_moe_spin.isEnabled()
    window.ngl_spin.setValue(49)
    window.cpu_moe_spin.setValue(48)
    view = settle(qtbot, window, lambda v: v.request.controls.n_cpu_moe == 48)
    gpu, host = view.estimate.devices
    assert view.estimate.cpu_moe_layers == 48 and gpu.weights_bytes < 2 * GIB < host.weights_bytes
    assert "the whole model is on the graphics card except its experts, which stay in system memory" in (
        window.banner.headline.text()
    )


def test_four_machines_side_by_side_for_one_model(qtbot, tmp_path):
    # An RTX 4090 box, a Mac Studio, a DGX Spark and an EPYC server for Llama 3.3 70B.
    window = open_window(qtbot, make_services(tmp_path))
    window.choose_model(ModelChoice(kind="catalog", ref="llama-3.3-70b", quant="Q4_K_M"))
    window.choose_hardware(HardwareChoice(kind="catalog", device_id="rtx-4090", host_ram_gib=64))
    for combo, device in zip(window.compare_combos, ("m2-ultra-192gb", "dgx-spark", "epyc-9655"), strict=True):
        combo.setCurrentIndex(combo.findData(f"catalog:{device}"))
        combo.activated.emit(combo.currentIndex())
    view = settle(qtbot, window, lambda v: len(v.comparison) == 3 and v.request.model.ref == "llama-3.3-70b")
    assert window.compare_table.rowCount() == 4
    labels = [window.compare_table.item(i, 0).text() for i in range(4)]
    assert any("M2 Ultra" in x for x in labels) and any("DGX Spark" in x for x in labels)
    assert any("EPYC 9655" in x for x in labels)
    speeds = {r.label: r.decode_tokens_per_s for r in view.comparison}
    mac = next(v for k, v in speeds.items() if "M2 Ultra" in k)
    spark = next(v for k, v in speeds.items() if "DGX Spark" in k)
    epyc = next(v for k, v in speeds.items() if "EPYC" in k)
    # 800 GB/s of unified memory beats 273 GB/s and a CPU server's 576 GB/s read by CPU cores.
    assert mac.low > spark.high and mac.low > epyc.low
    assert all(r.fits for r in view.comparison)


def test_picking_another_model_starts_on_its_usual_file(qtbot, tmp_path):
    # Q8_0 chosen for one model silently carried over to the next (changing its answers).
    window = open_window(qtbot, make_services(tmp_path))
    window.choose_model(ModelChoice(kind="catalog", ref="qwen2.5-7b", quant="Q8_0"))
    settle(qtbot, window, lambda v: v.request.model.quant == "Q8_0")
    for i in range(window.model_list.count()):
        if window.model_list.item(i).data(Qt.ItemDataRole.UserRole) == ("catalog", "qwen2.5-14b"):
            window.model_list.setCurrentRow(i)
    view = settle(qtbot, window, lambda v: v.request.model.ref == "qwen2.5-14b")
    assert view.request.model.quant == "Q4_K_M" and window.quant_combo.currentData() == "Q4_K_M"
    for i in range(window.model_list.count()):
        if window.model_list.item(i).data(Qt.ItemDataRole.UserRole) == ("catalog", "gpt-oss-20b"):
            window.model_list.setCurrentRow(i)
    view = settle(qtbot, window, lambda v: v.request.model.ref == "gpt-oss-20b")
    assert view.request.model.quant == "MXFP4_MOE"


def test_the_model_list_groups_families_and_finds_them_by_name(qtbot, tmp_path):
    """A buyer types "Qwen3.5" or "Gemma 4": that family's heading and models stay, the rest hide;
    a heading is not a model one can pick."""
    window = open_window(qtbot, make_services(tmp_path))

    def visible() -> list[tuple[str, str]]:
        out = []
        for i in range(window.model_list.count()):
            item = window.model_list.item(i)
            if not item.isHidden():
                out.append(item.data(Qt.ItemDataRole.UserRole))
        return out

    window.model_search.setText("Qwen3.5")
    shown = visible()
    assert ("family", "Qwen3.5 / Qwen3.6") in shown
    assert {("catalog", "qwen3.5-27b"), ("catalog", "qwen3.6-35b-a3b"), ("catalog", "qwen3.5-397b-a17b")} <= set(shown)
    assert not any(ref.startswith(("llama", "gemma")) for kind, ref in shown if kind == "catalog")

    window.model_search.setText("gemma 4")
    shown = visible()
    gemma_4 = ["gemma-4-e2b", "gemma-4-e4b", "gemma-4-26b-a4b", "gemma-4-31b"]
    assert [ref for kind, ref in shown if kind == "catalog"] == gemma_4
    assert ("family", "Gemma 4") in shown and ("family", "Gemma 3") not in shown

    window.model_search.setText("")
    rows = range(window.model_list.count())
    heading = next(i for i in rows if window.model_list.item(i).data(Qt.ItemDataRole.UserRole)[0] == "family")
    assert not window.model_list.item(heading).flags() & Qt.ItemFlag.ItemIsSelectable


def test_speculative_decoding_is_its_own_part_of_the_memory_split(qtbot, tmp_path, demo_gguf):
    """The model's MTP head (offered only for a model that has one) and a draft model file are each a
    segment of the device bars, and their flags are in the llama-server command."""
    window = open_window(qtbot, make_services(tmp_path))
    window.choose_hardware(HardwareChoice(kind="catalog", device_id="rtx-5090", host_ram_gib=64))
    window.choose_model(ModelChoice(kind="catalog", ref="qwen3.5-27b"))
    settle(qtbot, window, lambda v: v.request.model.ref == "qwen3.5-27b")
    combo = window.speculative_combo
    kinds = [combo.itemData(i) for i in range(combo.count())]
    assert kinds == ["off", "mtp", "file"]
    combo.setCurrentIndex(1)
    combo.activated.emit(1)
    view = settle(qtbot, window, lambda v: v.estimate is not None and v.estimate.speculative is not None)
    gpu_bar = window.split_chart.shown[0]
    assert gpu_bar.speculative_bytes == view.estimate.devices[0].speculative_bytes > 0
    assert "--spec-type draft-mtp" in window.command_text.toPlainText()

    window.choose_model(ModelChoice(kind="catalog", ref="llama-3.1-8b"))  # no MTP head: drafting stops
    view = settle(qtbot, window, lambda v: v.request.model.ref == "llama-3.1-8b")
    assert view.estimate.speculative is None
    assert [combo.itemData(i) for i in range(combo.count())] == ["off", "file"]

    window.choose_draft_file(demo_gguf)
    view = settle(qtbot, window, lambda v: v.estimate is not None and v.estimate.speculative is not None)
    assert view.estimate.speculative.spec.kind == "draft"
    assert window.split_chart.shown[0].speculative_bytes > 0
    assert f"-md {demo_gguf.name}" in window.command_text.toPlainText()
    assert combo.currentData() == "draft"
