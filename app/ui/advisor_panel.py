"""The "Which machine?" tab: the workload in plain words in, the catalog's machines that do it out —
ranked, on a price-against-speed chart with the best buys joined up, each with why the others fail —
and one click to open a configuration in the main view. The sweep is :func:`app.services.advisor`,
run on the tab's job runner."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pyqtgraph as pg
from PySide6.QtCore import Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.core.advisor.commands import launch_commands
from app.core.advisor.records import CATEGORY_WORDS, QUALITY_FLOORS, Candidate, HardwareAdvice, Workload
from app.core.report.choices import Controls, HardwareChoice, ModelChoice
from app.core.report.verdict import WORDS_PER_TOKEN
from app.services.advisor import advise, words_to_tokens, workload_sentence
from app.ui.chart_base import COLORS, Chart
from app.ui.jobs import JobRunner
from app.ui.panels import fill_table, readonly_table

CurrentModel = Callable[[], tuple[ModelChoice, Controls]]
"""The main view's model and settings (the workload starts from them)."""
OpenConfiguration = Callable[[ModelChoice, HardwareChoice, Controls], None]
"""Shows a configuration in the main view."""

DEMO_CATALOG_ID = "gemma-3-270m"  # the demo file's architecture, for a catalog sweep
HEADERS = ("#", "Machine", "Quantization", "Price", "Memory to spare", "Speed per user", "All users", "Verdict")


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


