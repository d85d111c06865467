"""What an empty search of the model catalog says, so that it is never a blank list: the
catalog's date (a model released later is not in it), the nearest models by name (links that pick
them), and the ways to add the model: its GGUF file, its config.json, or the Hugging Face Hub or
Ollama's library (links the controls turn into the window's dialogs)."""

from __future__ import annotations

import datetime
import difflib
import html
import os
import re
from collections.abc import Sequence

from app.core.model.benchmarks import catalog_date

MIN_CLOSENESS = 0.6  # the letters in common plus the shared start: below it a name is not "near"


def nearest_models(text: str, names: Sequence[tuple[str, str]], count: int = 3) -> list[tuple[str, str]]:
    """The catalog models whose names or ids are nearest ``text`` (letters and digits compared, so
    "qwen 3.5" is near "Qwen3 ..."), best first; none when nothing is near."""

    def plain(s: str) -> str:
        return re.sub(r"[^a-z0-9.]", "", s.lower())

    wanted = plain(text)
    if not wanted:
        return []

    def closeness(entry: tuple[str, str]) -> float:
        model_id, name = entry
        best = 0.0
        for candidate in (plain(model_id), plain(name)):
            ratio = difflib.SequenceMatcher(None, wanted, candidate).ratio()
            prefix = len(os.path.commonprefix([wanted, candidate])) / max(len(wanted), 1)
            best = max(best, ratio + prefix)
        return best

    ranked = sorted(names, key=closeness, reverse=True)[:count]
    return [entry for entry in ranked if closeness(entry) >= MIN_CLOSENESS]


def search_help_html(text: str, names: Sequence[tuple[str, str]]) -> str:
    """What an empty search says: the catalog's date, the nearest models (links that pick them),
    and the ways to add the model (links to the file, config.json and server dialogs)."""
    date = datetime.date.fromisoformat(catalog_date())
    nearest = nearest_models(text, names)
    near = ", ".join(f'<a href="model:{html.escape(i)}">{html.escape(n)}</a>' for i, n in nearest)
    return (
        f"No model in the catalog matches “{html.escape(text)}”. The catalog was brought up to date on "
        f"{date.day} {date:%B %Y}; newer models are not in it."
        + (f"<br>Nearest: {near}." if near else "")
        + '<br>To add it: <a href="gguf:">open its GGUF file</a>, <a href="config:">import its config.json</a>, '
        'or open it from <a href="hf:">Hugging Face</a> or <a href="ollama:">Ollama</a> (read from the server '
        "without downloading the weights)."
    )
