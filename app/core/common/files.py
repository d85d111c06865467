"""Opening what a user names or what sits in FitScope's data folder: only regular files, of a
sensible size, and JSON without surprises.

A FIFO, a device or a socket named as a model, a config or a suite would block a reader forever
(or stream without end: a link to /dev/zero); they are refused before anything is read. The file
is opened without blocking and checked on the open descriptor, so a file swapped for a FIFO
between the check and the open is refused too, and at most the size cap (plus one byte) is ever
read, whatever the file grows to meanwhile.

JSON from a file is parsed strictly (:func:`parse_json_text`): ``NaN`` and ``Infinity`` are
refused, and nesting deeper than :data:`MAX_JSON_DEPTH` is refused before Python's parser would
recurse into it. A data-folder file that fails is moved aside as ``NAME.bad``
(:func:`move_aside`), so one bad file never stops FitScope from starting and is kept for a look.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from app.core.common.errors import FitScopeError

MAX_TEXT_BYTES = 16 * 1024 * 1024  # config.json files and suites are kilobytes; this is generous
MAX_JSON_DEPTH = 64  # the deepest JSON FitScope writes is 6 levels; a suite's schema perhaps 20
BAD_SUFFIX = ".bad"


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    return "a pipe (FIFO)" if stat.S_ISFIFO(mode) else "a device or socket"


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
        raise error(f"{path} is {_kind(mode)}, not a {what}; name a regular file.")
    return path


def read_bytes_bounded(
    path: Path, what: str, max_bytes: int = MAX_TEXT_BYTES, error: type[FitScopeError] = FitScopeError
) -> bytes:
    """The bytes of the regular file ``path`` (links followed), at most ``max_bytes`` of them.
    Raises ``error`` for a missing file, a folder, FIFO, device or socket, a larger file, or a
    read that fails. Never blocks on a FIFO and never reads more than ``max_bytes + 1`` bytes."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise error(f"FitScope cannot find the {what} {path}.") from None
    except IsADirectoryError:
        raise error(f"{path} is a folder, not a {what}.") from None
    except OSError as exc:
        raise error(f"FitScope cannot open the {what} {path}: {exc.strerror or exc}.") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error(f"{path} is {_kind(mode)}, not a {what}; name a regular file.")
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise error(f"{path} is {_size_text(size)}, more than the {_size_text(max_bytes)} a {what} may have.")
        chunks: list[bytes] = []
        remaining = max_bytes + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:  # it grew while being read
            raise error(f"{path} is more than the {_size_text(max_bytes)} a {what} may have.")
        return data
    except OSError as exc:
        raise error(f"FitScope cannot read the {what} {path}: {exc.strerror or exc}.") from None
    finally:
        os.close(fd)


def _size_text(size: int) -> str:
    if size >= 1024**2:
        return f"{size / 1024**2:,.0f} MiB"
    return f"{size / 1024:,.0f} KiB" if size >= 1024 else f"{size} bytes"


def read_text_file(
    path: Path, what: str, error: type[FitScopeError] = FitScopeError, max_bytes: int = MAX_TEXT_BYTES
) -> str:
    """The text of a regular file of at most ``max_bytes`` (UTF-8, BOM allowed). Raises ``error``."""
    data = read_bytes_bounded(path, what, max_bytes, error)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(f"{path} is not UTF-8 text (byte {exc.start}), so it cannot be a {what}.") from None


def json_depth_problem(text: str, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Why ``text`` nests too deeply to parse (None when it does not): brackets outside strings
    counted in one pass, before any parser recurses."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > max_depth:
                    return f"it nests more than {max_depth} levels deep"
        elif char in "]}":
            depth -= 1
    return None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"it holds {name}, which is not a number JSON allows")


def parse_json_text(text: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The JSON value in ``text``. Raises ValueError (a short reason) for invalid JSON, ``NaN`` or
    ``Infinity``, a number too large for a float, and nesting deeper than ``max_depth``."""
    problem = json_depth_problem(text, max_depth)
    if problem:
        raise ValueError(problem)
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise ValueError(f"it is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise ValueError("it nests too deeply") from None
    problem = non_finite_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def non_finite_problem(value: Any, where: str = "") -> str | None:
    """Where ``value`` (JSON-like: dicts, lists, numbers, text) holds a number that is not finite
    (NaN, an infinity, or 1e999 read as one); None when every number is finite. Iterative: any depth."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return f"'{at or 'the value'}' is {item}, not a finite number"
        if isinstance(item, dict):
            stack.extend((v, f"{at}.{k}" if at else str(k)) for k, v in item.items())
        elif isinstance(item, list | tuple):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(item))
    return None


def read_json_file(
    path: Path, what: str, max_bytes: int = MAX_TEXT_BYTES, error: type[FitScopeError] = FitScopeError
) -> Any:
    """The JSON value in the regular file ``path`` (UTF-8, at most ``max_bytes``), strictly
    parsed (:func:`parse_json_text`). Raises ``error`` saying what is wrong with the file."""
    text = read_text_file(path, what, error, max_bytes)
    try:
        return parse_json_text(text)
    except ValueError as exc:
        raise error(f"{path.name} cannot be a {what}: {exc}.") from None


def move_aside(path: Path) -> Path | None:
    """Rename a bad file ``NAME`` to ``NAME.bad`` (``NAME.bad-2``... when taken) so that it is
    never read again but kept for a look; the new path, or None when it could not be moved. A
    link is moved, not what it points to."""
    target = path.with_name(path.name + BAD_SUFFIX)
    n = 1
    while target.exists() or target.is_symlink():
        n += 1
        target = path.with_name(f"{path.name}{BAD_SUFFIX}-{n}")
    with contextlib.suppress(OSError):
        os.replace(path, target)
        return target
    return None
