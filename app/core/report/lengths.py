"""Conversation lengths in the units people think in: tokens (what llama.cpp counts), words, and
pages. The assumptions are stated wherever a conversion is shown: English prose has about
:data:`WORDS_PER_TOKEN` words a token (as commonly quoted for BPE tokenizers), and a page of prose
about :data:`WORDS_PER_PAGE` words (single-spaced, 12 pt).
"""

from __future__ import annotations

from typing import Literal

WORDS_PER_TOKEN = 0.75
WORDS_PER_PAGE = 500
TOKENS_PER_PAGE = WORDS_PER_PAGE / WORDS_PER_TOKEN  # about 667

LengthUnit = Literal["tokens", "words", "pages"]
UNIT_WORDS: dict[str, str] = {"tokens": "tokens", "words": "words", "pages": "pages"}

ASSUMPTION = (
    f"a page of prose is about {WORDS_PER_PAGE} words, a word about {1 / WORDS_PER_TOKEN:.2f} tokens "
    f"(so a page is about {TOKENS_PER_PAGE:,.0f} tokens)"
)


def tokens_per(unit: str) -> float:
    """How many tokens one ``unit`` is."""
    return {"tokens": 1.0, "words": 1 / WORDS_PER_TOKEN, "pages": TOKENS_PER_PAGE}[unit]


def to_unit(tokens: int, unit: str) -> float:
    """``tokens`` in ``unit``."""
    return tokens / tokens_per(unit)


def from_unit(value: float, unit: str) -> int:
    """``value`` ``unit`` in tokens (rounded to a whole token)."""
    return max(1, round(value * tokens_per(unit)))


def _round_figure(x: float) -> str:
    if x >= 1000:
        return f"{round(x, -2):,.0f}"
    if x >= 10:
        return f"{x:,.0f}"
    return f"{x:.1f}".rstrip("0").rstrip(".")


def length_words(tokens: int) -> str:
    """A length in every unit: "about 98 pages, 49,200 words (65,536 tokens)"."""
    pages = to_unit(tokens, "pages")
    words = to_unit(tokens, "words")
    page_text = f"{_round_figure(pages)} page{'s' if pages >= 1.5 or pages < 1 else ''}"
    return f"about {page_text}, {_round_figure(words)} words ({tokens:,} tokens)"
