"""Tensor layouts of the hybrid families, whose layers are recurrent mixers among attention layers:
LFM2's short convolutions, Nemotron-H's Mamba-2 / attention / MLP blocks, Granite 4.0-H's Mamba-2 or
attention layers each with a feed-forward block, Qwen3-Next's and Qwen3.5's gated DeltaNet, Kimi
Linear's delta attention among latent-attention layers, each following ``load_arch_tensors`` in
src/models/*.cpp of the vendored llama.cpp."""

from __future__ import annotations

from collections.abc import Callable

from app.core.model.architecture import Architecture
from app.core.model.layout_parts import (
    TensorShape,
    attention,
    dense_ffn,
    ffn,
    mamba2_mixer,
    mat,
    mla_attention,
    nextn_head,
    vec,
)


def _lfm2_block(arch: Architecture, i: int) -> list[TensorShape]:
    """LFM2: every layer has a dense FFN; attention layers (n_head_kv > 0) have per-head q/k norms and
    a Q as wide as the embedding; the others a short convolution (src/models/lfm2.cpp)."""
    p = f"blk.{i}."
    e = arch.n_embd
    out = [vec(p + "ffn_norm.weight", e), *ffn(arch, i, p), vec(p + "attn_norm.weight", e)]
    if arch.is_recurrent_layer(i):
        assert arch.conv_l_cache is not None
        return out + [
            TensorShape(p + "shortconv.conv.weight", (arch.conv_l_cache, e), keep_f32=True),
            mat(p + "shortconv.in_proj.weight", e, 3 * e),
            mat(p + "shortconv.out_proj.weight", e, e),
        ]
    d = arch.head_dim_k_eff
    return out + [
        vec(p + "attn_q_norm.weight", d),
        vec(p + "attn_k_norm.weight", d),
        mat(p + "attn_q.weight", e, e),
        mat(p + "attn_k.weight", e, arch.kv_heads(i) * d),
        mat(p + "attn_v.weight", e, arch.kv_heads(i) * arch.head_dim_v_eff),
        mat(p + "attn_output.weight", e, e),
    ]


def _nemotron_h_block(arch: Architecture, i: int) -> list[TensorShape]:
    """Nemotron-H: each block is one of a Mamba-2 mixer, attention (no RoPE) or a ReLU-squared MLP
    with up and down projections only (src/models/nemotron-h.cpp load_arch_tensors)."""
    p = f"blk.{i}."
    e = arch.n_embd
    out = [vec(p + "attn_norm.weight", e)]
    if arch.ffn_only_layers is not None and i in arch.ffn_only_layers:
        ff = arch.ff(i)
        return out + [mat(p + "ffn_down.weight", ff, e), mat(p + "ffn_up.weight", e, ff)]
    if arch.is_recurrent_layer(i):
        return out + mamba2_mixer(arch, p)
    return out + attention(arch, i, p)


def _granite_hybrid_block(arch: Architecture, i: int) -> list[TensorShape]:
    """Granite 4.0-H (granitehybrid): a Mamba-2 mixer on layers with no KV heads, attention without RoPE
    on the others, each followed by a feed-forward block: the routed experts (gate, up, down) with a
    shared expert, or a dense gated FFN on the dense sizes
    (llama_model_granite_hybrid::load_arch_tensors, src/models/granite-hybrid.cpp)."""
    p = f"blk.{i}."
    e = arch.n_embd
    out = [vec(p + "attn_norm.weight", e)]
    out += mamba2_mixer(arch, p) if arch.is_recurrent_layer(i) else attention(arch, i, p)
    return out + [vec(p + "ffn_norm.weight", e), *ffn(arch, i, p)]


def _delta_net_block(arch: Architecture, i: int) -> list[TensorShape]:
    """Qwen3-Next and Qwen3.5 / 3.6: gated DeltaNet (linear attention) layers and gated full-attention
    layers (Q and its output gate in one projection); Qwen3-Next and Qwen3.5-MoE have a mixture of
    experts with a gated shared expert on every layer, dense Qwen3.5 a plain FFN; a trailing NextN
    layer holds the multi-token-prediction head (src/models/qwen3next.cpp, qwen35.cpp, qwen35moe.cpp
    load_arch_tensors)."""
    p = f"blk.{i}."
    e = arch.n_embd
    out = [vec(p + "attn_norm.weight", e)]
    if arch.is_recurrent_layer(i):
        ssm = arch.ssm
        assert ssm is not None
        key_dim = ssm.d_state * ssm.n_group
        value_dim = ssm.d_state * ssm.n_head
        conv_dim = 2 * key_dim + value_dim
        out += [
            mat(p + "attn_qkv.weight", e, conv_dim),
            mat(p + "attn_gate.weight", e, value_dim),
            TensorShape(p + "ssm_conv1d.weight", (ssm.d_conv, conv_dim), keep_f32=True),
            vec(p + "ssm_dt.bias", ssm.n_head),
            vec(p + "ssm_a", ssm.n_head),
        ]
        if arch.arch == "qwen3next":
            out.append(mat(p + "ssm_ba.weight", e, 2 * ssm.n_head))
        else:
            # Qwen3.5 keeps beta and alpha apart (in_proj_b / in_proj_a).
            out += [mat(p + "ssm_beta.weight", e, ssm.n_head), mat(p + "ssm_alpha.weight", e, ssm.n_head)]
        out += [vec(p + "ssm_norm.weight", ssm.d_state), mat(p + "ssm_out.weight", value_dim, e)]
    else:
        d = arch.head_dim_k_eff
        n_q = arch.heads(i) * d
        out += [
            mat(p + "attn_q.weight", e, 2 * n_q),
            mat(p + "attn_k.weight", e, arch.kv_heads(i) * d),
            mat(p + "attn_v.weight", e, arch.kv_heads(i) * arch.head_dim_v_eff),
            mat(p + "attn_output.weight", n_q, e),
            vec(p + "attn_q_norm.weight", d),
            vec(p + "attn_k_norm.weight", d),
        ]
    out.append(vec(p + "post_attention_norm.weight", e))
    if arch.moe is None:
        out += dense_ffn(arch, i, p)
    else:
        out += ffn(arch, i, p)
        out.append(vec(p + "ffn_gate_inp_shexp.weight", e))
    if arch.is_nextn_layer(i):
        out += nextn_head(arch, p)
    return out


