"""The A/B tab's "Add example…": a pasted prompt and expected answer join the user's suite file at
once, are ticked for the next compare, and are still there when the tab is opened again."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QDialogButtonBox

from app.core.quality.suite_reading import load_suite


def _panel(qtbot, folder: Path):
    from app.ui.ab_panel import AbPanel

    panel = AbPanel(lambda: ([], "this CPU", "none"), suites_folder=folder)
    qtbot.addWidget(panel)
    return panel


def _items(panel) -> dict[str, tuple[str, bool]]:
    """Suite name -> (the list's text, ticked)."""
    out = {}
    for i in range(panel.suites.suite_list.count()):
        item = panel.suites.suite_list.item(i)
        suite = item.data(Qt.ItemDataRole.UserRole)
        out[suite.name] = (item.text(), item.checkState() == Qt.CheckState.Checked)
    return out


def _add_through_the_dialog(qtbot, panel, prompt: str, expected: str, check: str) -> list[str]:
    """Click Add example…, fill the dialog and press OK; the dialog's messages, if it refused."""
    from app.ui.ab_dialogs import ExampleDialog

    messages: list[str] = []

    def fill() -> None:
        (dialog,) = [d for d in panel.findChildren(ExampleDialog) if d.isVisible()]
        dialog.prompt.setPlainText(prompt)
        dialog.expected.setPlainText(expected)
        dialog.check.setCurrentIndex(dialog.check.findData(check))
        dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()
        if dialog.isVisible():  # refused: say why, then close it
            messages.append(dialog.message.text())
            dialog.reject()

    QTimer.singleShot(0, fill)
    panel.suites.add_example_button.click()
    return messages


def test_an_example_added_in_the_tab_is_saved_listed_ticked_and_survives_a_restart(qtbot, tmp_path):
    folder = tmp_path / "suites"
    panel = _panel(qtbot, folder)
    assert "my-examples" not in _items(panel)
    summary = "Article: The corner shop closed after 40 years because its rent doubled.\n\nSummary in one sentence:"
    expected = "The corner shop closed after forty years when its rent doubled."
    assert _add_through_the_dialog(qtbot, panel, summary, expected, "similar") == []
    saved = folder / "my-examples.yaml"
    suite = load_suite(saved)
    assert [(p.prompt, p.check.kind, p.check.references) for p in suite.prompts] == [
        (summary, "similar", (expected,))
    ]
    assert _items(panel)["my-examples"] == ("my-examples (1 prompts, yours)", True)
    assert "Added 'article-the-corner-shop-closed' to my-examples (1 prompts), saved in" in panel.status.text()
    assert suite.name in [s.name for s in panel.suites.chosen_suites()]

    # The user unticks chat; a second example keeps that choice and the list shows the new count.
    for i in range(panel.suites.suite_list.count()):
        if panel.suites.suite_list.item(i).data(Qt.ItemDataRole.UserRole).name == "chat":
            panel.suites.suite_list.item(i).setCheckState(Qt.CheckState.Unchecked)
    assert _add_through_the_dialog(qtbot, panel, "What is the capital of Peru?", "Lima", "contains") == []
    items = _items(panel)
    assert items["my-examples"] == ("my-examples (2 prompts, yours)", True)
    assert items["chat"][1] is False

    # A new tab (the app restarted) lists the saved suite, ticked, with both examples.
    again = _panel(qtbot, folder)
    assert _items(again)["my-examples"] == ("my-examples (2 prompts, yours)", True)
    chosen = {s.name: s for s in again.suites.chosen_suites()}
    assert [p.check.kind for p in chosen["my-examples"].prompts] == ["similar", "contains"]
    assert chosen["my-examples"].prompts[1].check.value == "Lima"


def test_an_example_without_an_answer_is_refused_in_the_dialog_and_nothing_is_saved(qtbot, tmp_path):
    folder = tmp_path / "suites"
    panel = _panel(qtbot, folder)
    messages = _add_through_the_dialog(qtbot, panel, "What is the capital of Peru?", "   ", "exact")
    assert messages == ["The example has no expected answer; write the answer you want."]
    assert not (folder / "my-examples.yaml").exists()
    assert "my-examples" not in _items(panel)


def test_a_broken_suite_file_of_the_user_is_named_when_the_tab_opens(qtbot, tmp_path):
    folder = tmp_path / "suites"
    folder.mkdir()
    (folder / "mine.yaml").write_text("name: mine\ntask: chat\nprompts: []\n", encoding="utf-8")
    panel = _panel(qtbot, folder)
    assert "mine" not in _items(panel)
    assert panel.status.text().startswith("Some of your suites cannot be used: mine.yaml, line 3:")
