"""The tensors llama.cpp expects for an architecture: names and shapes, as a converted GGUF holds them.

Used when there is no file to read (a catalog model or a config.json): the weights are then summed
tensor by tensor after applying a quantization preset's rules (app.core.model.quant), and the proof
harness writes these very tensors into sparse GGUF files that llama.cpp loads.

This module holds the dispatch and the plain transformer block; the blocks of hybrid (recurrent)
families are in :mod:`app.core.model.layout_hybrid`, those of Gemma 3n/4 and the sparse-attention
families in :mod:`app.core.model.layout_recent`; the pieces they share in
:mod:`app.core.model.layout_parts`.
"""

from __future__ import annotations

from collections.abc import Callable

from app.core.common.errors import EstimateError
from app.core.model import layout_hybrid, layout_recent
from app.core.model.architecture import Architecture
from app.core.model.layout_parts import TensorShape, attention, ffn, mamba_mixer, mat, mla_attention, nextn_head, vec

__all__ = ["SUPPORTED_ARCHS", "TensorShape", "tensor_layout"]

Block = Callable[[Architecture, int], list[TensorShape]]

# Architectures whose blocks are one of the families in layout_hybrid / layout_recent.
_FAMILY_BLOCKS: dict[str, Block] = {**layout_hybrid.BLOCKS, **layout_recent.BLOCKS}

SUPPORTED_ARCHS: tuple[str, ...] = (
    "llama",
    "qwen2",
    "qwen3",
    "qwen3moe",
    "gemma2",
    "gemma3",
    "phi3",
    "deepseek2",
    "mistral4",
    "gpt-oss",
    "mamba",
    "mistral3",
    "seed_oss",
    "minimax-m2",
    "ernie4_5-moe",
    "glm4moe",
    "llama4",
    "smollm3",
    "apertus",
    *_FAMILY_BLOCKS,
)

# Architectures that normalise the FFN input with post_attention_norm and have no ffn_norm.
_POST_ATTENTION_NORM_ONLY = ("gpt-oss", "seed_oss", "glm4moe")

# Per-model tensors outside the blocks, before them (after token_embd) and after the output norm.
_PREFIX: dict[str, Callable[[Architecture], list[TensorShape]]] = layout_recent.PREFIX


def tensor_layout(arch: Architecture) -> list[TensorShape]:
    """Every tensor of ``arch`` in file order. Raises EstimateError for an unknown architecture."""
    if arch.arch not in SUPPORTED_ARCHS:
        raise EstimateError(
            f"FitScope cannot lay out the tensors of a '{arch.arch}' model without its file; "
            f"open its GGUF instead (catalog architectures: {', '.join(SUPPORTED_ARCHS)})."
        )
    e = arch.n_embd
    tensors: list[TensorShape] = [mat("token_embd.weight", e, arch.n_vocab)]
    prefix = _PREFIX.get(arch.arch)
    if prefix is not None:
        tensors += prefix(arch)
    block = _FAMILY_BLOCKS.get(arch.arch, _block)
    for layer in range(arch.n_layer):
        tensors += block(arch, layer)
    # LFM2 names its final norm token_embd_norm (LLM_TENSOR_OUTPUT_NORM_LFM2).
    tensors.append(vec("token_embd_norm.weight" if arch.arch == "lfm2" else "output_norm.weight", e))
    if not arch.tied_embeddings:
        tensors.append(mat("output.weight", e, arch.n_vocab))
    return tensors


def _block(arch: Architecture, i: int) -> list[TensorShape]:
    p = f"blk.{i}."
    e = arch.n_embd
    out: list[TensorShape] = [vec(p + "attn_norm.weight", e)]
    if arch.ssm is not None and arch.is_recurrent_layer(i):
        return out + mamba_mixer(arch, p)
    if arch.mla is not None:
        out += mla_attention(arch, p)
    else:
        out += attention(arch, i, p)
    if arch.arch in ("gemma2", "gemma3") or arch.arch in _POST_ATTENTION_NORM_ONLY:
        out.append(vec(p + "post_attention_norm.weight", e))
    if arch.arch not in _POST_ATTENTION_NORM_ONLY:
        out.append(vec(p + "ffn_norm.weight", e))
    out += ffn(arch, i, p)
    if arch.is_nextn_layer(i):
        # GLM-4.5's multi-token-prediction head (src/models/glm4-moe.cpp load_arch_tensors).
        out += nextn_head(arch, p)
    if arch.arch in ("gemma2", "gemma3"):
        out.append(vec(p + "post_ffw_norm.weight", e))
    return out
