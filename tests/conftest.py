from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def demo_gguf() -> Path:
    """The real demo model (Gemma 3 270M Q4_K_M), assembled from its PyPI package."""
    from app.adapters.demo_model import demo_model_path
    from app.core.errors import FitScopeError

    try:
        return demo_model_path()
    except FitScopeError as exc:  # the README's setup installs it; say so when it is missing
        pytest.skip(str(exc))
