"""Where FitScope keeps its files: the platform's config and data folders.

``FITSCOPE_CONFIG_DIR`` / ``FITSCOPE_DATA_DIR`` override them (tests and portable installs).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

APP_DIR_NAME = "FitScope"


def _home_sub(*parts: str) -> Path:
    return Path.home().joinpath(*parts)


def config_dir() -> Path:
    override = os.environ.get("FITSCOPE_CONFIG_DIR")
    if override:
        return Path(override)
    if sys.platform == "win32":
        return Path(os.environ.get("APPDATA") or _home_sub("AppData", "Roaming")) / APP_DIR_NAME
    if sys.platform == "darwin":
        return _home_sub("Library", "Application Support", APP_DIR_NAME)
    return Path(os.environ.get("XDG_CONFIG_HOME") or _home_sub(".config")) / "fitscope"


def data_dir() -> Path:
    override = os.environ.get("FITSCOPE_DATA_DIR")
    if override:
        return Path(override)
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or _home_sub("AppData", "Local")) / APP_DIR_NAME
    if sys.platform == "darwin":
        return _home_sub("Library", "Application Support", APP_DIR_NAME)
    return Path(os.environ.get("XDG_DATA_HOME") or _home_sub(".local", "share")) / "fitscope"


def preferences_path() -> Path:
    return config_dir() / "settings.json"
