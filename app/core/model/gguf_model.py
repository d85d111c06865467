"""A GGUF file read as a model: its header (:mod:`app.core.model.gguf_reader`) and the
:class:`Architecture` its metadata describes, read the way llama.cpp's ``llama_model::load_hparams``
reads the same keys (src/llama-model.cpp of the vendored llama.cpp): widths, heads, per-layer
arrays, sliding windows, MoE, MLA, recurrent and hybrid layouts."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from app.core.common.errors import ModelFileError
from app.core.model.architecture import (
    GEMMA3N_KV_LAYERS,
    GEMMA3N_PER_LAYER_WIDTH,
    Architecture,
    IndexerSpec,
    MLASpec,
    MoESpec,
    SSMSpec,
)
from app.core.model.gguf_reader import (
    DEFAULT_ALIGNMENT,
    MAX_LAYERS,
    SHORT_ARRAY,
    ArrayInfo,
    GgufHeader,
    header_from_buffer,
    read_gguf_header,
    with_file_buffer,
)
from app.core.model.gguf_split import check_first_part, merge_split_headers, split_part_names
from app.core.model.tensors import TensorInfo


@dataclass(frozen=True, slots=True)
class GgufModel:
    """What FitScope knows about one GGUF file after reading its header."""

    path: Path
    file_size_bytes: int
    architecture: Architecture
    tensors: tuple[TensorInfo, ...]
    file_type: int | None  # general.file_type (llama_ftype), e.g. 15 = Q4_K_M
    name: str
    metadata: Mapping[str, Any] = field(repr=False)
    tokenizer_model: str | None
    vocab_size: int
    version: int = 3
    alignment: int = DEFAULT_ALIGNMENT
    data_offset: int = 0  # where the tensor data starts

    @property
    def weights_bytes(self) -> int:
        """Bytes of all tensor data (what llama.cpp loads as model weights)."""
        return sum(t.n_bytes for t in self.tensors)

    @property
    def arch(self) -> str:
        return self.architecture.arch


def read_gguf(path: str | Path) -> GgufModel:
    """Read the header of the GGUF file at ``path`` (and of the other parts of a split model, found
    beside it by name). Raises ModelFileError when it cannot."""
    return with_file_buffer(path, _read)


def _read(path: Path, buf: Any, size: int) -> GgufModel:
    header = header_from_buffer(path, buf, size)
    count = check_first_part(header)
    if count > 1:
        parts = split_part_names(path.name, count)
        missing = [name for name in parts[1:] if not (path.parent / name).is_file()]
        if missing:
            raise ModelFileError(
                f"{path} is split into {count} files and {missing[0]} is not beside it; "
                "llama.cpp needs every part in the same folder."
            )
        header = merge_split_headers([header, *(read_gguf_header(path.parent / name) for name in parts[1:])])
    return model_from_header(header)


def model_from_header(header: GgufHeader) -> GgufModel:
    """The model a header describes (a file's, or a split model's merged one). Raises
    ModelFileError for a vision projector or metadata FitScope cannot use."""
    path = header.path
    shown, metadata, tensors = str(path), header.metadata, header.tensors
    if metadata.get("general.architecture") == "clip":
        raise ModelFileError(
            f"{shown} is a vision projector (an mmproj file), not a language model: open the model's own "
            "GGUF file, and add this one as its projector (fitscope estimate --mmproj)."
        )
    try:
        architecture = architecture_from_metadata(path, metadata, tensors)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the model"
        raise ModelFileError(f"{shown} describes a model FitScope cannot use: {where}: {first['msg']}.") from None
    file_type = metadata.get("general.file_type")
    tokenizer_model = metadata.get("tokenizer.ggml.model")
    return GgufModel(
        path=path,
        file_size_bytes=header.file_size_bytes,
        architecture=architecture,
        tensors=tensors,
        file_type=file_type if isinstance(file_type, int) else None,
        name=architecture.name,
        metadata=metadata,
        tokenizer_model=tokenizer_model if isinstance(tokenizer_model, str) else None,
        vocab_size=architecture.n_vocab,
        version=header.version,
        alignment=header.alignment,
        data_offset=header.data_offset,
    )


# llama.cpp's set_swa_pattern(N) for architectures whose GGUF files may omit
# attention.sliding_window_pattern (applies only when a sliding window is set).
ARCH_SWA_PATTERN: dict[str, int] = {
    "gemma2": 2,
    "gemma3": 6,
    "gemma3n": 5,
    "gemma-embedding": 6,
    "cohere2": 4,
    "gpt-oss": 2,
    "llama4": 4,
    "laguna": 4,
}

# Architectures whose SWA period starts with the full-attention layer (set_swa_pattern(n, dense_first)).
ARCH_SWA_DENSE_FIRST = frozenset({"laguna"})

# glm-dsa files with this context and no indexer.types key use llama.cpp's GLM-5.2 layout
# (GLM_5_2_DEFAULT_INDEXER_TYPES, src/models/glm-dsa.cpp).
GLM_5_2_CONTEXT = 1_048_576


def glm_5_2_full_indexer_layers(n_layer: int) -> list[int]:
    """GLM-5.2's indexer layout when its file lists none (GLM_5_2_DEFAULT_INDEXER_TYPES): layers 0-2,
    then every 4th, own an indexer; the others reuse the previous one's choice."""
    return [i for i in range(n_layer) if i < 2 or (i - 2) % 4 == 0]


