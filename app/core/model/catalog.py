"""The built-in catalogs in resources/catalog: models, devices and vision projectors, validated when loaded."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Protocol, TypeVar

from pydantic import Field, TypeAdapter, ValidationError

from app.core.common.errors import CatalogError
from app.core.common.units import Frozen
from app.core.hardware.devices import DeviceSpec
from app.core.model.architecture import Architecture
from app.core.model.projector import SUPPORTED_TYPES, ProjectorSpec, spec_from_layout

RESOURCES_DIR = Path(__file__).resolve().parents[3] / "resources"
CATALOG_DIR = RESOURCES_DIR / "catalog"


class _HasId(Protocol):
    @property
    def id(self) -> str: ...


_Item = TypeVar("_Item", bound=_HasId)


def _load_list(path: Path, item_type: type[_Item]) -> list[_Item]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise CatalogError(f"Catalog file {path} is missing.") from exc
    except json.JSONDecodeError as exc:
        raise CatalogError(f"Catalog file {path} is not valid JSON (line {exc.lineno}): {exc.msg}.") from exc
    try:
        items: list[_Item] = TypeAdapter(list[item_type]).validate_python(raw)  # type: ignore[valid-type]
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CatalogError(f"Catalog file {path} is invalid at {where}: {first['msg']}.") from exc
    ids = [item.id for item in items]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise CatalogError(f"Catalog file {path} repeats the ids {', '.join(duplicates)}.")
    return items


@cache
def load_models(path: Path = CATALOG_DIR / "models.json") -> tuple[Architecture, ...]:
    """Every catalog model, in file order. Raises CatalogError when the file is bad."""
    return tuple(_load_list(path, Architecture))


@cache
def load_devices(path: Path = CATALOG_DIR / "devices.json") -> tuple[DeviceSpec, ...]:
    """Every catalog device, in file order. Raises CatalogError when the file is bad."""
    return tuple(_load_list(path, DeviceSpec))


def _find(items: tuple[_Item, ...], item_id: str, what: str) -> _Item:
    wanted = item_id.strip().lower()
    for item in items:
        if item.id == wanted:
            return item
    import difflib  # only to name close matches in the error

    ids = [item.id for item in items]
    close = difflib.get_close_matches(wanted, ids, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise CatalogError(f"There is no {what} '{item_id}' in the catalog.{hint}")


# The families the window's model list groups the catalog by: (catalog id prefix, family), the first match
# wins, so longer prefixes come first.
FAMILIES: tuple[tuple[str, str], ...] = (
    ("llama-4", "Llama 4"),
    ("llama-3", "Llama 3"),
    ("qwen3.5", "Qwen3.5 / Qwen3.6"),
    ("qwen3.6", "Qwen3.5 / Qwen3.6"),
    ("qwen3-coder", "Qwen3-Coder"),
    ("qwen3-next", "Qwen3-Next"),
    ("qwen3", "Qwen3"),
    ("qwen2.5", "Qwen2.5"),
    ("gemma-4", "Gemma 4"),
    ("gemma-3", "Gemma 3"),
    ("gemma-2", "Gemma 2"),
    ("deepseek", "DeepSeek"),
    ("kimi", "Kimi"),
    ("glm", "GLM"),
    ("minimax", "MiniMax"),
    ("nemotron", "Nemotron"),
    ("ministral", "Mistral"),
    ("mistral", "Mistral"),
    ("mixtral", "Mistral"),
    ("gpt-oss", "gpt-oss"),
    ("phi", "Phi"),
    ("mamba", "Mamba"),
    ("falcon-mamba", "Mamba"),
    ("lfm2", "LFM2"),
    ("seed-oss", "Seed-OSS"),
    ("ernie", "ERNIE"),
    ("smollm", "SmolLM"),
    ("laguna", "Laguna"),
    ("granite", "Granite"),
    ("apertus", "Apertus"),
)


def family_of(model: Architecture) -> str:
    """The family a catalog model is listed under (its name's first word when no family matches)."""
    return next((family for prefix, family in FAMILIES if model.id.startswith(prefix)), model.name.split()[0])


def by_family(models: tuple[Architecture, ...] | list[Architecture]) -> list[tuple[str, list[Architecture]]]:
    """The models grouped by family, families in the order their first model appears."""
    groups: dict[str, list[Architecture]] = {}
    for m in models:
        groups.setdefault(family_of(m), []).append(m)
    return list(groups.items())


def find_model(model_id: str) -> Architecture:
    """The catalog model with this id. Raises CatalogError naming close matches."""
    return _find(load_models(), model_id, "model")


def find_device(device_id: str) -> DeviceSpec:
    """The catalog device with this id. Raises CatalogError naming close matches."""
    return _find(load_devices(), device_id, "device")


class ProjectorEntry(Frozen):
    """A catalog model's vision projector: the facts of its config.json's ``vision_config``.

    The weights are those of the F16 projector file llama.cpp's converter writes
    (``mmproj-*-f16.gguf``), summed from :func:`app.core.model.projector.projector_tensors`.
    """

    model_id: str
    name: str
    projector_type: str
    source: str = Field(pattern=r"^https://")
    image_size: int = Field(ge=1, le=8192)
    patch_size: int = Field(ge=1, le=1024)
    n_layer: int = Field(ge=1, le=1024)
    n_embd: int = Field(ge=1, le=65536)
    n_ff: int = Field(ge=1, le=1 << 20)
    n_head: int = Field(ge=1, le=1024)
    n_embd_text: int = Field(ge=1, le=1 << 20)
    n_merge: int = Field(ge=1, le=64)
    n_pos_embd: int = Field(default=0, ge=0, le=1 << 20)
    image_max_pixels: int = Field(default=0, ge=0, le=1 << 28)
    notes: str = ""

    @property
    def id(self) -> str:
        return self.model_id

    def spec(self) -> ProjectorSpec:
        return spec_from_layout(
            name=self.name,
            projector_type=self.projector_type,
            source=self.source,
            file_name=f"mmproj-{self.model_id}-f16.gguf",
            image_size=self.image_size,
            patch_size=self.patch_size,
            n_embd=self.n_embd,
            n_ff=self.n_ff,
            n_layer=self.n_layer,
            n_head=self.n_head,
            n_embd_text=self.n_embd_text,
            n_merge=self.n_merge,
            n_pos_embd=self.n_pos_embd,
            image_max_pixels=self.image_max_pixels,
        )


@cache
def load_projectors(path: Path = CATALOG_DIR / "projectors.json") -> tuple[ProjectorEntry, ...]:
    """Every catalog projector. Raises CatalogError when the file is bad: an unknown model or
    projector type, or an output width that is not the text model's n_embd."""
    entries = tuple(_load_list(path, ProjectorEntry))
    models = {m.id: m for m in load_models()}
    for e in entries:
        model = models.get(e.model_id)
        if model is None:
            raise CatalogError(f"Catalog file {path}: projector '{e.name}' names the unknown model '{e.model_id}'.")
        if e.projector_type not in SUPPORTED_TYPES:
            raise CatalogError(
                f"Catalog file {path}: projector '{e.name}' has type '{e.projector_type}'; "
                f"FitScope models {', '.join(SUPPORTED_TYPES)}."
            )
        if e.n_embd_text != model.n_embd:
            raise CatalogError(
                f"Catalog file {path}: projector '{e.name}' outputs width {e.n_embd_text}, but {model.name} "
                f"takes {model.n_embd}."
            )
    return entries


def find_projector(model_id: str) -> ProjectorEntry | None:
    """The vision projector of a catalog model, or None when it has none (text-only)."""
    wanted = model_id.strip().lower()
    return next((p for p in load_projectors() if p.model_id == wanted), None)
