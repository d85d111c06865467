"""Byte units and the base of FitScope's immutable records, defined once.

``Frozen`` is defined in ``app.core.common.records`` and loaded from here when first named: pydantic is a
large share of a command's start-up, and what needs only a unit (``fitscope --help``) never imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.core.common.records import Frozen as Frozen

KIB = 1024
MIB = 1024**2
GIB = 1024**3


def __getattr__(name: str) -> Any:
    if name == "Frozen":
        from app.core.common.records import Frozen

        return Frozen
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def pad_to(n: int, to: int) -> int:
    """``n`` rounded up to a multiple of ``to`` (llama.cpp pads its context to 256 cells and its
    reserved ubatch to a multiple of the sequences)."""
    return -(-n // to) * to
