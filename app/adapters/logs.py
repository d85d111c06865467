"""FitScope's log file, in the user's data folder: warnings and errors of the window and its
workers, kept for a bug report ("Copy diagnostics" names the file)."""

from __future__ import annotations

import logging
import logging.handlers
import sys
from pathlib import Path
from types import TracebackType

from app.adapters.paths import data_dir

_HANDLER_NAME = "fitscope-file"


def log_path() -> Path:
    return data_dir() / "logs" / "fitscope.log"


def setup_logging(level: int = logging.INFO) -> Path:
    """Log to a rotating file (1 MB x 3) and record uncaught exceptions there. Returns its path;
    a folder that cannot be written leaves logging to stderr only."""
    path = log_path()
    root = logging.getLogger()
    if any(h.get_name() == _HANDLER_NAME for h in root.handlers):
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(path, maxBytes=1_000_000, backupCount=3, encoding="utf-8")
    except OSError:
        return path
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(min(root.level or level, level))
    previous = sys.excepthook

    def log_uncaught(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        logging.getLogger("fitscope").critical("uncaught exception", exc_info=(kind, value, tb))
        previous(kind, value, tb)

    sys.excepthook = log_uncaught
    logging.getLogger("fitscope").info("FitScope started: %s", " ".join(sys.argv))
    return path
