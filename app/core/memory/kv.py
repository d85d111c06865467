"""The KV cache and the recurrent state llama.cpp allocates: cells per stream, the caches a model
gets (one, or a full and a sliding-window one), their bytes per layer, and the graph's masks.

Follows ``llama_kv_cache`` / ``llama_kv_cache_iswa`` (src/llama-kv-cache*.cpp), ``llama_context``'s
padding of the context (src/llama-context.cpp) and ``llama_memory_recurrent`` of the llama.cpp
vendored by llama-cpp-python 0.3.36."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, TypeVar, cast

from app.core.common.errors import EstimateError
from app.core.common.units import pad_to
from app.core.memory.records import TOTALS_CACHE_SIZE, KVCacheDetail, Settings
from app.core.model.architecture import Architecture
from app.core.model.tensors import CACHE_TYPES, GGMLType, is_quantized, row_bytes


def cache_type(name: str) -> GGMLType:
    return CACHE_TYPES[name]


def context_cells(settings: Settings) -> tuple[int, int]:
    """(cells per stream, streams) of the KV cache, as llama_context pads them."""
    n_ctx = pad_to(settings.context_tokens, 256)
    if settings.kv_unified:
        return n_ctx, 1
    n_seq = settings.parallel_sequences
    per_seq = pad_to(n_ctx // n_seq, 256)
    return per_seq, n_seq


def _kv_layer_widths(arch: Architecture, layer: int) -> tuple[int, int]:
    """(K elements, V elements) per cell for one layer; (0, 0) for a layer without KV."""
    if arch.is_nextn_layer(layer):
        # The main context's cache skips NextN layers (filter il < n_layer(), llama_model::create_memory).
        return 0, 0
    if not arch.has_own_kv(layer):
        # Shared-KV layers (Gemma 3n / 4) read an earlier layer's cache (hparams.has_kv, the reuse callback).
        return 0, 0
    if arch.mla is not None:
        # One latent + RoPE row per cell and no V; hybrids (Kimi Linear) only on their attention layers.
        if not arch.is_attention_layer(layer):
            return 0, 0
        return arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim, 0
    n_kv = arch.kv_heads(layer)
    # Head widths may differ between sliding-window and full layers (n_embd_head_k(il), Gemma 4).
    return n_kv * arch.head_dim_k_at(layer), n_kv * arch.head_dim_v_at(layer)


_WIDTHS_CACHE: dict[int, tuple[Architecture, tuple[tuple[int, int], ...]]] = {}


def kv_widths(arch: Architecture) -> tuple[tuple[int, int], ...]:
    """``_kv_layer_widths`` of every layer, remembered per architecture object (they are frozen)."""
    hit = _WIDTHS_CACHE.get(id(arch))
    if hit is not None and hit[0] is arch:
        return hit[1]
    widths = tuple(_kv_layer_widths(arch, i) for i in range(arch.n_layer))
    if len(_WIDTHS_CACHE) >= TOTALS_CACHE_SIZE:
        _WIDTHS_CACHE.pop(next(iter(_WIDTHS_CACHE)))
    _WIDTHS_CACHE[id(arch)] = (arch, widths)
    return widths


def graph_key(settings: Settings) -> tuple[object, ...]:
    """The settings that shape llama.cpp's worst-case graph (not where its layers go)."""
    return (
        settings.context_tokens,
        settings.batch_tokens,
        settings.ubatch_tokens,
        settings.flash_attn,
        settings.cache_type_k,
        settings.cache_type_v,
        settings.parallel_sequences,
        settings.kv_unified,
        settings.swa_full,
        settings.consumer,
    )


_MEMO: dict[tuple[object, ...], tuple[object, object]] = {}
_Made = TypeVar("_Made")


