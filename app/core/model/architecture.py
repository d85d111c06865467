"""What a transformer (or state-space) model looks like, as llama.cpp sees it.

An :class:`Architecture` holds the hyper-parameters that decide memory: layer count, widths,
attention heads, feed-forward sizes, vocabulary, sliding-window layout, mixture-of-experts,
multi-head latent attention and recurrent state. Catalog entries, GGUF headers and Hugging Face
``config.json`` files all end up as one of these.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from app.core.common.units import Frozen

PerLayerInt = int | list[int]

# Gemma 3n's fixed shapes: llama.cpp reads none of them from the file (llama_hparams defaults and
# llama_model_gemma3n::load_arch_hparams): 4 AltUp streams, LAuReL rank 64, per-layer embeddings of
# 256 per layer, and a KV cache on the first 20 layers only (n_layer_kv_from_start), whatever the
# file's shared_kv_layers says.
GEMMA3N_ALTUP = 4
GEMMA3N_LAUREL_RANK = 64
GEMMA3N_PER_LAYER_WIDTH = 256
GEMMA3N_KV_LAYERS = 20


class MoESpec(Frozen):
    """Mixture of experts: which FFN layers are routed and how wide each expert is."""

    n_expert: int = Field(ge=2, description="routed experts per MoE layer")
    n_expert_used: int = Field(ge=1, description="experts each token is routed to")
    expert_ff: int = Field(ge=1, description="FFN width of one routed expert")
    n_shared_expert: int = Field(default=0, ge=0, description="always-active shared experts")
    shared_expert_ff: int | None = Field(
        default=None,
        ge=1,
        description="total FFN width of the shared expert block; default expert_ff * n_shared_expert",
    )
    n_dense_lead_layers: int = Field(
        default=0, ge=0, description="leading layers with a dense FFN (DeepSeek first_k_dense_replace)"
    )
    layer_step: int = Field(
        default=1, ge=1, description="every N-th layer is MoE, the others dense (Llama 4 interleave_moe_layer_step)"
    )
    latent_size: int | None = Field(
        default=None,
        ge=1,
        description="the routed experts run in a narrower latent space, projected down and up around them "
        "(Nemotron 3 Super / Ultra moe_latent_size)",
    )
    selection_bias: bool = Field(
        default=False, description="the router carries a per-expert selection bias (exp_probs_b; DeepSeek-V3 style)"
    )

    @property
    def shared_ff(self) -> int:
        if self.n_shared_expert == 0:
            return 0
        return self.shared_expert_ff or self.expert_ff * self.n_shared_expert


class MLASpec(Frozen):
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2)."""

    q_lora_rank: int = Field(ge=0, description="0 when queries are not low-rank (V2-Lite)")
    kv_lora_rank: int = Field(ge=1)
    qk_rope_head_dim: int = Field(ge=1)
    qk_nope_head_dim: int = Field(ge=1)
    v_head_dim: int = Field(ge=1)


class IndexerSpec(Frozen):
    """DeepSeek sparse attention's lightning indexer (DeepSeek-V3.2, GLM-5): a small attention that picks
    the top-k cached tokens each query attends to, with its own per-token key cache; or MiniMax sparse
    attention's (MiniMax-M3), which picks blocks of positions with one indexer head per KV head."""

    n_head: int = Field(ge=1, description="indexer heads (index_n_heads)")
    head_dim: int = Field(ge=1, description="indexer key width per head (index_head_dim)")
    top_k: int = Field(ge=1, description="tokens each query attends to (index_topk)")
    full_layers: list[int] | None = Field(
        default=None,
        description="layers with their own indexer and indexer cache (GLM-5: the others reuse the previous "
        "full layer's choice); None: every attention layer",
    )
    block_size: int | None = Field(
        default=None,
        ge=1,
        description="MiniMax sparse attention (MiniMax-M3): the indexer ranks blocks of this many positions and "
        "top_k counts blocks; its cache holds a key and a one-head value per token on the layers after the "
        "dense lead. None: DeepSeek's per-token indexer",
    )
    local_blocks: int = Field(default=0, ge=0, description="MiniMax sparse attention: recent blocks always kept")


class SSMSpec(Frozen):
    """Selective state-space (Mamba) layers."""

    version: Literal[1, 2] = 1
    d_conv: int = Field(ge=1)
    d_inner: int = Field(ge=1)
    d_state: int = Field(ge=1)
    dt_rank: int = Field(default=0, ge=0, description="Mamba-1 time-step rank; 0 for Mamba-2")
    n_group: int = Field(default=1, ge=1)
    n_head: int = Field(default=0, ge=0, description="Mamba-2 heads; 0 for Mamba-1")


