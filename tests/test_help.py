"""First run and help: the walk-through shows once and comes back from Help, About gives the
versions, diagnostics hold what a bug report needs, and the log file is written."""

from __future__ import annotations

import logging
from importlib import metadata

from PySide6.QtCore import qVersion
from PySide6.QtGui import QGuiApplication
from test_window import make_services, open_window

from app.adapters.logs import setup_logging
from app.core.report.prefs import load_preferences


def test_walkthrough_shows_on_first_start_only_and_reopens_from_help(qtbot, tmp_path):
    services = make_services(tmp_path)
    services.first_run_guide = True
    window = open_window(qtbot, services)
    qtbot.waitUntil(lambda: window.walkthrough is not None and window.walkthrough.isVisible(), timeout=5000)
    guide = window.walkthrough
    assert "1. Your hardware" in guide.stack.currentWidget().text()
    assert "no GPU, so the CPU" in guide.stack.currentWidget().text()
    guide.next.click()
    guide.next.click()
    assert "3. Press Run" in guide.stack.currentWidget().text() and guide.done_button.isVisible()
    guide.done_button.click()
    window.close()
    assert load_preferences(services.prefs_path)[0].walkthrough_seen
    again = open_window(qtbot, services)
    assert again.walkthrough is None  # not shown a second time
    help_menu = next(a.menu() for a in again.menuBar().actions() if a.text() == "&Help")
    next(a for a in help_menu.actions() if a.text() == "&Getting started").trigger()
    assert again.walkthrough is not None and again.walkthrough.isVisible()


def test_about_and_diagnostics_name_the_versions_and_the_hardware(qtbot, tmp_path):
    window = open_window(qtbot, make_services(tmp_path))
    window.show_error("example.gguf is truncated")
    text = window.copy_diagnostics()
    assert QGuiApplication.clipboard().text() == text
    assert f"llama-cpp-python: {metadata.version('llama-cpp-python')}" in text
    assert f"Qt: {qVersion()}" in text and "GPU driver: no GPU found" in text
    assert f"CPU: {window.machine.host.cpu_model}" in text
    assert "Last error: example.gguf is truncated" in text
    assert "Verdict: Fits" in text
    from app.ui.help import AboutDialog

    about = AboutDialog(window.machine, window)
    qtbot.addWidget(about)
    assert metadata.version("llama-cpp-python") in about.label.text()


def test_the_log_file_records_warnings(tmp_path, monkeypatch):
    monkeypatch.setenv("FITSCOPE_DATA_DIR", str(tmp_path))
    import sys

    root = logging.getLogger()
    before = list(root.handlers)
    hook = sys.excepthook
    try:
        path = setup_logging()
        logging.getLogger("fitscope.test").warning("a warning a user would send us")
        for h in root.handlers:
            h.flush()
        assert path == tmp_path / "logs" / "fitscope.log"
        assert "a warning a user would send us" in path.read_text()
    finally:
        sys.excepthook = hook
        for h in list(root.handlers):
            if h not in before:
                root.removeHandler(h)
                h.close()


def test_architectures_page_lists_what_is_exact_and_what_is_approximate(qtbot, tmp_path):
    from app.core.model.coverage import PROVEN
    from app.ui.help import TextDialog

    window = open_window(qtbot, make_services(tmp_path))
    menu = next(a.menu() for a in window.menuBar().actions() if a.text() == "&Help")
    action = next(a for a in menu.actions() if a.text() == "Model a&rchitectures")
    action.trigger()
    dialog = next(w for w in window.findChildren(TextDialog) if w.windowTitle() == "Model architectures")
    text = dialog.text.toPlainText()
    assert f"For {len(PROVEN)} of them FitScope's memory rules are exact" in text
    assert "minimax-m2" in text and "falcon-h1" in text  # one proven, one approximate
    assert "loads 152 model architectures" in text
    window.close()
