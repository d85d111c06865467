"""The "Which machine?" tab, both ways round. Machines for this model: the workload in plain words
in, the catalog's machines that do it out — ranked, on a price-against-speed chart with the best
buys joined up, each with why the others fail — and one click to open a configuration in the main
view (:func:`app.services.advisor.advise`). Models for this machine: the machine chosen on the
left, and the catalog's models it runs well for the same workload, best answers first
(:func:`app.services.model_finder.models_for_machine`, shown by ``models_view.py``).

The workload (``workload_form.py``) is the window's one set of workload settings; results computed
for other settings are greyed with a line saying which (``stale.py``) until found again. Both
searches run on the tab's job runner, off the GUI thread, with progress.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from PySide6.QtCore import Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QButtonGroup,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QRadioButton,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from app.core.advisor.commands import launch_commands
from app.core.advisor.records import CATEGORY_WORDS, Candidate, HardwareAdvice, Workload
from app.core.report.choices import DEMO_CATALOG_ID, Controls, HardwareChoice, Machine, ModelChoice
from app.core.report.lengths import WORDS_PER_TOKEN
from app.core.report.prefs import Preferences
from app.core.report.verdict import rate
from app.services.advisor import advice_warnings, advise, workload_sentence
from app.services.model_finder import MachineModels, models_for_machine
from app.ui.advisor_chart import PriceSpeedChart
from app.ui.jobs import JobRunner
from app.ui.models_view import ModelsView
from app.ui.panels import fill_table, readonly_table
from app.ui.stale import Basis, StaleMark
from app.ui.workload_form import WorkloadEdit, WorkloadForm

CurrentSettings = Callable[[], tuple[Preferences, Machine]]
"""The window's preferences and this machine now (where both searches start)."""
OpenConfiguration = Callable[[ModelChoice, HardwareChoice, Controls], None]
"""Shows a configuration in the main view."""

HEADERS = ("#", "Machine", "Quantization", "Price", "Memory to spare", "Speed per person", "All together", "Verdict")
MACHINE_KEYS = (
    "model",
    "people",
    "conversation length",
    "speed needed",
    "quantization may cost",
    "budget",
    "put first",
)
MODEL_KEYS = ("machine", "people", "conversation length", "speed needed", "quantization may cost")


