"""Text that came from a file, made safe to show: the one sanitiser for labels on a terminal or in
the window.

A model's ``general.name``, a file name, a suite name or a prompt id is chosen by whoever wrote the
file. Printed raw, an escape sequence in it is obeyed by the terminal: OSC 52 (``ESC ] 52 ;``)
writes the clipboard in many terminals, other sequences retitle the window, hide text or move the
cursor over earlier lines. Here every escape sequence (ECMA-48: CSI, OSC, DCS, SOS, PM, APC and
the two-character ones, in their 7-bit and 8-bit forms) is removed, and every other control or
format character (C0, DEL, C1, bidirectional overrides) is removed from multi-line text or turned
into a space in a one-line label. A byte of a file name that is not UTF-8 (Python's surrogate
escape) is shown as ``\\xNN``, so the name shown is the real one. JSON output is not passed
through here: it carries the exact text, with JSON's own escapes.
"""

from __future__ import annotations

import re
import shlex

_ESCAPE_SEQUENCE = re.compile(
    r"""
      (?:\x1b\[|\x9b) [0-?]* [ -/]* [@-~]?                    # CSI: ESC [ params intermediates final
    | (?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f]) .*? (?:\x07|\x1b\\|\x9c|\Z)  # OSC/DCS/SOS/PM/APC strings
    | \x1b [ -/]* [0-~]?                                       # any other ESC sequence
    """,
    re.DOTALL | re.VERBOSE,
)
_SURROGATE = re.compile(r"[\udc80-\udcff]")
_OTHER_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _visible_bytes(text: str) -> str:
    """Surrogate-escaped bytes (a file name that is not UTF-8) as ``\\xNN``, other lone surrogates as ``?``."""
    text = _SURROGATE.sub(lambda m: f"\\x{ord(m.group()) - 0xDC00:02x}", text)
    return _OTHER_SURROGATE.sub("?", text)


def without_escapes(text: str) -> str:
    """``text`` with every terminal escape sequence removed (nothing else changed)."""
    return _ESCAPE_SEQUENCE.sub("", text)


def safe_text(text: object) -> str:
    """Multi-line text safe for a terminal or a window: escape sequences and every control or
    format character removed except newline and tab; undecodable bytes shown as ``\\xNN``."""
    cleaned = _visible_bytes(without_escapes(str(text)))
    return "".join(ch for ch in cleaned if ch in "\n\t" or ch.isprintable() or ch == " ")


def safe_label(text: object, limit: int | None = None) -> str:
    """One printable line for a label that came from a file (a model, file, suite or prompt name):
    escape sequences removed, other control or format characters and runs of white space made one
    space, undecodable bytes shown as ``\\xNN``, and at most ``limit`` characters (an ellipsis ends
    a cut label)."""
    cleaned = _visible_bytes(without_escapes(str(text)))
    cleaned = "".join(ch if ch.isprintable() else " " for ch in cleaned)
    cleaned = re.sub(r"\s+", " ", cleaned).strip()
    if limit is not None and len(cleaned) > limit:
        return cleaned[: max(limit - 1, 0)] + "…"
    return cleaned


def undecodable(text: str) -> bool:
    """Whether ``text`` holds bytes that were not UTF-8 (a file name read with surrogate escapes)."""
    return _OTHER_SURROGATE.search(text) is not None


def shell_quote(text: str) -> str:
    """``text`` as one word of a POSIX shell command naming exactly it: ``shlex.quote`` for
    printable text; for text with control characters or bytes that are not UTF-8 (a file name
    read with surrogate escapes), bash and zsh's ``$'...'`` quoting with ``\\xNN`` for each such
    byte, so that the command names the real file and the terminal sees no control character."""
    if text.isprintable() and not undecodable(text):
        return shlex.quote(text)
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that is no escaped byte
        raw = text.encode("utf-8", "surrogatepass")
    out = []
    for byte in raw:
        char = chr(byte)
        if 0x20 <= byte < 0x7F and char not in "\\'":
            out.append(char)
        else:
            out.append(f"\\x{byte:02x}")
    return "$'" + "".join(out) + "'"
