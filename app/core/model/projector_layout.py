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
    n_head: int = 1
    n_pos_embd: int = 0
    """Position-table entries where they are not (image_size / patch_size)^2 (Gemma 4: per axis)."""


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


def _biased_vit_layers(add: Add, s: VisionShape) -> None:
    """The ViT layers Qwen3-VL's and MoonViT's converters write alike: fused QKV, the output projection,
    two LayerNorms and a two-matrix feed-forward, every one with a bias, then the final LayerNorm as
    ``v.post_ln``."""
    e = s.n_embd
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
    _biased_vit_layers(add, s)
    add("mm.0.weight", F16, merged, merged)
    add("mm.0.bias", F32, merged)
    add("mm.2.weight", F16, merged, s.n_embd_text)
    add("mm.2.bias", F32, s.n_embd_text)


def _gemma4v(add: Add, s: VisionShape) -> None:
    """Gemma 4 (``Gemma4VisionAudioModel``, conversion/gemma.py; the vision tower of transformers'
    modeling_gemma4): the patch projection, a Linear over 3 x patch^2 pixels, reshaped to a Conv2D
    kernel (F16); one position table per axis, ``n_pos_embd`` entries each (F32); the
    ``standardize`` bias and scale; per layer separate Q/K/V/O without biases, RMS norms on Q and K
    per head (``head_dim`` wide; V's has no weight), four RMS norms around attention and the gated
    GELU feed-forward; the projection into the text model (no norm weight before it). Clamp scalars
    (``use_clipped_linears``) are not written here: the released 26B-A4B and 31B configs have none."""
    e, head_dim = s.n_embd, s.n_embd // s.n_head
    add("v.patch_embd.weight", F16, s.patch_size, s.patch_size, 3, e)
    add("v.position_embd.weight", F32, e, s.n_pos_embd, 2)
    add("v.std_bias", F32, e)
    add("v.std_scale", F32, e)
    for il in range(s.n_layer):
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            add(f"v.blk.{il}.{part}.weight", F16, e, e)
        add(f"v.blk.{il}.attn_q_norm.weight", F32, head_dim)
        add(f"v.blk.{il}.attn_k_norm.weight", F32, head_dim)
        for norm in ("ln1", "attn_post_norm", "ln2", "ffn_post_norm"):
            add(f"v.blk.{il}.{norm}.weight", F32, e)
        add(f"v.blk.{il}.ffn_gate.weight", F16, e, s.n_ff)
        add(f"v.blk.{il}.ffn_up.weight", F16, e, s.n_ff)
        add(f"v.blk.{il}.ffn_down.weight", F16, s.n_ff, e)
    add("mm.input_projection.weight", F16, e, s.n_embd_text)


def _kimik25(add: Add, s: VisionShape) -> None:
    """Kimi K2.5 (``KimiK25Model``, conversion/kimivl.py; MoonViT3d): a Conv2D patch embedding with a
    bias; a learned position grid of ``image_size / patch_size`` a side (F32); fused QKV (Q and K
    rows permuted for split RoPE, same shapes), every linear and LayerNorm with a bias; the final
    LayerNorm as ``v.post_ln``; the merger's pre-norm over one patch (``mm.input_norm``) and its two
    linears over ``n_merge``^2 patches (``mm.1``, ``mm.2``)."""
    e, p, side = s.n_embd, s.patch_size, s.image_size // s.patch_size
    merged = e * s.n_merge * s.n_merge
    add("v.patch_embd.weight", F16, p, p, 3, e)
    add("v.patch_embd.bias", F32, e)
    add("v.position_embd.weight", F32, e, side, side)
    _biased_vit_layers(add, s)
    add("mm.input_norm.weight", F32, e)
    add("mm.input_norm.bias", F32, e)
    add("mm.1.weight", F16, merged, merged)
    add("mm.1.bias", F32, merged)
    add("mm.2.weight", F16, merged, s.n_embd_text)
    add("mm.2.bias", F32, s.n_embd_text)


