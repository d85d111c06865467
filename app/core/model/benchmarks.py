"""How good a catalog model's answers are, in plain words, from a published score: each figure in
``resources/catalog/quality.json`` is an MMLU-Pro percentage copied from a cited source (a model
card, a technical report or a leaderboard), with the setting that source reports. A model without
one says "no published score" and is never given an invented figure.

The plain level (toy, weak, fair, good, very good, excellent) follows the score in fixed bands
(:data:`LEVELS`). :func:`too_small_for_many` says when a model is far too small to serve several
people as an office assistant: a weak or toy score, or, without a score, fewer than
:data:`SMALL_PARAMS_BILLIONS` billion parameters. The catalog's own date is here too: a search that
finds nothing says how old the catalog is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pydantic import Field, TypeAdapter, ValidationError

from app.core.common.errors import CatalogError
from app.core.common.units import Frozen
from app.core.model.catalog import CATALOG_DIR

SMALL_PARAMS_BILLIONS = 3.0
"""Below this size, and without a score, a model is taken to be too small for a shared assistant."""


@dataclass(frozen=True)
class Level:
    key: str
    words: str
    meaning: str
    from_percent: float  # the band starts at this MMLU-Pro score


LEVELS: tuple[Level, ...] = (
    Level("excellent", "excellent", "among the strongest open models; fit for demanding office work", 75.0),
    Level("very-good", "very good", "a dependable office assistant: letters, summaries, analysis", 65.0),
    Level("good", "good", "everyday drafting and questions; check its figures and reasoning", 55.0),
    Level("fair", "fair", "simple drafting and look-ups; makes mistakes a colleague would catch", 40.0),
    Level("weak", "weak", "short, simple tasks only; not an office assistant", 25.0),
    Level("toy", "a toy", "demos and speed tests only, not work", 0.0),
)
UNRATED = Level("unrated", "no published score", "FitScope cites no published score for this model", -1.0)


class _Source(Frozen):
    title: str
    url: str = Field(pattern=r"^https://")


class _Entry(Frozen):
    mmlu_pro_percent: float = Field(ge=0, le=100)
    setting: str
    source: str


class _QualityFile(Frozen):
    benchmark: str
    about: str
    sources: dict[str, _Source]
    models: dict[str, _Entry]


@dataclass(frozen=True)
class Score:
    """One published MMLU-Pro figure: the percentage, the setting it was measured in, its source."""

    model_id: str
    mmlu_pro_percent: float
    setting: str
    source_title: str
    source_url: str

    @property
    def level(self) -> Level:
        return level_of(self.mmlu_pro_percent)

    def citation(self) -> str:
        """The figure with where it comes from, for a tooltip or a details line."""
        return f"MMLU-Pro {self.mmlu_pro_percent:g}% ({self.setting}; {self.source_title}, {self.source_url})"


@cache
def _quality_file(path: Path = CATALOG_DIR / "quality.json") -> _QualityFile:
    try:
        data = _QualityFile.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError, ValidationError) as exc:
        raise CatalogError(f"Catalog file {path} cannot be read: {str(exc).splitlines()[0]}.") from exc
    unknown = sorted({e.source for e in data.models.values()} - set(data.sources))
    if unknown:
        raise CatalogError(f"Catalog file {path} names sources it does not list: {', '.join(unknown)}.")
    return data


def score_of(model_id: str) -> Score | None:
    """The published score of catalog model ``model_id``, or None when FitScope cites none."""
    entry = _quality_file().models.get(model_id)
    if entry is None:
        return None
    source = _quality_file().sources[entry.source]
    return Score(model_id, entry.mmlu_pro_percent, entry.setting, source.title, source.url)


def scored_models() -> tuple[str, ...]:
    """The catalog model ids that have a published score."""
    return tuple(_quality_file().models)


def benchmark_note() -> str:
    """What the score is and how far to trust a comparison of two (for the details and the help)."""
    return _quality_file().about


def level_of(percent: float) -> Level:
    """The plain level of an MMLU-Pro percentage."""
    return next(level for level in LEVELS if percent >= level.from_percent)


def level_for(model_id: str | None) -> Level:
    """The level of a catalog model (:data:`UNRATED` without a published score)."""
    score = score_of(model_id) if model_id else None
    return score.level if score is not None else UNRATED


def too_small_for_many(model_id: str | None, params_billions: float | None) -> bool:
    """Whether a model is far too small to serve several people as an office assistant: its
    published score is weak or a toy's, or it has none and under :data:`SMALL_PARAMS_BILLIONS`
    billion parameters."""
    level = level_for(model_id)
    if level is not UNRATED:
        return level.key in ("weak", "toy")
    return params_billions is not None and params_billions < SMALL_PARAMS_BILLIONS


TOY_PARAMS_BILLIONS = 1.0
"""Below this size, and without a score, a model is taken to be a toy whatever the number of people."""


def size_warning(model_id: str | None, name: str, params_billions: float | None, users: int) -> str:
    """The sentence when a model is far too small for the job ("" when it is not): for several
    people, :func:`too_small_for_many`; for one, a toy's score or under a billion parameters."""
    level = level_for(model_id)
    if level is not UNRATED:
        why = f"its published answers are {level.words}, {level.meaning}"
    else:
        why = f"it has {params_billions:g} billion parameters and no published score" if params_billions else ""
    toy = level.key == "toy" or (
        level is UNRATED and params_billions is not None and params_billions < TOY_PARAMS_BILLIONS
    )
    if users > 1 and too_small_for_many(model_id, params_billions):
        return (
            f"{name} is far too small for an assistant {users} people share: {why}. "
            "Look for a larger model (Which machine? > Models for this machine)."
        )
    if toy:
        return f"{name} is a toy model, fine for measuring speed but not for answering questions at work: {why}."
    return ""


def answer_quality(model_id: str | None) -> str:
    """The level in a few words, with the score: "very good (MMLU-Pro 69.1%)", "no published score"."""
    score = score_of(model_id) if model_id else None
    if score is None:
        return UNRATED.words
    return f"{score.level.words} (MMLU-Pro {score.mmlu_pro_percent:g}%)"


def answer_quality_sentence(model_id: str | None, name: str) -> str:
    """One sentence on how good ``name``'s answers are, and what that score is."""
    score = score_of(model_id) if model_id else None
    if score is None:
        return f"Answer quality of {name}: no published score (FitScope cites none for it)."
    level = score.level
    return (
        f"Answer quality of {name}: {level.words}, {level.meaning} (MMLU-Pro {score.mmlu_pro_percent:g}%, "
        f"{score.setting}; {score.source_title})."
    )


class _About(Frozen):
    models_updated: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    about: str = ""


@cache
def catalog_date(path: Path = CATALOG_DIR / "about.json") -> str:
    """The date the model catalog was last brought up to date (YYYY-MM-DD)."""
    try:
        return TypeAdapter(_About).validate_json(path.read_bytes()).models_updated
    except (OSError, ValidationError) as exc:
        raise CatalogError(f"Catalog file {path} cannot be read: {str(exc).splitlines()[0]}.") from exc
