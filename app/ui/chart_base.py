"""The base of every FitScope chart: a ``pg.PlotWidget`` whose look follows the system palette
(light or dark), whose text grows for presentation mode, whose title shortens when the plot is too
narrow for it, and which answers the pointer with exact figures (``hover_text``) in a tooltip.

The colours every chart and panel share are here too. The estimate's four charts are in
``charts.py``; the Run, Load, A/B and advisor tabs build their own charts on :class:`Chart`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF
from PySide6.QtGui import QColor, QCursor, QFont, QFontMetrics, QPalette
from PySide6.QtWidgets import QToolTip, QWidget

COLORS = {
    "weights": "#4e79a7",
    "kv": "#f28e2b",
    "compute": "#59a14f",
    "overhead": "#9c9c9c",
    "projector": "#b07aa1",
    "speculative": "#76b7b2",
    "capacity": "#d23c3c",
    "fits": "#2e9d4a",
    "current": "#d6336c",  # your choice: its own colour, apart from the KV cache's orange
    "muted": "#b8b8b8",
}


def nice_ceiling(x: float) -> float:
    """The next of 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 x 10^k at or above ``x`` (axis tops that
    do not move with every small change)."""
    if x <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(x))
    for step in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if step * power >= x * (1 - 1e-12):
            return step * power
    return 10 * power


class Chart(pg.PlotWidget):
    """Common look (follows the palette), hover tooltips and a presentation scale."""

    def __init__(self, title: str, parent: QWidget | None = None, short_title: str | None = None) -> None:
        super().__init__(parent=parent)
        self._full_title = title
        self._short_title = short_title or title
        self._title = title
        self.setMenuEnabled(False)
        self.hideButtons()
        self.setMouseEnabled(x=False, y=False)
        self.plotItem.setTitle(title)
        self.plotItem.showGrid(x=False, y=True, alpha=0.2)
        self.last_hover_text: str | None = None
        self.scene().sigMouseMoved.connect(self._on_mouse_moved)
        self._font = QFont(self.font())
        add_item = self.plotItem.addItem

        def add_styled(item, *args, **kwargs):
            # Text added later (labels that follow the data) takes the chart's current type size.
            if isinstance(item, pg.TextItem):
                item.setFont(self._font)
            return add_item(item, *args, **kwargs)

        self.plotItem.addItem = add_styled  # type: ignore[method-assign]
        self.apply_palette(self.palette(), 1.0)
        # Text placed by pixels is placed again once the plot area has its new size.
        self.plotItem.vb.sigResized.connect(lambda *_: self._fit_texts())
        self.plotItem.vb.sigTransformChanged.connect(lambda *_: self._fit_texts())

    def hover_text(self, x: float, y: float) -> str | None:  # pragma: no cover - overridden
        return None

    # Ranges and ticks are set only when they change: a new range repaints the axes, the most
    # expensive part of a chart, and a slider step should repaint only what moved.
    def _range(self, axis: str, lo: float, hi: float, padding: float = 0.0) -> None:
        key = (lo, hi, padding)
        if getattr(self, "_ranges", {}).get(axis) == key:
            return
        self._ranges = {**getattr(self, "_ranges", {}), axis: key}
        if axis == "x":
            self.plotItem.setXRange(lo, hi, padding=padding)
        else:
            self.plotItem.setYRange(lo, hi, padding=padding)

    def _ticks(self, axis: str, ticks: list[tuple[float, str]], thin: bool = False) -> None:
        """The axis' labelled ticks; with ``thin`` (evenly spaced ticks on the bottom axis), every
        second (or third...) one when the plot is too narrow for all their labels side by side, so
        that none runs into the next."""
        self._all_ticks = {**getattr(self, "_all_ticks", {}), axis: (ticks, thin)}
        if thin and len(ticks) > 2:
            metrics = QFontMetrics(self._font) if hasattr(self, "_font") else QFontMetrics(self.font())
            room = self.plotItem.vb.width() or self.width()
            gap = metrics.horizontalAdvance("  ")
            step = 1
            while step < len(ticks):
                kept = ticks[::step]
                if sum(metrics.horizontalAdvance(t) + gap for _, t in kept) <= room:
                    break
                step += 1
            ticks = ticks[::step]
        if getattr(self, "_tick_cache", {}).get(axis) == ticks:
            return
        self._tick_cache = {**getattr(self, "_tick_cache", {}), axis: ticks}
        self.plotItem.getAxis(axis).setTicks([ticks])

    def _on_mouse_moved(self, scene_pos: QPointF) -> None:
        if not self.plotItem.vb.sceneBoundingRect().contains(scene_pos):
            QToolTip.hideText()
            return
        p = self.plotItem.vb.mapSceneToView(scene_pos)
        text = self.hover_text(p.x(), p.y())
        if text and text == self.last_hover_text and QToolTip.isVisible():
            return  # the same figures: leave the tooltip where it is, to be read
        self.last_hover_text = text
        if text:
            # Shown while the pointer stays on the plot (up to a minute), not for Qt's few seconds.
            QToolTip.showText(QCursor.pos(), text, self, self.rect(), 60_000)
        else:
            QToolTip.hideText()

    def apply_palette(self, palette: QPalette, scale: float) -> None:
        """Colours from the system palette (light or dark) and type size for presentation mode."""
        bg = palette.color(QPalette.ColorRole.Base)
        fg = palette.color(QPalette.ColorRole.Text)
        self.setBackground(bg)
        font = QFont(self.font())
        font.setPointSizeF(max(7.0, font.pointSizeF() * scale))
        for name in ("left", "bottom", "right"):
            axis = self.plotItem.getAxis(name)
            axis.setPen(pg.mkPen(fg))
            axis.setTextPen(pg.mkPen(fg))
            axis.setTickFont(font)
            axis.label.setFont(font)
        self._fg = fg
        self._scale = scale
        self._set_title(self._title)
        legend = self.plotItem.legend
        if legend is not None:
            backdrop = QColor(bg)
            backdrop.setAlpha(215)  # readable over the lines it covers
            legend.setBrush(pg.mkBrush(backdrop))
            legend.setLabelTextColor(fg)
            legend.setLabelTextSize(f"{font.pointSizeF():.0f}pt")
            _rerender_legend(legend)
        self._font = font
        for item in self.plotItem.items:
            if isinstance(item, pg.TextItem):
                item.setFont(font)
            elif isinstance(item, pg.InfiniteLine) and getattr(item, "label", None) is not None:
                # In the text colour on a backdrop: readable over the filled areas it crosses.
                item.label.setFont(font)
                item.label.setColor(fg)
                backdrop = QColor(bg)
                backdrop.setAlpha(200)
                item.label.fill = pg.mkBrush(backdrop)
                item.label.update()
        self._restyle()
        self._fit_title()
        self._fit_texts()

    def _title_size(self) -> str:
        return f"{int(11 * getattr(self, '_scale', 1.0))}pt"

    def _set_title(self, title: str) -> None:
        self._title = title
        fg = getattr(self, "_fg", QColor("#000000"))
        self.plotItem.setTitle(title, color=fg.name(), size=self._title_size())

    def _fit_title(self) -> None:
        """The full title when the plot is wide enough for it at the current type size, else the short one."""
        font = QFont(self.font())
        font.setPointSizeF(11 * getattr(self, "_scale", 1.0))
        need = QFontMetrics(font).horizontalAdvance(self._full_title) + 12
        # The title is centred over the plot area: what it needs beyond that is cut by the edge.
        room = self.plotItem.vb.width() or self.width()
        title = self._full_title if need <= room else self._short_title
        if title != self._title:
            self._set_title(title)

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        if hasattr(self, "_font"):  # pyqtgraph resizes the widget while it is being built
            self._fit_title()
            self._fit_texts()
            for axis, (ticks, thin) in getattr(self, "_all_ticks", {}).items():
                self._ticks(axis, ticks, thin)

    def _fit_texts(self) -> None:
        """Re-choose text that depends on the plot's size in pixels (subclasses)."""

    def _place_labels(self, lines: Sequence[tuple[pg.InfiniteLine, Sequence[float]]]) -> None:
        """Each marker's label at the first of its positions (fractions along the line) where it is
        whole inside the plot and covers no label placed before it; hidden where there is none (the
        legend and the tooltip still name the marker)."""
        area = self.plotItem.vb.sceneBoundingRect()
        placed: list[QRectF] = []
        for line, positions in lines:
            label = line.label
            if not line.isVisible():
                continue
            label.setVisible(True)
            for position in positions:
                label.orthoPos = position
                label.updatePosition()
                rect = label.mapRectToScene(label.boundingRect())
                if area.contains(rect) and not any(rect.intersects(other) for other in placed):
                    placed.append(rect)
                    break
            else:
                label.setVisible(False)

    def addLegend(self, *args, **kwargs):  # noqa: N802 - pyqtgraph's name
        legend = self.plotItem.addLegend(*args, **kwargs)
        legend.setLabelTextSize(f"{self._font.pointSizeF():.0f}pt")
        legend.setLabelTextColor(getattr(self, "_fg", QColor("#000000")))
        return legend

    def _restyle(self) -> None:
        """Re-apply text colours and fonts to items the subclass owns."""


def _rerender_legend(legend: pg.LegendItem) -> None:
    """pyqtgraph stores a legend's new colour and size but draws existing entries with the old ones
    until their text is set again."""
    for _, label in legend.items:
        label.setText(label.text, color=legend.opts["labelTextColor"], size=legend.opts["labelTextSize"])