def _kimi_linear_block(arch: Architecture, i: int) -> list[TensorShape]:
    """Kimi Linear (kimi-linear): Kimi delta attention on the recurrent layers (q, k, v projections each
    with its own short convolution, the low-rank forget gate f_a / f_b with its bias, beta, A, the
    low-rank output gate g_a / g_b, the output norm and projection), multi-head latent attention without
    a low-rank query on the others; a dense FFN on the leading layers, then routed experts with a
    selection bias and a shared expert (llama_model_kimi_linear::load_arch_tensors,
    src/models/kimi-linear.cpp)."""
    p = f"blk.{i}."
    e = arch.n_embd
    out = [vec(p + "attn_norm.weight", e)]
    if arch.is_recurrent_layer(i):
        ssm = arch.ssm
        assert ssm is not None
        d, inner = ssm.d_state, ssm.d_inner
        out += [TensorShape(p + f"ssm_conv1d_{x}.weight", (ssm.d_conv, 1, inner), keep_f32=True) for x in "qkv"]
        out += [mat(p + f"attn_{x}.weight", e, inner) for x in "qkv"]
        out += [
            mat(p + "ssm_f_a.weight", e, d),
            mat(p + "ssm_f_b.weight", d, inner),
            mat(p + "ssm_beta.weight", e, ssm.n_head),
            TensorShape(p + "ssm_a", (1, ssm.n_head), keep_f32=True),
            vec(p + "ssm_dt.bias", inner),
            mat(p + "ssm_g_a.weight", e, d),
            mat(p + "ssm_g_b.weight", d, inner),
            vec(p + "ssm_norm.weight", d),
            mat(p + "attn_output.weight", inner, e),
        ]
    else:
        out += mla_attention(arch, p)
    return out + [vec(p + "ffn_norm.weight", e), *ffn(arch, i, p)]


def _nemotron_h_moe_block(arch: Architecture, i: int) -> list[TensorShape]:
    """Nemotron 3 (nemotron_h_moe): Mamba-2, attention and mixture-of-experts blocks; the experts have
    up and down projections only (ReLU squared), beside a shared expert of the same form, a router
    with a selection bias and, on Super / Ultra, a latent projection around the routed experts; a
    trailing multi-token-prediction block holds an attention and a MoE sub-layer
    (llama_model_nemotron_h::load_arch_tensors, src/models/nemotron-h.cpp)."""
    p = f"blk.{i}."
    e = arch.n_embd
    out = [vec(p + "attn_norm.weight", e)]
    if arch.is_nextn_layer(i):
        return (
            nextn_head(arch, p)
            + out
            + attention(arch, i, p)
            + [vec(p + "post_attention_norm.weight", e)]
            + _latent_experts(arch, p)
        )
    if arch.ffn_only_layers is not None and i in arch.ffn_only_layers:
        return out + _latent_experts(arch, p)
    if arch.is_recurrent_layer(i):
        return out + mamba2_mixer(arch, p)
    return out + attention(arch, i, p)


def _latent_experts(arch: Architecture, p: str) -> list[TensorShape]:
    """Nemotron 3's MoE: router and its bias, the latent down/up projections when the experts run in a
    narrower space (moe_latent_size), up/down experts and the shared expert."""
    moe = arch.moe
    assert moe is not None
    e = arch.n_embd
    n, ff = moe.n_expert, moe.expert_ff
    width = moe.latent_size or e
    out = [TensorShape(p + "ffn_gate_inp.weight", (e, n), keep_f32=True), vec(p + "exp_probs_b.bias", n)]
    if moe.latent_size:
        out += [mat(p + "ffn_latent_down.weight", e, width), mat(p + "ffn_latent_up.weight", width, e)]
    out += [mat(p + "ffn_down_exps.weight", ff, width, n), mat(p + "ffn_up_exps.weight", width, ff, n)]
    if moe.n_shared_expert:
        sff = moe.shared_ff
        out += [mat(p + "ffn_down_shexp.weight", sff, e), mat(p + "ffn_up_shexp.weight", e, sff)]
    return out


BLOCKS: dict[str, Callable[[Architecture, int], list[TensorShape]]] = {
    "granitehybrid": _granite_hybrid_block,
    "kimi-linear": _kimi_linear_block,
    "lfm2": _lfm2_block,
    "nemotron_h": _nemotron_h_block,
    "nemotron_h_moe": _nemotron_h_moe_block,
    "qwen3next": _delta_net_block,
    "qwen35": _delta_net_block,
    "qwen35moe": _delta_net_block,
}
