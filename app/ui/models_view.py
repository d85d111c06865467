"""The "Which machine?" tab's other question: which models this machine runs well. The answer of
:func:`app.services.model_finder.models_for_machine` as a table (best answers first: each model's
published quality, the quantization that reaches the speed needed, the speed per person, the memory
to spare), why the better-rated models that fall short do, and one click to open a model in the
main view."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from app.core.model.benchmarks import benchmark_note
from app.core.report.choices import ModelChoice
from app.core.report.verdict import gib, words_range
from app.services.model_finder import MachineModels, ModelOption, models_sentence
from app.ui.panels import fill_table, readonly_table

HEADERS = ("#", "Model", "Answers (MMLU-Pro)", "Quantization", "Speed per person", "Memory to spare")


class ModelsView(QWidget):
    """The ranked models, the shortfalls of the better-rated ones, and Open."""

    model_opened = Signal(object)  # ModelChoice: the catalog model at the quantization that passed

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.result: MachineModels | None = None
        self.headers = HEADERS
        self.summary = QLabel("")
        self.summary.setWordWrap(True)
        self.table = readonly_table(HEADERS, stretch_last=True)
        self.table.setSelectionBehavior(self.table.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(self.table.SelectionMode.SingleSelection)
        self.table.setAccessibleName("Models this machine runs well")
        self.table.doubleClicked.connect(lambda _index: self.open_selected())
        self.table.itemSelectionChanged.connect(self._on_selected)
        self.why_text = QPlainTextEdit()
        self.why_text.setReadOnly(True)
        self.why_text.setAccessibleName("Why the better-rated models fall short")
        self.why_text.setMaximumHeight(150)
        self.open_button = QPushButton("&Open this model")
        self.open_button.setEnabled(False)
        self.open_button.setToolTip("Show this model, at this quantization, in the main view")
        self.open_button.clicked.connect(self.open_selected)
        buttons = QHBoxLayout()
        buttons.addWidget(self.open_button)
        buttons.addStretch(1)
        note = QLabel(f"About the scores: {benchmark_note()}")
        note.setWordWrap(True)
        note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.note = note
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.summary)
        layout.addWidget(QLabel("Models it runs well, best answers first (double-click one to open it)"))
        layout.addWidget(self.table, 3)
        layout.addLayout(buttons)
        layout.addWidget(QLabel("Better-rated models that fall short, and why"))
        layout.addWidget(self.why_text)
        layout.addWidget(note)

    def show_models(self, result: MachineModels) -> None:
        self.result = result
        total = len(result.ranked) + len(result.failing)
        self.summary.setText(
            f"{models_sentence(result)} {len(result.ranked)} of {total} catalog models run well "
            f"({result.seconds:.1f} s)."
            if result.ranked
            else f"{models_sentence(result)} No catalog model runs well on it for this workload; below, the nearest."
        )
        fill_table(self.table, [self._cells(i, o) for i, o in enumerate(result.ranked, 1)])
        for row, o in enumerate(result.ranked):
            item = self.table.item(row, 2)
            if item is not None and o.score is not None:
                item.setToolTip(f"{o.level.meaning[0].upper()}{o.level.meaning[1:]}. {o.score.citation()}")
        best = result.ranked[0].score.mmlu_pro_percent if result.ranked and result.ranked[0].score else -1.0
        better = [o for o in result.failing if o.score is not None and o.score.mmlu_pro_percent > best]
        self.why_text.setPlainText("\n".join(f"{o.name} ({o.quality_text}): {o.reason}." for o in better[:12]))
        if result.ranked:
            self.table.selectRow(0)
        self._on_selected()

    @staticmethod
    def _cells(i: int, o: ModelOption) -> list[str]:
        return [
            str(i),
            o.name,
            o.quality_text,
            o.quant,
            words_range(o.decode) if o.decode is not None else "-",
            gib(o.headroom_bytes),
        ]

    def selected(self) -> ModelOption | None:
        if self.result is None:
            return None
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        index = rows[0].row() if rows else -1
        return self.result.ranked[index] if 0 <= index < len(self.result.ranked) else None

    def _on_selected(self) -> None:
        self.open_button.setEnabled(self.selected() is not None)

    def open_selected(self) -> ModelOption | None:
        """Open the selected model in the main view; returns it (None when nothing is selected)."""
        o = self.selected()
        if o is not None:
            self.model_opened.emit(ModelChoice(kind="catalog", ref=o.model_id, quant=o.quant))
        return o
