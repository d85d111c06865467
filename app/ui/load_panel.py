"""The Load tab: what batching does to latency as more people use the endpoint. The simulation is
fed by this machine's own measurements of the open model (prefill, and decode steps with 1, 2 and
4 sequences), and memory — the KV cache per slot, from the estimator — caps the slots."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.adapters.batch_probe import BatchProfile
from app.adapters.cpu_topology import llama_math_threads
from app.core.common.errors import FitScopeError
from app.core.speed.loadsim import Lengths, LoadResult
from app.services.load import LoadSimulation, simulate_load
from app.ui.chart_base import COLORS, Chart
from app.ui.jobs import JobRunner
from app.ui.panels import fill_table, readonly_table
from app.ui.stale import StaleMark

# (gguf path) -> (cached profile or None, measure(on_event) -> profile, slots for N tokens)
LoadSource = tuple[str, Callable[[], BatchProfile | None], Callable[[], BatchProfile], Callable[[int], int]]


_NONE_YET = 1 << 62  # above any job id: no simulation's result is wanted until one is asked for


class LoadPanel(QWidget):
    simulated = Signal(object)  # list[LoadResult]
    error_shown = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._source: LoadSource | None = None
        self.profile: BatchProfile | None = None
        self.results: list[LoadResult] = []
        self.max_slots: int | None = None
        self._job = JobRunner("load", self)
        self._latest_simulation = _NONE_YET
        self._job.finished.connect(self._on_done)
        self._job.failed.connect(self._on_failed)
        self._job.running_changed.connect(lambda _running: self._update_buttons())
        self._build()

    def _build(self) -> None:
        box = QGroupBox("Load")
        form = QFormLayout(box)
        self.model_label = QLabel("")
        self.model_label.setWordWrap(True)
        self.model_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        form.addRow("Model", self.model_label)
        self.mode = QComboBox()
        self.mode.addItem("users", "users")
        self.mode.addItem("arrival rate", "rate")
        self.mode.setItemData(
            0, "Concurrent users, each sending the next request when answered", Qt.ItemDataRole.ToolTipRole
        )
        self.mode.setItemData(1, "Requests arriving at random at a mean rate per second", Qt.ItemDataRole.ToolTipRole)
        self.mode.setAccessibleName("How the load is given")
        form.addRow("Load &given as", self.mode)
        self.users = QLineEdit("1,2,4,8,16")
        self.users.setAccessibleName("Load points to simulate")
        self.users_label = QLabel("Concurrent &users")
        self.users_label.setBuddy(self.users)
        form.addRow(self.users_label, self.users)
        self.users.setMinimumWidth(80)
        self.think = QDoubleSpinBox()
        self.think.setRange(0, 600)
        self.think.setSuffix(" s")
        form.addRow("&Think time between requests", self.think)
        self.prompt_lo, self.prompt_hi = QSpinBox(), QSpinBox()
        self.output_lo, self.output_hi = QSpinBox(), QSpinBox()
        for spin, value in ((self.prompt_lo, 128), (self.prompt_hi, 512), (self.output_lo, 64), (self.output_hi, 256)):
            spin.setRange(1, 1 << 17)
            spin.setValue(value)
        for text, lo, hi in (
            ("&Prompt tokens", self.prompt_lo, self.prompt_hi),
            ("&Output tokens", self.output_lo, self.output_hi),
        ):
            row = QHBoxLayout()
            row.addWidget(lo)
            row.addWidget(QLabel("to"))
            row.addWidget(hi)
            label = QLabel(text)
            label.setBuddy(lo)
            form.addRow(label, row)
        self.slots = QSpinBox()
        self.slots.setRange(1, 256)
        self.slots.setValue(4)
        self.slots.setToolTip("llama-server's -np: requests decoded together")
        form.addRow("Parallel &slots", self.slots)
        self.requests = QSpinBox()
        self.requests.setRange(20, 5000)
        self.requests.setValue(300)
        form.addRow("Requests per point", self.requests)
        buttons = QHBoxLayout()
        self.measure_button = QPushButton("&Measure this machine")
        self.simulate_button = QPushButton("Si&mulate")
        buttons.addWidget(self.measure_button)
        buttons.addWidget(self.simulate_button)
        form.addRow(buttons)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        form.addRow(self.status)

        self.throughput_chart = Chart("Throughput as users are added", short_title="Throughput")
        self.throughput_chart.setLabel("bottom", "concurrent users")
        self.throughput_chart.setLabel("left", "generated tokens/s (all users)")
        self.throughput_chart.addLegend(offset=(10, 10))
        self.chart = Chart("Waiting time per request", short_title="Waiting")
        self.chart.setLabel("bottom", "concurrent users")
        self.chart.setLabel("left", "seconds")
        self.chart.addLegend(offset=(10, 10))
        for chart in (self.throughput_chart, self.chart):
            chart.setMinimumSize(260, 180)  # below that a chart is unreadable: the tab scrolls instead
        self.throughput = {}
        self.curves = {}
        # Batched and one-by-one differ in line style and marker (filled circles, hollow squares), so
        # their legend entries can be told apart; the colour says which waiting time it is.
        for batching, style, symbol in ((True, Qt.PenStyle.SolidLine, "o"), (False, Qt.PenStyle.DashLine, "s")):
            policy = "batched" if batching else "one by one"
            fill = None if batching else pg.mkBrush(None)
            self.throughput[batching] = self.throughput_chart.plot(
                [],
                [],
                pen=pg.mkPen(COLORS["weights"], width=2, style=style),
                symbol=symbol,
                symbolSize=7,
                symbolBrush=fill if fill is not None else COLORS["weights"],
                name=policy,
            )
            for key, color, what in (
                ("ttft_p95_s", COLORS["compute"], "1st token p95"),
                ("e2e_p50_s", COLORS["weights"], "answer p50"),
                ("e2e_p95_s", COLORS["kv"], "answer p95"),
            ):
                self.curves[(batching, key)] = self.chart.plot(
                    [],
                    [],
                    pen=pg.mkPen(color, width=2, style=style),
                    symbol=symbol,
                    symbolSize=7,
                    symbolPen=pg.mkPen(color, width=1.5),
                    symbolBrush=fill if fill is not None else color,
                    name=f"{policy}, {what}",
                )
        self.table = readonly_table(
            [
                "Load",
                "Batching",
                "Tokens/s",
                "Requests/s",
                "TTFT p50",
                "TTFT p95",
                "End-to-end p50",
                "End-to-end p95",
                "Queue p95",
                "Slots",
            ]
        )
        self.summary = QLabel("")
        self.summary.setWordWrap(True)
        right = QVBoxLayout()
        self.stale_note = QLabel("")
        right.addWidget(self.stale_note)
        charts = QHBoxLayout()
        charts.addWidget(self.throughput_chart)
        charts.addWidget(self.chart)
        right.addLayout(charts, 3)
        right.addWidget(self.table, 2)
        right.addWidget(self.summary)
        layout = QHBoxLayout(self)
        box.setMaximumWidth(420)
        layout.addWidget(box, 1)
        layout.addLayout(right, 3)
        self.stale = StaleMark(
            self.stale_note, [self.throughput_chart, self.chart, self.table, self.summary], "press Simulate", ("model",)
        )
        self.mode.currentIndexChanged.connect(self._mode_changed)
        self.measure_button.clicked.connect(self.measure)
        self.simulate_button.clicked.connect(self.simulate)
        self._update_buttons()

    @property
    def charts(self) -> tuple[Chart, Chart]:
        return (self.throughput_chart, self.chart)

    def set_source(self, source: LoadSource | None, reason: str = "") -> None:
        """The open model file and how to measure it here; None disables the tab with ``reason``."""
        if source is not None and self._source is not None and source[0] == self._source[0]:
            return
        self._source = source
        # A simulation of the previous file still under way is not this file's: it is dropped.
        self._latest_simulation = _NONE_YET
        self.results = []
        self.profile = source[1]() if source is not None else None
        self.model_label.setText(source[0].rsplit("/", 1)[-1] if source is not None else reason)
        self.status.setText(
            "Measured earlier on this machine." if self.profile else "Measure this machine first (about 10 s)."
        )
        self._update_buttons()
        if self.profile is not None:
            self.simulate()

    @property
    def busy(self) -> bool:
        return self._job.running

    def _update_buttons(self) -> None:
        self.measure_button.setEnabled(self._source is not None and not self.busy)
        self.simulate_button.setEnabled(self.profile is not None and not self.busy)

    def measure(self) -> None:
        if self._source is None or self.busy:
            return
        measure = self._source[2]
        self.stale.begin()
        self.status.setText("Measuring prefill and batched decoding (1, 2 and 4 sequences)…")
        self._job.start(lambda _report: measure())

    def _on_done(self, job_id: int, outcome: BatchProfile | LoadSimulation) -> None:
        if isinstance(outcome, LoadSimulation):
            if job_id < self._latest_simulation:
                return  # asked for before the settings changed again: a newer one is on its way
            self.max_slots = outcome.max_slots
            self.results = list(outcome.points)
            self._show()
            self.stale.done()
            self.simulated.emit(self.results)
            return
        self.profile = outcome
        self.simulate()

    def _on_failed(self, _job_id: int, message: str) -> None:
        self.status.setText(message)
        self.error_shown.emit(message)

    @property
    def by_rate(self) -> bool:
        return self.mode.currentData() == "rate"

    def _mode_changed(self) -> None:
        rate = self.by_rate
        self.users_label.setText("Arrival &rates (requests/s)" if rate else "Concurrent &users")
        self.users.setText("0.1,0.2,0.4,0.8" if rate else "1,2,4,8,16")
        self.think.setEnabled(not rate)
        axis = "requests per second arriving" if rate else "concurrent users"
        for chart in self.charts:
            chart.setLabel("bottom", axis)
        if self.profile is not None:
            self.simulate()

    def rates_list(self) -> list[float]:
        try:
            rates = sorted({float(u) for u in self.users.text().replace(" ", "").split(",") if u})
        except ValueError:
            raise FitScopeError("Arrival rates: numbers separated by commas, e.g. 0.1,0.2,0.5.") from None
        if not rates or rates[0] <= 0 or rates[-1] > 1000:
            raise FitScopeError("Arrival rates: positive numbers of requests per second, separated by commas.")
        return rates

    def users_list(self) -> list[int]:
        try:
            users = sorted({int(u) for u in self.users.text().replace(" ", "").split(",") if u})
        except ValueError:
            raise FitScopeError("Concurrent users: numbers separated by commas, e.g. 1,2,4,8.") from None
        if not users or users[0] < 1 or users[-1] > 1024:
            raise FitScopeError("Concurrent users: numbers from 1 to 1024, separated by commas.")
        return users

    def simulate(self) -> int:
        """Simulates the load points on the tab's worker (the memory cap reads the model file);
        ``simulated`` brings the results. Returns the job's id, 0 when nothing can be simulated
        (no measurement yet, or load points that do not parse: the status line says why)."""
        if self.profile is None or self._source is None:
            return 0
        try:
            points = self.rates_list() if self.by_rate else self.users_list()
        except FitScopeError as exc:
            self.status.setText(str(exc))
            return 0
        lo_p, hi_p = sorted((self.prompt_lo.value(), self.prompt_hi.value()))
        lo_o, hi_o = sorted((self.output_lo.value(), self.output_hi.value()))
        profile, slots_for, by_rate = self.profile, self._source[3], self.by_rate
        job = partial(
            simulate_load,
            profile,
            slots_for,
            prompt=Lengths.uniform(lo_p, hi_p),
            output=Lengths.uniform(lo_o, hi_o),
            longest_tokens=hi_p + hi_o,
            slots=self.slots.value(),
            n_requests=self.requests.value(),
            users=() if by_rate else [int(p) for p in points],
            rates=points if by_rate else (),
            think_time_s=self.think.value(),
        )
        self.stale.begin()
        self._latest_simulation = self._job.submit(job)
        return self._latest_simulation

    @staticmethod
    def _x(r: LoadResult) -> float:
        return float(r.users if r.users is not None else (r.rate_per_s or 0.0))

    def _show(self) -> None:
        for batching, line in self.throughput.items():
            points = sorted((r for r in self.results if r.batching == batching), key=self._x)
            line.setData([self._x(r) for r in points], [r.tokens_per_s for r in points])
        for (batching, key), curve in self.curves.items():
            points = sorted((r for r in self.results if r.batching == batching), key=self._x)
            curve.setData([self._x(r) for r in points], [getattr(r, key) for r in points])
        fill_table(
            self.table,
            [
                [
                    str(r.users) if r.users is not None else f"{r.rate_per_s:g}/s",
                    "yes" if r.batching else "no",
                    f"{r.tokens_per_s:.1f}",
                    f"{r.requests_per_s:.2f}",
                    f"{r.ttft_p50_s:.2f} s",
                    f"{r.ttft_p95_s:.2f} s",
                    f"{r.e2e_p50_s:.2f} s",
                    f"{r.e2e_p95_s:.2f} s",
                    f"{r.queue_wait_p95_s:.2f} s",
                    f"{r.slots}" + (" (memory cap)" if r.slots_capped_by_memory else ""),
                ]
                for r in self.results
            ],
        )
        p = self.profile
        assert p is not None
        best = max((r for r in self.results if r.batching), key=lambda r: r.tokens_per_s, default=None)
        single = max((r for r in self.results if not r.batching), key=lambda r: r.tokens_per_s, default=None)
        lines = [
            f"Measured here with {p.n_threads} thread{'s' if p.n_threads != 1 else ''}"
            + (" (like llama-server)" if p.n_threads == llama_math_threads() else "")
            + f": prefill {p.prefill_tokens_per_s:,.0f} tokens/s; decode "
            + ", ".join(f"{n} at once {rate:,.1f} tokens/s" for n, rate in p.decode_tokens_per_s.items())
            + ".",
            f"Memory holds the KV cache of {self.max_slots} slots of this length; "
            + (
                f"the {self.slots.value()} slots asked for are capped to {self.max_slots}."
                if self.max_slots is not None and self.max_slots < self.slots.value()
                else f"{self.slots.value()} slots are used."
            ),
        ]
        if best is not None and single is not None and single.tokens_per_s > 0:
            if best.tokens_per_s < single.tokens_per_s:
                lines.append(
                    "These figures look wrong: serving requests together came out slower than serving them one at "
                    "a time, which batching never does. Another program was probably busy on this computer during "
                    "the measurement; close it and measure again."
                )
            else:
                lines.append(
                    f"Serving requests together reaches {best.tokens_per_s:,.0f} tokens/s in total, against "
                    f"{single.tokens_per_s:,.0f} tokens/s when they are served one at a time "
                    f"({best.tokens_per_s / single.tokens_per_s:.1f}x), at the price of each request waiting for "
                    "the others' steps."
                )
        self.summary.setText(" ".join(lines))
        self.status.setText("Simulated from this machine's measurements.")
