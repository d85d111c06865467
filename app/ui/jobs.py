"""The one way the window runs work off the GUI thread.

A ``JobRunner`` runs one job at a time on its worker: a thread, or a process from ``make_pool`` for
pure-Python number crunching. Two ways in:

- ``start(work)``: a long job (a live run, a comparison, a measurement). ``work(report)`` calls
  ``report(kind, payload)`` for progress; every 100 ms the runner delivers what was reported, in
  order (``progressed``), then ``ticked`` so the tab can sample live figures. Refused (returns 0)
  while a job runs.
- ``submit(job)``: a request whose newest version is all that matters (an estimate while a slider
  moves): while one runs, only the newest waiting request is kept.

Every job ends on the GUI thread with exactly one of ``finished(job_id, result)`` or
``failed(job_id, message)``, after the last of its progress. Any exception becomes a sentence a
person can act on (``error_message``): a tab never stays "busy" because a job died, and a worker
process that died is replaced.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import queue
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from concurrent.futures.process import BrokenProcessPool
from concurrent.futures.thread import BrokenThreadPool
from functools import partial
from typing import Any

from PySide6.QtCore import QObject, Qt, QTimer, Signal, Slot

from app.core.common.errors import FitScopeError

_log = logging.getLogger(__name__)
Report = Callable[[str, Any], None]
BrokenExecutor = (BrokenProcessPool, BrokenThreadPool)


def process_pool() -> Executor:
    """A one-process pool for pure-Python number crunching. In a thread it would hold the GIL the
    GUI thread needs for every paint, and the window would stutter while a big model is set up."""
    return ProcessPoolExecutor(
        max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=_yield_to_the_window
    )


def _yield_to_the_window() -> None:
    """Runs in the worker process: a lower CPU priority, so that on a machine with few cores the
    window's painting comes first."""
    with contextlib.suppress(AttributeError, OSError):
        os.nice(5)


def error_message(exc: BaseException) -> str:
    """What to tell the user about an exception from a job."""
    if isinstance(exc, FitScopeError):
        return str(exc)
    if isinstance(exc, MemoryError):
        return "FitScope ran out of memory while working this out."
    return f"Something went wrong inside FitScope: {type(exc).__name__}: {exc}"


