"""The window's panels: the verdict banner, the detected hardware, the hardware lists' labels and
the tables' helpers."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QCompleter,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.core.advisor.configs import machine_price
from app.core.hardware.devices import DeviceSpec
from app.core.hardware.snapshots import GpuSnapshot, HostSnapshot
from app.core.report.machine_text import gpu_bar, gpu_label, gpu_source, host_label, short_device_name
from app.core.report.verdict import Verdict


def readonly_table(headers: Sequence[str] = (), stretch_last: bool = False) -> QTableWidget:
    """A table of figures: not editable, no row numbers, columns as wide as their contents."""
    table = QTableWidget(0, len(headers))
    table.setHorizontalHeaderLabels(list(headers))
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.verticalHeader().setVisible(False)
    table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    table.horizontalHeader().setStretchLastSection(stretch_last)
    return table


def fill_table(table: QTableWidget, rows: Sequence[Sequence[str]]) -> None:
    """Show ``rows`` of text, reusing the cells already there (a slider step refills tables)."""
    table.setRowCount(len(rows))
    for r, cells in enumerate(rows):
        for c, text in enumerate(cells):
            item = table.item(r, c)
            if item is None:
                table.setItem(r, c, QTableWidgetItem(text))
            else:
                item.setText(text)


LIGHTS = {"green": "#2e9d4a", "amber": "#e0a100", "red": "#d23c3c"}
LIGHT_WORDS = {"green": "Fits", "amber": "Tight", "red": "Does not fit"}


class VerdictBanner(QFrame):
    """The answer in plain words with a green / amber / red light."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.light = QLabel()
        self.light.setFixedSize(28, 28)
        self.light_word = QLabel()
        self.light_word.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.headline = QLabel("Working it out…")
        self.headline.setWordWrap(True)
        self.headline.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details = QLabel("")
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        left = QVBoxLayout()
        left.addWidget(self.light, 0, Qt.AlignmentFlag.AlignHCenter)
        left.addWidget(self.light_word)
        left.addStretch(1)
        text = QVBoxLayout()
        text.addWidget(self.headline)
        text.addWidget(self.details)
        layout = QHBoxLayout(self)
        layout.addLayout(left)
        layout.addLayout(text, 1)
        self.level = ""
        self.set_scale(1.0)

    def set_scale(self, scale: float) -> None:
        """Type sizes for ``scale`` (presentation mode's is above 1: the headline, already large, then
        grows less than the rest, so that the charts keep the room on a 720-line projector)."""
        base = self.font().pointSizeF()
        headline = 1.35 if scale <= 1 else 1.05
        details = 1.05 if scale <= 1 else 0.9
        self.headline.setStyleSheet(f"font-weight: 600; font-size: {base * headline * scale:.1f}pt;")
        self.details.setStyleSheet(f"font-size: {base * details * scale:.1f}pt;")
        size = int(28 * scale)
        self.light.setFixedSize(size, size)
        self._paint_light()

    def _paint_light(self) -> None:
        color = LIGHTS.get(self.level, "#9c9c9c")
        radius = self.light.width() // 2
        self.light.setStyleSheet(f"background: {color}; border-radius: {radius}px;")

    def set_verdict(self, verdict: Verdict) -> None:
        self.level = verdict.level
        self.headline.setText(verdict.headline)
        self.details.setText(" ".join(verdict.sentences))
        self.light_word.setText(LIGHT_WORDS[verdict.level])
        self.light.setAccessibleName(f"{verdict.level} light")
        self.setAccessibleDescription(verdict.text)
        self._paint_light()

    def set_message(self, level: str, headline: str, details: str = "") -> None:
        self.level = level
        self.headline.setText(headline)
        self.details.setText(details)
        self.light_word.setText(LIGHT_WORDS.get(level, ""))
        self._paint_light()


