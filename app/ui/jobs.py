"""One way for a tab to run a long job (a live run, a comparison, a measurement) off the GUI thread.

The job is a plain function ``work(report)`` run on a worker thread; it calls ``report(kind,
payload)`` for progress (tokens, fractions, events) and returns its result. On the GUI thread the
runner delivers, every 100 ms and in order, what was reported (``progressed``), a ``ticked`` so the
tab can sample live figures, and at the end exactly one of ``finished(result)`` or
``failed(message)``. Any exception becomes a message a person can read (``worker.error_message``):
a tab never stays "busy" because a job died.

(The window's estimates, which coalesce and run in a process, use ``worker.TaskRunner``.)
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from app.ui.worker import error_message

_log = logging.getLogger(__name__)
Report = Callable[[str, Any], None]
_DONE, _FAILED = object(), object()


class JobRunner(QObject):
    """Runs one job at a time for one tab. ``start`` returns False while a job is running."""

    progressed = Signal(str, object)  # kind, payload: what the job reported, in order
    ticked = Signal()  # every interval while a job runs (after the progress of that interval)
    finished = Signal(object)  # the job's return value
    failed = Signal(str)  # a message for the user
    running_changed = Signal(bool)

    def __init__(self, name: str, parent: QObject | None = None, interval_ms: int = 100) -> None:
        super().__init__(parent)
        self._name = name
        self._events: queue.Queue[tuple[object, Any]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._timer = QTimer(self, interval=interval_ms)
        self._timer.timeout.connect(self._drain)

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self, work: Callable[[Report], Any]) -> bool:
        if self.running:
            return False
        events: queue.Queue[tuple[object, Any]] = queue.Queue()
        self._events = events

        def report(kind: str, payload: Any = None) -> None:
            events.put((kind, payload))

        def run() -> None:
            try:
                result = work(report)
            except BaseException as exc:  # the tab must hear of every ending
                if not isinstance(exc, Exception):
                    _log.warning("job %s interrupted: %r", self._name, exc)
                elif not type(exc).__module__.startswith("app."):
                    _log.exception("job %s failed", self._name)
                events.put((_FAILED, error_message(exc)))
            else:
                events.put((_DONE, result))

        self._thread = threading.Thread(target=run, name=f"fitscope-{self._name}", daemon=True)
        self._thread.start()
        self._timer.start()
        self.running_changed.emit(True)
        return True

    def join(self, timeout: float | None = None) -> None:
        """Waits for the worker thread (the window is closing); nothing more is delivered."""
        thread = self._thread
        self._timer.stop()
        if thread is not None:
            thread.join(timeout)

    def _drain(self) -> None:
        ending: tuple[object, Any] | None = None
        while True:
            try:
                kind, payload = self._events.get_nowait()
            except queue.Empty:
                break
            if kind is _DONE or kind is _FAILED:
                ending = (kind, payload)
                break
            self.progressed.emit(kind, payload)
        self.ticked.emit()
        if ending is None:
            return
        self._timer.stop()
        self._thread = None
        self.running_changed.emit(False)
        kind, payload = ending
        if kind is _DONE:
            self.finished.emit(payload)
        else:
            self.failed.emit(payload)