def memo_per_object(owner: object, key: tuple[object, ...], make: Callable[[], _Made]) -> _Made:
    """``make()`` remembered per ``owner`` object (by identity: records are frozen) and ``key``."""
    full_key = (id(owner), *key)
    hit = _MEMO.get(full_key)
    if hit is not None and hit[0] is owner:
        return cast(_Made, hit[1])
    value = make()
    if len(_MEMO) >= 64 * TOTALS_CACHE_SIZE:
        _MEMO.pop(next(iter(_MEMO)))
    _MEMO[full_key] = (owner, value)
    return value


def memo_per_arch(arch: Architecture, key: tuple[object, ...], make: Callable[[], _Made]) -> _Made:
    """``make()`` remembered per architecture object and ``key``: the sweeps behind one chart ask
    the same per-layer questions thousands of times."""
    return memo_per_object(arch, key, make)


def kv_caches(arch: Architecture, settings: Settings) -> list[tuple[KVCacheDetail, list[int]]]:
    """The KV caches llama.cpp creates, each with the layers it holds (callers must not change them).

    Raises EstimateError for a quantized V cache without flash attention (llama.cpp refuses it).
    """
    key = (
        "kv",
        settings.context_tokens,
        settings.parallel_sequences,
        settings.kv_unified,
        settings.swa_full,
        settings.flash_attn,
        settings.cache_type_k,
        settings.cache_type_v,
        settings.effective_ubatch,
    )
    return memo_per_arch(arch, key, lambda: _kv_caches(arch, settings))


def _kv_caches(arch: Architecture, settings: Settings) -> list[tuple[KVCacheDetail, list[int]]]:
    type_k, type_v = cache_type(settings.cache_type_k), cache_type(settings.cache_type_v)
    if is_quantized(type_v) and not settings.flash_attn:
        raise EstimateError(
            "A quantized V cache needs flash attention: llama.cpp refuses -ctv "
            f"{settings.cache_type_v} with -fa off. Turn flash attention on or use an f16 V cache."
        )
    cells, streams = context_cells(settings)
    widths = kv_widths(arch)
    layers = [i for i in range(arch.n_layer) if any(widths[i])]
    if not layers:
        return []
    v_trans = not settings.flash_attn
    v_width_max = max(widths[i][1] for i in layers)

    def build(
        kind: Literal["full", "swa", "indexer"], group: list[int], n_cells: int
    ) -> tuple[KVCacheDetail, list[int]]:
        k_bytes = v_bytes = 0
        for i in group:
            k_w, v_w = widths[i]
            k_bytes += row_bytes(type_k, k_w) * n_cells * streams
            if v_w:
                width = v_width_max if v_trans else v_w
                v_bytes += row_bytes(type_v, width) * n_cells * streams
        detail = KVCacheDetail(
            kind=kind, cells=n_cells, streams=streams, layers=len(group), k_bytes=k_bytes, v_bytes=v_bytes
        )
        return detail, group

    swa_layers = [i for i in layers if arch.is_swa_layer(i)]
    if not swa_layers:
        return [build("full", layers, cells), *_indexer_cache(arch, cells, streams, type_k, type_v)]
    full_layers = [i for i in layers if not arch.is_swa_layer(i)]
    assert arch.sliding_window is not None
    n_seq = settings.parallel_sequences
    swa_cells = cells
    if not settings.swa_full:
        window = arch.sliding_window * (n_seq if settings.kv_unified else 1) + settings.effective_ubatch
        swa_cells = pad_to(min(cells, window), 256)
    out = []
    if full_layers:
        out.append(build("full", full_layers, cells))
    out.append(build("swa", swa_layers, swa_cells))
    return out


