"""How FitScope starts its llama.cpp child processes: ``python -m MODULE`` from a source checkout,
``<bundle executable> --run-module MODULE`` from a frozen (PyInstaller) build, where ``-m`` does
not exist. ``app.cli.main`` answers ``--run-module``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

RUN_MODULE_FLAG = "--run-module"
_REPO_ROOT = Path(__file__).resolve().parents[2]


def module_command(module: str) -> list[str]:
    """The argv that runs ``module`` as ``__main__`` in a new process of this Python. ``-P``: the
    working folder is not put on the import path (a folder of the user's own named ``app`` must not
    stand in for FitScope's); FitScope is found through ``PYTHONPATH`` (``child_env``)."""
    if getattr(sys, "frozen", False):
        return [sys.executable, RUN_MODULE_FLAG, module]
    return [sys.executable, "-P", "-m", module]


def child_env() -> dict[str, str]:
    """This process's environment with FitScope's source on ``PYTHONPATH``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(_REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def start_child(module: str, args: Sequence[str] = ()) -> subprocess.Popen[str]:
    """Start ``module`` (with command-line ``args``) in a new process with pipes for stdin, stdout
    and stderr (text, line buffered): the shape every llama.cpp worker of FitScope uses
    (:class:`app.adapters.child_protocol.WorkerProcess` drives it). The child works in this
    process's folder, so a model path relative to it means the same file to both."""
    env = child_env()
    return subprocess.Popen(
        [*module_command(module), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
        errors="replace",
        bufsize=1,
        env=env,
    )
