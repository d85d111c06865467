"""Tensor layouts of the 2025-2026 families with their own block structure: Gemma 4 (sliding and
full attention of different head widths, a dense MLP beside the experts, per-layer embeddings on the
E sizes), Gemma 3n (AltUp streams, LAuReL, per-layer embeddings), MiniMax-M3 (experts with the
sparse-attention indexer's projections), HY V3 and Step 3.5 (experts with a shared expert and whole
decoder layers as multi-token-prediction blocks), each following
``load_arch_tensors`` in src/models/*.cpp of the vendored llama.cpp."""

from __future__ import annotations

from collections.abc import Callable

from app.core.model.architecture import GEMMA3N_ALTUP, GEMMA3N_LAUREL_RANK, Architecture
from app.core.model.layout_parts import (
    TensorShape,
    attention,
    dense_ffn,
    ffn,
    mat,
    mla_attention,
    nextn_head,
    routed_experts,
    vec,
)


def _per_layer_embedding(arch: Architecture) -> list[TensorShape]:
    """Gemma's per-layer embeddings (PLE): a second token embedding of n_embd_per_layer x n_layer values
    and its projection from the main embedding (llama_model_gemma4::load_arch_tensors)."""
    if not arch.n_embd_per_layer:
        return []
    width = arch.n_embd_per_layer * arch.n_layer
    return [
        mat("per_layer_token_embd.weight", width, arch.n_vocab),
        mat("per_layer_model_proj.weight", arch.n_embd, width),
        vec("per_layer_proj_norm.weight", arch.n_embd_per_layer),
    ]


