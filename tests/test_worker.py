"""The one background pattern: results and errors come back on the GUI thread as signals, waiting
jobs coalesce to the newest, and a dead worker process is replaced."""

from __future__ import annotations

import os
import signal
import threading
import time

from app.core.common.errors import ModelFileError
from app.ui.jobs import JobRunner, process_pool


def slow_square(x: int, delay_s: float = 0.0) -> int:
    time.sleep(delay_s)
    return x * x


def pid_of_worker() -> int:
    return os.getpid()


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def test_results_arrive_on_the_gui_thread_and_waiting_jobs_coalesce(qtbot):
    runner = JobRunner("test")
    results, threads = [], []
    runner.finished.connect(lambda job, value: (results.append((job, value)), threads.append(threading.get_ident())))
    first = runner.submit(lambda: slow_square(2, 0.2))
    runner.submit(lambda: slow_square(3))
    last = runner.submit(lambda: slow_square(4))
    qtbot.waitUntil(lambda: not runner.running, timeout=5000)
    # The running job finished; of the two waiting, only the newest ran.
    assert results == [(first, 4), (last, 16)]
    assert set(threads) == {threading.get_ident()}
    runner.close()


def test_errors_arrive_as_messages(qtbot):
    runner = JobRunner("test")

    def broken_file():
        raise ModelFileError("model.gguf is truncated: 12 bytes, a GGUF header needs at least 24.")

    def bug():
        return {}["missing"]

    with qtbot.waitSignal(runner.failed, timeout=5000) as blocker:
        runner.submit(broken_file)
    assert blocker.args[1] == "model.gguf is truncated: 12 bytes, a GGUF header needs at least 24."
    with qtbot.waitSignal(runner.failed, timeout=5000) as blocker:
        runner.submit(bug)
    assert blocker.args[1].startswith("Something went wrong inside FitScope: KeyError")
    runner.close()


def test_a_killed_worker_process_is_replaced(qtbot):
    runner = JobRunner("test", make_pool=process_pool)
    with qtbot.waitSignal(runner.finished, timeout=20000) as blocker:
        runner.submit(pid_of_worker)
    first_pid = blocker.args[1]
    assert first_pid != os.getpid()
    with qtbot.waitSignal(runner.failed, timeout=20000) as blocker:
        runner.submit(die)
    assert "restarted" in blocker.args[1]
    with qtbot.waitSignal(runner.finished, timeout=20000) as blocker:
        runner.submit(pid_of_worker)
    assert blocker.args[1] not in (first_pid, os.getpid())
    runner.close()
