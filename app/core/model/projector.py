"""Vision projectors: the ``--mmproj`` GGUF that llama-server loads beside a multimodal model.

A projector file (``general.architecture = "clip"``) holds a vision transformer and the small
network that turns its output into the text model's embeddings. llama.cpp's ``mtmd`` library
(tools/mtmd/clip.cpp in the vendored llama.cpp) loads it into a context of its own, beside the
text model's:

- weights: every tensor of the file (``clip_model_loader``'s constructor sums ``ggml_nbytes`` of
  each into the ``model size`` it prints), allocated on one backend;
- compute buffer: at load, ``clip_model_loader::warmup`` builds the graph for a dummy image of
  ``hparams.warmup_image_size`` pixels a side (``get_dummy_batch``) and reserves the scheduler's
  buffers for it (``reserve_compute_meta``). A larger image later grows the buffer to its own
  graph (``ggml_backend_sched_alloc_graph`` reallocates), so FitScope counts the larger of the
  warm-up graph and the graph of the largest image the preprocessor produces.

Where it goes: ``clip_ctx`` takes the first GPU when ``use_gpu`` is on (mtmd's default, and
llama-server's unless ``--no-mmproj-offload``), else the CPU — independently of ``-ngl``.

Supported projector types (their graphs are followed below, and proven against llama.cpp in
tests/test_projector.py): ``gemma3`` (Gemma 3: SigLIP encoder, 4x4 average pooling, RMS norm and
a linear projection; ``clip_graph_siglip::build``) and ``pixtral`` (Pixtral, Mistral Small 3.1 and
Ministral 3: a 2D-RoPE encoder with SwiGLU, a patch merger and a GELU MLP;
``clip_graph_pixtral::build``). A file of another projector type still gets its exact weights;
its compute buffer follows the generic ViT rule and is labelled approximate.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from app.core.common.errors import ModelFileError
from app.core.common.units import MIB, Frozen
from app.core.model.tensors import GGMLType, TensorInfo

if TYPE_CHECKING:
    from app.core.model.gguf_reader import GgufHeader

SUPPORTED_TYPES: tuple[str, ...] = ("gemma3", "pixtral")
"""Projector types whose compute graph FitScope follows (clip.projector_type values)."""

F32_BYTES = 4


class ProjectorSpec(Frozen):
    """What decides a projector's memory: its vision encoder's shape and its weights.

    Widths are ggml's (``clip.vision.*`` keys of the GGUF). ``weights_bytes`` is exact: the sum of
    the file's tensors (or, for a catalog projector, of the tensors llama.cpp's converter writes).
    """

    name: str
    projector_type: str = Field(description="clip.projector_type, e.g. gemma3 or pixtral")
    source: str = Field(description="the projector file, or the config.json a catalog entry is read from")
    file_name: str = Field(description="the file llama-server is given with --mmproj")
    image_size: int = Field(ge=1, le=8192, description="clip.vision.image_size (pixels a side)")
    patch_size: int = Field(ge=1, le=1024)
    n_embd: int = Field(ge=1, le=65536, description="the encoder's width")
    n_ff: int = Field(ge=1, le=1 << 20)
    n_layer: int = Field(ge=1, le=1024)
    n_head: int = Field(ge=1, le=1024)
    n_embd_text: int = Field(ge=1, le=1 << 20, description="width of the embeddings handed to the text model")
    n_merge: int = Field(ge=1, le=64, description="patches merged per side (Gemma 3 pooling, Pixtral merger)")
    weights_bytes: int = Field(ge=0)
    patch_embd_type: GGMLType = GGMLType.F16
    input_projection_type: GGMLType = GGMLType.F16
    has_patch_merger: bool = False
    gated_ffn: bool = False
    has_post_norm: bool = True

    @property
    def supported(self) -> bool:
        return self.projector_type in SUPPORTED_TYPES

    @property
    def warmup_image_size(self) -> int:
        """Pixels a side of the dummy image llama.cpp reserves for at load (``load_hparams``):
        ``image_size`` by default; Pixtral calls ``set_warmup_n_tokens(256)``, i.e. 16 merged
        tokens a side."""
        if self.projector_type == "pixtral":
            return 16 * self.patch_size * self.n_merge
        return self.image_size

    @property
    def max_image_size(self) -> int:
        """Pixels a side of the largest square image the preprocessor hands the encoder.

        Gemma 3 resizes every image to ``image_size``. Pixtral's preprocessor allows up to 1024
        merged tokens (``set_limit_image_tokens(8, 1024)``), i.e. 32 tokens a side."""
        if self.projector_type == "pixtral":
            side = min(32 * self.patch_size * self.n_merge, self.image_size)
            return side - side % (self.patch_size * self.n_merge)
        return self.image_size

    @property
    def image_tokens(self) -> int:
        """Embeddings one largest image becomes in the text model's context."""
        per_side = self.max_image_size // self.patch_size // self.n_merge
        if self.projector_type == "pixtral":
            return per_side * per_side + per_side - 1  # one [IMG_BREAK] per row but the last
        return per_side * per_side


