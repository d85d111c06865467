"""The Quantization A/B tab: 2–4 variants of one model (files the user has, or made here from a
higher-precision file), task suites with checks (the list and its dialogs: ``ab_suites.py``,
``ab_dialogs.py``), each variant's KL divergence and perplexity against the reference on a text,
and the answer — quality against speed and memory, and which variant to route each task to.

Long jobs (making a variant, running the suites) run on the tab's ``JobRunner`` (``app.ui.jobs``),
like the Run tab's: progress in 100 ms batches, and every failure as a message that leaves the tab
usable.
"""

from __future__ import annotations

import html
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.adapters.ab_compare import MAX_VARIANTS, compare_variants
from app.adapters.demo_model import DEMO_TOY_NOTE, is_demo_file
from app.adapters.divergence_runner import DivergenceSettings, builtin_text, read_text
from app.adapters.llamacpp_runner import LiveRun
from app.adapters.quantizer import Quantization, default_variant_path, quantize
from app.core.common.errors import FitScopeError
from app.core.common.text import safe_label
from app.core.common.units import GIB
from app.core.memory.records import Target
from app.core.model.quant import PRESETS
from app.core.quality.divergence import DivergenceFigures, meaning
from app.core.quality.quant_compare import Comparison, routing_config, to_toml
from app.ui.ab_suites import SuiteBox
from app.ui.chart_base import COLORS, Chart
from app.ui.jobs import JobRunner, Report
from app.ui.panels import fill_table, readonly_table
from app.ui.stale import StaleMark


