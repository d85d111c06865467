"""The estimate's four charts (where the memory goes, memory against context, the quantization
ladder, users that fit), each a :class:`app.ui.chart_base.Chart` with a narrow ``set_data``; its
items are created once and updated in place. Every chart keeps what it was last given in ``shown``
(bytes, tokens) and answers ``hover_text(x, y)`` with exact figures, shown as a tooltip under the
mouse.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFontMetrics
from PySide6.QtWidgets import QWidget

from app.core.common.units import GIB
from app.core.model.quant import quality_words
from app.core.report.machine_text import short_device_name
from app.core.report.verdict import rate_range
from app.services.view import ConcurrencyCurve, ContextCurve, LadderRow
from app.ui.chart_base import COLORS, Chart, nice_ceiling

PARTS = (
    ("weights", "Weights"),
    ("kv", "KV cache (conversation memory)"),
    ("compute", "Compute buffers"),
    ("overhead", "Runtime overhead"),
    ("projector", "Vision projector"),
    ("speculative", "Draft model / MTP head"),
)


def legend_html() -> str:
    """One legend for all the charts, as rich text for a QLabel."""
    items = [f'<span style="color:{COLORS[key]}">&#9632;</span>&nbsp;{label}' for key, label in PARTS]
    items.append(f'<span style="color:{COLORS["capacity"]}"><b>- - -</b></span>&nbsp;Memory the device has')
    items.append(f'<span style="color:{COLORS["current"]}">&#9632;</span>&nbsp;Your choice')
    return " &nbsp;&nbsp; ".join(items)


def _gib(n_bytes: float) -> float:
    return n_bytes / GIB


def context_label(tokens: int) -> str:
    if tokens >= 1024 and tokens % 1024 == 0:
        return f"{tokens // 1024}K"
    return f"{tokens:,}"


def _log2_ticks(lo: int, hi: int) -> list[tuple[float, str]]:
    ticks = []
    v = 512
    while v <= hi * 1.001:
        if v >= lo * 0.999:
            ticks.append((math.log2(v), context_label(v)))
        v *= 2
    return ticks


def _text(color: QColor | str = "#000000", anchor: tuple[float, float] = (0.5, 1.0)) -> pg.TextItem:
    item = pg.TextItem("", color=color, anchor=anchor)
    return item


@dataclass(frozen=True)
class DeviceBar:
    name: str
    weights_bytes: int
    kv_cache_bytes: int
    compute_bytes: int
    overhead_bytes: int
    capacity_bytes: int
    projector_bytes: int = 0
    speculative_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return (
            self.weights_bytes
            + self.kv_cache_bytes
            + self.compute_bytes
            + self.overhead_bytes
            + self.projector_bytes
            + self.speculative_bytes
        )


class SplitChart(Chart):
    """One stacked bar per device (weights, KV cache, compute, overhead, vision projector, draft) against
    its capacity."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Where the memory goes", parent, short_title="Memory use")
        self.plotItem.setLabel("left", "GiB")
        self.bars = {}
        for key, _label in PARTS:
            bar = pg.BarGraphItem(x=[], height=[], width=0.55, brush=COLORS[key], pen=pg.mkPen(None))
            self.plotItem.addItem(bar)
            self.bars[key] = bar
        self.capacity = pg.PlotDataItem(
            [], [], connect="pairs", pen=pg.mkPen(COLORS["capacity"], width=3, style=Qt.PenStyle.DashLine)
        )
        self.plotItem.addItem(self.capacity)
        self.labels: list[pg.TextItem] = []
        self.shown: list[DeviceBar] = []

    def set_data(self, devices: Sequence[DeviceBar]) -> None:
        self.shown = list(devices)
        xs = list(range(len(devices)))
        base = [0.0] * len(devices)
        for key, field in (
            ("weights", "weights_bytes"),
            ("kv", "kv_cache_bytes"),
            ("compute", "compute_bytes"),
            ("overhead", "overhead_bytes"),
            ("projector", "projector_bytes"),
            ("speculative", "speculative_bytes"),
        ):
            heights = [_gib(getattr(d, field)) for d in devices]
            self.bars[key].setOpts(x=xs, height=heights, y0=list(base), width=0.55)
            base = [b + h for b, h in zip(base, heights, strict=True)]
        cx, cy = [], []
        for i, d in enumerate(devices):
            cx += [i - 0.38, i + 0.38]
            cy += [_gib(d.capacity_bytes)] * 2
        self.capacity.setData(cx, cy)
        while len(self.labels) < len(devices):
            item = _text(self._fg)
            self.plotItem.addItem(item)
            self.labels.append(item)
        for i, item in enumerate(self.labels):
            if i < len(devices):
                d = devices[i]
                item.setPos(i, max(_gib(d.total_bytes), _gib(d.capacity_bytes)))
                item.setVisible(True)
            else:
                item.setVisible(False)
        self._fit_texts()
        self._ticks("bottom", [(i, short_device_name(d.name)) for i, d in enumerate(devices)])
        self._top = max([max(_gib(d.total_bytes), _gib(d.capacity_bytes)) for d in devices] or [1.0])
        self._range("x", -0.6, max(len(devices) - 0.4, 0.6))
        self._fit_texts()

    def _restyle(self) -> None:
        for item in getattr(self, "labels", []):
            item.setColor(self._fg)
            item.setFont(self._font)
        self._fit_texts()

    def _fit_texts(self) -> None:
        """Each bar's "used of capacity" label, as long as its share of the plot's width allows."""
        shown = getattr(self, "shown", [])
        if not shown:
            return
        metrics = QFontMetrics(self._font)
        slot = self.plotItem.vb.width() / max(len(shown) + 0.2, 1.0) - 8
        for d, item in zip(shown, self.labels, strict=False):
            used, capacity = _gib(d.total_bytes), _gib(d.capacity_bytes)
            choices = (
                f"{used:.1f} of {capacity:.1f} GiB",
                f"{used:.1f}/{capacity:.1f} GiB",
                f"{used:.0f}/{capacity:.0f}",
            )
            text = next((t for t in choices if metrics.horizontalAdvance(t) <= slot), choices[-1])
            if item.textItem.toPlainText() != text:
                item.setText(text)
        # Room above the tallest bar for its label, at the current type size and plot height.
        top = getattr(self, "_top", 1.0)
        height, text_px = self.plotItem.vb.height(), metrics.height() + 8
        needed = top * height / (height - text_px) if height > 2 * text_px else top * 1.15
        self._range("y", 0, nice_ceiling(max(top * 1.15, needed)))

    def hover_text(self, x: float, y: float) -> str | None:
        i = round(x)
        if not 0 <= i < len(self.shown) or abs(x - i) > 0.4:
            return None
        d = self.shown[i]
        free = d.capacity_bytes - d.total_bytes
        return (
            f"{d.name}\n"
            f"Weights: {_gib(d.weights_bytes):.2f} GiB\n"
            f"KV cache: {_gib(d.kv_cache_bytes):.2f} GiB\n"
            f"Compute buffers: {_gib(d.compute_bytes):.2f} GiB\n"
            f"Runtime overhead: {_gib(d.overhead_bytes):.2f} GiB\n"
            + (f"Vision projector: {_gib(d.projector_bytes):.2f} GiB\n" if d.projector_bytes else "")
            + (f"Draft model / MTP head: {_gib(d.speculative_bytes):.2f} GiB\n" if d.speculative_bytes else "")
            + f"Total: {_gib(d.total_bytes):.2f} of {_gib(d.capacity_bytes):.2f} GiB "
            + (f"({_gib(free):.2f} GiB free)" if free >= 0 else f"({_gib(-free):.2f} GiB short)")
        )


