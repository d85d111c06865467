"""One process at a time: an advisory lock on a file beside what is being changed.

Two ``fitscope suites --add`` at once would each read the examples file, append their example and
write it back: the second write drops the first's example. Read, change and write are done under
:func:`file_lock`, which waits for the other process (up to a limit) instead. The lock is the
operating system's (``flock`` on Linux and macOS, ``msvcrt.locking`` on Windows), so it is
released when its holder exits, however it exits.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from app.core.common.errors import FitScopeError

LOCK_WAIT_S = 10.0
_POLL_S = 0.05


def _try_lock(fd: int) -> bool:
    if sys.platform == "win32":
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # type: ignore[attr-defined]
        except OSError:
            return False
        return True
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _unlock(fd: int) -> None:
    if sys.platform == "win32":
        import msvcrt

        with contextlib.suppress(OSError):
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)  # type: ignore[attr-defined]
        return
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_UN)


@contextlib.contextmanager
def file_lock(path: Path, what: str, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if needed) for the block; ``what`` names the
    guarded thing in the message. Raises FitScopeError when another process holds it for longer
    than ``wait_s`` seconds, or the lock file cannot be made."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise FitScopeError(f"Cannot lock {what} ({path}: {exc.strerror or exc}).") from None
    try:
        deadline = time.monotonic() + wait_s
        while not _try_lock(fd):
            if time.monotonic() > deadline:
                raise FitScopeError(f"Another FitScope has been changing {what} for over {wait_s:g} s; try again.")
            time.sleep(_POLL_S)
        try:
            yield
        finally:
            _unlock(fd)
    finally:
        os.close(fd)
