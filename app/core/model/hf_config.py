"""Read a Hugging Face ``config.json`` into an :class:`Architecture`, in llama.cpp's terms.

Only the model families FitScope can size are accepted (see :data:`MODEL_TYPES`); the numbers
follow what llama.cpp's ``convert_hf_to_gguf.py`` would write into a GGUF file for the same model,
so that an estimate from a config.json and one from the converted GGUF agree.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from app.core.common.errors import ModelFileError
from app.core.common.files import read_text_file
from app.core.model.architecture import Architecture, MLASpec, MoESpec, SSMSpec
from app.core.model.gguf_model import ARCH_SWA_PATTERN, model_id_from
from app.core.model.hf_recent import NESTED, RECENT_MODEL_TYPES, read_recent

# Hugging Face model_type -> llama.cpp general.architecture
MODEL_TYPES: dict[str, str] = {
    "llama": "llama",
    "mistral": "llama",
    "mixtral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3moe",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3",
    "gemma3": "gemma3",
    "phi3": "phi3",
    "deepseek_v2": "deepseek2",
    "gpt_oss": "gpt-oss",
    "mamba": "mamba",
    "falcon_mamba": "mamba",
}

# transformers' default for tie_word_embeddings in each config class (used when the file omits it).
TIED_DEFAULT: dict[str, bool] = {
    "llama": False,
    "mistral": False,
    "mixtral": False,
    "qwen2": False,
    "qwen3": False,
    "qwen3_moe": False,
    "gemma2": True,
    "gemma3_text": True,
    "gemma3": True,
    "phi3": False,
    "deepseek_v2": False,
    "gpt_oss": False,
    "mamba": True,
    "falcon_mamba": True,
}

# Config-class defaults for keys that real config.json files of these families leave out
# (Gemma 3's multimodal checkpoints give only a handful of text_config keys).
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma2": {
        "vocab_size": 256000,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 8192,
        "sliding_window": 4096,
    },
    "gemma3_text": {
        "vocab_size": 262208,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 131072,
        "sliding_window": 4096,
    },
    "qwen3": {"head_dim": 128},
    "qwen3_moe": {"head_dim": 128},
    "gpt_oss": {"head_dim": 64, "sliding_window": 128},
    "mamba": {"state_size": 16, "conv_kernel": 4, "expand": 2, "time_step_rank": "auto"},
    "falcon_mamba": {"state_size": 16, "conv_kernel": 4, "expand": 2, "time_step_rank": "auto"},
}

# llama.cpp's SWA period (set_swa_pattern) for the families it runs with a sliding window.
SWA_PATTERN = ARCH_SWA_PATTERN  # one table: llama.cpp's set_swa_pattern per architecture

# Mamba has no trained context length; llama.cpp's converter writes this value.
MAMBA_CONTEXT = 1 << 20

_MISSING = object()


def _load(path_or_dict: str | Path | Mapping[str, Any]) -> tuple[dict[str, Any], str, Path | None]:
    """(config, name to show in messages, path or None)."""
    if isinstance(path_or_dict, Mapping):
        return dict(path_or_dict), "config.json", None
    try:
        path = Path(path_or_dict).expanduser()
        if path.is_dir():
            path = path / "config.json"
        text = read_text_file(path, "config file", ModelFileError)
    except ModelFileError:
        raise
    except UnicodeDecodeError as exc:
        raise ModelFileError(f"{path_or_dict} is not a text file, so it cannot be a config.json.") from exc
    except (OSError, ValueError) as exc:
        raise ModelFileError(f"FitScope cannot read {path_or_dict}: {exc}.") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelFileError(f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}.") from None
    except RecursionError:
        raise ModelFileError(f"{path} is not a config.json: its JSON nests too deeply.") from None
    except ValueError as exc:  # e.g. an integer of thousands of digits
        raise ModelFileError(f"{path} is not a usable config.json: {str(exc)[:120]}.") from None
    if not isinstance(data, dict):
        raise ModelFileError(f"{path} is not a model config: it holds a JSON {type(data).__name__}.")
    return data, str(path), path


MAX_CONFIG_INT = 1 << 40  # larger than any real width, count or context


class _Config:
    """Looks keys up in the (text) config, then in the family defaults; messages name file and key."""

    def __init__(self, data: Mapping[str, Any], shown: str, model_type: str, arch: str) -> None:
        self.data, self.shown, self.model_type, self.arch = data, shown, model_type, arch
        self.defaults = FAMILY_DEFAULTS.get(model_type, {})

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        value = self.data.get(key)
        if value is None:
            value = self.defaults.get(key)
        if value is None:
            if default is _MISSING:
                raise ModelFileError(f"{self.shown} has no '{key}' entry, which a {self.model_type} model needs.")
            return default
        return value

    def int(self, key: str, default: Any = _MISSING) -> Any:
        """A whole number from 0 to MAX_CONFIG_INT (sizes, counts: nothing real is larger)."""
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) <= MAX_CONFIG_INT:
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_CONFIG_INT:
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            raise ModelFileError(
                f"{self.shown}: '{key}' is {shown}, not a whole number from 0 to {MAX_CONFIG_INT:,}."
            )
        return value

    def flag(self, key: str, default: bool) -> bool:
        """A true/false entry: JSON booleans (and 0/1); anything else is refused, not guessed."""
        value = self.raw(key, default)
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise ModelFileError(f"{self.shown}: '{key}' is {value!r}; it must be true or false.")

    def first_int(self, *keys: str, default: Any = _MISSING) -> Any:
        for key in keys:
            value = self.int(key, None)
            if value is not None:
                return value
        if default is _MISSING:
            raise ModelFileError(f"{self.shown} has no '{keys[0]}' entry, which a {self.model_type} model needs.")
        return default


def _pattern_from_layer_types(layer_types: Any) -> int | None:
    """The SWA period of a transformers ``layer_types`` list (sliding_attention / full_attention):
    the first full-attention layer's position + 1, checked once over the list (linear time)."""
    if not isinstance(layer_types, list) or not layer_types or len(layer_types) > 4096:
        return None
    flags = [t == "sliding_attention" for t in layer_types]
    if all(flags):
        return 1
    n = flags.index(False) + 1
    if n >= 2 and all(flag == (i % n < n - 1) for i, flag in enumerate(flags)):
        return n
    return None


