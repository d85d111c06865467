"""Speculative decoding's own memory: the MTP context llama-server keeps beside the model's for
``--spec-type draft-mtp`` (a draft model's is a whole estimate of its own, made in
:mod:`app.core.memory.estimate`).

The MTP context (``llama_init_from_model`` with ``LLAMA_CONTEXT_TYPE_MTP``,
common_speculative_init_result in common/speculative.cpp) runs the model's NextN layers only:

- weights: the NextN block, which the loader now loads (load_mtp) instead of skipping;
- KV cache: the NextN layers alone (``filter il >= n_layer()`` in llama_model::create_memory), as
  many cells as the model's context, in the draft cache types; a plain attention cache on the hybrids
  (no recurrent state), a K-only latent cache for multi-head latent attention;
- compute: one decoder layer's working set over the ubatch (the graph_mtp of each architecture:
  src/models/qwen35.cpp, qwen35moe.cpp, nemotron-h-moe.cpp, deepseek32.cpp, glm-dsa.cpp, glm4-moe.cpp),
  and logits for one row per slot;
- output buffer: logits of one row per slot (n_outputs_max = n_parallel).
"""

from __future__ import annotations

from app.core.memory.graphs import MLA_ARCHS
from app.core.memory.kv import cache_type, context_cells
from app.core.memory.records import Settings, SpeculativeSpec
from app.core.model.architecture import Architecture
from app.core.model.tensors import row_bytes

F32 = 4
SMALL_INPUTS_BYTES = 64 * 1024

# Architectures whose graph has an MTP variant (LLM_GRAPH_TYPE_DECODER_MTP) in the vendored llama.cpp.
MTP_ARCHS = frozenset(
    {"qwen35", "qwen35moe", "qwen3next", "deepseek32", "glm-dsa", "glm4moe", "nemotron_h_moe", "deepseek4"}
)


def supports_mtp(arch: Architecture) -> bool:
    """Whether llama-server can draft with this model's own MTP head (the file keeps one)."""
    return arch.arch in MTP_ARCHS and arch.n_nextn_layers > 0


def mtp_kv_bytes(arch: Architecture, settings: Settings, spec: SpeculativeSpec) -> int:
    """The MTP context's KV cache: the NextN layers, the draft cache types, the model's cells."""
    cells, streams = context_cells(settings)
    type_k, type_v = cache_type(spec.cache_type_k), cache_type(spec.cache_type_v)
    total = 0
    for i in range(arch.n_layer - arch.n_nextn_layers, arch.n_layer):
        if arch.mla is not None:
            total += row_bytes(type_k, arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim) * cells * streams
            continue
        n_kv = arch.n_head_kv[i] if isinstance(arch.n_head_kv, list) else arch.n_head_kv
        total += row_bytes(type_k, n_kv * arch.head_dim_k_eff) * cells * streams
        total += row_bytes(type_v, n_kv * arch.head_dim_v_eff) * cells * streams
    return total


def mtp_compute_bytes(arch: Architecture, settings: Settings) -> int:
    """The MTP graph's peak: its one decoder layer over the ubatch, with the mask (f16 with flash
    attention, f32 without) and, without flash attention, the scores of every head over the cache.
    Measured on dry runs of Qwen3.5 27B / 35B-A3B, Nemotron 3 Super and DeepSeek-V3.2."""
    cells, streams = context_cells(settings)
    n_kv = cells * streams if settings.kv_unified else cells
    n_ub = settings.graph_tokens
    e = arch.n_embd
    mask = n_ub * n_kv * (2 if settings.flash_attn else F32)
    heads = arch.max_heads()
    if arch.mla is not None and arch.arch in MLA_ARCHS:
        mla = arch.mla
        q = heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
        q_cur = heads * (mla.kv_lora_rank + mla.qk_rope_head_dim)
        if settings.flash_attn:
            rows = 2 * e + q + mla.q_lora_rank + heads * mla.kv_lora_rank + heads * mla.qk_rope_head_dim + q_cur
        else:
            rows = 2 * e + q + heads * (mla.kv_lora_rank + mla.qk_nope_head_dim + mla.qk_rope_head_dim) + q_cur
            rows += heads * n_kv
        return n_ub * F32 * rows + mask
    if not settings.flash_attn:
        # The scores over the cache dominate: every head, f32, beside the (gated) query, its norm, the
        # projected input and the new K and V rows (Qwen3.5 27B: exact to 0.01 MiB at 8k cells).
        q_width = heads * arch.head_dim_k_eff
        kv_width = 2 * arch.kv_heads(arch.n_layer - 1) * arch.head_dim_k_eff
        return n_ub * F32 * (heads * n_kv + 3 * q_width + 2 * e + kv_width) + mask
    if arch.arch == "nemotron_h_moe":
        # The experts run on the kept rows only (crop_before_ffn): the peak is the token and hidden
        # embeddings and their concatenation before the projection.
        return n_ub * F32 * 4 * e + mask
    moe = arch.moe
    if moe is not None:
        return n_ub * F32 * moe.n_expert_used * (moe.expert_ff + 2 * e)
    ff = arch.ff(arch.n_layer - 1)
    # The graph's small inputs (positions, output ids) sit beside the peak: under 0.05 MiB.
    return n_ub * F32 * (3 * ff + 2 * e) + mask + SMALL_INPUTS_BYTES


def head_output_bytes(arch: Architecture, settings: Settings) -> int:
    """The second context's logits: one row per slot."""
    return max(1, settings.parallel_sequences) * arch.n_vocab * F32
