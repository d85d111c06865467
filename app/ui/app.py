"""Start the window: the QApplication, the real services (the GPU drivers, host, demo model), the saved settings."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pyqtgraph as pg
from PySide6.QtCore import QTimer
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from app.adapters.demo_model import demo_model_path
from app.adapters.gpus import default_detector
from app.adapters.host import detect_host
from app.adapters.logs import setup_logging
from app.adapters.paths import preferences_path
from app.core.common.errors import FitScopeError
from app.core.model.catalog import RESOURCES_DIR
from app.core.report.choices import ModelChoice
from app.core.report.prefs import load_preferences
from app.ui.window import MainWindow, Services


def real_services(prefs_path: Path | None = None) -> Services:
    detector = default_detector()
    return Services(
        gpu_status=detector.status,
        detect_host=lambda measure: detect_host(measure_bandwidth=measure),
        demo_path=demo_model_path,
        prefs_path=prefs_path or preferences_path(),
    )


def create_window(services: Services, open_path: str | None = None, model: ModelChoice | None = None) -> MainWindow:
    # Estimates run on a worker thread in pure Python. Every Qt callback on the GUI thread must take
    # the GIL back from it, waiting up to the switch interval each time (5 ms by default); at 1 ms
    # the window stays responsive while the worker loses little.
    sys.setswitchinterval(0.001)
    pg.setConfigOptions(antialias=True)
    prefs, note = load_preferences(services.prefs_path)
    if model is not None:
        prefs = prefs.model_copy(update={"model": model})
    window = MainWindow(services, prefs, note)
    if open_path:
        window.open_path(open_path)
    return window


# Shared libraries Qt's xcb (X11) platform plugin loads, and the Debian/Ubuntu packages that hold them.
XCB_LIBRARIES: dict[str, str] = {
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
}


def _loadable(library: str) -> bool:
    try:
        ctypes.CDLL(library)
    except OSError:
        return False
    return True


def missing_xcb_packages(loadable: Callable[[str], bool] = _loadable) -> list[str]:
    """The packages whose libraries Qt's X11 plugin would fail to load (empty when all are there)."""
    return [package for library, package in XCB_LIBRARIES.items() if not loadable(library)]


def display_problem(loadable: Callable[[str], bool] = _loadable) -> str | None:
    """Why no window can open here (a Linux session without a display, or without the libraries
    Qt's X11 plugin needs), or None."""
    platform_name = os.environ.get("QT_QPA_PLATFORM", "")
    if sys.platform.startswith("linux") and not platform_name:
        if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
            return (
                "No display found (DISPLAY and WAYLAND_DISPLAY are unset), so the window cannot open. "
                "Run FitScope in a desktop session, or use the terminal commands (`fitscope estimate --help`), "
                "or start it under a virtual display: xvfb-run fitscope."
            )
        if os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
            missing = missing_xcb_packages(loadable)
            if missing:
                return (
                    "The window needs system libraries that are not installed (Qt's X11 support). "
                    f"Install them with: sudo apt-get install {' '.join(missing)}"
                )
    return None


def run_window(argv: Sequence[str] | None = None, open_path: str | None = None, demo: bool = False) -> int:
    """Open the window and run until it closes. Returns the exit code. Raises FitScopeError when no
    window can open."""
    problem = display_problem()
    if problem:
        raise FitScopeError(problem)
    setup_logging()
    existing = QApplication.instance()
    app = existing if isinstance(existing, QApplication) else QApplication(list(argv or sys.argv[:1]))
    app.setApplicationName("FitScope")
    app.setOrganizationName("FitScope")
    icon = RESOURCES_DIR / "icons" / "fitscope.svg"
    if icon.exists():
        app.setWindowIcon(QIcon(str(icon)))
    window = create_window(real_services(), open_path, ModelChoice() if demo else None)
    close_on_signals(window)
    window.show()
    if os.environ.get("FITSCOPE_REPORT_STARTUP"):
        _report_startup(app, window)
    return app.exec()


def close_on_signals(window: MainWindow) -> QTimer:
    """SIGTERM (a logout, ``kill``, a session manager) and SIGINT close the window as its close
    button does: workers and llama.cpp children end, settings are saved. Python runs signal handlers
    only between bytecodes, so a light timer gives it the chance while Qt waits for events."""

    def close(_signum: int, _frame: object) -> None:
        QTimer.singleShot(0, window.close)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, close)
    tick = QTimer(window)
    tick.setInterval(200)
    tick.timeout.connect(lambda: None)
    tick.start()
    return tick


def _report_startup(app: QApplication, window: MainWindow) -> None:
    """For scripts/bench_startup.py: print when the window was shown and when its first estimate
    was on screen (seconds since the process started), then quit."""
    import psutil

    started = psutil.Process().create_time()
    shown = time.time() - started

    def first_view(_view: object) -> None:
        print(
            f"startup: window shown {shown:.3f} s, first estimate on screen {time.time() - started:.3f} s", flush=True
        )
        window.close()
        app.quit()

    window.view_changed.connect(first_view)
