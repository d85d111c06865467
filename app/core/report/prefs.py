"""What FitScope remembers between launches: the last hardware, model and settings, and the one set
of workload settings every tab shares (people and conversation length in ``controls``; the speed
each person needs, the budget, the quality floor and what to put first in ``workload``).

One pydantic model with a schema version, saved as JSON. A file of an older schema is carried
forward by :func:`migrate` (a renamed field keeps its value: schema 1's ``controls.context_tokens``,
each user's context, is schema 2's ``controls.context_per_user_tokens``; its ``gpu_layers`` null,
"auto", is "auto"), never reset. A file from a newer or unknown schema, or one that no longer
validates (a catalog id that was renamed), is set aside as ``settings.json.bad`` rather than
trusted, and the defaults are used; nothing here raises or blocks for a bad file (a FIFO, a link to
a device, a huge or deeply nested file: :func:`app.core.common.files.read_json_file`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.core.common.errors import FitScopeError
from app.core.common.files import move_aside, read_json_file
from app.core.common.units import Frozen
from app.core.report.choices import Controls, HardwareChoice, ModelChoice
from app.core.report.lengths import WORDS_PER_TOKEN

SCHEMA_VERSION = 2
MAX_PREFERENCES_BYTES = 1024 * 1024  # the file is about 2 KiB
MAX_COMPARED = 4

SpeedUnit = Literal["words", "tokens"]
LengthUnit = Literal["tokens", "words", "pages"]


class WorkloadPrefs(Frozen):
    """The workload settings beside the people and the conversation length (which are the
    controls' ``users`` and ``context_per_user_tokens``): each person's speed in ``speed_unit``
    (words or tokens a second), the budget in US dollars (None: no limit), the answers' quality
    floor, what the advisor puts first, and the unit conversation lengths are typed in."""

    min_speed: float = Field(default=7.5, ge=0, le=10_000)
    speed_unit: SpeedUnit = "words"
    budget_usd: float | None = Field(default=None, gt=0, le=1e9)
    quality_floor: Literal["same", "slight", "noticeable", "any"] = "slight"
    prefer: Literal["price", "speed", "headroom"] = "price"
    length_unit: LengthUnit = "tokens"

    def in_speed_unit(self, unit: SpeedUnit) -> WorkloadPrefs:
        """The same speed said in ``unit`` (7.5 words a second is 10 tokens a second), to 0.1."""
        if unit == self.speed_unit:
            return self
        factor = WORDS_PER_TOKEN if unit == "words" else 1 / WORDS_PER_TOKEN
        return self.model_copy(update={"speed_unit": unit, "min_speed": round(self.min_speed * factor, 1)})


class Preferences(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    schema_version: int = SCHEMA_VERSION
    hardware: HardwareChoice = HardwareChoice()
    compare: tuple[HardwareChoice, ...] = Field(default=(), max_length=MAX_COMPARED - 1)
    model: ModelChoice = ModelChoice()
    controls: Controls = Controls()
    workload: WorkloadPrefs = WorkloadPrefs()
    presentation: bool = False
    presentation_controls: bool = Field(default=False, description="presentation mode shows the controls too")
    recent_files: tuple[str, ...] = Field(default=(), max_length=10)
    walkthrough_seen: bool = False


def _from_schema_1(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 named each user's context ``context_tokens`` and "auto" GPU layers null."""
    controls = data.get("controls")
    if isinstance(controls, dict):
        controls = dict(controls)
        if "context_tokens" in controls and "context_per_user_tokens" not in controls:
            controls["context_per_user_tokens"] = controls.pop("context_tokens")
        if "gpu_layers" in controls and controls["gpu_layers"] is None:
            controls["gpu_layers"] = "auto"
        data = {**data, "controls": controls}
    return {**data, "schema_version": 2}


_MIGRATIONS = {1: _from_schema_1}


def migrate(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a settings file's JSON) carried forward to :data:`SCHEMA_VERSION`, one schema at a
    time. Raises ValueError for a schema this FitScope does not know (a newer one, or none)."""
    version = data.get("schema_version")
    while version != SCHEMA_VERSION:
        step = _MIGRATIONS.get(version) if isinstance(version, int) else None
        if step is None:
            raise ValueError(f"schema version {version!r}, this FitScope reads {SCHEMA_VERSION}")
        data = step(data)
        version = data["schema_version"]
    return data


def load_preferences(path: Path) -> tuple[Preferences, str]:
    """The saved preferences, or the defaults with a sentence saying why they were not used
    (empty when there was simply no file yet)."""
    if not path.exists() and not path.is_symlink():
        return Preferences(), ""
    try:
        data = read_json_file(path, "settings file", MAX_PREFERENCES_BYTES)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return Preferences.model_validate(migrate(data)), ""
    except (FitScopeError, ValueError, ValidationError) as exc:
        reason = str(exc).splitlines()[0].rstrip(".")
        moved = move_aside(path)
        kept = f" The file was kept as {moved.name}." if moved is not None else ""
        return Preferences(), (
            f"Your saved settings could not be read ({reason}); FitScope started with its defaults.{kept}"
        )


def save_preferences(prefs: Preferences, path: Path) -> None:
    """Write atomically (a crash mid-write leaves the previous file). Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".prefs-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(prefs.model_dump_json(indent=2))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
