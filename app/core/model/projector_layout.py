"""The tensors of a vision projector (mmproj) file, per projector type, as llama.cpp's converter writes
them into an F16 file and as ``clip_model_loader::load_tensors`` (tools/mtmd/clip.cpp) loads them.

Types follow convert_hf_to_gguf (conversion/base.py ``ModelBase.prepare_tensors``): 1-D tensors and
norms F32; position embeddings F32 (``V_ENC_EMBD_POS`` is in its always-F32 list); a tensor whose
name does not end in ``.weight`` F32 unless the model forces a type; ``MmprojModel.tensor_force_quant``
keeps patch embeddings and patch mergers F16 in an F16 file; every other matrix F16.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from app.core.model.tensors import GGMLType, TensorInfo

F16, F32 = GGMLType.F16, GGMLType.F32


class VisionShape(NamedTuple):
    """The facts of a vision encoder that fix its tensors (ggml widths)."""

    image_size: int
    patch_size: int
    n_embd: int
    n_ff: int
    n_layer: int
    n_embd_text: int
    n_merge: int


Add = Callable[..., None]


def _gemma3(add: Add, s: VisionShape) -> None:
    """Gemma 3 (``Gemma3VisionModel``): SigLIP with biases; ``.embeddings.`` tensors kept F32 and the
    input projection F16 (its ``tensor_force_quant``)."""
    e, n_pos = s.n_embd, (s.image_size // s.patch_size) ** 2
    add("v.patch_embd.weight", F32, s.patch_size, s.patch_size, 3, e)
    add("v.patch_embd.bias", F32, e)
    add("v.position_embd.weight", F32, e, n_pos)
    for il in range(s.n_layer):
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            add(f"v.blk.{il}.{part}.weight", F16, e, e)
            add(f"v.blk.{il}.{part}.bias", F32, e)
        for norm in ("ln1", "ln2"):
            add(f"v.blk.{il}.{norm}.weight", F32, e)
            add(f"v.blk.{il}.{norm}.bias", F32, e)
        add(f"v.blk.{il}.ffn_up.weight", F16, e, s.n_ff)
        add(f"v.blk.{il}.ffn_up.bias", F32, s.n_ff)
        add(f"v.blk.{il}.ffn_down.weight", F16, s.n_ff, e)
        add(f"v.blk.{il}.ffn_down.bias", F32, e)
    add("v.post_ln.weight", F32, e)
    add("v.post_ln.bias", F32, e)
    add("mm.input_projection.weight", F16, s.n_embd_text, e)
    add("mm.soft_emb_norm.weight", F32, e)


def _pixtral(add: Add, s: VisionShape) -> None:
    """Pixtral / Mistral 3 (``PixtralModel``, ``LlavaVisionModel``): no biases, a SwiGLU feed-forward,
    a patch merger when ``spatial_merge_size`` > 1 and the [IMG_BREAK] embedding."""
    e = s.n_embd
    add("v.patch_embd.weight", F16, s.patch_size, s.patch_size, 3, e)
    add("v.pre_ln.weight", F32, e)
    for il in range(s.n_layer):
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            add(f"v.blk.{il}.{part}.weight", F16, e, e)
        add(f"v.blk.{il}.ln1.weight", F32, e)
        add(f"v.blk.{il}.ln2.weight", F32, e)
        add(f"v.blk.{il}.ffn_gate.weight", F16, e, s.n_ff)
        add(f"v.blk.{il}.ffn_up.weight", F16, e, s.n_ff)
        add(f"v.blk.{il}.ffn_down.weight", F16, s.n_ff, e)
    if s.n_merge > 1:
        add("mm.input_norm.weight", F32, e)
        add("mm.patch_merger.weight", F16, e * s.n_merge * s.n_merge, e)
    add("mm.1.weight", F16, e, s.n_embd_text)
    add("mm.2.weight", F16, s.n_embd_text, s.n_embd_text)
    add("v.token_embd.img_break", F32, s.n_embd_text)


def _qwen3vl(add: Add, s: VisionShape) -> None:
    """Qwen3-VL and Qwen3.5 / Qwen3.6 (``Qwen3VLVisionModel``, conversion/qwen3vl.py): the Conv3D patch
    embedding split into two F16 Conv2D kernels (``v.patch_embd.weight`` and ``.weight.1``, the
    second kept F16 by the patch-embedding rule although its name does not end in ``.weight``) with
    one bias; learned position embeddings over ``num_position_embeddings`` (F32); fused QKV and every
    linear with a bias; the merger's norm as ``v.post_ln`` and its two linears as ``mm.0`` / ``mm.2``
    over ``n_merge``^2 merged patches. Deepstack mergers (Qwen3-VL only; Qwen3.5's
    ``deepstack_visual_indexes`` is empty) are not written here."""
    e, p, n_pos = s.n_embd, s.patch_size, (s.image_size // s.patch_size) ** 2
    merged = e * s.n_merge * s.n_merge
    add("v.patch_embd.weight", F16, p, p, 3, e)
    add("v.patch_embd.weight.1", F16, p, p, 3, e)
    add("v.patch_embd.bias", F32, e)
    add("v.position_embd.weight", F32, e, n_pos)
    for il in range(s.n_layer):
        add(f"v.blk.{il}.attn_qkv.weight", F16, e, 3 * e)
        add(f"v.blk.{il}.attn_qkv.bias", F32, 3 * e)
        add(f"v.blk.{il}.attn_out.weight", F16, e, e)
        add(f"v.blk.{il}.attn_out.bias", F32, e)
        for norm in ("ln1", "ln2"):
            add(f"v.blk.{il}.{norm}.weight", F32, e)
            add(f"v.blk.{il}.{norm}.bias", F32, e)
        add(f"v.blk.{il}.ffn_up.weight", F16, e, s.n_ff)
        add(f"v.blk.{il}.ffn_up.bias", F32, s.n_ff)
        add(f"v.blk.{il}.ffn_down.weight", F16, s.n_ff, e)
        add(f"v.blk.{il}.ffn_down.bias", F32, e)
    add("v.post_ln.weight", F32, e)
    add("v.post_ln.bias", F32, e)
    add("mm.0.weight", F16, merged, merged)
    add("mm.0.bias", F32, merged)
    add("mm.2.weight", F16, merged, s.n_embd_text)
    add("mm.2.bias", F32, s.n_embd_text)


LAYOUTS: dict[str, Callable[[Add, VisionShape], None]] = {
    "gemma3": _gemma3,
    "pixtral": _pixtral,
    "qwen3vl_merger": _qwen3vl,
}
"""Projector types (clip.projector_type values) whose file layout FitScope knows."""


def projector_tensors(projector_type: str, shape: VisionShape) -> tuple[TensorInfo, ...]:
    """The tensors of an F16 projector file of ``projector_type`` (shapes in ggml order).
    Raises ValueError for a projector type FitScope has no layout for."""
    build = LAYOUTS.get(projector_type)
    if build is None:
        raise ValueError(f"no tensor layout for projector type '{projector_type}'")
    out: list[TensorInfo] = []

    def add(name: str, ggml_type: GGMLType, *dims: int) -> None:
        out.append(TensorInfo(name, ggml_type, tuple(dims)))

    build(add, shape)
    return tuple(out)


class MmprojFacts(NamedTuple):
    """What llama.cpp's converter writes into the mmproj of a model, read from its config.json."""

    projector_type: str
    shape: VisionShape
    n_head: int


