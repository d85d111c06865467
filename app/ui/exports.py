"""Saving what the window shows (File menu): the charts as PNG images, the estimate as JSON, CSV
or a one-page HTML report with the charts, and the llama.cpp settings on the clipboard.

``app.services.exports`` writes the text of every export; these functions add the chart images, the
file dialogs and the clipboard, which need Qt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFileDialog, QWidget

from app.core.common.errors import FitScopeError
from app.services.exports import copy_command_text, report_csv, report_html, report_json
from app.services.view import View

CHART_TITLES = {
    "split": "Where the memory goes",
    "context": "Memory against context",
    "ladder": "Quantization ladder",
    "concurrency": "Users at once",
}
"""The report's caption for each chart, by the name the window gives it."""

FILE_FILTERS = {"html": "HTML report (*.html)", "json": "JSON (*.json)", "csv": "CSV (*.csv)"}


def chart_png(chart: QWidget) -> bytes:
    """The chart as it is on screen, as PNG bytes."""
    pixmap = chart.grab()
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    pixmap.save(buffer, "PNG")
    return bytes(data.data())


def export(view: View | None, charts: Mapping[str, QWidget], kind: str, path: Path) -> list[Path]:
    """Write ``view`` as ``kind`` (html, json, csv, png) to ``path`` (a folder for png, one
    ``fitscope-<name>.png`` per chart). Returns the files written. Raises FitScopeError when there is
    nothing to export, the format is unknown or the disk refuses."""
    if view is None:
        raise FitScopeError("There is no estimate to export yet.")
    try:
        if kind == "png":
            path.mkdir(parents=True, exist_ok=True)
            written = []
            for name, chart in charts.items():
                target = path / f"fitscope-{name}.png"
                target.write_bytes(chart_png(chart))
                written.append(target)
            return written
        if kind == "json":
            path.write_text(json.dumps(report_json(view), indent=2), encoding="utf-8")
        elif kind == "csv":
            path.write_text(report_csv(view), encoding="utf-8")
        elif kind == "html":
            images = {CHART_TITLES[name]: chart_png(chart) for name, chart in charts.items()}
            path.write_text(report_html(view, images), encoding="utf-8")
        else:
            raise FitScopeError(f"Unknown export format '{kind}'.")
    except OSError as exc:
        raise FitScopeError(f"Could not write {path}: {exc.strerror or exc}.") from None
    return [path]


def ask_export_target(parent: QWidget, kind: str) -> Path | None:
    """A file dialog for ``kind`` (a folder for png); None when the person cancels."""
    if kind == "png":
        folder = QFileDialog.getExistingDirectory(parent, "Folder for the chart images")
        return Path(folder) if folder else None
    name, _ = QFileDialog.getSaveFileName(parent, "Export", f"fitscope-estimate.{kind}", FILE_FILTERS[kind])
    return Path(name) if name else None


def copy_command(view: View) -> str:
    """Put the llama-server command and the llama-cpp-python settings for ``view`` on the clipboard
    and return them. Raises FitScopeError when the view has no estimate to launch."""
    text = copy_command_text(view)
    QGuiApplication.clipboard().setText(text)
    return text
