"""The A/B tab's dialogs: a task suite edited as YAML (errors point at their line), and an example
(a prompt and the answer expected of it) added to the user's own suite."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)

from app.core.quality.suite import Suite, SuiteError
from app.core.quality.suite_reading import parse_suite
from app.core.quality.suite_writing import EXAMPLE_CHECKS, example_check_meaning, example_prompt


class SuiteEditor(QDialog):
    """Edit a suite as YAML; errors point at the line."""

    def __init__(self, text: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Edit task suite")
        self.resize(760, 620)
        self.editor = QPlainTextEdit(text)
        self.editor.setAccessibleName("Suite text (YAML or JSON)")
        self.message = QLabel("")
        self.message.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        check = buttons.addButton("&Check", QDialogButtonBox.ButtonRole.ActionRole)
        check.clicked.connect(self.validate)
        buttons.accepted.connect(self._accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.editor)
        layout.addWidget(self.message)
        layout.addWidget(buttons)
        self.suite: Suite | None = None

    def validate(self) -> Suite | None:
        try:
            suite = parse_suite(self.editor.toPlainText(), "<editor>")
        except SuiteError as exc:
            self.message.setText(str(exc))
            if exc.line:
                block = self.editor.document().findBlockByLineNumber(exc.line - 1)
                cursor = self.editor.textCursor()
                cursor.setPosition(block.position())
                self.editor.setTextCursor(cursor)
            return None
        self.message.setText(f"OK: {len(suite.prompts)} prompts.")
        return suite

    def _accept(self) -> None:
        self.suite = self.validate()
        if self.suite is not None:
            self.accept()


class ExampleDialog(QDialog):
    """Paste a prompt and the answer you expect; choose how the model's answer is compared with it."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Add an example to your suite")
        self.resize(640, 520)
        self.prompt = QPlainTextEdit()
        self.prompt.setAccessibleName("Prompt")
        self.prompt.setPlaceholderText("The prompt, as your application sends it to the model")
        self.expected = QPlainTextEdit()
        self.expected.setAccessibleName("Expected answer")
        self.expected.setPlaceholderText("The answer you expect")
        self.check = QComboBox()
        self.check.setAccessibleName("How to compare the answer")
        labels = {"contains": "contains", "exact": "exact", "similar": "similar to"}
        for kind in EXAMPLE_CHECKS:
            self.check.addItem(f"{labels[kind]}: {example_check_meaning(kind)}", kind)
        self.message = QLabel("")
        self.message.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self._accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Prompt:"))
        layout.addWidget(self.prompt, 3)
        layout.addWidget(QLabel("Expected answer:"))
        layout.addWidget(self.expected, 2)
        row = QHBoxLayout()
        row.addWidget(QLabel("Pass when"))
        row.addWidget(self.check, 1)
        layout.addLayout(row)
        layout.addWidget(self.message)
        layout.addWidget(buttons)

    def example(self) -> tuple[str, str, str]:
        """The prompt, the expected answer and the check kind."""
        return self.prompt.toPlainText(), self.expected.toPlainText(), str(self.check.currentData())

    def _accept(self) -> None:
        try:
            example_prompt(*self.example())
        except SuiteError as exc:
            self.message.setText(str(exc))
            return
        self.accept()