class Architecture(Frozen):
    """Hyper-parameters of one model, in llama.cpp's terms.

    Per-layer values (``n_head``, ``n_head_kv``, ``n_ff``) may be one integer for every layer or
    a list with one entry per layer. ``n_head_kv`` of 0 on a layer means it holds no KV cache.
    """

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$", description="catalog id, e.g. llama-3.1-8b")
    name: str
    arch: str = Field(description="llama.cpp general.architecture, e.g. llama, qwen2, gemma3")
    source: str = Field(default="", description="where the numbers come from")
    params_billions: float | None = Field(default=None, gt=0, description="published size")
    n_layer: int = Field(ge=1, le=1024)
    n_embd: int = Field(ge=1)
    n_head: PerLayerInt
    n_head_kv: PerLayerInt
    head_dim_k: int | None = Field(default=None, ge=1, description="attention.key_length")
    head_dim_v: int | None = Field(default=None, ge=1, description="attention.value_length")
    n_ff: PerLayerInt
    n_vocab: int = Field(ge=1)
    tied_embeddings: bool
    n_ctx_train: int = Field(ge=1)
    sliding_window: int | None = Field(default=None, ge=1, description="SWA window in tokens")
    sliding_window_pattern: int | None = Field(
        default=None,
        ge=1,
        description="period of the SWA layout: in each run of N layers the last is full attention "
        "(Gemma 2: 2, Gemma 3: 6, gpt-oss: 2). 1 means every layer is SWA.",
    )
    swa_dense_first: bool = Field(
        default=False,
        description="the SWA period starts with its full-attention layer (set_swa_pattern's dense_first: "
        "Laguna XS.2 has full attention on layers 0, 4, 8...)",
    )
    attn_bias: bool = Field(default=False, description="q/k/v projections carry a bias")
    qk_norm: bool = Field(default=False, description="per-head RMS norm on q and k")
    head_dim_k_swa: int | None = Field(
        default=None, ge=1, description="key width per head on sliding-window layers (Gemma 4 key_length_swa)"
    )
    head_dim_v_swa: int | None = Field(
        default=None, ge=1, description="value width per head on sliding-window layers (value_length_swa)"
    )
    full_attention_k_is_v: bool = Field(
        default=False,
        description="full-attention layers have no V projection and attend with K as V (Gemma 4 attention_k_eq_v); "
        "their cache still holds both",
    )
    n_kv_shared_layers: int = Field(
        default=0,
        ge=0,
        description="trailing layers with no KV cache of their own: they read the last full / sliding-window "
        "layer's cache before them (Gemma 3n, Gemma 4 E2B/E4B shared_kv_layers)",
    )
    n_embd_per_layer: int = Field(
        default=0,
        ge=0,
        description="per-layer embedding width (Gemma 3n / Gemma 4 E sizes): a token's second embedding of "
        "n_embd_per_layer x n_layer values, fed to every layer",
    )
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    indexer: IndexerSpec | None = None
    ssm: SSMSpec | None = None
    conv_l_cache: int | None = Field(
        default=None,
        ge=2,
        description="short-convolution layers (LFM2): the convolution's length; each keeps n_embd x (L - 1) "
        "f32 of state per sequence",
    )
    attention_layers: list[int] | None = Field(
        default=None,
        description="for hybrid models: indices of the attention layers (the rest are recurrent)",
    )
    ffn_only_layers: list[int] | None = Field(
        default=None,
        description="for hybrids whose blocks are one of Mamba, attention or feed-forward (Nemotron-H): the "
        "feed-forward-only layers, which hold neither KV nor state",
    )
    n_nextn_layers: int = Field(
        default=0,
        ge=0,
        description="trailing multi-token-prediction (NextN) layers, counted in n_layer as llama.cpp's block_count "
        "does: their tensors are in the file but not loaded (load_mtp is off by default) and they hold no KV",
    )
    native_expert_type: Literal["MXFP4"] | None = Field(
        default=None,
        description="the type the routed experts were released in (gpt-oss: MXFP4); published GGUFs keep it",
    )
    default_quant: str | None = Field(default=None, description="the file people download, when not Q4_K_M")

    @model_validator(mode="after")
    def _check_shapes(self) -> Architecture:
        for field in ("n_head", "n_head_kv", "n_ff"):
            value = getattr(self, field)
            if isinstance(value, list):
                if len(value) != self.n_layer:
                    raise ValueError(f"{field} has {len(value)} entries for {self.n_layer} layers")
                if any(v < 0 for v in value):
                    raise ValueError(f"{field} has a negative entry")
            elif value < 0:
                raise ValueError(f"{field} is negative")
        if self.sliding_window_pattern is not None and self.sliding_window is None:
            raise ValueError("sliding_window_pattern is set without sliding_window")
        if self.attention_layers is not None:
            if not self.is_hybrid_family:
                raise ValueError("attention_layers is only meaningful for hybrid (ssm or short-convolution) models")
            if any(i < 0 or i >= self.n_layer for i in self.attention_layers):
                raise ValueError("attention_layers holds an index outside the model")
        if self.moe is not None and self.moe.n_expert_used > self.moe.n_expert:
            raise ValueError("n_expert_used exceeds n_expert")
        if self.n_nextn_layers >= self.n_layer:
            raise ValueError("n_nextn_layers leaves no layer to run")
        if self.n_kv_shared_layers and self.n_kv_shared_layers > self.n_layer - 2:
            raise ValueError("n_kv_shared_layers leaves fewer than two layers with a KV cache")
        return self

    # -- per-layer accessors -------------------------------------------------------------------
    def heads(self, layer: int) -> int:
        return self.n_head[layer] if isinstance(self.n_head, list) else self.n_head

    def kv_heads(self, layer: int) -> int:
        if not self.is_attention_layer(layer):
            return 0
        return self.n_head_kv[layer] if isinstance(self.n_head_kv, list) else self.n_head_kv

    def ff(self, layer: int) -> int:
        return self.n_ff[layer] if isinstance(self.n_ff, list) else self.n_ff

    def max_heads(self) -> int:
        return max(self.n_head) if isinstance(self.n_head, list) else self.n_head

    @property
    def head_dim_k_eff(self) -> int:
        """Key width per head: attention.key_length, else n_embd / n_head."""
        return self.head_dim_k or self.n_embd // max(1, self.max_heads())

    @property
    def head_dim_v_eff(self) -> int:
        return self.head_dim_v or self.n_embd // max(1, self.max_heads())

    def head_dim_k_at(self, layer: int) -> int:
        """Key width per head on ``layer`` (llama_hparams::n_embd_head_k(il): SWA layers may differ)."""
        if self.head_dim_k_swa is not None and self.is_swa_layer(layer):
            return self.head_dim_k_swa
        return self.head_dim_k_eff

    def head_dim_v_at(self, layer: int) -> int:
        if self.head_dim_v_swa is not None and self.is_swa_layer(layer):
            return self.head_dim_v_swa
        return self.head_dim_v_eff

    def has_own_kv(self, layer: int) -> bool:
        """Whether ``layer`` holds a KV cache of its own (llama_hparams::has_kv: not a shared-KV layer)."""
        return layer < self.n_layer - self.n_kv_shared_layers

    @property
    def is_hybrid_family(self) -> bool:
        """Recurrent layers of some kind (Mamba, short convolution), possibly among attention layers."""
        return self.ssm is not None or self.conv_l_cache is not None

    def is_attention_layer(self, layer: int) -> bool:
        if not self.is_hybrid_family:
            return True
        return self.attention_layers is not None and layer in self.attention_layers

    def is_recurrent_layer(self, layer: int) -> bool:
        if self.ffn_only_layers is not None and layer in self.ffn_only_layers:
            return False
        return self.is_hybrid_family and not self.is_attention_layer(layer)

    def is_swa_layer(self, layer: int) -> bool:
        """llama.cpp's set_swa_pattern: in each period of N layers the last one is full."""
        if self.sliding_window is None or self.sliding_window_pattern is None:
            return False
        n = self.sliding_window_pattern
        if self.swa_dense_first:
            return n == 1 or layer % n != 0
        return n == 1 or layer % n < n - 1

    def is_nextn_layer(self, layer: int | None) -> bool:
        """A trailing multi-token-prediction layer, which llama.cpp skips (no weights loaded, no KV)."""
        return layer is not None and self.n_nextn_layers > 0 and layer >= self.n_layer - self.n_nextn_layers

    def is_moe_layer(self, layer: int) -> bool:
        moe = self.moe
        return moe is not None and layer >= moe.n_dense_lead_layers and (layer + 1) % moe.layer_step == 0

    @property
    def uses_swa(self) -> bool:
        return any(self.is_swa_layer(i) for i in range(self.n_layer))
