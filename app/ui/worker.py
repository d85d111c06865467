"""One way to run work off the GUI thread: a plain function submitted to a one-thread pool, its
result or its error delivered back on the GUI thread as a signal.

Requests coalesce: while one job runs, only the newest waiting job is kept (dragging a slider
queues one estimate, not fifty). Exceptions never cross threads as exceptions; they arrive as
``failed(job_id, message)`` with a sentence a person can act on.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from concurrent.futures.thread import BrokenThreadPool
from functools import partial
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal, Slot

from app.core.errors import FitScopeError

_log = logging.getLogger(__name__)
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


class TaskRunner(QObject):
    """Runs one job at a time on a worker (a thread, or a process from ``make_pool``); the newest
    waiting job replaces older ones. A process job must be picklable (a module-level function, or a
    functools.partial of one)."""

    finished = Signal(int, object)  # job id, result
    failed = Signal(int, str)  # job id, message
    # Crosses from the worker thread carrying only the job id: Python objects in queued
    # cross-thread signals are not safe in every PySide6 release; the future waits in _running.
    _completed = Signal(int)

    def __init__(
        self, name: str, parent: QObject | None = None, make_pool: Callable[[], Executor] | None = None
    ) -> None:
        super().__init__(parent)
        self._make_pool = make_pool or (lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix=name))
        self._pool = self._make_pool()
        self._next_id = 0
        self._pending: tuple[int, Callable[[], Any]] | None = None
        self._busy = False
        self._closed = False
        self._running: dict[int, Future] = {}
        # Queued even when the job finished before its callback was attached (the callback then runs
        # on this thread): results always arrive after submit() has returned.
        self._completed.connect(self._on_completed, Qt.ConnectionType.QueuedConnection)
        self._tags: dict[int, Any] = {}

    def tag_of(self, job_id: int) -> Any:
        return self._tags.get(job_id)

    @property
    def busy(self) -> bool:
        return self._busy or self._pending is not None

    def submit(self, job: Callable[[], Any], tag: Any = None) -> int:
        """Queue ``job``; returns its id (ids grow, so the newest result is the largest id). ``tag``
        is kept with the job for :meth:`tag_of` until its result has been delivered."""
        self._next_id += 1
        if self._pending is not None:
            self._tags.pop(self._pending[0], None)  # replaced before it ran
        self._tags[self._next_id] = tag
        self._pending = (self._next_id, job)
        if not self._busy:
            self._start_pending()
        return self._next_id

    def _start_pending(self) -> None:
        if self._pending is None or self._closed:
            return
        job_id, job = self._pending
        self._pending = None
        self._busy = True
        try:
            future = self._pool.submit(job)
        except BrokenExecutor:
            # The worker process died (killed, out of memory): start a new one and carry on.
            self._pool = self._make_pool()
            future = self._pool.submit(job)
        self._running[job_id] = future
        future.add_done_callback(partial(self._notify, job_id))

    def _notify(self, job_id: int, _future: Future) -> None:
        """Called on the worker's thread: hand the job id over to the GUI thread."""
        self._completed.emit(job_id)

    @Slot(int)
    def _on_completed(self, job_id: int) -> None:
        future = self._running.pop(job_id)
        self._busy = False
        if not self._closed:
            exc = future.exception()
            if isinstance(exc, BrokenExecutor):
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = self._make_pool()
                self.failed.emit(job_id, "The estimate worker stopped unexpectedly; it has been restarted.")
            elif exc is None:
                self.finished.emit(job_id, future.result())
            else:
                if not isinstance(exc, FitScopeError):
                    _log.error("job failed", exc_info=exc)
                self.failed.emit(job_id, error_message(exc))
        self._tags.pop(job_id, None)
        self._start_pending()

    def close(self) -> None:
        """Drop waiting jobs and wait for the running one (estimates take milliseconds)."""
        self._closed = True
        self._pending = None
        self._pool.shutdown(wait=True, cancel_futures=True)
