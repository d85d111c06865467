"""The main window: hardware, model and controls on the left; the verdict and the charts on the right.

Every change goes the same way: the controls report the new choice, the window writes it into
``Preferences``, a request is sent to the estimate worker, and the returned ``View`` is shown
everywhere at once (``view_changed`` fires after it is). Nothing slow runs on the GUI thread.

The window owns its parts and the state they share (the preferences, this machine, the view on
screen); each part lives in its own module: how model files are opened and dropped
(``model_files.py``), the left-hand controls (``controls.py`` and ``hardware_box.py``), the verdict
and the estimate's tabs (``results.py``), the Run / A/B / Load / Scale out / Which machine? /
History tabs (``tool_tabs.py``), the menus (``menus.py``) and the exports (``exports.py``).
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
from PySide6.QtGui import QCloseEvent, QGuiApplication
from PySide6.QtWidgets import QMainWindow, QMessageBox, QSplitter

from app.adapters.demo_model import demo_model_ready
from app.adapters.divergence_runner import measured_quality
from app.adapters.history import RunHistory
from app.adapters.logs import log_path
from app.core.common.errors import FitScopeError
from app.core.hardware.snapshots import GpuStatus, HostSnapshot
from app.core.model.catalog import load_devices, load_models
from app.core.report.choices import Controls, HardwareChoice, Machine, ModelChoice, catalog_projector
from app.core.report.lengths import WORDS_PER_TOKEN
from app.core.report.prefs import Preferences, save_preferences
from app.services.remote import load_remote_model
from app.services.runs import calibration_of, reset_calibration
from app.services.view import Request, View, evaluate_in_worker
from app.ui import exports
from app.ui.controls import ControlsPanel
from app.ui.hardware_box import select_combo
from app.ui.help import Walkthrough, diagnostics
from app.ui.jobs import JobRunner, process_pool
from app.ui.menus import MenuActions, build_menus
from app.ui.model_files import ModelFiles, has_mtp
from app.ui.results import ResultsArea
from app.ui.tool_tabs import ToolTabs, gpu_offload_supported
from app.ui.tuning_dialog import open_fastest_dialog
from app.ui.wheel import guard_wheel
from app.ui.workload_form import WorkloadEdit

_log = logging.getLogger(__name__)

PRESENTATION_SCALE = 1.6
GPU_CHANGE_BYTES = 256 * 1024**2  # free GPU memory moving by less than this does not re-estimate


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


class MainWindow(ModelFiles, QMainWindow):
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
        self._projector_file = (
            projector if projector is not None and not projector.source.startswith("https://") else None
        )
        speculative = prefs.controls.speculative
        self._draft_file = speculative if speculative is not None and speculative.kind == "draft" else None
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
        self.tools.show_settings(self._prefs, self.machine)
        self._load_efficiencies()  # again, now that the calibration line exists
        guard_wheel(self.splitter)  # scrolling the panels never changes a setting
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
        c.workload_edited.connect(lambda workload: self._set_prefs(workload=workload))
        c.add_model_requested.connect(self._add_model)
        c.speculative_chosen.connect(self._speculative_chosen)
        c.open_button.clicked.connect(self.open_gguf_dialog)
        c.import_button.clicked.connect(self.import_config_dialog)
        c.mmproj_button.clicked.connect(lambda: self.choose_projector_file())
        c.fastest_button.clicked.connect(lambda: open_fastest_dialog(self, self._services.demo_path))
        self.tools.error_shown.connect(self.show_error)
        self.tools.workload_edited.connect(self._workload_edited)
        self.results.calibration_reset.connect(self.reset_calibration)
        self.results.controls_toggled.connect(self.show_controls_in_presentation)
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

    def _set_prefs(self, **update: Any) -> None:
        self._prefs = self._prefs.model_copy(update=update)
        if "controls" in update:
            self.controls.set_current_controls(self._prefs.controls)
        if "controls" in update or "workload" in update:
            # One set of workload settings: both panels show the value just chosen.
            self.controls.show_shared(self._prefs.controls, self._prefs.workload)
        self.tools.show_settings(self._prefs, self.machine)
        self._save_timer.start()
        self.request_estimate()

    def _workload_edited(self, edit: WorkloadEdit) -> None:
        """People, conversation length or the rest of the workload, edited in "Which machine?"."""
        controls = self._prefs.controls.model_copy(
            update={"users": edit.users, "context_per_user_tokens": edit.context_per_user_tokens}
        )
        self._set_prefs(controls=controls, workload=edit.workload)

    def _add_model(self, how: str) -> None:
        """A way to add a model the catalog lacks, from the empty search's links."""
        if how == "gguf":
            self.open_gguf_dialog()
        elif how == "config":
            self.import_config_dialog()
        else:
            self.open_remote_dialog(how)

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
        if controls.speculative is not None and controls.speculative.kind == "mtp" and not has_mtp(choice):
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
        # For a room the charts get the width: the controls hide (a button on the banner shows them).
        shown = not on or self._prefs.presentation_controls
        self.controls.setVisible(shown)
        self.results.set_presentation(on, shown)
        self.tools.set_presentation(on)
        font = QGuiApplication.font()
        if on:
            font.setPointSizeF(font.pointSizeF() * PRESENTATION_SCALE)
        self.splitter.setFont(font)
        # The controls keep room for a device's whole name at either type size.
        self.controls.keep_names_readable(font)
        self._apply_look()

    def show_controls_in_presentation(self, shown: bool) -> None:
        """Presentation mode with (or without) the controls on the left; remembered."""
        self._prefs = self._prefs.model_copy(update={"presentation_controls": shown})
        self._save_timer.start()
        self._set_presentation_widgets(self._prefs.presentation)

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
        speed = p.workload.min_speed
        return Request(
            model=p.model,
            hardware=p.hardware,
            controls=p.controls,
            machine=self.machine,
            compare=p.compare,
            measured_efficiency=self._efficiency,
            measured_quality=measured_quality(),
            min_tokens_per_s=(speed / WORDS_PER_TOKEN if p.workload.speed_unit == "words" else speed) or None,
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
        if self.controls.isVisible():  # the split as the person left it, not presentation mode's
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
        """The decode efficiencies good live runs measured on this machine (their median per
        device), for the next estimates; and the line that says so, with Reset."""
        found = calibration_of(self.machine, self.history) if self.history is not None else {}
        self._efficiency = tuple(sorted((name, c.efficiency) for name, c in found.items()))
        if hasattr(self, "results"):
            self.results.show_calibration(found)

    def reset_calibration(self) -> None:
        """Forget what runs measured on this machine: its estimates go back to the speed model's."""
        if self.history is None:
            return
        reset_calibration(self.machine, self.history)
        self._load_efficiencies()
        self.request_estimate()

    def _run_saved(self, _report: object) -> None:
        self._load_efficiencies()
        self.request_estimate()