class JobRunner(QObject):
    """One tab's (or one kind of request's) worker: one job at a time, results on the GUI thread."""

    progressed = Signal(str, object)  # kind, payload: what a started job reported, in order
    ticked = Signal()  # every interval while a started job runs (after that interval's progress)
    finished = Signal(int, object)  # job id, the job's return value
    failed = Signal(int, str)  # job id, a message for the user
    running_changed = Signal(bool)
    # Crosses from the worker thread carrying only the job id: Python objects in queued
    # cross-thread signals are not safe in every PySide6 release; the future waits in _running.
    _completed = Signal(int)

    def __init__(
        self,
        name: str,
        parent: QObject | None = None,
        make_pool: Callable[[], Executor] | None = None,
        interval_ms: int = 100,
    ) -> None:
        super().__init__(parent)
        self._name = name
        self._make_pool = make_pool or partial(ThreadPoolExecutor, max_workers=1, thread_name_prefix=f"fitscope-{name}")
        self._pool = self._make_pool()
        self._next_id = 0
        self._pending: tuple[int, Callable[[], Any]] | None = None
        self._running: dict[int, Future] = {}
        self._tags: dict[int, Any] = {}
        self._closed = False
        self._events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._timer = QTimer(self, interval=interval_ms)
        self._timer.timeout.connect(self._drain)
        # Queued even when the job finished before its callback was attached (the callback then runs
        # on this thread): results always arrive after start()/submit() has returned.
        self._completed.connect(self._on_completed, Qt.ConnectionType.QueuedConnection)

    @property
    def running(self) -> bool:
        """A job is running or waiting."""
        return bool(self._running) or self._pending is not None

    def tag_of(self, job_id: int) -> Any:
        """What ``submit`` or ``start`` kept with the job, until its ending has been delivered."""
        return self._tags.get(job_id)

    def start(self, work: Callable[[Report], Any], tag: Any = None) -> int:
        """Run ``work(report)`` now; its id, or 0 (refused) while another job runs or waits."""
        if self.running or self._closed:
            return 0
        job_id = self._new_id(tag)
        self._launch(job_id, partial(work, self._report))
        self._timer.start()
        return job_id

    def submit(self, job: Callable[[], Any], tag: Any = None) -> int:
        """Queue ``job`` (picklable for a process pool: a module-level function or a partial of one);
        returns its id. Ids grow, so the newest result has the largest id. A job still waiting when
        a newer one arrives never runs."""
        job_id = self._new_id(tag)
        if self._pending is not None:
            self._tags.pop(self._pending[0], None)  # replaced before it ran
        self._pending = (job_id, job)
        if not self._running:
            self._start_pending()
        return job_id

    def close(self, timeout: float | None = None) -> None:
        """The window is closing: drop waiting jobs, deliver nothing more, wait up to ``timeout``
        seconds (None: as long as it takes) for the running one."""
        self._closed = True
        self._pending = None
        self._timer.stop()
        running = list(self._running.values())
        self._pool.shutdown(wait=False, cancel_futures=True)
        if running:
            wait_for(running, timeout=timeout)

    # -- inside ---------------------------------------------------------------------------------

    def _new_id(self, tag: Any) -> int:
        self._next_id += 1
        self._tags[self._next_id] = tag
        return self._next_id

    def _report(self, kind: str, payload: Any = None) -> None:
        """Called on the worker's thread by a started job."""
        self._events.put((kind, payload))

    def _launch(self, job_id: int, job: Callable[[], Any]) -> None:
        was_idle = not self._running
        try:
            future = self._pool.submit(job)
        except BrokenExecutor:
            # The worker process died (killed, out of memory): start a new one and carry on.
            self._pool = self._make_pool()
            future = self._pool.submit(job)
        self._running[job_id] = future
        if was_idle:
            self.running_changed.emit(True)
        future.add_done_callback(partial(self._notify, job_id))

    def _start_pending(self) -> None:
        if self._pending is None or self._closed:
            return
        job_id, job = self._pending
        self._pending = None
        self._launch(job_id, job)

    def _notify(self, job_id: int, _future: Future) -> None:
        """Called on the worker's thread: hand the job id over to the GUI thread."""
        # A job that outlives its window (closed without waiting) has nobody left to tell.
        with contextlib.suppress(RuntimeError):
            self._completed.emit(job_id)

    def _drain(self) -> None:
        while True:
            try:
                kind, payload = self._events.get_nowait()
            except queue.Empty:
                break
            self.progressed.emit(kind, payload)
        self.ticked.emit()

    @Slot(int)
    def _on_completed(self, job_id: int) -> None:
        future = self._running.pop(job_id, None)
        if future is None or self._closed:
            self._tags.pop(job_id, None)
            return
        if self._timer.isActive():
            self._timer.stop()
            self._drain()  # the last of its progress comes before its ending
        exc = future.exception()
        if isinstance(exc, BrokenExecutor):
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = self._make_pool()
            message = f"The {self._name} worker stopped unexpectedly; it has been restarted."
        elif exc is not None:
            if not isinstance(exc, Exception):
                _log.warning("job %s interrupted: %r", self._name, exc)
            elif not isinstance(exc, FitScopeError):
                _log.error("job %s failed", self._name, exc_info=exc)
            message = error_message(exc)
        if self._pending is None:
            self.running_changed.emit(False)
        if exc is None:
            self.finished.emit(job_id, future.result())
        else:
            self.failed.emit(job_id, message)
        self._tags.pop(job_id, None)
        self._start_pending()
