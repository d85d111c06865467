"""The KV cache a decoded token reads: every cell of the full-attention cache up to the depth, and no
more than the window of a sliding-window cache (Gemma 4 at 128k reads its 10 full layers' cache and
50 small window caches, not 60 layers' worth of 64k tokens)."""

from __future__ import annotations

from app.core.memory.estimate import estimate
from app.core.memory.records import Settings
from app.core.memory.targets import host_ram_target
from app.core.model.catalog import find_model
from app.core.model.quant import quantize_layout
from app.core.speed.reads import attention_flops, kv_read_bytes

GIB = 1 << 30


def _estimate(model_id: str, context: int):
    arch = find_model(model_id)
    tensors = quantize_layout(arch, "Q4_K_M")
    return estimate(arch, tensors, Settings(context_tokens=context, swa_full=False), [host_ram_target(512 * GIB, 100)])


def test_a_sliding_window_cache_is_read_up_to_its_window() -> None:
    est = _estimate("gemma-4-31b", 131072)
    full = next(c for c in est.kv_caches if c.kind == "full")
    swa = next(c for c in est.kv_caches if c.kind == "swa")
    assert swa.cells < 4096
    # Half-way through the context: half the full cache and the whole window cache, never more than
    # the cache holds.
    read = kv_read_bytes(est, 65536)
    assert read == full.total_bytes / 2 + swa.total_bytes
    assert kv_read_bytes(est, 131072) == sum(c.total_bytes for c in est.kv_caches)
    # Below the window both caches grow with the depth.
    assert kv_read_bytes(est, 512) == (full.total_bytes / full.cells + swa.total_bytes / swa.cells) * 512


def test_a_full_attention_cache_is_read_in_proportion_to_the_depth() -> None:
    est = _estimate("llama-3.1-8b", 32768)
    (cache,) = est.kv_caches
    assert kv_read_bytes(est, 16384) == cache.total_bytes / 2
    # 32 layers x 8 KV heads x 128 x (K + V) x 2 bytes per token
    assert kv_read_bytes(est, 1) == 32 * 8 * 128 * 2 * 2


def test_a_sliding_window_layer_attends_over_its_window_only() -> None:
    est = _estimate("gemma-4-31b", 131072)
    arch = find_model("gemma-4-31b")
    swa = next(c for c in est.kv_caches if c.kind == "swa")
    full_layers = [i for i in range(arch.n_layer) if not arch.is_swa_layer(i)]
    assert len(full_layers) == 10
    per_layer = {i: 4 * arch.heads(i) * arch.head_dim_k_at(i) for i in range(arch.n_layer)}
    # Half-way through 128k: the 10 full layers over 65,536 cells, the 50 window layers over their
    # 1,536 cells each; at 512 tokens every layer over 512.
    expected = sum(per_layer[i] * (65536 if i in full_layers else swa.cells) for i in range(arch.n_layer))
    assert attention_flops(arch, est, 65536) == expected
    assert attention_flops(arch, est, 512) == sum(per_layer.values()) * 512