def _gemma4_prefix(arch: Architecture) -> list[TensorShape]:
    # The full-attention layers' proportional RoPE factors: one tensor for all of them.
    return [*_per_layer_embedding(arch), vec("rope_freqs.weight", arch.head_dim_k_eff // 2)]


def _gemma3n_prefix(arch: Architecture) -> list[TensorShape]:
    """Gemma 3n: AltUp's projections of the embedding into the other streams and back (one n_embd x
    n_embd matrix per extra stream), then the per-layer embeddings (llama_model_gemma3n::load_arch_tensors)."""
    e, extra = arch.n_embd, GEMMA3N_ALTUP - 1
    return [
        mat("altup_proj.weight", e, e, extra),
        mat("altup_unembd_proj.weight", e, e, extra),
        *_per_layer_embedding(arch),
    ]


def _gemma3n_block(arch: Architecture, i: int) -> list[TensorShape]:
    """Gemma 3n: q/k/v on every layer (a shared-KV layer keeps its k and v though it reads an earlier
    layer's cache), per-head q/k norms, Gemma's post-norms around a GELU FFN, the per-layer embedding's
    gate and projection, AltUp's router and predict/correct coefficients and LAuReL's low-rank pair
    (llama_model_gemma3n::load_arch_tensors)."""
    p = f"blk.{i}."
    e, n = arch.n_embd, GEMMA3N_ALTUP
    d = arch.head_dim_k_eff
    return [
        vec(p + "attn_norm.weight", e),
        mat(p + "attn_q.weight", e, arch.heads(i) * d),
        mat(p + "attn_k.weight", e, arch.kv_heads(i) * d),
        mat(p + "attn_v.weight", e, arch.kv_heads(i) * arch.head_dim_v_eff),
        mat(p + "attn_output.weight", arch.heads(i) * d, e),
        vec(p + "attn_q_norm.weight", d),
        vec(p + "attn_k_norm.weight", d),
        vec(p + "post_attention_norm.weight", e),
        vec(p + "ffn_norm.weight", e),
        *dense_ffn(arch, i, p),
        vec(p + "post_ffw_norm.weight", e),
        mat(p + "inp_gate.weight", e, arch.n_embd_per_layer),
        mat(p + "proj.weight", arch.n_embd_per_layer, e),
        vec(p + "post_norm.weight", e),
        mat(p + "altup_correct_coef.weight", n, n),
        vec(p + "altup_correct_scale.weight", e),
        mat(p + "altup_predict_coef.weight", n, n * n),
        mat(p + "altup_router.weight", e, n),
        vec(p + "altup_router_norm.weight", e),
        mat(p + "laurel_l.weight", e, GEMMA3N_LAUREL_RANK),
        mat(p + "laurel_r.weight", GEMMA3N_LAUREL_RANK, e),
        vec(p + "laurel_post_norm.weight", e),
    ]


def _gemma4_block(arch: Architecture, i: int) -> list[TensorShape]:
    """Gemma 4: q (and, on layers with a cache of their own, k and v: none for full-attention layers
    whose V is their K) with per-head norms and a scalar output scale; a dense GELU MLP, beside a
    softmax-routed mixture of experts with fused gate/up on the MoE sizes; per-layer embedding gate
    and projection on the E sizes."""
    p = f"blk.{i}."
    e = arch.n_embd
    d = arch.head_dim_k_at(i)
    n_kv = arch.kv_heads(i)
    out = [vec(p + "attn_norm.weight", e), mat(p + "attn_q.weight", e, arch.heads(i) * d)]
    own_kv = arch.has_own_kv(i)
    if own_kv:
        out.append(mat(p + "attn_k.weight", e, n_kv * d))
        if not (arch.full_attention_k_is_v and not arch.is_swa_layer(i)):
            out.append(mat(p + "attn_v.weight", e, n_kv * arch.head_dim_v_at(i)))
    out += [mat(p + "attn_output.weight", arch.heads(i) * d, e), vec(p + "attn_q_norm.weight", d)]
    if own_kv:
        out.append(vec(p + "attn_k_norm.weight", d))
    out += [
        vec(p + "post_attention_norm.weight", e),
        vec(p + "layer_output_scale.weight", 1),
        vec(p + "ffn_norm.weight", e),
        *dense_ffn(arch, i, p),
        vec(p + "post_ffw_norm.weight", e),
    ]
    moe = arch.moe
    if moe is not None and arch.is_moe_layer(i):
        n, ff = moe.n_expert, moe.expert_ff
        out += [
            TensorShape(p + "ffn_gate_inp.weight", (e, n), keep_f32=True),
            vec(p + "ffn_gate_inp.scale", e),
            vec(p + "pre_ffw_norm_2.weight", e),
            vec(p + "post_ffw_norm_1.weight", e),
            vec(p + "post_ffw_norm_2.weight", e),
            mat(p + "ffn_gate_up_exps.weight", e, 2 * ff, n),
            mat(p + "ffn_down_exps.weight", ff, e, n),
            vec(p + "ffn_down_exps.scale", n),
        ]
    if arch.n_embd_per_layer:
        out += [
            mat(p + "inp_gate.weight", e, arch.n_embd_per_layer),
            mat(p + "proj.weight", arch.n_embd_per_layer, e),
            vec(p + "post_norm.weight", e),
        ]
    return out


def _dsa_block(arch: Architecture, i: int) -> list[TensorShape]:
    """DeepSeek-V3.2 (deepseek32) and GLM-5 (glm-dsa): DeepSeek's multi-head latent attention with the
    sparse-attention lightning indexer (its q/k projections, head weights and k norm; on GLM-5.2 only
    the layers with a full indexer carry one), a dense FFN on the leading layers and experts with a
    selection bias after them; the trailing multi-token-prediction block, a whole decoder layer, keeps
    its own embedding and head copies (src/models/deepseek32.cpp, glm-dsa.cpp load_arch_tensors)."""
    p = f"blk.{i}."
    e = arch.n_embd
    mla, ix = arch.mla, arch.indexer
    assert mla is not None and ix is not None
    out = [vec(p + "attn_norm.weight", e), *mla_attention(arch, p), vec(p + "ffn_norm.weight", e)]
    if ix.full_layers is None or i in ix.full_layers or arch.is_nextn_layer(i):
        out += [
            vec(p + "indexer.k_norm.weight", ix.head_dim),
            vec(p + "indexer.k_norm.bias", ix.head_dim),
            mat(p + "indexer.proj.weight", e, ix.n_head),
            mat(p + "indexer.attn_k.weight", e, ix.head_dim),
            mat(p + "indexer.attn_q_b.weight", mla.q_lora_rank, ix.n_head * ix.head_dim),
        ]
    out += ffn(arch, i, p)
    if arch.is_nextn_layer(i):
        # The MTP module carries its own embedding and head copies (DeepSeek-V3's checkpoints, and GLM's:
        # model.layers.47.embed_tokens / shared_head.head in GLM-4.7-Flash's weight list).
        out += nextn_head(arch, p) + [
            mat(p + "nextn.embed_tokens.weight", e, arch.n_vocab),
            mat(p + "nextn.shared_head_head.weight", e, arch.n_vocab),
        ]
    return out


def _laguna_block(arch: Architecture, i: int) -> list[TensorShape]:
    """Laguna: attention with per-layer head counts, q/k norms and a per-head output gate (softplus), a
    dense FFN on the leading layers and sigmoid-routed experts with a selection bias and a shared expert
    after them (llama_model_laguna::load_arch_tensors)."""
    p = f"blk.{i}."
    e = arch.n_embd
    return [
        vec(p + "attn_norm.weight", e),
        *attention(arch, i, p),
        mat(p + "attn_gate.weight", e, arch.heads(i)),
        vec(p + "ffn_norm.weight", e),
        *ffn(arch, i, p),
    ]


def _minimax_m3_block(arch: Architecture, i: int) -> list[TensorShape]:
    """MiniMax-M3: grouped-query attention with per-head q/k norms, a dense FFN on the leading layers,
    then experts with a selection bias and shared experts, and the sparse-attention indexer's q/k
    projections and norms (kept F32: the converter forces them and llama.cpp's quantizer leaves them,
    llama_tensor_get_type) on the layers after the dense lead (llama_model_minimax_m3::load_arch_tensors)."""
    p = f"blk.{i}."
    e = arch.n_embd
    ix = arch.indexer
    assert ix is not None
    out = [vec(p + "attn_norm.weight", e), *attention(arch, i, p), vec(p + "ffn_norm.weight", e), *ffn(arch, i, p)]
    if arch.is_moe_layer(i):
        out += [
            TensorShape(p + "indexer.q_proj.weight", (e, ix.n_head * ix.head_dim), keep_f32=True),
            TensorShape(p + "indexer.k_proj.weight", (e, ix.head_dim), keep_f32=True),
            vec(p + "indexer.q_norm.weight", ix.head_dim),
            vec(p + "indexer.k_norm.weight", ix.head_dim),
        ]
    return out


def _hy_v3_block(arch: Architecture, i: int) -> list[TensorShape]:
    """HY V3: grouped-query attention with per-head q/k norms, a dense FFN on the leading layers, then
    sigmoid-routed experts with a selection bias (``exp_probs_b``, no suffix) and a shared expert; the
    trailing multi-token-prediction block is a whole decoder layer with the NextN projections and its
    final norm (llama_model_hy_v3::load_arch_tensors, HYV3Model.filter_tensors)."""
    p = f"blk.{i}."
    e = arch.n_embd
    out = [vec(p + "attn_norm.weight", e), *attention(arch, i, p), vec(p + "ffn_norm.weight", e)]
    moe = arch.moe
    if moe is None or not arch.is_moe_layer(i):
        out += dense_ffn(arch, i, p)
    else:
        sff = moe.shared_ff
        out += [
            *routed_experts(arch, p),
            vec(p + "exp_probs_b", moe.n_expert),
            mat(p + "ffn_gate_shexp.weight", e, sff),
            mat(p + "ffn_down_shexp.weight", sff, e),
            mat(p + "ffn_up_shexp.weight", e, sff),
        ]
    if arch.is_nextn_layer(i):
        out += nextn_head(arch, p)
    return out


def _step35_block(arch: Architecture, i: int) -> list[TensorShape]:
    """Step 3.5: attention with per-layer head counts (its sliding-window layers have their own), per-head
    q/k norms and a per-head output gate, a dense FFN on the leading layers, then sigmoid-routed experts
    with a selection bias and a shared expert; each trailing multi-token-prediction block is a whole
    decoder layer with the NextN projections and its own shared head (llama_model_step35::load_arch_tensors,
    Step35Model.filter_tensors)."""
    p = f"blk.{i}."
    e = arch.n_embd
    out = [
        vec(p + "attn_norm.weight", e),
        *attention(arch, i, p),
        mat(p + "attn_gate.weight", e, arch.heads(i)),
        vec(p + "ffn_norm.weight", e),
        *ffn(arch, i, p),
    ]
    if arch.is_nextn_layer(i):
        out += [*nextn_head(arch, p), mat(p + "nextn.shared_head_head.weight", e, arch.n_vocab)]
    return out


BLOCKS: dict[str, Callable[[Architecture, int], list[TensorShape]]] = {
    "hy_v3": _hy_v3_block,
    "step35": _step35_block,
    "laguna": _laguna_block,
    "minimax-m3": _minimax_m3_block,
    "gemma4": _gemma4_block,
    "gemma3n": _gemma3n_block,
    "deepseek32": _dsa_block,
    "glm-dsa": _dsa_block,
}

PREFIX: dict[str, Callable[[Architecture], list[TensorShape]]] = {
    "gemma4": _gemma4_prefix,
    "gemma3n": _gemma3n_prefix,
}