LAYOUTS: dict[str, Callable[[Add, VisionShape], None]] = {
    "gemma3": _gemma3,
    "pixtral": _pixtral,
    "qwen3vl_merger": _qwen3vl,
    "gemma4v": _gemma4v,
    "kimik25": _kimik25,
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
    image_max_pixels: int = 0
    """clip.vision.image_max_pixels, where the converter writes it (Kimi K2.5)."""


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
    ``hidden_size``, the merge from ``spatial_merge_size``. Gemma 4 and Kimi K2.5: see
    :func:`_gemma4_facts` and :func:`_kimik25_facts`.
    """
    vision = config.get("vision_config")
    architectures = config.get("architectures")
    if not isinstance(vision, dict) or not isinstance(architectures, list):
        return None
    text = config.get("text_config")
    text_config = {**config, **text} if isinstance(text, dict) else config
    if "Gemma4ForConditionalGeneration" in architectures:
        return _gemma4_facts(vision, config.get("audio_config"), int(text_config["hidden_size"]))
    if "KimiK25ForConditionalGeneration" in architectures:
        return _kimik25_facts(vision, int(text_config["hidden_size"]))
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
        n_head=int(vision["num_heads"]),
    )
    return MmprojFacts("qwen3vl_merger", shape)


def _gemma4_facts(vision: dict[str, Any], audio: object, n_embd_text: int) -> MmprojFacts | None:
    """Gemma 4 (``Gemma4VisionAudioModel``): ``image_size`` written as 224 (unused); the pooling
    kernel 3, as clip.cpp fixes it (the converter writes no scale factor); the position table's
    ``position_embedding_size``. None for a layout not written here: an audio encoder beside the
    vision one (the small E2B / E4B), clamp scalars (``use_clipped_linears``), no ``standardize``,
    or heads that do not tile the width."""
    heads = int(vision["num_attention_heads"])
    if (
        audio
        or vision.get("use_clipped_linears")
        or not vision.get("standardize")
        or int(vision.get("head_dim", 0)) * heads != int(vision["hidden_size"])
        or int(vision.get("num_key_value_heads", heads)) != heads
    ):
        return None
    shape = VisionShape(
        image_size=224,
        patch_size=int(vision["patch_size"]),
        n_embd=int(vision["hidden_size"]),
        n_ff=int(vision["intermediate_size"]),
        n_layer=int(vision["num_hidden_layers"]),
        n_embd_text=n_embd_text,
        n_merge=3,
        n_head=heads,
        n_pos_embd=int(vision["position_embedding_size"]),
    )
    return MmprojFacts("gemma4v", shape)


KIMI_IN_PATCH_LIMIT = 16384
"""``KimiK25Model``'s patch budget when the preprocessor config names none (``in_patch_limit``)."""


def _kimik25_facts(vision: dict[str, Any], n_embd_text: int) -> MmprojFacts | None:
    """Kimi K2.5 (``KimiK25Model``): the ``vt_*`` widths, ``image_size`` = ``init_pos_emb_height`` x
    ``patch_size``, the merge from ``merge_kernel_size``, and the pixel budget the converter writes,
    ``in_patch_limit`` x patch^2 (its default, since config.json does not carry the preprocessor's
    value). None for another projector (``patchmergerv2``: Kimi K3) or a grid that is not square."""
    merge = vision.get("merge_kernel_size", [2, 2])
    height, width = vision.get("init_pos_emb_height", 64), vision.get("init_pos_emb_width", 64)
    if vision.get("mm_projector_type", "patchmerger") != "patchmerger" or height != width or merge[0] != merge[1]:
        return None
    patch = int(vision.get("patch_size", 14))
    shape = VisionShape(
        image_size=int(height) * patch,
        patch_size=patch,
        n_embd=int(vision["vt_hidden_size"]),
        n_ff=int(vision["vt_intermediate_size"]),
        n_layer=int(vision["vt_num_hidden_layers"]),
        n_embd_text=n_embd_text,
        n_merge=int(merge[0]),
        n_head=int(vision["vt_num_attention_heads"]),
    )
    return MmprojFacts("kimik25", shape, KIMI_IN_PATCH_LIMIT * patch * patch)