def model_id_from(text: str) -> str:
    """A catalog-style id: lowercase, runs of other characters turned into '-'."""
    slug = re.sub(r"[^a-z0-9.\-]+", "-", text.lower())
    slug = re.sub(r"-{2,}", "-", slug)
    slug = re.sub(r"^[^a-z0-9]+", "", slug).rstrip("-.")
    return slug


def _params_billions(label: Any) -> float | None:
    """general.size_label such as '270M', '8B' or '1.5B' in billions; None for '8x7B' and the like."""
    if not isinstance(label, str):
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMBT])\s*", label, flags=re.IGNORECASE)
    if not m:
        return None
    scale = {"K": 1e-6, "M": 1e-3, "B": 1.0, "T": 1e3}[m.group(2).upper()]
    value = float(m.group(1)) * scale
    return value if value > 0 else None


class _Meta:
    """Typed access to ``{arch}.*`` keys with messages that name the key and the file."""

    def __init__(self, shown: str, arch: str, metadata: Mapping[str, Any]) -> None:
        self.shown, self.arch, self.md = shown, arch, metadata

    def key(self, suffix: str) -> str:
        return f"{self.arch}.{suffix}"

    def has(self, suffix: str) -> bool:
        return self.key(suffix) in self.md

    def missing(self, suffix: str, why: str = "") -> ModelFileError:
        return ModelFileError(f"{self.shown} has no '{self.key(suffix)}' entry, which a {self.arch} model needs{why}.")

    def maybe(self, suffix: str) -> int | None:
        """The whole number under ``{arch}.suffix``, or None when the file does not have it."""
        key = self.key(suffix)
        if key not in self.md:
            return None
        value = self.md[key]
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or value < 0:
            raise ModelFileError(f"{self.shown}: '{key}' is {value!r}, not a whole number.")
        return int(value)

    def get(self, suffix: str, default: int) -> int:
        value = self.maybe(suffix)
        return default if value is None else value

    def req(self, suffix: str, why: str = "") -> int:
        value = self.maybe(suffix)
        if value is None:
            raise self.missing(suffix, why)
        return value

    def per_layer(self, suffix: str, n_layer: int, default: Any = None, required: bool = False) -> Any:
        """A scalar, or a list with one entry per layer."""
        key = self.key(suffix)
        if key not in self.md:
            if required:
                raise self.missing(suffix)
            return default
        value = self.md[key]
        if isinstance(value, ArrayInfo):
            raise ModelFileError(
                f"{self.shown}: '{key}' has {len(value):,} entries; FitScope reads models of at most "
                f"{SHORT_ARRAY} layers."
            )
        if isinstance(value, list):
            if len(value) != n_layer:
                raise ModelFileError(f"{self.shown}: '{key}' has {len(value)} entries for {n_layer} layers.")
            if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
                raise ModelFileError(f"{self.shown}: '{key}' holds entries that are not whole numbers.")
            return list(value)
        return self.maybe(suffix)