class ProjectorEstimate(Frozen):
    """A projector's memory, in bytes, on the device llama.cpp puts it on."""

    spec: ProjectorSpec
    flash_attn: bool
    weights_bytes: int
    compute_bytes: int = Field(description="the larger of the warm-up graph and the largest image's graph")
    warmup_compute_bytes: int = Field(description="what llama.cpp reserves (and prints) at load")
    approximate: bool = False
    assumptions: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.compute_bytes


# -- the tensors llama.cpp's converter writes --------------------------------------------------


def projector_tensors(
    projector_type: str,
    *,
    image_size: int,
    patch_size: int,
    n_embd: int,
    n_ff: int,
    n_layer: int,
    n_embd_text: int,
    n_merge: int,
) -> tuple[TensorInfo, ...]:
    """The tensors of an F16 projector file as llama.cpp's converter writes them (shapes in ggml
    order), named as ``clip_model_loader::load_tensors`` loads them.

    Types follow convert_hf_to_gguf (conversion/base.py ``prepare_tensors``): 1-D tensors and
    norms F32; Gemma 3 keeps ``.embeddings.`` tensors (patch and position embeddings) in F32 and
    its input projection in F16 (``Gemma3VisionModel.tensor_force_quant``); Pixtral's patch
    embedding and patch merger are F16 in an F16 file (``MmprojModel.tensor_force_quant``).
    Raises ValueError for a projector type FitScope has no layout for.
    """
    f16, f32 = GGMLType.F16, GGMLType.F32
    out: list[TensorInfo] = []

    def add(name: str, ggml_type: GGMLType, *shape: int) -> None:
        out.append(TensorInfo(name, ggml_type, tuple(shape)))

    if projector_type == "gemma3":
        n_pos = (image_size // patch_size) ** 2
        add("v.patch_embd.weight", f32, patch_size, patch_size, 3, n_embd)
        add("v.patch_embd.bias", f32, n_embd)
        add("v.position_embd.weight", f32, n_embd, n_pos)
        for il in range(n_layer):
            for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
                add(f"v.blk.{il}.{part}.weight", f16, n_embd, n_embd)
                add(f"v.blk.{il}.{part}.bias", f32, n_embd)
            for norm in ("ln1", "ln2"):
                add(f"v.blk.{il}.{norm}.weight", f32, n_embd)
                add(f"v.blk.{il}.{norm}.bias", f32, n_embd)
            add(f"v.blk.{il}.ffn_up.weight", f16, n_embd, n_ff)
            add(f"v.blk.{il}.ffn_up.bias", f32, n_ff)
            add(f"v.blk.{il}.ffn_down.weight", f16, n_ff, n_embd)
            add(f"v.blk.{il}.ffn_down.bias", f32, n_embd)
        add("v.post_ln.weight", f32, n_embd)
        add("v.post_ln.bias", f32, n_embd)
        add("mm.input_projection.weight", f16, n_embd_text, n_embd)
        add("mm.soft_emb_norm.weight", f32, n_embd)
    elif projector_type == "pixtral":
        add("v.patch_embd.weight", f16, patch_size, patch_size, 3, n_embd)
        add("v.pre_ln.weight", f32, n_embd)
        for il in range(n_layer):
            for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
                add(f"v.blk.{il}.{part}.weight", f16, n_embd, n_embd)
            add(f"v.blk.{il}.ln1.weight", f32, n_embd)
            add(f"v.blk.{il}.ln2.weight", f32, n_embd)
            add(f"v.blk.{il}.ffn_gate.weight", f16, n_embd, n_ff)
            add(f"v.blk.{il}.ffn_up.weight", f16, n_embd, n_ff)
            add(f"v.blk.{il}.ffn_down.weight", f16, n_ff, n_embd)
        if n_merge > 1:
            add("mm.input_norm.weight", f32, n_embd)
            add("mm.patch_merger.weight", f16, n_embd * n_merge * n_merge, n_embd)
        add("mm.1.weight", f16, n_embd, n_embd_text)
        add("mm.2.weight", f16, n_embd_text, n_embd_text)
        add("v.token_embd.img_break", f32, n_embd_text)
    else:
        raise ValueError(f"no tensor layout for projector type '{projector_type}'")
    return tuple(out)


# -- reading a projector file -------------------------------------------------------------------


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
    )


