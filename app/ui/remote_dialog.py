"""File → "Open from Hugging Face…" / "Open from Ollama…": type a repository (or an Ollama model and
tag), see its GGUF files with their sizes and quantizations, pick one (and its vision projector),
and the window estimates it as it would a local file.

The fetches (the listing, then the chosen file's header and its projector's) run through a
``JobRunner`` of the dialog's own, a thread: progress arrives as the runner's ``progressed`` (the
service's ``status`` / ``fetched`` / ``cached`` reports) and Cancel sets the flag the service
checks between chunks. Every failure (offline, a timeout, a 401/404, a repository without GGUF
files, a truncated header) is the service's one sentence, shown in the dialog, which stays usable.
On success the headers are in the cache, so the window's estimate worker reads them from there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.core.common.units import GIB, MIB
from app.core.model.projector import ProjectorSpec
from app.core.model.remote import RemoteFile, RemoteListing, Source
from app.core.report.choices import ModelChoice
from app.services.remote import Fetch, choice_for, list_remote, load_remote_model, load_remote_projector
from app.ui.jobs import JobRunner, Report

TITLES = {"hf": "Open from Hugging Face", "ollama": "Open from Ollama"}
PROMPTS = {
    "hf": ("Repository", "ORG/REPO, e.g. bartowski/Qwen_Qwen3-8B-GGUF"),
    "ollama": ("Model", "MODEL:TAG, e.g. qwen3:30b"),
}


def list_job(source: Source, ref: str, cancel: threading.Event, report: Report) -> RemoteListing:
    """Runs on the dialog's worker: the listing."""
    return list_remote(source, ref, Fetch(report=report, cancelled=cancel.is_set))


def open_job(
    listing: RemoteListing, file: RemoteFile, projector: RemoteFile | None, cancel: threading.Event, report: Report
) -> tuple[ModelChoice, ProjectorSpec | None]:
    """Runs on the dialog's worker: the file's header(s) and the projector's, read and cached."""
    fetch = Fetch(report=report, cancelled=cancel.is_set)
    choice = choice_for(listing, file)
    load_remote_model(choice, fetch)
    spec = load_remote_projector(listing, projector, fetch) if projector is not None else None
    return choice, spec


