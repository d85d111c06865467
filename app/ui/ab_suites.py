"""The A/B tab's task suites: the built-in suites, the user's own (saved in their suites folder) and
any loaded or edited in this session, each ticked to run or not; loading a suite file, editing one
as YAML, and adding a pasted example to the user's suite.

``SuiteBox`` keeps what the user ticked across refills (a new example, an edited suite) and reports
problems and what it did as sentences (``error_shown``, ``status_changed``); the tab shows them.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.adapters.user_suites import UserSuite, add_example, load_user_suites, save_suite, user_suites_dir
from app.core.common.errors import FitScopeError
from app.core.common.text import safe_label
from app.core.quality.suite import Suite, SuiteError
from app.core.quality.suite_reading import builtin_suites, load_suite
from app.core.quality.suite_writing import suite_to_yaml
from app.ui.ab_dialogs import ExampleDialog, SuiteEditor


class SuiteBox(QGroupBox):
    """The list of task suites with their buttons (Load suite…, Edit…, Add example…)."""

    error_shown = Signal(str)
    status_changed = Signal(str)

    def __init__(self, suites_folder: Path | None = None, parent: QWidget | None = None) -> None:
        """``suites_folder`` holds the user's own suites (default: FitScope's data folder)."""
        super().__init__("Task suites", parent)
        self._suites_folder = user_suites_dir() if suites_folder is None else suites_folder
        self.user_suites, self.problems = load_user_suites(self._suites_folder)
        self.custom_suites: list[Suite] = []
        layout = QVBoxLayout(self)
        self.suite_list = QListWidget()
        self.suite_list.setAccessibleName("Task suites to run")
        layout.addWidget(self.suite_list)
        row = QHBoxLayout()
        self.load_suite_button = QPushButton("&Load suite…")
        self.edit_suite_button = QPushButton("&Edit…")
        self.add_example_button = QPushButton("Add e&xample…")
        self.add_example_button.setToolTip(
            f"Paste a prompt and the answer you expect; it is saved to your suite in {self._suites_folder}"
        )
        row.addWidget(self.load_suite_button)
        row.addWidget(self.edit_suite_button)
        row.addWidget(self.add_example_button)
        layout.addLayout(row)
        self._fill()
        self.load_suite_button.clicked.connect(self._load_suite_dialog)
        self.edit_suite_button.clicked.connect(self._edit_suite)
        self.add_example_button.clicked.connect(self._add_example_dialog)

    def _fill(self) -> None:
        # A refill (a new example, an edited suite) keeps what the user ticked.
        ticked = {
            self.suite_list.item(i).data(Qt.ItemDataRole.UserRole).name: self.suite_list.item(i).checkState()
            == Qt.CheckState.Checked
            for i in range(self.suite_list.count())
        }
        self.suite_list.clear()
        edited = {s.name for s in self.custom_suites}
        for name, suite in builtin_suites().items():
            self._add_item(suite, checked=ticked.get(name, name in ("chat", "extraction")))
        for mine in self.user_suites:
            if mine.suite.name not in edited:
                self._add_item(mine.suite, checked=ticked.get(mine.suite.name, True), path=mine.path)
        for suite in self.custom_suites:
            self._add_item(suite, checked=ticked.get(suite.name, True))

    def _add_item(self, suite: Suite, checked: bool, path: Path | None = None) -> None:
        floor = f", floor {suite.quality_floor:.0%}" if suite.quality_floor is not None else ""
        yours = ", yours" if path is not None else ""
        item = QListWidgetItem(f"{safe_label(suite.name)} ({len(suite.prompts)} prompts{floor}{yours})")
        item.setData(Qt.ItemDataRole.UserRole, suite)
        item.setData(Qt.ItemDataRole.UserRole + 1, str(path) if path is not None else None)
        item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
        item.setCheckState(Qt.CheckState.Checked if checked else Qt.CheckState.Unchecked)
        item.setToolTip(suite.description + (f"\nSaved in {path}" if path is not None else ""))
        self.suite_list.addItem(item)

    def chosen_suites(self) -> list[Suite]:
        """The ticked suites, in the list's order."""
        out = []
        for i in range(self.suite_list.count()):
            item = self.suite_list.item(i)
            if item.checkState() == Qt.CheckState.Checked:
                out.append(item.data(Qt.ItemDataRole.UserRole))
        return out

    def add_suite(self, suite: Suite) -> None:
        """List ``suite`` for this session (replacing one of the same name)."""
        self.custom_suites = [s for s in self.custom_suites if s.name != suite.name] + [suite]
        self._fill()

    def user_suite_names(self) -> list[str]:
        return [u.suite.name for u in self.user_suites]

    def _reload_user_suites(self) -> None:
        self.user_suites, problems = load_user_suites(self._suites_folder)
        self._fill()
        if problems:
            self.status_changed.emit("Some of your suites cannot be used: " + " ".join(problems))

    def _load_suite_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Load a task suite", "", "Suites (*.yaml *.yml *.json)")
        if not path:
            return
        try:
            self.add_suite(load_suite(path))
        except SuiteError as exc:
            self.error_shown.emit(str(exc))

    def _edit_suite(self) -> None:
        item = self.suite_list.currentItem()
        base = item.data(Qt.ItemDataRole.UserRole) if item is not None else next(iter(builtin_suites().values()))
        saved_in = item.data(Qt.ItemDataRole.UserRole + 1) if item is not None else None
        dialog = SuiteEditor(suite_to_yaml(base), self)
        if not dialog.exec() or dialog.suite is None:
            return
        if saved_in and dialog.suite.name == base.name:
            # One of the user's files: the edit is saved there, as an added example is.
            try:
                save_suite(dialog.suite, Path(saved_in))
            except FitScopeError as exc:
                self.error_shown.emit(str(exc))
                return
            self._reload_user_suites()
            return
        self.add_suite(dialog.suite)

    def add_example(self, prompt: str, expected: str, check: str) -> UserSuite | None:
        """Append an example to the user's examples suite, save it, and list it (ticked) at once.
        A problem is shown, not raised; returns the saved suite, or None."""
        try:
            saved = add_example(prompt, expected, check, folder=self._suites_folder)
        except FitScopeError as exc:
            self.error_shown.emit(str(exc))
            return None
        self.custom_suites = [s for s in self.custom_suites if s.name != saved.suite.name]
        self._reload_user_suites()
        for i in range(self.suite_list.count()):
            item = self.suite_list.item(i)
            if item.data(Qt.ItemDataRole.UserRole).name == saved.suite.name:
                item.setCheckState(Qt.CheckState.Checked)
                self.suite_list.setCurrentItem(item)
        added = saved.suite.prompts[-1]
        self.status_changed.emit(
            f"Added '{added.id}' to {saved.suite.name} ({len(saved.suite.prompts)} prompts), saved in {saved.path}."
        )
        return saved

    def _add_example_dialog(self) -> None:
        dialog = ExampleDialog(self)
        accepted = dialog.exec()
        example = dialog.example()
        dialog.deleteLater()
        if accepted:
            self.add_example(*example)
