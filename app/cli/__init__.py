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
import io
import math
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import NoReturn, TextIO

from app.core.common.errors import FitScopeError
from app.core.common.text import safe_label, safe_text

# The module (under app.cli) of each command; its function is cmd_<command>.
COMMAND_MODULES = {
    "estimate": "estimate",
    "demo": "estimate",
    "tune": "tuning",
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
_MAX_CONTEXT = 1 << 24  # app.core.memory.records.MAX_CONTEXT_TOKENS (not imported: the start stays fast)
# Options whose meaning has a far lower ceiling than a 32-bit count, checked where they are parsed,
# before any work: the estimator's and llama.cpp's limits, and what a simulation can finish.
_UPPER = {
    "ctx_size": _MAX_CONTEXT,
    "batch_size": _MAX_CONTEXT,
    "ubatch_size": _MAX_CONTEXT,
    "prompt_tokens": _MAX_CONTEXT,
    "n_prompt": _MAX_CONTEXT,
    "depth": _MAX_CONTEXT,
    "prompt": _MAX_CONTEXT,
    "n_predict": 1 << 20,
    "n_gen": 1 << 20,
    "output": 1 << 20,
    "parallel": 256,  # llama.cpp's LLAMA_MAX_SEQ
    "slots": 256,
    "max_num_seqs": 65_536,
    "repeat": 100,
    "requests": 100_000,
    "count": 64,
    "nodes": 64,
    "rpc_local": 16,
    "threads": 1024,
    "kl_tokens": 1 << 20,
    "kl_chunk": 16_384,
    "max_gpus": 8,
    "top": 10_000,
    "users": 1_000_000,
}
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
        limit = _UPPER.get(dest, _INT_MAX) if kind is int else _FLOAT_MAX
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
    """One printable line of at most ``limit`` characters (:func:`app.core.common.text.safe_label`):
    control characters and escape sequences from files never reach the terminal."""
    return safe_label(text, limit)


class _SafeStream(io.TextIOBase):
    """A terminal stream that passes on only :func:`app.core.common.text.safe_text`: whatever a
    command prints (a model's ``general.name``, a file, suite or prompt name), no escape sequence
    or control character from a file reaches the terminal. JSON output is not filtered: it is exact,
    with JSON's own escapes."""

    def __init__(self, inner: TextIO) -> None:
        super().__init__()
        self._inner = inner
        self.inner = inner  # closing the wrapper (or collecting it) leaves the terminal stream open

    def write(self, text: str) -> int:
        self._inner.write(safe_text(text))
        return len(text)

    def flush(self) -> None:
        self._inner.flush()

    def isatty(self) -> bool:
        return self._inner.isatty()

    def fileno(self) -> int:
        return self._inner.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._inner, "encoding", "utf-8")


@contextlib.contextmanager
def _safe_output(json_output: bool) -> Iterator[None]:
    """stderr always, and stdout unless the command prints JSON, through :class:`_SafeStream`."""
    saved = sys.stdout, sys.stderr
    if not json_output:
        sys.stdout = _SafeStream(sys.stdout)  # type: ignore[assignment]
    sys.stderr = _SafeStream(sys.stderr)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


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
    with _safe_output(bool(getattr(args, "json", False))):
        return _run_command(args)


def _validation_sentence(exc: Exception) -> str | None:
    """One sentence for a pydantic ValidationError (a setting out of its record's range), else None."""
    errors = getattr(exc, "errors", None)
    if type(exc).__name__ != "ValidationError" or not callable(errors):
        return None
    first = errors()[0]
    where = ".".join(str(part) for part in first.get("loc", ())) or "setting"
    return f"Invalid {where}: {str(first.get('msg', exc)).removeprefix('Value error, ')}."


def _run_command(args: argparse.Namespace) -> int:
    try:
        return _command(args.command)(args)
    except FitScopeError as exc:
        print(f"fitscope: {clean_message(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        getattr(sys.stderr, "inner", sys.stderr).close()
        return 0
    except Exception as exc:  # a defect: one line for the user, the traceback in the log
        settings_problem = _validation_sentence(exc)
        if settings_problem is not None:  # a value past a record's limit that no option check caught
            print(f"fitscope: {clean_message(settings_problem)}", file=sys.stderr)
            return 2
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
