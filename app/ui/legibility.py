"""Is every word on screen readable? Finds widget text cut off by its widget's width (or, for a
label that wraps, its height), table headers and cells too narrow for their text, and chart text
below a minimum size: the checks behind the window's layout tests and ``scripts/screenshots.py``.

A label that wraps is never clipped horizontally, but it is when its lines need more height than it
has; an elided label or table cell (``…``) is reported, since the user cannot read what was
dropped. Only widgets the user can see are checked.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyqtgraph as pg
from PySide6.QtCore import QPoint, QRect, Qt
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import (
    QAbstractButton,
    QCheckBox,
    QComboBox,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QTabBar,
    QTableWidget,
    QWidget,
)

# Padding Qt's styles put around a push button's, check box's and combo box's text.
_BUTTON_PAD = 12
_CHECK_PAD = 24
_COMBO_PAD = 28


@dataclass(frozen=True)
class Clipped:
    widget: str
    text: str
    needed_px: int
    available_px: int

    def __str__(self) -> str:
        return f"{self.widget}: {self.text!r} needs {self.needed_px}px, has {self.available_px}px"


def _name(w: QWidget) -> str:
    return w.objectName() or type(w).__name__


def _visible(w: QWidget) -> bool:
    return w.isVisible() and w.width() > 0 and w.height() > 0


def _cut_by_scroll_area(w: QWidget) -> int:
    """Pixels of ``w`` beyond the right edge of the scroll area holding it, when that area has no
    horizontal scroll bar (so the user can never see them)."""
    parent = w.parentWidget()
    while parent is not None and not isinstance(parent, QScrollArea):
        parent = parent.parentWidget()
    if parent is None or parent.horizontalScrollBarPolicy() != Qt.ScrollBarPolicy.ScrollBarAlwaysOff:
        return 0
    viewport = parent.viewport()
    if not viewport.isAncestorOf(w):
        return 0  # the area's own scroll bars and corner
    right = w.mapTo(viewport, QPoint(w.width(), 0)).x()
    return max(0, right - viewport.width())


def clipped_texts(root: QWidget) -> list[Clipped]:
    """Widget text under ``root`` that does not fit the width it is given, or that a scroll area
    without a horizontal scroll bar cuts off."""
    out: list[Clipped] = []
    for w in root.findChildren(QWidget):
        if not _visible(w):
            continue
        cut = _cut_by_scroll_area(w)
        text = w.text() if isinstance(w, (QLabel, QAbstractButton, QLineEdit)) else ""
        if isinstance(w, QComboBox):
            text = w.currentText()
        if cut > 1 and text:
            out.append(Clipped(_name(w), text, w.width(), w.width() - cut))
            continue
        fm = QFontMetrics(w.font())
        if isinstance(w, QLabel) and w.text() and w.wordWrap() and w.pixmap().isNull():
            # A wrapping label is cut when its lines need more height than it was given.
            need = w.heightForWidth(w.contentsRect().width())
            have = w.contentsRect().height()
            if need > have + 2:
                out.append(Clipped(_name(w) + " (height)", w.text()[:80], need, have))
            continue
        if isinstance(w, QTableWidget):
            out += _table_clipped(w)
            continue
        if isinstance(w, QLabel):
            text = w.text()
            if not text or w.wordWrap() or w.textFormat() == 1 or "<" in text or not w.pixmap().isNull():
                continue  # rich text lays itself out
            if w.buddy() is not None:  # "&x" is drawn as an underlined x
                text = text.replace("&&", "\0").replace("&", "").replace("\0", "&")
            width = max(fm.horizontalAdvance(line) for line in text.splitlines() or [""])
            avail = w.contentsRect().width() - 2 * w.margin() - max(0, w.indent())
            if width > avail + 1:
                out.append(Clipped(_name(w), text, width, avail))
        elif isinstance(w, QCheckBox):
            width = fm.horizontalAdvance(w.text()) + _CHECK_PAD
            if w.text() and width > w.width() + 1:
                out.append(Clipped(_name(w), w.text(), width, w.width()))
        elif isinstance(w, QPushButton) or (isinstance(w, QAbstractButton) and w.text()):
            text = w.text().replace("&", "")
            width = fm.horizontalAdvance(text) + _BUTTON_PAD
            if text and width > w.width() + 1:
                out.append(Clipped(_name(w), text, width, w.width()))
        elif isinstance(w, QComboBox):
            text = w.currentText()
            width = fm.horizontalAdvance(text) + _COMBO_PAD
            if text and width > w.width() + 1:
                out.append(Clipped(_name(w), text, width, w.width()))
        elif isinstance(w, QLineEdit) and w.isReadOnly():
            width = fm.horizontalAdvance(w.text()) + 8
            if w.text() and width > w.width() + 1:
                out.append(Clipped(_name(w), w.text(), width, w.width()))
        elif isinstance(w, QTabBar):
            for i in range(w.count()):
                text = w.tabText(i).replace("&", "")
                rect = w.tabRect(i)
                need = fm.horizontalAdvance(text) + 16
                if rect.width() and need > rect.width() + 1:
                    out.append(Clipped(f"{_name(w)} tab {i}", text, need, rect.width()))
                if rect.right() > w.width() + 1 and not w.usesScrollButtons():
                    out.append(Clipped(f"{_name(w)} tab {i}", text, rect.right(), w.width()))
    return out


_CELL_PAD = 8  # the margins a table cell's style keeps beside its text (what ResizeToContents adds)


def _table_clipped(table: QTableWidget) -> list[Clipped]:
    """Header sections and the cells in view whose text is wider than their column (Qt elides them)."""
    out: list[Clipped] = []
    header = table.horizontalHeader()
    header_metrics = QFontMetrics(header.font())
    cell_metrics = QFontMetrics(table.font())
    for c in range(table.columnCount()):
        if table.isColumnHidden(c):
            continue
        width = table.columnWidth(c)
        item = table.horizontalHeaderItem(c)
        title = item.text() if item is not None else ""
        if title and header_metrics.horizontalAdvance(title) + _CELL_PAD > width + 1:
            need = header_metrics.horizontalAdvance(title) + _CELL_PAD
            out.append(Clipped(f"{_name(table)} header", title, need, width))
        for r in range(min(table.rowCount(), 30)):
            cell = table.item(r, c)
            if cell is None or not cell.text():
                continue
            need = max(cell_metrics.horizontalAdvance(line) for line in cell.text().splitlines()) + _CELL_PAD
            if need > width + 1 and table.wordWrap():
                # A wrapping table breaks the text at spaces: it is whole when the row is tall enough.
                box = cell_metrics.boundingRect(
                    QRect(0, 0, max(width - _CELL_PAD, 1), 100_000), int(Qt.TextFlag.TextWordWrap), cell.text()
                )
                if box.width() <= width - _CELL_PAD + 1 and box.height() <= table.rowHeight(r):
                    continue
            if need > width + 1:
                out.append(Clipped(f"{_name(table)} row {r}", cell.text(), need, width))
    return out


def chart_text_sizes(root: QWidget) -> list[tuple[str, float]]:
    """(what, point size) of the text inside every visible pyqtgraph plot under ``root``: axis tick
    labels, axis titles, plot titles, legend entries and text items."""
    out: list[tuple[str, float]] = []
    for view in root.findChildren(pg.GraphicsView):
        if not _visible(view):
            continue
        scene = view.scene()
        if scene is None:
            continue
        for item in scene.items():
            if isinstance(item, pg.AxisItem) and item.isVisible():
                font = item.style.get("tickFont") or item.font()
                out.append((f"axis {item.orientation} ticks", float(font.pointSizeF())))
                if item.label.isVisible() and item.label.toPlainText().strip():
                    out.append((f"axis {item.orientation} title", float(item.label.font().pointSizeF())))
            elif isinstance(item, pg.TextItem) and item.isVisible() and item.textItem.toPlainText().strip():
                # (InfiniteLine labels are TextItems too)
                out.append(("text " + item.textItem.toPlainText()[:30], float(item.textItem.font().pointSizeF())))
            elif isinstance(item, pg.LabelItem) and item.isVisible() and item.text:
                size = item.opts.get("size")
                pt = float(str(size).rstrip("pt")) if size else float(item.item.font().pointSizeF())
                out.append(("label " + str(item.text)[:30], pt))
    return out


def chart_text_problems(root: QWidget) -> list[str]:
    """Chart text a viewer cannot read whole, in every visible plot under ``root``: a title wider
    than its plot, a text item or marker label that the plot area cuts off (a plot draws nothing
    outside it), and two such texts drawn over each other."""
    out: list[str] = []
    for view in root.findChildren(pg.PlotWidget):
        if not _visible(view):
            continue
        plot = view.getPlotItem()
        title = plot.titleLabel
        name = title.text or _name(view)
        if title.isVisible() and title.text:
            need = title.item.boundingRect().width()
            if need > view.width() + 1:
                out.append(f"chart title {title.text!r} needs {need:.0f}px, the chart is {view.width()}px wide")
        for side in ("bottom", "left"):
            axis = plot.getAxis(side)
            label = axis.label
            if not (axis.isVisible() and label.isVisible() and label.toPlainText().strip()):
                continue
            need = label.boundingRect().width()
            room = axis.width() if side == "bottom" else axis.height()
            if need > room + 1:
                out.append(f"{name}: axis title {label.toPlainText()!r} needs {need:.0f}px, the axis is {room:.0f}px")
        area = plot.vb.sceneBoundingRect()
        texts = []
        for item in view.scene().items():
            if not isinstance(item, pg.TextItem) or not item.isVisible():
                continue
            text = item.textItem.toPlainText().strip()
            if not text:
                continue
            rect = item.mapRectToScene(item.boundingRect())
            if not area.adjusted(-1, -1, 1, 1).contains(rect):
                out.append(f"{name}: {text!r} is cut off by the plot area")
            texts.append((text, rect))
        for i, (a, ra) in enumerate(texts):
            for b, rb in texts[i + 1 :]:
                overlap = ra.intersected(rb)
                if overlap.width() > 2 and overlap.height() > 2:
                    out.append(f"{name}: {a!r} and {b!r} are drawn over each other")
    return out
