"""The Hardware box at the top of the main window's controls: this machine's devices (memory bars,
CPU and RAM), what to estimate for (this machine, its CPU only, or catalog hardware with a GPU
count, the host RAM beside it and its memory type) and up to three more to compare with.

Edits are emitted as the new choice (``hardware_edited``, ``compare_edited``); ``show_choices``
puts saved choices on the widgets without emitting either.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.core.hardware.devices import DeviceSpec
from app.core.hardware.host_memory import DEFAULT_HOST_MEMORY, HOST_MEMORY, PCIE_CHOICES, parse_host_memory
from app.core.report.choices import HardwareChoice
from app.core.report.prefs import MAX_COMPARED
from app.ui.panels import DeviceCombo, HardwareView, device_label, device_tooltip


def select_combo(combo: QComboBox, data: Any) -> None:
    """Show the item whose data is ``data`` (the first item when none has it)."""
    index = next((i for i in range(combo.count()) if combo.itemData(i) == data), 0)
    combo.setCurrentIndex(index)
    line = combo.lineEdit()
    if line is not None:
        line.setCursorPosition(0)  # show the start of a long name


def hardware_key(choice: HardwareChoice) -> str:
    """The hardware combo boxes' item data: "local", "cpu" or "catalog:<device id>"."""
    return f"catalog:{choice.device_id}" if choice.kind == "catalog" else choice.kind


