"""The main window's right-hand side: the verdict banner above the tabs, and the estimate's own
tabs (the charts, the quantization ladder, the hardware comparison and the details).

``show_view`` puts one evaluated ``View`` on all of them at once. The table rows and texts come
from ``app.services.exports`` (the module that writes the exports); the charts are updated in place.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.adapters.history import Calibration
from app.core.common.errors import FitScopeError
from app.core.memory.records import Estimate
from app.core.report.choices import MAX_USERS
from app.services.exports import copy_command_text
from app.services.tables import (
    BREAKDOWN_HEADER,
    COMPARE_HEADER,
    COMPARE_NOTE,
    breakdown_rows,
    compare_cells,
    comparison_rows,
    fit_detail,
)
from app.services.view import View
from app.ui.charts import ConcurrencyChart, ContextChart, DeviceBar, LadderChart, SplitChart, legend_html
from app.ui.panels import VerdictBanner, fill_table, readonly_table


class ResultsArea(QWidget):
    """The verdict and the tabs; the tool tabs (``tool_tabs.py``: Run, A/B, ...) follow these four."""

    calibration_reset = Signal()  # "Reset" on the calibration line
    controls_toggled = Signal(bool)  # presentation mode: show (or hide) the controls

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._presentation = False
        self._view: View | None = None
        layout = QVBoxLayout(self)
        self.banner = VerdictBanner()
        self.controls_button = QToolButton()
        self.controls_button.setText("Controls")
        self.controls_button.setCheckable(True)
        self.controls_button.setToolTip("Show the settings on the left (presentation mode hides them)")
        self.controls_button.setVisible(False)
        self.controls_button.toggled.connect(self.controls_toggled)
        top = QHBoxLayout()
        top.addWidget(self.banner, 1)
        top.addWidget(self.controls_button, 0, Qt.AlignmentFlag.AlignTop)
        layout.addLayout(top)
        self.calibration = QLabel("")
        self.calibration.setWordWrap(True)
        self.calibration.setTextFormat(Qt.TextFormat.RichText)
        self.calibration.setAccessibleName("How this computer's speeds are calibrated")
        self.calibration.setVisible(False)
        self.calibration.linkActivated.connect(lambda _link: self.calibration_reset.emit())
        layout.addWidget(self.calibration)
        self.tabs = QTabWidget()
        # Tab titles are never shortened: when they do not fit, the bar scrolls.
        self.tabs.setElideMode(Qt.TextElideMode.ElideNone)
        self.tabs.setUsesScrollButtons(True)
        self.split_chart = SplitChart()
        self.context_chart = ContextChart()
        self.ladder_chart = LadderChart()
        self.concurrency_chart = ConcurrencyChart()
        self.charts = {
            "split": self.split_chart,
            "context": self.context_chart,
            "ladder": self.ladder_chart,
            "concurrency": self.concurrency_chart,
        }
        self.tabs.addTab(self._charts_page(), "C&harts")
        self.tabs.addTab(self.ladder_chart, "&Quantization ladder")
        # Every column as wide as its contents (never a squeezed last one, "Price (U"): when the window
        # is narrower than the table, it scrolls sideways.
        self.compare_table = readonly_table(COMPARE_HEADER)
        header = self.compare_table.horizontalHeaderItem(COMPARE_HEADER.index("Memory needed"))
        if header is not None:
            header.setToolTip(COMPARE_NOTE)
        self.compare_note = QLabel(COMPARE_NOTE)
        self.compare_note.setWordWrap(True)
        compare_page = QWidget()
        compare_layout = QVBoxLayout(compare_page)
        compare_layout.setContentsMargins(0, 0, 0, 0)
        compare_layout.addWidget(self.compare_table, 1)
        compare_layout.addWidget(self.compare_note)
        self.compare_page = compare_page
        self.tabs.addTab(compare_page, "Com&pare hardware")
        self.details = self._details_page()
        self.tabs.addTab(self.details, "&Details")
        layout.addWidget(self.tabs, 1)

    def _charts_page(self) -> QWidget:
        page = QWidget()
        grid = QGridLayout(page)
        grid.setContentsMargins(0, 0, 0, 0)
        self.legend = QLabel(legend_html())
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        self.legend.setWordWrap(True)
        self._charts_grid = grid
        self._arrange_charts(side_by_side=False)
        return page

    def _arrange_charts(self, side_by_side: bool) -> None:
        """Two columns (the memory bars beside the two curves), or, for a room, the three charts in
        one row, each with the page's full height."""
        grid = self._charts_grid
        for w in (self.legend, self.split_chart, self.context_chart, self.concurrency_chart):
            grid.removeWidget(w)
        for c in range(3):
            grid.setColumnStretch(c, 0)
        for r in range(3):
            grid.setRowStretch(r, 0)
        if side_by_side:
            grid.addWidget(self.legend, 0, 0, 1, 3)
            for c, chart in enumerate((self.split_chart, self.context_chart, self.concurrency_chart)):
                grid.addWidget(chart, 1, c)
                grid.setColumnStretch(c, 1)
            grid.setRowStretch(1, 1)
            return
        grid.addWidget(self.legend, 0, 0, 1, 2)
        grid.addWidget(self.split_chart, 1, 0, 2, 1)
        grid.addWidget(self.context_chart, 1, 1)
        grid.addWidget(self.concurrency_chart, 2, 1)
        grid.setColumnStretch(0, 2)
        grid.setColumnStretch(1, 3)
        grid.setRowStretch(1, 1)
        grid.setRowStretch(2, 1)

    def _details_page(self) -> QWidget:
        page = QWidget()
        layout = QVBoxLayout(page)
        self.breakdown_table = readonly_table(BREAKDOWN_HEADER, stretch_last=True)
        self.command_text = QPlainTextEdit()
        self.command_text.setReadOnly(True)
        self.command_text.setMaximumHeight(170)
        self.assumptions_text = QPlainTextEdit()
        self.assumptions_text.setReadOnly(True)
        layout.addWidget(QLabel("Per device (GiB)"))
        layout.addWidget(self.breakdown_table)
        layout.addWidget(QLabel("The same settings for llama.cpp"))
        layout.addWidget(self.command_text)
        layout.addWidget(QLabel("Assumptions behind these figures"))
        layout.addWidget(self.assumptions_text)
        return page

    def show_view(self, view: View) -> None:
        """The verdict, every chart and every table for ``view``. A chart whose data the view lacks
        (an impossible setting) keeps what it showed."""
        self._view = view
        self._show_verdict()
        if view.estimate is not None:
            self.split_chart.set_data(device_bars(view.estimate))
        c = view.request.controls
        if view.context_curve is not None:
            self.context_chart.set_data(view.context_curve, c.context_per_user_tokens)
        if view.ladder:
            self.ladder_chart.set_data(view.ladder)
        if view.concurrency is not None:
            self.concurrency_chart.set_data(
                view.concurrency, c.context_per_user_tokens, c.users, MAX_USERS, view.users_that_fit, view.verdict.level
            )
        fill_table(self.breakdown_table, breakdown_rows(view))
        rows = comparison_rows(view)
        fill_table(self.compare_table, [compare_cells(r) for r in rows])
        price_column, fits_column = COMPARE_HEADER.index("Price"), COMPARE_HEADER.index("Fits")
        for i, r in enumerate(rows):
            for column, tip in ((price_column, r.price_note), (fits_column, fit_detail(r))):
                item = self.compare_table.item(i, column)
                if item is not None:
                    item.setToolTip(tip)
        try:
            self.command_text.setPlainText(copy_command_text(view))
        except FitScopeError as exc:
            self.command_text.setPlainText(str(exc))
        details = [*view.verdict.technical, *view.assumptions]
        self.assumptions_text.setPlainText("\n".join(f"• {a}" for a in details) or view.error)

    def _show_verdict(self) -> None:
        """The verdict; in presentation mode the room's headline (model, machine, people, answer)
        above it."""
        view = self._view
        if view is None:
            return
        self.banner.set_verdict(view.verdict)
        if self._presentation and view.room_headline:
            # For a room: the answer, then the verdict's own headline; the rest is one click away.
            self.banner.set_message(view.verdict.level, view.room_headline, view.verdict.headline)
        self.banner.setToolTip("\n".join(view.verdict.technical))

    def show_calibration(self, found: Mapping[str, Calibration]) -> None:
        """"Speeds calibrated from N runs on DATE — Reset", or nothing when none calibrate them."""
        if not found:
            self.calibration.setVisible(False)
            return
        runs = max(c.runs for c in found.values())
        latest = datetime.date.fromtimestamp(max(c.latest_s for c in found.values()))
        devices = ", ".join(found)
        self.calibration.setText(
            f"This computer's speeds are calibrated from {runs} run{'s' if runs != 1 else ''} "
            f"(the newest on {latest.day} {latest:%B %Y}; {devices}: the median of the runs nothing disturbed) — "
            '<a href="reset">Reset</a>'
        )
        self.calibration.setVisible(True)

    def set_presentation(self, on: bool, controls_shown: bool = False) -> None:
        """Presentation mode hides the Details tab and the Details' figures, and puts the room's
        headline first; a button shows the controls."""
        self._presentation = on
        self.tabs.setTabVisible(self.tabs.indexOf(self.details), not on)
        self.controls_button.setVisible(on)
        was = self.controls_button.blockSignals(True)
        self.controls_button.setChecked(controls_shown if on else False)
        self.controls_button.blockSignals(was)
        self.compare_note.setVisible(not on)
        self._arrange_charts(side_by_side=on)
        self._show_verdict()

    def apply_look(self, palette: QPalette, scale: float) -> None:
        """Recolour the charts for ``palette`` and size their text and the banner's by ``scale``."""
        for chart in self.charts.values():
            chart.apply_palette(palette, scale)
        self.banner.set_scale(scale)


def device_bars(est: Estimate) -> list[DeviceBar]:
    """One stacked bar per device that holds part of the model. Host memory gets its own bar when
    it holds layers (or is the only device); otherwise it keeps only the token embedding and
    buffers, listed under Details."""
    has_gpu_layers = any(d.kind == "gpu" and d.layers for d in est.devices)
    return [
        DeviceBar(
            name=d.name,
            weights_bytes=d.weights_bytes + d.repack_bytes,
            kv_cache_bytes=d.kv_cache_bytes + d.recurrent_state_bytes,
            compute_bytes=d.compute_bytes + d.output_bytes,
            overhead_bytes=d.overhead_bytes,
            capacity_bytes=d.capacity_bytes,
            projector_bytes=d.projector_bytes,
            speculative_bytes=d.speculative_bytes,
        )
        for d in est.devices
        if d.kind == "gpu" and d.total_bytes or d.kind == "cpu" and (d.layers or not has_gpu_layers)
    ]
