"""The tensors llama.cpp expects for an architecture: names and shapes, as a converted GGUF holds them.

Used when there is no file to read (a catalog model or a config.json): the weights are then summed
tensor by tensor after applying a quantization preset's rules (app.core.model.quant), and the proof
harness writes these very tensors into sparse GGUF files that llama.cpp loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.core.common.errors import EstimateError
from app.core.model.architecture import Architecture

SUPPORTED_ARCHS = (
    "llama",
    "qwen2",
    "qwen3",
    "qwen3moe",
    "gemma2",
    "gemma3",
    "phi3",
    "deepseek2",
    "gpt-oss",
    "mamba",
    "mistral3",
    "seed_oss",
    "minimax-m2",
    "ernie4_5-moe",
    "glm4moe",
    "lfm2",
    "nemotron_h",
    "qwen3next",
    "llama4",
)

# Architectures whose routed experts carry a selection bias (``exp_probs_b``): llama.cpp requires it
# for MiniMax-M2 (src/models/minimax-m2.cpp load_arch_tensors); ERNIE 4.5's converter writes it
# from ``e_score_correction_bias``.
_EXPERT_BIAS = ("minimax-m2", "ernie4_5-moe", "glm4moe")

# Architectures that normalise the FFN input with post_attention_norm and have no ffn_norm.
_POST_ATTENTION_NORM_ONLY = ("gpt-oss", "seed_oss", "glm4moe")


@dataclass(frozen=True, slots=True)
class TensorShape:
    """A tensor before quantization: ``keep_f32`` tensors stay F32 in any converted file."""

    name: str
    shape: tuple[int, ...]
    keep_f32: bool = False


def _vec(name: str, n: int) -> TensorShape:
    return TensorShape(name, (n,), keep_f32=True)


def _mat(name: str, *shape: int) -> TensorShape:
    return TensorShape(name, tuple(shape))


def tensor_layout(arch: Architecture) -> list[TensorShape]:
    """Every tensor of ``arch`` in file order. Raises EstimateError for an unknown architecture."""
    if arch.arch not in SUPPORTED_ARCHS:
        raise EstimateError(
            f"FitScope cannot lay out the tensors of a '{arch.arch}' model without its file; "
            f"open its GGUF instead (catalog architectures: {', '.join(SUPPORTED_ARCHS)})."
        )
    e = arch.n_embd
    tensors: list[TensorShape] = [_mat("token_embd.weight", e, arch.n_vocab)]
    for layer in range(arch.n_layer):
        if arch.arch == "lfm2":
            tensors += _lfm2_block(arch, layer)
        elif arch.arch == "nemotron_h":
            tensors += _nemotron_h_block(arch, layer)
        elif arch.arch == "qwen3next":
            tensors += _qwen3next_block(arch, layer)
        else:
            tensors += _block(arch, layer)
    # LFM2 names its final norm token_embd_norm (LLM_TENSOR_OUTPUT_NORM_LFM2).
    tensors.append(_vec("token_embd_norm.weight" if arch.arch == "lfm2" else "output_norm.weight", e))
    if not arch.tied_embeddings:
        tensors.append(_mat("output.weight", e, arch.n_vocab))
    return tensors


def _block(arch: Architecture, i: int) -> list[TensorShape]:
    p = f"blk.{i}."
    e = arch.n_embd
    out: list[TensorShape] = [_vec(p + "attn_norm.weight", e)]
    if arch.ssm is not None and arch.is_recurrent_layer(i):
        return out + _mamba_mixer(arch, p)
    if arch.mla is not None:
        out += _mla_attention(arch, p)
    else:
        out += _attention(arch, i, p)
    if arch.arch in ("gemma2", "gemma3") or arch.arch in _POST_ATTENTION_NORM_ONLY:
        out.append(_vec(p + "post_attention_norm.weight", e))
    if arch.arch not in _POST_ATTENTION_NORM_ONLY:
        out.append(_vec(p + "ffn_norm.weight", e))
    out += _ffn(arch, i, p)
    if arch.is_nextn_layer(i):
        # GLM-4.5's multi-token-prediction head (src/models/glm4-moe.cpp load_arch_tensors).
        out += [
            _mat(p + "nextn.eh_proj.weight", 2 * e, e),
            _vec(p + "nextn.enorm.weight", e),
            _vec(p + "nextn.hnorm.weight", e),
            _vec(p + "nextn.shared_head_norm.weight", e),
        ]
    if arch.arch in ("gemma2", "gemma3"):
        out.append(_vec(p + "post_ffw_norm.weight", e))
    return out


def _lfm2_block(arch: Architecture, i: int) -> list[TensorShape]:
    """LFM2: every layer has a dense FFN; attention layers (n_head_kv > 0) have per-head q/k norms and
    a Q as wide as the embedding; the others a short convolution (src/models/lfm2.cpp)."""
    p = f"blk.{i}."
    e = arch.n_embd
    out = [_vec(p + "ffn_norm.weight", e), *_ffn(arch, i, p), _vec(p + "attn_norm.weight", e)]
    if arch.is_recurrent_layer(i):
        assert arch.conv_l_cache is not None
        return out + [
            TensorShape(p + "shortconv.conv.weight", (arch.conv_l_cache, e), keep_f32=True),
            _mat(p + "shortconv.in_proj.weight", e, 3 * e),
            _mat(p + "shortconv.out_proj.weight", e, e),
        ]
    d = arch.head_dim_k_eff
    return out + [
        _vec(p + "attn_q_norm.weight", d),
        _vec(p + "attn_k_norm.weight", d),
        _mat(p + "attn_q.weight", e, e),
        _mat(p + "attn_k.weight", e, arch.kv_heads(i) * d),
        _mat(p + "attn_v.weight", e, arch.kv_heads(i) * arch.head_dim_v_eff),
        _mat(p + "attn_output.weight", e, e),
    ]


def _nemotron_h_block(arch: Architecture, i: int) -> list[TensorShape]:
    """Nemotron-H: each block is one of a Mamba-2 mixer, attention (no RoPE) or a ReLU-squared MLP
    with up and down projections only (src/models/nemotron-h.cpp load_arch_tensors)."""
    p = f"blk.{i}."
    e = arch.n_embd
    out = [_vec(p + "attn_norm.weight", e)]
    if arch.ffn_only_layers is not None and i in arch.ffn_only_layers:
        ff = arch.ff(i)
        return out + [_mat(p + "ffn_down.weight", ff, e), _mat(p + "ffn_up.weight", e, ff)]
    if arch.is_recurrent_layer(i):
        return out + _mamba2_mixer(arch, p)
    return out + _attention(arch, i, p)


def _qwen3next_block(arch: Architecture, i: int) -> list[TensorShape]:
    """Qwen3-Next: gated DeltaNet (linear attention) layers and gated full-attention layers (Q and its
    output gate in one projection), every layer a mixture of experts with a gated shared expert, and
    a trailing NextN layer (src/models/qwen3next.cpp load_arch_tensors)."""
    p = f"blk.{i}."
    e = arch.n_embd
    out = [_vec(p + "attn_norm.weight", e)]
    if arch.is_recurrent_layer(i):
        ssm = arch.ssm
        assert ssm is not None
        key_dim = ssm.d_state * ssm.n_group
        value_dim = ssm.d_state * ssm.n_head
        conv_dim = 2 * key_dim + value_dim
        out += [
            _mat(p + "attn_qkv.weight", e, conv_dim),
            _mat(p + "attn_gate.weight", e, value_dim),
            TensorShape(p + "ssm_conv1d.weight", (ssm.d_conv, conv_dim), keep_f32=True),
            _vec(p + "ssm_dt.bias", ssm.n_head),
            _vec(p + "ssm_a", ssm.n_head),
            _mat(p + "ssm_ba.weight", e, 2 * ssm.n_head),
            _vec(p + "ssm_norm.weight", ssm.d_state),
            _mat(p + "ssm_out.weight", value_dim, e),
        ]
    else:
        d = arch.head_dim_k_eff
        n_q = arch.heads(i) * d
        out += [
            _mat(p + "attn_q.weight", e, 2 * n_q),
            _mat(p + "attn_k.weight", e, arch.kv_heads(i) * d),
            _mat(p + "attn_v.weight", e, arch.kv_heads(i) * arch.head_dim_v_eff),
            _mat(p + "attn_output.weight", n_q, e),
            _vec(p + "attn_q_norm.weight", d),
            _vec(p + "attn_k_norm.weight", d),
        ]
    out.append(_vec(p + "post_attention_norm.weight", e))
    out += _ffn(arch, i, p)
    out.append(_vec(p + "ffn_gate_inp_shexp.weight", e))
    if arch.is_nextn_layer(i):
        out += [
            _mat(p + "nextn.eh_proj.weight", 2 * e, e),
            _vec(p + "nextn.enorm.weight", e),
            _vec(p + "nextn.hnorm.weight", e),
            _vec(p + "nextn.shared_head_norm.weight", e),
        ]
    return out


def _mamba2_mixer(arch: Architecture, p: str) -> list[TensorShape]:
    ssm = arch.ssm
    assert ssm is not None
    e, d_inner, n_head = arch.n_embd, ssm.d_inner, ssm.n_head
    xbc = d_inner + 2 * ssm.n_group * ssm.d_state
    return [
        _mat(p + "ssm_in.weight", e, 2 * d_inner + 2 * ssm.n_group * ssm.d_state + n_head),
        TensorShape(p + "ssm_conv1d.weight", (ssm.d_conv, xbc), keep_f32=True),
        _vec(p + "ssm_conv1d.bias", xbc),
        _vec(p + "ssm_dt.bias", n_head),
        TensorShape(p + "ssm_a", (1, n_head), keep_f32=True),
        TensorShape(p + "ssm_d", (1, n_head), keep_f32=True),
        TensorShape(p + "ssm_norm.weight", (d_inner // ssm.n_group, ssm.n_group), keep_f32=True),
        _mat(p + "ssm_out.weight", d_inner, e),
    ]


def _attention(arch: Architecture, i: int, p: str) -> list[TensorShape]:
    e = arch.n_embd
    n_q = arch.heads(i) * arch.head_dim_k_eff
    n_k = arch.kv_heads(i) * arch.head_dim_k_eff
    n_v = arch.kv_heads(i) * arch.head_dim_v_eff
    if arch.arch == "phi3":
        out = [_mat(p + "attn_qkv.weight", e, n_q + n_k + n_v)]
    else:
        out = [
            _mat(p + "attn_q.weight", e, n_q),
            _mat(p + "attn_k.weight", e, n_k),
            _mat(p + "attn_v.weight", e, n_v),
        ]
    if arch.attn_bias:
        out += [_vec(p + "attn_q.bias", n_q), _vec(p + "attn_k.bias", n_k), _vec(p + "attn_v.bias", n_v)]
    if arch.qk_norm and arch.arch == "minimax-m2":
        # One norm over the whole Q and K projections, not per head (src/models/minimax-m2.cpp).
        out += [_vec(p + "attn_q_norm.weight", n_q), _vec(p + "attn_k_norm.weight", n_k)]
    elif arch.qk_norm:
        out += [
            _vec(p + "attn_q_norm.weight", arch.head_dim_k_eff),
            _vec(p + "attn_k_norm.weight", arch.head_dim_k_eff),
        ]
    out.append(_mat(p + "attn_output.weight", arch.heads(i) * arch.head_dim_v_eff, e))
    if arch.arch == "gpt-oss":
        out += [_vec(p + "attn_output.bias", e), _vec(p + "attn_sinks.weight", arch.heads(i))]
    return out


def _mla_attention(arch: Architecture, p: str) -> list[TensorShape]:
    """DeepSeek-V2/V3 attention as current converters write it (attn_k_b / attn_v_b split)."""
    mla = arch.mla
    assert mla is not None
    e = arch.n_embd
    n_head = arch.max_heads()
    k_head = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    out: list[TensorShape] = []
    if mla.q_lora_rank > 0:
        out += [
            _vec(p + "attn_q_a_norm.weight", mla.q_lora_rank),
            _mat(p + "attn_q_a.weight", e, mla.q_lora_rank),
            _mat(p + "attn_q_b.weight", mla.q_lora_rank, n_head * k_head),
        ]
    else:
        out.append(_mat(p + "attn_q.weight", e, n_head * k_head))
    out += [
        _vec(p + "attn_kv_a_norm.weight", mla.kv_lora_rank),
        _mat(p + "attn_kv_a_mqa.weight", e, mla.kv_lora_rank + mla.qk_rope_head_dim),
        _mat(p + "attn_k_b.weight", mla.qk_nope_head_dim, mla.kv_lora_rank, n_head),
        _mat(p + "attn_v_b.weight", mla.kv_lora_rank, mla.v_head_dim, n_head),
        _mat(p + "attn_output.weight", n_head * mla.v_head_dim, e),
    ]
    return out


def _ffn(arch: Architecture, i: int, p: str) -> list[TensorShape]:
    e = arch.n_embd
    if not arch.is_moe_layer(i):
        ff = arch.ff(i)
        if arch.arch == "phi3":
            return [_mat(p + "ffn_up.weight", e, 2 * ff), _mat(p + "ffn_down.weight", ff, e)]
        return [
            _mat(p + "ffn_gate.weight", e, ff),
            _mat(p + "ffn_down.weight", ff, e),
            _mat(p + "ffn_up.weight", e, ff),
        ]
    moe = arch.moe
    assert moe is not None
    n, ff = moe.n_expert, moe.expert_ff
    out = [
        TensorShape(p + "ffn_gate_inp.weight", (e, n), keep_f32=True),
        _mat(p + "ffn_gate_exps.weight", e, ff, n),
        _mat(p + "ffn_down_exps.weight", ff, e, n),
        _mat(p + "ffn_up_exps.weight", e, ff, n),
    ]
    if arch.arch == "gpt-oss":
        out += [
            _vec(p + "ffn_gate_inp.bias", n),
            TensorShape(p + "ffn_gate_exps.bias", (ff, n), keep_f32=True),
            TensorShape(p + "ffn_down_exps.bias", (e, n), keep_f32=True),
            TensorShape(p + "ffn_up_exps.bias", (ff, n), keep_f32=True),
        ]
    if arch.arch in _EXPERT_BIAS:
        out.append(_vec(p + "exp_probs_b.bias", n))
    if moe.n_shared_expert:
        sff = moe.shared_ff
        out += [
            _mat(p + "ffn_gate_shexp.weight", e, sff),
            _mat(p + "ffn_down_shexp.weight", sff, e),
            _mat(p + "ffn_up_shexp.weight", e, sff),
        ]
    return out


def _mamba_mixer(arch: Architecture, p: str) -> list[TensorShape]:
    ssm = arch.ssm
    assert ssm is not None
    e, d_inner, d_state, dt_rank = arch.n_embd, ssm.d_inner, ssm.d_state, ssm.dt_rank
    return [
        _mat(p + "ssm_in.weight", e, 2 * d_inner),
        TensorShape(p + "ssm_conv1d.weight", (ssm.d_conv, d_inner), keep_f32=True),
        _vec(p + "ssm_conv1d.bias", d_inner),
        _mat(p + "ssm_x.weight", d_inner, dt_rank + 2 * d_state),
        _mat(p + "ssm_dt.weight", dt_rank, d_inner),
        _vec(p + "ssm_dt.bias", d_inner),
        TensorShape(p + "ssm_a", (d_state, d_inner), keep_f32=True),
        _vec(p + "ssm_d", d_inner),
        _mat(p + "ssm_out.weight", d_inner, e),
    ]
