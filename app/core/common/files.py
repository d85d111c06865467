"""Opening what a user names: only regular files, and text files of a sensible size.

A FIFO, a device or a socket named as a model, a config or a suite would block a reader forever
(or stream without end); they are refused before anything is opened.
"""

from __future__ import annotations

import stat
from pathlib import Path

from app.core.common.errors import FitScopeError

MAX_TEXT_BYTES = 16 * 1024 * 1024  # config.json files and suites are kilobytes; this is generous


def regular_file(path: Path, what: str, error: type[FitScopeError] = FitScopeError) -> Path:
    """``path`` if it is a regular file (links followed). Raises ``error`` saying what it is instead."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise error(f"FitScope cannot find the {what} {path}.") from None
    except OSError as exc:
        raise error(f"FitScope cannot open the {what} {path}: {exc.strerror or exc}.") from None
    if stat.S_ISDIR(mode):
        raise error(f"{path} is a folder, not a {what}.")
    if not stat.S_ISREG(mode):
        kind = "a pipe (FIFO)" if stat.S_ISFIFO(mode) else "a device or socket"
        raise error(f"{path} is {kind}, not a {what}; name a regular file.")
    return path


def read_text_file(path: Path, what: str, error: type[FitScopeError] = FitScopeError) -> str:
    """The text of a regular file of at most MAX_TEXT_BYTES (UTF-8, BOM allowed). Raises ``error``."""
    regular_file(path, what, error)
    try:
        size = path.stat().st_size
        if size > MAX_TEXT_BYTES:
            raise error(f"{path} is {size / 1024**2:,.0f} MiB, far too large for a {what}.")
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(f"{path} is not UTF-8 text (byte {exc.start}), so it cannot be a {what}.") from None
    except OSError as exc:
        raise error(f"FitScope cannot read the {what} {path}: {exc.strerror or exc}.") from None
