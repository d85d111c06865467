"""The Quantization A/B tab: 2–4 variants of one model (files the user has, or made here from a
higher-precision file), task suites with checks, and the answer — quality against speed and
memory, and which variant to route each task to.

Long jobs (making a variant, running the suites) run on the tab's ``JobRunner`` (``app.ui.jobs``),
like the Run tab's: progress in 100 ms batches, and every failure as a message that leaves the tab
usable.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.adapters.ab_compare import MAX_VARIANTS, compare_variants
from app.adapters.llamacpp_runner import LiveRun
from app.adapters.quantizer import Quantization, default_variant_path, quantize
from app.core.errors import FitScopeError
from app.core.estimate import Target
from app.core.quant import PRESETS
from app.core.quant_compare import Comparison, routing_config, to_toml
from app.core.suites import Suite, SuiteError, builtin_suites, load_suite, parse_suite, suite_to_yaml
from app.core.units import GIB
from app.ui.charts import COLORS, Chart
from app.ui.jobs import JobRunner, Report
from app.ui.panels import fill_table, readonly_table


class SuiteEditor(QDialog):
    """Edit a suite as YAML; errors point at the line."""

    def __init__(self, text: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Edit task suite")
        self.resize(760, 620)
        self.editor = QPlainTextEdit(text)
        self.editor.setAccessibleName("Suite text (YAML or JSON)")
        self.message = QLabel("")
        self.message.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        check = buttons.addButton("&Check", QDialogButtonBox.ButtonRole.ActionRole)
        check.clicked.connect(self.validate)
        buttons.accepted.connect(self._accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.editor)
        layout.addWidget(self.message)
        layout.addWidget(buttons)
        self.suite: Suite | None = None

    def validate(self) -> Suite | None:
        try:
            suite = parse_suite(self.editor.toPlainText(), "<editor>")
        except SuiteError as exc:
            self.message.setText(str(exc))
            if exc.line:
                block = self.editor.document().findBlockByLineNumber(exc.line - 1)
                cursor = self.editor.textCursor()
                cursor.setPosition(block.position())
                self.editor.setTextCursor(cursor)
            return None
        self.message.setText(f"OK: {len(suite.prompts)} prompts.")
        return suite

    def _accept(self) -> None:
        self.suite = self.validate()
        if self.suite is not None:
            self.accept()


class AbPanel(QWidget):
    comparison_finished = Signal(object)  # Comparison
    error_shown = Signal(str)

    def __init__(
        self,
        hardware: Callable[[], tuple[list[Target], str, str]],
        parent: QWidget | None = None,
    ) -> None:
        """``hardware()`` gives the targets the advice must fit, their label and the CPU repack profile."""
        super().__init__(parent)
        self._hardware = hardware
        self._job = JobRunner("ab", self)
        self._job.progressed.connect(self._on_progress)
        self._job.finished.connect(self._on_finished)
        self._job.failed.connect(self._on_failed)
        self._stop = threading.Event()
        self._live: LiveRun | None = None
        self._quantization: Quantization | None = None
        self.comparison: Comparison | None = None
        self.custom_suites: list[Suite] = []
        self._source_path = ""
        self._build()

    # -- layout ---------------------------------------------------------------------------------

    def _build(self) -> None:
        variants_box = QGroupBox("Variants (2–4 files of one model)")
        vl = QVBoxLayout(variants_box)
        self.variant_list = QListWidget()
        self.variant_list.setAccessibleName("Variants to compare")
        vl.addWidget(self.variant_list)
        row = QHBoxLayout()
        self.add_button = QPushButton("&Add GGUF…")
        self.remove_button = QPushButton("Re&move")
        row.addWidget(self.add_button)
        row.addWidget(self.remove_button)
        vl.addLayout(row)
        make = QHBoxLayout()
        self.make_preset = QComboBox()
        self.make_preset.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.make_preset.setMinimumContentsLength(8)  # the longest preset name, read whole
        for p in PRESETS:
            if p.name not in ("F32", "MXFP4_MOE") and not p.uses_imatrix:
                self.make_preset.addItem(p.name, p.name)
        self.make_preset.setCurrentText("Q4_K_M")
        self.make_preset.setAccessibleName("Preset of the variant to make")
        self.make_button = QPushButton("Ma&ke from the current model")
        self.make_button.setToolTip("Quantize the open GGUF file with llama.cpp's quantizer; the result joins the list")
        make.addWidget(self.make_preset)
        make.addWidget(self.make_button)
        vl.addLayout(make)
        self.make_progress = QProgressBar()
        self.make_progress.setVisible(False)
        vl.addWidget(self.make_progress)

        suites_box = QGroupBox("Task suites")
        sl = QVBoxLayout(suites_box)
        self.suite_list = QListWidget()
        self.suite_list.setAccessibleName("Task suites to run")
        sl.addWidget(self.suite_list)
        srow = QHBoxLayout()
        self.load_suite_button = QPushButton("&Load suite…")
        self.edit_suite_button = QPushButton("&Edit…")
        srow.addWidget(self.load_suite_button)
        srow.addWidget(self.edit_suite_button)
        sl.addLayout(srow)
        self._fill_suites()

        run_row = QHBoxLayout()
        self.compare_button = QPushButton("&Compare")
        self.stop_button = QPushButton("S&top")
        self.stop_button.setEnabled(False)
        run_row.addWidget(self.compare_button)
        run_row.addWidget(self.stop_button)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.status = QLabel("Add two to four variants of one model, then Compare.")
        self.status.setWordWrap(True)

        self.chart = Chart("Quality against speed (bubble size: memory)")
        self.chart.setLabel("bottom", "decode tokens/s")
        self.chart.setLabel("left", "pass rate (all chosen suites)")
        self.scatter = pg.ScatterPlotItem(pen=pg.mkPen("w", width=1))
        self.chart.addItem(self.scatter)
        self.labels: list[pg.TextItem] = []

        self.table = readonly_table()
        self.advice = QLabel("")
        self.advice.setWordWrap(True)
        self.advice.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        export = QHBoxLayout()
        self.export_json = QPushButton("Export routing config (&JSON)…")
        self.export_toml = QPushButton("Export routing config (T&OML)…")
        self.export_json.setEnabled(False)
        self.export_toml.setEnabled(False)
        export.addWidget(self.export_json)
        export.addWidget(self.export_toml)
        export.addStretch(1)

        left = QVBoxLayout()
        left.addWidget(variants_box)
        left.addWidget(suites_box)
        left.addLayout(run_row)
        left.addWidget(self.progress)
        left.addWidget(self.status)
        right = QVBoxLayout()
        right.addWidget(self.chart, 2)
        right.addWidget(self.table, 2)
        right.addWidget(self.advice)
        right.addLayout(export)
        grid = QGridLayout(self)
        grid.addLayout(left, 0, 0)
        grid.addLayout(right, 0, 1)
        grid.setColumnStretch(0, 2)
        grid.setColumnStretch(1, 5)

        self.add_button.clicked.connect(self._add_dialog)
        self.remove_button.clicked.connect(self._remove_selected)
        self.make_button.clicked.connect(lambda: self.make_variant(self.make_preset.currentData()))
        self.load_suite_button.clicked.connect(self._load_suite_dialog)
        self.edit_suite_button.clicked.connect(self._edit_suite)
        self.compare_button.clicked.connect(self.start)
        self.stop_button.clicked.connect(self.stop)
        self.export_json.clicked.connect(lambda: self._export_dialog("json"))
        self.export_toml.clicked.connect(lambda: self._export_dialog("toml"))

    def _fill_suites(self) -> None:
        self.suite_list.clear()
        for name, suite in builtin_suites().items():
            self._add_suite_item(suite, checked=name in ("chat", "extraction"))
        for suite in self.custom_suites:
            self._add_suite_item(suite, checked=True)

    def _add_suite_item(self, suite: Suite, checked: bool) -> None:
        floor = f", floor {suite.quality_floor:.0%}" if suite.quality_floor is not None else ""
        item = QListWidgetItem(f"{suite.name} ({len(suite.prompts)} prompts{floor})")
        item.setData(Qt.ItemDataRole.UserRole, suite)
        item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
        item.setCheckState(Qt.CheckState.Checked if checked else Qt.CheckState.Unchecked)
        item.setToolTip(suite.description)
        self.suite_list.addItem(item)

    # -- inputs ---------------------------------------------------------------------------------

    def set_source(self, gguf_path: str | None) -> None:
        """The window's current GGUF file, the source for "Make"."""
        self._source_path = gguf_path or ""
        self.make_button.setEnabled(bool(gguf_path) and not self.busy)
        self.make_button.setToolTip(
            f"Quantize {Path(gguf_path).name} with llama.cpp's quantizer" if gguf_path else "Open a GGUF file first"
        )

    def variants(self) -> list[str]:
        return [self.variant_list.item(i).data(Qt.ItemDataRole.UserRole) for i in range(self.variant_list.count())]

    def add_variant(self, path: str) -> None:
        if path in self.variants():
            return
        if self.variant_list.count() >= MAX_VARIANTS:
            self.error_shown.emit(f"Compare at most {MAX_VARIANTS} variants; remove one first.")
            return
        size = Path(path).stat().st_size / GIB if Path(path).exists() else 0.0
        item = QListWidgetItem(f"{Path(path).name} ({size:.2f} GiB)")
        item.setData(Qt.ItemDataRole.UserRole, path)
        self.variant_list.addItem(item)

    def chosen_suites(self) -> list[Suite]:
        out = []
        for i in range(self.suite_list.count()):
            item = self.suite_list.item(i)
            if item.checkState() == Qt.CheckState.Checked:
                out.append(item.data(Qt.ItemDataRole.UserRole))
        return out

    def add_suite(self, suite: Suite) -> None:
        self.custom_suites = [s for s in self.custom_suites if s.name != suite.name] + [suite]
        self._fill_suites()

    def _add_dialog(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Add variants", "", "GGUF models (*.gguf)")
        for p in paths:
            self.add_variant(p)

    def _remove_selected(self) -> None:
        for item in self.variant_list.selectedItems():
            self.variant_list.takeItem(self.variant_list.row(item))

    def _load_suite_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Load a task suite", "", "Suites (*.yaml *.yml *.json)")
        if not path:
            return
        try:
            self.add_suite(load_suite(path))
        except SuiteError as exc:
            self.error_shown.emit(str(exc))

    def _edit_suite(self) -> None:
        item = self.suite_list.currentItem()
        base = item.data(Qt.ItemDataRole.UserRole) if item is not None else next(iter(builtin_suites().values()))
        dialog = SuiteEditor(suite_to_yaml(base), self)
        if dialog.exec() and dialog.suite is not None:
            self.add_suite(dialog.suite)

    # -- jobs -----------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._job.running

    def _start_job(self, work: Callable[[Report], Any], stop: threading.Event) -> None:
        self._stop = stop
        if self._job.start(work):
            self._set_busy(True)

    def _set_busy(self, busy: bool) -> None:
        self.compare_button.setEnabled(not busy)
        self.make_button.setEnabled(not busy and bool(self._source_path))
        self.stop_button.setEnabled(busy)

    def make_variant(self, preset: str) -> None:
        """Quantize the current model's file with ``preset``; the result joins the variants."""
        if self.busy or not self._source_path:
            return
        source = self._source_path
        target = default_variant_path(source, preset)
        self.make_progress.setVisible(True)
        self.make_progress.setValue(0)
        self.status.setText(f"Making {target.name}…")

        def work(report: Report) -> tuple[str, str]:
            out = quantize(
                source,
                target,
                preset,
                on_progress=lambda d, n: report("make_progress", (d, n)),
                on_start=self._quantization_started,
            )
            return "made", str(out)

        self._start_job(work, threading.Event())

    def _quantization_started(self, job: Quantization) -> None:
        self._quantization = job
        if self._stop.is_set():
            job.cancel()

    def start(self) -> None:
        if self.busy:
            return
        paths = self.variants()
        suites = self.chosen_suites()
        if not 2 <= len(paths) <= MAX_VARIANTS:
            self.error_shown.emit(f"Choose 2 to {MAX_VARIANTS} variants of one model to compare.")
            return
        if not suites:
            self.error_shown.emit("Tick at least one task suite.")
            return
        targets, label, repack = self._hardware()
        self.progress.setValue(0)
        stop = threading.Event()

        def work(report: Report) -> tuple[str, Comparison]:
            result = compare_variants(
                paths,
                suites,
                targets,
                label,
                repack=repack,
                on_progress=lambda f, m: report("progress", (f, m)),
                stop=stop,
                on_start=self._run_started,
            )
            return "compared", result

        self._start_job(work, stop)

    def _run_started(self, live: LiveRun) -> None:
        self._live = live

    def stop(self) -> None:
        self._stop.set()
        if self._live is not None:
            self._live.stop()
        if self._quantization is not None:
            self._quantization.cancel()
        self.status.setText("Stopping…")

    def shutdown(self) -> None:
        self.stop()
        if self._live is not None:
            self._live.kill()
        self._job.join(timeout=5)

    def _on_progress(self, kind: str, payload: Any) -> None:
        if kind == "progress":
            fraction, message = payload
            self.progress.setValue(int(1000 * fraction))
            self.status.setText(message)
        elif kind == "make_progress":
            done, total = payload
            self.make_progress.setMaximum(total)
            self.make_progress.setValue(done)

    def _job_ended(self) -> None:
        self._live = None
        self._quantization = None
        self._set_busy(False)
        self.make_progress.setVisible(False)

    def _on_finished(self, outcome: tuple[str, Any]) -> None:
        self._job_ended()
        kind, payload = outcome
        if kind == "made":
            self.add_variant(payload)
            self.status.setText(f"Made {Path(payload).name}.")
        else:
            self.show_comparison(payload)
            self.comparison_finished.emit(payload)

    def _on_failed(self, message: str) -> None:
        self._job_ended()
        self.status.setText(message)
        self.error_shown.emit(message)

    # -- results --------------------------------------------------------------------------------

    def show_comparison(self, comparison: Comparison) -> None:
        self.comparison = comparison
        suites = [s.name for s in comparison.suites]
        headers = ["Variant", "Quant", "Memory (est.)", "Peak RSS", "Decode tok/s", "Prefill tok/s", "TTFT", "Threads"]
        headers += ["Same tokens", "Top-1 agreement"] + [f"{n} pass" for n in suites]
        self.table.setColumnCount(len(headers))
        self.table.setHorizontalHeaderLabels(headers)
        rows = []
        spots: list[dict[str, Any]] = []
        for v in comparison.variants:
            rows.append(
                [
                    v.label + (" (reference)" if v.is_reference else ""),
                    v.quant,
                    f"{v.estimated_total_bytes / GIB:.2f} GiB" + ("" if v.fits else " (does not fit)"),
                    f"{v.peak_rss_bytes / GIB:.2f} GiB" if v.peak_rss_bytes else "-",
                    f"{v.decode_tokens_per_s:.1f}" if v.decode_tokens_per_s else "-",
                    f"{v.prefill_tokens_per_s:.0f}" if v.prefill_tokens_per_s else "-",
                    f"{v.ttft_s * 1000:.0f} ms" if v.ttft_s is not None else "-",
                    str(v.n_threads) if v.n_threads else "-",
                    "—" if v.identical_token_share is None else f"{v.identical_token_share:.0%}",
                    "—" if v.top1_agreement is None else f"{v.top1_agreement:.0%}",
                ]
                + [f"{v.pass_rates.get(n, 0.0):.0%}" for n in suites]
            )
            overall = sum(v.pass_rates.values()) / max(len(v.pass_rates), 1)
            size = 12 + 30 * v.estimated_total_bytes / max(x.estimated_total_bytes for x in comparison.variants)
            color = COLORS["current"] if v.is_reference else (COLORS["weights"] if v.fits else COLORS["muted"])
            spots.append({"pos": (v.decode_tokens_per_s or 0.0, overall), "size": size, "brush": color})
        fill_table(self.table, rows)
        self.scatter.setData(spots)
        for item in self.labels:
            self.chart.removeItem(item)
        self.labels = []
        for v, spot in zip(comparison.variants, spots, strict=True):
            label = pg.TextItem(v.label, color=self.chart._fg, anchor=(0.5, 1.6))
            x, y = spot["pos"]
            label.setPos(x, y)
            self.chart.addItem(label)
            self.labels.append(label)
        self.chart.plotItem.setYRange(0, 1.1)
        formats = {v.prompt_format for v in comparison.variants}
        lines = [
            "Prompts went through each model's own chat template, as a deployed model gets them."
            if formats == {"chat template"}
            else "Prompts were sent as raw completions (a model without a chat template, such as a base model)."
            if formats == {"raw"}
            else "Some variants have a chat template and some do not: their answers are not comparable."
        ]
        for a in comparison.advice:
            lines.append(f"<b>{a.profile}</b> (needs ≥ {a.floor:.0%}): <b>{a.chosen or 'none qualifies'}</b>")
            lines += [f"&nbsp;&nbsp;• {r}" for r in a.reasons]
        self.advice.setText("<br>".join(lines))
        self.export_json.setEnabled(True)
        self.export_toml.setEnabled(True)
        self.status.setText("Done. " + " ".join(comparison.notes))

    def export_routing(self, path: Path, kind: str) -> None:
        if self.comparison is None:
            raise FitScopeError("Run a comparison first.")
        config = routing_config(self.comparison)
        text = to_toml(config) if kind == "toml" else json.dumps(config, indent=2)
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise FitScopeError(f"Could not write {path}: {exc.strerror or exc}.") from None

    def _export_dialog(self, kind: str) -> None:
        name, _ = QFileDialog.getSaveFileName(self, "Export routing config", f"routing.{kind}", f"*.{kind}")
        if not name:
            return
        try:
            self.export_routing(Path(name), kind)
        except FitScopeError as exc:
            self.error_shown.emit(str(exc))
            return
        self.status.setText(f"Wrote {name}.")
