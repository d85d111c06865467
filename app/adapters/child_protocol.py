"""The one protocol between FitScope and its llama.cpp worker processes.

llama.cpp aborts the whole process on some errors (``GGML_ASSERT``, a lost RPC server), so every
model is loaded in a child process: an abort ends the child only, and the parent reports it.

The wire: the parent starts ``python -m MODULE`` (:func:`app.adapters.child.start_child`, which
also covers frozen builds), writes the worker's settings as one JSON line on the child's stdin and
reads one JSON event per line from its stdout, each with an ``"event"`` tag
(:func:`encode_event` / :func:`parse_event`). A later ``stop`` line on stdin asks the child to
finish early; stdin closing means the parent is gone. Anything else the child prints (llama.cpp's
C code, Python) goes to stderr, of which the parent keeps the last lines for its error messages.

The parent side is :class:`WorkerProcess`: it starts the child, drains its stderr into a bounded
tail on a thread, yields typed events (:class:`ChildEvent` and the worker's own subclasses), stops
and ends the child with one policy (``stop`` on stdin, then SIGTERM, then SIGKILL; a timeout ends
it the same way) and words every failure one way (:meth:`WorkerProcess.failure`), with llama.cpp's
own reason. The child side is :func:`serve_child`: the settings from the first stdin line, stop
and parent death watched, events out through a :class:`ChildChannel`, llama.cpp's log captured by
:func:`install_llama_log`.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import IntEnum
from pathlib import Path
from typing import Any, Literal, TextIO, TypeVar

from pydantic import BaseModel, ValidationError

from app.adapters.child import start_child
from app.core.common.errors import FitScopeError
from app.core.common.text import safe_label, shell_quote, undecodable
from app.core.common.units import Frozen

STOP_GRACE_S = 1.0
"""After ``stop``: how long a child has to finish on its own before it is ended."""
END_GRACE_S = 2.0
"""After SIGTERM: how long a child has to exit before SIGKILL."""
ORPHAN_EXIT_S = 3.0
"""After its parent is gone: how long a child's current step may take before it leaves anyway."""
STDERR_TAIL_LINES = 200
FAILURE_TAIL_LINES = 8
STOP_LINE = "stop"

_log = logging.getLogger(__name__)


# -- llama.cpp's log -----------------------------------------------------------------------------


class LogLevel(IntEnum):
    """``ggml_log_level`` of the llama.cpp in llama-cpp-python 0.3.36 (ggml.h). CONT continues
    the previous message at its level."""

    NONE = 0
    DEBUG = 1
    INFO = 2
    WARN = 3
    ERROR = 4
    CONT = 5


NO_REASON = "no reason given in the log"


def _last_lines(text: str, n: int) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return "\n".join(lines[-n:])


def llama_reason(error_lines: Sequence[str], log: str = "", fallback: str = "") -> str:
    """Why llama.cpp refused, in its own words: its first error line without the ``function: ``
    prefix and final full stop; without error lines ``fallback``, else the log's last 3 lines."""
    lines = [ln.strip() for ln in error_lines if ln.strip()]
    if not lines:
        return fallback or _last_lines(log, 3) or NO_REASON
    first = lines[0]
    if m := re.match(r"^\w+: (.*)$", first):
        first = m[1]
    return first.rstrip(".")


