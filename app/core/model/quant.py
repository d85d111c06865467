"""Quantization presets and the per-tensor type rules llama.cpp's quantizer applies.

A preset such as Q4_K_M is a mixture: most weights get the preset's base type, but attention-V and
FFN-down tensors of some layers, the output layer and tensors whose row width does not fit a
256-wide block get other types. ``quantize_layout`` reproduces llama-quant's choice tensor by
tensor (llama.cpp as vendored by llama-cpp-python 0.3.36), so a catalog model's weights are the sum
of real tensor sizes rather than parameters × an average bits-per-weight.

GPU serving formats (FP16, FP8, INT8, AWQ/GPTQ 4-bit) are described by ``SERVING_FORMATS`` for
comparisons with vLLM-style stacks.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.core.common.errors import EstimateError
from app.core.model.architecture import Architecture
from app.core.model.layout import TensorShape, tensor_layout
from app.core.model.tensors import BLOCK, GGMLType, TensorInfo

T = GGMLType


@dataclass(frozen=True)
class QuantPreset:
    """One llama.cpp file type (llama_ftype). ``ppl_increase`` is llama-quantize's published
    perplexity increase on Llama-3-8B (None where llama.cpp publishes none)."""

    name: str
    ftype: int
    base_type: GGMLType
    ppl_increase: float | None
    description: str
    uses_imatrix: bool = False


PRESETS: tuple[QuantPreset, ...] = (
    QuantPreset("F32", 0, T.F32, None, "32-bit floats: the unquantized reference"),
    QuantPreset("BF16", 32, T.BF16, -0.0050, "bfloat16, as most models are published (ppl on Mistral-7B)"),
    QuantPreset("F16", 1, T.F16, 0.0020, "16-bit floats (ppl on Mistral-7B)"),
    QuantPreset("Q8_0", 7, T.Q8_0, 0.0026, "8.5 bits per weight, practically lossless"),
    QuantPreset("Q6_K", 18, T.Q6_K, 0.0217, "6.56 bpw k-quant"),
    QuantPreset("Q5_K_M", 17, T.Q5_K, 0.0569, "5-bit k-quant, attention-V and FFN-down of key layers at Q6_K"),
    QuantPreset("Q5_K_S", 16, T.Q5_K, 0.1049, "5-bit k-quant, uniform"),
    QuantPreset("Q5_1", 9, T.Q5_1, 0.1062, "legacy 5-bit with offset"),
    QuantPreset("Q5_0", 8, T.Q5_0, 0.1316, "legacy 5-bit"),
    QuantPreset("Q4_K_M", 15, T.Q4_K, 0.1754, "4-bit k-quant, attention-V and FFN-down of key layers at Q6_K"),
    QuantPreset("Q4_K_S", 14, T.Q4_K, 0.2689, "4-bit k-quant, mostly uniform"),
    QuantPreset("IQ4_NL", 25, T.IQ4_NL, None, "4.5 bpw non-linear", uses_imatrix=True),
    QuantPreset("IQ4_XS", 30, T.IQ4_XS, None, "4.25 bpw non-linear", uses_imatrix=True),
    QuantPreset("Q4_1", 3, T.Q4_1, 0.4511, "legacy 4-bit with offset"),
    QuantPreset("Q4_0", 2, T.Q4_0, 0.4685, "legacy 4-bit (fast on CPUs through repacking)"),
    QuantPreset("Q3_K_L", 13, T.Q3_K, 0.5562, "3-bit k-quant, attention-V/FFN-down/output at Q5_K"),
    QuantPreset("Q3_K_M", 12, T.Q3_K, 0.6569, "3-bit k-quant, key tensors at Q4_K/Q5_K"),
    QuantPreset("IQ3_M", 27, T.IQ3_S, None, "3.66 bpw mix", uses_imatrix=True),
    QuantPreset("IQ3_S", 26, T.IQ3_S, None, "3.44 bpw", uses_imatrix=True),
    QuantPreset("Q3_K_S", 11, T.Q3_K, 1.6321, "3-bit k-quant, uniform"),
    QuantPreset("IQ3_XS", 22, T.IQ3_S, None, "3.3 bpw", uses_imatrix=True),
    QuantPreset("IQ3_XXS", 23, T.IQ3_XXS, None, "3.06 bpw", uses_imatrix=True),
    QuantPreset("Q2_K", 10, T.Q2_K, 3.5199, "2-bit k-quant: large quality loss"),
    QuantPreset("Q2_K_S", 21, T.Q2_K, 3.1836, "2-bit k-quant, small"),
    QuantPreset("IQ2_M", 29, T.IQ2_S, None, "2.7 bpw", uses_imatrix=True),
    QuantPreset("IQ2_S", 28, T.IQ2_XS, None, "2.5 bpw", uses_imatrix=True),
    QuantPreset("IQ2_XS", 20, T.IQ2_XS, None, "2.31 bpw", uses_imatrix=True),
    QuantPreset("IQ2_XXS", 19, T.IQ2_XXS, None, "2.06 bpw", uses_imatrix=True),
    QuantPreset("IQ1_M", 31, T.IQ1_M, None, "1.75 bpw: for experiments", uses_imatrix=True),
    QuantPreset("IQ1_S", 24, T.IQ1_S, None, "1.56 bpw: for experiments", uses_imatrix=True),
    QuantPreset("MXFP4_MOE", 38, T.MXFP4, None, "experts in MXFP4, the rest Q8_0 (gpt-oss style)"),
)

def quality_words(ppl_increase: float | None) -> str:
    """The published perplexity increase (on Mistral-7B, llama.cpp's quantize table) in words a
    person can weigh: Q8_0/Q6_K practically the same, the 5- and 4-bit k-quants slightly worse,
    legacy 4-bit and 3-bit noticeably worse, below that much worse."""
    if ppl_increase is None:
        return "quality loss not published"
    if ppl_increase <= 0.03:
        return "practically the same quality"
    if ppl_increase <= 0.2:
        return "slightly worse quality"
    if ppl_increase <= 0.7:
        return "noticeably worse quality"
    return "much worse quality"


_BY_NAME = {p.name: p for p in PRESETS}
_BY_FTYPE = {p.ftype: p for p in PRESETS}


def find_preset(name: str) -> QuantPreset:
    """The preset called ``name`` (case-insensitive). Raises EstimateError listing the valid ones."""
    preset = _BY_NAME.get(name.strip().upper())
    if preset is None:
        raise EstimateError(f"Unknown quantization '{name}'. Choose one of: {', '.join(_BY_NAME)}.")
    return preset


def preset_for_ftype(ftype: int | None) -> QuantPreset | None:
    """The preset a GGUF's general.file_type names, or None when unknown."""
    return _BY_FTYPE.get(ftype) if ftype is not None else None


# -- llama-quant's rules ------------------------------------------------------------------------

_IQ12 = {"IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"}


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name == "token_embd.weight":
        return "token_embd"
    for key, cat in (
        ("attn_qkv.weight", "attn_qkv"),
        ("attn_kv_b.weight", "attn_kv_b"),
        ("attn_v.weight", "attn_v"),
        ("attn_k.weight", "attn_k"),
        ("attn_q.weight", "attn_q"),
        ("attn_output.weight", "attn_output"),
        ("ffn_up", "ffn_up"),
        ("ffn_gate", "ffn_gate"),
        ("ffn_down", "ffn_down"),
    ):
        if key in name:
            return cat
    return "other"


def _quantizable(t: TensorShape) -> bool:
    name = t.name
    if len(t.shape) < 2 or not name.endswith("weight") or t.keep_f32:
        return False
    excluded = ("_norm.weight", "ffn_gate_inp.weight", "ssm_conv1d", "attn_rel_b.weight")
    return not any(x in name for x in excluded)


def _fallback(target: GGMLType, ncols: int) -> GGMLType:
    block = BLOCK[target][0]
    if ncols % block == 0:
        return target
    fallback = {
        T.IQ1_S: T.IQ4_NL,
        T.IQ1_M: T.IQ4_NL,
        T.IQ2_XXS: T.IQ4_NL,
        T.IQ2_XS: T.IQ4_NL,
        T.IQ2_S: T.IQ4_NL,
        T.IQ3_XXS: T.IQ4_NL,
        T.IQ3_S: T.IQ4_NL,
        T.IQ4_XS: T.IQ4_NL,
        T.Q2_K: T.Q4_0,
        T.Q3_K: T.Q4_0,
        T.TQ1_0: T.Q4_0,
        T.TQ2_0: T.Q4_0,
        T.Q4_K: T.Q5_0,
        T.Q5_K: T.Q5_1,
        T.Q6_K: T.Q8_0,
    }.get(target, target)
    if ncols % BLOCK[fallback][0]:
        return T.F16
    return fallback


class _State:
    def __init__(self, arch: Architecture, layout: list[TensorShape]):
        self.n_attention_wv = sum(_category(t.name) in ("attn_v", "attn_qkv", "attn_kv_b") for t in layout)
        self.tied = not any(t.name == "output.weight" for t in layout)
        self.i_attention_wv = 0
        self.i_ffn_down = 0
        self.n_layer = arch.n_layer
        self.n_expert = arch.moe.n_expert if arch.moe else 0
        heads_kv = next((arch.kv_heads(i) for i in range(arch.n_layer) if arch.kv_heads(i)), 0)
        self.n_gqa = arch.heads(0) // heads_kv if heads_kv else 0
        # llama.cpp's LLM_TYPE_70B: Llama with 80 layers.
        self.is_70b = arch.arch == "llama" and arch.n_layer == 80


def _choose(st: _State, p: QuantPreset, t: TensorShape, arch: Architecture, imatrix: bool) -> GGMLType:
    ft = p.name
    new = p.base_type
    cat = _category(t.name)
    nx = t.shape[0]
    layer = int(t.name.split(".")[1]) if t.name.startswith("blk.") else 0

    if cat == "output" or (st.tied and cat == "token_embd"):
        if ft == "MXFP4_MOE" or nx % BLOCK[new][0]:
            return T.Q8_0
        if ft in _IQ12:
            return T.Q5_K
        return new if new == T.Q8_0 else T.Q6_K
    if ft == "MXFP4_MOE":
        return T.MXFP4 if len(t.shape) > 2 and t.shape[2] > 1 else T.Q8_0
    if cat == "token_embd":
        if ft in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
            return T.Q2_K
        if ft in ("IQ2_S", "IQ2_M", "IQ3_XXS"):
            return T.IQ3_S
        return new
    if ft in _IQ12:
        if cat in ("attn_v", "attn_qkv", "attn_kv_b"):
            st.i_attention_wv += 1
            if st.n_gqa >= 4 or st.n_expert >= 4:
                return T.Q4_K
            return T.IQ3_S if ft in ("IQ2_S", "IQ2_M") else T.Q2_K
        if st.n_expert == 8 and cat == "attn_k":
            return T.Q4_K
        if cat == "ffn_down":
            if st.i_ffn_down < st.n_layer // 8:
                new = T.IQ3_S if ft in ("IQ2_S", "IQ2_M") else T.Q2_K
            st.i_ffn_down += 1
            return new
        if cat == "attn_output":
            if st.n_expert == 8:
                return T.Q5_K
            if ft in ("IQ1_S", "IQ1_M"):
                return T.IQ2_XXS
            if ft in ("IQ2_S", "IQ2_M"):
                return T.IQ3_S
        return new
    if cat in ("attn_v", "attn_qkv", "attn_kv_b"):
        i = st.i_attention_wv
        if ft == "Q2_K":
            new = T.Q4_K if st.n_gqa >= 4 else T.Q3_K
        elif ft == "Q2_K_S" and st.n_gqa >= 4:
            new = T.Q4_K
        elif ft == "IQ3_XXS":
            new = T.Q4_K if st.n_gqa >= 4 else (T.IQ3_XXS if imatrix else T.IQ3_S)
        elif ft in ("IQ3_XS", "IQ3_S") and st.n_gqa >= 4 or ft == "IQ3_M":
            new = T.Q4_K
        elif ft == "Q3_K_M":
            new = T.Q5_K if i < 2 else T.Q4_K
        elif ft == "Q3_K_L" or ft in ("IQ4_NL", "IQ4_XS") and st.n_gqa >= 4:
            new = T.Q5_K
        elif ft in ("Q4_K_M", "Q5_K_M") and _use_more_bits(i, st.n_attention_wv):
            new = T.Q6_K
        elif ft == "Q4_K_S" and i < 4:
            new = T.Q5_K
        if st.is_70b and new in (T.Q3_K, T.Q4_K):
            new = T.Q5_K
        if st.n_expert == 8:
            new = T.Q8_0
        st.i_attention_wv += 1
        # The fused QKV and KV_B tensors then take the branch below in llama.cpp only when they
        # are not attention-V; keep that order: attn_v rules win.
        return new
    if cat == "attn_k":
        if st.n_expert == 8:
            return T.Q8_0
        if ft == "IQ3_XS":
            return T.IQ3_XXS
        if ft == "IQ3_XXS":
            return T.IQ2_S
        return new
    if cat == "attn_q":
        if ft == "IQ3_XS":
            return T.IQ3_XXS
        if ft == "IQ3_XXS":
            return T.IQ2_S
        return new
    if cat == "ffn_down":
        i_layer = layer if st.n_expert > 1 else st.i_ffn_down
        n = st.n_layer
        if ft == "Q2_K":
            new = T.Q3_K
        elif ft == "Q2_K_S":
            if i_layer < n // 8:
                new = T.Q4_K
        elif ft == "IQ3_XXS" and not imatrix:
            new = T.Q4_K if i_layer < n // 8 else T.Q3_K
        elif ft == "Q3_K_M":
            new = T.Q5_K if i_layer < n // 16 else T.Q4_K
        elif ft == "IQ3_M" and (i_layer < n // 8 or (st.n_expert == 8 and _use_more_bits(i_layer, n))):
            new = T.Q4_K
        elif ft == "Q3_K_L":
            new = T.Q5_K
        elif ft == "Q4_K_M":
            if _use_more_bits(i_layer, n):
                new = T.Q6_K
        elif i_layer < n // 8 and ft in ("IQ4_NL", "IQ4_XS") and not imatrix:
            new = T.Q5_K
        elif ft == "Q5_K_M" and _use_more_bits(i_layer, n):
            new = T.Q6_K
        elif ft == "Q4_K_S" and i_layer < n // 8:
            new = T.Q5_K
        elif ft in ("Q4_0", "Q5_0") and imatrix and i_layer < n // 8:
            new = T.Q4_1 if ft == "Q4_0" else T.Q5_1
        st.i_ffn_down += 1
        return new
    if cat == "attn_output":
        if st.n_expert == 8:
            if ft in (
                "Q2_K",
                "IQ3_XS",
                "IQ3_XXS",
                "Q3_K_S",
                "Q3_K_M",
                "IQ4_NL",
                "Q4_K_S",
                "Q4_K_M",
                "IQ3_S",
                "IQ3_M",
                "IQ4_XS",
            ):
                return T.Q5_K
            return new
        return {"Q2_K": T.Q3_K, "IQ3_XXS": T.IQ3_S, "Q3_K_M": T.Q4_K, "Q3_K_L": T.Q5_K, "IQ3_M": T.Q4_K}.get(ft, new)
    if cat in ("ffn_gate", "ffn_up"):
        i_layer = layer
        n = st.n_layer
        if ft == "IQ3_XS" and n // 8 <= i_layer < 7 * n // 8:
            return T.IQ3_XXS
        return new
    return new


def quantize_layout(
    arch: Architecture, preset: QuantPreset | str, layout: list[TensorShape] | None = None
) -> list[TensorInfo]:
    """The tensors of ``arch`` with the types llama-quantize gives them under ``preset``.

    Raises EstimateError for an unknown preset or an architecture whose layout is unknown.
    """
    p = find_preset(preset) if isinstance(preset, str) else preset
    tensors = layout if layout is not None else tensor_layout(arch)
    st = _State(arch, tensors)
    imatrix = p.uses_imatrix
    out: list[TensorInfo] = []
    for t in tensors:
        if not _quantizable(t):
            ggml_type = T.F32 if (t.keep_f32 or len(t.shape) < 2) else T.F16
        elif p.base_type in (T.F32, T.F16, T.BF16):
            ggml_type = p.base_type
        elif arch.native_expert_type == "MXFP4" and len(t.shape) > 2 and t.shape[2] > 1:
            # Released in MXFP4 (gpt-oss): the published K-quant files keep the experts as they are
            # (e.g. a Q4_K_M gpt-oss-20b is an 11.6 GB file, not the 14+ GB a fresh Q4_K_M would be).
            ggml_type = T.MXFP4
        else:
            ggml_type = _fallback(_choose(st, p, t, arch, imatrix), t.shape[0])
        out.append(TensorInfo(t.name, ggml_type, t.shape))
    return out


# -- GPU serving formats (vLLM, TGI, TensorRT-LLM) ----------------------------------------------


@dataclass(frozen=True)
class ServingFormat:
    """Weight storage of GPU serving stacks. Linear layers take ``linear_bits`` per weight plus
    ``group_overhead_bits`` (scales and zero points shared by a group of weights); embeddings and
    the output head stay 16-bit, as those stacks leave them."""

    name: str
    linear_bits: float
    group_overhead_bits: float
    description: str

    @property
    def bits_per_weight(self) -> float:
        return self.linear_bits + self.group_overhead_bits


SERVING_FORMATS: tuple[ServingFormat, ...] = (
    ServingFormat("FP16", 16, 0.0, "16-bit weights (BF16/FP16)"),
    ServingFormat("FP8", 8, 32 / 4096, "FP8 E4M3 weights with a per-channel FP32 scale (4096-wide rows)"),
    ServingFormat("INT8", 8, 32 / 4096, "INT8 weight-only, per-channel FP32 scale"),
    ServingFormat("AWQ-4bit", 4, (16 + 4) / 128, "AWQ 4-bit, group 128: FP16 scale + 4-bit zero per group"),
    ServingFormat("GPTQ-4bit", 4, (16 + 4) / 128, "GPTQ 4-bit, group 128: FP16 scale + 4-bit zero per group"),
)


def find_serving_format(name: str) -> ServingFormat:
    for f in SERVING_FORMATS:
        if f.name.lower() == name.strip().lower():
            return f
    raise EstimateError(
        f"Unknown serving format '{name}'. Choose one of: {', '.join(f.name for f in SERVING_FORMATS)}."
    )


def serving_weights_bytes(arch: Architecture, fmt: ServingFormat) -> int:
    """Weight bytes of ``arch`` stored in a GPU serving format (embeddings and head at 16-bit)."""
    total = 0.0
    for t in tensor_layout(arch):
        n = 1
        for d in t.shape:
            n *= d
        if t.name in ("token_embd.weight", "output.weight") or not _quantizable(t):
            bits = 16.0 if len(t.shape) > 1 else 32.0
        else:
            bits = fmt.bits_per_weight
        total += n * bits / 8
    return int(total)
