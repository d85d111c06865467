"""The state of one hardware-advisor sweep, and the cheap bounds that settle configurations early.

:class:`Sweep` holds what every configuration of one workload shares (the model's variants, every
user's KV cache) and collects the verdicts. The bounds answer, before any estimate, what no
placement could beat: :func:`speed_bound` feeds the speed model's own formula the fewest bytes each
memory must read per token, and :func:`offload_bound` does so for the bytes that cannot stay on the
GPUs. :func:`fewest_cpu_moe` guesses the ``--n-cpu-moe`` that llama.cpp's ``--fit`` will choose,
which auto-fit checks with two estimates instead of searching (its answer is the same either way).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.core.advisor.configs import Variant
from app.core.advisor.records import Candidate, Workload, format_rate, format_usd
from app.core.memory.autofit import DEFAULT_MARGIN_BYTES
from app.core.memory.estimate import estimate
from app.core.memory.kv import kv_caches
from app.core.memory.layers import tensor_totals
from app.core.memory.records import GPU_RUNTIME_OVERHEAD_BYTES, Estimate, Target
from app.core.model.architecture import Architecture
from app.core.report.choices import Machine
from app.core.report.verdict import gib
from app.core.speed.model import decode_seconds_per_token, load_speed_model
from app.core.speed.predict import Range, decode_tflops, memory_kind, target_family
from app.core.speed.reads import kv_read_bytes, weight_mix

NO_MACHINE = Machine()  # catalog hardware only: nothing of this machine is looked at
# A target large enough for any model, to read the KV bytes per token off one estimate.
_PROBE_TARGET = Target(name="probe", kind="cpu", capacity_bytes=1 << 62, bandwidth_gb_s=1.0, fp16_tflops=1.0)


@dataclass
class Sweep:
    """One sweep's shared state: the workload, the model (``label``, and ``model_path`` when it is a
    file) and its variants, every user's KV cache (``kv_bytes``), the configurations judged so far
    (``out``) and how many needed the estimator."""

    workload: Workload
    arch: Architecture
    label: str
    model_path: str
    variants: list[Variant]
    kv_bytes: int
    kv_read_bytes: float  # every user's KV cache read once per decode step, half-way through the context
    out: list[Candidate] = field(default_factory=list)
    estimated: int = 0
    targets: dict[object, list[Target]] = field(default_factory=dict)  # per hardware choice, resolved once

    @classmethod
    def start(cls, workload: Workload, arch: Architecture, label: str, path: str, variants: list[Variant]) -> Sweep:
        """A sweep of ``variants`` of ``arch`` for ``workload``, nothing judged yet. Raises
        EstimateError for settings llama.cpp refuses."""
        settings = workload.controls().settings("x86-avx512")
        caches = kv_caches(arch, settings)
        kv_total = sum(d.total_bytes for d, _ in caches)
        probe = estimate(arch, variants[0].tensors, settings, [_PROBE_TARGET])
        kv_read = kv_read_bytes(probe, max(workload.context_per_user_tokens // 2, 1)) * workload.users
        return cls(workload, arch, label, path, variants, kv_total, kv_read)

    def over_budget(self, price: float | None) -> str:
        """Why ``price`` (US dollars) breaks the workload's budget; "" when it does not."""
        budget = self.workload.budget_usd
        if budget is None:
            return ""
        if price is None:
            return "no list price in the catalog, so it cannot be held to the budget"
        if price > budget:
            return f"costs {format_usd(price)}, over the {format_usd(budget)} budget"
        return ""

    def judge_speed(self, v: Variant, decode: Range, typical: float, free_bytes: int, where: str) -> tuple[bool, str]:
        """Whether a placement that fits (``where``, in words) is fast enough, and the reason."""
        wanted = self.workload.min_tokens_per_s
        if typical >= wanted:
            caution = f" (the range starts at {format_rate(decode.low)})" if decode.low < wanted else ""
            return True, f"{v.preset}: {where}, about {format_rate(typical)} tokens/s per user{caution}"
        return False, (
            f"{v.preset}: {where} ({gib(free_bytes)} to spare), but about {format_rate(typical)} tokens/s per user "
            f"(under the {format_rate(wanted)} needed)"
        )


def speed_bound(sw: Sweep, v: Variant, parts: Sequence[tuple[Target, float]], layers: int) -> float:
    """The most tokens/s per user the speed model's typical figure can give when each target of
    ``parts`` reads at least the given weight bytes per token (the first also every user's KV cache)
    over ``layers`` layers: its own formula (``decode_seconds_per_token`` with the fitted constants)
    fed lower bounds, so a configuration below it fails whatever the estimate would add."""
    model = load_speed_model()
    total = sum(w for _, w in parts) or 1.0
    seconds = 0.0
    per_layer = math.inf
    mix = weight_mix(v.tensors)
    for i, (target, weights) in enumerate(parts):
        c = model.constants(target_family(target))
        read = weights + (sw.kv_read_bytes if i == 0 else 0.0)
        params = v.active_params * weights / total * sw.workload.users
        rate = model.read_factor(memory_kind(target), *mix)
        seconds += decode_seconds_per_token(
            read, 0, target.bandwidth_gb_s, c, params, decode_tflops(target), read_factor=rate
        )
        per_layer = min(per_layer, c.per_layer_s)
    seconds += layers * per_layer
    return 1.0 / seconds if seconds > 0 else math.inf


def fewest_cpu_moe(sw: Sweep, v: Variant, full: Estimate) -> int | None:
    """The ``--n-cpu-moe`` that llama.cpp's --fit would choose, predicted from an estimate with the
    experts of its first ``full.cpu_moe_layers`` layers in system memory: the experts of the next
    layers leave in order, and each GPU must shed its overflow (plus the 1 GiB margin) from the
    layers it holds. None when the experts alone are not enough."""
    experts = tensor_totals(sw.arch, v.tensors).expert_bytes
    start = full.cpu_moe_layers
    need = {
        i: d.total_bytes + DEFAULT_MARGIN_BYTES - d.capacity_bytes
        for i, d in enumerate(full.devices)
        if d.kind == "gpu" and d.total_bytes + DEFAULT_MARGIN_BYTES > d.capacity_bytes
    }
    for layer in range(start, sw.arch.n_layer):
        if not need:
            return layer
        dev = full.layer_devices[layer]
        if dev in need:
            need[dev] -= experts[layer]
            if need[dev] <= 0:
                del need[dev]
    return sw.arch.n_layer if not need else None


def offload_bound(sw: Sweep, v: Variant, capacity: int, count: int, gpu: Target, host: Target) -> float:
    """Tokens/s per user that no placement with part of the weights in system memory can beat: at
    least the bytes that cannot stay on the GPUs are read from host memory, the rest from the GPUs
    (:func:`speed_bound`)."""
    room = capacity - count * GPU_RUNTIME_OVERHEAD_BYTES - sw.kv_bytes
    moved = max(v.layer_bytes - max(room, 0), 0)
    if moved <= 0:
        return math.inf
    if sw.arch.moe is not None and v.expert_bytes:
        share = v.active_expert_bytes / v.expert_bytes
        from_experts = min(moved, v.expert_bytes)
        host_read = from_experts * share + (moved - from_experts) * (v.active_bytes / max(v.weights_bytes, 1))
    else:
        host_read = moved * (v.active_bytes / max(v.weights_bytes, 1))
    return speed_bound(sw, v, [(gpu, max(v.active_bytes - host_read, 0.0)), (host, host_read)], sw.arch.n_layer)
