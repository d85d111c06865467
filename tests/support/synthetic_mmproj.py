"""Sparse synthetic vision projectors (mmproj GGUFs): the header llama.cpp's converter writes for a
projector, its tensors named and shaped as clip.cpp loads them, and zeros that take no disk.

mtmd loads such a file like the published one, so its model size and the compute buffer it
reserves at warm-up can be measured without the weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

from app.core.model.projector import ProjectorSpec
from app.core.model.projector_layout import projector_tensors
from app.core.model.tensors import TensorInfo

ALIGNMENT = 32


def write_sparse_mmproj(
    path: Path, spec: ProjectorSpec, tensors: Sequence[TensorInfo] | None = None
) -> list[TensorInfo]:
    """Write ``spec`` as a sparse F16 projector GGUF at ``path``; return its tensors (the converter's
    layout of ``spec`` unless ``tensors`` gives others)."""
    tensors = list(projector_tensors(spec.projector_type, spec.shape) if tensors is None else tensors)
    w = GGUFWriter(path, "clip")
    w.add_name(spec.name)
    w.add_file_type(1)  # MOSTLY_F16
    w.add_clip_has_vision_encoder(True)
    if spec.projector_type == "gemma4v":  # Gemma4VisionAudioModel names the vision type only
        w.add_clip_vision_projector_type(spec.projector_type)
    else:
        w.add_clip_projector_type(spec.projector_type)
    w.add_vision_image_size(spec.image_size)
    w.add_vision_patch_size(spec.patch_size)
    w.add_vision_embedding_length(spec.n_embd)
    w.add_vision_feed_forward_length(spec.n_ff)
    w.add_vision_block_count(spec.n_layer)
    w.add_vision_head_count(spec.n_head)
    w.add_vision_projection_dim(spec.n_embd_text)
    w.add_vision_image_mean([0.5, 0.5, 0.5])
    w.add_vision_image_std([0.5, 0.5, 0.5])
    if spec.projector_type == "gemma3":
        w.add_vision_attention_layernorm_eps(1e-6)
        w.add_vision_use_gelu(True)
        if spec.n_merge != 4:
            w.add_vision_projector_scale_factor(spec.n_merge)
    elif spec.projector_type == "pixtral":
        w.add_vision_attention_layernorm_eps(1e-5)
        w.add_vision_use_silu(True)
        if spec.n_merge > 1:
            w.add_vision_spatial_merge_size(spec.n_merge)
    elif spec.projector_type == "gemma4v":  # Gemma4VisionAudioModel.set_gguf_parameters: eps only
        w.add_vision_attention_layernorm_eps(1e-6)
        if spec.n_merge != 3:
            w.add_vision_projector_scale_factor(spec.n_merge)
    elif spec.projector_type == "kimik25":  # KimiK25Model.set_gguf_parameters
        side = spec.image_size // spec.patch_size
        for key in ("vision.pos_emb_height", "vision.pos_emb_width"):
            w.add_uint32(key, side)
        w.add_uint32("vision.pos_emb_time", 4)
        w.add_vision_use_gelu(True)
        w.add_vision_attention_layernorm_eps(1e-5)
        w.add_vision_projector_scale_factor(spec.n_merge)
        w.add_vision_min_pixels(8 * spec.patch_size**2)
        w.add_vision_max_pixels(spec.image_max_pixels)
    elif spec.projector_type == "qwen3vl_merger":  # Qwen3VLVisionModel.set_gguf_parameters
        w.add_vision_use_gelu(True)
        w.add_vision_spatial_merge_size(spec.n_merge)
        w.add_vision_attention_layernorm_eps(1e-6)  # the text model's rms_norm_eps
        w.add_vision_is_deepstack_layers([False] * spec.n_layer)
    for t in tensors:
        w.add_tensor_info(
            t.name,
            tuple(reversed(t.shape)),
            np.dtype(np.float32),
            t.n_bytes,
            raw_dtype=GGMLQuantizationType(int(t.ggml_type)),
        )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    header = path.stat().st_size
    data_start = -(-header // ALIGNMENT) * ALIGNMENT
    data = sum(-(-t.n_bytes // ALIGNMENT) * ALIGNMENT for t in tensors)
    with path.open("r+b") as f:
        f.truncate(data_start + data)
    return tensors
