"""``config.json`` of the 2025-2026 families, in llama.cpp's terms: Qwen3-Next and Qwen3.5 / 3.6 (gated
DeltaNet hybrids), Gemma 4, DeepSeek-V3-style MLA (DeepSeek V3.x, Kimi K2.x, GLM-4.7-Flash), DeepSeek-V3.2
and GLM-5 sparse attention, Nemotron 3 (Mamba-2 / attention / MoE), Granite 4.0-H (Mamba-2 / attention),
SmolLM3, Apertus, Ministral 3 / Mistral 3 and Laguna.

Each reader follows what the vendored converter (convert_hf_to_gguf.py and conversion/*.py) writes for
the family, so that an estimate from the config.json and one from the converted GGUF agree: the
multi-token-prediction block counts as a layer where the converter keeps it (Qwen3.5, DeepSeek-V3.2,
GLM-5, Nemotron 3 Super/Ultra) and not where it drops it (DeepseekV2Model's skip_mtp).
:mod:`app.core.model.hf_config` dispatches here by ``model_type``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from app.core.common.errors import ModelFileError
from app.core.model.architecture import Architecture, IndexerSpec, MLASpec, MoESpec, SSMSpec
from app.core.model.gguf_model import GLM_5_2_CONTEXT, glm_5_2_full_indexer_layers


class ConfigKeys(Protocol):
    """The typed key access :class:`app.core.model.hf_config._Config` provides."""

    shown: str

    def raw(self, key: str, default: Any = ...) -> Any: ...
    def int(self, key: str, default: Any = ...) -> Any: ...
    def flag(self, key: str, default: bool) -> bool: ...
    def first_int(self, *keys: str, default: Any = ...) -> Any: ...


# Hugging Face model_type -> llama.cpp general.architecture, for the families read here.
RECENT_MODEL_TYPES: dict[str, str] = {
    "qwen3_5": "qwen35",
    "qwen3_5_text": "qwen35",
    "qwen3_5_moe": "qwen35moe",
    "qwen3_5_moe_text": "qwen35moe",
    "qwen3_next": "qwen3next",
    "gemma4": "gemma4",
    "gemma4_text": "gemma4",
    "kimi_k2": "deepseek2",
    "kimi_k25": "deepseek2",
    "glm4_moe_lite": "deepseek2",
    "deepseek_v32": "deepseek32",
    "glm_moe_dsa": "glm-dsa",
    "nemotron_h": "nemotron_h",
    "smollm3": "smollm3",
    "laguna": "laguna",
    "minimax_m2": "minimax-m2",
    "granitemoehybrid": "granitehybrid",
    "apertus": "apertus",
    "mistral3": "mistral3",
}

# Model types whose config nests the language model under text_config.
NESTED = ("qwen3_5", "qwen3_5_moe", "gemma4", "kimi_k25", "mistral3")

# transformers' default for tie_word_embeddings where the file leaves it out (SmolLM3Config: True).
TIED_DEFAULT = {"smollm3": True, "gemma4": True, "granitemoehybrid": True}

# The context length the converter writes for a Granite hybrid without RoPE (GraniteHybridModel).
GRANITE_HYBRID_CONTEXT = 1 << 20



def read_recent(c: ConfigKeys, data: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    """The Architecture fields (all but id, name and source) of a config of ``model_type`` (a key of
    :data:`RECENT_MODEL_TYPES`); ``c`` reads the text config. Raises ModelFileError for a missing key."""
    arch = RECENT_MODEL_TYPES[model_type]
    common = {
        "arch": arch,
        "n_embd": c.int("hidden_size"),
        "n_vocab": c.int("vocab_size"),
        "n_ctx_train": c.int("max_position_embeddings"),
        "tied_embeddings": _tied(c, data, model_type),
    }
    if arch in ("qwen35", "qwen35moe", "qwen3next"):
        return common | _qwen35(c)
    if arch == "gemma4":
        return common | _gemma4(c)
    if arch in ("deepseek2", "deepseek32", "glm-dsa"):
        return common | _deepseek(c, arch)
    if arch == "nemotron_h":
        return _nemotron_h(c, common)
    if arch == "laguna":
        return common | _laguna(c)
    if arch == "granitehybrid":
        return _granite_hybrid(c, common)
    if arch == "mistral3" and c.raw("model_type", None) == "mistral4":
        # Mistral3Model.Mistral4Model: DeepSeek-V2-style latent attention with experts (mistral4).
        raise ModelFileError(
            f"{c.shown}: a mistral4 language model, whose tensors FitScope cannot lay out without its file."
        )
    # SmolLM3 (Llama's tensors, NoPE on every 4th layer), Apertus (Llama's attention with q/k norm, an
    # ungated xIELU MLP: ApertusModel), Ministral 3 / Mistral 3 (Llama's tensors: Mistral3Model's
    # Ministral3Model) and MiniMax-M2 (256 experts, full-width q/k norm).
    n_head = c.int("num_attention_heads")
    fields: dict[str, Any] = common | {
        "n_layer": c.int("num_hidden_layers"),
        "n_head": n_head,
        "n_head_kv": c.int("num_key_value_heads", n_head),
        "n_ff": c.int("intermediate_size"),
    }
    head_dim = c.int("head_dim", None)
    if head_dim and head_dim != fields["n_embd"] // n_head:
        fields |= {"head_dim_k": head_dim, "head_dim_v": head_dim}
    if arch == "apertus":
        fields["qk_norm"] = c.flag("qk_norm", True)
    if arch == "minimax-m2":
        fields |= {
            "qk_norm": c.flag("use_qk_norm", True),
            "moe": MoESpec(
                n_expert=c.int("num_local_experts"),
                n_expert_used=c.int("num_experts_per_tok"),
                expert_ff=c.int("intermediate_size"),
            ),
        }
    return fields


def _tied(c: ConfigKeys, data: Mapping[str, Any], model_type: str) -> bool:
    tied = c.raw("tie_word_embeddings", None)
    if tied is None:
        tied = data.get("tie_word_embeddings")
    if tied is None:
        tied = TIED_DEFAULT.get(model_type, False)
    if not isinstance(tied, bool):
        raise ModelFileError(f"{c.shown}: 'tie_word_embeddings' is {tied!r}; it must be true or false.")
    return tied


def _layer_types(c: ConfigKeys, n_layer: int) -> list[str]:
    types = c.raw("layer_types", None)
    if not isinstance(types, list) or len(types) != n_layer or not all(isinstance(t, str) for t in types):
        raise ModelFileError(f"{c.shown}: 'layer_types' must list one type per layer ({n_layer}).")
    return types


def _qwen35(c: ConfigKeys) -> dict[str, Any]:
    """Qwen3-Next and Qwen3.5 / 3.6 (Qwen3NextModel.set_gguf_parameters and _QwenMtpMixin): gated DeltaNet
    layers where layer_types says linear_attention (Qwen3-Next: every layer but each full_attention_interval-th),
    the MTP block appended as a full-attention layer. Qwen3-Next's config.json does not say whether its
    checkpoint holds an MTP block (the converter counts the mtp.* tensors), so none is counted for it."""
    trunk = c.int("num_hidden_layers")
    n_mtp = c.int("mtp_num_hidden_layers", 0)
    if c.raw("layer_types", None) is None and c.raw("full_attention_interval", None) is not None:
        if c.raw("mlp_only_layers", None) or c.int("decoder_sparse_step", 1) != 1:
            raise ModelFileError(f"{c.shown}: dense layers among the experts are not a shape FitScope models.")
        interval = c.int("full_attention_interval")
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(trunk)]
    else:
        types = _layer_types(c, trunk)
    n_v_heads = c.int("linear_num_value_heads")
    fields: dict[str, Any] = {
        "n_layer": trunk + n_mtp,
        "n_head": c.int("num_attention_heads"),
        "n_head_kv": c.int("num_key_value_heads"),
        "head_dim_k": c.int("head_dim"),
        "head_dim_v": c.int("head_dim"),
        "n_ff": c.int("intermediate_size", 0),
        "qk_norm": True,
        "ssm": SSMSpec(
            version=2,
            d_conv=c.int("linear_conv_kernel_dim"),
            d_inner=c.int("linear_value_head_dim") * n_v_heads,
            d_state=c.int("linear_key_head_dim"),
            n_group=c.int("linear_num_key_heads"),
            n_head=n_v_heads,
        ),
        "attention_layers": [i for i, t in enumerate(types) if t == "full_attention"]
        + list(range(trunk, trunk + n_mtp)),
        "n_nextn_layers": n_mtp,
    }
    if c.int("num_experts", 0) >= 2:
        fields["moe"] = MoESpec(
            n_expert=c.int("num_experts"),
            n_expert_used=c.int("num_experts_per_tok"),
            expert_ff=c.int("moe_intermediate_size"),
            n_shared_expert=1,
            shared_expert_ff=c.int("shared_expert_intermediate_size"),
        )
    return fields


def _gemma4(c: ConfigKeys) -> dict[str, Any]:
    """Gemma 4 (Gemma4Model.set_gguf_parameters): per-layer SWA flags, KV heads and head widths (global
    for full attention, head_dim for sliding), shared-KV layers, per-layer embeddings, the MoE block."""
    n_layer = c.int("num_hidden_layers")
    types = _layer_types(c, n_layer)
    swa = [t == "sliding_attention" for t in types]
    pattern = next((n for n in range(1, n_layer + 1) if all(f == (i % n < n - 1) for i, f in enumerate(swa))), None)
    if pattern is None:
        raise ModelFileError(f"{c.shown}: its layer_types do not repeat a sliding-window period FitScope can model.")
    kv_swa = c.int("num_key_value_heads")
    kv_full = c.int("num_global_key_value_heads", kv_swa)
    head_swa = c.int("head_dim")
    head_full = c.int("global_head_dim", head_swa)
    n_shared = c.int("num_kv_shared_layers", 0)
    n_ff = c.int("intermediate_size")
    ff: int | list[int] = n_ff
    if c.flag("use_double_wide_mlp", False):
        ff = [n_ff if i < n_layer - n_shared else 2 * n_ff for i in range(n_layer)]
    fields: dict[str, Any] = {
        "n_layer": n_layer,
        "n_head": c.int("num_attention_heads"),
        "n_head_kv": [kv_swa if s else kv_full for s in swa],
        "head_dim_k": head_full,
        "head_dim_v": head_full,
        "head_dim_k_swa": head_swa,
        "head_dim_v_swa": head_swa,
        "n_ff": ff,
        "sliding_window": c.int("sliding_window"),
        "sliding_window_pattern": pattern,
        "qk_norm": True,
        "full_attention_k_is_v": c.flag("attention_k_eq_v", False),
        "n_kv_shared_layers": n_shared,
        "n_embd_per_layer": c.int("hidden_size_per_layer_input", 0),
    }
    if c.flag("enable_moe_block", False):
        fields["moe"] = MoESpec(
            n_expert=c.int("num_experts"),
            n_expert_used=c.int("top_k_experts"),
            expert_ff=c.first_int("expert_intermediate_size", "moe_intermediate_size"),
        )
    return fields


def _deepseek(c: ConfigKeys, arch: str) -> dict[str, Any]:
    """DeepSeek-V3-style MLA with routed and shared experts (DeepseekV2Model.set_gguf_parameters):
    Kimi K2.x and GLM-4.7-Flash as deepseek2 (MTP dropped), DeepSeek-V3.2 and GLM-5 with the indexer and
    the MTP block kept (DeepseekV32Model, GlmMoeDsaModel)."""
    trunk = c.int("num_hidden_layers")
    n_nextn = c.int("num_nextn_predict_layers", 0) if arch in ("deepseek32", "glm-dsa") else 0
    n_head = c.int("num_attention_heads")
    fields: dict[str, Any] = {
        "n_layer": trunk + n_nextn,
        "n_head": n_head,
        "n_head_kv": n_head,
        "n_ff": c.int("intermediate_size"),
        "moe": MoESpec(
            n_expert=c.int("n_routed_experts"),
            n_expert_used=c.int("num_experts_per_tok"),
            expert_ff=c.int("moe_intermediate_size"),
            n_shared_expert=c.int("n_shared_experts", 0),
            n_dense_lead_layers=c.int("first_k_dense_replace", 0),
            # noaux_tc routing carries e_score_correction_bias, written as exp_probs_b.
            selection_bias=c.raw("topk_method", None) == "noaux_tc",
        ),
        "mla": MLASpec(
            q_lora_rank=c.int("q_lora_rank", 0) or 0,
            kv_lora_rank=c.int("kv_lora_rank"),
            qk_rope_head_dim=c.int("qk_rope_head_dim"),
            qk_nope_head_dim=c.int("qk_nope_head_dim"),
            v_head_dim=c.int("v_head_dim"),
        ),
        "n_nextn_layers": n_nextn,
    }
    if arch in ("deepseek32", "glm-dsa"):
        full = None
        types = c.raw("indexer_types", None)
        if isinstance(types, list):
            full = [i for i, t in enumerate(types) if t == "full"]
        elif arch == "glm-dsa" and c.int("max_position_embeddings") >= GLM_5_2_CONTEXT:
            full = glm_5_2_full_indexer_layers(trunk)
        fields["indexer"] = IndexerSpec(
            n_head=c.int("index_n_heads"),
            head_dim=c.int("index_head_dim"),
            top_k=c.int("index_topk"),
            full_layers=full,
        )
    return fields


def _nemotron_h(c: ConfigKeys, common: dict[str, Any]) -> dict[str, Any]:
    """Nemotron-H / Nemotron 3 (NemotronHModel): the layout string (M Mamba-2, * attention, - MLP or E
    experts) or layers_block_type; MoE files become nemotron_h_moe and keep their MTP block (attention +
    MoE) as one trailing layer."""
    pattern = c.raw("hybrid_override_pattern", None) or c.raw("layers_block_type", None)
    if not isinstance(pattern, (str, list)) or not pattern:
        raise ModelFileError(f"{c.shown} has no 'hybrid_override_pattern' or 'layers_block_type'.")
    codes = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "moe": "E", "mlp": "-"}
    layout = pattern if isinstance(pattern, str) else "".join(codes.get(str(t), "?") for t in pattern)
    is_moe = c.raw("num_experts_per_tok", None) is not None
    ffn_code = "E" if is_moe else "-"
    n_mtp = c.int("num_nextn_predict_layers", 0) if is_moe else 0
    n_layer = len(layout) + n_mtp
    attention = [i for i, t in enumerate(layout) if t == "*"] + list(range(len(layout), n_layer))
    ffn_layers = [i for i, t in enumerate(layout) if t == ffn_code] + list(range(len(layout), n_layer))
    n_ff = c.int("moe_intermediate_size") if is_moe else c.int("intermediate_size")
    n_kv = c.int("num_key_value_heads")
    d_head = c.int("mamba_head_dim")
    n_heads = c.int("mamba_num_heads")
    # The converter pads the vocabulary to a multiple of 8 (NemotronHModel.set_vocab).
    vocab = -(common["n_vocab"] // -8) * 8
    fields = common | {
        "arch": "nemotron_h_moe" if is_moe else "nemotron_h",
        "n_vocab": vocab,
        "n_layer": n_layer,
        "n_head": c.int("num_attention_heads"),
        "n_head_kv": [n_kv if i in attention else 0 for i in range(n_layer)],
        "head_dim_k": c.int("head_dim"),
        "head_dim_v": c.int("head_dim"),
        "n_ff": [n_ff if i in ffn_layers else 0 for i in range(n_layer)],
        "ssm": SSMSpec(
            version=2,
            d_conv=c.int("conv_kernel"),
            d_inner=n_heads * d_head,
            d_state=c.int("ssm_state_size"),
            n_group=c.int("n_groups"),
            n_head=n_heads,
        ),
        "attention_layers": attention,
        "ffn_only_layers": ffn_layers,
        "n_nextn_layers": n_mtp,
    }
    if is_moe:
        fields["moe"] = MoESpec(
            n_expert=c.int("n_routed_experts"),
            n_expert_used=c.int("num_experts_per_tok"),
            expert_ff=n_ff,
            n_shared_expert=c.int("n_shared_experts", 1),
            shared_expert_ff=c.int("moe_shared_expert_intermediate_size"),
            latent_size=c.int("moe_latent_size", None),
            selection_bias=True,  # e_score_correction_bias, written as exp_probs_b
        )
    return fields


def _granite_hybrid(c: ConfigKeys, common: dict[str, Any]) -> dict[str, Any]:
    """Granite 4.0-H (GraniteHybridModel.set_gguf_parameters): Mamba-2 mixers where layer_types says mamba
    (d_inner = mamba_expand x hidden_size, mamba_n_heads heads) and attention without RoPE on the others
    (so the converter writes a context length of 2^20), each layer followed by routed experts of
    intermediate_size with a shared expert of shared_intermediate_size, or, with no experts, a dense FFN
    (the converter's shared_mlp, loaded at feed_forward_length)."""
    n_layer = c.int("num_hidden_layers")
    types = _layer_types(c, n_layer)
    attention = [i for i, t in enumerate(types) if t == "attention"]
    if len(attention) == n_layer:
        raise ModelFileError(f"{c.shown}: every layer is attention; the converter writes it as granite, not read here.")
    n_kv = c.int("num_key_value_heads")
    n_ff = c.int("intermediate_size")
    shared_ff = c.int("shared_intermediate_size", 0)
    fields = common | {
        # Mamba2Model.set_vocab pads the vocabulary to a multiple of 8 when there are Mamba layers.
        "n_vocab": -(common["n_vocab"] // -8) * 8,
        "n_ctx_train": GRANITE_HYBRID_CONTEXT,
        "n_layer": n_layer,
        "n_head": c.int("num_attention_heads"),
        "n_head_kv": [n_kv if i in attention else 0 for i in range(n_layer)],
        "n_ff": n_ff,
        "ssm": SSMSpec(
            version=2,
            d_conv=c.int("mamba_d_conv"),
            d_inner=c.int("mamba_expand") * common["n_embd"],
            d_state=c.int("mamba_d_state"),
            n_group=c.int("mamba_n_groups"),
            n_head=c.int("mamba_n_heads"),
        ),
        "attention_layers": attention,
    }
    if c.int("num_local_experts", 0) >= 2:
        fields["moe"] = MoESpec(
            n_expert=c.int("num_local_experts"),
            n_expert_used=c.int("num_experts_per_tok"),
            expert_ff=n_ff,
            n_shared_expert=1 if shared_ff else 0,
            shared_expert_ff=shared_ff or None,
        )
    elif shared_ff != n_ff:
        raise ModelFileError(
            f"{c.shown}: a dense Granite hybrid needs shared_intermediate_size equal to intermediate_size "
            f"({shared_ff} and {n_ff}), as llama.cpp loads its FFN at feed_forward_length."
        )
    return fields


def _laguna(c: ConfigKeys) -> dict[str, Any]:
    """Laguna (LagunaModel.set_gguf_parameters): per-layer head counts, full attention on layers 0, 4,
    8... among sliding-window ones, leading dense layers then sigmoid-routed experts with a shared one."""
    n_layer = c.int("num_hidden_layers")
    heads = c.raw("num_attention_heads_per_layer", None) or c.int("num_attention_heads")
    types = _layer_types(c, n_layer)
    swa = [t == "sliding_attention" for t in types]
    if any(swa) and not all(f == (i % 4 != 0) for i, f in enumerate(swa)):
        raise ModelFileError(f"{c.shown}: its layer_types are not Laguna's full / 3 x sliding pattern.")
    mlp = c.raw("mlp_layer_types", None) or []
    lead = next((i for i, t in enumerate(mlp) if t != "dense"), len(mlp))
    head_dim = c.int("head_dim")
    return {
        "n_layer": n_layer,
        "n_head": heads,
        "n_head_kv": c.int("num_key_value_heads"),
        "head_dim_k": head_dim,
        "head_dim_v": head_dim,
        "n_ff": c.int("intermediate_size"),
        "sliding_window": c.int("sliding_window") if any(swa) else None,
        "sliding_window_pattern": 4 if any(swa) else None,
        "swa_dense_first": any(swa),
        "qk_norm": True,
        "moe": MoESpec(
            n_expert=c.int("num_experts"),
            n_expert_used=c.int("num_experts_per_tok"),
            expert_ff=c.int("moe_intermediate_size"),
            n_shared_expert=1,
            shared_expert_ff=c.int("shared_expert_intermediate_size"),
            n_dense_lead_layers=lead,
            selection_bias=True,
        ),
    }


def build_recent(fields: dict[str, Any], model_id: str, name: str, source: str) -> Architecture:
    return Architecture(id=model_id, name=name, source=source, **fields)
