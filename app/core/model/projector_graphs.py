"""The compute buffer llama.cpp reserves for a vision projector's graph (tools/mtmd/clip.cpp and
tools/mtmd/models/*.cpp in the vendored llama.cpp), per projector type.

``clip_model_loader::warmup`` builds the graph of one image and ``reserve_compute_meta`` reserves
what ggml's allocator (``ggml_gallocr_alloc_graph``, ggml/src/ggml-alloc.c) needs for it: the
tensors alive at the graph's peak, where the allocator has placed them. Every encoder layer is
alike, so the peak is one layer's, with P patches of width E (one activation, A = P x E x 4 bytes).

Qwen3-VL, Gemma 4 and Kimi K2.5 are followed tensor by tensor, placement included. The allocator places the
graph's inputs first: the image (width x height x 3, f32) at the start of the buffer, then the
positions. The image is freed once the patch convolution has read it; the hole it leaves takes only
tensors no larger than it, so a peak is the image's size, plus the live tensors that do not fit in
that hole, plus the positions (:func:`placed_peak`). Gemma 3 and Pixtral keep the measured counts
of live activations they were proven with.
"""

from __future__ import annotations

from typing import Protocol

from app.core.model.tensors import GGMLType

F32_BYTES = 4


class EncoderShape(Protocol):
    """What the graph of a projector depends on (a :class:`~app.core.model.projector.ProjectorSpec`)."""

    @property
    def projector_type(self) -> str: ...
    @property
    def patch_size(self) -> int: ...
    @property
    def n_embd(self) -> int: ...
    @property
    def n_ff(self) -> int: ...
    @property
    def n_head(self) -> int: ...
    @property
    def n_embd_text(self) -> int: ...
    @property
    def n_merge(self) -> int: ...
    @property
    def gated_ffn(self) -> bool: ...
    @property
    def patch_embd_type(self) -> GGMLType: ...
    @property
    def input_projection_type(self) -> GGMLType: ...
    @property
    def n_deepstack(self) -> int: ...


def graph_bytes(spec: EncoderShape, width: int, height: int, flash_attn: bool) -> int:
    """The compute buffer, in bytes, of ``spec``'s encoder graph for one image of ``width`` x
    ``height`` pixels, with flash attention on or off."""
    n_pos = (width // spec.patch_size) * (height // spec.patch_size)
    pixels = width * height
    if spec.projector_type == "qwen3vl_merger":  # M-RoPE: four positions per patch
        return fused_qkv_graph_bytes(spec, n_pos, pixels, flash_attn, positions_per_patch=4)
    if spec.projector_type == "kimik25":  # 2D RoPE: a row and a column per patch
        return fused_qkv_graph_bytes(spec, n_pos, pixels, flash_attn, positions_per_patch=2)
    if spec.projector_type == "gemma4v":
        return gemma4v_graph_bytes(spec, n_pos, pixels, flash_attn)
    return counted_graph_bytes(spec, n_pos, pixels, flash_attn)


def _type_bytes(ggml_type: GGMLType) -> int:
    return 2 if ggml_type in (GGMLType.F16, GGMLType.BF16) else 4


def counted_graph_bytes(spec: EncoderShape, n_pos: int, pixels: int, flash_attn: bool) -> int:
    """Gemma 3, Pixtral and the generic ViT rule: the live intermediates at the peak of
    ``clip_graph::build_vit`` as measured counts of activations.

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
    act = n_pos * spec.n_embd * F32_BYTES
    ffn = n_pos * spec.n_ff * F32_BYTES
    scores = n_pos * n_pos * spec.n_head * F32_BYTES
    attention = act * 11 // 2 if flash_attn else scores + 6 * act
    feed_forward = act * 17 // 4 + 3 * ffn if spec.gated_ffn else 3 * act + ffn
    if spec.projector_type == "gemma3":
        projection = spec.n_embd_text * spec.n_embd * _type_bytes(spec.input_projection_type)
        early = pixels * 3 * F32_BYTES + n_pos * 3 * spec.patch_size**2 * _type_bytes(spec.patch_embd_type)
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


def placed_peak(image: int, peaks: list[tuple[list[int], int]]) -> int:
    """The largest of ``peaks`` above the image's hole: each is (the live tensors that may take the
    hole, bytes that never fit in it), in bytes, with the image's own bytes below them."""
    return max(image + sum(live) - _fits_below(live, image) + extra for live, extra in peaks)