def _first_tensor(tensors: tuple[TensorInfo, ...], *suffixes: str) -> TensorInfo | None:
    for t in tensors:
        if t.name.endswith(suffixes):
            return t
    return None


def _swa_pattern(meta: _Meta, n_layer: int) -> tuple[int | None, bool]:
    """attention.sliding_window_pattern in the project's terms (1 = every layer SWA), and whether its
    period starts with the full-attention layer. A per-layer list is read over the trunk layers only
    (a NextN layer holds no cache in the main context, and Step-3.5's converter pads the MTP layers'
    entries with full attention), in the architecture's own convention first, then the other."""
    key = meta.key("attention.sliding_window_pattern")
    preferred = meta.arch in ARCH_SWA_DENSE_FIRST
    if key not in meta.md:
        return ARCH_SWA_PATTERN.get(meta.arch), preferred
    value = meta.md[key]
    if isinstance(value, bool):
        value = [value] * n_layer
    if isinstance(value, int):
        # llama.cpp: layer il is SWA when n == 0 or il % n < n - 1 (so 0 = all, 1 = none)
        if value == 0:
            return 1, preferred
        return (None if value == 1 else value), preferred
    if isinstance(value, list) and len(value) == n_layer:
        trunk = n_layer - _nextn_layers(meta, n_layer)
        flags = [bool(v) for v in value[:trunk]]
        if all(flags):
            return 1, preferred
        if not any(flags):
            return None, preferred
        for dense_first in (preferred, not preferred):
            for n in range(2, trunk + 1):
                if all(flags[i] == ((i % n != 0) if dense_first else (i % n < n - 1)) for i in range(trunk)):
                    return n, dense_first
        return None, preferred  # a layout the model cannot express: count every layer as full attention
    raise ModelFileError(f"{meta.shown}: '{key}' is {value!r}, which FitScope cannot interpret.")


