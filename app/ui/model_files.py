"""How a model file reaches the main window: File > Open GGUF, Import config.json and Open from
Hugging Face / Ollama, a file dropped on the window or named on the command line, and a vision
projector file chosen beside the model. Each ends as the window's new model choice (or a sentence
saying why the file cannot be used, the previous model staying).

``ModelFiles`` is a part of :class:`app.ui.window.MainWindow`, kept here by its job; ``_Window`` is
what it uses of the window.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget

from app.core.common.errors import FitScopeError
from app.core.memory.records import SpeculativeSpec
from app.core.memory.speculative import supports_mtp
from app.core.model.catalog import find_model
from app.core.model.projector import ProjectorSpec
from app.core.model.projector_file import read_projector
from app.core.model.source import model_from_gguf
from app.core.report.choices import Controls, HardwareChoice, ModelChoice, catalog_projector
from app.core.report.prefs import Preferences
from app.services.view import View
from app.ui.controls import ControlsPanel
from app.ui.remote_dialog import RemoteModelDialog, open_remote_dialog


class _Window(Protocol):
    """What ``ModelFiles`` uses of the main window."""

    _prefs: Preferences
    _projector_file: ProjectorSpec | None
    _draft_file: SpeculativeSpec | None
    controls: ControlsPanel
    view: View | None

    def choose_model(self, choice: ModelChoice) -> None: ...

    def set_scenario(
        self,
        model: ModelChoice | None = None,
        hardware: HardwareChoice | None = None,
        controls: Controls | None = None,
        compare: tuple[HardwareChoice, ...] | None = None,
    ) -> None: ...

    def show_error(self, message: str) -> None: ...

    def _controls_edited(self, controls: Controls) -> None: ...

    def _vision_available(self) -> bool: ...

    def _sync_vision_widgets(self) -> None: ...

    def _remember_file(self, path: str) -> None: ...

    def choose_projector_file(self, path: str | Path | None = None) -> None: ...

    def _mtp_available(self) -> bool: ...

    def _sync_speculative_widgets(self) -> None: ...

    def choose_draft_file(self, path: str | Path | None = None) -> None: ...

    def open_gguf(self, path: str) -> None: ...

    def import_config(self, path: str) -> None: ...

    def open_path(self, path: str) -> None: ...

    def window(self) -> QWidget: ...


def has_mtp(choice: ModelChoice) -> bool:
    """Whether a catalog model keeps an MTP head llama-server can draft with (False for the others,
    whose head is known only once read)."""
    if choice.kind != "catalog":
        return False
    try:
        return supports_mtp(find_model(choice.ref))
    except FitScopeError:
        return False


class ModelFiles:
    """The main window's model and projector files: dialogs, drops and recent files."""

    # A projector read from a file (not a catalog model's own) stays chosen across models; so does a
    # draft model read from a file, offered beside every model.
    _projector_file: ProjectorSpec | None = None
    _draft_file: SpeculativeSpec | None = None

    def _vision_available(self: _Window) -> bool:
        """Whether a projector can be added: one is loaded, was read from a file, or the model has its own."""
        return (
            self._prefs.controls.projector is not None
            or self._projector_file is not None
            or catalog_projector(self._prefs.model) is not None
        )

    def _update_model_widgets(self: _Window) -> None:
        self.controls.update_model_widgets(
            self._prefs.model.kind, self._prefs.controls.projector, self._vision_available()
        )

    def _sync_vision_widgets(self: _Window) -> None:
        self.controls.show_vision(self._prefs.controls.projector, self._vision_available())

    def _vision_toggled(self: _Window, on: bool) -> None:
        spec = (self._projector_file or catalog_projector(self._prefs.model)) if on else None
        if on and spec is None:
            self.choose_projector_file()
            return
        self._controls_edited(self._prefs.controls.model_copy(update={"projector": spec}))

    def choose_projector_file(self: _Window, path: str | Path | None = None) -> None:
        """Load a projector GGUF beside the model (a file dialog without ``path``)."""
        if path is None:
            chosen, _ = QFileDialog.getOpenFileName(
                self.window(), "Choose a vision projector", "", "GGUF files (*.gguf)"
            )
            if not chosen:
                self._sync_vision_widgets()
                return
            path = chosen
        try:
            spec = read_projector(path)
        except FitScopeError as exc:
            QMessageBox.warning(self.window(), "Vision projector", str(exc))
            self._sync_vision_widgets()
            return
        self._projector_file = spec
        self._controls_edited(self._prefs.controls.model_copy(update={"projector": spec}))
        self._sync_vision_widgets()

    def open_gguf(self: _Window, path: str) -> None:
        self.choose_model(ModelChoice(kind="gguf", ref=str(path)))
        self._remember_file(path)

    def import_config(self: _Window, path: str) -> None:
        self.choose_model(ModelChoice(kind="hf_config", ref=str(path), quant=self.controls.quant_combo.currentData()))
        self._remember_file(path)

    def _remember_file(self: _Window, path: str) -> None:
        recent = tuple(dict.fromkeys((str(path), *self._prefs.recent_files)))[:10]
        self._prefs = self._prefs.model_copy(update={"recent_files": recent})

    def open_gguf_dialog(self: _Window) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self.window(), "Open a GGUF model", "", "GGUF models (*.gguf);;All files (*)"
        )
        if path:
            self.open_gguf(path)

    def open_remote_dialog(self: _Window, source: str) -> RemoteModelDialog:
        """File > Open from Hugging Face / Ollama: a model opened there becomes this window's."""

        def opened(choice: ModelChoice, spec: ProjectorSpec | None) -> None:
            self.set_scenario(model=choice, controls=self._prefs.controls.model_copy(update={"projector": spec}))

        return open_remote_dialog(self.window(), source, opened)  # type: ignore[arg-type]

    def import_config_dialog(self: _Window) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self.window(), "Import a Hugging Face config.json", "", "config.json (*.json);;All files (*)"
        )
        if path:
            self.import_config(path)

    def open_path(self: _Window, path: str) -> None:
        """A dropped or named file: a .gguf model or a config.json."""
        lower = path.lower()
        if lower.endswith(".gguf"):
            self.open_gguf(path)
        elif lower.endswith(".json"):
            self.import_config(path)
        else:
            self.show_error(f"{Path(path).name} is neither a .gguf model nor a config.json; FitScope opens those.")

    # -- drag and drop ------------------------------------------------------------------------

    def dragEnterEvent(self: _Window, event: QDragEnterEvent) -> None:  # noqa: N802 - Qt's name
        if event.mimeData().hasUrls() and any(u.isLocalFile() for u in event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self: _Window, event: QDropEvent) -> None:  # noqa: N802 - Qt's name
        paths = [u.toLocalFile() for u in event.mimeData().urls() if u.isLocalFile()]
        if not paths:
            return
        event.acceptProposedAction()
        self.open_path(paths[0])

    # -- speculative decoding: the model's MTP head or a draft model file (-md) ---------------------

    def _mtp_available(self: _Window) -> bool:
        """Whether the model shown has an MTP head llama-server can draft with."""
        return self.view is not None and self.view.model is not None and supports_mtp(self.view.model.arch)

    def _sync_speculative_widgets(self: _Window) -> None:
        self.controls.show_speculative(self._prefs.controls.speculative, self._draft_file, self._mtp_available())

    def _speculative_chosen(self: _Window, kind: str) -> None:
        if kind == "file":
            self.choose_draft_file()
            return
        spec: SpeculativeSpec | None = None
        if kind == "mtp":
            spec = SpeculativeSpec(kind="mtp", name="the model's MTP head")
        elif kind == "draft":
            spec = self._draft_file
        self._controls_edited(self._prefs.controls.model_copy(update={"speculative": spec}))

    def choose_draft_file(self: _Window, path: str | Path | None = None) -> None:
        """Draft with a small model read from a GGUF (llama-server -md; a file dialog without ``path``)."""
        if path is None:
            chosen, _ = QFileDialog.getOpenFileName(self.window(), "Choose a draft model", "", "GGUF files (*.gguf)")
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
            QMessageBox.warning(self.window(), "Draft model", str(exc))
            self._sync_speculative_widgets()
            return
        self._draft_file = spec
        self._controls_edited(self._prefs.controls.model_copy(update={"speculative": spec}))
        self._sync_speculative_widgets()
