"""How FitScope starts its llama.cpp child processes: ``python -m MODULE`` from a source checkout,
``<bundle executable> --run-module MODULE`` from a frozen (PyInstaller) build, where ``-m`` does
not exist. ``app.cli.main`` answers ``--run-module``."""

from __future__ import annotations

import sys

RUN_MODULE_FLAG = "--run-module"


def module_command(module: str) -> list[str]:
    """The argv that runs ``module`` as ``__main__`` in a new process of this Python."""
    if getattr(sys, "frozen", False):
        return [sys.executable, RUN_MODULE_FLAG, module]
    return [sys.executable, "-m", module]
