"""Sparse synthetic GGUF files: a real header (metadata, tensor names, shapes and types) followed
by zeros that take no disk space.

llama.cpp loads such a file exactly like the published model (zero blocks are valid in every
type), so the true allocations of any architecture can be measured without its weights. The
metadata written here mirrors what llama.cpp's converter writes for each architecture.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

from app.core.model.architecture import GEMMA3N_ALTUP, Architecture
from app.core.model.quant import QuantPreset, find_preset, quantize_layout
from app.core.model.tensors import TensorInfo
from tests.support.tiny_gguf import tiny_vocab

ALIGNMENT = 32


def _metadata(arch: Architecture) -> dict[str, object]:
    a = arch.arch
    kv: dict[str, object] = {
        f"{a}.context_length": arch.n_ctx_train,
        f"{a}.embedding_length": arch.n_embd,
        f"{a}.block_count": arch.n_layer,
        f"{a}.vocab_size": arch.n_vocab,
    }
    if arch.ssm is not None and arch.attention_layers is None:
        ssm = arch.ssm
        kv.update(
            {
                f"{a}.feed_forward_length": 0,
                f"{a}.attention.head_count": 0,
                f"{a}.attention.layer_norm_rms_epsilon": 1e-5,
                f"{a}.ssm.conv_kernel": ssm.d_conv,
                f"{a}.ssm.inner_size": ssm.d_inner,
                f"{a}.ssm.state_size": ssm.d_state,
                f"{a}.ssm.time_step_rank": ssm.dt_rank,
            }
        )
        return kv
    kv[f"{a}.feed_forward_length"] = arch.n_ff
    kv[f"{a}.attention.head_count"] = arch.n_head
    kv[f"{a}.attention.head_count_kv"] = arch.n_head_kv
    if a in DELTA_NET:
        # Its converter writes the layout as an interval (every 4th layer is full attention).
        assert arch.attention_layers is not None
        kv[f"{a}.full_attention_interval"] = arch.attention_layers[0] + 1
        kv[f"{a}.rope.dimension_count"] = arch.head_dim_k_eff // 4  # partial_rotary_factor 0.25
        if a != "qwen3next":
            kv[f"{a}.rope.dimension_sections"] = [11, 11, 10, 0]  # mrope_section, as Qwen3.5's converter pads it
        if arch.moe is not None and arch.moe.n_shared_expert:
            kv[f"{a}.expert_shared_feed_forward_length"] = arch.moe.shared_ff
    elif arch.attention_layers is not None:
        # Hybrids mark their recurrent layers with 0 KV heads.
        kv[f"{a}.attention.head_count_kv"] = [arch.kv_heads(i) for i in range(arch.n_layer)]
    if arch.conv_l_cache is not None:
        kv[f"{a}.shortconv.l_cache"] = arch.conv_l_cache
    if a == "kimi-linear":
        # KimiLinearModel.set_gguf_parameters: the delta attention's short-convolution kernel and head
        # width, a sigmoid router (moe_router_activation_func), the routed scaling factor.
        assert arch.ssm is not None
        kv[f"{a}.ssm.conv_kernel"] = arch.ssm.d_conv
        kv[f"{a}.kda.head_dim"] = arch.ssm.d_state
        kv[f"{a}.expert_gating_func"] = 2
    elif arch.ssm is not None:
        # A Mamba-2 hybrid (Nemotron-H): its mixer's geometry, and LayerNorm epsilon as the converter writes it.
        ssm = arch.ssm
        kv.update(
            {
                f"{a}.ssm.conv_kernel": ssm.d_conv,
                f"{a}.ssm.inner_size": ssm.d_inner,
                f"{a}.ssm.state_size": ssm.d_state,
                f"{a}.ssm.time_step_rank": ssm.n_head,
                f"{a}.ssm.group_count": ssm.n_group,
                f"{a}.attention.layer_norm_epsilon": 1e-5,
            }
        )
    kv[f"{a}.attention.layer_norm_rms_epsilon"] = 1e-6
    if arch.head_dim_k is not None:
        kv[f"{a}.attention.key_length"] = arch.head_dim_k
    if arch.head_dim_v is not None:
        kv[f"{a}.attention.value_length"] = arch.head_dim_v
    if arch.sliding_window is not None:
        kv[f"{a}.attention.sliding_window"] = arch.sliding_window
    if arch.moe is not None:
        kv.update(_moe_metadata(arch))
    if arch.n_nextn_layers:
        kv[f"{a}.nextn_predict_layers"] = arch.n_nextn_layers
    if a == "glm4moe":
        kv[f"{a}.rope.dimension_count"] = arch.head_dim_k_eff // 2  # partial_rotary_factor 0.5
    if a == "granitehybrid":
        # GraniteHybridModel: no RoPE on the hybrids (rope.scaling.finetuned false, context 2^20 in the
        # converter; the record's context is kept here) and Granite's four multipliers (attention_multiplier,
        # embedding_multiplier, residual_multiplier, logits_scaling), which add scale operations to the
        # graph: any non-zero value adds the same ones, so the values only need to be plausible.
        kv[f"{a}.rope.scaling.finetuned"] = False
        kv[f"{a}.attention.scale"] = 0.0078125
        kv[f"{a}.embedding_scale"] = 12.0
        kv[f"{a}.residual_scale"] = 0.22
        kv[f"{a}.logit_scale"] = 6.0
    if a == "mistral3":
        # Ministral 3 files carry Llama 4's attention temperature (llama_4_scaling_beta), which adds a
        # per-token scale on Q to the graph.
        kv[f"{a}.attention.temperature_scale"] = 0.1
    if a == "apertus":
        # ApertusModel writes its xIELU constants per layer; llama.cpp requires them (values only plausible).
        for key, value in (("alpha_n", 0.8), ("alpha_p", 0.8), ("beta", 0.5), ("eps", -1e-6)):
            kv[f"xielu.{key}"] = [value] * arch.n_layer
    if a == "gemma4":
        kv.update(_gemma4_metadata(arch))
    if a == "gemma3n":
        kv.update(_gemma3n_metadata(arch))
    if a in ("hy_v3", "step35"):
        kv.update(_hy_v3_step35_metadata(arch))
    if a == "laguna":
        # Per-layer head counts, the shared expert's width, a sigmoid router (LagunaModel.set_gguf_parameters).
        kv[f"{a}.attention.head_count"] = [arch.heads(i) for i in range(arch.n_layer)]
        kv[f"{a}.rope.dimension_count"] = arch.head_dim_k_eff // 2
        kv[f"{a}.rope.dimension_count_swa"] = arch.head_dim_k_eff
    if arch.mla is not None:
        mla = arch.mla
        # Current converters store the MLA cache geometry: one "head" of latent + rope dims.
        if arch.attention_layers is None:
            kv[f"{a}.attention.head_count_kv"] = 1
        kv[f"{a}.attention.key_length"] = mla.kv_lora_rank + mla.qk_rope_head_dim
        kv[f"{a}.attention.value_length"] = mla.kv_lora_rank
        kv[f"{a}.attention.key_length_mla"] = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        kv[f"{a}.attention.value_length_mla"] = mla.v_head_dim
        kv[f"{a}.rope.dimension_count"] = mla.qk_rope_head_dim
        kv[f"{a}.attention.kv_lora_rank"] = mla.kv_lora_rank
        if mla.q_lora_rank:
            kv[f"{a}.attention.q_lora_rank"] = mla.q_lora_rank
        kv[f"{a}.expert_weights_scale"] = 1.0
    if arch.indexer is not None:
        ix = arch.indexer
        kv[f"{a}.attention.indexer.head_count"] = ix.n_head
        kv[f"{a}.attention.indexer.key_length"] = ix.head_dim
        kv[f"{a}.attention.indexer.top_k"] = ix.top_k
        kv[f"{a}.expert_gating_func"] = 2
        if ix.block_size is not None:
            # MiniMaxM3Model.set_gguf_parameters: sparse_block_size and sparse_local_block, the shared experts'
            # count, partial rotary (rotary_dim: half the head here).
            kv[f"{a}.attention.indexer.block_size"] = ix.block_size
            kv[f"{a}.attention.indexer.local_blocks"] = ix.local_blocks
            kv[f"{a}.rope.dimension_count"] = arch.head_dim_k_eff // 2
            kv[f"{a}.expert_shared_count"] = arch.moe.n_shared_expert if arch.moe is not None else 0
            kv[f"{a}.expert_weights_norm"] = True
        if ix.full_layers is not None:
            trunk = arch.n_layer - arch.n_nextn_layers
            kv[f"{a}.attention.indexer.types"] = [i in ix.full_layers for i in range(trunk)]
    return kv


DELTA_NET = ("qwen3next", "qwen35", "qwen35moe")


def _moe_metadata(arch: Architecture) -> dict[str, object]:
    a = arch.arch
    moe = arch.moe
    assert moe is not None
    kv: dict[str, object] = {
        f"{a}.expert_count": moe.n_expert,
        f"{a}.expert_used_count": moe.n_expert_used,
    }
    if a == "llama":
        kv[f"{a}.feed_forward_length"] = moe.expert_ff
    else:
        kv[f"{a}.expert_feed_forward_length"] = moe.expert_ff
    if moe.n_shared_expert:
        kv[f"{a}.expert_shared_count"] = moe.n_shared_expert
    if moe.n_dense_lead_layers:
        kv[f"{a}.leading_dense_block_count"] = moe.n_dense_lead_layers
    if a == "minimax-m2":
        # The expert width is feed_forward_length; the router is a sigmoid (LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID).
        kv[f"{a}.feed_forward_length"] = moe.expert_ff
        kv[f"{a}.expert_gating_func"] = 2
    if a == "glm4moe":
        kv[f"{a}.expert_gating_func"] = 2
        kv[f"{a}.expert_weights_norm"] = True
        kv[f"{a}.expert_weights_scale"] = 1.0
    if a == "llama4":
        kv[f"{a}.interleave_moe_layer_step"] = moe.layer_step
    if a == "ernie4_5-moe":
        kv[f"{a}.interleave_moe_layer_step"] = 1
        if moe.n_shared_expert:
            kv[f"{a}.expert_shared_feed_forward_length"] = moe.shared_ff
    if a == "laguna":
        kv[f"{a}.expert_shared_feed_forward_length"] = moe.shared_ff
        kv[f"{a}.expert_gating_func"] = 2
        kv[f"{a}.leading_dense_block_count"] = moe.n_dense_lead_layers
    if a == "granitehybrid":
        # GraniteMoeModel writes the expert width as feed_forward_length (intermediate_size) and the
        # shared expert's as expert_shared_feed_forward_length, with no expert or shared-expert count.
        del kv[f"{a}.expert_feed_forward_length"]
        kv.pop(f"{a}.expert_shared_count", None)
        kv[f"{a}.feed_forward_length"] = moe.expert_ff
        kv[f"{a}.expert_shared_feed_forward_length"] = moe.shared_ff
    if a == "hy_v3":
        kv.pop(f"{a}.leading_dense_block_count", None)
        kv.pop(f"{a}.expert_shared_count", None)
    if a == "nemotron_h_moe":
        kv[f"{a}.expert_shared_feed_forward_length"] = moe.shared_ff
        kv[f"{a}.expert_weights_norm"] = True
        kv[f"{a}.expert_weights_scale"] = 2.5
        if moe.latent_size:
            kv[f"{a}.moe_latent_size"] = moe.latent_size
    return kv


def _gemma4_metadata(arch: Architecture) -> dict[str, object]:
    """Gemma 4 as its converter writes it (Gemma4Model.set_gguf_parameters): per-layer SWA flags and KV
    heads, full and SWA head widths and RoPE dimensions, shared-KV layers, per-layer embedding width."""
    a = arch.arch
    swa = [arch.is_swa_layer(i) for i in range(arch.n_layer)]
    return {
        f"{a}.attention.sliding_window_pattern": swa,
        f"{a}.attention.head_count_kv": [arch.kv_heads(i) for i in range(arch.n_layer)],
        f"{a}.attention.key_length": arch.head_dim_k_eff,
        f"{a}.attention.value_length": arch.head_dim_v_eff,
        f"{a}.attention.key_length_swa": arch.head_dim_k_swa or arch.head_dim_k_eff,
        f"{a}.attention.value_length_swa": arch.head_dim_v_swa or arch.head_dim_v_eff,
        f"{a}.rope.dimension_count": arch.head_dim_k_eff,
        f"{a}.rope.dimension_count_swa": arch.head_dim_k_swa or arch.head_dim_k_eff,
        f"{a}.attention.shared_kv_layers": arch.n_kv_shared_layers,
        f"{a}.embedding_length_per_layer_input": arch.n_embd_per_layer,
        f"{a}.final_logit_softcapping": 30.0,
    }


def _gemma3n_metadata(arch: Architecture) -> dict[str, object]:
    """Gemma 3n as its converter writes it (Gemma3NModel / Gemma3Model.set_gguf_parameters): per-layer SWA
    flags from layer_types, AltUp's active stream and count, the per-layer input width, shared-KV layers,
    the activation-sparsity scale per layer (the first 10 layers' 0.95 quantile), logit soft-capping."""
    a = arch.arch
    return {
        f"{a}.attention.sliding_window_pattern": [arch.is_swa_layer(i) for i in range(arch.n_layer)],
        f"{a}.altup.active_idx": 0,
        f"{a}.altup.num_inputs": GEMMA3N_ALTUP,
        f"{a}.embedding_length_per_layer_input": arch.n_embd_per_layer,
        f"{a}.attention.shared_kv_layers": arch.n_kv_shared_layers,
        f"{a}.activation_sparsity_scale": [1.6448533535003662 if i < 10 else 0.0 for i in range(arch.n_layer)],
        f"{a}.final_logit_softcapping": 30.0,
        f"{a}.rope.freq_base_swa": 10000.0,
    }


def _hy_v3_step35_metadata(arch: Architecture) -> dict[str, object]:
    """HY V3 (HYV3Model.set_gguf_parameters): the shared expert's width, a sigmoid router with normalised
    weights, no leading-dense or shared-expert count (llama.cpp finds the dense layers by their missing
    router). Step 3.5 (Step35Model.set_gguf_parameters): per-layer SWA flags over every block (the MTP
    blocks' padded as full attention), the shared expert's width, the MoE period, per-layer SwiGLU clamps
    on the routed and shared experts (0 on the MTP blocks), which add clamp and activation tensors."""
    a = arch.arch
    moe = arch.moe
    assert moe is not None
    kv: dict[str, object] = {
        f"{a}.expert_shared_feed_forward_length": moe.shared_ff,
        f"{a}.expert_weights_norm": True,
        f"{a}.expert_weights_scale": 2.5,
    }
    if a == "hy_v3":
        kv[f"{a}.expert_gating_func"] = 2
        return kv
    trunk = arch.n_layer - arch.n_nextn_layers
    swa = [arch.is_swa_layer(i) for i in range(trunk)] + [False] * arch.n_nextn_layers
    clamp = [7.0 if i % 3 == 0 else 0.0 for i in range(trunk)] + [0.0] * arch.n_nextn_layers
    kv.update(
        {
            f"{a}.attention.sliding_window_pattern": swa,
            f"{a}.moe_every_n_layers": 1,
            f"{a}.swiglu_clamp_exp": clamp,
            f"{a}.swiglu_clamp_shexp": clamp,
            f"{a}.rope.freq_base_swa": 10000.0,
        }
    )
    return kv


def _add(writer: GGUFWriter, key: str, value: object) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, list):
        writer.add_array(key, value)
    else:
        writer.add_string(key, str(value))


