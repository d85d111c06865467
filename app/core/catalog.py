"""The built-in catalogs in resources/catalog: models and devices, validated when loaded."""

from __future__ import annotations

import difflib
import json
from functools import cache
from pathlib import Path
from typing import Protocol, TypeVar

from pydantic import TypeAdapter, ValidationError

from app.core.architecture import Architecture
from app.core.devices import DeviceSpec
from app.core.errors import CatalogError

RESOURCES_DIR = Path(__file__).resolve().parents[2] / "resources"
CATALOG_DIR = RESOURCES_DIR / "catalog"


class _HasId(Protocol):
    id: str


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


def _find(items: tuple, item_id: str, what: str):
    wanted = item_id.strip().lower()
    for item in items:
        if item.id == wanted:
            return item
    ids = [item.id for item in items]
    close = difflib.get_close_matches(wanted, ids, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise CatalogError(f"There is no {what} '{item_id}' in the catalog.{hint}")


def find_model(model_id: str) -> Architecture:
    """The catalog model with this id. Raises CatalogError naming close matches."""
    return _find(load_models(), model_id, "model")


def find_device(device_id: str) -> DeviceSpec:
    """The catalog device with this id. Raises CatalogError naming close matches."""
    return _find(load_devices(), device_id, "device")
