"""The History tab: every finished run, newest first; compare any two; export CSV."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.adapters.history import HistoryRow, RunHistory
from app.core.common.errors import FitScopeError
from app.core.common.text import safe_label
from app.core.common.units import MIB
from app.ui.panels import fill_table, readonly_table

COLUMNS = [
    "#",
    "When",
    "Model",
    "Hardware",
    "Mode",
    "Context",
    "GPU layers",
    "Repeats",
    "TTFT",
    "Prefill tok/s",
    "Decode tok/s",
    "Peak RSS",
    "llama-cpp-python",
]
FIGURE_NAMES = {
    "ttft_s": "Time to first token (s)",
    "prefill_tokens_per_s": "Prefill (tok/s)",
    "decode_tokens_per_s": "Decode (tok/s)",
    "itl_p50_s": "Inter-token p50 (s)",
    "itl_p95_s": "Inter-token p95 (s)",
    "load_s": "Load time (s)",
    "peak_rss_bytes": "Peak RSS (MiB)",
    "model_buffer_bytes": "Model buffers (MiB)",
    "kv_buffer_bytes": "KV buffers (MiB)",
    "rs_buffer_bytes": "Recurrent state (MiB)",
    "compute_buffer_bytes": "Compute buffers (MiB)",
    "output_buffer_bytes": "Output buffers (MiB)",
}


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


class HistoryPanel(QWidget):
    error_shown = Signal(str)

    def __init__(self, history: RunHistory | None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.history = history
        self.table = readonly_table(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setAccessibleName("Run history")
        self.compare_button = QPushButton("&Compare the two selected")
        self.export_button = QPushButton("E&xport CSV…")
        self.delete_button = QPushButton("&Delete selected")
        buttons = QHBoxLayout()
        for b in (self.compare_button, self.export_button, self.delete_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        self.note = QLabel("")
        self.comparison = readonly_table(["Figure", "Run A", "Run B", "B against A"])
        layout = QVBoxLayout(self)
        layout.addWidget(self.table, 3)
        layout.addLayout(buttons)
        layout.addWidget(self.note)
        layout.addWidget(self.comparison, 2)
        self.compare_button.clicked.connect(self.compare_selected)
        self.export_button.clicked.connect(self._export_dialog)
        self.delete_button.clicked.connect(self.delete_selected)
        self.rows: list[HistoryRow] = []
        self.refresh()

    def refresh(self) -> None:
        if self.history is None:
            self.note.setText("The run history is not available (see the message shown at start-up).")
            self.rows = []
        else:
            self.rows = self.history.rows()
            count = len(self.rows)
            self.note.setText(
                f"{count} run{'s' if count != 1 else ''} kept in {self.history.path}" if self.rows else "No runs yet."
            )
        fill_table(
            self.table,
            [
                [
                    str(row.run_id),
                    dt.datetime.fromtimestamp(row.started_at).strftime("%Y-%m-%d %H:%M"),
                    safe_label(row.model_name),
                    row.hardware,
                    row.mode,
                    f"{row.n_ctx:,}",
                    str(row.n_gpu_layers),
                    str(row.repeat),
                    "-" if row.ttft_s is None else f"{row.ttft_s * 1000:,.0f} ms",
                    _num(row.prefill_tokens_per_s),
                    _num(row.decode_tokens_per_s),
                    "-" if row.peak_rss_bytes is None else f"{row.peak_rss_bytes / MIB:,.0f} MiB",
                    row.llama_cpp_version,
                ]
                for row in self.rows
            ],
        )

    def selected_ids(self) -> list[int]:
        rows = sorted({i.row() for i in self.table.selectedIndexes()})
        return [self.rows[r].run_id for r in rows if r < len(self.rows)]

    def compare(self, a: int, b: int) -> None:
        if self.history is None:
            return
        rows = []
        for name, va, vb, change in self.history.compare(a, b):
            scale = 1 / MIB if name.endswith("_bytes") else 1.0
            digits = 3 if name.endswith("_s") else 1
            rows.append(
                [
                    FIGURE_NAMES.get(name, name),
                    "-" if va is None else f"{va * scale:,.{digits}f}",
                    "-" if vb is None else f"{vb * scale:,.{digits}f}",
                    "-" if change is None else f"{100 * change:+.1f}%",
                ]
            )
        fill_table(self.comparison, rows)
        self.note.setText(f"Run #{a} (A) against run #{b} (B).")

    def compare_selected(self) -> None:
        ids = self.selected_ids()
        if len(ids) != 2:
            self.note.setText("Select exactly two runs to compare (Ctrl+click the second).")
            return
        older, newer = sorted(ids)
        self.compare(older, newer)

    def export_csv(self, path: Path) -> int:
        if self.history is None:
            raise FitScopeError("There is no run history to export.")
        ids = self.selected_ids() or None
        try:
            return self.history.export_csv(path, ids)
        except OSError as exc:
            raise FitScopeError(f"Could not write {path}: {exc.strerror or exc}.") from None

    def _export_dialog(self) -> None:
        name, _ = QFileDialog.getSaveFileName(self, "Export the run history", "fitscope-runs.csv", "CSV (*.csv)")
        if not name:
            return
        try:
            n = self.export_csv(Path(name))
        except FitScopeError as exc:
            self.error_shown.emit(str(exc))
            return
        self.note.setText(f"Wrote {n} run{'s' if n != 1 else ''} to {name}.")

    def delete_selected(self) -> None:
        if self.history is None:
            return
        for run_id in self.selected_ids():
            self.history.delete(run_id)
        self.refresh()