def architecture_from_metadata(
    path: Path, metadata: Mapping[str, Any], tensors: tuple[TensorInfo, ...]
) -> Architecture:
    """The architecture a GGUF header describes. Raises ModelFileError naming a key it cannot use."""
    shown = str(path)
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelFileError(
            f"{shown} has no 'general.architecture' entry, so FitScope cannot tell what model it holds."
        )
    m = _Meta(shown, arch, metadata)
    names = {t.name for t in tensors}

    n_layer = m.req("block_count")
    if not 1 <= n_layer <= MAX_LAYERS:
        # Checked before any per-layer list is built from it.
        raise ModelFileError(f"{shown} is corrupt: '{m.key('block_count')}' is {n_layer:,} (1 to {MAX_LAYERS:,}).")
    beyond = max((t.layer for t in tensors if t.layer is not None), default=-1)
    if beyond >= n_layer:
        raise ModelFileError(
            f"{shown} is corrupt: it holds tensors of layer {beyond} but '{m.key('block_count')}' "
            f"says {n_layer} layers."
        )
    n_embd = m.req("embedding_length")
    n_ctx_train = m.req("context_length")
    is_ssm = m.has("ssm.conv_kernel") or m.has("ssm.state_size") or arch.startswith("mamba")
    n_expert = m.get("expert_count", 0)
    is_moe = n_expert >= 2

    n_head = m.per_layer("attention.head_count", n_layer, default=0 if is_ssm else None, required=not is_ssm)
    n_head_kv = m.per_layer("attention.head_count_kv", n_layer, default=n_head)
    n_ff = m.per_layer(
        "feed_forward_length",
        n_layer,
        default=0 if (is_ssm or is_moe) else None,
        required=not (is_ssm or is_moe),
    )
    head_dim_k = m.maybe("attention.key_length") or None
    head_dim_v = m.maybe("attention.value_length") or None
    # Sliding-window layers of their own width (Gemma 4: attention.key_length_swa).
    head_dim_k_swa = m.maybe("attention.key_length_swa") or None
    head_dim_v_swa = m.maybe("attention.value_length_swa") or None

    # vocabulary
    n_vocab = m.maybe("vocab_size")
    if not n_vocab:
        tokens = metadata.get("tokenizer.ggml.tokens")
        if isinstance(tokens, (list, ArrayInfo)) and len(tokens):
            n_vocab = len(tokens)
    if not n_vocab:
        embd = next((t for t in tensors if t.name == "token_embd.weight"), None)
        if embd is not None and len(embd.shape) >= 2:
            n_vocab = embd.shape[1]
    if not n_vocab:
        raise ModelFileError(
            f"{shown} does not say how large its vocabulary is (no '{arch}.vocab_size', "
            "no 'tokenizer.ggml.tokens' and no 'token_embd.weight' tensor)."
        )

    # sliding window
    sliding_window = m.maybe("attention.sliding_window") or None
    if arch == "llama4" and m.maybe("attention.sliding_window") != 0:
        # Chunked attention of 8192 tokens unless the file says 0, whatever window it gives
        # (llama_model_llama4::load_arch_hparams).
        sliding_window = 8192
    pattern, dense_first = _swa_pattern(m, n_layer) if sliding_window else (None, False)

    moe = None
    if is_moe:
        n_used = m.req("expert_used_count")
        expert_ff = m.maybe("expert_feed_forward_length")
        if not expert_ff:
            t = _first_tensor(tensors, ".ffn_up_exps.weight", ".ffn_gate_exps.weight")
            if t is not None and len(t.shape) >= 2:
                expert_ff = t.shape[1]
            else:
                t = _first_tensor(tensors, ".ffn_gate_up_exps.weight")
                if t is not None and len(t.shape) >= 2:
                    expert_ff = t.shape[1] // 2
        if not expert_ff and isinstance(n_ff, int) and n_ff > 0:
            expert_ff = n_ff  # Mixtral-style files: every FFN is an expert of feed_forward_length
        if not expert_ff:
            raise m.missing("expert_feed_forward_length", " (and no ffn_up_exps tensor shows it)")
        shexp = _first_tensor(tensors, ".ffn_up_shexp.weight", ".ffn_gate_shexp.weight")
        n_shared = m.maybe("expert_shared_count")
        if n_shared is None:
            n_shared = 1 if shexp is not None else 0
        shared_ff = m.maybe("expert_shared_feed_forward_length") or None
        if shared_ff is None and shexp is not None and len(shexp.shape) >= 2 and n_shared:
            shared_ff = shexp.shape[1]
        moe = MoESpec(
            n_expert=n_expert,
            n_expert_used=n_used,
            expert_ff=expert_ff,
            n_shared_expert=n_shared,
            shared_expert_ff=shared_ff if n_shared else None,
            n_dense_lead_layers=m.get("leading_dense_block_count", _routerless_lead(arch, n_layer, names)),
            layer_step=max(1, m.get("interleave_moe_layer_step", 1)) if arch == "llama4" else 1,
            latent_size=m.maybe("moe_latent_size") or None,
            selection_bias=any(n.endswith((".exp_probs_b.bias", ".exp_probs_b")) for n in names),
        )

    mla = None
    if arch == "deepseek2" or m.has("attention.kv_lora_rank"):
        kv_lora_rank = m.req("attention.kv_lora_rank")
        rope_dims = m.req("rope.dimension_count")
        k_len = m.maybe("attention.key_length_mla") or head_dim_k
        v_len = m.maybe("attention.value_length_mla") or head_dim_v
        if not k_len:
            raise m.missing("attention.key_length_mla", " (or attention.key_length)")
        if not v_len:
            raise m.missing("attention.value_length_mla", " (or attention.value_length)")
        if k_len <= rope_dims:
            raise ModelFileError(f"{shown}: the MLA key width {k_len} is not larger than the RoPE width {rope_dims}.")
        mla = MLASpec(
            q_lora_rank=m.get("attention.q_lora_rank", 0),
            kv_lora_rank=kv_lora_rank,
            qk_rope_head_dim=rope_dims,
            qk_nope_head_dim=k_len - rope_dims,
            v_head_dim=v_len,
        )
        head_dim_k = head_dim_v = None  # the MLA block carries the widths

    ssm = None
    attention_layers = None
    ffn_only_layers = None
    if is_ssm and m.has("kda.head_dim"):
        # Kimi Linear's delta-attention (KDA) layers: per head a head_dim x head_dim state and three
        # short convolutions (q, k, v) of the heads' width, the gated DeltaNet's geometry with one key
        # head per value head (llama_hparams::n_embd_r / n_embd_s for n_embd_head_kda); layers with 0
        # KV heads are KDA (llama_model_kimi_linear::load_arch_hparams).
        head_dim, heads = m.req("kda.head_dim"), n_head if isinstance(n_head, int) else max(n_head)
        ssm = SSMSpec(
            version=2,
            d_conv=m.req("ssm.conv_kernel"),
            d_inner=heads * head_dim,
            d_state=head_dim,
            n_group=heads,
            n_head=heads,
        )
        kv = n_head_kv if isinstance(n_head_kv, list) else [n_head_kv] * n_layer
        attention_layers = [i for i, v in enumerate(kv) if v > 0] or None
    elif is_ssm:
        group_count = m.maybe("ssm.group_count")
        version: Literal[1, 2] = 2 if arch == "mamba2" or group_count is not None else 1
        dt_rank = m.get("ssm.time_step_rank", 0)
        ssm = SSMSpec(
            version=version,
            d_conv=m.req("ssm.conv_kernel"),
            d_inner=m.req("ssm.inner_size"),
            d_state=m.req("ssm.state_size"),
            dt_rank=dt_rank if version == 1 else 0,
            n_group=group_count or 1,
            n_head=dt_rank if version == 2 else 0,  # Mamba-2 stores its head count as time_step_rank
        )
        kv = n_head_kv if isinstance(n_head_kv, list) else [n_head_kv] * n_layer
        attention_layers = [i for i, v in enumerate(kv) if v > 0] or None
        if m.has("attention.recurrent_layers") or m.has("full_attention_interval"):
            attention_layers = _full_attention_layers(m, n_layer, _nextn_layers(m, n_layer))
        if arch in ("nemotron_h", "nemotron_h_moe") and isinstance(n_ff, list):
            # Each block is one of Mamba-2, attention or MLP: layers with a feed-forward width are MLPs
            # (llama_model_nemotron_h::load_arch_hparams).
            ffn_only_layers = [i for i, f in enumerate(n_ff) if f > 0] or None
    conv_l_cache = m.maybe("shortconv.l_cache") or None
    if conv_l_cache is not None:
        if conv_l_cache < 2:
            raise ModelFileError(f"{shown}: '{m.key('shortconv.l_cache')}' is {conv_l_cache} (at least 2).")
        # LFM2: layers with 0 KV heads are short convolutions (llama_model_lfm2::load_arch_hparams).
        kv = n_head_kv if isinstance(n_head_kv, list) else [n_head_kv] * n_layer
        attention_layers = [i for i, v in enumerate(kv) if v > 0]

    indexer = _indexer(m, n_layer, n_ctx_train)
    # Gemma 4's full-attention layers with no V projection attend with K as V (attention_k_eq_v).
    k_is_v = arch == "gemma4" and any(
        f"blk.{i}.attn_k.weight" in names and f"blk.{i}.attn_v.weight" not in names for i in range(n_layer)
    )

    n_kv_shared = m.get("attention.shared_kv_layers", 0)
    n_embd_per_layer = m.get("embedding_length_per_layer_input", 0)
    if arch == "gemma3n":
        # llama.cpp fixes these for Gemma 3n (llama_model_gemma3n::load_arch_hparams, llama_hparams).
        n_kv_shared = max(0, n_layer - GEMMA3N_KV_LAYERS)
        n_embd_per_layer = GEMMA3N_PER_LAYER_WIDTH

    name = metadata.get("general.name")
    if not isinstance(name, str) or not name.strip():
        name = path.stem
    model_id = model_id_from(name) or model_id_from(path.stem) or "model"

    return Architecture(
        id=model_id,
        name=name.strip(),
        arch=arch,
        source=shown,
        params_billions=_params_billions(metadata.get("general.size_label")),
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        head_dim_k_swa=head_dim_k_swa if sliding_window else None,
        head_dim_v_swa=head_dim_v_swa if sliding_window else None,
        full_attention_k_is_v=k_is_v,
        n_kv_shared_layers=n_kv_shared,
        n_embd_per_layer=n_embd_per_layer,
        swa_dense_first=dense_first and pattern is not None,
        indexer=indexer,
        n_ff=n_ff,
        n_vocab=n_vocab,
        tied_embeddings="output.weight" not in names,
        n_ctx_train=n_ctx_train,
        sliding_window=sliding_window,
        sliding_window_pattern=pattern,
        attn_bias=any(n.endswith((".attn_q.bias", ".attn_qkv.bias")) for n in names),
        qk_norm=any(n.endswith(".attn_q_norm.weight") for n in names),
        moe=moe,
        mla=mla,
        ssm=ssm,
        attention_layers=attention_layers,
        n_nextn_layers=_nextn_layers(m, n_layer),
        conv_l_cache=conv_l_cache,
        ffn_only_layers=ffn_only_layers,
    )