def spec_from_layout(
    *,
    name: str,
    projector_type: str,
    source: str,
    file_name: str,
    image_size: int,
    patch_size: int,
    n_embd: int,
    n_ff: int,
    n_layer: int,
    n_head: int,
    n_embd_text: int,
    n_merge: int,
) -> ProjectorSpec:
    """The spec of an F16 projector file llama.cpp's converter would write for these facts
    (weights summed from :func:`projector_tensors`). Raises ValueError for an unknown type."""
    tensors = projector_tensors(
        projector_type,
        image_size=image_size,
        patch_size=patch_size,
        n_embd=n_embd,
        n_ff=n_ff,
        n_layer=n_layer,
        n_embd_text=n_embd_text,
        n_merge=n_merge,
    )
    by_name = {t.name: t for t in tensors}
    return ProjectorSpec(
        name=name,
        projector_type=projector_type,
        source=source,
        file_name=file_name,
        image_size=image_size,
        patch_size=patch_size,
        n_embd=n_embd,
        n_ff=n_ff,
        n_layer=n_layer,
        n_head=n_head,
        n_embd_text=n_embd_text,
        n_merge=n_merge,
        weights_bytes=sum(t.n_bytes for t in tensors),
        patch_embd_type=by_name["v.patch_embd.weight"].ggml_type,
        has_patch_merger="mm.patch_merger.weight" in by_name,
        gated_ffn="v.blk.0.ffn_gate.weight" in by_name,
        has_post_norm="v.post_ln.weight" in by_name,
    )


# -- the compute buffer -------------------------------------------------------------------------


def _type_bytes(ggml_type: GGMLType) -> int:
    return 2 if ggml_type in (GGMLType.F16, GGMLType.BF16) else 4


