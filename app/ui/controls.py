"""The main window's left-hand controls: the hardware box (``hardware_box.py``: this machine's
devices, what to estimate for, what to compare with), the model box (the catalog's search and list,
the open and import buttons, what the model is) and the settings box (context, users, quantization,
llama.cpp's options).

The panel shows choices and reports edits; it keeps no preferences of its own. Each edit a person
makes is emitted as the new choice (``hardware_edited``, ``compare_edited``, ``controls_edited``,
``workload_edited``, ``quant_chosen``, ``model_chosen``, ``vision_toggled``) and the window writes
it into ``Preferences``; the people, the conversation length and the speed needed are the workload
settings every tab shares. A search the catalog cannot answer says the catalog's date, the nearest
models and how to add one (``add_model_requested``). ``show_preferences`` puts saved or scripted
choices on the widgets without emitting any of these.
"""

from __future__ import annotations

import contextlib
import html
from collections.abc import Iterable

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFont, QFontMetrics
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.adapters.demo_model import DEMO_LICENSE, DEMO_MODEL_NAME
from app.core.common.errors import FitScopeError
from app.core.hardware.devices import DeviceSpec
from app.core.memory.records import SpeculativeSpec
from app.core.model.architecture import Architecture
from app.core.model.catalog import by_family, find_model
from app.core.model.projector import ProjectorSpec
from app.core.model.quant import PRESETS
from app.core.model.tensors import CACHE_TYPES
from app.core.report.choices import MAX_USERS, Controls, HardwareChoice, ModelChoice
from app.core.report.prefs import Preferences, WorkloadPrefs
from app.services.tables import model_summary
from app.services.view import View
from app.ui.context_control import ContextControl
from app.ui.hardware_box import HardwareBox, select_combo
from app.ui.help import term
from app.ui.model_search import search_help_html

BACKENDS = (
    ("auto", "auto (by the hardware)"),
    ("cpu", "CPU only"),
    ("cuda", "CUDA"),
    ("rocm", "ROCm"),
    ("vulkan", "Vulkan"),
    ("metal", "Metal"),
    ("sycl", "SYCL"),
)


