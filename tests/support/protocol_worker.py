"""A worker child that speaks FitScope's child protocol without llama.cpp, for the protocol's tests:
``python -m tests.support.protocol_worker`` behaves as its :class:`Script` says, so that a death, a
hang or a stop can be had on demand."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Literal

from app.adapters.child_protocol import ChildChannel, Done, Loaded, Progress, serve_child
from app.core.common.units import Frozen

MODULE = "tests.support.protocol_worker"
ASSERT_LINE = "GGML_ASSERT(n_tokens_all <= cparams.n_batch) failed"


class Script(Frozen):
    """finish: Loaded, ``steps`` Progress, Done. abort: Loaded, one Progress, then llama.cpp's
    assertion on stderr and SIGABRT. until_stop: Progress every 20 ms until asked to stop.
    ignore_stop: Loaded, then sleep through any stop. hang_before_loading: sleep before Loaded."""

    behaviour: Literal["finish", "abort", "until_stop", "ignore_stop", "hang_before_loading"]
    steps: int = 3


def _run(child: ChildChannel, script: Script) -> int:
    if script.behaviour == "hang_before_loading":
        time.sleep(600)
    child.emit(Loaded())
    if script.behaviour == "finish":
        for i in range(script.steps):
            child.emit(Progress(done=i + 1, total=script.steps))
        child.emit(Done())
    elif script.behaviour == "abort":
        child.emit(Progress(done=1, total=script.steps))
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file for this test
        except (ImportError, ValueError, OSError):
            pass
        sys.stderr.write(ASSERT_LINE + "\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGABRT)
        time.sleep(10)
    elif script.behaviour == "until_stop":
        done = 0
        while not child.stop_requested:
            done += 1
            child.emit(Progress(done=done, total=0))
            time.sleep(0.02)
    elif script.behaviour == "ignore_stop":
        time.sleep(600)
    return 0


if __name__ == "__main__":
    sys.exit(serve_child(Script, _run))
