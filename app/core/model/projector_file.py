"""Reading a vision projector file (``--mmproj``, ``general.architecture = "clip"``): its encoder's
shape from the ``clip.vision.*`` keys and tensor widths, and its exact weights (the sum of its tensors,
as ``clip_model_loader``'s constructor sums ``ggml_nbytes`` into the ``model size`` it prints;
tools/mtmd/clip.cpp in the vendored llama.cpp).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.core.common.errors import ModelFileError
from app.core.model.projector import ProjectorSpec
from app.core.model.tensors import GGMLType

if TYPE_CHECKING:
    from app.core.model.gguf_reader import GgufHeader


def _uint(metadata: Mapping[str, Any], key: str, shown: str, default: int | None = None) -> int:
    value = metadata.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        if value is None:
            raise ModelFileError(f"{shown} has no '{key}' entry, which a vision projector needs.")
        raise ModelFileError(f"{shown}: '{key}' is {value!r}, not a whole number.")
    return value


def read_projector(path: str | Path) -> ProjectorSpec:
    """Read a projector GGUF (``--mmproj``): its encoder's shape and its exact weights.

    Raises ModelFileError when the file cannot be read, is not a vision projector (a text model,
    an audio-only projector) or misses a key llama.cpp needs.
    """
    from app.core.model.gguf_reader import read_gguf_header

    return projector_from_header(read_gguf_header(path))


def projector_from_header(header: GgufHeader) -> ProjectorSpec:
    """The projector a GGUF header (a local file's, or one read over the network) describes.
    Raises ModelFileError as :func:`read_projector` does."""
    shown = str(header.path)
    md = header.metadata
    if md.get("general.architecture") != "clip":
        raise ModelFileError(
            f"{shown} is not a vision projector: its general.architecture is "
            f"{md.get('general.architecture')!r}, not 'clip' (mmproj files are)."
        )
    if md.get("clip.has_vision_encoder") is not True:
        raise ModelFileError(f"{shown} has no vision encoder (clip.has_vision_encoder), so it cannot read images.")
    ptype = md.get("clip.projector_type") or md.get("clip.vision.projector_type")
    if not isinstance(ptype, str) or not ptype:
        raise ModelFileError(f"{shown} does not say its projector type (clip.projector_type).")
    tensors = {t.name: t for t in header.tensors}

    def width(name: str, dim: int) -> int | None:
        t = tensors.get(name)
        return t.shape[dim] if t is not None and len(t.shape) > dim else None

    n_embd = _uint(md, "clip.vision.embedding_length", shown)
    if ptype == "gemma3":
        n_embd_text = width("mm.input_projection.weight", 0)
        n_merge = _uint(md, "clip.vision.projector.scale_factor", shown, 4)
    elif ptype == "pixtral":
        n_embd_text = width("mm.2.weight", 1)
        n_merge = _uint(md, "clip.vision.spatial_merge_size", shown, 1)
    elif ptype == "qwen3vl_merger":  # clip.cpp load_hparams: spatial merge 2 unless the file says
        n_embd_text = width("mm.2.weight", 1)
        n_merge = _uint(md, "clip.vision.spatial_merge_size", shown, 2)
    elif ptype == "kimik25":  # the merge kernel is written as the scale factor
        n_embd_text = width("mm.2.weight", 1)
        n_merge = _uint(md, "clip.vision.projector.scale_factor", shown, 2)
    elif ptype == "gemma4v":  # clip.cpp load_hparams: pooling kernel 3 unless the file says
        n_embd_text = width("mm.input_projection.weight", 1)
        n_merge = _uint(md, "clip.vision.projector.scale_factor", shown, 3)
    else:
        n_embd_text = None
        n_merge = 1
    if n_embd_text is None:
        n_embd_text = _uint(md, "clip.vision.projection_dim", shown, n_embd)
    patch = tensors.get("v.patch_embd.weight")
    proj = tensors.get("mm.input_projection.weight")
    name = md.get("general.name")
    return ProjectorSpec(
        name=name.strip() if isinstance(name, str) and name.strip() else header.path.stem,
        projector_type=ptype,
        source=shown,
        file_name=str(header.path),
        image_size=_uint(md, "clip.vision.image_size", shown) or 1,
        patch_size=_uint(md, "clip.vision.patch_size", shown),
        n_embd=n_embd,
        n_ff=_uint(md, "clip.vision.feed_forward_length", shown),
        n_layer=_uint(md, "clip.vision.block_count", shown),
        n_head=_uint(md, "clip.vision.attention.head_count", shown),
        n_embd_text=n_embd_text,
        n_merge=max(1, n_merge),
        weights_bytes=header.tensors_bytes,
        patch_embd_type=patch.ggml_type if patch is not None else GGMLType.F16,
        input_projection_type=proj.ggml_type if proj is not None else GGMLType.F16,
        has_patch_merger="mm.patch_merger.weight" in tensors,
        gated_ffn="v.blk.0.ffn_gate.weight" in tensors,
        has_post_norm="v.post_ln.weight" in tensors,
        n_pos_embd=(width("v.position_embd.weight", 1) or 0) if ptype == "gemma4v" else 0,
        image_max_pixels=_uint(md, "clip.vision.image_max_pixels", shown, 0),
        has_audio_encoder=md.get("clip.has_audio_encoder") is True,
        n_deepstack=sum(1 for n in tensors if n.startswith("v.deepstack.") and n.endswith(".fc1.weight")),
    )
