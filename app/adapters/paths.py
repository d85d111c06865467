"""Where FitScope keeps its files: the platform's config, data and cache folders.

``FITSCOPE_CONFIG_DIR`` / ``FITSCOPE_DATA_DIR`` / ``FITSCOPE_CACHE_DIR`` override them (tests and
portable installs).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

APP_DIR_NAME = "FitScope"


def _platform_dir(override: str, windows_env: str, windows_default: str, xdg_env: str, xdg_default: str) -> Path:
    chosen = os.environ.get(override)
    if chosen:
        return Path(chosen)
    home = Path.home()
    if sys.platform == "win32":
        return Path(os.environ.get(windows_env) or home / "AppData" / windows_default) / APP_DIR_NAME
    if sys.platform == "darwin":
        return home / "Library" / "Application Support" / APP_DIR_NAME
    return Path(os.environ.get(xdg_env) or home / xdg_default) / "fitscope"


def config_dir() -> Path:
    return _platform_dir("FITSCOPE_CONFIG_DIR", "APPDATA", "Roaming", "XDG_CONFIG_HOME", ".config")


def data_dir() -> Path:
    return _platform_dir("FITSCOPE_DATA_DIR", "LOCALAPPDATA", "Local", "XDG_DATA_HOME", ".local/share")


def cache_dir() -> Path:
    """What can be fetched again (remote GGUF headers): Linux ``$XDG_CACHE_HOME/fitscope``, macOS
    ``~/Library/Caches/FitScope``, Windows ``%LOCALAPPDATA%\\FitScope\\Cache``."""
    chosen = os.environ.get("FITSCOPE_CACHE_DIR")
    if chosen:
        return Path(chosen)
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local") / APP_DIR_NAME / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / APP_DIR_NAME
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fitscope"


def preferences_path() -> Path:
    return config_dir() / "settings.json"
