"""``fitscope window`` (and ``fitscope`` alone): the desktop window, when PySide6 and pyqtgraph
are installed; the other commands work without them.
"""

from __future__ import annotations

import argparse

from app.core.common.errors import FitScopeError


def cmd_window(args: argparse.Namespace) -> int:
    try:
        from app.ui.app import run_window
    except ImportError as exc:
        raise FitScopeError(
            f"The window needs PySide6 and pyqtgraph ({exc}); the other commands work without them."
        ) from exc
    return run_window(open_path=args.path, demo=args.demo)