class RemoteModelDialog(QDialog):
    """Lists a repository's (or an Ollama tag's) GGUF files and opens one."""

    model_opened = Signal(object, object)  # ModelChoice, ProjectorSpec | None

    def __init__(self, source: Source, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.source = source
        self.setWindowTitle(TITLES[source])
        self.resize(760, 460)
        self.listing: RemoteListing | None = None
        self._cancel = threading.Event()
        self.runner = JobRunner(f"{source}-fetch", self)
        self.runner.progressed.connect(self._on_progress)
        self.runner.finished.connect(self._on_finished)
        self.runner.failed.connect(self._on_failed)
        self.runner.running_changed.connect(self._on_running)

        label, placeholder = PROMPTS[source]
        self.ref_edit = QLineEdit()
        self.ref_edit.setPlaceholderText(placeholder)
        self.ref_edit.setAccessibleName(label)
        self.ref_edit.returnPressed.connect(self.list_files)
        self.list_button = QPushButton("&List files")
        self.list_button.clicked.connect(self.list_files)
        row = QHBoxLayout()
        row.addWidget(self.ref_edit, 1)
        row.addWidget(self.list_button)
        form = QFormLayout()
        ref_label = QLabel(f"&{label}")
        ref_label.setBuddy(self.ref_edit)
        form.addRow(ref_label, row)

        self.files_table = QTableWidget(0, 4)
        self.files_table.setHorizontalHeaderLabels(["Quantization", "Size", "Parts", "File"])
        self.files_table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.files_table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.files_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.files_table.verticalHeader().setVisible(False)
        self.files_table.horizontalHeader().setStretchLastSection(True)
        self.files_table.itemSelectionChanged.connect(self._update_buttons)
        self.files_table.doubleClicked.connect(lambda _index: self.open_selected())
        self.projector_combo = QComboBox()
        self.projector_combo.setAccessibleName("Vision projector")
        projector_form = QFormLayout()
        projector_label = QLabel("&Vision projector")
        projector_label.setBuddy(self.projector_combo)
        projector_form.addRow(projector_label, self.projector_combo)

        self.status_label = QLabel(
            "FitScope reads only each file's header (a few MiB at most), never the weights, and keeps it "
            "in its cache."
        )
        self.status_label.setWordWrap(True)
        self.status_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.progress = QProgressBar()
        self.progress.setRange(0, 0)
        self.progress.setVisible(False)
        self.buttons = QDialogButtonBox()
        self.open_button = self.buttons.addButton("&Estimate", QDialogButtonBox.ButtonRole.AcceptRole)
        self.cancel_button = self.buttons.addButton(QDialogButtonBox.StandardButton.Cancel)
        self.open_button.clicked.connect(self.open_selected)
        self.cancel_button.clicked.connect(self.cancel)

        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.files_table, 1)
        layout.addLayout(projector_form)
        layout.addWidget(self.status_label)
        layout.addWidget(self.progress)
        layout.addWidget(self.buttons)
        self._fill_projectors(())
        self._update_buttons()

    # -- actions --------------------------------------------------------------------------------

    def list_files(self) -> None:
        ref = self.ref_edit.text().strip()
        if not ref:
            self._say(f"Type a {PROMPTS[self.source][0].lower()} first.", error=True)
            return
        self._start(partial(list_job, self.source, ref), "list")

    def open_selected(self) -> None:
        file = self.selected_file()
        if file is None or self.listing is None:
            return
        projector = self.projector_combo.currentData()
        self._start(partial(open_job, self.listing, file, projector), "open")

    def cancel(self) -> None:
        """Stop the fetch under way; with none, close the dialog."""
        if self.runner.running:
            self._cancel.set()
            self._say("Cancelling…")
        else:
            self.reject()

    def selected_file(self) -> RemoteFile | None:
        rows = self.files_table.selectionModel().selectedRows()
        if not rows or self.listing is None:
            return None
        return self.listing.models[rows[0].row()]

    def done(self, result: int) -> None:
        """Closing stops the fetch; the dialog goes once its worker has let go of it."""
        self._cancel.set()
        super().done(result)
        if self.runner.running:
            self.runner.running_changed.connect(self._delete_when_idle)
        else:
            self.deleteLater()

    def _delete_when_idle(self, running: bool) -> None:
        if not running:
            self.deleteLater()

    # -- inside ---------------------------------------------------------------------------------

    def _start(self, work: Any, what: str) -> None:
        self._cancel = threading.Event()
        if not self.runner.start(partial(work, self._cancel), tag=what):
            return
        self._say("Listing…" if what == "list" else "Reading the header…")

    def _say(self, text: str, error: bool = False) -> None:
        self.status_label.setText(text)
        self.status_label.setStyleSheet("color: #c0392b;" if error else "")

    def _on_running(self, running: bool) -> None:
        self.progress.setVisible(running)
        for w in (self.ref_edit, self.list_button, self.files_table, self.projector_combo):
            w.setEnabled(not running)
        self._update_buttons()

    def _update_buttons(self) -> None:
        self.open_button.setEnabled(not self.runner.running and self.selected_file() is not None)

    def _on_progress(self, kind: str, payload: object) -> None:
        if kind == "status" and isinstance(payload, str):
            self._say(payload)
        elif kind == "fetched" and isinstance(payload, tuple):
            shown, n = payload
            self._say(f"Read {n / MIB:,.1f} MiB of {shown}'s header…")
        elif kind == "cached" and isinstance(payload, tuple):
            self._say(f"{payload[0]}: its header is in the cache.")

    def _on_finished(self, job_id: int, result: object) -> None:
        if self.runner.tag_of(job_id) == "list" and isinstance(result, RemoteListing):
            self._show_listing(result)
        elif isinstance(result, tuple):
            choice, spec = result
            self.model_opened.emit(choice, spec)
            self.accept()

    def _on_failed(self, _job_id: int, message: str) -> None:
        self._say(message, error=True)

    def _show_listing(self, listing: RemoteListing) -> None:
        self.listing = listing
        self.files_table.setRowCount(len(listing.models))
        for row, f in enumerate(listing.models):
            missing = f" (missing {len(f.missing_parts)})" if f.missing_parts else ""
            cells = (f.quant or "?", f"{f.size_bytes / GIB:,.2f} GiB", f"{len(f.parts)}{missing}", f.path)
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if col in (1, 2):
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.files_table.setItem(row, col, item)
        for col in range(3):  # the file's name takes the rest
            self.files_table.resizeColumnToContents(col)
        self._fill_projectors(listing.projectors)
        where = f"{listing.repo} at {listing.revision[:12]}"
        if not listing.models:
            self._say(f"{where} holds no GGUF model; try another repository.", error=True)
        else:
            count = f"{len(listing.models)} GGUF model{'s' if len(listing.models) > 1 else ''}"
            self._say(" ".join(filter(None, (listing.note, f"{where}: {count}. Pick one, then Estimate."))))
            if len(listing.models) == 1:
                self.files_table.selectRow(0)
        self._update_buttons()

    def _fill_projectors(self, projectors: tuple[RemoteFile, ...]) -> None:
        self.projector_combo.clear()
        self.projector_combo.addItem("None (text only)", None)
        for p in projectors:
            self.projector_combo.addItem(f"{p.path} ({p.size_bytes / GIB:,.2f} GiB)", p)
        if projectors:
            f16 = next((i for i, p in enumerate(projectors) if p.quant == "F16"), 0)
            self.projector_combo.setCurrentIndex(f16 + 1)
        self.projector_combo.setEnabled(bool(projectors))


def open_remote_dialog(
    parent: QWidget, source: Source, opened: Callable[[ModelChoice, ProjectorSpec | None], object]
) -> RemoteModelDialog:
    """Show the dialog over ``parent``; a model opened in it goes to ``opened`` with its projector."""
    dialog = RemoteModelDialog(source, parent)
    dialog.model_opened.connect(opened)
    dialog.open()
    return dialog
