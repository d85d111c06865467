"""The main window's tabs that go beyond the estimate: Run (a live llama.cpp run held against the
estimate), Quantization A/B, Load, Scale out, Which machine? and History.

``ToolTabs`` builds these panels into the window's tab widget and keeps them pointed at what the
window shows: ``show_view`` gives the Run, A/B and Load tabs the current model file and settings.
It reads the window's state through the small ``Workspace`` protocol and reports back by signals
(``error_shown``, ``run_saved``, ``quality_measured``). Finished runs go through
``app.services.runs`` (the flow the command line runs too).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QScrollArea, QTabWidget, QWidget

from app.adapters.demo_model import DEMO_MODEL_NAME
from app.adapters.history import RunHistory
from app.adapters.load_profile import cached_profile, measure_profile, memory_slots
from app.core.advisor.records import QUALITY_FLOORS
from app.core.common.errors import FitScopeError
from app.core.common.text import safe_label
from app.core.common.units import GIB
from app.core.hardware.snapshots import machine_key
from app.core.memory.records import Settings, Target
from app.core.memory.targets import repack_profile
from app.core.model.catalog import find_model
from app.core.model.source import ModelSource
from app.core.report.choices import HardwareChoice, Machine, ModelChoice, load_model, resolve_targets
from app.core.report.prefs import Preferences
from app.core.report.run_vs_estimate import RunReport
from app.core.speed.measure import RunResult, SweepRow
from app.services.remote import load_remote_model
from app.services.runs import finish_run, save_run
from app.services.view import View
from app.ui.ab_panel import AbPanel
from app.ui.advisor_panel import AdvisorPanel, OpenConfiguration
from app.ui.chart_base import Chart
from app.ui.history_panel import HistoryPanel
from app.ui.load_panel import LoadPanel
from app.ui.run_panel import RunContext, RunPanel, demo_or_path
from app.ui.scale_panel import ScalePanel


class Workspace(Protocol):
    """What the tool tabs read from the window: this machine now, the choices, the view on screen."""

    @property
    def machine(self) -> Machine: ...

    @property
    def view(self) -> View | None: ...

    @property
    def preferences(self) -> Preferences: ...


class ToolTabs(QObject):
    """The six tool panels, added to ``tabs`` in order, and their wiring to the window."""

    error_shown = Signal(str)
    run_saved = Signal(object)  # RunReport, kept in the history: its measured efficiency is now known
    quality_measured = Signal()  # an A/B comparison finished: the ladder can show measured quality
    workload_edited = Signal(object)  # WorkloadEdit: the shared workload settings, edited in "Which machine?"

    def __init__(
        self,
        tabs: QTabWidget,
        workspace: Workspace,
        demo_path: Callable[[], Path],
        history: RunHistory | None,
        open_configuration: OpenConfiguration,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._tabs = tabs
        self._lab_pages: list[QWidget] = []  # the tabs that measure this computer
        self._workspace = workspace
        self._demo_path = demo_path
        self._history = history
        self.run_panel = RunPanel(self._finish_run, self._save_run, self._gpu_memory_of)
        tabs.addTab(self._lab_page(self.run_panel), "&Run")
        self.ab_panel = AbPanel(self._ab_hardware)
        tabs.addTab(self._lab_page(self.ab_panel), "Quantization &A/B")
        self.ab_panel.error_shown.connect(self.error_shown)
        self.ab_panel.comparison_finished.connect(lambda _c: self.quality_measured.emit())
        self.load_panel = LoadPanel()
        tabs.addTab(self._lab_page(self.load_panel), "&Load")
        self.load_panel.error_shown.connect(self.error_shown)
        self.scale_panel = ScalePanel(self._scale_model)
        tabs.addTab(self._lab_page(self.scale_panel), "Scale &out")
        self.advisor_panel = AdvisorPanel(lambda: (workspace.preferences, workspace.machine), open_configuration)
        tabs.addTab(_scrolled(self.advisor_panel), "Which &machine?")
        self.advisor_panel.error_shown.connect(self.error_shown)
        self.advisor_panel.workload_edited.connect(self.workload_edited)
        self.history_panel = HistoryPanel(history)
        tabs.addTab(self._lab_page(self.history_panel), "H&istory")
        self.run_panel.run_failed.connect(self.error_shown)
        self.history_panel.error_shown.connect(self.error_shown)

    @property
    def charts(self) -> tuple[Chart, ...]:
        return (*self.run_panel.charts, *self.load_panel.charts, self.ab_panel.chart, self.advisor_panel.chart)

    def show_view(self, view: View) -> None:
        """Point the Run, A/B and Load tabs at the view's model file (or say why they cannot run it)."""
        self._update_run_context(view)
        self.ab_panel.set_source(str(view.model.path) if view.model is not None and view.model.path else None)
        self._update_load_source(view)

    def show_settings(self, prefs: Preferences, machine: Machine) -> None:
        """The window's settings now: the workload on the "Which machine?" form, and every tab's
        results marked when they were computed for other settings."""
        parts = settings_words(prefs, machine)
        self.advisor_panel.show_workload(prefs, parts)
        for mark in (self.run_panel.stale, self.ab_panel.stale, self.load_panel.stale, self.scale_panel.stale):
            mark.set_settings(parts)

    def set_presentation(self, on: bool) -> None:
        """For a room: "Which machine?" in its short form, and the tabs that measure this computer
        (Run, A/B, Load, Scale out, History) out of the way."""
        self.advisor_panel.set_presentation(on)
        for page in self._lab_pages:
            self._tabs.setTabVisible(self._tabs.indexOf(page), not on)

    def _lab_page(self, panel: QWidget) -> QWidget:
        page = _scrolled(panel)
        self._lab_pages.append(page)
        return page

    def shutdown(self) -> None:
        """Stop whatever the tabs are running (the window is closing)."""
        self.run_panel.shutdown()
        self.ab_panel.shutdown()
        self.advisor_panel.shutdown()
        self.scale_panel.shutdown()

    # -- Run ----------------------------------------------------------------------------------

    def _update_run_context(self, view: View) -> None:
        choice = view.request.model
        if choice.kind not in ("demo", "gguf") or view.model is None:
            label = safe_label(view.model.label) if view.model is not None else "This model"
            remote = choice.kind in ("hf", "ollama")
            where = "read from its header on a server" if remote else "an estimate from the catalog"
            self.run_panel.set_context(
                None,
                f"{label} is {where}: live runs need a GGUF file here. Open one (Ctrl+O) or choose the demo model.",
            )
            return
        c = view.request.controls
        self.run_panel.set_context(
            RunContext(
                gguf_path=demo_or_path(choice.ref if choice.kind == "gguf" else None, self._demo_path),
                model_label=DEMO_MODEL_NAME if choice.kind == "demo" else safe_label(view.model.label),
                is_demo=choice.kind == "demo",
                n_ctx=c.context_per_user_tokens,
                flash_attn=c.flash_attn,
                cache_type_k=c.cache_type_k,
                cache_type_v=c.cache_type_v,
            )
        )

    def _finish_run(self, result: RunResult, sweep: Sequence[SweepRow]) -> RunReport:
        """On the run's thread: the report against the estimate for the run's own settings."""
        return finish_run(result, self._workspace.machine, sweep)

    def _save_run(self, report: RunReport) -> RunReport:
        """On the GUI thread (the history's connection lives here): keep the run, then say so, so
        that the next estimates use the efficiency it measured."""
        saved = save_run(report, self._workspace.machine, self._history)
        if saved.save_message:
            self.error_shown.emit(saved.save_message)
            return saved
        self.history_panel.refresh()
        self.run_saved.emit(saved)
        return saved

    def _gpu_memory_of(self, pid: int) -> tuple[int, int] | None:
        for gpu in self._workspace.machine.gpus:
            for process in gpu.processes:
                if process.pid == pid:
                    return process.used_memory_bytes or 0, gpu.memory_used_bytes
        return None

    # -- A/B, Load, Scale out, Which machine? -------------------------------------------------

    def _ab_hardware(self) -> tuple[list[Target], str, str]:
        """What the A/B advice must fit: the hardware chosen on the left."""
        hardware = self._workspace.preferences.hardware
        machine = self._workspace.machine
        backend = self._workspace.preferences.controls.backend
        return resolve_targets(hardware, machine, backend), hardware.label(machine), repack_profile(machine.host)

    def _update_load_source(self, view: View) -> None:
        path = view.model.path if view.model is not None else None
        if path is None or view.request.model.kind == "hf_config":
            self.load_panel.set_source(
                None,
                "The load simulation measures the model on this machine: open a GGUF file or choose the demo model.",
            )
            return
        machine = self._workspace.machine
        key = machine_key(machine.host)
        targets = resolve_targets(HardwareChoice(kind="cpu"), machine)
        repack = repack_profile(machine.host)
        self.load_panel.set_source(
            (
                str(path),
                lambda: cached_profile(path, key),
                lambda: measure_profile(path, key),
                lambda tokens: memory_slots(path, tokens, targets, repack),
            )
        )

    def _scale_model(self) -> tuple[ModelSource, Settings, int, int, int]:
        """The current model with its tensors (read again: views carry none), for the Scale out tab."""
        prefs, view, machine = self._workspace.preferences, self._workspace.view, self._workspace.machine
        choice, c = prefs.model, prefs.controls
        path = view.model.path if view is not None and view.model is not None else None
        if choice.kind in ("gguf", "demo") and path is None:
            raise FitScopeError("The model is still loading; try again in a moment.")
        model = load_model(choice, path, load_remote_model)
        settings = c.settings(repack_profile(machine.host))
        host = machine.host.ram_total_bytes if machine.host else 64 * GIB
        return model, settings, c.context_per_user_tokens, c.users, host