class AdvisorPanel(QWidget):
    """The workload, the question (machines for a model, or models for a machine), the answer."""

    advice_shown = Signal(object)  # the HardwareAdvice on screen
    models_shown = Signal(object)  # the MachineModels on screen
    configuration_opened = Signal(object)  # the Candidate sent to the main view
    model_opened = Signal(object)  # the ModelChoice sent to the main view
    workload_edited = Signal(object)  # WorkloadEdit: the shared workload settings, edited here
    error_shown = Signal(str)

    def __init__(self, current: CurrentSettings, open_configuration: OpenConfiguration, parent: QWidget | None = None):
        super().__init__(parent)
        self._current = current
        self._open = open_configuration
        self.advice: HardwareAdvice | None = None
        self.models: MachineModels | None = None
        self._pending: Basis | None = None
        self._basis_parts: dict[str, str] = {}
        self._job = JobRunner("advisor", self)
        self._job.progressed.connect(self._on_progress)
        self._job.finished.connect(self._on_finished)
        self._job.failed.connect(self._on_failed)
        self._job.running_changed.connect(self._on_running)
        self._build()

    # -- layout ------------------------------------------------------------------------------------

    def _build(self) -> None:
        self.machines_mode = QRadioButton("&Machines for this model")
        self.models_mode = QRadioButton("Mo&dels for this machine")
        self.machines_mode.setChecked(True)
        modes = QButtonGroup(self)
        modes.addButton(self.machines_mode)
        modes.addButton(self.models_mode)
        self.machines_mode.toggled.connect(lambda _on: self._mode_changed())
        mode_row = QHBoxLayout()
        mode_row.addWidget(self.machines_mode)
        mode_row.addWidget(self.models_mode)
        mode_row.addStretch(1)
        self.form = WorkloadForm()
        self.form.workload_edited.connect(self._workload_edited)
        self.summary = QLabel("")  # the workload in one line, in presentation mode (the form is hidden)
        self.summary.setWordWrap(True)
        self.summary.setVisible(False)
        buttons = QHBoxLayout()
        self.find_button = QPushButton("&Find machines")
        self.find_button.clicked.connect(self.search)
        buttons.addWidget(self.find_button)
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setVisible(False)
        buttons.addWidget(self.progress, 1)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        # Each answer's note sits on its own page: only the question on screen says it is out of date.
        self.stale_note = QLabel("")
        self.models_stale_note = QLabel("")

        self.machines_view = QWidget()
        self.table = readonly_table(HEADERS)  # every column whole; the table scrolls sideways if need be
        self.table.setSelectionBehavior(self.table.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(self.table.SelectionMode.SingleSelection)
        self.table.setAccessibleName("Machines that do it")
        self.table.itemSelectionChanged.connect(self._on_selected)
        self.table.doubleClicked.connect(lambda _index: self.open_selected())
        self.chart = PriceSpeedChart()
        self.chart.setMinimumHeight(220)
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
        self.open_button.setToolTip("Show this machine, model, conversation length and people in the main view")
        self.open_button.clicked.connect(self.open_selected)
        self.copy_button = QPushButton("Copy the launch command")
        self.copy_button.setEnabled(False)
        self.copy_button.clicked.connect(self.copy_command)
        actions.addWidget(self.open_button)
        actions.addWidget(self.copy_button)
        actions.addStretch(1)
        machines = QVBoxLayout(self.machines_view)
        machines.setContentsMargins(0, 0, 0, 0)
        machines.addWidget(self.stale_note)
        self.machines_results = QWidget()
        results = QVBoxLayout(self.machines_results)
        results.setContentsMargins(0, 0, 0, 0)
        machines.addWidget(self.machines_results, 1)
        machines = results
        machines.addWidget(QLabel("Machines that do it, best first (double-click one to open it)"))
        machines.addWidget(self.table, 2)
        machines.addWidget(self.chart, 2)
        machines.addLayout(actions)
        self.command_label = QLabel("The launch command")
        machines.addWidget(self.command_label)
        machines.addWidget(self.command_text)
        self.why_label = QLabel("The best of each kind, and why the others fall short")
        machines.addWidget(self.why_label)
        machines.addWidget(self.why_text)
        self.models_view = ModelsView()
        self.models_view.model_opened.connect(self._open_model)
        models_page = QWidget()
        models = QVBoxLayout(models_page)
        models.setContentsMargins(0, 0, 0, 0)
        models.addWidget(self.models_stale_note)
        models.addWidget(self.models_view, 1)
        self.models_page = models_page
        self.results = QStackedWidget()
        self.results.addWidget(self.machines_view)
        self.results.addWidget(models_page)

        layout = QVBoxLayout(self)
        layout.addLayout(mode_row)
        layout.addWidget(self.form)
        layout.addWidget(self.summary)
        layout.addLayout(buttons)
        layout.addWidget(self.status)
        layout.addWidget(self.results, 1)
        self.marks = {
            True: StaleMark(self.stale_note, [self.machines_results], "press Find machines"),
            False: StaleMark(self.models_stale_note, [self.models_view], "press Find models"),
        }
        self._mode_changed()

    # -- the workload ------------------------------------------------------------------------------

    @property
    def for_machines(self) -> bool:
        return self.machines_mode.isChecked()

    def _mode_changed(self) -> None:
        machines = self.for_machines
        self.form.set_for_machines(machines)
        self.results.setCurrentWidget(self.machines_view if machines else self.models_page)
        self.find_button.setText("&Find machines" if machines else "&Find models")
        self._show_subject()

    def show_workload(self, prefs: Preferences, parts: Mapping[str, str]) -> None:
        """Put the window's workload settings on the form and say whether the answer on screen is
        for them (``parts``: the settings in words, as the stale marks compare them)."""
        self.form.show_workload(prefs.controls.users, prefs.controls.context_per_user_tokens, prefs.workload)
        self._basis_parts = dict(parts)
        self._show_subject()
        self.marks[True].set_current(Basis.of(parts, MACHINE_KEYS))
        self.marks[False].set_current(Basis.of(parts, MODEL_KEYS))

    def _basis(self) -> Basis:
        return Basis.of(self._basis_parts, MACHINE_KEYS if self.for_machines else MODEL_KEYS)

    def _show_subject(self) -> None:
        subject = self._basis_parts.get("model" if self.for_machines else "machine", "")
        self.form.subject.setText(subject or "The model chosen on the left.")
        self.summary.setText(
            f"{subject}: "
            + ", ".join(f"{k} {v}" for k, v in self._basis().parts if k not in ("model", "machine"))
            + "."
        )

    def _workload_edited(self, edit: WorkloadEdit) -> None:
        self.workload_edited.emit(edit)

    def workload(self) -> Workload:
        """The workload on screen, for the model chosen on the left (the demo file as the catalog's
        model it is)."""
        prefs, _machine = self._current()
        model = prefs.model
        if model.kind == "demo":
            model = ModelChoice(kind="catalog", ref=DEMO_CATALOG_ID, quant=model.quant)
        w = prefs.workload
        return Workload(
            model=model,
            context_per_user_tokens=prefs.controls.context_per_user_tokens,
            users=prefs.controls.users,
            min_tokens_per_s=self.form.min_tokens_per_s,
            budget_usd=w.budget_usd,
            prefer=w.prefer,
            quality_floor=w.quality_floor,
        )

    # -- searching ---------------------------------------------------------------------------------

    def search(self) -> bool:
        """Start the search the tab asks now; False when one is running or the workload cannot be read."""
        return self.find_machines() if self.for_machines else self.find_models()

    def find_machines(self) -> bool:
        """Start the machines sweep; False when one is running or the workload cannot be read."""
        if self._job.running:
            return False
        try:
            workload = self.workload()
        except ValueError as exc:
            self._on_failed(0, str(exc))
            return False
        self._pending = Basis.of(self._basis_parts, MACHINE_KEYS)
        self.status.setText("Going through the catalog's machines…")
        return bool(self._job.start(lambda report: advise(workload, progress=lambda f, m: report("progress", (f, m)))))

    def find_models(self) -> bool:
        """Start the models sweep for the machine chosen on the left."""
        if self._job.running:
            return False
        prefs, machine = self._current()
        controls = prefs.controls
        tps, floor = self.form.min_tokens_per_s, prefs.workload.quality_floor
        self._pending = Basis.of(self._basis_parts, MODEL_KEYS)
        self.status.setText("Going through the catalog's models…")

        def work(report: Callable[[str, object], None]) -> MachineModels:
            return models_for_machine(
                prefs.hardware, controls, tps, floor, machine, progress=lambda f, m: report("progress", (f, m))
            )

        return bool(self._job.start(work))

    @property
    def running(self) -> bool:
        return self._job.running

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

    def _on_finished(self, _job_id: int, outcome: HardwareAdvice | MachineModels) -> None:
        if isinstance(outcome, MachineModels):
            self.show_models(outcome)
        else:
            self.show_advice(outcome)

    # -- results -----------------------------------------------------------------------------------

    def show_models(self, result: MachineModels) -> None:
        self.models = result
        self.models_view.show_models(result)
        self.status.setText("")
        self.marks[False].set_computed(self._pending)
        self.models_shown.emit(result)

    def _speed_unit(self) -> tuple[float, str]:
        if self.form.workload.speed_unit == "words":
            return WORDS_PER_TOKEN, "words a second"
        return 1.0, "tokens/s"

    def show_advice(self, advice: HardwareAdvice) -> None:
        self.advice = advice
        w = advice.workload
        unit, unit_name = self._speed_unit()
        warnings = " ".join(advice_warnings(advice))
        opening = f"{workload_sentence(w, advice.model_label)} {warnings}".strip()
        self.status.setText(
            f"{opening} {advice.evaluated:,} configurations looked at in {advice.seconds:.1f} s: "
            f"{len(advice.ranked)} machines do it. Prices are whole computers."
            if advice.ranked
            else f"{opening} No machine in the catalog does it; below, the nearest."
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
                    f"{rate(speed)} {unit_name}",
                    f"{rate(c.total_tokens_per_s * unit)} {unit_name}",
                    "does it",
                ]
            )
        fill_table(self.table, rows)
        for row, c in enumerate(advice.ranked):
            item = self.table.item(row, 3)
            if item is not None:
                item.setToolTip(c.price_note)
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
        self.marks[True].set_computed(self._pending)
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

    def _open_model(self, model: ModelChoice) -> None:
        prefs, _machine = self._current()
        self._open(model, prefs.hardware, prefs.controls)
        self.model_opened.emit(model)

    def copy_command(self) -> str:
        c = self.selected()
        if c is None or self.advice is None:
            return ""
        text = launch_commands(self.advice, c)[0]
        QGuiApplication.clipboard().setText(text)
        self.status.setText("The llama-server command is on the clipboard.")
        return text

    @property
    def results_stale(self) -> bool:
        """Whether the answer on screen was found for other settings than the window's now."""
        return self.marks[self.for_machines].stale

    def set_presentation(self, on: bool) -> None:
        """For a room: the workload in one line instead of the form, and the answer's table with the
        columns a buyer reads (machine, price, speed per person, verdict)."""
        self.form.setVisible(not on)
        self.summary.setVisible(on)
        self.status.setVisible(not on)
        for w in (self.command_text, self.command_label, self.why_text, self.why_label, self.chart):
            w.setVisible(not on)
        for column in ("Quantization", "Memory to spare", "All together", "Verdict"):
            self.table.setColumnHidden(HEADERS.index(column), on)
        for column in ("Memory to spare",):
            self.models_view.table.setColumnHidden(self.models_view.headers.index(column), on)
        self.models_view.note.setVisible(not on)

    def shutdown(self) -> None:
        self._job.close(timeout=5)
