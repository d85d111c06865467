"""The main window's right-hand side: the verdict banner above the tabs, and the estimate's own
tabs (the charts, the quantization ladder, the hardware comparison and the details).

``show_view`` puts one evaluated ``View`` on all of them at once. The table rows and texts come
from ``app.services.exports`` (the module that writes the exports); the charts are updated in place.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QGridLayout, QLabel, QPlainTextEdit, QTabWidget, QVBoxLayout, QWidget

from app.core.common.errors import FitScopeError
from app.core.memory.records import Estimate
from app.core.report.choices import MAX_USERS
from app.services.exports import copy_command_text
from app.services.tables import BREAKDOWN_HEADER, COMPARE_HEADER, breakdown_rows, compare_cells, comparison_rows
from app.services.view import View
from app.ui.charts import ConcurrencyChart, ContextChart, DeviceBar, LadderChart, SplitChart, legend_html
from app.ui.panels import VerdictBanner, fill_table, readonly_table


class ResultsArea(QWidget):
    """The verdict and the tabs; the tool tabs (``tool_tabs.py``: Run, A/B, ...) follow these four."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        self.banner = VerdictBanner()
        layout.addWidget(self.banner)
        self.tabs = QTabWidget()
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
        self.compare_table = readonly_table(COMPARE_HEADER, stretch_last=True)
        self.tabs.addTab(self.compare_table, "Com&pare hardware")
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
        grid.addWidget(self.legend, 0, 0, 1, 2)
        grid.addWidget(self.split_chart, 1, 0, 2, 1)
        grid.addWidget(self.context_chart, 1, 1)
        grid.addWidget(self.concurrency_chart, 2, 1)
        grid.setColumnStretch(0, 2)
        grid.setColumnStretch(1, 3)
        return page

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
        self.banner.set_verdict(view.verdict)
        if view.estimate is not None:
            self.split_chart.set_data(device_bars(view.estimate))
        c = view.request.controls
        if view.context_curve is not None:
            self.context_chart.set_data(view.context_curve, c.context_per_user_tokens)
        if view.ladder:
            self.ladder_chart.set_data(view.ladder)
        if view.concurrency is not None:
            self.concurrency_chart.set_data(view.concurrency, c.context_per_user_tokens, c.users, MAX_USERS)
        fill_table(self.breakdown_table, breakdown_rows(view))
        fill_table(self.compare_table, [compare_cells(r) for r in comparison_rows(view)])
        try:
            self.command_text.setPlainText(copy_command_text(view))
        except FitScopeError as exc:
            self.command_text.setPlainText(str(exc))
        self.assumptions_text.setPlainText("\n".join(f"• {a}" for a in view.assumptions) or view.error)

    def set_presentation(self, on: bool) -> None:
        """Presentation mode hides the Details tab."""
        self.tabs.setTabVisible(self.tabs.indexOf(self.details), not on)

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