class HardwareBox(QGroupBox):
    """This machine, the hardware to estimate for, and the hardware to compare with."""

    hardware_edited = Signal(object)  # HardwareChoice
    compare_edited = Signal(object)  # tuple[HardwareChoice, ...]

    def __init__(self, devices: Iterable[DeviceSpec], parent: QWidget | None = None) -> None:
        super().__init__("&Hardware", parent)
        self._devices = {d.id: d for d in devices}
        self._updating = False  # True while choices are put on the widgets: no edits are emitted
        hw_layout = QVBoxLayout(self)
        self.hardware_view = HardwareView()
        hw_layout.addWidget(self.hardware_view)
        form = QFormLayout()
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapAllRows)
        self.target_combo = self._device_combo(include_local=True)
        self.target_combo.setAccessibleName("Hardware to estimate for")
        self.count_spin = QSpinBox()
        self.count_spin.setRange(1, 8)
        self.count_spin.setSuffix(" GPU(s)")
        self.host_ram_spin = QDoubleSpinBox()
        self.host_ram_spin.setRange(0, 65536)
        self.host_ram_spin.setDecimals(0)
        self.host_ram_spin.setSuffix(" GiB")
        self.host_ram_spin.setSpecialValueText("this machine's")
        self.host_ram_spin.setToolTip(
            "System memory beside the GPUs (holds the token embedding and any layers left on the CPU)"
        )
        row = QHBoxLayout()
        row.addWidget(self.count_spin)
        row.addWidget(QLabel("host RAM"))
        row.addWidget(self.host_ram_spin)
        # The presets, and any DDR generation, speed and channels typed in ("DDR4-2666, 2 channels").
        self.host_memory_combo = QComboBox()
        self.host_memory_combo.setEditable(True)
        self.host_memory_combo.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        for key, (memory_label, peak) in HOST_MEMORY.items():
            # The kind of machine it belongs to goes in the item's tooltip, so the choice reads whole.
            self.host_memory_combo.addItem(f"{memory_label.split(' (')[0]}, {peak:.0f} GB/s", key)
            self.host_memory_combo.setItemData(
                self.host_memory_combo.count() - 1, f"{memory_label}: {peak:.0f} GB/s", Qt.ItemDataRole.ToolTipRole
            )
        self.host_memory_combo.setAccessibleName("Host memory type")
        self.host_memory_combo.setToolTip(
            "The system memory of the box: how fast layers and experts left in system memory are read. Pick one "
            "or type its generation, speed and channels, e.g. DDR4-2666, 2 channels (DDR4, 2 channels when the "
            "speed is not known: the decode range spans the generation's speeds)"
        )
        self.host_memory_error = QLabel()
        self.host_memory_error.setWordWrap(True)
        self.host_memory_error.setStyleSheet("color: #b00020")
        self.host_memory_error.hide()
        self._host_memory = DEFAULT_HOST_MEMORY  # the last memory type read from the combo
        self.pcie_combo = QComboBox()
        self.pcie_combo.addItem("PCIe as the card is sold", "")
        for link in PCIE_CHOICES:
            gen, lanes = link.split("x")
            self.pcie_combo.addItem(f"PCIe {gen}.0 x{lanes}", link)
        self.pcie_combo.setAccessibleName("PCIe link of the GPUs")
        self.pcie_combo.setToolTip(
            "The GPUs' link to the host: with weights in system memory, each prompt ubatch copies them over it "
            "(an x4 slot or a Thunderbolt eGPU is far slower than x16); this machine's GPUs report their own"
        )
        self.host_cores_spin = QSpinBox()
        self.host_cores_spin.setRange(0, 1024)
        self.host_cores_spin.setSpecialValueText("CPU cores: by memory type")
        self.host_cores_spin.setSuffix(" CPU cores")
        self.host_cores_spin.setAccessibleName("CPU cores beside the GPUs")
        self.host_cores_spin.setToolTip(
            "Physical cores of the CPU beside catalog GPUs: they compute the layers and experts left in system memory"
        )
        form.addRow("Estimate &for", self.target_combo)
        form.addRow("", row)
        form.addRow("", self.host_memory_combo)
        form.addRow("", self.host_memory_error)
        form.addRow("", self.host_cores_spin)
        form.addRow("", self.pcie_combo)
        self.compare_combos: list[QComboBox] = []
        self.compare_counts: list[QSpinBox] = []
        self.compare_box = QWidget()
        compare_form = QFormLayout(self.compare_box)
        compare_form.setContentsMargins(0, 0, 0, 0)
        # Each label above its list, so a device's name has the panel's whole width.
        compare_form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapAllRows)
        for i in range(MAX_COMPARED - 1):
            combo = self._device_combo(include_local=True, include_none=True)
            combo.setAccessibleName(f"Compare with, choice {i + 1}")
            count = QSpinBox()
            count.setRange(1, 8)
            count.setSuffix("x")
            line = QHBoxLayout()
            line.addWidget(combo, 1)
            line.addWidget(count)
            label = QLabel(f"Compare with &{i + 1}")
            label.setBuddy(combo)
            compare_form.addRow(label, line)
            self.compare_combos.append(combo)
            self.compare_counts.append(count)
        hw_layout.addLayout(form)
        hw_layout.addWidget(self.compare_box)

        self.target_combo.activated.connect(self._hardware_edited)
        self.count_spin.valueChanged.connect(self._hardware_edited)
        self.host_ram_spin.valueChanged.connect(self._hardware_edited)
        for combo, count in zip(self.compare_combos, self.compare_counts, strict=True):
            combo.activated.connect(self._compare_edited)
            count.valueChanged.connect(self._compare_edited)
        self.host_memory_combo.activated.connect(self._host_memory_edited)
        memory_edit = self.host_memory_combo.lineEdit()
        if memory_edit is not None:
            memory_edit.editingFinished.connect(self._host_memory_edited)
        self.pcie_combo.activated.connect(self._hardware_edited)
        self.host_cores_spin.valueChanged.connect(self._hardware_edited)

    def _device_combo(self, include_local: bool, include_none: bool = False) -> QComboBox:
        combo = DeviceCombo()
        if include_none:
            combo.addItem("(nothing)", "")
        if include_local:
            combo.addItem("This machine", "local")
            combo.addItem("This machine's CPU only", "cpu")
        for d in self._devices.values():
            combo.addItem(device_label(d), f"catalog:{d.id}")
            combo.setItemData(combo.count() - 1, device_tooltip(d), Qt.ItemDataRole.ToolTipRole)
        return combo

    def show_choices(self, hardware: HardwareChoice, compare: Sequence[HardwareChoice]) -> None:
        """Put the hardware to estimate for and to compare with on the widgets."""
        self._updating = True
        try:
            select_combo(self.target_combo, hardware_key(hardware))
            self.count_spin.setValue(hardware.count)
            self.host_ram_spin.setValue(hardware.host_ram_gib or 0)
            for i, combo in enumerate(self.compare_combos):
                choice = compare[i] if i < len(compare) else None
                select_combo(combo, hardware_key(choice) if choice else "")
                self.compare_counts[i].setValue(choice.count if choice else 1)
            self._show_host_memory(hardware.host_memory)
            select_combo(self.pcie_combo, hardware.pcie or "")
            self.host_cores_spin.setValue(hardware.host_cores or 0)
        finally:
            self._updating = False

    def update_widgets(self, hardware: HardwareChoice) -> None:
        """GPU count, host RAM and host memory type apply to catalog GPUs only (not to this machine,
        nor to unified-memory machines)."""
        device = self._devices.get(hardware.device_id or "")
        multi = hardware.kind == "catalog" and device is not None and device.memory_kind != "unified"
        self.count_spin.setEnabled(multi)
        self.host_ram_spin.setEnabled(multi)
        self.host_memory_combo.setEnabled(multi)
        self.host_cores_spin.setEnabled(multi)
        # This machine's GPUs report their link, but a riser or an eGPU may be worth trying.
        self.pcie_combo.setEnabled(multi or hardware.kind == "local")
        try:
            cores = parse_host_memory(self._host_memory).cores
        except ValueError:
            cores = parse_host_memory(None).cores
        self.host_cores_spin.setSpecialValueText(f"CPU cores: {cores}")

    def _show_host_memory(self, key: str | None) -> None:
        """Put a memory type on the combo: its preset's item, or its own words."""
        try:
            memory = parse_host_memory(key)
        except ValueError as exc:
            # A saved choice it cannot read (an edited settings file): shown as it is, and said why.
            self._host_memory = key or ""
            self.host_memory_combo.setEditText(key or "")
            self._say_memory_error(str(exc))
            return
        self._host_memory = memory.key
        self._say_memory_error("")
        index = self.host_memory_combo.findData(memory.key)
        if index >= 0:
            self.host_memory_combo.setCurrentIndex(index)
        else:
            rate = (
                f"{memory.peak_gb_s:.0f}" if memory.speed_stated else f"{memory.slow_gb_s:.0f}-{memory.fast_gb_s:.0f}"
            )
            self.host_memory_combo.setEditText(f"{memory.label}, {rate} GB/s")

    def _say_memory_error(self, text: str) -> None:
        """Say under the memory type box why its words cannot be read; hidden when ``text`` is empty."""
        self.host_memory_error.setText(text)
        self.host_memory_error.setVisible(bool(text))

    def _host_memory_edited(self, *_args: Any) -> None:
        """Read the memory type from the combo's text; words it cannot read are said below it and
        change nothing."""
        if self._updating:
            return
        try:
            key = parse_host_memory(self.host_memory_combo.currentText()).key
        except ValueError as exc:
            self._say_memory_error(str(exc))
            return
        self._say_memory_error("")
        if key != self._host_memory:
            self._host_memory = key
            self._hardware_edited()

    def _hardware_edited(self, *_args: Any) -> None:
        if self._updating:
            return
        data = self.target_combo.currentData()
        if not data:
            return
        line = self.target_combo.lineEdit()
        if line is not None:
            line.setCursorPosition(0)
        kind, _, device_id = data.partition(":")
        ram = self.host_ram_spin.value() or None
        choice = HardwareChoice(
            kind=kind,
            device_id=device_id or None,
            count=self.count_spin.value(),
            host_ram_gib=ram,
            host_memory=self._host_memory,
            host_cores=self.host_cores_spin.value() or None,
            pcie=self.pcie_combo.currentData() or None,
        )
        self.hardware_edited.emit(choice)

    def _compare_edited(self, *_args: Any) -> None:
        if self._updating:
            return
        choices = []
        for combo, count in zip(self.compare_combos, self.compare_counts, strict=True):
            data = combo.currentData()
            if data:
                kind, _, device_id = data.partition(":")
                choices.append(HardwareChoice(kind=kind, device_id=device_id or None, count=count.value()))
        self.compare_edited.emit(tuple(choices))
