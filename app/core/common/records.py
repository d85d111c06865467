"""The base of FitScope's immutable records.

Apart from the byte units in ``app.core.common.units`` (which also names it) so that what needs only a unit,
such as the command line's parser, does not import pydantic.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """An immutable record that refuses unknown fields (every domain record derives from it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
