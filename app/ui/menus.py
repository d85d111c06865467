"""The main window's menu bar: File (open a GGUF, from the Hugging Face Hub or Ollama's library, import
a config.json, the exports, copy the llama.cpp command, quit), View (presentation mode, full screen,
search the models) and Help (the three-step guide, how the estimate works, the glossary, the model
architectures, copy diagnostics, about). Each entry calls one of the actions the window hands over
(:class:`MenuActions`) or opens a help dialog; the menus know nothing else of the window.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QMainWindow, QMenu

from app.core.report.choices import Machine
from app.ui.help import HOW_IT_WORKS, AboutDialog, TextDialog, architectures_html, glossary_html


@dataclass(frozen=True)
class MenuActions:
    """What the menus can ask the window to do."""

    open_gguf: Callable[[], object]
    open_remote: Callable[[str], object]  # "hf" or "ollama"
    import_config: Callable[[], object]
    export: Callable[[str], object]  # "html", "png", "json" or "csv"
    copy_command: Callable[[], object]
    set_presentation: Callable[[bool], object]
    focus_search: Callable[[], object]
    show_walkthrough: Callable[[], object]
    copy_diagnostics: Callable[[], object]
    machine: Callable[[], Machine]  # for the About box


def build_menus(window: QMainWindow, actions: MenuActions) -> QAction:
    """Fill ``window``'s menu bar with ``actions``. Returns the View menu's checkable presentation
    mode action."""

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
    action(file_menu, "&Open GGUF…", actions.open_gguf, QKeySequence.StandardKey.Open)
    action(file_menu, "Open from &Hugging Face…", lambda: actions.open_remote("hf"), "Ctrl+Shift+O")
    action(file_menu, "Open from O&llama…", lambda: actions.open_remote("ollama"))
    action(file_menu, "&Import config.json…", actions.import_config, "Ctrl+I")
    file_menu.addSeparator()
    action(file_menu, "&Export report (HTML)…", lambda: actions.export("html"), "Ctrl+E")
    action(file_menu, "Export charts as &PNG…", lambda: actions.export("png"), "Ctrl+Shift+E")
    action(file_menu, "Export estimate as &JSON…", lambda: actions.export("json"))
    action(file_menu, "Export estimate as &CSV…", lambda: actions.export("csv"))
    action(file_menu, "Copy llama.cpp &command", actions.copy_command, "Ctrl+Shift+C")
    file_menu.addSeparator()
    action(file_menu, "&Quit", window.close, QKeySequence.StandardKey.Quit)
    view_menu = menu_bar.addMenu("&View")
    presentation = action(view_menu, "&Presentation mode", actions.set_presentation, "F5", checkable=True)
    action(view_menu, "&Full screen", toggle_full_screen, QKeySequence.StandardKey.FullScreen)
    action(view_menu, "Search &models", actions.focus_search, QKeySequence.StandardKey.Find)
    help_menu = menu_bar.addMenu("&Help")
    action(help_menu, "&Getting started", actions.show_walkthrough)
    how = text_dialog("How the estimate works", lambda: HOW_IT_WORKS)
    action(help_menu, "&How the estimate works", how, QKeySequence.StandardKey.HelpContents)
    action(help_menu, "&Glossary", text_dialog("Glossary", glossary_html))
    action(help_menu, "Model a&rchitectures", text_dialog("Model architectures", architectures_html))
    action(help_menu, "Copy &diagnostics", actions.copy_diagnostics)
    help_menu.addSeparator()
    action(help_menu, "&About FitScope", lambda: AboutDialog(actions.machine(), window).open())
    return presentation