class LlamaLog:
    """llama.cpp's log in a worker: every message (``chunks``), those printed without
    ``--verbose`` (``info_chunks``: INFO and above) and the ERROR ones (``error_lines``), with
    continuation messages counted at the level they continue. ``on_message(level, text)``, when
    given, sees each message as it arrives. Install it with :func:`install_llama_log`."""

    def __init__(self, on_message: Callable[[int, str], None] | None = None) -> None:
        self.chunks: list[str] = []
        self.info_chunks: list[str] = []
        self.error_lines: list[str] = []
        self._on_message = on_message
        self._last_level: int = LogLevel.NONE

    def receive(self, level: int, text: str) -> None:
        """One message from llama.cpp (the log callback calls this)."""
        effective = self._last_level if level == LogLevel.CONT else level
        self.chunks.append(text)
        if effective == LogLevel.ERROR:
            self.error_lines.append(text)
        if effective >= LogLevel.INFO:
            self.info_chunks.append(text)
        self._last_level = effective
        if self._on_message is not None:
            self._on_message(effective, text)

    def text(self) -> str:
        return "".join(self.chunks)

    def info_text(self) -> str:
        return "".join(self.info_chunks)

    def forget(self) -> None:
        """Drop what was logged so far (a later step's messages are then read alone)."""
        self.chunks.clear()
        self.info_chunks.clear()
        self.error_lines.clear()

    def forget_errors(self) -> None:
        self.error_lines.clear()

    def reason(self, fallback: str = "") -> str:
        """llama.cpp's reason for the last refusal (:func:`llama_reason`)."""
        return llama_reason(self.error_lines, self.text(), fallback)


_installed_callbacks: list[Any] = []  # ctypes callbacks llama.cpp holds: referenced until exit


def install_llama_log(
    llama_cpp: Any, on_message: Callable[[int, str], None] | None = None, also: Sequence[Callable[..., Any]] = ()
) -> LlamaLog:
    """Route llama.cpp's log (and that of each ``*_log_set`` function in ``also``, such as mtmd's)
    into a new :class:`LlamaLog` and return it. Call it in the child after ``import llama_cpp``."""
    log = LlamaLog(on_message)

    def on_log(level: int, text: bytes | None, _user_data: ctypes.c_void_p) -> None:
        log.receive(level, (text or b"").decode("utf-8", "replace"))

    callback = llama_cpp.llama_log_callback(on_log)
    _installed_callbacks.append(callback)
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
    for set_log in also:
        set_log(callback, ctypes.c_void_p(0))
    return log


# -- events --------------------------------------------------------------------------------------


class ChildEvent(Frozen):
    """One line of a worker's stdout. Each kind sets ``event`` to its own tag."""

    event: str


class Loaded(ChildEvent):
    """The model is loaded and the work begins; workers add what the load reported."""

    event: Literal["loaded"] = "loaded"


class Progress(ChildEvent):
    """``done`` of ``total`` steps of the work are finished (tensors, chunks, measurements)."""

    event: Literal["progress"] = "progress"
    done: int
    total: int


class Token(ChildEvent):
    """One generated token of repetition ``run``: its text, and seconds since the prompt was sent."""

    event: Literal["token"] = "token"
    run: int = 0
    text: str = ""
    t_s: float


class Done(ChildEvent):
    """The work is finished; workers add their final figures."""

    event: Literal["done"] = "done"


class Failed(ChildEvent):
    """The work cannot go on; ``message`` says why in llama.cpp's words where it gave any."""

    event: Literal["failed"] = "failed"
    message: str


EventTypes = Iterable[type[ChildEvent]]


def event_vocabulary(types: EventTypes) -> dict[str, type[ChildEvent]]:
    """Tag -> event class for one worker (one class per tag), with :class:`Failed` always in."""
    vocabulary: dict[str, type[ChildEvent]] = {}
    kinds: list[type[ChildEvent]] = [Failed, *types]
    for kind in kinds:
        tag = kind.model_fields["event"].default
        if vocabulary.get(tag, kind) is not kind:
            raise ValueError(f"two event classes use the tag {tag!r}: {vocabulary[tag].__name__}, {kind.__name__}")
        vocabulary[tag] = kind
    return vocabulary


def encode_event(event: ChildEvent) -> str:
    """One event as its line on the wire (without the newline)."""
    return event.model_dump_json()