class AdvisorPanel(QWidget):
    """Takes the workload, runs the advisor off the GUI thread with progress, shows the answer."""

    advice_shown = Signal(object)  # the HardwareAdvice on screen
    configuration_opened = Signal(object)  # the Candidate sent to the main view
    error_shown = Signal(str)

    def __init__(self, current: CurrentModel, open_configuration: OpenConfiguration, parent: QWidget | None = None):
        super().__init__(parent)
        self._current = current
        self._open = open_configuration
        self.advice: HardwareAdvice | None = None
        self._workload: Workload | None = None
        self._prefilled = False
        self._job = JobRunner("advisor", self)
        self._job.progressed.connect(self._on_progress)
        self._job.finished.connect(self._on_finished)
        self._job.failed.connect(self._on_failed)
        self._job.running_changed.connect(self._on_running)
        self._build()

    # -- layout ------------------------------------------------------------------------------------

    def _build(self) -> None:
        box = QGroupBox("What the machine must do")
        form = QFormLayout(box)
        self.model_label = QLabel("The model chosen on the left.")
        self.model_label.setWordWrap(True)
        form.addRow("Model", self.model_label)
        self.context = QSpinBox()
        self.context.setRange(512, 1 << 20)
        self.context.setSingleStep(1024)
        self.context.setValue(8192)
        self.context.setSuffix(" tokens")
        self.context.setAccessibleName("Context per user")
        form.addRow("Conversation length per user", self.context)
        self.users = QSpinBox()
        self.users.setRange(1, 64)
        self.users.setAccessibleName("Users at once")
        form.addRow("People using it at once", self.users)
        speed_row = QHBoxLayout()
        self.speed = QDoubleSpinBox()
        self.speed.setRange(0.0, 1000.0)
        self.speed.setDecimals(1)
        self.speed.setValue(10.0)
        self.speed.setAccessibleName("Minimum speed per user")
        self.speed_unit = QComboBox()
        self.speed_unit.addItem("words a second", "words")
        self.speed_unit.addItem("tokens a second", "tokens")
        self.speed_unit.setToolTip(f"English prose is about {WORDS_PER_TOKEN} words per token.")
        speed_row.addWidget(self.speed)
        speed_row.addWidget(self.speed_unit)
        form.addRow("Each person needs at least", speed_row)
        self.quality = QComboBox()
        for key, (words, _limit) in QUALITY_FLOORS.items():
            self.quality.addItem(words[0].upper() + words[1:], key)
        self.quality.setCurrentIndex(1)
        form.addRow("Answers' quality", self.quality)
        self.budget = QSpinBox()
        self.budget.setRange(0, 10_000_000)
        self.budget.setSingleStep(1000)
        self.budget.setPrefix("$")
        self.budget.setSpecialValueText("no limit")
        form.addRow("Budget", self.budget)
        self.prefer = QComboBox()
        self.prefer.addItem("the lowest price", "price")
        self.prefer.addItem("the fastest", "speed")
        self.prefer.addItem("the most memory to spare", "headroom")
        form.addRow("Put first", self.prefer)
        buttons = QHBoxLayout()
        self.find_button = QPushButton("Find &machines")
        self.find_button.clicked.connect(self.find_machines)
        buttons.addWidget(self.find_button)
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setVisible(False)
        buttons.addWidget(self.progress, 1)
        form.addRow(buttons)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        form.addRow(self.status)

        self.table = readonly_table(HEADERS, stretch_last=True)
        self.table.setSelectionBehavior(self.table.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(self.table.SelectionMode.SingleSelection)
        self.table.setAccessibleName("Machines that do it")
        self.table.itemSelectionChanged.connect(self._on_selected)
        self.table.doubleClicked.connect(lambda _index: self.open_selected())
        self.chart = PriceSpeedChart()
        self.chart.setMinimumHeight(240)
        self.why_text = QPlainTextEdit()
        self.why_text.setReadOnly(True)
        self.why_text.setAccessibleName("Why the others fail")
        self.why_text.setMaximumHeight(150)
        self.command_text = QPlainTextEdit()
        self.command_text.setReadOnly(True)
        self.command_text.setAccessibleName("Launch command")
        self.command_text.setMaximumHeight(90)
        actions = QHBoxLayout()
        self.open_button = QPushButton("&Open this configuration")
        self.open_button.setEnabled(False)
        self.open_button.setToolTip("Show this machine, model, context and users in the main view")
        self.open_button.clicked.connect(self.open_selected)
        self.copy_button = QPushButton("Copy the launch command")
        self.copy_button.setEnabled(False)
        self.copy_button.clicked.connect(self.copy_command)
        actions.addWidget(self.open_button)
        actions.addWidget(self.copy_button)
        actions.addStretch(1)

        layout = QVBoxLayout(self)
        layout.addWidget(box)
        layout.addWidget(QLabel("Machines that do it, best first (double-click one to open it)"))
        layout.addWidget(self.table, 2)
        layout.addWidget(self.chart, 2)
        layout.addLayout(actions)
        layout.addWidget(QLabel("The launch command"))
        layout.addWidget(self.command_text)
        layout.addWidget(QLabel("The best of each kind, and why the others fall short"))
        layout.addWidget(self.why_text)

    # -- the workload --------------------------------------------------------------------------------

    def _speed_unit(self) -> tuple[float, str]:
        if self.speed_unit.currentData() == "words":
            return WORDS_PER_TOKEN, "words a second"
        return 1.0, "tokens/s"

    def workload(self) -> Workload:
        """The workload on screen, for the model chosen on the left."""
        model, _controls = self._current()
        if model.kind == "demo":
            model = ModelChoice(kind="catalog", ref=DEMO_CATALOG_ID, quant=model.quant)
        speed = self.speed.value()
        tps = words_to_tokens(speed) if self.speed_unit.currentData() == "words" else speed
        return Workload(
            model=model,
            context_per_user_tokens=self.context.value(),
            users=self.users.value(),
            min_tokens_per_s=tps,
            budget_usd=float(self.budget.value()) or None,
            prefer=self.prefer.currentData(),
            quality_floor=self.quality.currentData(),
        )

    def prefill(self) -> None:
        """Take context and users from the main view (when the tab is first shown)."""
        model, controls = self._current()
        self.context.setValue(controls.context_per_user_tokens)
        self.users.setValue(controls.users)
        self.model_label.setText(model.ref or "the built-in demo model")

    def showEvent(self, event) -> None:  # noqa: N802 - Qt's name
        if not self._prefilled:
            self._prefilled = True
            self.prefill()
        super().showEvent(event)

    def find_machines(self) -> bool:
        """Start the sweep; False when one is running or the workload cannot be read."""
        if self._job.running:
            return False
        try:
            workload = self.workload()
        except ValueError as exc:
            self._on_failed(0, str(exc))
            return False
        self._workload = workload
        self.model_label.setText(workload.model.ref)
        self.status.setText("Going through the catalog…")
        return bool(self._job.start(lambda report: advise(workload, progress=lambda f, m: report("progress", (f, m)))))

    @property
    def running(self) -> bool:
        return self._job.running

    # -- results -----------------------------------------------------------------------------------

    def _on_running(self, running: bool) -> None:
        self.find_button.setEnabled(not running)
        self.progress.setVisible(running)
        if running:
            self.progress.setValue(0)

    def _on_progress(self, kind: str, payload: object) -> None:
        if kind == "progress" and isinstance(payload, tuple):
            fraction, message = payload
            self.progress.setValue(int(100 * fraction))
            self.progress.setFormat(f"%p% · {message}")

    def _on_failed(self, _job_id: int, message: str) -> None:
        self.status.setText(message)
        self.error_shown.emit(message)

    def _on_finished(self, _job_id: int, advice: HardwareAdvice) -> None:
        self.show_advice(advice)

    def show_advice(self, advice: HardwareAdvice) -> None:
        self.advice = advice
        w = advice.workload
        unit, unit_name = self._speed_unit()
        self.status.setText(
            f"{workload_sentence(w, advice.model_label)} {advice.evaluated:,} configurations looked at in "
            f"{advice.seconds:.1f} s: {len(advice.ranked)} machines do it."
            if advice.ranked
            else f"{workload_sentence(w, advice.model_label)} No machine in the catalog does it; below, the nearest."
        )
        rows = []
        for i, c in enumerate(advice.ranked, 1):
            speed = c.decode_typical * unit
            rows.append(
                [
                    str(i),
                    c.label,
                    f"{c.quant} ({c.quality})",
                    f"${c.price_usd:,.0f}" if c.price_usd is not None else "not listed",
                    f"{c.headroom_bytes / 2**30:,.1f} GiB",
                    f"{speed:,.1f} {unit_name}",
                    f"{c.total_tokens_per_s * unit:,.0f} {unit_name}",
                    "does it",
                ]
            )
        fill_table(self.table, rows)
        self.chart.set_data(advice.ranked, unit, unit_name)
        lines = []
        for kind, c in advice.best_per_category().items():
            verdict = "does it" if c.passes else "falls short"
            lines.append(f"{CATEGORY_WORDS[kind]}: {c.label} ({c.quant}) {verdict}: {c.reason}.")
        for device_id in dict.fromkeys(c.device_id for c in advice.ranked[:10] if c.count > 1):
            one = advice.why_not(device_id, 1)
            if one is not None:
                lines.append(f"Why not one {one.device_name}: {one.reason}.")
        self.why_text.setPlainText("\n".join(lines))
        if rows:
            self.table.selectRow(0)
        else:
            self._on_selected()
        self.advice_shown.emit(advice)

    def selected(self) -> Candidate | None:
        if self.advice is None:
            return None
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        if not rows:
            return None
        index = rows[0].row()
        return self.advice.ranked[index] if index < len(self.advice.ranked) else None

    def _on_selected(self) -> None:
        c = self.selected()
        self.open_button.setEnabled(c is not None)
        self.copy_button.setEnabled(c is not None)
        self.chart.set_chosen(c)
        if c is None or self.advice is None:
            self.command_text.setPlainText("")
            return
        llama, vllm = launch_commands(self.advice, c)
        text = llama + (f"\n\n{vllm}" if vllm else "") + f"\n\nPrice: {c.price_note}."
        self.command_text.setPlainText(text)

    def open_selected(self) -> Candidate | None:
        """Sends the selected configuration to the main view (model and preset, hardware, context,
        users); returns it, or None when nothing is selected."""
        c = self.selected()
        if c is None or self.advice is None:
            return None
        w = self.advice.workload
        model = w.model if w.model.kind == "gguf" else w.model.model_copy(update={"quant": c.quant})
        self._open(model, c.hardware_choice(), c.controls(w))
        self.configuration_opened.emit(c)
        return c

    def copy_command(self) -> str:
        c = self.selected()
        if c is None or self.advice is None:
            return ""
        text = launch_commands(self.advice, c)[0]
        QGuiApplication.clipboard().setText(text)
        self.status.setText("The llama-server command is on the clipboard.")
        return text

    def shutdown(self) -> None:
        self._job.close(timeout=5)
