"""The Run tab: generate with the real llama.cpp, watch the output and tokens/s as they come, and
hold every figure against the estimate.

The run itself is a llama.cpp child process (``app.adapters.llamacpp_runner``), driven by the tab's
``JobRunner`` (``app.ui.jobs``): its events arrive on the GUI thread in 100 ms batches, so a fast
model does not repaint the window per token.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QTextOption
from PySide6.QtWidgets import (
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.adapters.child_protocol import ChildEvent, Token
from app.adapters.demo_model import DEMO_TOY_NOTE
from app.adapters.llamacpp_runner import LiveLoaded, LiveRun, RunDone, run_live, sweep_threads
from app.adapters.rpc_servers import run_across_rpc
from app.core.common.units import MIB
from app.core.report.run_vs_estimate import RunReport, time_left
from app.core.report.verdict import rate
from app.core.speed.measure import RunResult, RunSettings, Spread, SweepRow, summary, sweep_rows
from app.services.runs import rpc_run_report
from app.ui.chart_base import COLORS, Chart
from app.ui.jobs import JobRunner, Report
from app.ui.panels import fill_table, readonly_table
from app.ui.run_form import RunForm
from app.ui.stale import StaleMark


@dataclass
class RunContext:
    """What the window supplies for a run: the model file and llama.cpp settings from its controls."""

    gguf_path: Callable[[], str]  # may raise FitScopeError; called on the run's thread
    model_label: str
    is_demo: bool
    n_ctx: int
    flash_attn: bool
    cache_type_k: str
    cache_type_v: str


class RunPanel(QWidget):
    """Run / Stop, the streamed output, the live tokens/s and memory charts, and the figures."""

    run_finished = Signal(object, object)  # RunResult, RunReport (after saving)
    run_failed = Signal(str)
    running_changed = Signal(bool)

    def __init__(
        self,
        finish: Callable[[RunResult, Sequence[SweepRow]], RunReport],
        save: Callable[[RunReport], RunReport] = lambda report: report,
        gpu_memory_of: Callable[[int], tuple[int, int] | None] = lambda pid: None,
        parent: QWidget | None = None,
    ) -> None:
        """``finish`` runs on the run's thread once it has finished: it estimates the same settings
        and returns the report (``app.services.runs.finish_run``). ``save`` runs on the GUI thread
        before the report is shown and returns it with its place in the history. ``gpu_memory_of(pid)``
        gives the process's and the device's GPU memory in bytes when NVML can tell."""
        super().__init__(parent)
        self._finish = finish
        self._save = save
        self._gpu_memory_of = gpu_memory_of
        self._context: RunContext | None = None
        self._pieces: list[str] = []
        self._live: LiveRun | None = None
        self._started = 0.0
        self._token_times: list[float] = []
        self._run_index = 0
        self._generating_since: float | None = None  # when the model started generating (for the time left)
        self._repeats = 1
        self._memory: list[tuple[float, float]] = []
        self._gpu_memory: list[tuple[float, float, float]] = []
        self.last_result: RunResult | None = None
        self.last_report: RunReport | None = None
        self.last_sweep: tuple[SweepRow, ...] = ()
        self.gpu_offload_supported: bool | None = None
        self._build()
        self._job = JobRunner("run", self)
        self._job.progressed.connect(self._on_progress)
        self._job.ticked.connect(self._refresh)
        self._job.finished.connect(self._on_finished)
        self._job.failed.connect(self._on_failed)

    # -- layout ---------------------------------------------------------------------------------

    def _build(self) -> None:
        self.form = RunForm()
        controls = QVBoxLayout()
        controls.addWidget(self.form)
        buttons = QHBoxLayout()
        self.run_button = QPushButton("&Run")
        self.stop_button = QPushButton("S&top")
        self.stop_button.setEnabled(False)
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.stop_button)
        controls.addLayout(buttons)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        controls.addWidget(self.status)
        controls.addStretch(1)

        self.output = QPlainTextEdit()
        self.output.setReadOnly(True)
        self.output.setAccessibleName("Generated text")
        self.output.setPlaceholderText("The generated text streams in here.")
        # Wrapped inside the box whatever the model writes (a long run without spaces included).
        self.output.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        self.output.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        self.toy_note = QLabel(DEMO_TOY_NOTE)
        self.toy_note.setWordWrap(True)
        self.toy_note.setAccessibleName("About the demo model's answers")
        self.toy_note.setVisible(False)
        self.stale_note = QLabel("")

        self.speed_chart = Chart("Tokens per second during the run", short_title="Tokens/s")
        self.speed_chart.setLabel("bottom", "seconds after the prompt")
        self.speed_chart.setLabel("left", "tokens/s")
        self.speed_curve = self.speed_chart.plot([], [], pen=pg.mkPen(COLORS["weights"], width=2))
        self.memory_chart = Chart("Memory during the run", short_title="Memory")
        self.memory_chart.setLabel("bottom", "seconds into the run")
        self.memory_chart.setLabel("left", "MiB")
        self.memory_chart.addLegend(offset=(10, 10))
        self.rss_curve = self.memory_chart.plot(
            [], [], pen=pg.mkPen(COLORS["weights"], width=2), name="this run's process (RSS)"
        )
        self.gpu_curve = self.memory_chart.plot([], [], pen=pg.mkPen(COLORS["kv"], width=2), name="GPU, whole device")
        self.gpu_process_curve = self.memory_chart.plot(
            [], [], pen=pg.mkPen(COLORS["compute"], width=2), name="GPU, this run's process"
        )
        self.estimate_line = pg.InfiniteLine(
            angle=0, pen=pg.mkPen(COLORS["capacity"], width=2, style=Qt.PenStyle.DashLine), label="estimated total"
        )
        self.estimate_line.setVisible(False)
        self.memory_chart.addItem(self.estimate_line)

        self.figures = readonly_table(["Figure", "Measured (median)", "Spread", "Estimated"], stretch_last=True)
        self.buffers = readonly_table(
            ["llama.cpp buffer", "Reported", "Estimated", "Difference", "%"], stretch_last=True
        )
        self.log_view = QPlainTextEdit()
        self.log_view.setReadOnly(True)
        self.log_view.setAccessibleName("llama.cpp's log while loading")
        self.log_view.setPlaceholderText("llama.cpp's own log lines while loading appear here after a run.")
        self.log_view.setMaximumHeight(160)
        self.diagnosis = QLabel("")
        self.diagnosis.setWordWrap(True)
        self.diagnosis.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        grid = QGridLayout(self)
        grid.addLayout(controls, 0, 0, 2, 1)
        output = QVBoxLayout()
        output.addWidget(self.stale_note)
        output.addWidget(self.toy_note)
        output.addWidget(self.output, 1)
        grid.addLayout(output, 0, 1)
        charts = QHBoxLayout()
        for chart in (self.speed_chart, self.memory_chart):
            chart.setMinimumSize(260, 180)  # below that a chart is unreadable: the tab scrolls instead
            charts.addWidget(chart)
        grid.addLayout(charts, 1, 1)
        tables = QVBoxLayout()
        tables.addWidget(self.figures)
        tables.addWidget(self.buffers)
        tables.addWidget(self.diagnosis)
        tables.addWidget(QLabel("llama.cpp's log while loading (the buffer lines are what the table compares)"))
        tables.addWidget(self.log_view)
        grid.addLayout(tables, 2, 0, 1, 2)
        grid.setColumnStretch(0, 2)
        grid.setColumnStretch(1, 3)

        self.run_button.clicked.connect(self.start)
        self.stop_button.clicked.connect(self.stop)
        self.stale = StaleMark(
            self.stale_note,
            [self.output, self.speed_chart, self.memory_chart, self.figures, self.buffers, self.diagnosis],
            "press Run",
            ("model", "conversation length", "llama.cpp settings"),
        )

    @property
    def charts(self) -> tuple[Chart, Chart]:
        return (self.speed_chart, self.memory_chart)

    # -- what to run ----------------------------------------------------------------------------

    def set_context(self, context: RunContext | None, reason: str = "") -> None:
        """The model and settings the next run uses; None disables Run with ``reason``."""
        self._context = context
        if context is None:
            self.form.model_label.setText(reason)
        else:
            extra = " (built-in demo model; Gemma Terms of Use apply)" if context.is_demo else ""
            self.form.model_label.setText(f"{context.model_label}{extra}; context {context.n_ctx:,} tokens")
        self._update_buttons()

    def set_gpu_offload_supported(self, supported: bool, gpu_vendor: str | None) -> None:
        """When the installed llama.cpp cannot offload: the build ``gpu_vendor``'s GPU needs (None: none found)."""
        self.gpu_offload_supported = supported
        self.form.set_gpu_offload_supported(supported, gpu_vendor)

    @property
    def child_pid(self) -> int | None:
        """The llama.cpp child process of the current run, once it has started."""
        return self._live.pid if self._live is not None else None

    @property
    def tokens_so_far(self) -> int:
        """Tokens of the current repetition shown so far."""
        return len(self._token_times)

    @property
    def running(self) -> bool:
        return self._job.running

    def _update_buttons(self) -> None:
        self.run_button.setEnabled(self._context is not None and not self.running)
        self.stop_button.setEnabled(self.running)

    # -- running --------------------------------------------------------------------------------

    def start(self) -> None:
        if self._context is None or self.running:
            return
        context = self._context
        self.output.clear()
        self._token_times = []
        self._run_index = 0
        self._memory = []
        self._gpu_memory = []
        self.speed_curve.setData([], [])
        self.rss_curve.setData([], [])
        self.gpu_curve.setData([], [])
        self.gpu_process_curve.setData([], [])
        self.estimate_line.setVisible(False)
        self.figures.setRowCount(0)
        self.buffers.setRowCount(0)
        self.diagnosis.setText("")
        self.status.setText("Loading the model…")
        self._started = time.perf_counter()
        self._generating_since = None
        self._repeats = self.form.repeat.value()
        self._pieces = []
        self.toy_note.setVisible(context.is_demo)
        self.stale.begin()
        form = self.form
        collect = form.values()
        counts = form.sweep_counts if form.bench_mode and form.sweep.isChecked() else ()
        rpc_servers = form.rpc_local.value() if form.rpc_local.isEnabled() else 0
        self.last_sweep = ()

        def work(report: Report) -> tuple[RunResult, RunReport]:
            settings = self.settings_for(context, collect)
            on_event = lambda e: report("event", e)  # noqa: E731
            if rpc_servers:
                outcome = run_across_rpc(
                    settings, local_servers=rpc_servers, on_event=on_event, on_start=self._started_live
                )
                return outcome.result, rpc_run_report(outcome)
            sweep: tuple[SweepRow, ...] = ()
            if counts:
                results = sweep_threads(settings, counts, on_event=on_event, on_start=self._started_live)
                sweep = sweep_rows(results)
                # The figures and the calibration follow the run with llama-server's threads.
                result = next((r for r in results if r.threads and r.threads.is_llama_default), results[-1])
            else:
                result = run_live(settings, on_event=on_event, on_start=self._started_live)
            return result, self._finish(result, sweep)

        if self._job.start(work):
            self._update_buttons()
            self.running_changed.emit(True)

    @staticmethod
    def settings_for(context: RunContext, values: dict[str, Any]) -> RunSettings:
        return RunSettings(
            gguf_path=context.gguf_path(),
            context_tokens=context.n_ctx,
            flash_attn=context.flash_attn,
            cache_type_k=context.cache_type_k,
            cache_type_v=context.cache_type_v,
            **values,
        )

    def _started_live(self, live: LiveRun) -> None:
        self._live = live

    def stop(self) -> None:
        """Ask the run to stop; it ends within a second (killed if need be)."""
        if self._live is not None:
            self._live.stop()
            self.status.setText("Stopping…")

    def shutdown(self) -> None:
        """The window is closing: end the run now and leave no process behind."""
        if self._live is not None:
            with contextlib.suppress(OSError):
                self._live.kill()
        self._job.close(timeout=5)

    # -- showing --------------------------------------------------------------------------------

    def _on_progress(self, kind: str, payload: Any) -> None:
        if kind == "event":
            self._on_event(payload, self._pieces)

    def _refresh(self) -> None:
        """Every 100 ms of a run: the text that arrived, the memory sample, the speed curve."""
        if self._pieces:
            cursor = self.output.textCursor()
            cursor.movePosition(cursor.MoveOperation.End)
            cursor.insertText("".join(self._pieces))
            self.output.setTextCursor(cursor)
            self._pieces = []
        self._sample_memory()
        self._refresh_speed()

    def _run_ended(self) -> None:
        self._live = None
        self._update_buttons()
        self.running_changed.emit(False)

    def _on_finished(self, _job_id: int, outcome: tuple[RunResult, RunReport]) -> None:
        self._run_ended()
        result, report = outcome
        if report.rpc is None:  # a run across RPC servers measures the network too: never kept
            report = self._save(report)
        self.run_finished.emit(result, report)
        self._show_result(result, report)

    def _on_failed(self, _job_id: int, message: str) -> None:
        self._run_ended()
        self.status.setText(message)
        self.run_failed.emit(message)

    def _on_event(self, event: ChildEvent, pieces: list[str]) -> None:
        if isinstance(event, LiveLoaded):
            if event.threads is not None:  # the next run of a thread sweep
                self._run_index = 0
                self._token_times = []
            sweep = f" ({event.threads} threads)" if event.threads is not None else ""
            self._generating_since = time.perf_counter()
            self.status.setText(f"Loaded in {event.load_s:.2f} s{sweep}; generating…")
        elif isinstance(event, Token):
            if event.run == self._run_index:
                self._token_times.append(event.t_s)
                if self._run_index == 0:
                    pieces.append(event.text)
        elif isinstance(event, RunDone):
            f = event.figures
            self._run_index = event.run + 1
            rate = f.decode_tokens_per_s_llama or f.decode_tokens_per_s_wall or 0.0
            since = self._generating_since
            left = time_left(self._run_index, self._repeats, time.perf_counter() - since) if since else ""
            self.status.setText(
                f"Run {self._run_index} of {self._repeats} done: first word after {f.ttft_s * 1000:.0f} ms, "
                f"{rate:.1f} tokens/s" + (f"; {left}" if left else "")
            )
            self._token_times = []

    def _sample_memory(self) -> None:
        live = self._live
        if live is None:
            return
        now = time.perf_counter() - self._started
        with contextlib.suppress(psutil.Error):
            rss = psutil.Process(live.pid).memory_info().rss
            self._memory.append((now, rss / MIB))
            self.rss_curve.setData([t for t, _ in self._memory], [m for _, m in self._memory])
        gpu = self._gpu_memory_of(live.pid)
        if gpu is not None:
            self._gpu_memory.append((now, gpu[1] / MIB, gpu[0] / MIB))
            times = [t for t, _, _ in self._gpu_memory]
            self.gpu_curve.setData(times, [d for _, d, _ in self._gpu_memory])
            self.gpu_process_curve.setData(times, [p for _, _, p in self._gpu_memory])

    def _refresh_speed(self) -> None:
        times = self._token_times
        if len(times) < 3:
            return
        # Tokens/s over a sliding window of eight tokens: smooth enough to read, quick to react.
        window = 8
        xs, ys = [], []
        for i in range(1, len(times)):
            j = max(0, i - window)
            span = times[i] - times[j]
            if span > 0:
                xs.append(times[i])
                ys.append((i - j) / span)
        self.speed_curve.setData(xs, ys)

    def _show_result(self, result: RunResult, report: RunReport) -> None:
        self.last_result = result
        self.last_report = report
        self.stale.done()
        self.last_sweep = report.thread_sweep
        stats = summary(result)
        est = report.estimate_json() or {}

        def rng(key: str, scale: float = 1.0, digits: int = 1) -> str:
            # Each end as a sentence says it (never "0-0": a tiny figure is "under 0.01").
            r = est.get(key)
            return f"{rate(r['low'] * scale)}-{rate(r['high'] * scale)}" if r else ""

        def row(name: str, spread: Spread | None, unit: str, scale: float = 1.0, digits: int = 1, estimated=""):
            if spread is None:
                return [name, "-", "-", estimated]
            return [
                name,
                f"{spread.median * scale:,.{digits}f} {unit}",
                f"{spread.low * scale:,.{digits}f}-{spread.high * scale:,.{digits}f}" if spread.n > 1 else "",
                estimated,
            ]

        threads = result.threads
        if result.prompt_format == "chat template":
            prompt_format = "one user turn through the model's chat template"
        elif result.settings.prompt_tokens is not None:
            prompt_format = "synthetic tokens"
        elif result.settings.chat:
            prompt_format = "sent as typed: this model has no chat template (a base model)"
        else:
            prompt_format = "sent as typed"
        rows = [
            ["Prompt", prompt_format, "", ""],
            ["Threads", threads.describe() if threads else str(result.settings.n_threads or "-"), "", ""],
            ["Load time", f"{result.load_s:.2f} s", "", ""],
            row("Time to first token", stats["ttft_s"], "ms", 1000, 0, rng("ttft_s", 1000, 0) + " ms" if est else ""),
            row(
                "Prefill (llama.cpp timings)",
                stats["prefill_tokens_per_s"],
                "tok/s",
                estimated=rng("prefill_tokens_per_s"),
            ),
            row("Prefill (wall clock)", stats["prefill_tokens_per_s_wall"], "tok/s"),
            row(
                "Decode (llama.cpp timings)",
                stats["decode_tokens_per_s"],
                "tok/s",
                estimated=rng("decode_tokens_per_s"),
            ),
            row("Decode (wall clock)", stats["decode_tokens_per_s_wall"], "tok/s"),
            row("Gap between tokens, typical", stats["itl_p50_s"], "ms", 1000),
            row("Gap between tokens, slowest 1 in 20", stats["itl_p95_s"], "ms", 1000),
            [
                "Peak memory of the run (RSS)",
                f"{result.peak_rss_bytes / MIB:,.0f} MiB" if result.peak_rss_bytes else "-",
                "",
                f"{est['total_bytes'] / MIB:,.0f} MiB in total" if est else "",
            ],
        ]
        if report.measured_efficiency is not None:
            share = report.measured_efficiency.value
            rows.append(["Speed against what the memory allows", f"{100 * share:.0f}%", "", ""])
        for sweep_row in self.last_sweep:
            peaks = [name for name, best in (("pp", sweep_row.best_prefill), ("tg", sweep_row.best_decode)) if best]
            pp, tg = sweep_row.prefill_tokens_per_s, sweep_row.decode_tokens_per_s
            rows.append(
                [
                    f"Sweep: {sweep_row.n_threads} thread{'s' if sweep_row.n_threads != 1 else ''}",
                    f"pp {pp:,.1f} / tg {tg:,.1f} tok/s" if pp and tg else "-",
                    "peak: " + " and ".join(peaks) if peaks else "",
                    "",
                ]
            )
        fill_table(self.figures, rows)
        fill_table(
            self.buffers,
            [
                [
                    c.buffer,
                    f"{c.measured_bytes / MIB:,.2f} MiB",
                    f"{c.estimated_bytes / MIB:,.2f} MiB",
                    f"{c.difference_bytes / MIB:+,.2f} MiB",
                    "" if c.difference_percent is None else f"{c.difference_percent:+.1f}%",
                ]
                for c in report.comparison
            ],
        )
        if est:
            self.estimate_line.setValue(est["total_bytes"] / MIB)
            self.estimate_line.setVisible(True)
        self.log_view.setPlainText(result.log_tail)
        notes = report.notes()
        if report.save_message:
            notes.append(report.save_message)
        if result.runs and result.runs[-1].stopped:
            notes.insert(0, "Stopped before the end; the figures cover what ran.")
        self.diagnosis.setText("\n".join(notes))
        self.status.setText(
            f"Done: {len(result.completed_runs)} of {result.settings.repeat} repetitions"
            + (f"; saved as run #{report.history_id}" if report.history_id is not None else "")
        )


def demo_or_path(path: str | None, demo: Callable[[], Path]) -> Callable[[], str]:
    """A deferred path: the demo model's is resolved (and checked) on the run's thread."""
    if path:
        return lambda: path
    return lambda: str(demo())
