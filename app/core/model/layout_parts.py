"""Building blocks of tensor layouts: one tensor, an attention block, a feed-forward block (dense or
mixture of experts), multi-head latent attention and the recurrent mixers, each with the names and
shapes llama.cpp's ``load_arch_tensors`` of the vendored source asks for.

:mod:`app.core.model.layout` assembles them per architecture; the families with their own block
structure live in :mod:`app.core.model.layout_hybrid` and :mod:`app.core.model.layout_recent`.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.core.model.architecture import Architecture

# Architectures whose routed experts carry a selection bias (``exp_probs_b``): llama.cpp requires it
# for MiniMax-M2 and M3 (src/models/minimax-m2.cpp, minimax-m3.cpp load_arch_tensors); ERNIE 4.5's
# and GLM's converters write it from ``e_score_correction_bias``.
EXPERT_BIAS = ("minimax-m2", "minimax-m3", "ernie4_5-moe", "glm4moe")

# Architectures whose converter writes the routed experts' gate and up as one stacked tensor
# (``ffn_gate_up_exps``): Mistral 4's checkpoint stores them fused and Mistral4Model keeps them so
# (conversion/mistral3.py, merge_expert = False); llama.cpp takes either (create_tensor_gate_up_exps).
FUSED_GATE_UP = ("mistral4",)


@dataclass(frozen=True, slots=True)
class TensorShape:
    """A tensor before quantization: ``keep_f32`` tensors stay F32 in any converted file."""

    name: str
    shape: tuple[int, ...]
    keep_f32: bool = False


def vec(name: str, n: int) -> TensorShape:
    return TensorShape(name, (n,), keep_f32=True)


def mat(name: str, *shape: int) -> TensorShape:
    return TensorShape(name, tuple(shape))


def attention(arch: Architecture, i: int, p: str) -> list[TensorShape]:
    """q/k/v (or fused qkv for Phi-3), their biases and norms, and the output projection."""
    e = arch.n_embd
    n_q = arch.heads(i) * arch.head_dim_k_eff
    n_k = arch.kv_heads(i) * arch.head_dim_k_eff
    n_v = arch.kv_heads(i) * arch.head_dim_v_eff
    if arch.arch == "phi3":
        out = [mat(p + "attn_qkv.weight", e, n_q + n_k + n_v)]
    else:
        out = [
            mat(p + "attn_q.weight", e, n_q),
            mat(p + "attn_k.weight", e, n_k),
            mat(p + "attn_v.weight", e, n_v),
        ]
    if arch.attn_bias:
        out += [vec(p + "attn_q.bias", n_q), vec(p + "attn_k.bias", n_k), vec(p + "attn_v.bias", n_v)]
    if arch.qk_norm and arch.arch == "minimax-m2":
        # One norm over the whole Q and K projections, not per head (src/models/minimax-m2.cpp).
        out += [vec(p + "attn_q_norm.weight", n_q), vec(p + "attn_k_norm.weight", n_k)]
    elif arch.qk_norm:
        out += [
            vec(p + "attn_q_norm.weight", arch.head_dim_k_eff),
            vec(p + "attn_k_norm.weight", arch.head_dim_k_eff),
        ]
    out.append(mat(p + "attn_output.weight", arch.heads(i) * arch.head_dim_v_eff, e))
    if arch.arch == "gpt-oss":
        out += [vec(p + "attn_output.bias", e), vec(p + "attn_sinks.weight", arch.heads(i))]
    return out


def mla_attention(arch: Architecture, p: str) -> list[TensorShape]:
    """DeepSeek-V2/V3 attention as current converters write it (attn_k_b / attn_v_b split)."""
    mla = arch.mla
    assert mla is not None
    e = arch.n_embd
    n_head = arch.max_heads()
    k_head = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    out: list[TensorShape] = []
    if mla.q_lora_rank > 0:
        out += [
            vec(p + "attn_q_a_norm.weight", mla.q_lora_rank),
            mat(p + "attn_q_a.weight", e, mla.q_lora_rank),
            mat(p + "attn_q_b.weight", mla.q_lora_rank, n_head * k_head),
        ]
    else:
        out.append(mat(p + "attn_q.weight", e, n_head * k_head))
    out += [
        vec(p + "attn_kv_a_norm.weight", mla.kv_lora_rank),
        mat(p + "attn_kv_a_mqa.weight", e, mla.kv_lora_rank + mla.qk_rope_head_dim),
        mat(p + "attn_k_b.weight", mla.qk_nope_head_dim, mla.kv_lora_rank, n_head),
        mat(p + "attn_v_b.weight", mla.kv_lora_rank, mla.v_head_dim, n_head),
        mat(p + "attn_output.weight", n_head * mla.v_head_dim, e),
    ]
    return out


def dense_ffn(arch: Architecture, i: int, p: str, suffix: str = "") -> list[TensorShape]:
    """gate / down / up of width ``arch.ff(i)`` (Phi-3: gate and up fused into ffn_up; Apertus: no gate,
    its xIELU MLP is up then down, src/models/apertus.cpp load_arch_tensors)."""
    e = arch.n_embd
    ff = arch.ff(i)
    if arch.arch == "phi3":
        return [mat(p + "ffn_up.weight", e, 2 * ff), mat(p + "ffn_down.weight", ff, e)]
    if arch.arch == "apertus":
        return [mat(p + f"ffn_down{suffix}.weight", ff, e), mat(p + f"ffn_up{suffix}.weight", e, ff)]
    return [
        mat(p + f"ffn_gate{suffix}.weight", e, ff),
        mat(p + f"ffn_down{suffix}.weight", ff, e),
        mat(p + f"ffn_up{suffix}.weight", e, ff),
    ]


def routed_experts(arch: Architecture, p: str, gate: bool = True) -> list[TensorShape]:
    """The router and the routed experts' stacked gate/down/up (``gate=False``: up and down only)."""
    moe = arch.moe
    assert moe is not None
    e = arch.n_embd
    n, ff = moe.n_expert, moe.expert_ff
    out = [TensorShape(p + "ffn_gate_inp.weight", (e, n), keep_f32=True)]
    if gate and arch.arch in FUSED_GATE_UP:
        return out + [mat(p + "ffn_gate_up_exps.weight", e, 2 * ff, n), mat(p + "ffn_down_exps.weight", ff, e, n)]
    if gate:
        out.append(mat(p + "ffn_gate_exps.weight", e, ff, n))
    out += [mat(p + "ffn_down_exps.weight", ff, e, n), mat(p + "ffn_up_exps.weight", e, ff, n)]
    return out


