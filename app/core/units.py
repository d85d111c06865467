"""Byte units and the base of FitScope's immutable records, defined once."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

KIB = 1024
MIB = 1024**2
GIB = 1024**3


class Frozen(BaseModel):
    """An immutable record that refuses unknown fields (every domain record derives from it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