def write_sparse_gguf(
    path: Path,
    arch: Architecture,
    preset: QuantPreset | str = "Q4_K_M",
    tensors: list[TensorInfo] | None = None,
    tokenizer: bool = False,
) -> list[TensorInfo]:
    """Write ``arch`` quantized with ``preset`` as a sparse GGUF at ``path``; return its tensors.

    The file's apparent size is the real model's; its disk usage is a few hundred KiB. With
    ``tokenizer`` the file carries the tiny SentencePiece vocabulary of tests/support/tiny_gguf.py
    (and a vocabulary that size) instead of none, for code that looks tokens up (mtmd does).
    """
    if tokenizer:
        arch = arch.model_copy(update={"n_vocab": len(tiny_vocab()[0])})
    p = find_preset(preset) if isinstance(preset, str) else preset
    infos = tensors if tensors is not None else quantize_layout(arch, p)
    _write_part(path, arch, p, infos, {}, tokenizer=tokenizer)
    return infos


def write_sparse_split_gguf(
    folder: Path, stem: str, arch: Architecture, preset: QuantPreset | str = "Q4_K_M", n_parts: int = 3
) -> tuple[list[Path], list[TensorInfo]]:
    """Write ``arch`` as a sparse model split over ``n_parts`` files named as llama.cpp's gguf-split
    names them (``{stem}-00001-of-0000N.gguf``): every metadata entry in the first part, the
    ``split.*`` keys in each (u16 split.no and split.count, i32 split.tensors.count), the tensors
    shared out in order. Returns the parts' paths and all the tensors."""
    p = find_preset(preset) if isinstance(preset, str) else preset
    infos = quantize_layout(arch, p)
    per = -(-len(infos) // n_parts)
    paths = []
    for i in range(n_parts):
        path = folder / f"{stem}-{i + 1:05d}-of-{n_parts:05d}.gguf"
        split = {"split.no": (i, "u16"), "split.count": (n_parts, "u16"), "split.tensors.count": (len(infos), "i32")}
        _write_part(path, arch, p, infos[i * per : (i + 1) * per], split, metadata=i == 0)
        paths.append(path)
    return paths, infos


def _write_part(
    path: Path,
    arch: Architecture,
    p: QuantPreset,
    infos: list[TensorInfo],
    split: dict[str, tuple[int, str]],
    metadata: bool = True,
    tokenizer: bool = False,
) -> None:
    writer = GGUFWriter(path, arch.arch)
    if metadata:
        writer.add_name(arch.name)
        writer.add_file_type(p.ftype)
        writer.add_quantization_version(2)
        for key, value in _metadata(arch).items():
            _add(writer, key, value)
        if tokenizer:
            tokens, scores, types = tiny_vocab()
            writer.add_tokenizer_model("llama")
            writer.add_token_list(tokens)
            writer.add_token_scores(scores)
            writer.add_token_types(types)
        else:
            writer.add_string("tokenizer.ggml.model", "no_vocab")
    for key, (value, kind) in split.items():
        (writer.add_uint16 if kind == "u16" else writer.add_int32)(key, value)
    for t in infos:
        writer.add_tensor_info(
            t.name,
            tuple(reversed(t.shape)),
            np.dtype(np.float32),
            t.n_bytes,
            raw_dtype=GGMLQuantizationType(int(t.ggml_type)),
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    header = path.stat().st_size
    data_start = -(-header // ALIGNMENT) * ALIGNMENT
    data = sum(-(-t.n_bytes // ALIGNMENT) * ALIGNMENT for t in infos)
    with path.open("r+b") as f:
        f.truncate(data_start + data)