class ContextChart(Chart):
    """Memory against context per user: stacked areas, the capacity, the chosen and largest context."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Memory as the conversation grows", parent, short_title="Memory vs. context")
        self.plotItem.setLabel("left", "GiB")
        self.plotItem.setLabel("bottom", "tokens each")
        self.curves = [pg.PlotDataItem([], [], pen=pg.mkPen(None)) for _ in range(len(PARTS) + 1)]
        for c in self.curves:
            self.plotItem.addItem(c)
        self.fills = []
        for i, (key, _label) in enumerate(PARTS):
            color = QColor(COLORS[key])
            color.setAlpha(200)
            fill = pg.FillBetweenItem(self.curves[i], self.curves[i + 1], brush=color)
            self.plotItem.addItem(fill)
            self.fills.append(fill)
        pen = pg.mkPen(COLORS["capacity"], width=2, style=Qt.PenStyle.DashLine)
        # Under the line, left-aligned from the plot's left edge: never cut there, and never moved
        # to the other side of the line by a change of range.
        self.capacity = pg.InfiniteLine(
            angle=0, pen=pen, label="capacity", labelOpts={"position": 0.01, "anchors": [(0, 0), (0, 0)]}
        )
        # The two vertical markers' labels at different heights: they may stand close together.
        self.chosen = pg.InfiniteLine(
            angle=90, pen=pg.mkPen(COLORS["current"], width=2), label="your context", labelOpts={"position": 0.9}
        )
        fits_pen = pg.mkPen(COLORS["fits"], width=2, style=Qt.PenStyle.DotLine)
        self.largest = pg.InfiniteLine(angle=90, pen=fits_pen, label="largest that fits", labelOpts={"position": 0.55})
        for item in (self.capacity, self.chosen, self.largest):
            self.plotItem.addItem(item)
        self.shown: ContextCurve | None = None
        self.chosen_tokens = 0

    def set_data(self, curve: ContextCurve, chosen_tokens: int) -> None:
        if curve is self.shown:  # the curve does not depend on the chosen context: move the marker only
            self.set_chosen(chosen_tokens)
            return
        self.shown = curve
        xs = [math.log2(n) for n in curve.contexts]
        acc = [0.0] * len(xs)
        self.curves[0].setData(xs, acc)
        projector = curve.projector_bytes or (0,) * len(xs)
        draft = curve.speculative_bytes or (0,) * len(xs)
        for i, series in enumerate(
            (curve.weights_bytes, curve.kv_cache_bytes, curve.compute_bytes, curve.overhead_bytes, projector, draft),
            start=1,
        ):
            acc = [a + _gib(v) for a, v in zip(acc, series, strict=True)]
            self.curves[i].setData(xs, acc)
        self.capacity.setValue(_gib(curve.capacity_bytes))
        self.largest.setVisible(curve.max_context_tokens > 0)
        if curve.max_context_tokens > 0:
            self.largest.setValue(math.log2(curve.max_context_tokens))
        self._move_chosen(chosen_tokens)
        self._ticks("bottom", _log2_ticks(curve.contexts[0], curve.contexts[-1]), thin=True)
        top = max(max(acc, default=0.0), _gib(curve.capacity_bytes))
        self._range("y", 0, nice_ceiling(top * 1.05))
        self._range("x", xs[0], xs[-1], padding=0.02)
        self._fit_texts()

    def set_chosen(self, chosen_tokens: int) -> None:
        self._move_chosen(chosen_tokens)
        self._fit_texts()

    def _move_chosen(self, chosen_tokens: int) -> None:
        """The chosen context's marker, its label placed by the caller (once the ranges are set)."""
        self.chosen_tokens = chosen_tokens
        self.chosen.setValue(math.log2(max(chosen_tokens, 1)))

    def _fit_texts(self) -> None:
        """The capacity's label at the left; each vertical marker's at the highest of a few heights
        where it covers no other label."""
        if not hasattr(self, "largest"):
            return  # the base class styles the chart before the markers exist
        heights = (0.85, 0.7, 0.55, 0.4, 0.25, 0.12)
        self._place_labels([(self.capacity, (0.01,)), (self.chosen, heights), (self.largest, heights)])

    def hover_text(self, x: float, y: float) -> str | None:
        c = self.shown
        if c is None:
            return None
        i = min(range(len(c.contexts)), key=lambda k: abs(math.log2(c.contexts[k]) - x))
        projector = c.projector_bytes[i] if c.projector_bytes else 0
        draft = c.speculative_bytes[i] if c.speculative_bytes else 0
        total = (
            c.weights_bytes[i] + c.kv_cache_bytes[i] + c.compute_bytes[i] + c.overhead_bytes[i] + projector + draft
        )
        return (
            f"{c.contexts[i]:,} tokens per user on {c.label}\n"
            f"Weights: {_gib(c.weights_bytes[i]):.2f} GiB\n"
            f"KV cache: {_gib(c.kv_cache_bytes[i]):.2f} GiB\n"
            f"Compute buffers: {_gib(c.compute_bytes[i]):.2f} GiB\n"
            f"Runtime overhead: {_gib(c.overhead_bytes[i]):.2f} GiB\n"
            + (f"Vision projector: {_gib(projector):.2f} GiB\n" if projector else "")
            + (f"Draft model / MTP head: {_gib(draft):.2f} GiB\n" if draft else "")
            + f"Total: {_gib(total):.2f} of {_gib(c.capacity_bytes):.2f} GiB\n"
            f"Largest context that fits: {c.max_context_tokens:,} tokens"
        )


