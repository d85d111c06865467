"""The ``fitscope`` command: estimates, catalogs, detected hardware, live runs, quantization A/B
comparisons and planning from the terminal (``fitscope`` alone opens the window).

This package holds what every command shares: ``main`` (the dispatch, one-line errors, exit codes),
the range checks every number option gets, signal handling and the ``--run-module`` entry of frozen
builds. The arguments are in ``app.cli.parser``; each command lives in the module of its family and
is imported only when it runs, so that ``fitscope --help`` and a catalog ``estimate`` start quickly:

- ``estimate``: estimate, demo;
- ``listings``: models, architectures, gpus, hw;
- ``runs``: run (also across RPC servers), bench;
- ``compare``: compare, suites, quantize;
- ``planning``: plan, advise, load;
- ``window``: window.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import NoReturn

from app.core.common.errors import FitScopeError

# The module (under app.cli) of each command; its function is cmd_<command>.
COMMAND_MODULES = {
    "estimate": "estimate",
    "demo": "estimate",
    "models": "listings",
    "architectures": "listings",
    "gpus": "listings",
    "hw": "listings",
    "run": "runs",
    "bench": "runs",
    "compare": "compare",
    "suites": "compare",
    "quantize": "compare",
    "plan": "planning",
    "advise": "planning",
    "load": "planning",
    "window": "window",
}


def _command(name: str) -> Callable[[argparse.Namespace], int]:
    """The function of command ``name``, its module imported now."""
    module = importlib.import_module(f"app.cli.{COMMAND_MODULES[name]}")
    return getattr(module, f"cmd_{name}")


def _run_module(module: str, rest: list[str]) -> int:
    """A frozen build's stand-in for ``python -m MODULE`` (see app.adapters.child)."""
    import runpy

    if not module.startswith("app.adapters."):
        print(f"fitscope: --run-module only runs FitScope's own workers, not {module!r}", file=sys.stderr)
        return 2
    sys.argv = [module, *rest]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0
    return 0


# -- input hygiene ---------------------------------------------------------------------------------

_NON_NEGATIVE = {"depth", "n_cpu_moe", "fit_target", "think", "temp"}
_MINUS_ONE_OK = {"n_gpu_layers"}  # -1: every layer
_INT_MAX = 1 << 31
_FLOAT_MAX = 1e9


def _bounded(kind: type, dest: str):
    """An argparse type that accepts only finite numbers in the range the option means."""
    low = -1 if dest in _MINUS_ONE_OK else 0 if dest in _NON_NEGATIVE else 1

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{clean_message(text, 40)!r} is not a {'whole number' if kind is int else 'number'}"
            ) from None
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        limit = _INT_MAX if kind is int else _FLOAT_MAX
        if kind is float and low == 1:
            if not 0 < value <= limit:
                raise argparse.ArgumentTypeError(f"{value:g} must be above 0 and at most {limit:g}")
        elif not low <= value <= limit:
            shown = f"{value:,}" if kind is int else f"{value:g}"
            top = f"{limit:,}" if kind is int else f"{limit:g}"
            raise argparse.ArgumentTypeError(f"{shown} must be from {low} to {top}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _harden(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Every int and float option of every command gets range checking (no NaN, no 0 tokens)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _harden(sub)
        elif action.type in (int, float):
            action.type = _bounded(action.type, action.dest)
    return parser


def clean_message(text: str, limit: int = 500) -> str:
    """One printable line of at most ``limit`` characters: control characters and escape sequences
    from files never reach the terminal."""
    text = re.sub(r"\x1b\[[0-9;?]*[ -/]*[@-~]", "", str(text))
    text = "".join(ch if ch.isprintable() else " " for ch in text)
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error, like every other message of the command."""

    def error(self, message: str) -> NoReturn:
        self.exit(
            2,
            f"fitscope: {self.prog.removeprefix('fitscope ')}: {clean_message(message, 300)} "
            f"(see {self.prog} --help)\n",
        )


# -- signals --------------------------------------------------------------------------------------


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block ends (then interrupt as usual): what was measured is
    reported and saved first. Only in the main thread, where Python handles signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _frame: caught.append(signum)) for s in _STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if caught:
            raise KeyboardInterrupt


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


# -- the command ----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``fitscope ARGV`` (default: this process's arguments) and returns the exit code: 0, 2 for
    a usage error or a FitScopeError (one line on stderr), 130 when interrupted, 1 for a defect
    (one line on stderr, the traceback in the log)."""
    # The window's estimate worker is a spawned process; in a frozen build it re-enters here.
    # Elsewhere freeze_support does nothing, and importing multiprocessing would only slow the start.
    if getattr(sys, "frozen", False):
        import multiprocessing

        multiprocessing.freeze_support()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--run-module"] and len(argv) >= 2:
        return _run_module(argv[1], argv[2:])
    from app.cli.parser import build_parser  # it builds on _Parser: imported once this package is complete

    parser = _harden(build_parser())
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a one-line error already printed
        return exc.code if isinstance(exc.code, int) else 2
    if args.command is None:
        args = parser.parse_args(["window"])
    if args.command != "window" and threading.current_thread() is threading.main_thread():
        # SIGTERM like Ctrl+C: cleanup runs and llama.cpp children are ended, not orphaned.
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _command(args.command)(args)
    except FitScopeError as exc:
        print(f"fitscope: {clean_message(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
    except Exception as exc:  # a defect: one line for the user, the traceback in the log
        import logging

        from app.adapters.logs import log_path, setup_logging

        setup_logging()
        logging.getLogger("fitscope").exception("fitscope %s failed", args.command)
        print(
            f"fitscope: {args.command} failed unexpectedly ({type(exc).__name__}: {clean_message(str(exc), 200)}); "
            f"details are in {log_path()}",
            file=sys.stderr,
        )
        return 1