def _derive_id(model_id: str | None, data: Mapping[str, Any], path: Path | None, model_type: str) -> str:
    candidates = [model_id]
    name_or_path = data.get("_name_or_path")
    if isinstance(name_or_path, str) and name_or_path.strip():
        candidates.append(name_or_path.rstrip("/").split("/")[-1])
    if path is not None:
        candidates.append(path.resolve().parent.name)
    candidates.append(model_type)
    for candidate in candidates:
        if candidate:
            slug = model_id_from(candidate.rstrip("/").split("/")[-1])  # "org/Name" -> "name"
            if slug:
                return slug
    return "model"


def read_hf_config(path_or_dict: str | Path | Mapping[str, Any], model_id: str | None = None) -> Architecture:
    """The Architecture described by a config.json (a path, a folder holding one, or its parsed dict).

    Raises ModelFileError for unreadable files, bad JSON, unknown model types and missing keys.
    """
    data, shown, path = _load(path_or_dict)
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ModelFileError(
            f"{shown} has no 'model_type' entry, so FitScope cannot tell which architecture it describes."
        )
    if model_type in RECENT_MODEL_TYPES or model_type == "deepseek_v3":
        return _read_recent(data, shown, path, model_type, model_id)
    if model_type not in MODEL_TYPES:
        known = [*MODEL_TYPES, "deepseek_v3", *RECENT_MODEL_TYPES]
        raise ModelFileError(f"unknown architecture '{model_type}' in {shown}; FitScope reads: {', '.join(known)}.")
    arch = MODEL_TYPES[model_type]

    text: Mapping[str, Any] = data
    family = model_type
    if model_type == "gemma3":
        nested = data.get("text_config")
        if isinstance(nested, Mapping):
            text = nested
        family = "gemma3_text"
    c = _Config(text, shown, family, arch)

    try:
        return _build(c, data, text, path, model_type, arch, model_id)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the model"
        raise ModelFileError(f"{shown} describes a model FitScope cannot use: {where}: {first['msg']}.") from None


