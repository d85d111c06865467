"""The main window: hardware, model and controls on the left; the verdict and the charts on the right.

Every change goes the same way: the controls report the new choice, the window writes it into
``Preferences``, a request is sent to the estimate worker, and the returned ``View`` is shown
everywhere at once (``view_changed`` fires after it is). Nothing slow runs on the GUI thread.

The window owns its parts and the state they share (the preferences, this machine, the view on
screen); each part lives in its own module: the left-hand controls (``controls.py`` and
``hardware_box.py``), the verdict and the estimate's tabs (``results.py``), the Run / A/B / Load /
Scale out / Which machine? / History tabs (``tool_tabs.py``), the menus (``menus.py``) and the
exports (``exports.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QCloseEvent, QDragEnterEvent, QDropEvent, QGuiApplication
from PySide6.QtWidgets import QFileDialog, QMainWindow, QMessageBox, QSplitter

from app.adapters.cpu_topology import llama_math_threads
from app.adapters.demo_model import demo_model_ready
from app.adapters.divergence_runner import measured_quality
from app.adapters.history import RunHistory
from app.adapters.logs import log_path
from app.core.common.errors import FitScopeError
from app.core.hardware.snapshots import GpuStatus, HostSnapshot, machine_key
from app.core.memory.records import SpeculativeSpec
from app.core.memory.speculative import supports_mtp
from app.core.model.catalog import find_model, load_devices, load_models
from app.core.model.projector import ProjectorSpec, read_projector
from app.core.model.source import model_from_gguf
from app.core.report.choices import Controls, HardwareChoice, Machine, ModelChoice, catalog_projector
from app.core.report.prefs import Preferences, save_preferences
from app.services.remote import load_remote_model
from app.services.view import Request, View, evaluate_in_worker
from app.ui import exports
from app.ui.controls import ControlsPanel
from app.ui.hardware_box import select_combo
from app.ui.help import Walkthrough, diagnostics
from app.ui.jobs import JobRunner, process_pool
from app.ui.menus import MenuActions, build_menus
from app.ui.remote_dialog import RemoteModelDialog, open_remote_dialog
from app.ui.results import ResultsArea
from app.ui.tool_tabs import ToolTabs, gpu_offload_supported

_log = logging.getLogger(__name__)

PRESENTATION_SCALE = 1.6
GPU_CHANGE_BYTES = 256 * 1024**2  # free GPU memory moving by less than this does not re-estimate


def _has_mtp(choice: ModelChoice) -> bool:
    """Whether a catalog model keeps an MTP head llama-server can draft with (False for the others,
    whose head is known only once read)."""
    if choice.kind != "catalog":
        return False
    try:
        return supports_mtp(find_model(choice.ref))
    except FitScopeError:
        return False


@dataclass
class Services:
    """What the window needs from the outside world, passed in (tests pass fakes for the GPU
    drivers only: a fake NVML, recorded sysfs trees and command outputs)."""

    gpu_status: Callable[[], GpuStatus]
    detect_host: Callable[[bool], HostSnapshot]
    demo_path: Callable[[], Path]
    prefs_path: Path
    poll_interval_ms: int = 1000
    measure_bandwidth: bool = True
    make_estimate_pool: Callable[[], Executor] | None = process_pool
    history_path: Path | None = None  # None: the platform's data folder
    first_run_guide: bool = True  # show the walk-through until it has been closed once
    remote_model: Callable[[ModelChoice], Any] | None = load_remote_model  # models on the Hub / in Ollama


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
        speculative = prefs.controls.speculative
        # A draft model read from a file stays offered across models.
        self._draft_file: SpeculativeSpec | None = (
            speculative if speculative is not None and speculative.kind == "draft" else None
        )
        self._estimates = JobRunner("estimate", self, make_pool=services.make_estimate_pool)
        self._hardware = JobRunner("gpus", self)
        self._host_job = JobRunner("host", self)
        self._last_good_model: ModelChoice | None = None
        self._applied_job = 0
        self.view: View | None = None
        self._measuring = services.measure_bandwidth
        status = services.gpu_status()
        self._gpu_message = status.message
        self.machine = Machine(
            gpus=status.gpus if status.available else (), host=services.detect_host(False), gpu_message=status.message
        )
        self._presentation_shown = False  # the presentation widgets have been set once
        self._history_note = ""
        self.last_error = ""
        self.walkthrough: Walkthrough | None = None
        try:
            self.history: RunHistory | None = RunHistory(services.history_path)
            self._history_note = " ".join(self.history.notices)
        except FitScopeError as exc:
            self.history = None
            self._history_note = str(exc)
        self._efficiency: tuple[tuple[str, float], ...] = ()
        self._load_efficiencies()

        # Start the first estimate before building the widgets: the worker process starts meanwhile.
        self.request_estimate()
        self._build_ui()
        self.presentation_action = build_menus(
            self,
            MenuActions(
                open_gguf=self.open_gguf_dialog,
                open_remote=self.open_remote_dialog,
                import_config=self.import_config_dialog,
                export=self.export_dialog,
                copy_command=self.copy_command,
                set_presentation=self.set_presentation,
                focus_search=self.controls.focus_search,
                show_walkthrough=self.show_walkthrough,
                copy_diagnostics=self.copy_diagnostics,
                machine=lambda: self.machine,
            ),
        )
        if prefs.model.kind == "demo" and not demo_model_ready():
            self.banner.set_message("", "Preparing the built-in demo model (first start only)…")
        self._apply_prefs_to_widgets()
        self.hardware_view.set_gpus(self.machine.gpus, self._gpu_message)
        self.hardware_view.set_host(self.machine.host, self._measuring)

        self._estimates.finished.connect(self._on_view)
        self._estimates.failed.connect(self._on_estimate_failed)
        self._hardware.finished.connect(self._on_gpus)
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
        self.controls = ControlsPanel(load_devices(), load_models())
        self.results = ResultsArea()
        self.tools = ToolTabs(
            self.results.tabs, self, self._services.demo_path, self.history, self.open_configuration, self
        )
        self.splitter = QSplitter()
        self.splitter.addWidget(self.controls)
        self.splitter.addWidget(self.results)
        self.splitter.setStretchFactor(1, 1)
        self.setCentralWidget(self.splitter)
        self.resize(1440, 900)
        self.splitter.setSizes([400, 1040])

        c = self.controls
        c.hardware_edited.connect(self._hardware_edited)
        c.compare_edited.connect(lambda choices: self._set_prefs(compare=choices))
        c.controls_edited.connect(self._controls_edited)
        c.quant_chosen.connect(self._quant_chosen)
        c.model_chosen.connect(self.choose_model)
        c.vision_toggled.connect(self._vision_toggled)
        c.speculative_chosen.connect(self._speculative_chosen)
        c.open_button.clicked.connect(self.open_gguf_dialog)
        c.import_button.clicked.connect(self.import_config_dialog)
        c.mmproj_button.clicked.connect(lambda: self.choose_projector_file())
        self.tools.error_shown.connect(self.show_error)
        self.tools.run_saved.connect(self._run_saved)
        self.tools.quality_measured.connect(self.request_estimate)  # the ladder's measured quality

        # The parts' widgets under the window's own names, where tests and scripts reach them.
        h = c.hardware_box
        self.left_scroll, self.hardware_view, self.target_combo = c, h.hardware_view, h.target_combo
        self.count_spin, self.host_ram_spin, self.host_memory_combo = h.count_spin, h.host_ram_spin, h.host_memory_combo
        self.compare_box, self.compare_combos, self.compare_counts = h.compare_box, h.compare_combos, h.compare_counts
        self.model_search, self.model_list, self.model_info = c.model_search, c.model_list, c.model_info
        self.open_button, self.import_button = c.open_button, c.import_button
        self.context_control, self.users_spin, self.quant_combo = c.context_control, c.users_spin, c.quant_combo
        self.advanced, self.ctk_combo, self.ctv_combo, self.fa_check = c.advanced, c.ctk_combo, c.ctv_combo, c.fa_check
        self.ngl_spin, self.cpu_moe_spin, self.mmap_check = c.ngl_spin, c.cpu_moe_spin, c.mmap_check
        self.backend_combo, self.consumer_combo = c.backend_combo, c.consumer_combo
        self.vision_check, self.mmproj_button = c.vision_check, c.mmproj_button
        self.speculative_combo = c.speculative_combo
        r = self.results
        self.banner, self.tabs, self.legend, self.charts = r.banner, r.tabs, r.legend, r.charts
        self.split_chart, self.context_chart = r.split_chart, r.context_chart
        self.ladder_chart, self.concurrency_chart = r.ladder_chart, r.concurrency_chart
        self.compare_table, self.breakdown_table = r.compare_table, r.breakdown_table
        self.command_text, self.assumptions_text = r.command_text, r.assumptions_text
        t = self.tools
        self.run_panel, self.ab_panel, self.load_panel = t.run_panel, t.ab_panel, t.load_panel
        self.scale_panel, self.advisor_panel, self.history_panel = t.scale_panel, t.advisor_panel, t.history_panel

    # -- preferences <-> widgets --------------------------------------------------------------

    def _apply_prefs_to_widgets(self) -> None:
        p = self._prefs
        self.controls.show_preferences(p, bool(self.machine.gpus), self._vision_available())
        if self.presentation_action.isChecked() != p.presentation or not self._presentation_shown:
            self.presentation_action.setChecked(p.presentation)
            self._set_presentation_widgets(p.presentation)
            self._presentation_shown = True

    _select_combo = staticmethod(select_combo)

    def _vision_available(self) -> bool:
        """Whether a projector can be added: one is loaded, was read from a file, or the model has its own."""
        return (
            self._prefs.controls.projector is not None
            or self._projector_file is not None
            or catalog_projector(self._prefs.model) is not None
        )

    def _update_model_widgets(self) -> None:
        self.controls.update_model_widgets(
            self._prefs.model.kind, self._prefs.controls.projector, self._vision_available()
        )

    def _sync_vision_widgets(self) -> None:
        self.controls.show_vision(self._prefs.controls.projector, self._vision_available())

    def _vision_toggled(self, on: bool) -> None:
        spec = (self._projector_file or catalog_projector(self._prefs.model)) if on else None
        if on and spec is None:
            self.choose_projector_file()
            return
        self._controls_edited(self._prefs.controls.model_copy(update={"projector": spec}))

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
        self._controls_edited(self._prefs.controls.model_copy(update={"projector": spec}))
        self._sync_vision_widgets()

    def _mtp_available(self) -> bool:
        """Whether the model shown has an MTP head llama-server can draft with."""
        return self.view is not None and self.view.model is not None and supports_mtp(self.view.model.arch)

    def _sync_speculative_widgets(self) -> None:
        self.controls.show_speculative(self._prefs.controls.speculative, self._draft_file, self._mtp_available())

    def _speculative_chosen(self, kind: str) -> None:
        if kind == "file":
            self.choose_draft_file()
            return
        spec: SpeculativeSpec | None = None
        if kind == "mtp":
            spec = SpeculativeSpec(kind="mtp", name="the model's MTP head")
        elif kind == "draft":
            spec = self._draft_file
        self._controls_edited(self._prefs.controls.model_copy(update={"speculative": spec}))

    def choose_draft_file(self, path: str | Path | None = None) -> None:
        """Draft with a small model read from a GGUF (llama-server -md; a file dialog without ``path``)."""
        if path is None:
            chosen, _ = QFileDialog.getOpenFileName(self, "Choose a draft model", "", "GGUF files (*.gguf)")
            if not chosen:
                self._sync_speculative_widgets()
                return
            path = chosen
        try:
            draft = model_from_gguf(path)
            spec = SpeculativeSpec(
                kind="draft",
                name=draft.label,
                file_name=Path(path).name,
                architecture=draft.arch,
                tensors=tuple(draft.tensors),
            )
        except (FitScopeError, ValueError) as exc:
            QMessageBox.warning(self, "Draft model", str(exc))
            self._sync_speculative_widgets()
            return
        self._draft_file = spec
        self._controls_edited(self._prefs.controls.model_copy(update={"speculative": spec}))
        self._sync_speculative_widgets()

    def _set_prefs(self, **update: Any) -> None:
        self._prefs = self._prefs.model_copy(update=update)
        if "controls" in update:
            self.controls.set_current_controls(self._prefs.controls)
        self._save_timer.start()
        self.request_estimate()

    def _hardware_edited(self, choice: HardwareChoice) -> None:
        self._prefs = self._prefs.model_copy(update={"hardware": choice})
        self.controls.update_hardware_widgets(choice, bool(self.machine.gpus))
        self._set_prefs()

    def _controls_edited(self, controls: Controls) -> None:
        self._set_prefs(controls=controls)

    def _quant_chosen(self, quant: str) -> None:
        if self._prefs.model.kind in ("catalog", "hf_config"):
            self._set_prefs(model=self._prefs.model.model_copy(update={"quant": quant}))

    # -- public actions (menus, tests, screenshots) -------------------------------------------

    def choose_model(self, choice: ModelChoice) -> None:
        """Switch model; if it cannot be read, a message says why and the previous one stays."""
        controls = self._prefs.controls
        if controls.projector is not None and controls.projector != self._projector_file:
            # A catalog model's own projector follows the model; a chosen file stays until unticked.
            controls = controls.model_copy(update={"projector": catalog_projector(choice)})
        if controls.speculative is not None and controls.speculative.kind == "mtp" and not _has_mtp(choice):
            controls = controls.model_copy(update={"speculative": None})  # the new model has no head to draft with
        self._set_prefs(model=choice, controls=controls)
        self.controls.select_model_item(choice)
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
        self.set_scenario(hardware=choice)

    def set_controls(self, controls: Controls) -> None:
        self.set_scenario(controls=controls)

    def open_gguf(self, path: str) -> None:
        self.choose_model(ModelChoice(kind="gguf", ref=str(path)))
        self._remember_file(path)

    def import_config(self, path: str) -> None:
        self.choose_model(ModelChoice(kind="hf_config", ref=str(path), quant=self.controls.quant_combo.currentData()))
        self._remember_file(path)

    def _remember_file(self, path: str) -> None:
        recent = tuple(dict.fromkeys((str(path), *self._prefs.recent_files)))[:10]
        self._prefs = self._prefs.model_copy(update={"recent_files": recent})

    def open_gguf_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a GGUF model", "", "GGUF models (*.gguf);;All files (*)")
        if path:
            self.open_gguf(path)

    def open_remote_dialog(self, source: str) -> RemoteModelDialog:
        """File > Open from Hugging Face / Ollama: a model opened there becomes this window's."""

        def opened(choice: ModelChoice, spec: ProjectorSpec | None) -> None:
            self.set_scenario(model=choice, controls=self._prefs.controls.model_copy(update={"projector": spec}))

        return open_remote_dialog(self, source, opened)  # type: ignore[arg-type]

    def import_config_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Import a Hugging Face config.json", "", "config.json (*.json);;All files (*)"
        )
        if path:
            self.import_config(path)

    def open_path(self, path: str) -> None:
        """A dropped or named file: a .gguf model or a config.json."""
        lower = path.lower()
        if lower.endswith(".gguf"):
            self.open_gguf(path)
        elif lower.endswith(".json"):
            self.import_config(path)
        else:
            self.show_error(f"{Path(path).name} is neither a .gguf model nor a config.json; FitScope opens those.")

    # -- presentation mode and look -----------------------------------------------------------

    def set_presentation(self, on: bool) -> None:
        """Large type and only the essential controls, for demos on a projector."""
        self.presentation_action.setChecked(on)
        if self._prefs.presentation != on:
            self._prefs = self._prefs.model_copy(update={"presentation": on})
            self._save_timer.start()
        self._set_presentation_widgets(on)

    def _set_presentation_widgets(self, on: bool) -> None:
        self.controls.set_presentation(on)
        self.results.set_presentation(on)
        font = QGuiApplication.font()
        if on:
            font.setPointSizeF(font.pointSizeF() * PRESENTATION_SCALE)
        self.splitter.setFont(font)
        # The controls keep room for a device's whole name at either type size.
        self.controls.keep_names_readable(font)
        self._apply_look()

    @property
    def presentation(self) -> bool:
        return self._prefs.presentation

    def _apply_look(self) -> None:
        scale = PRESENTATION_SCALE if self._prefs.presentation else 1.0
        palette = self.palette()
        self.results.apply_look(palette, scale)
        for chart in self.tools.charts:
            chart.apply_palette(palette, scale)

    # -- help and messages --------------------------------------------------------------------

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
        job = partial(evaluate_in_worker, request, self._services.demo_path, self._services.remote_model)
        return self._estimates.submit(job, request.model)

    @property
    def busy(self) -> bool:
        return self._estimates.running

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
            self.controls.select_model_item(fallback)
            self._update_model_widgets()
            self.show_error(message)
            self.request_estimate()
            return
        self.banner.set_message("red", "No estimate.", message)
        self.show_error(message)

    def show_view(self, view: View) -> None:
        """Put ``view`` on screen: the verdict, the model's summary, the charts, the tables, and
        the tool tabs' model; then emit ``view_changed``."""
        self.view = view
        self.controls.show_model(view)
        self._sync_speculative_widgets()
        self.results.show_view(view)
        self.tools.show_view(view)
        self.view_changed.emit(view)

    # -- hardware polling ---------------------------------------------------------------------

    def _poll_gpus(self) -> None:
        if not self._hardware.running:
            self._hardware.submit(self._services.gpu_status)

    def _on_gpus(self, _job_id: int, status: GpuStatus | bool) -> None:
        if isinstance(status, bool):  # the answer to gpu_offload_supported()
            gpus = self.machine.gpus
            self.run_panel.set_gpu_offload_supported(status, gpus[0].vendor if gpus else None)
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
        return exports.chart_png(self.charts[name])

    def export(self, kind: str, path: Path) -> list[Path]:
        """Write the current view as ``kind`` (html, json, csv, png) to ``path`` (a folder for png).
        Returns the files written. Raises FitScopeError when there is nothing to export or the disk
        refuses."""
        return exports.export(self.view, self.charts, kind, path)

    def export_dialog(self, kind: str) -> None:
        """Ask where to save, then export (File menu); a failure is shown, not raised."""
        target = exports.ask_export_target(self, kind)
        if target is None:
            return
        try:
            written = self.export(kind, target)
        except FitScopeError as exc:
            self.show_error(str(exc))
            return
        self.statusBar().showMessage(f"Saved {', '.join(str(p) for p in written)}", 8000)

    def copy_command(self) -> str:
        """The llama.cpp settings for the view on the clipboard; returns them ("" without a view)."""
        if self.view is None:
            return ""
        try:
            text = exports.copy_command(self.view)
        except FitScopeError as exc:
            self.show_error(str(exc))
            return ""
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
        if event.type() in palette_events and hasattr(self, "tools"):
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
        self.tools.shutdown()
        for runner in (self._estimates, self._hardware, self._host_job):
            runner.close()
        if self.history is not None:
            self.history.close()
        super().closeEvent(event)

    # -- measured efficiencies ----------------------------------------------------------------

    def _load_efficiencies(self) -> None:
        """The decode efficiencies live runs measured on this machine, for the next estimates."""
        if self.history is not None:
            found = self.history.efficiencies(machine_key(self.machine.host, self.machine.gpus), llama_math_threads())
            self._efficiency = tuple(sorted(found.items()))

    def _run_saved(self, _report: object) -> None:
        self._load_efficiencies()
        self.request_estimate()