class HardwareView(QWidget):
    """What this machine has: each GPU (any vendor) with a live memory bar and what limits its
    memory, then the CPU and RAM. The words are ``app.core.report.machine_text``'s, as ``fitscope hw``
    prints them."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._grid = QGridLayout(self)
        self._grid.setContentsMargins(0, 0, 0, 0)
        self.gpu_message = QLabel("")
        self.gpu_message.setWordWrap(True)
        self.host_label = QLabel("")
        self.host_label.setWordWrap(True)
        self.bars: list[QProgressBar] = []
        self.gpu_labels: list[QLabel] = []
        self.gpu_notes: list[QLabel] = []
        self._grid.addWidget(self.gpu_message, 0, 0, 1, 2)
        self._grid.addWidget(self.host_label, 100, 0, 1, 2)

    def set_gpus(self, gpus: tuple[GpuSnapshot, ...], message: str) -> None:
        self.gpu_message.setVisible(not gpus)
        self.gpu_message.setText(message or "No GPU found: FitScope estimates for the CPU and the catalog.")
        while len(self.bars) < len(gpus):
            row = len(self.bars) * 3 + 1
            label = QLabel()
            label.setWordWrap(True)
            bar = QProgressBar()
            bar.setRange(0, 1000)
            bar.setTextVisible(True)
            note = QLabel()
            note.setWordWrap(True)
            note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self._grid.addWidget(label, row, 0, 1, 2)
            self._grid.addWidget(bar, row + 1, 0, 1, 2)
            self._grid.addWidget(note, row + 2, 0, 1, 2)
            self.gpu_labels.append(label)
            self.bars.append(bar)
            self.gpu_notes.append(note)
        for i, (label, bar, note) in enumerate(zip(self.gpu_labels, self.bars, self.gpu_notes, strict=True)):
            visible = i < len(gpus)
            label.setVisible(visible)
            bar.setVisible(visible)
            note.setVisible(visible and bool(gpus[i].memory_note))
            if not visible:
                continue
            g = gpus[i]
            label.setText(gpu_label(g))
            value, text = gpu_bar(g)
            bar.setValue(value)
            bar.setFormat(text)
            bar.setToolTip(gpu_source(g))
            note.setText(g.memory_note)

    def set_host(self, host: HostSnapshot | None, measuring: bool) -> None:
        self.host_label.setText(host_label(host, measuring))


def device_label(device: DeviceSpec) -> str:
    """A catalog device as a hardware list shows it: the name without the vendor and the details in
    parentheses, its memory and its whole-computer price (the card's own price and the assumed rest
    are in :func:`device_tooltip`), short enough to read whole."""
    price = machine_price(device)
    money = f" · {price.short}" if price.total_usd is not None else ""
    return f"{short_device_name(device.name)} · {device.memory_gib:g} GiB{money}"


def device_tooltip(device: DeviceSpec) -> str:
    """The whole name and what its price is made of."""
    price = machine_price(device)
    return f"{device.name}, {device.memory_gib:g} GiB. Price: {price.short}: {price.note}."


class DeviceCombo(QComboBox):
    """A hardware list you can type into: the first click opens the list, typing part of a name
    ("3090", "M2 Ultra", "EPYC") filters it, and the list is as wide as its longest entry."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setEditable(True)
        self.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.setMinimumContentsLength(14)
        self.setToolTip("Pick from the list, or type part of a name (3090, M2 Ultra, EPYC) to filter it")
        line = self.lineEdit()
        assert line is not None  # editable
        line.setPlaceholderText("type to filter, e.g. 3090")
        line.installEventFilter(self)
        completer = self.completer()
        if completer is not None:
            completer.setFilterMode(Qt.MatchFlag.MatchContains)
            completer.setCompletionMode(QCompleter.CompletionMode.PopupCompletion)

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 - Qt's name
        if watched is self.lineEdit() and event.type() == QEvent.Type.MouseButtonPress and not self.view().isVisible():
            self.showPopup()
            return True
        return super().eventFilter(watched, event)

    def showPopup(self) -> None:  # noqa: N802 - Qt's name
        metrics = self.view().fontMetrics()
        widest = max((metrics.horizontalAdvance(self.itemText(i)) for i in range(self.count())), default=0)
        self.view().setMinimumWidth(widest + 40)
        super().showPopup()
