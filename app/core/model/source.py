"""A model ready to estimate: its architecture and tensor list, from the catalog (quantized with a
llama.cpp preset), a GGUF header (a local file's, or one read from a server: its real tensors) or a
Hugging Face config.json."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from app.core.model.architecture import Architecture
from app.core.model.catalog import find_model
from app.core.model.quant import find_preset, preset_for_ftype, quantize_layout
from app.core.model.tensors import TensorInfo

if TYPE_CHECKING:
    from app.core.model.gguf_model import GgufModel


@dataclass(frozen=True)
class ModelSource:
    """A model ready to estimate: its architecture, its tensors and where they came from."""

    arch: Architecture
    tensors: tuple[TensorInfo, ...]
    label: str
    quant: str
    path: Path | None = None


def model_from_catalog(model_id: str, quant: str = "Q4_K_M") -> ModelSource:
    """A catalog model quantized with a llama.cpp preset. Raises CatalogError / EstimateError."""
    arch = find_model(model_id)
    preset = find_preset(quant)
    return ModelSource(arch, tuple(quantize_layout(arch, preset)), arch.name, preset.name)


def model_from_gguf(path: str | Path) -> ModelSource:
    """A local GGUF file: its real tensors. Raises ModelFileError with a readable message."""
    from app.core.model.gguf_model import read_gguf

    return model_from_header(read_gguf(path), Path(path))


def model_from_header(g: GgufModel, path: Path | None) -> ModelSource:
    """The model a GGUF header describes: a local file's (at ``path``) or a server's (None: there
    is no file here to run)."""
    preset = preset_for_ftype(g.file_type)
    return ModelSource(g.architecture, g.tensors, g.name, preset.name if preset else "file", path)


def model_from_hf_config(path: str | Path, quant: str = "Q4_K_M") -> ModelSource:
    """A Hugging Face config.json, quantized with a llama.cpp preset."""
    from app.core.model.hf_config import read_hf_config

    arch = read_hf_config(path)
    preset = find_preset(quant)
    return ModelSource(arch, tuple(quantize_layout(arch, preset)), arch.name, preset.name, Path(path))