def _read_recent(
    data: Mapping[str, Any], shown: str, path: Path | None, model_type: str, model_id: str | None
) -> Architecture:
    """The 2025-2026 families (app.core.model.hf_recent); DeepSeek-V3 is read there with Kimi K2."""
    kind = "kimi_k2" if model_type == "deepseek_v3" else model_type
    text: Mapping[str, Any] = data
    if model_type in NESTED:
        nested = data.get("text_config")
        if not isinstance(nested, Mapping):
            raise ModelFileError(f"{shown} has no 'text_config' entry, which a {model_type} model needs.")
        text = nested
    c = _Config(text, shown, kind, RECENT_MODEL_TYPES[kind])
    try:
        fields = read_recent(c, data, kind)
        model_id_text = _derive_id(model_id, data, path, model_type)
        source = str(path) if path is not None else (f"config.json of {model_id}" if model_id else "config.json")
        return Architecture(id=model_id_text, name=model_id or model_id_text, source=source, **fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the model"
        raise ModelFileError(f"{shown} describes a model FitScope cannot use: {where}: {first['msg']}.") from None


def _build(
    c: _Config,
    data: Mapping[str, Any],
    text: Mapping[str, Any],
    path: Path | None,
    model_type: str,
    arch: str,
    model_id: str | None,
) -> Architecture:
    is_mamba = arch == "mamba"

    if is_mamba:
        n_embd = c.first_int("hidden_size", "d_model")
        n_layer = c.first_int("num_hidden_layers", "n_layer")
        n_head = n_head_kv = n_ff = 0
        n_ctx_train = c.int("max_position_embeddings", MAMBA_CONTEXT)
        # llama.cpp pads Mamba's vocabulary to pad_vocab_size_multiple (8)
        pad = c.int("pad_vocab_size_multiple", 8) or 1
        n_vocab = -(c.int("vocab_size") // -pad) * pad
    else:
        n_embd = c.int("hidden_size")
        n_layer = c.int("num_hidden_layers")
        n_head = c.int("num_attention_heads")
        n_head_kv = c.int("num_key_value_heads", n_head)
        n_ff = c.int("intermediate_size")
        n_ctx_train = c.int("max_position_embeddings")
        n_vocab = c.int("vocab_size")
        # Consistency a real transformer has: heads divide the width (or head_dim is given), KV heads
        # divide the heads, and no count exceeds the width.
        if not 1 <= n_head <= n_embd:
            raise ModelFileError(f"{c.shown}: 'num_attention_heads' is {n_head:,}; it must be from 1 to hidden_size.")
        if not 1 <= n_head_kv <= n_head or n_head % n_head_kv:
            raise ModelFileError(
                f"{c.shown}: 'num_key_value_heads' is {n_head_kv:,}; it must divide num_attention_heads ({n_head:,})."
            )
        if n_embd % n_head and not c.int("head_dim", None):
            raise ModelFileError(
                f"{c.shown}: hidden_size {n_embd:,} is not a multiple of num_attention_heads {n_head:,} "
                "and no head_dim is given."
            )

    # per-head widths: only when they differ from n_embd / n_head (always true for Gemma)
    head_dim_k = head_dim_v = None
    if not is_mamba:
        head_dim = c.int("head_dim", None)
        if head_dim and (n_head == 0 or n_embd % n_head or head_dim != n_embd // n_head):
            head_dim_k = head_dim_v = head_dim

    if model_type == "qwen2":
        attn_bias = True  # Qwen2 always has q/k/v biases
    elif model_type == "gpt_oss":
        attn_bias = c.flag("attention_bias", True)
    elif model_type == "llama":
        attn_bias = c.flag("attention_bias", False)
    else:
        attn_bias = False
    qk_norm = model_type in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text")

    # sliding window: llama.cpp uses it only for these families
    sliding_window = pattern = None
    if arch in SWA_PATTERN:
        sliding_window = c.int("sliding_window", None) or None
        if sliding_window:
            pattern = SWA_PATTERN[arch]
            if arch == "gemma3":
                explicit = c.int("sliding_window_pattern", None) or c.int("_sliding_window_pattern", None)
                pattern = explicit or _pattern_from_layer_types(text.get("layer_types")) or pattern

    tied = text.get("tie_word_embeddings")
    if tied is None:
        tied = data.get("tie_word_embeddings")
    if tied is None:
        tied = TIED_DEFAULT[model_type]
    if not isinstance(tied, bool):
        raise ModelFileError(f"{c.shown}: 'tie_word_embeddings' is {tied!r}; it must be true or false.")

    moe = None
    n_expert = c.first_int("num_local_experts", "num_experts", "n_routed_experts", default=0)
    if n_expert >= 2:
        n_shared = c.int("n_shared_experts", None)
        shared_ff = c.int("shared_expert_intermediate_size", None) or None
        if n_shared is None:
            n_shared = 1 if shared_ff else 0
        moe = MoESpec(
            n_expert=n_expert,
            n_expert_used=c.first_int("num_experts_per_tok", "experts_per_token"),
            expert_ff=c.first_int("moe_intermediate_size", "intermediate_size"),
            n_shared_expert=n_shared,
            shared_expert_ff=shared_ff if n_shared else None,
            n_dense_lead_layers=c.int("first_k_dense_replace", 0),
        )

    mla = None
    if arch == "deepseek2":
        mla = MLASpec(
            q_lora_rank=c.int("q_lora_rank", 0),
            kv_lora_rank=c.int("kv_lora_rank"),
            qk_rope_head_dim=c.int("qk_rope_head_dim"),
            qk_nope_head_dim=c.int("qk_nope_head_dim"),
            v_head_dim=c.int("v_head_dim"),
        )
        head_dim_k = head_dim_v = None  # the MLA block carries the widths

    ssm = None
    if is_mamba:
        auto = c.raw("time_step_rank") == "auto"
        dt_rank = math.ceil(n_embd / 16) if auto else c.int("time_step_rank")
        ssm = SSMSpec(
            version=1,
            d_conv=c.int("conv_kernel"),
            d_inner=c.int("intermediate_size", None) or c.int("expand") * n_embd,
            d_state=c.int("state_size"),
            dt_rank=dt_rank,
        )

    model_id_text = _derive_id(model_id, data, path, model_type)
    name = model_id or model_id_text
    source = str(path) if path is not None else (f"config.json of {model_id}" if model_id else "config.json")
    return Architecture(
        id=model_id_text,
        name=name,
        arch=arch,
        source=source,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        n_ff=n_ff,
        n_vocab=n_vocab,
        tied_embeddings=bool(tied),
        n_ctx_train=n_ctx_train,
        sliding_window=sliding_window,
        sliding_window_pattern=pattern,
        attn_bias=attn_bias,
        qk_norm=qk_norm,
        moe=moe,
        mla=mla,
        ssm=ssm,
    )
