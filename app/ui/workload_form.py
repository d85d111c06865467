"""The "Which machine?" tab's workload: what the machine must do, in people's terms. The people, the
conversation length and the speed each person needs are the same settings as the left-hand panel's
(one set, remembered in ``Preferences``); the budget, the quantization quality kept and what to
put first are the tab's own, remembered beside them.

``WorkloadForm.show`` puts the shared settings on the widgets without emitting; each edit emits
``workload_edited(WorkloadEdit)`` and the window writes it into the preferences, from where both
panels show it.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QDoubleSpinBox, QFormLayout, QGroupBox, QHBoxLayout, QLabel, QSpinBox, QWidget

from app.core.advisor.records import QUALITY_FLOORS
from app.core.report.choices import MAX_USERS
from app.core.report.lengths import WORDS_PER_TOKEN
from app.core.report.prefs import WorkloadPrefs
from app.ui.context_control import ContextControl
from app.ui.hardware_box import select_combo


@dataclass(frozen=True)
class WorkloadEdit:
    """The workload after an edit: people, each person's context (tokens), and the rest."""

    users: int
    context_per_user_tokens: int
    workload: WorkloadPrefs


class WorkloadForm(QGroupBox):
    """People, conversation length, speed needed, quantization quality, budget, what to put first."""

    workload_edited = Signal(object)  # WorkloadEdit

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("What the machine must do", parent)
        self._updating = False
        self._workload = WorkloadPrefs()
        form = QFormLayout(self)
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        self.subject = QLabel("The model chosen on the left.")
        self.subject.setWordWrap(True)
        self.subject_title = QLabel("Model")
        form.addRow(self.subject_title, self.subject)
        self.users = QSpinBox()
        self.users.setRange(1, MAX_USERS)
        self.users.setAccessibleName("People using it at once")
        form.addRow("People using it at once", self.users)
        self.context = ContextControl()
        self.context.setAccessibleName("Conversation length per person")
        form.addRow("Conversation length per person", self.context)
        speed_row = QHBoxLayout()
        self.speed = QDoubleSpinBox()
        self.speed.setRange(0.0, 1000.0)
        self.speed.setDecimals(1)
        self.speed.setAccessibleName("Minimum speed per person")
        self.speed_unit = QComboBox()
        self.speed_unit.addItem("words a second", "words")
        self.speed_unit.addItem("tokens a second", "tokens")
        self.speed_unit.setToolTip(f"English prose is about {WORDS_PER_TOKEN} words per token.")
        speed_row.addWidget(self.speed)
        speed_row.addWidget(self.speed_unit, 1)
        form.addRow("Each person needs at least", speed_row)
        self.quality = QComboBox()
        for key, (words, _limit) in QUALITY_FLOORS.items():
            self.quality.addItem(words[0].upper() + words[1:], key)
        self.quality.setToolTip(
            "How much answer quality the quantization (the model's compression) may cost, by llama.cpp's published "
            "perplexity figures"
        )
        form.addRow("Quantization may cost", self.quality)
        self.budget = QSpinBox()
        self.budget.setRange(0, 10_000_000)
        self.budget.setSingleStep(1000)
        self.budget.setPrefix("$")
        self.budget.setSpecialValueText("no limit")
        self.budget.setToolTip("The whole computer, as every price in FitScope")
        self.budget_label = QLabel("Budget")
        form.addRow(self.budget_label, self.budget)
        self.prefer = QComboBox()
        self.prefer.addItem("the lowest price", "price")
        self.prefer.addItem("the fastest", "speed")
        self.prefer.addItem("the most memory to spare", "headroom")
        self.prefer_label = QLabel("Put first")
        form.addRow(self.prefer_label, self.prefer)
        self.users.valueChanged.connect(lambda _v: self._edited())
        self.context.context_changed.connect(lambda _v: self._edited())
        self.context.unit_changed.connect(lambda unit: self._edited(length_unit=unit))
        self.speed.valueChanged.connect(lambda v: self._edited(min_speed=v))
        self.speed_unit.activated.connect(self._speed_unit_picked)
        self.quality.activated.connect(lambda _i: self._edited(quality_floor=self.quality.currentData()))
        self.budget.valueChanged.connect(lambda v: self._edited(budget_usd=float(v) or None))
        self.prefer.activated.connect(lambda _i: self._edited(prefer=self.prefer.currentData()))

    def show_workload(self, users: int, context_tokens: int, workload: WorkloadPrefs) -> None:
        """Put the shared settings on the widgets, emitting nothing."""
        self._updating = True
        try:
            self._workload = workload
            self.users.setValue(users)
            self.context.set_unit(workload.length_unit)
            self.context.set_tokens(context_tokens)
            select_combo(self.speed_unit, workload.speed_unit)
            self.speed.setValue(workload.min_speed)
            select_combo(self.quality, workload.quality_floor)
            self.budget.setValue(int(workload.budget_usd or 0))
            select_combo(self.prefer, workload.prefer)
        finally:
            self._updating = False

    def set_for_machines(self, machines: bool) -> None:
        """The budget and the order apply when looking for machines, not for models."""
        for w in (self.budget, self.budget_label, self.prefer, self.prefer_label):
            w.setVisible(machines)
        self.subject_title.setText("Model" if machines else "Machine")

    @property
    def min_tokens_per_s(self) -> float:
        w = self._workload
        return w.min_speed / WORDS_PER_TOKEN if w.speed_unit == "words" else w.min_speed

    @property
    def workload(self) -> WorkloadPrefs:
        return self._workload

    def _speed_unit_picked(self, _index: int) -> None:
        unit = self.speed_unit.currentData()
        if unit == self._workload.speed_unit:
            return
        said = self._workload.in_speed_unit(unit)
        was = self.speed.blockSignals(True)
        self.speed.setValue(said.min_speed)
        self.speed.blockSignals(was)
        self._edited(speed_unit=unit, min_speed=said.min_speed)

    def _edited(self, **update: object) -> None:
        if self._updating:
            return
        self._workload = WorkloadPrefs.model_validate(self._workload.model_dump() | update)
        self.workload_edited.emit(WorkloadEdit(self.users.value(), self.context.tokens(), self._workload))
