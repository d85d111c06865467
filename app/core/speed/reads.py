"""What a decoded token and a prompt ubatch read and compute on each device of a placed estimate:
weight bytes (a mixture of experts' routed share, or the union several users' tokens route to), the
parameters computed, the KV-cache bytes read at a depth and the attention FLOPs over it, and the mix
of weight formats the kernels see. Pure figures of the model and the placement; ``predict`` turns
them into time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from app.core.memory.kv import cache_type, memo_per_object
from app.core.memory.layers import TensorTotals, device_runs, tensor_totals
from app.core.memory.records import Estimate
from app.core.model.architecture import Architecture
from app.core.model.tensors import BLOCK, TensorInfo
from app.core.speed.model import expert_coverage, weight_format


@dataclass(frozen=True)
class Placement:
    """What one decoded token and one prompt ubatch touch on each device of an estimate (same order
    as ``Estimate.devices``; the host is last)."""

    bytes_per_token: tuple[float, ...]  # weight bytes one decode step reads (of ``rows`` tokens; default one)
    params_per_token: tuple[float, ...]  # parameters computed per decoded token
    host_layers: int  # layers with host-resident weights, in a run with GPUs
    copy_bytes: float  # host-resident weight bytes one ubatch copies to GPU 0 (op offload)
    ubatch_bytes: tuple[float, ...] = ()  # weight bytes one prompt ubatch reads on each device

    @property
    def hybrid(self) -> bool:
        return self.host_layers > 0 and len(self.bytes_per_token) > 1 and self.bytes_per_token[-1] > 0


def placement(
    arch: Architecture,
    tensors: Sequence[TensorInfo],
    est: Estimate,
    ubatch_tokens: int,
    routing_exponent: float = 1.0,
    rows: int = 1,
) -> Placement:
    """Bytes and parameters each device of ``est`` handles per decoded token, the layers whose weights
    stay in host memory beside GPUs, the bytes a ``ubatch_tokens`` ubatch copies to GPU 0 (the
    experts it routes to, ``expert_coverage`` at ``routing_exponent``, and every other host-resident
    matrix) and the weight bytes it reads on each device (copied ones are read on GPU 0's side).

    A decode step of ``rows`` users' tokens reads every expert any of them routes to, once: users'
    conversations route independently (``expert_coverage`` at exponent 1), so four users of a mixture of
    experts read more expert bytes per step than one; ``params_per_token`` stays one token's."""
    totals = tensor_totals(arch, tensors)
    n_dev = len(est.devices)
    host = n_dev - 1
    by_bytes = [0.0] * n_dev
    by_params = [0.0] * n_dev
    has_gpu = any(d.kind == "gpu" for d in est.devices)
    moe = arch.moe
    coverage = expert_coverage(ubatch_tokens, moe.n_expert_used, moe.n_expert, routing_exponent) if moe else 1.0
    by_ubatch = [0.0] * n_dev
    host_layers = 0
    copy = 0.0
    sums = _layer_sums(arch, totals)
    step_share = expert_coverage(rows, moe.n_expert_used, moe.n_expert) if moe and rows > 1 else 0.0
    expert_active = totals.active_expert_bytes or (0.0,) * (arch.n_layer + 1)
    expert_bytes = totals.expert_bytes or (0,) * (arch.n_layer + 1)

    def span(name: str, first: int, end: int) -> float:
        column = sums[name]
        return column[end] - column[first]

    # The experts one decode step reads: the token's own, or the union of the rows' choices.
    steps = sums["expert_active"]
    if step_share:
        steps = memo_per_object(
            totals,
            ("step-sums", step_share),
            lambda: list(
                accumulate(
                    (max(expert_active[i], expert_bytes[i] * step_share) for i in range(arch.n_layer + 1)),
                    initial=0.0,
                )
            ),
        )

    def step(first: int, end: int) -> float:
        return steps[end] - steps[first]

    cut = est.cpu_moe_layers
    for device, first, end in device_runs(est.layer_devices):
        parts = [(first, end, False)]
        if device != host and first < cut:
            # --n-cpu-moe: these layers' routed experts are read (and computed) from host memory.
            parts = [(first, min(end, cut), True), (min(end, cut), end, False)]
        for a, b, moved in parts:
            if a >= b:
                continue
            experts = step(a, b)
            own = span("active", a, b) - span("expert_active", a, b)
            dense = span("dense", a, b)
            if moved:
                by_bytes[host] += experts
                by_params[host] += span("expert_params", a, b)
                by_bytes[device] += own
                by_params[device] += span("params", a, b) - span("expert_params", a, b)
                host_layers += b - a
                copy += span("expert_bytes", a, b) * coverage
                by_ubatch[device] += dense
                continue
            by_bytes[device] += own + experts
            by_params[device] += span("params", a, b)
            if device == host and has_gpu:
                host_layers += b - a
                copy += dense + span("expert_bytes", a, b) * coverage
            else:
                by_ubatch[device] += dense + span("expert_bytes", a, b) * coverage
    return Placement(tuple(by_bytes), tuple(by_params), host_layers, copy, tuple(by_ubatch))


def _layer_sums(arch: Architecture, totals: TensorTotals) -> dict[str, list[float]]:
    """Prefix sums over the placement layers (0..n_layer) of what ``placement`` adds up per run of one
    device's layers, remembered per tensor totals: a decode token's bytes and parameters, its routed
    experts' share of them, the experts' whole bytes, and the dense weights a ubatch reads (the tied
    head reading the token embedding)."""

    def make() -> dict[str, list[float]]:
        n = arch.n_layer + 1
        dense = [totals.layer_bytes[i] - (totals.expert_bytes[i] if totals.expert_bytes else 0) for i in range(n)]
        if not totals.has_output:
            dense[arch.n_layer] += totals.token_embd_bytes
        columns = {
            "active": totals.active_layer_bytes,
            "expert_active": totals.active_expert_bytes or (0.0,) * n,
            "expert_bytes": totals.expert_bytes or (0,) * n,
            "expert_params": totals.active_expert_params or (0.0,) * n,
            "params": totals.active_layer_params or (0.0,) * n,
            "dense": dense,
        }
        return {name: list(accumulate(values, initial=0.0)) for name, values in columns.items()}

    return memo_per_object(totals, ("layer-sums",), make)


def active_bytes_by_device(arch: Architecture, tensors: Sequence[TensorInfo], est: Estimate) -> list[float]:
    """Weight bytes read per decoded token on each device of ``est`` (same order)."""
    return list(placement(arch, tensors, est, est.settings.effective_ubatch).bytes_per_token)


def active_params(arch: Architecture, tensors: Sequence[TensorInfo]) -> float:
    """Parameters touched per token (routed share of experts; embedding lookup excluded)."""
    return tensor_totals(arch, tensors).active_params


def kv_read_bytes(est: Estimate, depth_tokens: int, as_f16: bool = False) -> float:
    """KV-cache bytes one decoded token reads at ``depth_tokens`` of context (both caches, one
    sequence): each cache's bytes per cell over the cells it holds at that depth, so a sliding-window
    cache never reads more than its window. ``as_f16``: what an f16 cache would read, for the CPU
    backend, whose flash attention converts a quantized K/V tile to float before using it, so that a
    smaller cache saves reads but not time (on this machine, q4_0 and q8_0 caches decoded 18% and 15%
    slower than f16 with the demo model)."""
    total = 0.0
    for cache in est.kv_caches:
        cells = cache.cells * cache.streams
        if cells:
            total += cache.total_bytes / cells * min(max(depth_tokens, 0), cache.cells)
    if as_f16:
        s = est.settings
        total *= 2 / ((_element_bytes(s.cache_type_k) + _element_bytes(s.cache_type_v)) / 2)
    return total


def attention_flops(arch: Architecture, est: Estimate, depth_tokens: int) -> float:
    """A token's attention FLOPs (QK^T and AV over each attention layer's heads) at ``depth_tokens``
    of context: a sliding-window layer attends over its window's cells only, and a layer that shares
    an earlier layer's cache (Gemma 3n/4) attends over that cache all the same."""
    cells = {c.kind: c.cells for c in est.kv_caches}
    full = cells.get("full", 0)
    depth = max(depth_tokens, 0)
    _, full_per_cell, swa_per_cell = _attention_shape(arch)
    return float(full_per_cell * min(depth, full) + swa_per_cell * min(depth, cells.get("swa", full)))


def _element_bytes(cache: str) -> float:
    elements, size = BLOCK[cache_type(cache)]
    return size / elements


_ATTENTION_SHAPES: dict[int, tuple[Architecture, tuple[int, int, int]]] = {}
_WEIGHT_MIX_CACHE: dict[int, tuple[Sequence[TensorInfo], tuple[float, str]]] = {}


def attention_layers(arch: Architecture) -> int:
    """Layers with an attention KV cache (at least 1)."""
    return _attention_shape(arch)[0]


def _attention_shape(arch: Architecture) -> tuple[int, int, int]:
    """(attention layers, at least 1; attention FLOPs per cell of context over the full-attention
    layers; the same over the sliding-window layers), remembered per architecture object: a sweep over
    hardware asks for the same model thousands of times."""
    hit = _ATTENTION_SHAPES.get(id(arch))
    if hit is not None and hit[0] is arch:
        return hit[1]
    full = swa = 0
    for i in range(arch.n_layer):
        if not arch.is_attention_layer(i) or arch.is_nextn_layer(i):
            continue
        head_dim = arch.mla.kv_lora_rank if arch.mla is not None else arch.head_dim_k_at(i)
        flops = 4 * arch.heads(i) * head_dim
        if arch.is_swa_layer(i):
            swa += flops
        else:
            full += flops
    shape = (sum(1 for i in range(arch.n_layer) if arch.is_attention_layer(i)) or 1, full, swa)
    if len(_ATTENTION_SHAPES) >= 128:
        _ATTENTION_SHAPES.pop(next(iter(_ATTENTION_SHAPES)))
    _ATTENTION_SHAPES[id(arch)] = (arch, shape)
    return shape


def weight_mix(tensors: Sequence[TensorInfo]) -> tuple[float, str]:
    """(share of weight bytes stored as F16/BF16/F32, the format of most of the quantized bytes,
    ``weight_format``): float weights run on cuBLAS/float kernels, each quantized format on its own.
    Remembered per tensor tuple (it cannot change) as ``tensor_totals`` remembers its sums: a sweep over
    hardware asks it for the same model thousands of times."""
    hit = _WEIGHT_MIX_CACHE.get(id(tensors))
    if hit is not None and hit[0] is tensors:
        return hit[1]
    mix = _sum_weight_mix(tensors)
    if isinstance(tensors, tuple):
        if len(_WEIGHT_MIX_CACHE) >= 128:
            _WEIGHT_MIX_CACHE.pop(next(iter(_WEIGHT_MIX_CACHE)))
        _WEIGHT_MIX_CACHE[id(tensors)] = (tensors, mix)
    return mix


def _sum_weight_mix(tensors: Sequence[TensorInfo]) -> tuple[float, str]:
    matrices = [t for t in tensors if len(t.shape) >= 2]
    total = sum(t.n_bytes for t in matrices) or 1
    by_format: dict[str, int] = {}
    for t in matrices:
        fmt = weight_format(t.ggml_type.name)
        by_format[fmt] = by_format.get(fmt, 0) + t.n_bytes
    floats = by_format.pop("float", 0)
    return floats / total, max(by_format, key=by_format.__getitem__) if by_format else ""
