"""The main window's menu bar: File (open a GGUF, from the Hugging Face Hub or Ollama's library, import
a config.json, the exports, copy the llama.cpp command, quit), View (presentation mode, full screen,
search the models) and Help (the three-step guide, how the estimate works, the glossary, the model
architectures, copy diagnostics, about). Each entry calls one of the window's public actions or opens a help dialog.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QMenu

from app.ui.help import HOW_IT_WORKS, AboutDialog, TextDialog, architectures_html, glossary_html
from app.ui.remote_dialog import open_remote_dialog

if TYPE_CHECKING:
    from app.ui.window import MainWindow


def build_menus(window: MainWindow) -> QAction:
    """Fill ``window``'s menu bar. Returns the View menu's checkable presentation mode action."""

    def action(
        menu: QMenu,
        text: str,
        slot: Callable[..., object],
        shortcut: QKeySequence | QKeySequence.StandardKey | str | None = None,
        checkable: bool = False,
    ) -> QAction:
        act = QAction(text, window)
        if shortcut is not None:
            act.setShortcut(QKeySequence(shortcut))
        act.setCheckable(checkable)
        act.triggered.connect(slot)
        menu.addAction(act)
        return act

    def text_dialog(title: str, text: Callable[[], str]) -> Callable[[], None]:
        return lambda: TextDialog(title, text(), window).open()

    def toggle_full_screen() -> None:
        window.showNormal() if window.isFullScreen() else window.showFullScreen()

    menu_bar = window.menuBar()
    file_menu = menu_bar.addMenu("&File")
    action(file_menu, "&Open GGUF…", window.open_gguf_dialog, QKeySequence.StandardKey.Open)
    action(file_menu, "Open from &Hugging Face…", lambda: open_remote_dialog(window, "hf"), "Ctrl+Shift+O")
    action(file_menu, "Open from O&llama…", lambda: open_remote_dialog(window, "ollama"))
    action(file_menu, "&Import config.json…", window.import_config_dialog, "Ctrl+I")
    file_menu.addSeparator()
    action(file_menu, "&Export report (HTML)…", lambda: window.export_dialog("html"), "Ctrl+E")
    action(file_menu, "Export charts as &PNG…", lambda: window.export_dialog("png"), "Ctrl+Shift+E")
    action(file_menu, "Export estimate as &JSON…", lambda: window.export_dialog("json"))
    action(file_menu, "Export estimate as &CSV…", lambda: window.export_dialog("csv"))
    action(file_menu, "Copy llama.cpp &command", window.copy_command, "Ctrl+Shift+C")
    file_menu.addSeparator()
    action(file_menu, "&Quit", window.close, QKeySequence.StandardKey.Quit)
    view_menu = menu_bar.addMenu("&View")
    presentation = action(view_menu, "&Presentation mode", window.set_presentation, "F5", checkable=True)
    action(view_menu, "&Full screen", toggle_full_screen, QKeySequence.StandardKey.FullScreen)
    action(view_menu, "Search &models", window.controls.focus_search, QKeySequence.StandardKey.Find)
    help_menu = menu_bar.addMenu("&Help")
    action(help_menu, "&Getting started", window.show_walkthrough)
    how = text_dialog("How the estimate works", lambda: HOW_IT_WORKS)
    action(help_menu, "&How the estimate works", how, QKeySequence.StandardKey.HelpContents)
    action(help_menu, "&Glossary", text_dialog("Glossary", glossary_html))
    action(help_menu, "Model a&rchitectures", text_dialog("Model architectures", architectures_html))
    action(help_menu, "Copy &diagnostics", window.copy_diagnostics)
    help_menu.addSeparator()
    action(help_menu, "&About FitScope", lambda: AboutDialog(window.machine, window).open())
    return presentation
