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
``clip_graph_qwen3vl::build``) and ``gemma4v`` (Gemma 4: a 2D-RoPE encoder with per-head Q/K norms,
a gated GELU feed-forward and 3x3 average pooling; ``clip_graph_gemma4v::build``) and ``kimik25``
(Kimi K2.5 / K2.6: MoonViT, fused QKV with 2D RoPE, an interpolated position grid, a 2x2 merger;
``clip_graph_kimik25::build``). The tensors each
type's file holds are in :mod:`app.core.model.projector_layout`, the compute graphs in
:mod:`app.core.model.projector_graphs`; reading a file is :mod:`app.core.model.projector_file`. A
file of another projector type still gets its exact weights; its compute buffer follows the generic
ViT rule and is labelled approximate.
"""

from __future__ import annotations

from pydantic import Field

from app.core.common.units import MIB, Frozen
from app.core.model.projector_graphs import graph_bytes
from app.core.model.projector_layout import VisionShape, projector_tensors
from app.core.model.tensors import GGMLType

SUPPORTED_TYPES: tuple[str, ...] = ("gemma3", "pixtral", "qwen3vl_merger", "gemma4v", "kimik25")
"""Projector types whose compute graph FitScope follows (clip.projector_type values)."""


# How close each supported type's compute buffer came to llama.cpp's reservation (tests/test_projector.py).
PROOF: dict[str, str] = {
    "gemma3": "exact for Gemma 3",
    "pixtral": "within 2% for Pixtral / Mistral 3",
    "qwen3vl_merger": "exact, to the 0.01 MiB it prints, for Qwen3.5 / Qwen3.6",
    "gemma4v": "exact, to the 0.01 MiB it prints, for Gemma 4",
    "kimik25": "exact, to the 0.01 MiB it prints, for Kimi K2.5 / K2.6",
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
    n_pos_embd: int = Field(default=0, ge=0, description="Gemma 4's position-table entries per axis")
    image_max_pixels: int = Field(default=0, ge=0, description="clip.vision.image_max_pixels (Kimi K2.5)")
    has_audio_encoder: bool = Field(default=False, description="an audio encoder beside the vision one")

    @property
    def shape(self) -> VisionShape:
        return VisionShape(
            self.image_size,
            self.patch_size,
            self.n_embd,
            self.n_ff,
            self.n_layer,
            self.n_embd_text,
            self.n_merge,
            self.n_head,
            self.n_pos_embd,
        )

    @property
    def supported(self) -> bool:
        """Whether the compute graph is followed: a supported type, no Qwen3-VL deepstack mergers
        (their features stay alive to the end of the graph; not measured) and no audio encoder
        (mtmd gives it a clip context of its own, with its own compute buffer; not modelled)."""
        return self.projector_type in SUPPORTED_TYPES and self.n_deepstack == 0 and not self.has_audio_encoder

    @property
    def warmup_image_size(self) -> int:
        """Pixels a side of the dummy image llama.cpp reserves for at load (``load_hparams``):
        ``image_size`` by default; ``set_warmup_n_tokens(n)`` makes it sqrt(n) merged tokens a side:
        Pixtral and Gemma 4 256 (16 a side), Qwen3-VL 46 x 46. Kimi K2.5 warms up with its largest
        image, sqrt(``image_max_pixels``) a side."""
        if self.projector_type == "kimik25":
            return int(self._kimi_max_pixels**0.5)
        tokens_a_side = {"pixtral": 16, "gemma4v": 16, "qwen3vl_merger": 46}.get(self.projector_type)
        if tokens_a_side is None:
            return self.image_size
        return tokens_a_side * self.patch_size * self.n_merge

    @property
    def max_image(self) -> tuple[int, int]:
        """Width and height, in pixels, of the image with the most patches the preprocessor hands
        the encoder.

        Gemma 3 resizes every image to ``image_size``. The others allow a number of merged tokens
        (``set_limit_image_tokens``): Pixtral 1024 (and no more than ``image_size`` a side), Qwen3-VL
        4096, Gemma 4 1120; Kimi K2.5 as many as the file's ``image_max_pixels`` holds (4096 when
        it has none). ``mtmd_image_preprocessor_dyn_size`` scales an image down to at most that many
        merged tokens' pixels, whatever its aspect, so the image counted is the grid of that many
        tokens closest to a square (Gemma 4: 35 x 32)."""
        step = self.patch_size * self.n_merge
        if self.projector_type == "pixtral":
            side = min(32 * step, self.image_size)
            return side - side % step, side - side % step
        limits = {"qwen3vl_merger": 4096, "gemma4v": 1120, "kimik25": self._kimi_max_pixels // step**2}
        limit = limits.get(self.projector_type)
        if limit is None:
            return self.image_size, self.image_size
        rows = next(r for r in range(int(limit**0.5), 0, -1) if limit % r == 0)
        return limit // rows * step, rows * step

    @property
    def _kimi_max_pixels(self) -> int:
        """Kimi K2.5's pixel budget: the file's, else ``set_limit_image_tokens(2, 4096)``'s."""
        return self.image_max_pixels or 4096 * (self.patch_size * self.n_merge) ** 2

    @property
    def image_tokens(self) -> int:
        """Embeddings one largest image becomes in the text model's context."""
        width, height = self.max_image
        columns, rows = width // self.patch_size // self.n_merge, height // self.patch_size // self.n_merge
        if self.projector_type == "pixtral":
            return columns * rows + rows - 1  # one [IMG_BREAK] per row but the last
        return columns * rows


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
    n_pos_embd: int = 0,
    image_max_pixels: int = 0,
) -> ProjectorSpec:
    """The spec of an F16 projector file llama.cpp's converter would write for these facts
    (weights summed from :func:`projector_tensors`). Raises ValueError for an unknown type."""
    tensors = projector_tensors(
        projector_type,
        VisionShape(image_size, patch_size, n_embd, n_ff, n_layer, n_embd_text, n_merge, n_head, n_pos_embd),
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
        n_pos_embd=n_pos_embd,
        image_max_pixels=image_max_pixels,
        weights_bytes=sum(t.n_bytes for t in tensors),
        patch_embd_type=by_name["v.patch_embd.weight"].ggml_type,
        has_patch_merger="mm.patch_merger.weight" in by_name,
        gated_ffn="v.blk.0.ffn_gate.weight" in by_name,
        has_post_norm="v.post_ln.weight" in by_name,
    )


def estimate_projector(spec: ProjectorSpec, flash_attn: bool = True) -> ProjectorEstimate:
    """Weights and compute buffer of ``spec`` with flash attention on or off (llama-server hands
    its ``-fa`` setting to mtmd; on 'auto' every llama.cpp backend FitScope models supports it).
    Bytes. The compute buffer counted is the larger of the warm-up graph and the largest image's.
    """
    warm = graph_bytes(spec, spec.warmup_image_size, spec.warmup_image_size, flash_attn)
    width, height = spec.max_image
    largest = graph_bytes(spec, width, height, flash_attn)
    notes = [
        f"Vision projector {spec.name} ({spec.projector_type}, {spec.n_layer} layers, width {spec.n_embd}): "
        f"weights {spec.weights_bytes / MIB:,.1f} MiB, summed tensor by tensor; compute buffer for the "
        f"largest image ({width}x{height} pixels, {spec.image_tokens} tokens), flash attention "
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
    elif spec.has_audio_encoder and spec.projector_type in SUPPORTED_TYPES:
        notes.append(
            "The file also holds an audio encoder: its weights are counted, but the compute buffer of its own "
            "clip context is not, so the projector's compute buffer is approximate."
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
