"""The window's "Fastest settings" dialog and the host controls beside catalog GPUs (PCIe link,
CPU cores), driven as a person would."""

from __future__ import annotations

from app.core.report.choices import HardwareChoice, ModelChoice
from app.ui.tuning_dialog import FastestDialog
from tests.test_window import make_services, open_window, settle


def test_the_pcie_link_and_cpu_cores_beside_a_catalog_gpu_change_the_hybrid_speed(qtbot, tmp_path):
    window = open_window(qtbot, make_services(tmp_path))
    window.choose_model(ModelChoice(kind="catalog", ref="gpt-oss-120b", quant="MXFP4_MOE"))
    window.choose_hardware(HardwareChoice(kind="catalog", device_id="rtx-4070", host_ram_gib=64))
    box = window.controls.hardware_box
    view = settle(qtbot, window, lambda v: v.request.hardware.device_id == "rtx-4070")
    assert box.pcie_combo.isEnabled() and box.host_cores_spin.isEnabled()
    x16 = view.speed.prefill_tokens_per_s.high
    box.pcie_combo.setCurrentIndex(box.pcie_combo.findData("3x4"))
    box.pcie_combo.activated.emit(box.pcie_combo.currentIndex())
    view = settle(qtbot, window, lambda v: v.request.hardware.pcie == "3x4")
    # An eGPU-class link copies the experts in RAM to the GPU far slower on every prompt ubatch.
    assert view.speed.prefill_tokens_per_s.high < x16 / 3
    assert window.preferences.hardware.pcie == "3x4"
    box.host_cores_spin.setValue(4)
    view = settle(qtbot, window, lambda v: v.request.hardware.host_cores == 4)
    assert any("4 CPU thread" in a for a in view.speed.assumptions)


def test_any_host_memory_typed_beside_a_catalog_gpu_sets_the_hybrid_decode(qtbot, tmp_path):
    """The memory type is typed as a person has it ("DDR4-2666, 2 channels"); words it cannot read are
    said under it and leave the estimate as it was; a generation without a speed widens the decode range."""
    window = open_window(qtbot, make_services(tmp_path))
    window.choose_model(ModelChoice(kind="catalog", ref="gpt-oss-120b", quant="MXFP4_MOE"))
    window.choose_hardware(HardwareChoice(kind="catalog", device_id="rtx-4070", host_ram_gib=64))
    box = window.controls.hardware_box
    view = settle(qtbot, window, lambda v: v.request.hardware.device_id == "rtx-4070")
    ddr5 = view.speed.decode_tokens_per_s
    combo = box.host_memory_combo
    combo.setEditText("DDR4-2666, 2 channels")
    combo.lineEdit().editingFinished.emit()
    view = settle(qtbot, window, lambda v: v.request.hardware.host_memory == "ddr4-2666-2ch")
    ddr4 = view.speed.decode_tokens_per_s
    # 42.7 GB/s against DDR5-5600's 89.6: the experts in RAM are read at half the rate.
    assert ddr4.high < 0.7 * ddr5.high
    assert window.preferences.hardware.host_memory == "ddr4-2666-2ch"
    combo.setEditText("DDR4 at 9000, two sticks")
    combo.lineEdit().editingFinished.emit()
    assert not box.host_memory_error.isHidden() and "ddr4-2666-2ch" in box.host_memory_error.text()
    assert window.preferences.hardware.host_memory == "ddr4-2666-2ch"
    combo.setEditText("DDR4, 2 channels")
    combo.lineEdit().editingFinished.emit()
    view = settle(qtbot, window, lambda v: v.request.hardware.host_memory == "ddr4-2ch")
    assert box.host_memory_error.isHidden()
    box.show_choices(window.preferences.hardware, ())
    assert combo.currentText() == "DDR4, speed not stated, 2 channels, 34-58 GB/s"
    # A settings file naming memory it cannot read shows it and says why, without failing.
    box.show_choices(HardwareChoice(kind="catalog", device_id="rtx-4070", host_memory="ddr9-2ch"), ())
    assert combo.currentText() == "ddr9-2ch" and not box.host_memory_error.isHidden()
    unstated = view.speed.decode_tokens_per_s
    assert unstated.low < ddr4.low and any("speed is not stated" in a for a in view.speed.assumptions)


def test_fastest_settings_lists_three_and_use_puts_one_on_the_controls(qtbot, tmp_path):
    window = open_window(qtbot, make_services(tmp_path))
    window.choose_model(ModelChoice(kind="catalog", ref="gpt-oss-120b", quant="MXFP4_MOE"))
    window.choose_hardware(HardwareChoice(kind="catalog", device_id="rtx-4070", host_ram_gib=64))
    settle(qtbot, window, lambda v: v.request.hardware.device_id == "rtx-4070")
    window.controls.fastest_button.click()
    qtbot.waitUntil(lambda: bool(window.findChildren(FastestDialog)), timeout=5000)
    dialog = window.findChildren(FastestDialog)[-1]
    qtbot.waitUntil(lambda: dialog.found is not None, timeout=30000)
    assert dialog.table.rowCount() == 3
    assert "--n-cpu-moe" in dialog.command.toPlainText()
    dialog.table.selectRow(2)
    chosen = dialog.selected()
    assert chosen is not None and chosen.rank == 3
    dialog.use_selected()
    view = settle(qtbot, window, lambda v: v.request.controls.n_cpu_moe == chosen.candidate.plan.n_cpu_moe)
    controls = view.request.controls
    assert controls.cache_type_k == chosen.candidate.settings.cache_type_k
    assert window.ctk_combo.currentData() == chosen.candidate.settings.cache_type_k
    assert window.cpu_moe_spin.value() == chosen.candidate.plan.n_cpu_moe
