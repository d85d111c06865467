"""The main window: hardware, model and controls on the left; the verdict and the charts on the right.

Every change goes the same way: the widgets write the new choice into ``Preferences``, a request is
sent to the estimate worker, and the returned ``View`` is shown everywhere at once
(``view_changed`` fires after it is). Nothing slow runs on the GUI thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from PySide6.QtCore import QBuffer, QByteArray, QEvent, QIODevice, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import (
    QAction,
    QCloseEvent,
    QDragEnterEvent,
    QDropEvent,
    QFontMetrics,
    QGuiApplication,
    QKeySequence,
)
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.adapters.cpu_topology import llama_math_threads
from app.adapters.demo_model import DEMO_LICENSE, DEMO_MODEL_NAME, demo_model_ready
from app.adapters.divergence_runner import measured_quality
from app.adapters.history import RunHistory
from app.adapters.load_profile import cached_profile, measure_profile, memory_slots
from app.adapters.logs import log_path
from app.core import fit, report
from app.core.catalog import find_model, find_projector, load_devices, load_models
from app.core.coverage import APPROXIMATE_NOTE, coverage
from app.core.errors import FitScopeError
from app.core.estimate import Settings
from app.core.hardware import DEFAULT_HOST_MEMORY, HOST_MEMORY, HostSnapshot, NvmlStatus, machine_key
from app.core.measure import RunResult, SweepRow
from app.core.prefs import MAX_COMPARED, Preferences, save_preferences
from app.core.projector import ProjectorSpec, read_projector
from app.core.quant import PRESETS
from app.core.run_vs_estimate import RunReport
from app.core.scenario import (
    MAX_USERS,
    Controls,
    HardwareChoice,
    Machine,
    ModelChoice,
    Request,
    View,
    evaluate_in_worker,
    load_model,
    resolve_targets,
)
from app.core.tensors import CACHE_TYPES
from app.core.units import GIB
from app.services.runs import finish_run, save_run
from app.ui.ab_panel import AbPanel
from app.ui.advisor_panel import AdvisorPanel
from app.ui.charts import ConcurrencyChart, ContextChart, DeviceBar, LadderChart, SplitChart, legend_html
from app.ui.help import (
    HOW_IT_WORKS,
    AboutDialog,
    TextDialog,
    Walkthrough,
    architectures_html,
    diagnostics,
    glossary_html,
    term,
)
from app.ui.history_panel import HistoryPanel
from app.ui.jobs import JobRunner, process_pool
from app.ui.load_panel import LoadPanel
from app.ui.panels import (
    ContextControl,
    DeviceCombo,
    HardwareView,
    VerdictBanner,
    device_label,
    fill_table,
    readonly_table,
)
from app.ui.run_panel import RunContext, RunPanel, demo_or_path
from app.ui.scale_panel import ScalePanel

_log = logging.getLogger(__name__)

PRESENTATION_SCALE = 1.6
GPU_CHANGE_BYTES = 256 * 1024**2  # free GPU memory moving by less than this does not re-estimate


@dataclass
class Services:
    """What the window needs from the outside world, passed in (tests pass fakes for NVML only)."""

    nvml_status: Callable[[], NvmlStatus]
    detect_host: Callable[[bool], HostSnapshot]
    demo_path: Callable[[], Path]
    prefs_path: Path
    poll_interval_ms: int = 1000
    measure_bandwidth: bool = True
    make_estimate_pool: Callable[[], Executor] | None = process_pool
    history_path: Path | None = None  # None: the platform's data folder
    first_run_guide: bool = True  # show the walk-through until it has been closed once


class MainWindow(QMainWindow):
    view_changed = Signal(object)  # View, after it is on screen
    error_shown = Signal(str)
    machine_changed = Signal(object)  # Machine

    def __init__(self, services: Services, prefs: Preferences, startup_note: str = "") -> None:
        super().__init__()
        self.setWindowTitle("FitScope: will this model run here, and how fast?")
        self.setAcceptDrops(True)
        self._services = services
        self._prefs = prefs
        projector = prefs.controls.projector
        # A projector read from a file (not a catalog model's own) stays chosen across models.
        self._projector_file: ProjectorSpec | None = (
            projector if projector is not None and not projector.source.startswith("https://") else None
        )
        self._estimates = JobRunner("estimate", self, make_pool=services.make_estimate_pool)
        self._hardware = JobRunner("nvml", self)
        self._host_job = JobRunner("host", self)
        self._last_good_model: ModelChoice | None = None
        self._applied_job = 0
        self.view: View | None = None
        self._measuring = services.measure_bandwidth
        status = services.nvml_status()
        self._nvml_message = status.message
        self.machine = Machine(
            gpus=status.gpus if status.available else (), host=services.detect_host(False), gpu_message=status.message
        )
        self._devices = {d.id: d for d in load_devices()}
        self._models = load_models()
        self._updating = False
        self._history_note = ""
        self.last_error = ""
        self.walkthrough: Walkthrough | None = None
        try:
            self.history: RunHistory | None = RunHistory(services.history_path)
        except FitScopeError as exc:
            self.history = None
            self._history_note = str(exc)
        self._efficiency: tuple[tuple[str, float], ...] = ()
        self._load_efficiencies()

        # Start the first estimate before building the widgets: the worker process starts meanwhile.
        self.request_estimate()
        self._build_ui()
        self._build_menus()
        if prefs.model.kind == "demo" and not demo_model_ready():
            self.banner.set_message("", "Preparing the built-in demo model (first start only)…")
        self._apply_prefs_to_widgets()
        self.hardware_view.set_gpus(self.machine.gpus, self._nvml_message)
        self.hardware_view.set_host(self.machine.host, self._measuring)

        self._estimates.finished.connect(self._on_view)
        self._estimates.failed.connect(self._on_estimate_failed)
        self._hardware.finished.connect(self._on_nvml)
        self._host_job.finished.connect(self._on_host)
        self._save_timer = QTimer(self, singleShot=True, interval=400)
        self._save_timer.timeout.connect(self.save_preferences)
        self._poll = QTimer(self, interval=services.poll_interval_ms)
        self._poll.timeout.connect(self._poll_gpus)
        if self.machine.gpus:
            self._poll.start()
        if services.measure_bandwidth:
            self._host_job.submit(lambda: services.detect_host(True))
        hints = QGuiApplication.styleHints()
        hints.colorSchemeChanged.connect(lambda _scheme: self._apply_look())
        self._restore_geometry()
        self._apply_look()
        for note in (startup_note, self._history_note):
            if note:
                QTimer.singleShot(0, lambda n=note: self.show_error(n))
        self._hardware.submit(gpu_offload_supported)
        if services.first_run_guide and not prefs.walkthrough_seen:
            QTimer.singleShot(0, self.show_walkthrough)

    # -- construction -------------------------------------------------------------------------

    def _build_ui(self) -> None:
        left = QWidget()
        left_layout = QVBoxLayout(left)

        hw_box = QGroupBox("&Hardware")
        hw_layout = QVBoxLayout(hw_box)
        self.hardware_view = HardwareView()
        hw_layout.addWidget(self.hardware_view)
        form = QFormLayout()
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapAllRows)
        self.target_combo = self._device_combo(include_local=True)
        self.target_combo.setAccessibleName("Hardware to estimate for")
        self.count_spin = QSpinBox()
        self.count_spin.setRange(1, 8)
        self.count_spin.setSuffix(" GPU(s)")
        self.host_ram_spin = QDoubleSpinBox()
        self.host_ram_spin.setRange(0, 65536)
        self.host_ram_spin.setDecimals(0)
        self.host_ram_spin.setSuffix(" GiB")
        self.host_ram_spin.setSpecialValueText("this machine's")
        self.host_ram_spin.setToolTip(
            "System memory beside the GPUs (holds the token embedding and any layers left on the CPU)"
        )
        row = QHBoxLayout()
        row.addWidget(self.count_spin)
        row.addWidget(QLabel("host RAM"))
        row.addWidget(self.host_ram_spin)
        self.host_memory_combo = QComboBox()
        for key, (memory_label, peak) in HOST_MEMORY.items():
            # The kind of machine it belongs to goes in the item's tooltip, so the choice reads whole.
            self.host_memory_combo.addItem(f"{memory_label.split(' (')[0]}, {peak:.0f} GB/s", key)
            self.host_memory_combo.setItemData(
                self.host_memory_combo.count() - 1, f"{memory_label}: {peak:.0f} GB/s", Qt.ItemDataRole.ToolTipRole
            )
        self.host_memory_combo.setAccessibleName("Host memory type")
        self.host_memory_combo.setToolTip(
            "The system memory of the box: how fast layers and experts left in system memory are read"
        )
        form.addRow("Estimate &for", self.target_combo)
        form.addRow("", row)
        form.addRow("", self.host_memory_combo)
        self.compare_combos: list[QComboBox] = []
        self.compare_counts: list[QSpinBox] = []
        self.compare_box = QWidget()
        compare_form = QFormLayout(self.compare_box)
        compare_form.setContentsMargins(0, 0, 0, 0)
        # Each label above its list, so a device's name has the panel's whole width.
        compare_form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapAllRows)
        for i in range(MAX_COMPARED - 1):
            combo = self._device_combo(include_local=True, include_none=True)
            combo.setAccessibleName(f"Compare with, choice {i + 1}")
            count = QSpinBox()
            count.setRange(1, 8)
            count.setSuffix("x")
            line = QHBoxLayout()
            line.addWidget(combo, 1)
            line.addWidget(count)
            label = QLabel(f"Compare with &{i + 1}")
            label.setBuddy(combo)
            compare_form.addRow(label, line)
            self.compare_combos.append(combo)
            self.compare_counts.append(count)
        hw_layout.addLayout(form)
        hw_layout.addWidget(self.compare_box)
        left_layout.addWidget(hw_box)

        model_box = QGroupBox("&Model")
        model_layout = QVBoxLayout(model_box)
        self.model_search = QLineEdit()
        self.model_search.setPlaceholderText("Search the catalog (Ctrl+F)")
        self.model_search.setClearButtonEnabled(True)
        self.model_list = QListWidget()
        self.model_list.setMinimumHeight(120)
        self.model_list.setAccessibleName("Model catalog")
        self._fill_model_list()
        buttons = QHBoxLayout()
        self.open_button = QPushButton("&Open GGUF…")
        self.import_button = QPushButton("Import &config.json…")
        buttons.addWidget(self.open_button)
        buttons.addWidget(self.import_button)
        self.model_info = QLabel("")
        self.model_info.setWordWrap(True)
        self.model_info.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        model_layout.addWidget(self.model_search)
        model_layout.addWidget(self.model_list, 1)
        model_layout.addLayout(buttons)
        model_layout.addWidget(self.model_info)
        left_layout.addWidget(model_box, 1)

        ctl_box = QGroupBox("&Settings")
        ctl = QFormLayout(ctl_box)
        self.context_control = ContextControl()
        ctl.addRow("Conte&xt per user", self.context_control)
        self.users_spin = QSpinBox()
        self.users_spin.setRange(1, MAX_USERS)
        self.users_spin.setAccessibleName("Concurrent users")
        self.users_spin.setToolTip(term("Concurrent users"))
        self.context_control.setToolTip(term("Context"))
        ctl.addRow("Concurrent &users", self.users_spin)
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
        self.backend_combo = QComboBox()
        for key, build_name in (
            ("auto", "auto (by the hardware)"),
            ("cpu", "CPU only"),
            ("cuda", "CUDA"),
            ("rocm", "ROCm"),
            ("vulkan", "Vulkan"),
            ("metal", "Metal"),
        ):
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
        self.consumer_combo.setAccessibleName("Program running llama.cpp")
        self.consumer_combo.setToolTip(
            "llama-server reserves answers only for its users and keeps a small sliding-window cache; "
            "llama-cpp-python reserves a whole batch of answers and a full-size cache"
        )
        adv.addRow("R&un by", self.consumer_combo)
        self.mmap_check = QCheckBox("&Memory-map the weights (mmap)")
        self.mmap_check.setToolTip("llama.cpp's default; --no-mmap loads them into memory instead")
        adv.addRow("", self.mmap_check)
        self.vision_check = QCheckBox("Add &vision projector")
        self.vision_check.setToolTip(
            "Models that read images are served with a projector file beside them (llama-server --mmproj); "
            "its weights and working memory go on the first GPU, or in system memory without one"
        )
        self.mmproj_button = QPushButton("Projector &file...")
        self.mmproj_button.setToolTip("Choose a projector GGUF (mmproj-*.gguf) to load beside the model")
        vision_row = QHBoxLayout()
        vision_row.addWidget(self.vision_check)
        vision_row.addWidget(self.mmproj_button)
        ctl.addRow(vision_row)
        ctl.addRow(self.advanced)
        left_layout.addWidget(ctl_box)

        scroll = QScrollArea()
        scroll.setWidget(left)
        scroll.setWidgetResizable(True)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setMinimumWidth(360)
        self.left_scroll = scroll

        right = QWidget()
        right_layout = QVBoxLayout(right)
        self.banner = VerdictBanner()
        right_layout.addWidget(self.banner)
        self.tabs = QTabWidget()
        charts_page = QWidget()
        grid = QGridLayout(charts_page)
        grid.setContentsMargins(0, 0, 0, 0)
        self.split_chart = SplitChart()
        self.context_chart = ContextChart()
        self.ladder_chart = LadderChart()
        self.concurrency_chart = ConcurrencyChart()
        self.legend = QLabel(legend_html())
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        self.legend.setWordWrap(True)
        grid.addWidget(self.legend, 0, 0, 1, 2)
        grid.addWidget(self.split_chart, 1, 0, 2, 1)
        grid.addWidget(self.context_chart, 1, 1)
        grid.addWidget(self.concurrency_chart, 2, 1)
        grid.setColumnStretch(0, 2)
        grid.setColumnStretch(1, 3)
        self.charts = {
            "split": self.split_chart,
            "context": self.context_chart,
            "ladder": self.ladder_chart,
            "concurrency": self.concurrency_chart,
        }
        self.tabs.addTab(charts_page, "C&harts")
        self.tabs.addTab(self.ladder_chart, "&Quantization ladder")
        self.compare_table = readonly_table(report.COMPARE_HEADER, stretch_last=True)
        self.tabs.addTab(self.compare_table, "Com&pare hardware")
        details = QWidget()
        details_layout = QVBoxLayout(details)
        self.breakdown_table = readonly_table(
            ["Device", "Weights", "KV cache", "Compute", "Output", "Overhead", "Vision projector", "Total", "Capacity"],
            stretch_last=True,
        )
        self.command_text = QPlainTextEdit()
        self.command_text.setReadOnly(True)
        self.command_text.setMaximumHeight(170)
        self.assumptions_text = QPlainTextEdit()
        self.assumptions_text.setReadOnly(True)
        details_layout.addWidget(QLabel("Per device (GiB)"))
        details_layout.addWidget(self.breakdown_table)
        details_layout.addWidget(QLabel("The same settings for llama.cpp"))
        details_layout.addWidget(self.command_text)
        details_layout.addWidget(QLabel("Assumptions behind these figures"))
        details_layout.addWidget(self.assumptions_text)
        self.tabs.addTab(details, "&Details")
        self.run_panel = RunPanel(self._finish_run, self._save_run, self._gpu_memory_of)
        self.tabs.addTab(_scrolled(self.run_panel), "&Run")
        self.ab_panel = AbPanel(self._ab_hardware)
        self.tabs.addTab(_scrolled(self.ab_panel), "Quantization &A/B")
        self.ab_panel.error_shown.connect(self.show_error)
        self.ab_panel.comparison_finished.connect(lambda _c: self.request_estimate())  # measured ladder quality
        self.load_panel = LoadPanel()
        self.tabs.addTab(_scrolled(self.load_panel), "&Load")
        self.load_panel.error_shown.connect(self.show_error)
        self.scale_panel = ScalePanel(self._scale_model)
        self.tabs.addTab(_scrolled(self.scale_panel), "Scale &out")
        self.advisor_panel = AdvisorPanel(lambda: (self._prefs.model, self._prefs.controls), self.open_configuration)
        self.tabs.addTab(_scrolled(self.advisor_panel), "Which &machine?")
        self.advisor_panel.error_shown.connect(self.show_error)
        self.history_panel = HistoryPanel(self.history)
        self.tabs.addTab(_scrolled(self.history_panel), "H&istory")
        self.run_panel.run_failed.connect(self.show_error)
        self.history_panel.error_shown.connect(self.show_error)
        right_layout.addWidget(self.tabs, 1)

        splitter = QSplitter()
        splitter.addWidget(scroll)
        splitter.addWidget(right)
        splitter.setStretchFactor(1, 1)
        self.splitter = splitter
        self.setCentralWidget(splitter)
        self.resize(1440, 900)
        splitter.setSizes([400, 1040])

        self.target_combo.activated.connect(self._hardware_edited)
        self.count_spin.valueChanged.connect(self._hardware_edited)
        self.host_ram_spin.valueChanged.connect(self._hardware_edited)
        for combo, count in zip(self.compare_combos, self.compare_counts, strict=True):
            combo.activated.connect(self._compare_edited)
            count.valueChanged.connect(self._compare_edited)
        self.model_search.textChanged.connect(self._filter_models)
        self.model_list.currentItemChanged.connect(self._model_picked)
        self.open_button.clicked.connect(self.open_gguf_dialog)
        self.import_button.clicked.connect(self.import_config_dialog)
        self.context_control.context_changed.connect(lambda v: self._controls_edited(context_tokens=v))
        self.users_spin.valueChanged.connect(lambda v: self._controls_edited(users=v))
        self.quant_combo.activated.connect(self._quant_picked)
        self.ctk_combo.activated.connect(lambda _i: self._controls_edited(cache_type_k=self.ctk_combo.currentData()))
        self.ctv_combo.activated.connect(lambda _i: self._controls_edited(cache_type_v=self.ctv_combo.currentData()))
        self.fa_check.toggled.connect(lambda on: self._controls_edited(flash_attn=on))
        self.ngl_spin.valueChanged.connect(lambda v: self._controls_edited(gpu_layers=None if v < 0 else v))
        self.cpu_moe_spin.valueChanged.connect(lambda v: self._controls_edited(n_cpu_moe=None if v < 0 else v))
        self.backend_combo.activated.connect(lambda _i: self._controls_edited(backend=self.backend_combo.currentData()))
        self.consumer_combo.activated.connect(
            lambda _i: self._controls_edited(consumer=self.consumer_combo.currentData())
        )
        self.mmap_check.toggled.connect(lambda on: self._controls_edited(mmap=on))
        self.vision_check.toggled.connect(self._vision_toggled)
        self.mmproj_button.clicked.connect(self.choose_projector_file)
        self.host_memory_combo.activated.connect(self._hardware_edited)

    def _device_combo(self, include_local: bool, include_none: bool = False) -> QComboBox:
        combo = DeviceCombo()
        if include_none:
            combo.addItem("(nothing)", "")
        if include_local:
            combo.addItem("This machine", "local")
            combo.addItem("This machine's CPU only", "cpu")
        for d in self._devices.values():
            combo.addItem(device_label(d.name, d.memory_gib, d.price_usd), f"catalog:{d.id}")
            price = f", ${d.price_usd:,.0f}" if d.price_usd else ""
            combo.setItemData(combo.count() - 1, f"{d.name}: {d.memory_gib:g} GiB{price}", Qt.ItemDataRole.ToolTipRole)
        return combo

    def _fill_model_list(self) -> None:
        item = QListWidgetItem(f"Demo: {DEMO_MODEL_NAME}")
        item.setData(Qt.ItemDataRole.UserRole, ("demo", ""))
        item.setToolTip(f"The built-in demo model. {DEMO_LICENSE}")
        self.model_list.addItem(item)
        for arch in self._models:
            size = f"{arch.params_billions:g}B" if arch.params_billions else ""
            item = QListWidgetItem(f"{arch.name}  {size}")
            item.setData(Qt.ItemDataRole.UserRole, ("catalog", arch.id))
            item.setToolTip(f"{arch.name}: {arch.arch}, {arch.n_layer} layers, trained context {arch.n_ctx_train:,}")
            self.model_list.addItem(item)

    def _build_menus(self) -> None:
        def action(menu, text: str, slot, shortcut=None, checkable: bool = False) -> QAction:
            act = QAction(text, self)
            if shortcut is not None:
                act.setShortcut(QKeySequence(shortcut))
            act.setCheckable(checkable)
            act.triggered.connect(slot)
            menu.addAction(act)
            return act

        file_menu = self.menuBar().addMenu("&File")
        action(file_menu, "&Open GGUF…", self.open_gguf_dialog, QKeySequence.StandardKey.Open)
        action(file_menu, "&Import config.json…", self.import_config_dialog, "Ctrl+I")
        file_menu.addSeparator()
        action(file_menu, "&Export report (HTML)…", lambda: self._export_dialog("html"), "Ctrl+E")
        action(file_menu, "Export charts as &PNG…", lambda: self._export_dialog("png"), "Ctrl+Shift+E")
        action(file_menu, "Export estimate as &JSON…", lambda: self._export_dialog("json"))
        action(file_menu, "Export estimate as &CSV…", lambda: self._export_dialog("csv"))
        action(file_menu, "Copy llama.cpp &command", self.copy_command, "Ctrl+Shift+C")
        file_menu.addSeparator()
        action(file_menu, "&Quit", self.close, QKeySequence.StandardKey.Quit)
        view_menu = self.menuBar().addMenu("&View")
        self.presentation_action = action(view_menu, "&Presentation mode", self.set_presentation, "F5", checkable=True)
        action(view_menu, "&Full screen", self._toggle_full_screen, QKeySequence.StandardKey.FullScreen)
        action(view_menu, "Search &models", self._focus_search, QKeySequence.StandardKey.Find)
        help_menu = self.menuBar().addMenu("&Help")
        action(help_menu, "&Getting started", self.show_walkthrough)
        action(help_menu, "&How the estimate works", self._show_how, QKeySequence.StandardKey.HelpContents)
        action(help_menu, "&Glossary", self._show_glossary)
        action(help_menu, "Model a&rchitectures", self._show_architectures)
        action(help_menu, "Copy &diagnostics", self.copy_diagnostics)
        help_menu.addSeparator()
        action(help_menu, "&About FitScope", self._show_about)

    # -- preferences <-> widgets --------------------------------------------------------------

    def _apply_prefs_to_widgets(self) -> None:
        self._updating = True
        try:
            p = self._prefs
            self._select_combo(self.target_combo, hardware_key(p.hardware))
            self.count_spin.setValue(p.hardware.count)
            self.host_ram_spin.setValue(p.hardware.host_ram_gib or 0)
            for i, combo in enumerate(self.compare_combos):
                choice = p.compare[i] if i < len(p.compare) else None
                self._select_combo(combo, hardware_key(choice) if choice else "")
                self.compare_counts[i].setValue(choice.count if choice else 1)
            c = p.controls
            self.context_control.set_tokens(c.context_tokens)
            self.users_spin.setValue(c.users)
            self._select_combo(self.ctk_combo, c.cache_type_k)
            self._select_combo(self.ctv_combo, c.cache_type_v)
            self.fa_check.setChecked(c.flash_attn)
            self.ngl_spin.setValue(-1 if c.gpu_layers is None else c.gpu_layers)
            self.cpu_moe_spin.setValue(-1 if c.n_cpu_moe is None else c.n_cpu_moe)
            self._select_combo(self.backend_combo, c.backend)
            self._select_combo(self.consumer_combo, c.consumer)
            self.mmap_check.setChecked(c.mmap)
            self.vision_check.setChecked(c.projector is not None)
            self._select_combo(self.host_memory_combo, p.hardware.host_memory or DEFAULT_HOST_MEMORY)
            self._select_combo(self.quant_combo, p.model.quant)
            self._select_model_item(p.model)
            self._update_hardware_widgets()
            self._update_model_widgets()
            if self.presentation_action.isChecked() != p.presentation or not hasattr(self, "_looked"):
                self.presentation_action.setChecked(p.presentation)
                self._set_presentation_widgets(p.presentation)
                self._looked = True
        finally:
            self._updating = False

    @staticmethod
    def _select_combo(combo: QComboBox, data: Any) -> None:
        index = next((i for i in range(combo.count()) if combo.itemData(i) == data), 0)
        combo.setCurrentIndex(index)
        line = combo.lineEdit()
        if line is not None:
            line.setCursorPosition(0)  # show the start of a long name

    def _select_model_item(self, choice: ModelChoice) -> None:
        was = self.model_list.blockSignals(True)
        self.model_list.setCurrentRow(-1)
        for i in range(self.model_list.count()):
            if self.model_list.item(i).data(Qt.ItemDataRole.UserRole) == (choice.kind, choice.ref):
                self.model_list.setCurrentRow(i)
        self.model_list.blockSignals(was)

    def _update_hardware_widgets(self) -> None:
        hw = self._prefs.hardware
        device = self._devices.get(hw.device_id or "")
        multi = hw.kind == "catalog" and device is not None and device.memory_kind != "unified"
        self.count_spin.setEnabled(multi)
        self.host_ram_spin.setEnabled(multi)
        self.host_memory_combo.setEnabled(multi)
        has_gpu = (hw.kind == "local" and bool(self.machine.gpus)) or (hw.kind == "catalog")
        self.ngl_spin.setEnabled(has_gpu)
        self.ngl_spin.setToolTip(term("Layers") if has_gpu else "No GPU in this choice: every layer runs on the CPU.")

    def _catalog_projector(self) -> ProjectorSpec | None:
        """The current catalog model's own projector, if it has one."""
        choice = self._prefs.model
        if choice.kind != "catalog":
            return None
        entry = find_projector(choice.ref)
        return entry.spec() if entry is not None else None

    def _vision_toggled(self, on: bool) -> None:
        if self._updating:
            return
        spec = (self._projector_file or self._catalog_projector()) if on else None
        if on and spec is None:
            self.choose_projector_file()
            return
        self._controls_edited(projector=spec)

    def choose_projector_file(self, path: str | Path | None = None) -> None:
        """Load a projector GGUF beside the model (a file dialog without ``path``)."""
        if path is None:
            chosen, _ = QFileDialog.getOpenFileName(self, "Choose a vision projector", "", "GGUF files (*.gguf)")
            if not chosen:
                self._sync_vision_widgets()
                return
            path = chosen
        try:
            spec = read_projector(path)
        except FitScopeError as exc:
            QMessageBox.warning(self, "Vision projector", str(exc))
            self._sync_vision_widgets()
            return
        self._projector_file = spec
        self._controls_edited(projector=spec)
        self._sync_vision_widgets()

    def _sync_vision_widgets(self) -> None:
        projector = self._prefs.controls.projector
        available = projector is not None or self._projector_file is not None or self._catalog_projector() is not None
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
            else "Add the model's vision projector (llama-server --mmproj)"
        )

    def _update_model_widgets(self) -> None:
        self._sync_vision_widgets()
        kind = self._prefs.model.kind
        self.quant_combo.setEnabled(kind in ("catalog", "hf_config"))
        self.quant_combo.setToolTip(
            term("Quantization")
            if self.quant_combo.isEnabled()
            else "A GGUF file's quantization is fixed; the ladder shows the others."
        )

    def _set_prefs(self, **update: Any) -> None:
        self._prefs = self._prefs.model_copy(update=update)
        self._save_timer.start()
        self.request_estimate()

    def _hardware_edited(self, *_args: Any) -> None:
        if self._updating:
            return
        data = self.target_combo.currentData()
        if not data:
            return
        line = self.target_combo.lineEdit()
        if line is not None:
            line.setCursorPosition(0)
        kind, _, device_id = data.partition(":")
        ram = self.host_ram_spin.value() or None
        choice = HardwareChoice(
            kind=kind,
            device_id=device_id or None,
            count=self.count_spin.value(),
            host_ram_gib=ram,
            host_memory=self.host_memory_combo.currentData(),
        )
        self._prefs = self._prefs.model_copy(update={"hardware": choice})
        self._update_hardware_widgets()
        self._set_prefs()

    def _compare_edited(self, *_args: Any) -> None:
        if self._updating:
            return
        choices = []
        for combo, count in zip(self.compare_combos, self.compare_counts, strict=True):
            data = combo.currentData()
            if data:
                kind, _, device_id = data.partition(":")
                choices.append(HardwareChoice(kind=kind, device_id=device_id or None, count=count.value()))
        self._set_prefs(compare=tuple(choices))

    def _controls_edited(self, **update: Any) -> None:
        if self._updating:
            return
        self._set_prefs(controls=self._prefs.controls.model_copy(update=update))

    def _quant_picked(self, _index: int) -> None:
        if self._updating or self._prefs.model.kind not in ("catalog", "hf_config"):
            return
        self._set_prefs(model=self._prefs.model.model_copy(update={"quant": self.quant_combo.currentData()}))

    def _model_picked(self, current: QListWidgetItem | None, _previous: QListWidgetItem | None = None) -> None:
        if self._updating or current is None:
            return
        kind, ref = current.data(Qt.ItemDataRole.UserRole)
        quant = self.quant_combo.currentData() or "Q4_K_M"
        if kind == "catalog":
            # A new model starts on the file people download (Q4_K_M, or the format it was released
            # in, such as gpt-oss's MXFP4), not on the quantization chosen for the previous model.
            with contextlib.suppress(FitScopeError):
                quant = find_model(ref).default_quant or "Q4_K_M"
        self.choose_model(ModelChoice(kind=kind, ref=ref, quant=quant))

    def _filter_models(self, text: str) -> None:
        needle = text.strip().lower()
        for i in range(self.model_list.count()):
            item = self.model_list.item(i)
            item.setHidden(bool(needle) and needle not in (item.text() + item.toolTip()).lower())

    # -- public actions (menus, tests, screenshots) -------------------------------------------

    def choose_model(self, choice: ModelChoice) -> None:
        """Switch model; if it cannot be read, a message says why and the previous one stays."""
        controls = self._prefs.controls
        if controls.projector is not None and controls.projector != self._projector_file:
            # A catalog model's own projector follows the model; a chosen file stays until unticked.
            entry = find_projector(choice.ref) if choice.kind == "catalog" else None
            controls = controls.model_copy(update={"projector": entry.spec() if entry is not None else None})
        self._set_prefs(model=choice, controls=controls)
        self._select_model_item(choice)
        self._update_model_widgets()

    def set_scenario(
        self,
        model: ModelChoice | None = None,
        hardware: HardwareChoice | None = None,
        controls: Controls | None = None,
        compare: tuple[HardwareChoice, ...] | None = None,
    ) -> None:
        """Change several things at once, as one estimate (scripts, screenshots, benchmarks)."""
        update = {"model": model, "hardware": hardware, "controls": controls, "compare": compare}
        self._prefs = self._prefs.model_copy(update={k: v for k, v in update.items() if v is not None})
        self._apply_prefs_to_widgets()
        self._set_prefs()

    def open_configuration(self, model: ModelChoice, hardware: HardwareChoice, controls: Controls) -> None:
        """Show a configuration (the advisor's) in the main view: model and preset, hardware, settings."""
        self.set_scenario(model=model, hardware=hardware, controls=controls)
        self.tabs.setCurrentIndex(0)

    def choose_hardware(self, choice: HardwareChoice) -> None:
        self._prefs = self._prefs.model_copy(update={"hardware": choice})
        self._apply_prefs_to_widgets()
        self._set_prefs()

    def set_controls(self, controls: Controls) -> None:
        self._prefs = self._prefs.model_copy(update={"controls": controls})
        self._apply_prefs_to_widgets()
        self._set_prefs()

    def open_gguf(self, path: str) -> None:
        self.choose_model(ModelChoice(kind="gguf", ref=str(path)))
        self._remember_file(path)

    def import_config(self, path: str) -> None:
        self.choose_model(ModelChoice(kind="hf_config", ref=str(path), quant=self.quant_combo.currentData()))
        self._remember_file(path)

    def _remember_file(self, path: str) -> None:
        recent = tuple(dict.fromkeys((str(path), *self._prefs.recent_files)))[:10]
        self._prefs = self._prefs.model_copy(update={"recent_files": recent})

    def open_gguf_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a GGUF model", "", "GGUF models (*.gguf);;All files (*)")
        if path:
            self.open_gguf(path)

    def import_config_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Import a Hugging Face config.json", "", "config.json (*.json);;All files (*)"
        )
        if path:
            self.import_config(path)

    def _focus_search(self) -> None:
        self.model_search.setFocus()
        self.model_search.selectAll()

    def _toggle_full_screen(self) -> None:
        self.showNormal() if self.isFullScreen() else self.showFullScreen()

    def set_presentation(self, on: bool) -> None:
        """Large type and only the essential controls, for demos on a projector."""
        self.presentation_action.setChecked(on)
        if self._prefs.presentation != on:
            self._prefs = self._prefs.model_copy(update={"presentation": on})
            self._save_timer.start()
        self._set_presentation_widgets(on)

    def _set_presentation_widgets(self, on: bool) -> None:
        self.advanced.setVisible(not on)
        self.hardware_view.setVisible(not on)
        self.tabs.setTabVisible(3, not on)
        font = QGuiApplication.font()
        if on:
            font.setPointSizeF(font.pointSizeF() * PRESENTATION_SCALE)
        self.splitter.setFont(font)
        # The controls keep room for a device's whole name at either type size.
        metrics = QFontMetrics(font)
        widest = max(metrics.horizontalAdvance(self.target_combo.itemText(i)) for i in range(self.target_combo.count()))
        # combo chrome, the compare row's count box, group and scroll margins
        scroll = self.left_scroll
        content = scroll.widget()
        assert content is not None
        content.adjustSize()
        chrome = scroll.verticalScrollBar().sizeHint().width() + 2 * scroll.frameWidth()
        need = max(content.minimumSizeHint().width(), widest + metrics.horizontalAdvance("x" * 10) + 60)
        scroll.setMinimumWidth(max(360, need + chrome))
        self._apply_look()

    @property
    def presentation(self) -> bool:
        return self._prefs.presentation

    def _apply_look(self) -> None:
        scale = PRESENTATION_SCALE if self._prefs.presentation else 1.0
        palette = self.palette()
        charts = (*self.charts.values(), *self.run_panel.charts, *self.load_panel.charts)
        for chart in (*charts, self.ab_panel.chart, self.advisor_panel.chart):
            chart.apply_palette(palette, scale)
        self.banner.set_scale(scale)

    def _show_how(self) -> None:
        TextDialog("How the estimate works", HOW_IT_WORKS, self).open()

    def _show_glossary(self) -> None:
        TextDialog("Glossary", glossary_html(), self).open()

    def _show_architectures(self) -> None:
        TextDialog("Model architectures", architectures_html(), self).open()

    def _show_about(self) -> None:
        AboutDialog(self.machine, self).open()

    def show_walkthrough(self) -> Walkthrough:
        """The three-step guide; closing it marks it seen (Help reopens it)."""
        guide = Walkthrough(self.machine, self)
        guide.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        guide.finished.connect(lambda _result: self._walkthrough_seen())
        guide.open()
        self.walkthrough = guide
        return guide

    def _walkthrough_seen(self) -> None:
        if not self._prefs.walkthrough_seen:
            self._prefs = self._prefs.model_copy(update={"walkthrough_seen": True})
            self._save_timer.start()

    def diagnostics_text(self) -> str:
        p = self._prefs
        context = {
            "Model": f"{p.model.kind} {p.model.ref} {p.model.quant}".strip(),
            "Hardware": p.hardware.label(self.machine),
            "Settings": p.controls.model_dump_json(),
            "Verdict": self.view.verdict.text if self.view is not None else "none yet",
        }
        return diagnostics(self.machine, context, self.last_error, str(log_path()))

    def copy_diagnostics(self) -> str:
        text = self.diagnostics_text()
        QGuiApplication.clipboard().setText(text)
        self.statusBar().showMessage("Diagnostics copied to the clipboard: paste them into a bug report", 6000)
        return text

    def show_error(self, message: str) -> None:
        """A message the user must see; the window stays usable (the box is not modal)."""
        _log.warning("%s", message)
        self.last_error = message
        box = QMessageBox(QMessageBox.Icon.Warning, "FitScope", message, QMessageBox.StandardButton.Ok, self)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.setWindowModality(Qt.WindowModality.NonModal)
        box.show()
        self.error_shown.emit(message)

    # -- estimating ---------------------------------------------------------------------------

    def current_request(self) -> Request:
        p = self._prefs
        return Request(
            model=p.model,
            hardware=p.hardware,
            controls=p.controls,
            machine=self.machine,
            compare=p.compare,
            measured_efficiency=self._efficiency,
            measured_quality=measured_quality(),
        )

    def request_estimate(self) -> int:
        request = self.current_request()
        return self._estimates.submit(partial(evaluate_in_worker, request, self._services.demo_path), request.model)

    @property
    def busy(self) -> bool:
        return self._estimates.busy

    def _on_view(self, job_id: int, view: View) -> None:
        if job_id < self._applied_job:
            return
        self._applied_job = job_id
        self._last_good_model = view.request.model
        self.show_view(view)

    def _on_estimate_failed(self, job_id: int, message: str) -> None:
        failed = self._estimates.tag_of(job_id)
        fallback = self._last_good_model or ModelChoice()
        if failed is not None and failed != fallback and failed == self._prefs.model:
            self._prefs = self._prefs.model_copy(update={"model": fallback})
            self._select_model_item(fallback)
            self._update_model_widgets()
            self.show_error(message)
            self.request_estimate()
            return
        self.banner.set_message("red", "No estimate.", message)
        self.show_error(message)

    def show_view(self, view: View) -> None:
        self.view = view
        self.banner.set_verdict(view.verdict)
        self._show_model_info(view)
        est = view.estimate
        if est is not None:
            # Host memory gets its own bar when it holds layers (or is the only device); otherwise
            # it keeps only the token embedding and buffers, listed under Details.
            has_gpu_layers = any(d.kind == "gpu" and d.layers for d in est.devices)
            bars = [
                DeviceBar(
                    name=d.name,
                    weights_bytes=d.weights_bytes + d.repack_bytes,
                    kv_cache_bytes=d.kv_cache_bytes + d.recurrent_state_bytes,
                    compute_bytes=d.compute_bytes + d.output_bytes,
                    overhead_bytes=d.overhead_bytes,
                    capacity_bytes=d.capacity_bytes,
                    projector_bytes=d.projector_bytes,
                )
                for d in est.devices
                if d.kind == "gpu" and d.total_bytes or d.kind == "cpu" and (d.layers or not has_gpu_layers)
            ]
            self.split_chart.set_data(bars)
        c = view.request.controls
        if view.context_curve is not None:
            self.context_chart.set_data(view.context_curve, c.context_tokens)
        if view.ladder:
            self.ladder_chart.set_data(view.ladder)
        if view.concurrency is not None:
            self.concurrency_chart.set_data(view.concurrency, c.context_tokens, c.users, MAX_USERS)
        self._show_tables(view)
        self._update_run_context(view)
        self.ab_panel.set_source(str(view.model.path) if view.model is not None and view.model.path else None)
        self._update_load_source(view)
        self.view_changed.emit(view)

    def _show_model_info(self, view: View) -> None:
        m = view.model
        if m is None:
            return
        arch = m.arch
        kv = arch.n_head_kv if isinstance(arch.n_head_kv, int) else f"{min(arch.n_head_kv)}-{max(arch.n_head_kv)}"
        params = f"{arch.params_billions:g} billion parameters" if arch.params_billions else "parameters unknown"
        label = DEMO_MODEL_NAME if view.request.model.kind == "demo" else m.label
        lines = [
            f"<b>{_escape(label)}</b> ({arch.arch}, {m.quant})",
            f"{params}; {arch.n_layer} layers; {kv} KV heads; trained context {arch.n_ctx_train:,} tokens",
        ]
        rules = coverage(arch.arch)
        if rules.status != "exact":
            lines.append(f"Memory rules for {arch.arch}: {APPROXIMATE_NOTE} ({rules.detail}).")
        if m.path is not None:
            lines.append(f"File: {m.path.name} (in {m.path.parent})")
        if view.request.model.kind == "demo":
            lines.append(f"Built-in demo model. License: {DEMO_LICENSE}")
        if view.ladder_note:
            lines.append(view.ladder_note)
        self.model_info.setText("<br>".join(_escape(line) if i else line for i, line in enumerate(lines)))
        self.ngl_spin.setToolTip(
            f"llama.cpp's -ngl: {arch.n_layer + 1} puts all {arch.n_layer} layers and the output layer on the GPU"
        )
        self.cpu_moe_spin.setMaximum(arch.n_layer)
        self.cpu_moe_spin.setEnabled(arch.moe is not None and self.ngl_spin.isEnabled())
        self.context_control.set_trained_context(arch.n_ctx_train)
        if m.quant in {p.name for p in PRESETS} and not self.quant_combo.isEnabled():
            self._select_combo(self.quant_combo, m.quant)

    def _show_tables(self, view: View) -> None:
        rows = []
        if view.estimate is not None:
            for d in view.estimate.devices:
                rows.append(
                    [d.name]
                    + [
                        f"{v / GIB:.2f}"
                        for v in (
                            d.weights_bytes + d.repack_bytes,
                            d.kv_cache_bytes + d.recurrent_state_bytes,
                            d.compute_bytes,
                            d.output_bytes,
                            d.overhead_bytes,
                            d.projector_bytes,
                            d.total_bytes,
                            d.capacity_bytes,
                        )
                    ]
                )
        fill_table(self.breakdown_table, rows)
        compare = [report.compare_cells(r) for r in report.comparison_rows(view)]
        fill_table(self.compare_table, compare)
        try:
            self.command_text.setPlainText(report.copy_command_text(view))
        except FitScopeError as exc:
            self.command_text.setPlainText(str(exc))
        self.assumptions_text.setPlainText("\n".join(f"• {a}" for a in view.assumptions) or view.error)

    # -- hardware polling ---------------------------------------------------------------------

    def _poll_gpus(self) -> None:
        if not self._hardware.busy:
            self._hardware.submit(self._services.nvml_status)

    def _on_nvml(self, _job_id: int, status: NvmlStatus | bool) -> None:
        if isinstance(status, bool):  # the answer to gpu_offload_supported()
            self.run_panel.set_gpu_offload_supported(status, bool(self.machine.gpus))
            return
        gpus = status.gpus if status.available else ()
        self.hardware_view.set_gpus(gpus, status.message)
        old = self.machine.gpus
        moved = len(old) != len(gpus) or any(
            abs(a.memory_free_bytes - b.memory_free_bytes) >= GPU_CHANGE_BYTES for a, b in zip(old, gpus, strict=False)
        )
        if moved:
            self.machine = Machine(gpus=gpus, host=self.machine.host, gpu_message=status.message)
            self.machine_changed.emit(self.machine)
            if self._prefs.hardware.kind == "local" or any(c.kind == "local" for c in self._prefs.compare):
                self.request_estimate()

    def _on_host(self, _job_id: int, host: HostSnapshot) -> None:
        self._measuring = False
        self.machine = Machine(gpus=self.machine.gpus, host=host, gpu_message=self.machine.gpu_message)
        self.hardware_view.set_host(host, False)
        self.machine_changed.emit(self.machine)
        self.request_estimate()

    # -- export -------------------------------------------------------------------------------

    def chart_png(self, name: str) -> bytes:
        pixmap = self.charts[name].grab()
        data = QByteArray()
        buffer = QBuffer(data)
        buffer.open(QIODevice.OpenModeFlag.WriteOnly)
        pixmap.save(buffer, "PNG")
        return bytes(data.data())

    def export(self, kind: str, path: Path) -> list[Path]:
        """Write the current view as ``kind`` (html, json, csv, png) to ``path`` (a folder for png).
        Returns the files written. Raises FitScopeError when there is nothing to export or the disk
        refuses."""
        view = self.view
        if view is None:
            raise FitScopeError("There is no estimate to export yet.")
        titles = {
            "split": "Where the memory goes",
            "context": "Memory against context",
            "ladder": "Quantization ladder",
            "concurrency": "Users at once",
        }
        try:
            if kind == "png":
                path.mkdir(parents=True, exist_ok=True)
                written = []
                for name in self.charts:
                    target = path / f"fitscope-{name}.png"
                    target.write_bytes(self.chart_png(name))
                    written.append(target)
                return written
            if kind == "json":
                path.write_text(json.dumps(report.report_json(view), indent=2), encoding="utf-8")
            elif kind == "csv":
                path.write_text(report.report_csv(view), encoding="utf-8")
            elif kind == "html":
                images = {titles[n]: self.chart_png(n) for n in self.charts}
                path.write_text(report.report_html(view, images), encoding="utf-8")
            else:
                raise FitScopeError(f"Unknown export format '{kind}'.")
        except OSError as exc:
            raise FitScopeError(f"Could not write {path}: {exc.strerror or exc}.") from None
        return [path]

    def _export_dialog(self, kind: str) -> None:
        if kind == "png":
            folder = QFileDialog.getExistingDirectory(self, "Folder for the chart images")
            target = Path(folder) if folder else None
        else:
            filters = {"html": "HTML report (*.html)", "json": "JSON (*.json)", "csv": "CSV (*.csv)"}
            name, _ = QFileDialog.getSaveFileName(self, "Export", f"fitscope-estimate.{kind}", filters[kind])
            target = Path(name) if name else None
        if target is None:
            return
        try:
            written = self.export(kind, target)
        except FitScopeError as exc:
            self.show_error(str(exc))
            return
        self.statusBar().showMessage(f"Saved {', '.join(str(p) for p in written)}", 8000)

    def copy_command(self) -> str:
        if self.view is None:
            return ""
        try:
            text = report.copy_command_text(self.view)
        except FitScopeError as exc:
            self.show_error(str(exc))
            return ""
        QGuiApplication.clipboard().setText(text)
        self.statusBar().showMessage("llama-server and llama-cpp-python settings copied to the clipboard", 6000)
        return text

    # -- drag and drop ------------------------------------------------------------------------

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 - Qt's name
        if event.mimeData().hasUrls() and any(u.isLocalFile() for u in event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802 - Qt's name
        paths = [u.toLocalFile() for u in event.mimeData().urls() if u.isLocalFile()]
        if not paths:
            return
        event.acceptProposedAction()
        self.open_path(paths[0])

    def open_path(self, path: str) -> None:
        """A dropped or named file: a .gguf model or a config.json."""
        lower = path.lower()
        if lower.endswith(".gguf"):
            self.open_gguf(path)
        elif lower.endswith(".json"):
            self.import_config(path)
        else:
            self.show_error(f"{Path(path).name} is neither a .gguf model nor a config.json; FitScope opens those.")

    # -- persistence --------------------------------------------------------------------------

    @property
    def preferences(self) -> Preferences:
        return self._prefs

    def save_preferences(self) -> None:
        try:
            save_preferences(self._prefs, self._services.prefs_path)
        except OSError as exc:
            _log.warning("could not save settings: %s", exc)

    def _qsettings(self) -> QSettings:
        return QSettings(str(self._services.prefs_path.parent / "window.ini"), QSettings.Format.IniFormat)

    def _restore_geometry(self) -> None:
        s = self._qsettings()
        geometry = s.value("geometry")
        if geometry is not None:
            self.restoreGeometry(geometry)
        splitter = s.value("splitter")
        if splitter is not None:
            self.splitter.restoreState(splitter)

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt's name
        # Light/dark switches reach us as a palette change: recolour the charts to match.
        palette_events = (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange)
        if event.type() in palette_events and hasattr(self, "charts"):
            self._apply_look()
        super().changeEvent(event)

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt's name
        s = self._qsettings()
        s.setValue("geometry", self.saveGeometry())
        s.setValue("splitter", self.splitter.saveState())
        s.sync()
        self._save_timer.stop()
        self.save_preferences()
        self._poll.stop()
        self.run_panel.shutdown()
        self.ab_panel.shutdown()
        self.advisor_panel.shutdown()
        self.scale_panel.shutdown()
        for runner in (self._estimates, self._hardware, self._host_job):
            runner.close()
        if self.history is not None:
            self.history.close()
        super().closeEvent(event)

    # -- live runs ----------------------------------------------------------------------------

    def _machine_key(self) -> str:
        return machine_key(self.machine.host, self.machine.gpus)

    def _load_efficiencies(self) -> None:
        if self.history is not None:
            found = self.history.efficiencies(self._machine_key(), llama_math_threads())
            self._efficiency = tuple(sorted(found.items()))

    def _update_run_context(self, view: View) -> None:
        choice = view.request.model
        if choice.kind not in ("demo", "gguf") or view.model is None:
            label = view.model.label if view.model is not None else "This model"
            self.run_panel.set_context(
                None,
                f"{label} is an estimate from the catalog: live runs need a GGUF file. Open one (Ctrl+O) or "
                "choose the demo model.",
            )
            return
        c = view.request.controls
        self.run_panel.set_context(
            RunContext(
                gguf_path=demo_or_path(choice.ref if choice.kind == "gguf" else None, self._services.demo_path),
                model_label=DEMO_MODEL_NAME if choice.kind == "demo" else view.model.label,
                is_demo=choice.kind == "demo",
                n_ctx=c.context_tokens,
                flash_attn=c.flash_attn,
                cache_type_k=c.cache_type_k,
                cache_type_v=c.cache_type_v,
            )
        )

    def _finish_run(self, result: RunResult, sweep: Sequence[SweepRow]) -> RunReport:
        """On the run's thread: the report against the estimate for the run's own settings."""
        return finish_run(result, self.machine, sweep)

    def _save_run(self, report: RunReport) -> RunReport:
        """On the GUI thread (the history's connection lives here): keep the run, then let the next
        estimates use the efficiency it measured."""
        saved = save_run(report, self.machine, self.history)
        if saved.save_message:
            self.show_error(saved.save_message)
            return saved
        self.history_panel.refresh()
        self._load_efficiencies()
        self.request_estimate()
        return saved

    def _scale_model(self) -> tuple[fit.ModelSource, Settings, int, int, int]:
        """The current model with its tensors (read again: views carry none), for the Scale out tab."""
        choice, c = self._prefs.model, self._prefs.controls
        path = self.view.model.path if self.view is not None and self.view.model is not None else None
        if choice.kind in ("gguf", "demo") and path is None:
            raise FitScopeError("The model is still loading; try again in a moment.")
        model = load_model(choice, path)
        settings = c.settings(fit.repack_profile(self.machine.host))
        host = self.machine.host.ram_total_bytes if self.machine.host else 64 * GIB
        return model, settings, c.context_tokens, c.users, host

    def _update_load_source(self, view: View) -> None:
        path = view.model.path if view.model is not None else None
        if path is None or view.request.model.kind == "hf_config":
            self.load_panel.set_source(
                None,
                "The load simulation measures the model on this machine: open a GGUF file or choose the demo model.",
            )
            return
        key = machine_key(self.machine.host)
        host = self.machine.host
        targets = resolve_targets(HardwareChoice(kind="cpu"), self.machine)
        repack = fit.repack_profile(host)
        self.load_panel.set_source(
            (
                str(path),
                lambda: cached_profile(path, key),
                lambda: measure_profile(path, key),
                lambda tokens: memory_slots(path, tokens, targets, repack),
            )
        )

    def _ab_hardware(self) -> tuple[list, str, str]:
        """What the A/B advice must fit: the hardware chosen on the left."""
        hardware = self._prefs.hardware
        return (
            resolve_targets(hardware, self.machine),
            hardware.label(self.machine),
            fit.repack_profile(self.machine.host),
        )

    def _gpu_memory_of(self, pid: int) -> tuple[int, int] | None:
        for gpu in self.machine.gpus:
            for process in gpu.processes:
                if process.pid == pid:
                    return process.used_memory_bytes or 0, gpu.memory_used_bytes
        return None


def _scrolled(widget: QWidget) -> QScrollArea:
    """A page that scrolls when the window is smaller than its controls need."""
    area = QScrollArea()
    area.setWidget(widget)
    area.setWidgetResizable(True)
    area.setFrameShape(QScrollArea.Shape.NoFrame)
    return area


def gpu_offload_supported() -> bool:
    """Whether the installed llama-cpp-python can offload layers to a GPU (loads the library)."""
    try:
        import llama_cpp
    except ImportError:
        return False
    from app.adapters.rpc_servers import offloads_to_local_gpu

    return offloads_to_local_gpu(llama_cpp)


def hardware_key(choice: HardwareChoice) -> str:
    """The hardware combo boxes' item data: "local", "cpu" or "catalog:<device id>"."""
    return f"catalog:{choice.device_id}" if choice.kind == "catalog" else choice.kind


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


