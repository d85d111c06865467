from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_folders(tmp_path_factory: pytest.TempPathFactory):
    """Tests never read or write the user's settings and run history."""
    import os

    saved = {k: os.environ.get(k) for k in ("FITSCOPE_CONFIG_DIR", "FITSCOPE_DATA_DIR", "FITSCOPE_CACHE_DIR")}
    os.environ["FITSCOPE_CONFIG_DIR"] = str(tmp_path_factory.mktemp("config"))
    os.environ["FITSCOPE_DATA_DIR"] = str(tmp_path_factory.mktemp("data"))
    os.environ["FITSCOPE_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def demo_gguf() -> Path:
    """The real demo model (Gemma 3 270M Q4_K_M), assembled from its PyPI package."""
    from app.adapters.demo_model import demo_model_path
    from app.core.common.errors import FitScopeError

    try:
        return demo_model_path()
    except FitScopeError as exc:  # the README's setup installs it; say so when it is missing
        pytest.skip(str(exc))
