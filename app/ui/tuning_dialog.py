"""The "Fastest settings" dialog beside auto-fit: the best three llama-server settings for what the
window shows (``app.services.tuning``), with their predicted speeds, what each trades and its
command; "Use" puts a result's KV cache, flash attention and placement on the controls.

The search runs on the dialog's own ``JobRunner`` (it takes well under a second, but a model file
is read first), so the window never waits on it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QPlainTextEdit,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.core.report.choices import Controls
from app.services.tuning import TunedSetting, TuneResult, tune_choice
from app.services.view import Request
from app.ui.jobs import JobRunner

COLUMNS = ("#", "Decode (tokens/s)", "Prefill (tokens/s)", "What it trades")


class FastestDialog(QDialog):
    """Searches on open; shows the best settings; ``Use`` applies the chosen one through ``apply``."""

    def __init__(
        self,
        request: Request,
        demo_path: Callable[[], Path] | None,
        apply: Callable[[Controls], None],
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Fastest settings")
        self.resize(900, 420)
        self._request = request
        self._apply = apply
        self.found: TuneResult | None = None
        layout = QVBoxLayout(self)
        self.status = QLabel("Searching KV cache types, flash attention, -ub, threads and placements…")
        self.status.setWordWrap(True)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.setAccessibleName("Fastest settings")
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        self.command = QPlainTextEdit()
        self.command.setReadOnly(True)
        self.command.setAccessibleName("llama-server command of the chosen settings")
        self.command.setMaximumHeight(70)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.use_button = self.buttons.addButton("&Use these settings", QDialogButtonBox.ButtonRole.ApplyRole)
        self.use_button.setEnabled(False)
        layout.addWidget(self.status)
        layout.addWidget(self.table)
        layout.addWidget(self.command)
        layout.addWidget(self.buttons)
        self.buttons.rejected.connect(self.reject)
        self.use_button.clicked.connect(self.use_selected)
        self.table.currentCellChanged.connect(lambda row, *_: self._show_command(row))
        self.jobs = JobRunner("tune", self)
        self.jobs.finished.connect(lambda _id, result: self.show_result(result))
        self.jobs.failed.connect(lambda _id, message: self.status.setText(message))
        demo = str(demo_path()) if request.model.kind == "demo" and demo_path is not None else None
        self.jobs.submit(partial(tune_choice, request.model, request.hardware, request.controls, request.machine, demo))

    def show_result(self, result: TuneResult) -> None:
        self.found = result
        self.status.setText(
            f"The {len(result.settings)} fastest settings for {result.model_label} that fit "
            f"(searched in {result.search_s:.2f} s; decode for {result.prompt_tokens} tokens of context):"
        )
        self.table.setRowCount(len(result.settings))
        for row, t in enumerate(result.settings):
            d_lo, d_hi = t.decode_tokens_per_s
            p_lo, p_hi = t.prefill_tokens_per_s
            cells = (str(t.rank), f"{d_lo:.1f}-{d_hi:.1f}", f"{p_lo:.0f}-{p_hi:.0f}", t.trades)
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(t.command if col < 3 else text)
                self.table.setItem(row, col, item)
        self.table.resizeColumnsToContents()
        if result.settings:
            self.table.selectRow(0)
            self._show_command(0)
            self.use_button.setEnabled(True)

    def _show_command(self, row: int) -> None:
        if self.found is not None and 0 <= row < len(self.found.settings):
            self.command.setPlainText(self.found.settings[row].command)

    def selected(self) -> TunedSetting | None:
        row = self.table.currentRow()
        if self.found is None or not 0 <= row < len(self.found.settings):
            return None
        return self.found.settings[row]

    def use_selected(self) -> None:
        """Put the chosen settings' KV cache, flash attention and placement on the controls."""
        chosen = self.selected()
        if chosen is None:
            return
        s = chosen.candidate.settings
        plan = chosen.candidate.plan
        self._apply(
            self._request.controls.model_copy(
                update={
                    "cache_type_k": s.cache_type_k,
                    "cache_type_v": s.cache_type_v,
                    "flash_attn": s.flash_attn,
                    "gpu_layers": None if plan.fully_on_gpu else plan.gpu_layers,
                    "n_cpu_moe": plan.n_cpu_moe,
                }
            )
        )
        self.accept()


def open_fastest_dialog(window, demo_path: Callable[[], Path] | None) -> FastestDialog:
    """The dialog for ``window``'s current choices, shown without blocking it."""
    dialog = FastestDialog(window.current_request(), demo_path, window.set_controls, window)
    dialog.show()
    return dialog
