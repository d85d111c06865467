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
a linear projection; ``clip_graph_siglip::build``), ``pixtral`` (Pixtral, Mistral Small 3.1 and
Ministral 3: a 2D-RoPE encoder with SwiGLU, a patch merger and a GELU MLP;
``clip_graph_pixtral::build``) and ``qwen3vl_merger`` (Qwen3-VL, Qwen3.5 and Qwen3.6: a two-frame
patch convolution, interpolated learned positions, fused QKV with M-RoPE, a 2x2 merger MLP;
``clip_graph_qwen3vl::build``). The tensors each type's file holds are in
:mod:`app.core.model.projector_layout`; reading a file is :mod:`app.core.model.projector_file`. A file
of another projector type still gets its exact weights; its compute buffer follows the generic ViT
rule and is labelled approximate.
"""

from __future__ import annotations

from pydantic import Field

from app.core.common.units import MIB, Frozen
from app.core.model.projector_layout import VisionShape, projector_tensors
from app.core.model.tensors import GGMLType

SUPPORTED_TYPES: tuple[str, ...] = ("gemma3", "pixtral", "qwen3vl_merger")
"""Projector types whose compute graph FitScope follows (clip.projector_type values)."""

F32_BYTES = 4

# How close each supported type's compute buffer came to llama.cpp's reservation (tests/test_projector.py).
PROOF: dict[str, str] = {
    "gemma3": "exact for Gemma 3",
    "pixtral": "within 2% for Pixtral / Mistral 3",
    "qwen3vl_merger": "exact, to the 0.01 MiB it prints, for Qwen3.5 / Qwen3.6",
}


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
    n_deepstack: int = Field(default=0, ge=0, description="Qwen3-VL deepstack mergers (none in Qwen3.5)")

    @property
    def shape(self) -> VisionShape:
        return VisionShape(
            self.image_size, self.patch_size, self.n_embd, self.n_ff, self.n_layer, self.n_embd_text, self.n_merge
        )

    @property
    def supported(self) -> bool:
        """Whether the compute graph is followed: a supported type, and no Qwen3-VL deepstack
        mergers (their features stay alive to the end of the graph; not measured)."""
        return self.projector_type in SUPPORTED_TYPES and self.n_deepstack == 0

    @property
    def warmup_image_size(self) -> int:
        """Pixels a side of the dummy image llama.cpp reserves for at load (``load_hparams``):
        ``image_size`` by default; Pixtral calls ``set_warmup_n_tokens(256)``, i.e. 16 merged
        tokens a side; Qwen3-VL ``set_warmup_n_tokens(46*46)``, 46 merged tokens a side."""
        if self.projector_type == "pixtral":
            return 16 * self.patch_size * self.n_merge
        if self.projector_type == "qwen3vl_merger":
            return 46 * self.patch_size * self.n_merge
        return self.image_size

    @property
    def max_image_size(self) -> int:
        """Pixels a side of the largest square image the preprocessor hands the encoder.

        Gemma 3 resizes every image to ``image_size``. Pixtral's preprocessor allows up to 1024
        merged tokens (``set_limit_image_tokens(8, 1024)``), i.e. 32 tokens a side. Qwen3-VL's
        allows 4096 merged tokens (``set_limit_image_tokens(8, 4096)``) whatever ``image_size`` (its
        position embeddings are interpolated): ``mtmd_image_preprocessor_dyn_size`` scales an image
        down to at most that many pixels, so no image has more patches than a square of 64 tokens
        a side."""
        if self.projector_type == "pixtral":
            side = min(32 * self.patch_size * self.n_merge, self.image_size)
            return side - side % (self.patch_size * self.n_merge)
        if self.projector_type == "qwen3vl_merger":
            return 64 * self.patch_size * self.n_merge
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
        VisionShape(image_size, patch_size, n_embd, n_ff, n_layer, n_embd_text, n_merge),
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
    if spec.projector_type == "qwen3vl_merger":
        return qwen3vl_graph_bytes(spec, image_side, flash_attn)
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


def _fits_below(live: list[int], hole: int) -> int:
    """Bytes of the ``live`` tensors that fit in a free block of ``hole`` bytes, the largest that
    still fits first (ggml's allocator takes the best-fitting free block for each tensor)."""
    used = 0
    for size in sorted(live, reverse=True):
        if used + size <= hole:
            used += size
    return used


def qwen3vl_graph_bytes(spec: ProjectorSpec, image_side: int, flash_attn: bool) -> int:
    """The compute buffer of ``clip_graph_qwen3vl::build`` for one square image ``image_side`` pixels
    a side, in bytes: the tensors alive at the graph's peak, placed as ggml's allocator places them.

    ggml's allocator (``ggml_gallocr_alloc_graph``, ggml/src/ggml-alloc.c) places the graph's inputs
    first: the image (side x side x 3 f32) at the start of the buffer, the M-RoPE positions
    (4 x P int32, alive to the last layer) after it. The image is freed once both patch
    convolutions have read it (``build_inp_with_temporal_merge``); the hole it leaves takes only
    tensors no larger than it, so the peak is the image's size, plus the live tensors at the peak
    that do not fit in that hole, plus the positions. With P = (side / patch)^2 patches and
    one activation A = P x E x 4 bytes, the peak is one layer's (every layer is alike):

    - attention (``clip_graph::build_attn``) with flash attention, when K is cast to f16: the
      residual, the fused QKV (3A, alive until V is cast), Q and K after ``ggml_rope_multi`` and
      K in f16 (A/2); without it, when the scores K x Q (P x P x heads x 4 bytes) are made: the
      residual, QKV, roped Q and K and the contiguous V;
    - feed-forward (``clip_graph::build_ffn``, GELU, no gate): the residual, the normed input and
      the P x n_ff up-projection.

    The merger at the end (P/4 merged tokens) and the patch convolutions are smaller. Measured
    against llama.cpp's own reservation for widths 512 to 2048 and 2,116 to 19,044 patches: exact
    to the 0.01 MiB it prints (tests/test_projector.py). Qwen3-VL's deepstack mergers (none in
    Qwen3.5) keep their outputs to the end and concatenate them; that is not measured, so they are
    counted twice over as an allowance and the spec is not ``supported``.
    """
    n_pos = (image_side // spec.patch_size) ** 2
    act = n_pos * spec.n_embd * F32_BYTES
    image = image_side * image_side * 3 * F32_BYTES
    positions = 4 * n_pos * 4
    if flash_attn:
        attention, scores = [act, 3 * act, act, act, act // 2], 0
    else:
        attention, scores = [act, 3 * act, act, act, act], n_pos * n_pos * spec.n_head * F32_BYTES
    feed_forward = [act, act, n_pos * spec.n_ff * F32_BYTES]
    deepstack = 2 * spec.n_deepstack * (n_pos // 4) * spec.n_embd_text * F32_BYTES
    peak = max(
        image + sum(live) - _fits_below(live, image) + extra for live, extra in ((attention, scores), (feed_forward, 0))
    )
    return peak + positions + deepstack


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
            f"own reservation ({PROOF[spec.projector_type]})."
        )
    elif spec.n_deepstack:
        notes.append(
            f"Its {spec.n_deepstack} deepstack mergers are not measured: their outputs are counted twice over, "
            "so the compute buffer is approximate (its weights are exact)."
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