# config.json ``architectures`` -> the clip projector type its mmproj gets (conversion/__init__.py's
# registry of MmprojModel classes).
QWEN3VL_ARCHITECTURES = frozenset(
    {
        "Qwen3VLForConditionalGeneration",
        "Qwen3VLMoeForConditionalGeneration",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
    }
)


def mmproj_facts(config: dict[str, Any]) -> MmprojFacts | None:
    """The projector a Hugging Face ``config.json`` converts to, as the converter reads it, or None
    when the model has no vision encoder FitScope knows the layout of.

    Qwen3-VL / Qwen3.5 (``Qwen3VLVisionModel.__init__`` and ``MmprojModel.set_gguf_parameters``):
    ``image_size`` = sqrt(``num_position_embeddings``) x ``patch_size`` when the config has none,
    heads from ``num_heads``, layers from ``depth``, the output width from the text config's
    ``hidden_size``, the merge from ``spatial_merge_size``.
    """
    vision = config.get("vision_config")
    architectures = config.get("architectures")
    if not isinstance(vision, dict) or not isinstance(architectures, list):
        return None
    text = config.get("text_config")
    text_config = {**config, **text} if isinstance(text, dict) else config
    if QWEN3VL_ARCHITECTURES.isdisjoint(architectures):
        return None
    patch = int(vision.get("patch_size", 16))
    image_size = vision.get("image_size") or int(int(vision.get("num_position_embeddings", 2304)) ** 0.5 * patch)
    shape = VisionShape(
        image_size=int(image_size),
        patch_size=patch,
        n_embd=int(vision["hidden_size"]),
        n_ff=int(vision["intermediate_size"]),
        n_layer=int(vision["depth"]),
        n_embd_text=int(text_config["hidden_size"]),
        n_merge=int(vision.get("spatial_merge_size", 2)),
    )
    return MmprojFacts("qwen3vl_merger", shape, int(vision["num_heads"]))