def _indexer_cache(
    arch: Architecture, cells: int, streams: int, type_k: GGMLType, type_v: GGMLType
) -> list[tuple[KVCacheDetail, list[int]]]:
    """DeepSeek sparse attention's indexer key cache: one key of indexer.head_dim per token and layer, in
    the K cache type, no V, on the trunk layers that own an indexer (llama_kv_cache_dsa's kv_lid, built
    with one KV head of indexer_head_size; filter_lid in llama_model::create_memory).

    MiniMax sparse attention's (MiniMax-M3) is a whole second llama_kv_cache over the layers after the
    dense lead (filter_idx in llama_model::create_memory): the model's hyper-parameters with one KV head
    and a key of indexer.head_dim, so beside each indexer key it holds a one-head value of the model's
    value width, in the V cache type (llama_kv_cache_msa's constructor; the model is not MLA, so the
    cache has V)."""
    ix = arch.indexer
    if ix is None:
        return []
    if ix.block_size is not None:
        lead = arch.moe.n_dense_lead_layers if arch.moe is not None else 0
        group = list(range(lead, arch.n_layer - arch.n_nextn_layers))
        v_bytes = row_bytes(type_v, arch.head_dim_v_eff) * cells * streams * len(group)
    else:
        trunk = arch.n_layer - arch.n_nextn_layers
        group = [i for i in range(trunk) if ix.full_layers is None or i in ix.full_layers]
        v_bytes = 0
    k_bytes = row_bytes(type_k, ix.head_dim) * cells * streams * len(group)
    detail = KVCacheDetail(
        kind="indexer", cells=cells, streams=streams, layers=len(group), k_bytes=k_bytes, v_bytes=v_bytes
    )
    return [(detail, group)]


def recurrent_state_bytes_per_layer(arch: Architecture, settings: Settings) -> int:
    """Mamba conv + SSM state, or a short convolution's history (f32), for every sequence, one layer
    (llama_hparams::n_embd_r / n_embd_s; llama_memory_recurrent keeps max(1, n_seq_max) rows)."""
    n_seq = max(1, settings.parallel_sequences)
    if arch.conv_l_cache is not None:
        return arch.n_embd * (arch.conv_l_cache - 1) * 4 * n_seq
    ssm = arch.ssm
    if ssm is None:
        return 0
    conv = (ssm.d_conv - 1) * (ssm.d_inner + 2 * ssm.n_group * ssm.d_state)
    state = ssm.d_state * ssm.d_inner
    return (conv + state) * 4 * n_seq


def mask_bytes(settings: Settings, caches: Sequence[KVCacheDetail]) -> int:
    """The graph's attention masks: one per KV cache, n_kv x n_ubatch, f16 with flash attention and
    f32 without (``build_attn_inp_kq_mask``, src/llama-graph.cpp)."""
    n_ub = settings.graph_tokens
    per = 2 if settings.flash_attn else 4
    return sum(c.cells * n_ub * per for c in caches)


def shared_kv_copy_bytes(
    arch: Architecture, caches: Sequence[tuple[KVCacheDetail, list[int]]], layer_dev: Sequence[int]
) -> dict[int, int]:
    """Per device, the bytes of the KV copies its shared-KV layers (Gemma 3n / 4) need when the layer
    whose cache they read is on another device.

    A shared layer attends over a view of its source layer's K and V (the reuse callback in
    llama_model::create_memory: the last sliding-window layer with a cache for sliding-window layers,
    the last full one for the others). Where that cache is in another device's memory, ggml-backend's
    scheduler copies each layer's views into the device running the attention, and allocates every
    input of a split at its start (ggml_backend_sched_split_graph), so the copies of all its shared
    layers are alive together below the first layer's own intermediates: one source layer's whole
    cache per shared layer."""
    start = arch.n_layer - arch.n_kv_shared_layers
    per_layer = {i: layer_cache_bytes(detail, group) for detail, group in caches for i in group}
    copies: dict[int, int] = {}
    for i in range(start, arch.n_layer):
        src = start - (2 if arch.is_swa_layer(i) else 1)
        if layer_dev[i] != layer_dev[src]:
            copies[layer_dev[i]] = copies.get(layer_dev[i], 0) + per_layer.get(src, 0)
    return copies


def layer_cache_bytes(detail: KVCacheDetail, group: Sequence[int]) -> int:
    """One layer's K and V bytes in a cache holding ``group``'s layers (each of the same width)."""
    return detail.k_bytes // max(1, len(group)) + detail.v_bytes // max(1, len(group))