class LadderChart(Chart):
    """Every quantization preset: memory (bars) against the capacity line, with the expected decode
    speed and the published quality loss in a column on the right; the current choice highlighted,
    the ones that do not fit greyed. The column is an axis (drawn once, cached) rather than dozens
    of text items, which keeps repaints cheap."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Quantization ladder: memory, speed, quality", parent, short_title="Quantization ladder")
        self.plotItem.setLabel("bottom", "GiB")
        self.plotItem.showGrid(x=True, y=False, alpha=0.2)
        self.plotItem.showAxis("right")
        self.bars = pg.BarGraphItem(x0=[], y=[], width=[], height=0.7, brushes=[], pen=pg.mkPen(None))
        self.plotItem.addItem(self.bars)
        pen = pg.mkPen(COLORS["capacity"], width=2, style=Qt.PenStyle.DashLine)
        self.capacity = pg.InfiniteLine(angle=90, pen=pen, label="capacity", labelOpts={"position": 0.9})
        self.plotItem.addItem(self.capacity)
        self.plotItem.invertY(True)
        self.shown: list[LadderRow] = []

    def set_data(self, rows: Sequence[LadderRow]) -> None:
        self.shown = list(rows)
        ys = list(range(len(rows)))
        widths = [_gib(r.budget_bytes) for r in rows]
        brushes = [COLORS["current"] if r.current else (COLORS["weights"] if r.fits else COLORS["muted"]) for r in rows]
        self.bars.setOpts(x0=[0.0] * len(rows), y=ys, width=widths, height=0.7, brushes=brushes)
        capacity = _gib(rows[0].capacity_bytes) if rows else 0.0
        self.capacity.setValue(capacity)
        self._ticks("left", [(i, r.preset) for i, r in enumerate(rows)])
        texts = [self._row_text(r) for r in rows]
        self._ticks("right", list(enumerate(texts)))
        metrics = QFontMetrics(self._font)
        width = max((metrics.horizontalAdvance(t) for t in texts), default=40) + 16
        if width != getattr(self, "_right_width", None):
            self._right_width = width
            self.plotItem.getAxis("right").setWidth(width)
        right = max(max(widths, default=1.0), capacity)
        self._range("x", 0, nice_ceiling(right * 1.05))
        self._range("y", -0.6, max(len(rows) - 0.4, 0.6))
        self._fit_texts()

    def _fit_texts(self) -> None:
        if hasattr(self, "capacity"):  # the base class styles the chart before the marker exists
            self._place_labels([(self.capacity, (0.9, 0.5, 0.1))])

    @staticmethod
    def _row_text(r: LadderRow) -> str:
        """Memory, speed and quality in words (the perplexity figures are in the tooltip)."""
        text = f"{_gib(r.budget_bytes):.1f} GiB · {rate_range(r.decode_tokens_per_s)}"
        if r.ppl_increase is not None:
            text += f" · {quality_words(r.ppl_increase)}"
        if r.measured is not None:
            text += f" · measured here against {r.measured.reference_preset}"
        if r.placement != "gpu":
            text += f" · {r.placement_words}"
        return text + (" ◀" if r.current else "")

    def _restyle(self) -> None:
        self._tick_cache = {}
        if getattr(self, "shown", None):
            self.set_data(self.shown)

    def hover_text(self, x: float, y: float) -> str | None:
        i = round(y)
        if not 0 <= i < len(self.shown):
            return None
        r = self.shown[i]
        quality = (
            f"{quality_words(r.ppl_increase)} (published perplexity increase {r.ppl_increase:+.4f})"
            if r.ppl_increase is not None
            else "no published perplexity figure"
        )
        m = r.measured
        if m is not None:
            quality += (
                f"\nMeasured on this model: perplexity {m.delta_perplexity:+.3f} (95% interval "
                f"{m.low:+.3f} to {m.high:+.3f}) against {m.reference_preset}, {m.tokens:,} tokens of {m.text_name}"
            )
        speed = r.decode_tokens_per_s
        return (
            f"{r.preset}: {r.description}\n"
            f"Memory: {_gib(r.budget_bytes):.2f} of {_gib(r.capacity_bytes):.2f} GiB"
            + ("" if r.fits else " (does not fit)")
            + f"\nDecode: {rate_range(speed)}\nQuality: {quality}"
            + ("\n(your current choice)" if r.current else "")
        )


LEVEL_COLORS = {"green": COLORS["fits"], "amber": "#e0a100", "red": COLORS["capacity"]}


class ConcurrencyChart(Chart):
    """How many people, each with the given conversation length, fit at once. The line passes
    through the exact count at the chosen length (the same count the verdict's "up to N people"
    says), and the chosen point takes the verdict's colour: it is never drawn as fitting when the
    verdict says it does not."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("How many people fit at once", parent, short_title="People that fit")
        self.plotItem.setLabel("left", "people")
        self.plotItem.setLabel("bottom", "tokens each")
        self.line = pg.PlotDataItem(
            [], [], pen=pg.mkPen(COLORS["weights"], width=3), symbol="o", symbolSize=7, symbolBrush=COLORS["weights"]
        )
        self.plotItem.addItem(self.line)
        self.point = pg.ScatterPlotItem(size=14, brush=COLORS["current"], pen=pg.mkPen("w", width=1.5))
        self.plotItem.addItem(self.point)
        self.chosen = pg.InfiniteLine(angle=90, pen=pg.mkPen(COLORS["current"], width=1))
        self.plotItem.addItem(self.chosen)
        self.shown: ConcurrencyCurve | None = None
        self.chosen_point: tuple[int, int] = (0, 0)
        self.fit_at_choice = 0
        self.level = ""
        self._cap = 0

    def set_data(
        self,
        curve: ConcurrencyCurve,
        context_tokens: int,
        users: int,
        cap: int,
        fit_at_choice: int | None = None,
        level: str = "",
    ) -> None:
        """``curve``: people that fit against conversation length; the choice (``context_tokens``,
        ``users``); ``fit_at_choice`` the people that fit at exactly that length (the verdict's
        count) and ``level`` the verdict's light (green, amber, red), which colours the choice."""
        self.shown = curve
        self._cap = cap
        self.fit_at_choice = fit_at_choice if fit_at_choice is not None else 0
        self.level = level
        points = dict(zip(curve.contexts, curve.users, strict=True))
        if fit_at_choice is not None:
            points[context_tokens] = fit_at_choice
        contexts = sorted(points)
        xs = [math.log2(n) for n in contexts]
        self.line.setData(xs, [points[n] for n in contexts])
        self.set_chosen(context_tokens, users)
        self._ticks("bottom", _log2_ticks(contexts[0], contexts[-1]), thin=True)
        lo, hi = min(xs[0], math.log2(max(context_tokens, 1))), max(xs[-1], math.log2(max(context_tokens, 1)))
        self._range("x", lo, hi, padding=0.03)
        self._range("y", 0, nice_ceiling(max(max(curve.users, default=1), users, 1) * 1.08))

    def set_chosen(self, context_tokens: int, users: int) -> None:
        self.chosen_point = (context_tokens, users)
        x = math.log2(max(context_tokens, 1))
        self.point.setData([x], [users], brush=pg.mkBrush(LEVEL_COLORS.get(self.level, COLORS["current"])))
        self.chosen.setValue(x)

    @property
    def choice_fits(self) -> bool:
        """Whether the chart shows the choice as fitting: on or under the line, not in red."""
        _context, users = self.chosen_point
        return users <= self.fit_at_choice and self.level != "red"

    def hover_text(self, x: float, y: float) -> str | None:
        c = self.shown
        if c is None:
            return None
        i = min(range(len(c.contexts)), key=lambda k: abs(math.log2(c.contexts[k]) - x))
        n = c.users[i]
        more = "+" if n >= self._cap else ""
        return f"{c.contexts[i]:,} tokens each: {n}{more} people fit at once"