def fused_qkv_graph_bytes(
    spec: EncoderShape, n_pos: int, pixels: int, flash_attn: bool, positions_per_patch: int
) -> int:
    """The compute buffer of an encoder with fused QKV, biases and a GELU MLP, in bytes:
    ``clip_graph_qwen3vl::build`` (Qwen3-VL, Qwen3.5, Qwen3.6) and ``clip_graph_kimik25::build``
    (Kimi K2.5's MoonViT through ``clip_graph::build_vit``).

    Inputs: the image, freed after the patch convolutions (Qwen3-VL's two, ``build_inp_with_
    temporal_merge``; Kimi's one, ``build_inp``), and the rope positions (``positions_per_patch``
    int32 per patch, alive to the last layer: Qwen3-VL's M-RoPE 4, Kimi's 2D RoPE 2). The peak is
    one layer's:

    - attention (``clip_graph::build_attn``) with flash attention, when K is cast to f16: the
      residual, the fused QKV (3A, alive until V is cast), Q and K after their rope and K in f16
      (A/2); without it, when the scores K x Q (P x P x heads x 4 bytes) are made: the residual,
      QKV, roped Q and K and the contiguous V;
    - feed-forward (``clip_graph::build_ffn``, GELU, no gate): the residual, the normed input and
      the P x n_ff up-projection.

    The merger at the end (P/4 merged tokens), the patch convolutions and Kimi's interpolation of
    its position grid are smaller. Measured against llama.cpp's own reservation for widths 512 to
    2048 and 2,116 to 19,044 patches (Qwen3-VL) and 4,096 to 16,384 (Kimi): exact to the 0.01 MiB
    it prints (tests/test_projector.py). Qwen3-VL's deepstack mergers (none in Qwen3.5) keep their
    outputs to the end and concatenate them; that is not measured, so they are counted twice over
    as an allowance (and the spec is not ``supported``).
    """
    act = n_pos * spec.n_embd * F32_BYTES
    if flash_attn:
        attention, scores = [act, 3 * act, act, act, act // 2], 0
    else:
        attention, scores = [act, 3 * act, act, act, act], n_pos * n_pos * spec.n_head * F32_BYTES
    feed_forward = [act, act, n_pos * spec.n_ff * F32_BYTES]
    peak = placed_peak(pixels * 3 * F32_BYTES, [(attention, scores), (feed_forward, 0)])
    deepstack = 2 * spec.n_deepstack * (n_pos // 4) * spec.n_embd_text * F32_BYTES
    return peak + positions_per_patch * n_pos * 4 + deepstack


def gemma4v_graph_bytes(spec: EncoderShape, n_pos: int, pixels: int, flash_attn: bool) -> int:
    """The compute buffer of ``clip_graph_gemma4v::build`` (Gemma 4's vision encoder), in bytes.

    Inputs: the image (rescaled by ``ggml_scale_bias`` and freed after the patch convolution) and
    the x and y positions (P int32 each, alive to the last layer: the two NEOX ropes of every
    layer read them). Each layer of ``clip_graph::build_vit`` (RMS norms, separate Q/K/V with
    per-head norms, V's norm without weight, a norm after attention and after the feed-forward)
    peaks at:

    - attention: five activations (the residual, Q, K and V after their norms and ropes, and the
      one being made), and without flash attention the scores K x Q beside them;
    - feed-forward (``clip_graph::build_ffn``, gated GELU): gate, up and their product (3 x P x
      n_ff x 4) beside three activations.

    The pooling (``ggml_pool_2d`` over n_merge x n_merge patches) and the projection are smaller.
    Measured against llama.cpp's own reservation for widths 512 to 2304 and 1,024 to 9,216 patches:
    exact to the 0.01 MiB it prints (tests/test_projector.py).
    """
    act = n_pos * spec.n_embd * F32_BYTES
    scores = 0 if flash_attn else n_pos * n_pos * spec.n_head * F32_BYTES
    ffn = n_pos * spec.n_ff * F32_BYTES
    peak = placed_peak(pixels * 3 * F32_BYTES, [([act] * 5, scores), ([ffn] * 3 + [act] * 3, 0)])
    return peak + 2 * n_pos * 4