def model_words(choice: ModelChoice) -> str:
    """The model a choice names, in a few words ("Qwen3 32B (Q4_K_M)", "tiny.gguf")."""
    if choice.kind == "demo":
        return "the demo model"
    if choice.kind == "catalog":
        try:
            return f"{find_model(choice.ref).name} ({choice.quant})"
        except FitScopeError:
            return choice.ref
    if choice.kind == "gguf":
        return Path(choice.ref).name
    if choice.kind == "hf_config":
        return f"{Path(choice.ref).parent.name or choice.ref} ({choice.quant})"
    return choice.ref


def settings_words(prefs: Preferences, machine: Machine) -> dict[str, str]:
    """Every setting a tab's results may depend on, in words, as their stale notes compare them."""
    c, w = prefs.controls, prefs.workload
    speed = f"{w.min_speed:g} {'words' if w.speed_unit == 'words' else 'tokens'} a second"
    return {
        "model": model_words(prefs.model),
        "machine": prefs.hardware.label(machine),
        "people": str(c.users),
        "conversation length": f"{c.context_per_user_tokens:,} tokens",
        "speed needed": speed,
        "quantization may cost": QUALITY_FLOORS[w.quality_floor][0],
        "budget": f"${w.budget_usd:,.0f}" if w.budget_usd else "no limit",
        "put first": w.prefer,
        "llama.cpp settings": f"K cache {c.cache_type_k}, V cache {c.cache_type_v}, flash attention "
        f"{'on' if c.flash_attn else 'off'}",
    }


def gpu_offload_supported() -> bool:
    """Whether the installed llama-cpp-python can offload layers to a GPU (loads the library: run
    it off the GUI thread). The Run tab says so when it cannot."""
    try:
        import llama_cpp
    except ImportError:
        return False
    from app.adapters.rpc_backend import offloads_to_local_gpu

    return offloads_to_local_gpu(llama_cpp)


def _scrolled(widget: QWidget) -> QScrollArea:
    """A page that scrolls when the window is smaller than its controls need."""
    area = QScrollArea()
    area.setWidget(widget)
    area.setWidgetResizable(True)
    area.setFrameShape(QScrollArea.Shape.NoFrame)
    return area