def graph_bytes(spec: ProjectorSpec, image_side: int, flash_attn: bool) -> int:
    """The compute buffer, in bytes, llama.cpp's scheduler reserves for the encoder graph of one
    square image ``image_side`` pixels a side: the live intermediates at the graph's peak.

    Followed from clip.cpp: ``clip_graph::build_vit`` runs every layer on P = (side / patch)^2
    positions of width E (one activation: P x E x 4 bytes, f32), so the peak is one layer's:

    - attention (``clip_graph::build_attn``): with flash attention the residual, the normed input,
      Q, K, V, their f16 casts and the output, about 5.5 activations as ggml's allocator packs
      them; without it the scores K x Q, P x P x heads x 4 bytes, beside 6 activations;
    - feed-forward (``clip_graph::build_ffn``): Gemma 3's GELU MLP holds the residual, the normed
      input and one P x n_ff product with the output (3 activations + P x n_ff x 4); Pixtral's
      SwiGLU holds gate, up and their product (3 x P x n_ff x 4) beside 4.25 activations.

    Gemma 3's projection ``ggml_cont(ggml_transpose(mm_input_proj_w))`` (``clip_graph_siglip::
    build``) is computed first and held to the end; it takes extra room only when it does not fit
    where the input image and its im2col were (small images), and then the allocator also leaves
    two activations unused beside the feed-forward block. These counts are measured, not derived
    allocation by allocation: see tests/test_projector.py for how close they come.
    """
    n_pos = (image_side // spec.patch_size) ** 2
    act = n_pos * spec.n_embd * F32_BYTES
    ffn = n_pos * spec.n_ff * F32_BYTES
    scores = n_pos * n_pos * spec.n_head * F32_BYTES
    attention = act * 11 // 2 if flash_attn else scores + 6 * act
    feed_forward = act * 17 // 4 + 3 * ffn if spec.gated_ffn else 3 * act + ffn
    if spec.projector_type == "gemma3":
        projection = spec.n_embd_text * spec.n_embd * _type_bytes(spec.input_projection_type)
        pixels = image_side * image_side * 3 * F32_BYTES
        early = pixels + n_pos * 3 * spec.patch_size**2 * _type_bytes(spec.patch_embd_type)
        if projection > early:
            attention += projection
            feed_forward += projection + 2 * act
    return max(attention, feed_forward)


def estimate_projector(spec: ProjectorSpec, flash_attn: bool = True) -> ProjectorEstimate:
    """Weights and compute buffer of ``spec`` with flash attention on or off (llama-server hands
    its ``-fa`` setting to mtmd; on 'auto' every llama.cpp backend FitScope models supports it).
    Bytes. The compute buffer counted is the larger of the warm-up graph and the largest image's.
    """
    warm = graph_bytes(spec, spec.warmup_image_size, flash_attn)
    largest = graph_bytes(spec, spec.max_image_size, flash_attn)
    side = spec.max_image_size
    notes = [
        f"Vision projector {spec.name} ({spec.projector_type}, {spec.n_layer} layers, width {spec.n_embd}): "
        f"weights {spec.weights_bytes / MIB:,.1f} MiB, summed tensor by tensor; compute buffer for the "
        f"largest image ({side}x{side} pixels, {spec.image_tokens} tokens), flash attention "
        f"{'on' if flash_attn else 'off'}.",
    ]
    if largest > warm:
        notes.append(
            f"llama.cpp reserves {warm / MIB:,.1f} MiB for the projector at load (a "
            f"{spec.warmup_image_size}x{spec.warmup_image_size} warm-up image); the first large image grows "
            f"it to {largest / MIB:,.1f} MiB, which is what FitScope counts."
        )
    if spec.supported:
        notes.append(
            "The projector's compute buffer follows clip.cpp's graph; it is checked against llama.cpp's "
            "own reservation (exact for Gemma 3, within 2% for Pixtral / Mistral 3)."
        )
    else:
        notes.append(
            f"Projector type '{spec.projector_type}' is not modelled: its compute buffer follows the generic "
            "vision-transformer rule and is approximate (its weights are exact)."
        )
    return ProjectorEstimate(
        spec=spec,
        flash_attn=flash_attn,
        weights_bytes=spec.weights_bytes,
        compute_bytes=max(warm, largest),
        warmup_compute_bytes=warm,
        approximate=not spec.supported,
        assumptions=tuple(notes),
    )
