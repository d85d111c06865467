"""The advisor's chart: price against speed per person for every machine that does the job, the
best buys (no other machine both cheaper and faster) joined up, the chosen one ringed. Items are
created once and updated."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pyqtgraph as pg
from PySide6.QtWidgets import QWidget

from app.core.advisor.records import Candidate
from app.ui.chart_base import COLORS, Chart


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both price (x, lower) and speed (y, higher),
    cheapest first."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], -math.inf
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


class PriceSpeedChart(Chart):
    """Price against speed per user: every machine that does it, the best buys joined up, the
    chosen one ringed. Items are created once and updated."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Price against speed per user", parent, short_title="Price vs. speed")
        self.setLabel("bottom", "price (US dollars)")
        self.setLabel("left", "speed per user")
        self.others = pg.ScatterPlotItem(size=8, brush=pg.mkBrush(COLORS["muted"]), pen=pg.mkPen(None))
        self.front_line = pg.PlotDataItem([], [], pen=pg.mkPen(COLORS["fits"], width=2))
        self.front = pg.ScatterPlotItem(size=12, brush=pg.mkBrush(COLORS["fits"]), pen=pg.mkPen("w", width=1))
        self.chosen = pg.ScatterPlotItem(size=18, brush=pg.mkBrush(None), pen=pg.mkPen(COLORS["current"], width=3))
        for item in (self.others, self.front_line, self.front, self.chosen):
            self.addItem(item)
        self.rows: list[Candidate] = []
        self.front_indices: list[int] = []
        self._unit = 1.0

    def set_data(self, rows: Sequence[Candidate], unit: float, unit_name: str) -> None:
        """``rows``: the ranked machines with a price; speeds shown times ``unit`` (words or tokens)."""
        self.rows = [r for r in rows if r.price_usd is not None]
        self._unit = unit
        self.setLabel("left", f"speed per user ({unit_name})")
        points = [(r.price_usd or 0.0, r.decode_typical * unit) for r in self.rows]
        self.front_indices = pareto_front(points)
        on_front = set(self.front_indices)
        self.others.setData(
            [p[0] for i, p in enumerate(points) if i not in on_front],
            [p[1] for i, p in enumerate(points) if i not in on_front],
        )
        fx = [points[i][0] for i in self.front_indices]
        fy = [points[i][1] for i in self.front_indices]
        self.front.setData(fx, fy)
        self.front_line.setData(fx, fy)
        self.chosen.setData([], [])

    def set_chosen(self, c: Candidate | None) -> None:
        if c is None or c.price_usd is None:
            self.chosen.setData([], [])
        else:
            self.chosen.setData([c.price_usd], [c.decode_typical * self._unit])

    def hover_text(self, x: float, y: float) -> str | None:
        if not self.rows:
            return None
        vb = self.plotItem.vb
        (x0, x1), (y0, y1) = vb.viewRange()
        sx, sy = max(x1 - x0, 1e-9), max(y1 - y0, 1e-9)
        best = min(
            self.rows,
            key=lambda r: ((r.price_usd or 0) - x) ** 2 / sx**2 + (r.decode_typical * self._unit - y) ** 2 / sy**2,
        )
        return f"{best.label}, {best.quant}: ${best.price_usd:,.0f}, {best.decode_typical * self._unit:.1f} per user"