# Architectures whose graph runs a layer's experts where its file has a router (ffn_gate_inp) and a dense
# FFN elsewhere, whatever the metadata says (llama_model_hy_v3 / llama_model_step35::graph); HY V3's
# converter writes no leading_dense_block_count.
ROUTER_BY_TENSOR = frozenset({"hy_v3", "step35"})


def _routerless_lead(arch: str, n_layer: int, names: set[str]) -> int:
    """The leading layers without a router, for ROUTER_BY_TENSOR architectures (0 for the others)."""
    if arch not in ROUTER_BY_TENSOR:
        return 0
    return next((i for i in range(n_layer) if f"blk.{i}.ffn_gate_inp.weight" in names), n_layer)


def _indexer(m: _Meta, n_layer: int, n_ctx_train: int) -> IndexerSpec | None:
    """DeepSeek sparse attention's indexer (attention.indexer.*), with the layers that own one
    (attention.indexer.types; GLM-5.2's default layout for glm-dsa files without it), or MiniMax
    sparse attention's with its block size."""
    if not m.has("attention.indexer.head_count"):
        return None
    trunk = n_layer - _nextn_layers(m, n_layer)
    full = None
    flags = m.md.get(m.key("attention.indexer.types"))
    if isinstance(flags, list) and flags:
        full = [i for i, v in enumerate(flags) if v]
    elif m.arch == "glm-dsa" and n_ctx_train >= GLM_5_2_CONTEXT:
        full = glm_5_2_full_indexer_layers(trunk)
    return IndexerSpec(
        n_head=m.req("attention.indexer.head_count"),
        head_dim=m.req("attention.indexer.key_length"),
        top_k=m.req("attention.indexer.top_k"),
        full_layers=full,
        # MiniMax sparse attention ranks blocks of positions (llama_model_minimax_m3::load_arch_hparams).
        block_size=m.maybe("attention.indexer.block_size") or None,
        local_blocks=m.get("attention.indexer.local_blocks", 0),
    )


def _full_attention_layers(m: _Meta, n_layer: int, n_nextn: int) -> list[int]:
    """Qwen3-Next style layouts: ``attention.recurrent_layers`` flags, else every
    ``full_attention_interval``-th layer is full attention; NextN layers are never recurrent
    (llama_model_qwen3next::load_arch_hparams)."""
    key = m.key("attention.recurrent_layers")
    flags = m.md.get(key)
    if isinstance(flags, list) and len(flags) == n_layer:
        recurrent = [bool(v) for v in flags]
    else:
        interval = m.get("full_attention_interval", 4)
        if interval < 1:
            raise ModelFileError(f"{m.shown}: '{m.key('full_attention_interval')}' is {interval}.")
        recurrent = [(i + 1) % interval != 0 for i in range(n_layer)]
    trunk = n_layer - n_nextn
    return [i for i in range(n_layer) if not (i < trunk and recurrent[i])]


def _nextn_layers(m: _Meta, n_layer: int) -> int:
    n = m.get("nextn_predict_layers", 0)
    if not 0 <= n < n_layer:
        raise ModelFileError(f"{m.shown}: '{m.key('nextn_predict_layers')}' is {n} for {n_layer} layers.")
    return n