class AbPanel(QWidget):
    comparison_finished = Signal(object)  # Comparison
    error_shown = Signal(str)

    def __init__(
        self,
        hardware: Callable[[], tuple[list[Target], str, str]],
        parent: QWidget | None = None,
        suites_folder: Path | None = None,
    ) -> None:
        """``hardware()`` gives the targets the advice must fit, their label and the CPU repack profile;
        ``suites_folder`` holds the user's own suites (default: FitScope's data folder)."""
        super().__init__(parent)
        self.suites = SuiteBox(suites_folder)
        self._hardware = hardware
        self._job = JobRunner("ab", self)
        self._job.progressed.connect(self._on_progress)
        self._job.finished.connect(self._on_finished)
        self._job.failed.connect(self._on_failed)
        self._stop = threading.Event()
        self._live: LiveRun | None = None
        self._quantization: Quantization | None = None
        self.comparison: Comparison | None = None
        self._source_path = ""
        self._text, self._text_name = builtin_text()
        self._build()
        self.suites.error_shown.connect(self.error_shown)
        self.suites.status_changed.connect(self.status.setText)
        if self.suites.problems:
            self.status.setText("Some of your suites cannot be used: " + " ".join(self.suites.problems))

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

        text_box = QGroupBox("Distribution check: KL divergence and perplexity on a text")
        tl = QVBoxLayout(text_box)
        self.kl_check = QCheckBox("Measure every variant against the reference on a text")
        self.kl_check.setChecked(True)
        self.kl_check.setToolTip(
            "As llama-perplexity --kl-divergence: one pass per file over the text, cached, so a rerun is instant"
        )
        tl.addWidget(self.kl_check)
        trow = QHBoxLayout()
        self.text_label = QLabel(self._text_name)
        self.text_label.setWordWrap(True)
        self.choose_text_button = QPushButton("C&hoose text…")
        self.builtin_text_button = QPushButton("Built-in")
        trow.addWidget(self.text_label, 1)
        trow.addWidget(self.choose_text_button)
        trow.addWidget(self.builtin_text_button)
        tl.addLayout(trow)
        nrow = QHBoxLayout()
        nrow.addWidget(QLabel("Tokens of the text:"))
        self.kl_tokens = QSpinBox()
        self.kl_tokens.setRange(0, 1_000_000)
        self.kl_tokens.setSingleStep(512)
        self.kl_tokens.setValue(2048)
        self.kl_tokens.setSpecialValueText("all")
        self.kl_tokens.setAccessibleName("Tokens of the text to evaluate")
        nrow.addWidget(self.kl_tokens)
        nrow.addStretch(1)
        tl.addLayout(nrow)

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

        self.chart = Chart("Quality against speed (bubble size: memory)", short_title="Quality vs. speed")
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
        left.addWidget(self.suites)
        left.addWidget(text_box)
        left.addLayout(run_row)
        left.addWidget(self.progress)
        left.addWidget(self.status)
        right = QVBoxLayout()
        self.stale_note = QLabel("")
        right.addWidget(self.stale_note)
        right.addWidget(self.chart, 2)
        right.addWidget(self.table, 2)
        right.addWidget(self.advice)
        right.addLayout(export)
        grid = QGridLayout(self)
        grid.addLayout(left, 0, 0)
        grid.addLayout(right, 0, 1)
        grid.setColumnStretch(0, 2)
        grid.setColumnStretch(1, 5)
        # The advice says what fits the hardware chosen on the left.
        self.stale = StaleMark(self.stale_note, [self.chart, self.table, self.advice], "press Compare", ("machine",))

        self.add_button.clicked.connect(self._add_dialog)
        self.remove_button.clicked.connect(self._remove_selected)
        self.make_button.clicked.connect(lambda: self.make_variant(self.make_preset.currentData()))
        self.choose_text_button.clicked.connect(self._choose_text_dialog)
        self.builtin_text_button.clicked.connect(lambda: self.set_text(*builtin_text()))
        self.compare_button.clicked.connect(self.start)
        self.stop_button.clicked.connect(self.stop)
        self.export_json.clicked.connect(lambda: self._export_dialog("json"))
        self.export_toml.clicked.connect(lambda: self._export_dialog("toml"))

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
        item = QListWidgetItem(f"{safe_label(Path(path).name)} ({size:.2f} GiB)")
        item.setData(Qt.ItemDataRole.UserRole, path)
        self.variant_list.addItem(item)

    def set_text(self, text: str, name: str) -> None:
        """The text the variants' distributions are compared on."""
        self._text, self._text_name = text, name
        self.text_label.setText(name)

    def divergence_settings(self) -> DivergenceSettings | None:
        if not self.kl_check.isChecked():
            return None
        return DivergenceSettings(text=self._text, text_name=self._text_name, max_tokens=self.kl_tokens.value())

    def _choose_text_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Text for KL divergence and perplexity", "", "Text (*.txt *.md)")
        if not path:
            return
        try:
            self.set_text(*read_text(path))
        except FitScopeError as exc:
            self.error_shown.emit(str(exc))

    def _add_dialog(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Add variants", "", "GGUF models (*.gguf)")
        for p in paths:
            self.add_variant(p)

    def _remove_selected(self) -> None:
        for item in self.variant_list.selectedItems():
            self.variant_list.takeItem(self.variant_list.row(item))

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
        suites = self.suites.chosen_suites()
        if not 2 <= len(paths) <= MAX_VARIANTS:
            self.error_shown.emit(f"Choose 2 to {MAX_VARIANTS} variants of one model to compare.")
            return
        if not suites:
            self.error_shown.emit("Tick at least one task suite.")
            return
        targets, label, repack = self._hardware()
        self.progress.setValue(0)
        stop = threading.Event()
        divergence = self.divergence_settings()

        self.stale.begin()

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
                divergence=divergence,
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
        self._job.close(timeout=5)

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

    def _on_finished(self, _job_id: int, outcome: tuple[str, Any]) -> None:
        self._job_ended()
        kind, payload = outcome
        if kind == "made":
            self.add_variant(payload)
            self.status.setText(f"Made {Path(payload).name}.")
        else:
            self.show_comparison(payload)
            self.comparison_finished.emit(payload)

    def _on_failed(self, _job_id: int, message: str) -> None:
        self._job_ended()
        self.status.setText(message)
        self.error_shown.emit(message)

    # -- results --------------------------------------------------------------------------------

    def show_comparison(self, comparison: Comparison) -> None:
        self.comparison = comparison
        suites = [s.name for s in comparison.suites]
        headers = ["Variant", "Quant", "Memory (est.)", "Peak RSS", "Decode tok/s", "Prefill tok/s", "TTFT", "Threads"]
        headers += ["Same tokens", "Top-1 agreement"] + [f"{n} pass" for n in suites]
        headers += ["KL mean (95%)", "KL 99th pct", "Δ perplexity (95%)", "Same top token (95%)"]
        self.table.setColumnCount(len(headers))
        self.table.setHorizontalHeaderLabels(headers)
        rows = []
        spots: list[dict[str, Any]] = []
        for v in comparison.variants:
            rows.append(
                [
                    safe_label(v.label) + (" (reference)" if v.is_reference else ""),
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
                + divergence_cells(v.divergence)
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
            label = pg.TextItem(safe_label(v.label), color=self.chart._fg, anchor=(0.5, 1.6))
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
        measured = [v for v in comparison.variants if v.divergence is not None]
        if measured:
            lines.append("<b>Measured on this model</b> (next-token distributions against the reference):")
            lines += [
                f"&nbsp;&nbsp;• {_html_label(v.label)}: {meaning(v.divergence)}" for v in measured if v.divergence
            ]
            lines += [f"&nbsp;&nbsp;• {_html_label(n)}" for n in comparison.notes[1:]]
        for a in comparison.advice:
            chosen = _html_label(a.chosen) if a.chosen else "none qualifies"
            lines.append(f"<b>{a.profile}</b> (needs ≥ {a.floor:.0%}): <b>{chosen}</b>")
            lines += [f"&nbsp;&nbsp;• {_html_label(r)}" for r in a.reasons]
        if any(is_demo_file(v.gguf_path) for v in comparison.variants):
            lines.insert(0, f"<b>{html.escape(DEMO_TOY_NOTE)}</b>")
        self.advice.setText("<br>".join(lines))
        self.stale.done()
        self.export_json.setEnabled(True)
        self.export_toml.setEnabled(True)
        self.status.setText("Done. " + safe_label(" ".join(comparison.notes)))

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


def _html_label(text: str) -> str:
    """Text from a file (a variant's name) in the rich-text advice: sanitised, then HTML-escaped."""
    return html.escape(safe_label(text))


def divergence_cells(d: DivergenceFigures | None) -> list[str]:
    """The four distribution columns of one variant: KL mean, KL 99th percentile, Δ perplexity and
    same top token, each with its 95% interval ("—" for the reference, "-" when not measured)."""
    if d is None:
        return ["-"] * 4
    if d.is_reference or d.kl_mean is None or d.kl_p99 is None or d.delta_perplexity is None or d.same_top is None:
        return ["—", "—", f"reference (ppl {d.perplexity.value:.2f})", "—"]
    p99_high = "?" if d.kl_p99.high is None else f"{d.kl_p99.high:.2f}"
    return [
        f"{d.kl_mean.value:.4f} ({d.kl_mean.low:.4f}–{d.kl_mean.high or 0:.4f})",
        f"{d.kl_p99.value:.3f} ({d.kl_p99.low:.2f}–{p99_high})",
        f"{d.delta_perplexity.value:+.3f} ({d.delta_perplexity.low:+.2f} to {d.delta_perplexity.high or 0:+.2f})",
        f"{d.same_top.value:.1%} ({d.same_top.low:.1%}–{d.same_top.high or 0:.1%})",
    ]