def parse_event(line: str, vocabulary: Mapping[str, type[ChildEvent]]) -> ChildEvent | None:
    """The event on one stdout line, or None for a line that is not one of ``vocabulary``'s
    events (output that slipped past the redirection, an unknown tag, a malformed record)."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        data = json.loads(line)
    except json.JSONDecodeError:
        return None
    kind = vocabulary.get(str(data.get("event"))) if isinstance(data, dict) else None
    if kind is None:
        return None
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        _log.warning("a worker's %s event does not validate: %s", kind.__name__, exc)
        return None


# -- the parent side -----------------------------------------------------------------------------


def require_file(path: str | os.PathLike[str], error: type[FitScopeError]) -> Path:
    """``path`` when it is a regular file with a UTF-8 name; raises ``error`` in one sentence
    otherwise. llama-cpp-python encodes a model's path as UTF-8 before llama.cpp opens it, so a
    name with other bytes (read with surrogate escapes) cannot reach it: the sentence says how to
    rename it, quoting the real bytes."""
    p = Path(path)
    if undecodable(str(p)):
        fixed = p.name.encode("utf-8", "surrogateescape").decode("utf-8", "replace").replace("\ufffd", "_")
        raise error(
            f"{safe_label(p.name)}: its file name is not valid UTF-8, and llama-cpp-python opens models by "
            f"UTF-8 names only; rename it, e.g. mv {shell_quote(str(p))} {shell_quote(str(p.with_name(fixed)))}"
        )
    if not p.is_file():
        raise error(f"{p} does not exist or is not a file.")
    return p


def exit_description(code: int) -> str:
    """How a child's exit reads: "exit code N", or "killed by SIGNAME" when a signal ended it."""
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def failure_message(activity: str, exit_code: int, stderr_tail: str) -> str:
    """How a worker that died reads: "llama.cpp stopped ACTIVITY (exit code N)" then the end of
    its stderr, where an abort's reason (``GGML_ASSERT``...) and Python tracebacks land."""
    return f"llama.cpp stopped {activity} ({exit_description(exit_code)})" + (
        f": {stderr_tail}" if stderr_tail else "."
    )


