"""The KV cache a decoded token reads: every cell of the full-attention cache up to the depth, and no
more than the window of a sliding-window cache (Gemma 4 at 128k reads its 10 full layers' cache and
50 small window caches, not 60 layers' worth of 64k tokens)."""

from __future__ import annotations

from app.core.memory.estimate import estimate
from app.core.memory.records import Settings
from app.core.memory.targets import host_ram_target
from app.core.model.catalog import find_model
from app.core.model.quant import quantize_layout
from app.core.speed.predict import attention_flops, kv_read_bytes

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
    full = next(c for c in est.kv_caches if c.kind == "full")
    swa = next(c for c in est.kv_caches if c.kind == "swa")
    assert (full.layers, swa.layers) == (10, 50)
    arch = find_model("gemma-4-31b")
    deep, shallow = attention_flops(arch, est, 65536), attention_flops(arch, est, 512)
    # Half-way through 128k the window layers add only their 1,536 cells each: the full layers dominate.
    per_cell = deep / (10 * 65536 + 50 * swa.cells)
    assert shallow == per_cell * 60 * 512