class ControlsPanel(QScrollArea):
    """Hardware, model and settings, one above the other, scrolling when the window is short."""

    hardware_edited = Signal(object)  # HardwareChoice
    compare_edited = Signal(object)  # tuple[HardwareChoice, ...]
    controls_edited = Signal(object)  # Controls: the whole new choice, validated
    quant_chosen = Signal(str)  # a llama.cpp preset's name
    model_chosen = Signal(object)  # ModelChoice, picked from the list
    vision_toggled = Signal(bool)
    workload_edited = Signal(object)  # WorkloadPrefs: the speed needed, or the unit lengths are typed in
    add_model_requested = Signal(str)  # "gguf", "config", "hf" or "ollama": a way to add a model not listed
    speculative_chosen = Signal(str)  # "off", "mtp", "draft" (the loaded draft) or "file" (choose one)

    def __init__(
        self, devices: Iterable[DeviceSpec], models: Iterable[Architecture], parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self._updating = False  # True while choices are put on the widgets: no edits are emitted
        self._controls = Controls()  # the choice the widgets show; each edit emits a changed copy
        self._workload = WorkloadPrefs()
        self.hardware_box = HardwareBox(devices)
        self.hardware_box.hardware_edited.connect(self.hardware_edited)
        self.hardware_box.compare_edited.connect(self.compare_edited)
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.addWidget(self.hardware_box)
        left_layout.addWidget(self._build_model_box(models), 1)
        left_layout.addWidget(self._build_settings_box())
        self.setWidget(left)
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setMinimumWidth(360)
        self._connect()

    # -- construction -------------------------------------------------------------------------

    def _build_model_box(self, models: Iterable[Architecture]) -> QGroupBox:
        model_box = QGroupBox("&Model")
        model_layout = QVBoxLayout(model_box)
        self.model_search = QLineEdit()
        self.model_search.setPlaceholderText("Search the catalog (Ctrl+F)")
        self.model_search.setClearButtonEnabled(True)
        self.model_list = QListWidget()
        self.model_list.setMinimumHeight(120)
        self.model_list.setAccessibleName("Model catalog")
        self._fill_model_list(models)
        buttons = QHBoxLayout()
        self.open_button = QPushButton("&Open GGUF…")
        self.import_button = QPushButton("Import &config.json…")
        buttons.addWidget(self.open_button)
        buttons.addWidget(self.import_button)
        self.model_info = QLabel("")
        self.model_info.setWordWrap(True)
        self.model_info.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        # What to do when the catalog has no such model: its date, the nearest names, how to add one.
        self.search_help = QLabel("")
        self.search_help.setWordWrap(True)
        self.search_help.setTextFormat(Qt.TextFormat.RichText)
        self.search_help.setAccessibleName("No catalog model matches")
        self.search_help.setVisible(False)
        self.search_help.linkActivated.connect(self._search_link)
        model_layout.addWidget(self.model_search)
        model_layout.addWidget(self.search_help)
        model_layout.addWidget(self.model_list, 1)
        model_layout.addLayout(buttons)
        model_layout.addWidget(self.model_info)
        return model_box

    def _build_settings_box(self) -> QGroupBox:
        ctl_box = QGroupBox("&Settings")
        ctl = QFormLayout(ctl_box)
        self.users_spin = QSpinBox()
        self.users_spin.setRange(1, MAX_USERS)
        self.users_spin.setAccessibleName("People at once")
        self.users_spin.setToolTip(term("Concurrent users"))
        ctl.addRow("&People at once", self.users_spin)
        self.context_control = ContextControl()
        self.context_control.setToolTip(term("Context"))
        ctl.addRow("Conversation &length\nper person", self.context_control)
        speed_row = QHBoxLayout()
        self.speed_spin = QDoubleSpinBox()
        self.speed_spin.setRange(0.0, 1000.0)
        self.speed_spin.setDecimals(1)
        self.speed_spin.setSingleStep(0.5)
        self.speed_spin.setAccessibleName("Speed each person needs")
        self.speed_spin.setToolTip(
            "The slowest answer a person will accept; the verdict says when a machine is slower. People read about "
            "4-5 words a second."
        )
        self.speed_unit = QComboBox()
        self.speed_unit.addItem("words a second", "words")
        self.speed_unit.addItem("tokens a second", "tokens")
        self.speed_unit.setAccessibleName("Unit of the speed needed")
        speed_row.addWidget(self.speed_spin)
        speed_row.addWidget(self.speed_unit, 1)
        ctl.addRow("Speed &needed", speed_row)
        self.quant_combo = QComboBox()
        for p in PRESETS:
            self.quant_combo.addItem(p.name, p.name)
        self.quant_combo.setAccessibleName("Weight quantization")
        ctl.addRow("Quantizatio&n", self.quant_combo)
        self.advanced = QWidget()
        adv = QFormLayout(self.advanced)
        adv.setContentsMargins(0, 0, 0, 0)
        self.ctk_combo = QComboBox()
        self.ctv_combo = QComboBox()
        for combo in (self.ctk_combo, self.ctv_combo):
            for name in CACHE_TYPES:
                combo.addItem(name, name)
        self.ctk_combo.setToolTip(term("KV cache") + " A smaller type (q8_0) halves it.")
        self.ctv_combo.setToolTip(term("KV cache") + " A quantized V cache needs flash attention.")
        self.ctk_combo.setAccessibleName("K cache type")
        self.ctv_combo.setAccessibleName("V cache type")
        adv.addRow("&K cache type", self.ctk_combo)
        adv.addRow("&V cache type", self.ctv_combo)
        self.fa_check = QCheckBox("Flash &attention")
        self.fa_check.setToolTip(term("Flash attention") + " (llama.cpp's -fa; a quantized V cache needs it)")
        adv.addRow("", self.fa_check)
        self.ngl_spin = QSpinBox()
        self.ngl_spin.setRange(-1, 1000)
        self.ngl_spin.setSpecialValueText("auto (the most that fit)")
        self.ngl_spin.setAccessibleName("GPU layers")
        self.ngl_spin.setWhatsThis(term("Layers"))
        adv.addRow("&GPU layers", self.ngl_spin)
        self.cpu_moe_spin = QSpinBox()
        self.cpu_moe_spin.setRange(-1, 1024)
        self.cpu_moe_spin.setSpecialValueText("auto (as llama.cpp's --fit)")
        self.cpu_moe_spin.setSuffix(" layers")
        self.cpu_moe_spin.setAccessibleName("Experts in system memory")
        self.cpu_moe_spin.setToolTip(
            "Mixture-of-experts models: keep the experts of the first N layers in system memory "
            "(llama-server --n-cpu-moe N; 0: none). Attention and shared weights stay on the GPU."
        )
        adv.addRow("E&xperts in system memory", self.cpu_moe_spin)
        self.fastest_button = QPushButton("&Fastest settings…")
        self.fastest_button.setToolTip(
            "Search KV cache types, flash attention, -ub, threads and the GPU/system-memory split for the "
            "fastest llama-server settings that fit this context and these users; shows the best three"
        )
        adv.addRow("", self.fastest_button)
        self.backend_combo = QComboBox()
        for key, build_name in BACKENDS:
            self.backend_combo.addItem(build_name, key)
        self.backend_combo.setAccessibleName("llama.cpp build")
        self.backend_combo.setToolTip(
            "Which llama.cpp build runs the model: a GPU build keeps no repacked copy of the weights left in "
            "system memory, and keeps working buffers on the first GPU even for layers on the CPU"
        )
        adv.addRow("llama.cpp &build", self.backend_combo)
        self.consumer_combo = QComboBox()
        self.consumer_combo.addItem("llama-server", "llama-server")
        self.consumer_combo.addItem("llama-cpp-python (FitScope's runs)", "llama-cpp-python")
        self.consumer_combo.addItem("Ollama (llama-server, its batch sizes)", "ollama")
        self.consumer_combo.setAccessibleName("Program running llama.cpp")
        self.consumer_combo.setToolTip(
            "llama-server reserves answers only for its users and keeps a small sliding-window cache; "
            "llama-cpp-python reserves a whole batch of answers and a full-size cache; Ollama runs llama-server "
            "with batches sized by the context"
        )
        adv.addRow("R&un by", self.consumer_combo)
        self.mmap_check = QCheckBox("&Memory-map the weights (mmap)")
        self.mmap_check.setToolTip("llama.cpp's default; --no-mmap loads them into memory instead")
        adv.addRow("", self.mmap_check)
        self.speculative_combo = QComboBox()
        self.speculative_combo.setAccessibleName("Speculative decoding")
        self.speculative_combo.setToolTip(
            "llama-server drafts tokens with a small model (-md) or the model's own multi-token-prediction "
            "head (--spec-type draft-mtp); the draft's weights, KV cache and buffers are its own part of the memory"
        )
        adv.addRow("S&peculative decoding", self.speculative_combo)
        self.vision_check = QCheckBox("Add &vision projector")
        self.vision_check.setToolTip(
            "Lets the model read pictures: a small second file (its vision \"projector\") is loaded beside it, "
            "and its weights and working memory take room on the first graphics card (in system memory without "
            "one). llama-server loads it with --mmproj."
        )
        self.mmproj_button = QPushButton("Projector &file...")
        self.mmproj_button.setToolTip("Choose a projector GGUF (mmproj-*.gguf) to load beside the model")
        vision_row = QHBoxLayout()
        vision_row.addWidget(self.vision_check)
        vision_row.addWidget(self.mmproj_button)
        ctl.addRow(vision_row)
        ctl.addRow(self.advanced)
        return ctl_box

    def _fill_model_list(self, models: Iterable[Architecture]) -> None:
        """The demo, then the catalog under a heading per family (Qwen3.5 / Qwen3.6, Gemma 4, ...):
        headings are not selectable; typing a family's name in the search shows all of it."""
        item = QListWidgetItem(f"Demo: {DEMO_MODEL_NAME}")
        item.setData(Qt.ItemDataRole.UserRole, ("demo", ""))
        item.setToolTip(f"The built-in demo model. {DEMO_LICENSE}")
        self.model_list.addItem(item)
        heading_font = QFont(self.model_list.font())
        heading_font.setBold(True)
        for family, members in by_family(list(models)):
            heading = QListWidgetItem(family)
            heading.setData(Qt.ItemDataRole.UserRole, ("family", family))
            heading.setFlags(Qt.ItemFlag.ItemIsEnabled)  # a heading, not a choice
            heading.setFont(heading_font)
            self.model_list.addItem(heading)
            for arch in members:
                size = f"{arch.params_billions:g}B" if arch.params_billions else ""
                item = QListWidgetItem(f"    {arch.name}  {size}")
                item.setData(Qt.ItemDataRole.UserRole, ("catalog", arch.id))
                item.setToolTip(
                    f"{family}: {arch.name}: {arch.arch}, {arch.n_layer} layers, trained context {arch.n_ctx_train:,}"
                )
                self.model_list.addItem(item)

    def _connect(self) -> None:
        self.model_search.textChanged.connect(self._filter_models)
        self.model_list.currentItemChanged.connect(self._model_picked)
        self.context_control.context_changed.connect(lambda v: self._edited(context_per_user_tokens=v))
        self.context_control.unit_changed.connect(lambda unit: self._workload_changed(length_unit=unit))
        self.speed_spin.valueChanged.connect(lambda v: self._workload_changed(min_speed=v))
        self.speed_unit.activated.connect(self._speed_unit_picked)
        self.users_spin.valueChanged.connect(lambda v: self._edited(users=v))
        self.quant_combo.activated.connect(self._quant_picked)
        self.ctk_combo.activated.connect(lambda _i: self._edited(cache_type_k=self.ctk_combo.currentData()))
        self.ctv_combo.activated.connect(lambda _i: self._edited(cache_type_v=self.ctv_combo.currentData()))
        self.fa_check.toggled.connect(lambda on: self._edited(flash_attn=on))
        self.ngl_spin.valueChanged.connect(lambda v: self._edited(gpu_layers="auto" if v < 0 else v))
        self.cpu_moe_spin.valueChanged.connect(lambda v: self._edited(n_cpu_moe=None if v < 0 else v))
        self.backend_combo.activated.connect(lambda _i: self._edited(backend=self.backend_combo.currentData()))
        self.consumer_combo.activated.connect(lambda _i: self._edited(consumer=self.consumer_combo.currentData()))
        self.mmap_check.toggled.connect(lambda on: self._edited(mmap=on))
        self.vision_check.toggled.connect(self._vision_toggled)
        self.speculative_combo.activated.connect(self._speculative_picked)

    # -- choices onto the widgets -------------------------------------------------------------

    def show_preferences(self, prefs: Preferences, local_gpus: bool, vision_available: bool) -> None:
        """Put every saved choice on its widget. ``local_gpus``: this machine has GPUs;
        ``vision_available``: a projector can be added to this model."""
        self._updating = True
        try:
            self.hardware_box.show_choices(prefs.hardware, prefs.compare)
            c = prefs.controls
            self._controls = c
            self.show_workload(prefs.workload)
            self.context_control.set_tokens(c.context_per_user_tokens)
            self.users_spin.setValue(c.users)
            select_combo(self.ctk_combo, c.cache_type_k)
            select_combo(self.ctv_combo, c.cache_type_v)
            self.fa_check.setChecked(c.flash_attn)
            self.ngl_spin.setValue(
                -1 if c.gpu_layers == "auto" else self.ngl_spin.maximum() if c.gpu_layers == "all" else c.gpu_layers
            )
            self.cpu_moe_spin.setValue(-1 if c.n_cpu_moe is None else c.n_cpu_moe)
            select_combo(self.backend_combo, c.backend)
            select_combo(self.consumer_combo, c.consumer)
            self.mmap_check.setChecked(c.mmap)
            self.vision_check.setChecked(c.projector is not None)
            select_combo(self.quant_combo, prefs.model.quant)
            self.select_model_item(prefs.model)
            self.update_hardware_widgets(prefs.hardware, local_gpus)
            self.update_model_widgets(prefs.model.kind, c.projector, vision_available)
        finally:
            self._updating = False

    def show_shared(self, controls: Controls, workload: WorkloadPrefs) -> None:
        """The workload settings every tab shares, after an edit elsewhere: people, conversation
        length, speed needed (emitting nothing)."""
        self._controls = controls
        self._updating = True
        try:
            self.users_spin.setValue(controls.users)
            self.context_control.set_tokens(controls.context_per_user_tokens)
        finally:
            self._updating = False
        self.show_workload(workload)

    def show_workload(self, workload: WorkloadPrefs) -> None:
        """Put the shared workload settings (speed needed, units) on the widgets, emitting nothing."""
        self._workload = workload
        for w in (self.speed_spin, self.speed_unit):
            w.blockSignals(True)
        try:
            select_combo(self.speed_unit, workload.speed_unit)
            self.speed_spin.setValue(workload.min_speed)
        finally:
            for w in (self.speed_spin, self.speed_unit):
                w.blockSignals(False)
        self.context_control.set_unit(workload.length_unit)

    def select_model_item(self, choice: ModelChoice) -> None:
        """Highlight ``choice`` in the list (none for a file), without emitting ``model_chosen``."""
        was = self.model_list.blockSignals(True)
        self.model_list.setCurrentRow(-1)
        for i in range(self.model_list.count()):
            if self.model_list.item(i).data(Qt.ItemDataRole.UserRole) == (choice.kind, choice.ref):
                self.model_list.setCurrentRow(i)
        self.model_list.blockSignals(was)

    def update_hardware_widgets(self, hardware: HardwareChoice, local_gpus: bool) -> None:
        """Enable what applies to ``hardware``: GPU count and host memory for catalog GPUs, GPU
        layers wherever there is a GPU (``local_gpus``: this machine has some)."""
        self.hardware_box.update_widgets(hardware)
        has_gpu = (hardware.kind == "local" and local_gpus) or (hardware.kind == "catalog")
        self.ngl_spin.setEnabled(has_gpu)
        self.ngl_spin.setToolTip(term("Layers") if has_gpu else "No GPU in this choice: every layer runs on the CPU.")

    def update_model_widgets(self, model_kind: str, projector: ProjectorSpec | None, vision_available: bool) -> None:
        """The vision box, and the quantization list (a file's quantization is fixed)."""
        self.show_vision(projector, vision_available)
        self.quant_combo.setEnabled(model_kind in ("catalog", "hf_config"))
        self.quant_combo.setToolTip(
            term("Quantization")
            if self.quant_combo.isEnabled()
            else "A GGUF file's quantization is fixed; the ladder shows the others."
        )

    def show_vision(self, projector: ProjectorSpec | None, available: bool) -> None:
        """Tick the vision box when ``projector`` is loaded; it is enabled when one is ``available``."""
        previous, self._updating = self._updating, True
        try:
            self.vision_check.setChecked(projector is not None)
        finally:
            self._updating = previous
        self.vision_check.setEnabled(available)
        self.vision_check.setToolTip(
            f"Loaded: {projector.name} ({projector.file_name})"
            if projector is not None
            else "This model reads text only; choose a projector file to add one"
            if not available
            else "Let the model read pictures: its vision projector, a small second file, is loaded beside it "
            "(llama-server --mmproj)"
        )

    def show_speculative(self, spec: SpeculativeSpec | None, draft: SpeculativeSpec | None, mtp: bool) -> None:
        """The speculative-decoding choices: off, the model's MTP head (when it has one llama.cpp can
        run: ``mtp``), the ``draft`` model read from a file, and a file to choose; ``spec`` is selected."""
        previous, self._updating = self._updating, True
        try:
            combo = self.speculative_combo
            combo.clear()
            combo.addItem("Off", "off")
            if mtp or (spec is not None and spec.kind == "mtp"):
                combo.addItem("The model's MTP head (--spec-type draft-mtp)", "mtp")
            if draft is not None:
                combo.addItem(f"Draft model: {draft.name} (-md)", "draft")
            combo.addItem("Choose a draft model file (-md)…", "file")
            select_combo(combo, "off" if spec is None else spec.kind)
        finally:
            self._updating = previous

    def show_model(self, view: View) -> None:
        """What the view's model is, and the limits it sets: GPU layers, experts, trained context."""
        m = view.model
        summary = model_summary(view, DEMO_MODEL_NAME, DEMO_LICENSE)
        if m is None or summary is None:
            return
        arch = m.arch
        title = f"<b>{html.escape(summary.name, quote=False)}</b> ({html.escape(summary.kind, quote=False)})"
        self.model_info.setText("<br>".join([title, *(html.escape(line, quote=False) for line in summary.lines)]))
        self.ngl_spin.setToolTip(
            f"llama.cpp's -ngl: {arch.n_layer + 1} puts all {arch.n_layer} layers and the output layer on the GPU"
        )
        self.cpu_moe_spin.setMaximum(arch.n_layer)
        self.cpu_moe_spin.setEnabled(arch.moe is not None and self.ngl_spin.isEnabled())
        self.context_control.set_trained_context(arch.n_ctx_train)
        if m.quant in {p.name for p in PRESETS} and not self.quant_combo.isEnabled():
            select_combo(self.quant_combo, m.quant)

    # -- presentation -------------------------------------------------------------------------

    def set_presentation(self, on: bool) -> None:
        """Only the essential controls: the advanced settings and the device bars are hidden."""
        self.advanced.setVisible(not on)
        self.hardware_box.hardware_view.setVisible(not on)

    def keep_names_readable(self, font: QFont) -> None:
        """Widen the panel so the longest device name fits whole at ``font``'s size."""
        metrics = QFontMetrics(font)
        names = self.hardware_box.target_combo
        widest = max(metrics.horizontalAdvance(names.itemText(i)) for i in range(names.count()))
        # combo chrome, the compare row's count box, group and scroll margins
        content = self.widget()
        assert content is not None
        content.adjustSize()
        chrome = self.verticalScrollBar().sizeHint().width() + 2 * self.frameWidth()
        need = max(content.minimumSizeHint().width(), widest + metrics.horizontalAdvance("x" * 10) + 60)
        self.setMinimumWidth(max(360, need + chrome))

    def focus_search(self) -> None:
        self.model_search.setFocus()
        self.model_search.selectAll()

    # -- edits --------------------------------------------------------------------------------

    def set_current_controls(self, controls: Controls) -> None:
        """The choice the window holds now (changed elsewhere: a projector, a configuration opened)."""
        self._controls = controls

    def _edited(self, **update: object) -> None:
        if self._updating:
            return
        self._controls = Controls.model_validate(self._controls.model_dump() | update)
        self.controls_edited.emit(self._controls)

    def _workload_changed(self, **update: object) -> None:
        if self._updating:
            return
        self._workload = WorkloadPrefs.model_validate(self._workload.model_dump() | update)
        self.workload_edited.emit(self._workload)

    def _speed_unit_picked(self, _index: int) -> None:
        """The same speed said in the other unit (7.5 words a second is 10 tokens a second)."""
        unit = self.speed_unit.currentData()
        if unit == self._workload.speed_unit:
            return
        said = self._workload.in_speed_unit(unit)
        was = self.speed_spin.blockSignals(True)
        self.speed_spin.setValue(said.min_speed)
        self.speed_spin.blockSignals(was)
        self._workload_changed(speed_unit=unit, min_speed=said.min_speed)

    def _quant_picked(self, _index: int) -> None:
        if not self._updating:
            self.quant_chosen.emit(self.quant_combo.currentData())

    def _vision_toggled(self, on: bool) -> None:
        if not self._updating:
            self.vision_toggled.emit(on)

    def _speculative_picked(self, _index: int) -> None:
        if not self._updating:
            self.speculative_chosen.emit(self.speculative_combo.currentData())

    def _model_picked(self, current: QListWidgetItem | None, _previous: QListWidgetItem | None = None) -> None:
        if self._updating or current is None:
            return
        kind, ref = current.data(Qt.ItemDataRole.UserRole)
        if kind == "family":
            return  # a heading
        quant = self.quant_combo.currentData() or "Q4_K_M"
        if kind == "catalog":
            # A new model starts on the file people download (Q4_K_M, or the format it was released
            # in, such as gpt-oss's MXFP4), not on the quantization chosen for the previous model.
            with contextlib.suppress(FitScopeError):
                quant = find_model(ref).default_quant or "Q4_K_M"
        self.model_chosen.emit(ModelChoice(kind=kind, ref=ref, quant=quant))

    def _filter_models(self, text: str) -> None:
        """Show the models whose name, family or details hold ``text``, under their family's heading;
        a family's name shows the whole family."""
        needle = text.strip().lower()
        heading: QListWidgetItem | None = None
        heading_matches = shown_in_family = False
        shown = 0
        for i in range(self.model_list.count()):
            item = self.model_list.item(i)
            kind, _ref = item.data(Qt.ItemDataRole.UserRole)
            if kind == "family":
                if heading is not None:
                    heading.setHidden(bool(needle) and not (heading_matches or shown_in_family))
                heading = item
                heading_matches = not needle or needle in item.text().lower()
                shown_in_family = False
                continue
            match = not needle or needle in (item.text() + item.toolTip()).lower()
            visible = match or (kind == "catalog" and heading_matches)
            item.setHidden(not visible)
            shown_in_family |= visible and kind == "catalog"
            shown += visible
        if heading is not None:
            heading.setHidden(bool(needle) and not (heading_matches or shown_in_family))
        self.search_help.setVisible(shown == 0)
        if shown == 0:
            self.search_help.setText(search_help_html(text.strip(), self._catalog_names()))

    def _catalog_names(self) -> list[tuple[str, str]]:
        """(catalog id, name) of every model in the list."""
        out = []
        for i in range(self.model_list.count()):
            kind, ref = self.model_list.item(i).data(Qt.ItemDataRole.UserRole)
            if kind == "catalog":
                out.append((ref, self.model_list.item(i).text().strip().split("  ")[0]))
        return out

    def _search_link(self, link: str) -> None:
        kind, _, ref = link.partition(":")
        if kind == "model":
            self.model_search.clear()
            for i in range(self.model_list.count()):
                if self.model_list.item(i).data(Qt.ItemDataRole.UserRole) == ("catalog", ref):
                    self.model_list.setCurrentRow(i)  # picked as a click would
            return
        self.add_model_requested.emit(kind)

