"""How fast a placed model runs: decode from the memory-bandwidth roofline, prefill from FLOPs.

Decode is memory-bound: each new token reads every active weight once plus the KV cache up to
the current depth, so tokens/s <= efficiency x bandwidth / bytes read. Mixture-of-experts models
read only the routed share of their expert tensors. With partial offload, each device reads its
own share and the times add up. Prefill is compute-bound: about 2 FLOPs per active parameter per
token, plus attention over the context.

Every figure is a range (low-high) whose bounds come from the efficiency ranges below, observed
for llama.cpp in public benchmarks; a later measurement on the user's machine narrows them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.core.architecture import Architecture
from app.core.estimate import Estimate, Settings, Target, tensor_totals
from app.core.tensors import TensorInfo

# Share of the bandwidth roofline llama.cpp reaches in decode, by device class.
DECODE_EFFICIENCY: dict[str, tuple[float, float]] = {
    "nvidia": (0.50, 0.75),
    "amd": (0.45, 0.70),
    "apple": (0.55, 0.80),
    "cpu": (0.70, 0.90),  # of a measured read bandwidth
    "host-spec": (0.30, 0.60),  # of a DRAM spec-sheet peak (host memory of hardware not measured)
}
# Share of dense FP16 throughput reached in prefill (quantized matmuls dequantize on the fly).
PREFILL_EFFICIENCY: dict[str, tuple[float, float]] = {
    "nvidia": (0.25, 0.55),
    "amd": (0.15, 0.40),
    "apple": (0.30, 0.60),
    "cpu": (0.25, 0.55),
    "host-spec": (0.25, 0.55),
}
# Fixed cost per decoded token (kernel launches, sampling), seconds: (best case, worst case).
PER_TOKEN_OVERHEAD_S: dict[str, tuple[float, float]] = {
    "nvidia": (0.0003, 0.0015),
    "amd": (0.0005, 0.002),
    "apple": (0.0005, 0.002),
    "cpu": (0.0001, 0.0008),
    "host-spec": (0.0001, 0.0008),
}


@dataclass(frozen=True)
class Range:
    low: float
    high: float

    def as_dict(self) -> dict[str, float]:
        return {"low": round(self.low, 2), "high": round(self.high, 2)}


@dataclass(frozen=True)
class SpeedEstimate:
    decode_tokens_per_s: Range
    prefill_tokens_per_s: Range
    ttft_s: Range
    prompt_tokens: int
    depth_tokens: int
    assumptions: tuple[str, ...]


def active_bytes_by_device(arch: Architecture, tensors: Sequence[TensorInfo], est: Estimate) -> list[float]:
    """Weight bytes read per decoded token on each device of ``est`` (same order)."""
    out = [0.0] * len(est.devices)
    totals = tensor_totals(arch, tensors)
    host = len(est.devices) - 1
    for layer, n_bytes in enumerate(totals.active_layer_bytes):
        device = est.layer_devices[layer]
        if layer < est.cpu_moe_layers and device != host:
            # --n-cpu-moe: this layer's routed experts are read from host memory.
            moved = totals.active_expert_bytes[layer]
            out[host] += moved
            n_bytes -= moved
        out[device] += n_bytes
    return out


def active_params(arch: Architecture, tensors: Sequence[TensorInfo]) -> float:
    """Parameters touched per token (routed share of experts; embedding lookup excluded)."""
    return tensor_totals(arch, tensors).active_params


def kv_bytes_per_token(est: Estimate) -> float:
    """KV-cache bytes one token of context adds (both caches, one sequence)."""
    total = 0.0
    for cache in est.kv_caches:
        cells = cache.cells * cache.streams
        if cells:
            total += cache.total_bytes / cells
    return total


def estimate_speed(
    arch: Architecture,
    tensors: Sequence[TensorInfo],
    est: Estimate,
    targets: list[Target],
    prompt_tokens: int = 512,
    depth_tokens: int | None = None,
    measured_efficiency: dict[str, float] | None = None,
) -> SpeedEstimate:
    """Decode and prefill tokens/s ranges and time to first token for ``prompt_tokens``.

    ``depth_tokens`` is the context already in the cache when decoding (default: the prompt).
    ``measured_efficiency`` maps a target name to a decode efficiency measured on this machine,
    which then replaces the class range (±10%).
    """
    settings: Settings = est.settings
    depth = prompt_tokens if depth_tokens is None else depth_tokens
    by_name = {t.name: t for t in targets}
    weights = active_bytes_by_device(arch, tensors, est)
    kv_per_token = kv_bytes_per_token(est)
    n_attn_layers = sum(1 for i in range(arch.n_layer) if arch.is_attention_layer(i)) or 1
    assumptions = []

    t_low = t_high = 0.0  # seconds per token, optimistic / pessimistic
    flops_rate_low = flops_rate_high = 0.0
    busy_devices = 0
    for d, w in zip(est.devices, weights, strict=True):
        target = by_name.get(d.name)
        if target is None or (w == 0 and d.kind == "gpu"):
            continue
        cls = target.efficiency_class
        eff_lo, eff_hi = DECODE_EFFICIENCY[cls]
        if measured_efficiency and d.name in measured_efficiency:
            m = measured_efficiency[d.name]
            eff_lo, eff_hi = m * 0.9, min(1.0, m * 1.1)
            assumptions.append(f"{d.name}: decode efficiency {m:.2f} measured on this machine.")
        kv_share = kv_per_token * depth * (d.layers / n_attn_layers)
        bytes_read = w + kv_share
        bw = target.bandwidth_gb_s * 1e9
        over_lo, over_hi = PER_TOKEN_OVERHEAD_S[cls]
        t_low += bytes_read / (eff_hi * bw) + over_lo
        t_high += bytes_read / (eff_lo * bw) + over_hi
        p_lo, p_hi = PREFILL_EFFICIENCY[cls]
        flops_rate_low += p_lo * target.fp16_tflops * 1e12 * (w / max(sum(weights), 1))
        flops_rate_high += p_hi * target.fp16_tflops * 1e12 * (w / max(sum(weights), 1))
        busy_devices += 1
        assumptions.append(
            f"{d.name}: reads {w / 1e9:.2f} GB of weights per token at {target.bandwidth_gb_s:.0f} GB/s, "
            f"efficiency {eff_lo:.2f}-{eff_hi:.2f}."
        )
    decode = Range(1.0 / t_high if t_high else 0.0, 1.0 / t_low if t_low else 0.0)

    params = active_params(arch, tensors)
    head_dim = arch.head_dim_k_eff if arch.mla is None else arch.mla.kv_lora_rank
    attn_flops = 4 * n_attn_layers * arch.max_heads() * head_dim * (prompt_tokens / 2)
    flops_per_token = 2 * params + attn_flops
    prefill = (
        Range(flops_rate_low / flops_per_token, flops_rate_high / flops_per_token) if busy_devices else Range(0, 0)
    )
    if prefill.high and decode.high:
        # Prefill can never be slower per token than decoding the same tokens one by one.
        prefill = Range(max(prefill.low, decode.low), max(prefill.high, decode.high))
    ttft = Range(
        prompt_tokens / prefill.high + 1 / max(decode.high, 1e-9) if prefill.high else 0.0,
        prompt_tokens / prefill.low + 1 / max(decode.low, 1e-9) if prefill.low else 0.0,
    )
    assumptions.append(
        f"Decode at a depth of {depth} tokens (KV read {kv_per_token * depth / 1e6:.1f} MB per token); "
        f"prefill of {prompt_tokens} tokens at {flops_per_token / 1e9:.1f} GFLOP per token; ubatch "
        f"{settings.effective_ubatch}."
    )
    if arch.moe:
        assumptions.append(
            f"Mixture of experts: {arch.moe.n_expert_used} of {arch.moe.n_expert} experts read per token."
        )
    return SpeedEstimate(decode, prefill, ttft, prompt_tokens, depth, tuple(assumptions))