def ffn(arch: Architecture, i: int, p: str) -> list[TensorShape]:
    """A layer's feed-forward block: dense, or the router, routed and shared experts."""
    e = arch.n_embd
    if not arch.is_moe_layer(i):
        return dense_ffn(arch, i, p)
    moe = arch.moe
    assert moe is not None
    n, ff = moe.n_expert, moe.expert_ff
    out = routed_experts(arch, p)
    if arch.arch == "gpt-oss":
        out += [
            vec(p + "ffn_gate_inp.bias", n),
            TensorShape(p + "ffn_gate_exps.bias", (ff, n), keep_f32=True),
            TensorShape(p + "ffn_down_exps.bias", (e, n), keep_f32=True),
            TensorShape(p + "ffn_up_exps.bias", (ff, n), keep_f32=True),
        ]
    if arch.arch in EXPERT_BIAS or moe.selection_bias:
        out.append(vec(p + "exp_probs_b.bias", n))
    if moe.n_shared_expert:
        sff = moe.shared_ff
        out += [
            mat(p + "ffn_gate_shexp.weight", e, sff),
            mat(p + "ffn_down_shexp.weight", sff, e),
            mat(p + "ffn_up_shexp.weight", e, sff),
        ]
    return out


def nextn_head(arch: Architecture, p: str) -> list[TensorShape]:
    """A multi-token-prediction layer's own tensors (``nextn.*``, e.g. src/models/glm4-moe.cpp)."""
    e = arch.n_embd
    return [
        mat(p + "nextn.eh_proj.weight", 2 * e, e),
        vec(p + "nextn.enorm.weight", e),
        vec(p + "nextn.hnorm.weight", e),
        vec(p + "nextn.shared_head_norm.weight", e),
    ]


def mamba_mixer(arch: Architecture, p: str) -> list[TensorShape]:
    ssm = arch.ssm
    assert ssm is not None
    e, d_inner, d_state, dt_rank = arch.n_embd, ssm.d_inner, ssm.d_state, ssm.dt_rank
    return [
        mat(p + "ssm_in.weight", e, 2 * d_inner),
        TensorShape(p + "ssm_conv1d.weight", (ssm.d_conv, d_inner), keep_f32=True),
        vec(p + "ssm_conv1d.bias", d_inner),
        mat(p + "ssm_x.weight", d_inner, dt_rank + 2 * d_state),
        mat(p + "ssm_dt.weight", dt_rank, d_inner),
        vec(p + "ssm_dt.bias", d_inner),
        TensorShape(p + "ssm_a", (d_state, d_inner), keep_f32=True),
        vec(p + "ssm_d", d_inner),
        mat(p + "ssm_out.weight", d_inner, e),
    ]


def mamba2_mixer(arch: Architecture, p: str) -> list[TensorShape]:
    """A Mamba-2 mixer (Nemotron-H, Granite 4 hybrids: src/models/mamba-base.cpp)."""
    ssm = arch.ssm
    assert ssm is not None
    e, d_inner, n_head = arch.n_embd, ssm.d_inner, ssm.n_head
    xbc = d_inner + 2 * ssm.n_group * ssm.d_state
    return [
        mat(p + "ssm_in.weight", e, 2 * d_inner + 2 * ssm.n_group * ssm.d_state + n_head),
        TensorShape(p + "ssm_conv1d.weight", (ssm.d_conv, xbc), keep_f32=True),
        vec(p + "ssm_conv1d.bias", xbc),
        vec(p + "ssm_dt.bias", n_head),
        TensorShape(p + "ssm_a", (1, n_head), keep_f32=True),
        TensorShape(p + "ssm_d", (1, n_head), keep_f32=True),
        TensorShape(p + "ssm_norm.weight", (d_inner // ssm.n_group, ssm.n_group), keep_f32=True),
        mat(p + "ssm_out.weight", d_inner, e),
    ]