class WorkerProcess:
    """One worker child process (``module``), given ``settings`` as its first stdin line (None:
    stdin is closed at once, for a child that takes command-line ``args`` instead) and speaking
    the events ``events`` (:class:`Failed` is always understood). ``name`` names the model file in
    messages; past ``timeout_s`` the child is ended and the run reported as timed out.

    :meth:`follow` reads the events; :meth:`stop` (thread-safe) asks the child to finish early;
    :meth:`kill` ends it now; :meth:`failure` says why it did not finish. The last
    :class:`Loaded`, :class:`Done` and :class:`Failed` seen are kept in ``loaded``, ``done`` and
    ``failed``.
    """

    def __init__(
        self,
        module: str,
        settings: BaseModel | None,
        events: EventTypes = (),
        *,
        name: str,
        timeout_s: float | None = None,
        args: Sequence[str] = (),
    ) -> None:
        event_types = tuple(events)
        # Serialised before the child starts: a value JSON cannot carry (a file name that is not
        # UTF-8) is refused here, rather than leaving the child waiting for a line never sent.
        try:
            first_line = settings.model_dump_json() + "\n" if settings is not None else None
        except (ValueError, TypeError) as exc:
            raise FitScopeError(
                f"{safe_label(name)}: its settings cannot be sent to the worker process ({safe_label(exc, 200)})."
            ) from None
        self.settings = settings
        self.name = name
        self.timeout_s = timeout_s
        self.loaded: Loaded | None = None
        self.done: Done | None = None
        self.failed: Failed | None = None
        self._vocabulary = event_vocabulary(event_types)
        self._loads = any(issubclass(t, Loaded) for t in event_types)
        self._tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self._stop_requested = threading.Event()
        self._timed_out = threading.Event()
        self._stdin_lock = threading.Lock()
        self._proc = start_child(module, args)
        self._drainer = threading.Thread(target=self._drain_stderr, daemon=True)
        self._drainer.start()
        self._timer: threading.Timer | None = None
        if timeout_s is not None:
            self._timer = threading.Timer(timeout_s, self._time_out)
            self._timer.daemon = True
            self._timer.start()
        with self._stdin_lock, contextlib.suppress(OSError, ValueError):
            assert self._proc.stdin is not None
            if first_line is None:
                self._proc.stdin.close()
            else:
                self._proc.stdin.write(first_line)
                self._proc.stdin.flush()

    # -- state --

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc.poll() is None

    @property
    def exit_code(self) -> int | None:
        return self._proc.returncode

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested.is_set()

    @property
    def timed_out(self) -> bool:
        return self._timed_out.is_set()

    def stderr_tail(self, n: int = FAILURE_TAIL_LINES) -> str:
        """The child's last ``n`` stderr lines."""
        return "".join(list(self._tail)[-n:]).strip()

    # -- reading --

    def follow(self, on_event: Callable[[ChildEvent], None] | None = None) -> int:
        """Pass each event to ``on_event`` (on this thread) until the child exits, and return its
        exit code. If ``on_event`` raises or the wait is interrupted (Ctrl+C), the child is ended
        first: nobody would read its output any more."""

        def on_line(line: str) -> None:
            event = parse_event(line, self._vocabulary)
            if event is None:
                return
            if isinstance(event, Loaded):
                self.loaded = event
            elif isinstance(event, Done):
                self.done = event
            elif isinstance(event, Failed):
                self.failed = event
            if on_event is not None:
                on_event(event)

        return self._read(on_line)

    def json_answer(self) -> dict[str, Any] | None:
        """For a child that answers once: the JSON object on its last stdout line starting with
        ``{`` (None when there is none, or it does not parse), after the child has exited."""
        last: list[str] = []

        def on_line(line: str) -> None:
            if line.startswith("{"):
                last[:] = [line]

        self._read(on_line)
        if not last:
            return None
        try:
            answer = json.loads(last[0])
        except json.JSONDecodeError:
            return None
        return answer if isinstance(answer, dict) else None

    def _read(self, on_line: Callable[[str], None]) -> int:
        assert self._proc.stdout is not None
        try:
            for line in self._proc.stdout:
                on_line(line)
        except BaseException:
            self.kill()
            raise
        finally:
            code = self.wait()
        return code

    def _drain_stderr(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._tail.append(line)

    # -- ending --

    def stop(self) -> None:
        """Ask the child to finish early; end it if it has not exited within ``STOP_GRACE_S``."""
        if self._stop_requested.is_set():
            return
        self._stop_requested.set()
        with self._stdin_lock, contextlib.suppress(OSError, ValueError):
            assert self._proc.stdin is not None
            self._proc.stdin.write(STOP_LINE + "\n")
            self._proc.stdin.flush()
        threading.Thread(target=self._end_after_grace, daemon=True).start()

    def _end_after_grace(self) -> None:
        try:
            self._proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def _time_out(self) -> None:
        self._timed_out.set()
        self.kill()

    def kill(self) -> None:
        """End the child now: SIGTERM, up to ``END_GRACE_S`` to exit, then SIGKILL. Returns once
        it has exited."""
        if self._proc.poll() is None:
            with contextlib.suppress(OSError):
                self._proc.terminate()
            try:
                self._proc.wait(timeout=END_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    self._proc.kill()
        self.wait()

    def wait(self) -> int:
        """Wait for the child to exit and return its exit code."""
        code = self._proc.wait()
        if self._timer is not None:
            self._timer.cancel()
        self._drainer.join(timeout=1)
        with self._stdin_lock, contextlib.suppress(OSError, ValueError):
            assert self._proc.stdin is not None
            self._proc.stdin.close()
        return code

    # -- reporting --

    def failure(self, activity: str) -> str | None:
        """Why the child did not finish, in one sentence; None when it sent :class:`Done`, or was
        asked to stop (after it had loaded, for a worker with a :class:`Loaded` event). In order:
        its own :class:`Failed` message after the file's name ("NAME: llama.cpp could not load it:
        REASON"); a timeout ("llama.cpp took longer than T s ACTIVITY and was stopped."); a stop
        before it had loaded ("Stopped before NAME had loaded; nothing was measured."); its death
        (:func:`failure_message`: "while loading NAME" before :class:`Loaded`, ``activity``
        after, with the end of its stderr). Call it after :meth:`follow` or :meth:`json_answer`
        returned."""
        if self.failed is not None:
            return f"{self.name}: {self.failed.message}"
        if self.timed_out:
            return f"llama.cpp took longer than {self.timeout_s:g} s {activity} and was stopped."
        not_loaded = self._loads and self.loaded is None
        if not_loaded and self.stop_requested:
            return f"Stopped before {self.name} had loaded; nothing was measured."
        if self.done is not None or self.stop_requested:
            return None
        where = f"while loading {self.name}" if not_loaded else activity
        return failure_message(where, self.wait(), self.stderr_tail())


# -- the child side ------------------------------------------------------------------------------


def reserve_stdout() -> TextIO:
    """Keep this process's stdout for the protocol alone: returns a line-buffered writer on the
    original stdout and sends everything else written to it (llama.cpp's C code, ``print``) to
    stderr."""
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", encoding="utf-8", buffering=1)


class ChildChannel:
    """The child's end of the protocol: :meth:`emit` events (thread-safe, so llama.cpp's log
    callback may emit too), and ``stop_requested`` once the parent asked to stop or went away."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._stop = threading.Event()

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def emit(self, event: ChildEvent) -> None:
        with self._lock:
            self._out.write(encode_event(event) + "\n")
            self._out.flush()

    def fail(self, message: str) -> int:
        """Report :class:`Failed` with ``message`` and return the exit code for it (1)."""
        self.emit(Failed(message=message))
        return 1

    def watch_stdin(self, stdin: TextIO) -> None:
        """Until stdin closes: a ``stop`` line asks to stop. Once it closes the parent is gone:
        stop now, and leave if the current step does not return within ``ORPHAN_EXIT_S``."""
        for line in stdin:
            if line.strip() == STOP_LINE:
                self._stop.set()
        self._stop.set()
        threading.Timer(ORPHAN_EXIT_S, lambda: os._exit(3)).start()


def llama_failed(action: str, log: LlamaLog, fallback: str = "") -> Failed:
    """The child's report that llama.cpp refused: "llama.cpp could not ACTION: REASON", REASON from
    llama.cpp's log (``fallback``, such as the binding's exception text, when the log has no error)."""
    return Failed(message=f"llama.cpp could not {action}: {log.reason(fallback)}")


_S = TypeVar("_S", bound=BaseModel)


def serve_child(settings_type: type[_S], handler: Callable[[ChildChannel, _S], int]) -> int:
    """The body of every worker child: stdout reserved for events, ``settings_type`` read from
    the first stdin line, stdin watched for ``stop`` and the parent's death, and ``handler`` run;
    any exception is reported as :class:`Failed` rather than raised. Returns the exit code."""
    channel = ChildChannel(reserve_stdout())
    try:
        settings = settings_type.model_validate_json(sys.stdin.readline())
    except Exception as exc:  # the parent sent nothing usable
        channel.emit(Failed(message=f"bad settings: {exc}"))
        return 2
    threading.Thread(target=channel.watch_stdin, args=(sys.stdin,), daemon=True).start()
    try:
        return handler(channel, settings)
    except Exception as exc:  # reported, not raised: the parent shows it
        return channel.fail(f"{type(exc).__name__}: {exc}")


def peak_rss_bytes() -> int | None:
    """This process's peak resident memory, in bytes."""
    try:
        import resource
    except ImportError:  # Windows
        import psutil

        info = psutil.Process().memory_info()
        return int(getattr(info, "peak_wset", info.rss))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
