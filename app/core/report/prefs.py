"""What FitScope remembers between launches: the last hardware, model and settings.

One pydantic model with a schema version, saved as JSON. A file from a newer or unknown schema,
or one that no longer validates (a catalog id that was renamed), is set aside as ``settings.json.bad``
rather than trusted, and the defaults are used; nothing here raises or blocks for a bad file (a
FIFO, a link to a device, a huge or deeply nested file: :func:`app.core.common.files.read_json_file`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.core.common.errors import FitScopeError
from app.core.common.files import move_aside, read_json_file
from app.core.report.choices import Controls, HardwareChoice, ModelChoice

SCHEMA_VERSION = 1
MAX_PREFERENCES_BYTES = 1024 * 1024  # the file is about 2 KiB
MAX_COMPARED = 4


class Preferences(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    schema_version: int = SCHEMA_VERSION
    hardware: HardwareChoice = HardwareChoice()
    compare: tuple[HardwareChoice, ...] = Field(default=(), max_length=MAX_COMPARED - 1)
    model: ModelChoice = ModelChoice()
    controls: Controls = Controls()
    presentation: bool = False
    recent_files: tuple[str, ...] = Field(default=(), max_length=10)
    walkthrough_seen: bool = False


def load_preferences(path: Path) -> tuple[Preferences, str]:
    """The saved preferences, or the defaults with a sentence saying why they were not used
    (empty when there was simply no file yet)."""
    if not path.exists() and not path.is_symlink():
        return Preferences(), ""
    try:
        data = read_json_file(path, "settings file", MAX_PREFERENCES_BYTES)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(f"schema version {version!r}, this FitScope reads {SCHEMA_VERSION}")
        return Preferences.model_validate(data), ""
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
