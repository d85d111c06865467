"""Which machine to buy: every catalog configuration evaluated for one workload.

The question turned round: not "does this model fit this machine" but "for this model, context,
number of users and speed per user, which hardware works, and what does it cost?". :func:`advise`
enumerates what the device catalog can build —

- boxes of 1-8 identical GPUs on a host platform (a desktop for 1-2 GPUs, a workstation for 3-4, a
  server for 5-8), with the platform's host RAM options;
- Apple machines and the other unified-memory boxes (DGX Spark, Ryzen AI Max);
- CPU servers;

— and, for each, every llama.cpp quantization preset that meets the user's quality floor (the
published perplexity increase in plain words, :func:`app.core.quant.quality_words`). Each one is
placed as llama.cpp places it (the estimator's layer split over identical GPUs; MoE experts or
whole layers moved to system memory as ``--fit`` does when the GPUs are too small), timed with the
speed model at half the context for every user at once, and priced from the catalog.

Speed: the full catalog x presets x offload options is a few thousand configurations. The tensor
layout of each preset is computed once per model (kept here), the estimator remembers its per-model
sums, and configurations that cannot work are settled by cheap bounds before any estimate: the
weights alone larger than all the memory there is, or, with part of the model in system memory, a
speed that even the full bandwidth of both memories could not reach. They are still reported, with
the bound as the reason. ``scripts/bench_advisor.py`` times the whole sweep.

Prices: catalog list prices. A GPU box also needs a host; its price here is an assumption shown
with every answer (the platform's CPU from the catalog, a round figure for board, power supply,
case and disk, and DDR5 at a round price per GiB), not a quote.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from pydantic import Field

from app.core.architecture import Architecture
from app.core.autofit import DEFAULT_MARGIN_BYTES, auto_fit
from app.core.catalog import find_device, find_model, load_devices
from app.core.commands import server_command
from app.core.devices import DeviceSpec
from app.core.errors import EstimateError, FitScopeError
from app.core.estimate import GPU_RUNTIME_OVERHEAD_BYTES, Estimate, Settings, Target, estimate, kv_caches, tensor_totals
from app.core.fit import model_from_gguf, target_from_device
from app.core.hardware import HOST_MEMORY
from app.core.hf_config import read_hf_config
from app.core.quant import PRESETS, QuantPreset, find_preset, quality_words, quantize_layout
from app.core.scenario import (
    WORDS_PER_TOKEN,
    Controls,
    HardwareChoice,
    Machine,
    ModelChoice,
    budget_of,
    resolve_targets,
)
from app.core.speed import Range, estimate_speed, kv_bytes_per_token, target_family
from app.core.speed_model import decode_seconds_per_token, load_speed_model
from app.core.tensors import TensorInfo
from app.core.units import GIB, Frozen

Preference = Literal["price", "speed", "headroom"]
QualityFloor = Literal["same", "slight", "noticeable", "any"]
Category = Literal["multi-gpu", "gpu", "apple", "unified", "cpu"]
Placement = Literal["gpu", "experts", "partial", "cpu"]

QUALITY_FLOORS: dict[str, tuple[str, float]] = {
    # The thresholds of quality_words: the published perplexity increase each phrase covers.
    "same": ("practically the same quality", 0.03),
    "slight": ("at most slightly worse quality", 0.2),
    "noticeable": ("at most noticeably worse quality", 0.7),
    "any": ("any published quality loss, 2-bit presets included", math.inf),
}
CATEGORY_WORDS: dict[str, str] = {
    "multi-gpu": "several GPUs in one box",
    "gpu": "one GPU",
    "apple": "Apple",
    "unified": "unified-memory box",
    "cpu": "CPU server",
}
OS_RESERVE_BYTES = 4 * GIB  # host RAM left to the operating system when choosing a RAM size
RAM_USD_PER_GIB = 4.0  # DDR5 at a round 2025 street price; an assumption, shown with the answer


@dataclass(frozen=True)
class HostPlatform:
    """The computer around the GPUs: its CPU (a catalog entry), memory channels and RAM sizes, and a
    round price for everything else (board, power supply, case, disk)."""

    key: str
    label: str
    cpu_id: str
    host_memory: str
    max_gpus: int
    ram_options_gib: tuple[int, ...]
    base_usd: float

    def price_usd(self, ram_gib: float) -> float:
        return self.cpu_price_usd + self.base_usd + ram_gib * RAM_USD_PER_GIB

    @cached_property
    def cpu_price_usd(self) -> float:
        return find_device(self.cpu_id).price_usd or 0.0

    @cached_property
    def cpu_name(self) -> str:
        return find_device(self.cpu_id).name.split(" (")[0]


PLATFORMS: tuple[HostPlatform, ...] = (
    HostPlatform("desktop", "desktop", "ryzen-9-9950x", "ddr5-5600-2ch", 2, (64, 128, 192), 1000.0),
    HostPlatform("workstation", "workstation", "threadripper-7980x", "ddr5-6400-4ch", 4, (128, 256, 512), 2500.0),
    HostPlatform("server", "server", "epyc-9655", "ddr5-6000-12ch", 8, (256, 512, 768), 6000.0),
)


def platform_for_gpus(count: int) -> HostPlatform:
    """The smallest platform that takes ``count`` GPUs."""
    return next(p for p in PLATFORMS if count <= p.max_gpus)


def _platform_for_cpu(device: DeviceSpec) -> HostPlatform:
    same = next((p for p in PLATFORMS if p.cpu_id == device.id), None)
    if same is not None:
        return same
    return next((p for p in PLATFORMS if device.memory_gib <= p.ram_options_gib[-1]), PLATFORMS[-1])


class Workload(Frozen):
    """What the machine must do, in the user's terms. ``context_tokens`` is each user's context;
    ``min_tokens_per_s`` each user's decode speed; ``quants`` empty means every preset meeting
    ``quality_floor``."""

    model: ModelChoice
    quants: tuple[str, ...] = ()
    context_tokens: int = Field(default=8192, ge=256, le=1 << 20)
    users: int = Field(default=1, ge=1, le=64)
    min_tokens_per_s: float = Field(default=10.0, ge=0, le=10000)
    budget_usd: float | None = Field(default=None, gt=0)
    prefer: Preference = "price"
    quality_floor: QualityFloor = "slight"
    max_gpus: int = Field(default=8, ge=1, le=8)

    @property
    def min_words_per_s(self) -> float:
        return self.min_tokens_per_s * WORDS_PER_TOKEN

    def controls(self) -> Controls:
        return Controls(context_tokens=self.context_tokens, users=self.users)


@dataclass(frozen=True)
class Candidate:
    """One configuration and its verdict. Bytes are integers; ``needed_bytes`` / ``capacity_bytes``
    are the memory that limits (the GPUs together, or the machine's memory without GPUs);
    ``decode`` is tokens/s per user (None when the configuration was settled without a speed)."""

    category: Category
    device_id: str
    device_name: str
    count: int
    quant: str
    ppl_increase: float | None
    platform: str
    host_ram_gib: float | None
    host_memory: str | None
    placement: Placement
    gpu_layers: int | None
    n_cpu_moe: int
    price_usd: float | None
    price_note: str
    needed_bytes: int
    capacity_bytes: int
    decode: Range | None
    decode_typical: float
    users: int
    passes: bool
    reason: str
    settled_by: Literal["estimate", "memory", "speed", "price"] = "estimate"
    """What decided a failure: the estimator, or a bound on memory or speed, or the price, before any estimate."""
    estimate: Estimate | None = field(default=None, repr=False, compare=False)

    @property
    def label(self) -> str:
        name = f"{self.count}x {self.device_name}" if self.count > 1 else self.device_name
        if self.platform:
            ram = f", {self.host_ram_gib:g} GiB RAM" if self.host_ram_gib else ""
            name += f" ({self.platform}{ram})"
        return name

    @property
    def quality(self) -> str:
        return quality_words(self.ppl_increase)

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.needed_bytes

    @property
    def headroom_fraction(self) -> float:
        return self.headroom_bytes / self.capacity_bytes if self.capacity_bytes else 0.0

    @property
    def total_tokens_per_s(self) -> float:
        return self.decode_typical * self.users

    @property
    def placement_words(self) -> str:
        return {
            "gpu": "all on the GPUs" if self.count > 1 else "all on the GPU",
            "experts": f"experts of {self.n_cpu_moe} layers in system memory",
            "partial": f"{self.gpu_layers} layers on the GPU, the rest in system memory",
            "cpu": "on the CPU",
        }[self.placement]

    def closeness(self, min_tokens_per_s: float) -> float:
        """How near a failing configuration came: below 1, the share of the memory it needs that it
        has; from 1 to 2, it fits and reaches this share of the speed; 0 when settled by price."""
        if self.passes:
            return 3.0
        if self.needed_bytes <= 0:
            return 0.0
        if self.needed_bytes > self.capacity_bytes or (self.decode is None and self.settled_by != "speed"):
            return min(0.999, self.capacity_bytes / self.needed_bytes)
        return 1.0 + min(0.999, self.decode_typical / max(min_tokens_per_s, 1e-9))

    def hardware_choice(self) -> HardwareChoice:
        """The main view's hardware for this configuration."""
        if self.category == "cpu":
            return HardwareChoice(kind="catalog", device_id=self.device_id)
        return HardwareChoice(
            kind="catalog",
            device_id=self.device_id,
            count=self.count,
            host_ram_gib=self.host_ram_gib,
            host_memory=self.host_memory,
        )

    def controls(self, workload: Workload) -> Controls:
        """The main view's settings for this configuration (its placement pinned)."""
        pinned = self.placement in ("experts", "partial")
        return workload.controls().model_copy(
            update={"gpu_layers": self.gpu_layers if pinned else None, "n_cpu_moe": self.n_cpu_moe if pinned else None}
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "category": self.category,
            "device_id": self.device_id,
            "device": self.device_name,
            "count": self.count,
            "quant": self.quant,
            "quality": self.quality,
            "platform": self.platform or None,
            "host_ram_gib": self.host_ram_gib,
            "placement": self.placement,
            "gpu_layers": self.gpu_layers,
            "n_cpu_moe": self.n_cpu_moe,
            "price_usd": self.price_usd,
            "price_note": self.price_note,
            "needed_bytes": self.needed_bytes,
            "capacity_bytes": self.capacity_bytes,
            "headroom_bytes": self.headroom_bytes,
            "decode_tokens_per_s": self.decode.as_dict() if self.decode else None,
            "decode_typical_tokens_per_s": round(self.decode_typical, 2),
            "decode_total_tokens_per_s": round(self.total_tokens_per_s, 2),
            "passes": self.passes,
            "reason": self.reason,
            "settled_by": self.settled_by,
        }


@dataclass(frozen=True)
class Advice:
    """The answer: ``ranked`` holds one configuration per machine (its best-quality preset that
    passes), ordered by the preference; ``passing`` every configuration that passes; ``failing``
    the others, each with its reason."""

    workload: Workload
    model_label: str
    arch: Architecture
    ranked: tuple[Candidate, ...]
    passing: tuple[Candidate, ...]
    failing: tuple[Candidate, ...]
    evaluated: int
    estimated: int
    seconds: float
    presets: tuple[str, ...]
    assumptions: tuple[str, ...]
    model_path: str = ""

    def best_per_category(self) -> dict[str, Candidate]:
        """For each kind of machine, its first ranked configuration, or the failing one that came
        closest when none passes."""
        out: dict[str, Candidate] = {}
        for c in self.ranked:
            out.setdefault(c.category, c)
        wanted = self.workload.min_tokens_per_s
        for c in sorted(self.failing, key=lambda c: -c.closeness(wanted)):
            out.setdefault(c.category, c)
        return {k: out[k] for k in CATEGORY_WORDS if k in out}

    def why_not(self, device_id: str, count: int = 1) -> Candidate | None:
        """The failing configuration of ``count`` x ``device_id`` that came closest (None when one passes)."""
        if any(c.device_id == device_id and c.count == count for c in self.passing):
            return None
        mine = [c for c in self.failing if c.device_id == device_id and c.count == count]
        wanted = self.workload.min_tokens_per_s
        return max(mine, key=lambda c: c.closeness(wanted)) if mine else None

    def commands(self, c: Candidate) -> tuple[str, str]:
        """The llama-server command for a configuration, and a vLLM command for multi-GPU CUDA/ROCm
        boxes when vLLM's plan starts ("" otherwise, or the reason it would not, after '#')."""
        if c.estimate is None:
            return "", ""
        split = tuple(1 for _ in range(c.count)) if c.category == "multi-gpu" else ()
        layers = c.estimate.gpu_layers if c.category != "cpu" else 0
        path = self.model_path or f"{self.arch.id}-{c.quant}.gguf"
        llama = server_command(c.estimate, path, layers, self.arch.sliding_window is not None, tensor_split=split)
        return llama, _vllm_command(self.arch, c, self.workload)

    def to_json(self, limit: int = 50) -> dict[str, Any]:
        def with_commands(c: Candidate) -> dict[str, Any]:
            llama, vllm = self.commands(c)
            return c.to_json() | {"llama_server_command": llama, "vllm_command": vllm or None}

        return {
            "model": self.model_label,
            "workload": self.workload.model_dump(mode="json"),
            "presets": list(self.presets),
            "evaluated": self.evaluated,
            "estimated": self.estimated,
            "seconds": round(self.seconds, 3),
            "ranked": [with_commands(c) for c in self.ranked[:limit]],
            "best_per_category": {k: with_commands(c) for k, c in self.best_per_category().items()},
            "passing": len(self.passing),
            "failing": [c.to_json() for c in self.failing],
            "assumptions": list(self.assumptions),
        }


class AdviceCancelled(FitScopeError):
    """The sweep was stopped before it finished."""


# -- the model and its presets ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Variant:
    preset: str
    ppl_increase: float | None
    tensors: tuple[TensorInfo, ...]
    weights_bytes: int  # loaded: every tensor but unloaded NextN layers
    layer_bytes: int  # what full offload puts on the GPUs (the input embedding stays in host memory)
    active_bytes: float  # read per decoded token
    expert_bytes: int
    active_expert_bytes: float
    active_params: float


_LAYOUTS: dict[tuple[int, str], tuple[Architecture, tuple[TensorInfo, ...]]] = {}
_ARCHS: dict[tuple[str, str, float], Architecture] = {}


def _layout(arch: Architecture, preset: QuantPreset) -> tuple[TensorInfo, ...]:
    key = (id(arch), preset.name)
    hit = _LAYOUTS.get(key)
    if hit is not None and hit[0] is arch:
        return hit[1]
    tensors = tuple(quantize_layout(arch, preset))
    if len(_LAYOUTS) >= 256:
        _LAYOUTS.pop(next(iter(_LAYOUTS)))
    _LAYOUTS[key] = (arch, tensors)
    return tensors


def _variant(arch: Architecture, preset: str, ppl: float | None, tensors: tuple[TensorInfo, ...]) -> _Variant:
    t = tensor_totals(arch, tensors)
    loaded = t.model_bytes - t.unloaded_bytes
    return _Variant(
        preset=preset,
        ppl_increase=ppl,
        tensors=tensors,
        weights_bytes=loaded,
        layer_bytes=loaded - t.input_bytes,
        active_bytes=sum(t.active_layer_bytes),
        expert_bytes=sum(t.expert_bytes),
        active_expert_bytes=sum(t.active_expert_bytes),
        active_params=t.active_params,
    )


def presets_for(arch: Architecture, floor: QualityFloor) -> list[QuantPreset]:
    """The llama.cpp presets whose published quality loss meets ``floor`` (BF16 left out: the same
    bytes as F16; F32 left out; presets without a published loss left out; MXFP4_MOE only for models
    released in MXFP4, whatever the floor)."""
    limit = QUALITY_FLOORS[floor][1]
    out = []
    for p in PRESETS:
        if p.name in ("F32", "BF16"):
            continue
        if p.name == "MXFP4_MOE":
            if arch.native_expert_type == "MXFP4":
                out.append(p)
            continue
        if p.ppl_increase is None:
            continue  # no published loss to hold to a floor (the IQ presets): named with quants only
        if p.ppl_increase <= limit:
            out.append(p)
    return out


def _load(workload: Workload) -> tuple[Architecture, str, str, list[_Variant]]:
    """The architecture, its label, the model path for commands, and a variant per preset."""
    choice = workload.model
    if choice.kind == "gguf":
        source = model_from_gguf(choice.ref)
        arch = source.arch
        variants = [_variant(arch, source.quant, _ppl(source.quant), source.tensors)]
        if workload.quants:
            variants = [
                _variant(arch, p.name, p.ppl_increase, _layout(arch, p)) for p in map(find_preset, workload.quants)
            ]
        return arch, source.label, str(choice.ref), variants
    if choice.kind == "catalog":
        arch = find_model(choice.ref)
        path = ""
    elif choice.kind == "hf_config":
        from pathlib import Path

        p = Path(choice.ref)
        key = (choice.kind, str(p), p.stat().st_mtime if p.exists() else 0.0)
        cached = _ARCHS.get(key)
        arch = cached if cached is not None else read_hf_config(p)
        _ARCHS[key] = arch
        path = ""
    else:
        raise FitScopeError("The advisor needs a catalog model, a GGUF file or a config.json.")
    presets = (
        [find_preset(q) for q in workload.quants] if workload.quants else presets_for(arch, workload.quality_floor)
    )
    if not presets:
        raise FitScopeError("No quantization preset meets that quality floor.")
    variants = [_variant(arch, p.name, p.ppl_increase, _layout(arch, p)) for p in presets]
    return arch, arch.name, path, variants if workload.quants else _undominated(variants)


def _undominated(variants: list[_Variant]) -> list[_Variant]:
    """The presets worth trying: one that is no smaller than another and loses more quality is never
    the better choice (memory and decode speed both follow the bytes)."""

    def loss(v: _Variant) -> float:
        return v.ppl_increase if v.ppl_increase is not None else math.inf

    return [
        v
        for v in variants
        if v.preset == "MXFP4_MOE"  # the released format of the models offered it
        or not any(u is not v and u.weights_bytes <= v.weights_bytes and loss(u) < loss(v) for u in variants)
    ]


def _ppl(quant: str) -> float | None:
    try:
        return find_preset(quant).ppl_increase
    except EstimateError:
        return None


# -- words -------------------------------------------------------------------------------------------


def _gib(n: float) -> str:
    return f"{n / GIB:,.1f} GiB"


def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 10 else f"{x:.1f}"


def _usd(x: float) -> str:
    return f"${x:,.0f}"


# -- the sweep ---------------------------------------------------------------------------------------

_NO_MACHINE = Machine()


@dataclass
class _Sweep:
    workload: Workload
    arch: Architecture
    variants: list[_Variant]
    settings: dict[str, Settings]
    kv_bytes: int
    kv_read_bytes: float  # every user's KV cache read once per decode step, half-way through the context
    out: list[Candidate] = field(default_factory=list)
    estimated: int = 0
    # (device id, preset) -> decode speed with every layer on the GPUs. A layer split runs the GPUs
    # in turn, each reading its own layers, so the speed model's time per token is the same sum
    # however many identical GPUs share the layers: computed once, for the fewest GPUs that hold them.
    split_speed: dict[tuple[str, str], tuple[Range, float]] = field(default_factory=dict)

    @property
    def depth(self) -> int:
        return max(self.workload.context_tokens // 2, 1)

    def speed(self, tensors: Sequence[TensorInfo], est: Estimate, targets: list[Target]) -> tuple[Range, float]:
        s = estimate_speed(
            self.arch,
            tensors,
            est,
            targets,
            prompt_tokens=min(512, est.settings.context_tokens),
            depth_tokens=self.depth,
            users=self.workload.users,
        )
        return s.decode_tokens_per_s, s.decode_typical

    def over_budget(self, price: float | None) -> str:
        budget = self.workload.budget_usd
        if budget is None:
            return ""
        if price is None:
            return "no list price in the catalog, so it cannot be held to the budget"
        if price > budget:
            return f"costs {_usd(price)}, over the {_usd(budget)} budget"
        return ""

    def judge_speed(self, v: _Variant, decode: Range, typical: float, free_bytes: int, where: str) -> tuple[bool, str]:
        wanted = self.workload.min_tokens_per_s
        if typical >= wanted:
            caution = f" (the range starts at {_rate(decode.low)})" if decode.low < wanted else ""
            return True, f"{v.preset}: {where}, about {_rate(typical)} tokens/s per user{caution}"
        return False, (
            f"{v.preset}: {where} ({_gib(free_bytes)} to spare), but about {_rate(typical)} tokens/s per user "
            f"< {wanted:g}"
        )


def _vllm_command(arch: Architecture, c: Candidate, w: Workload) -> str:
    if c.category != "multi-gpu" or c.placement != "gpu":
        return ""
    from app.core.multigpu import vllm_plan

    device = find_device(c.device_id)
    if device.backend not in ("cuda", "rocm"):
        return ""
    ppl = c.ppl_increase if c.ppl_increase is not None else 1.0
    fmt = "FP16" if c.quant in ("F16", "BF16") else "FP8" if ppl <= 0.03 else "AWQ-4bit"
    try:
        plan = vllm_plan(arch, device, c.count, dtype=fmt, max_model_len=w.context_tokens, max_num_seqs=w.users)
    except FitScopeError as exc:
        return f"# vLLM: {exc}"
    if not plan.starts:
        return f"# vLLM ({fmt}) would not start: {plan.problems[0]}"
    return plan.command


def _evaluate_box(sw: _Sweep, device: DeviceSpec, count: int) -> None:
    """Every preset on ``count`` x ``device`` on its host platform: all on the GPUs when that fits;
    otherwise experts (MoE) or layers in system memory, as llama.cpp's --fit would place them."""
    w = sw.workload
    platform = platform_for_gpus(count)
    ram_max = platform.ram_options_gib[-1]
    gpu_price = device.price_usd * count if device.price_usd else None
    choice = HardwareChoice(
        kind="catalog", device_id=device.id, count=count, host_ram_gib=ram_max, host_memory=platform.host_memory
    )
    targets = resolve_targets(choice, _NO_MACHINE)
    settings = sw.settings["gpu"]
    capacity = sum(t.capacity_bytes for t in targets if t.kind == "gpu")
    host_label = HOST_MEMORY[platform.host_memory][0]
    category: Category = "multi-gpu" if count > 1 else "gpu"

    def candidate(v: _Variant, **kw: Any) -> Candidate:
        base: dict[str, Any] = dict(
            category=category,
            device_id=device.id,
            device_name=device.name,
            count=count,
            quant=v.preset,
            ppl_increase=v.ppl_increase,
            platform=platform.label,
            host_ram_gib=None,
            host_memory=platform.host_memory,
            placement="gpu",
            gpu_layers=None,
            n_cpu_moe=0,
            price_usd=None,
            price_note="",
            needed_bytes=0,
            capacity_bytes=capacity,
            decode=None,
            decode_typical=0.0,
            users=w.users,
            passes=False,
            reason="",
        )
        base.update(kw)
        return Candidate(**base)

    cpu_name = platform.cpu_name

    def priced(ram_gib: float) -> tuple[float | None, str]:
        if gpu_price is None:
            return None, "no list price for this GPU in the catalog"
        host = platform.price_usd(ram_gib)
        return gpu_price + host, (
            f"{count} x {_usd(device.price_usd or 0)} GPUs + {_usd(host)} for the {platform.label} around them "
            f"({cpu_name}, {ram_gib:g} GiB RAM; assumed)"
        )

    lowest_price, _ = priced(platform.ram_options_gib[0])
    for v in sw.variants:
        over = sw.over_budget(lowest_price)
        if over:
            sw.out.append(candidate(v, reason=over, price_usd=lowest_price, settled_by="price"))
            continue
        fastest = _speed_bound(sw, v, [(targets[0], v.active_bytes)], sw.arch.n_layer)
        if fastest < w.min_tokens_per_s:
            least = v.layer_bytes + sw.kv_bytes
            memory = (
                f"needs at least {_gib(least)} of GPU memory, has {_gib(capacity)}, and " if least > capacity else ""
            )
            sw.out.append(
                candidate(
                    v,
                    needed_bytes=least,
                    decode_typical=fastest,
                    settled_by="speed",
                    reason=f"{v.preset}: {memory}at most {_rate(fastest)} tokens/s per user even with every layer "
                    f"on the {'GPUs' if count > 1 else 'GPU'} < {w.min_tokens_per_s:g} "
                    f"({device.bandwidth_gb_s:g} GB/s)",
                )
            )
            continue
        total_memory = capacity + ram_max * GIB
        if v.weights_bytes > total_memory:
            sw.out.append(
                candidate(
                    v,
                    needed_bytes=v.weights_bytes,
                    settled_by="memory",
                    capacity_bytes=total_memory,
                    reason=f"{v.preset}: the weights alone ({_gib(v.weights_bytes)}) exceed the GPUs and the largest "
                    f"host RAM together ({_gib(total_memory)})",
                )
            )
            continue
        full: Estimate | None = None
        needed = v.layer_bytes + sw.kv_bytes
        if needed <= capacity:
            sw.estimated += 1
            full = estimate(sw.arch, v.tensors, settings, targets)
            if full.fits:
                _settle(sw, v, full, targets, platform, priced, candidate, "gpu")
                continue
            needed = budget_of(full).used_bytes
        at_least = "" if full is not None else "at least "
        shortfall = f"{v.preset}: needs {at_least}{_gib(needed)} of GPU memory, has {_gib(capacity)}"
        # Part of the model in system memory: the fastest it could possibly run (the speed model fed
        # the fewest bytes that must leave the GPUs) settles most cases without an estimate.
        bound = _offload_bound(sw, v, capacity, count, targets[0], targets[-1])
        if bound < w.min_tokens_per_s:
            what = "the experts" if sw.arch.moe is not None else "the layers that do not fit"
            sw.out.append(
                candidate(
                    v,
                    needed_bytes=needed,
                    settled_by="estimate" if full is not None else "memory",
                    reason=f"{shortfall}; with {what} in system memory ({host_label}) at most "
                    f"{_rate(bound)} tokens/s per user < {w.min_tokens_per_s:g}",
                )
            )
            continue
        sw.estimated += 1
        if sw.arch.moe is not None and v.expert_bytes:
            # The buffers change once any expert leaves the GPUs (fewer pipeline copies of the graph
            # inputs), so the prediction starts from one layer's experts in system memory.
            one = estimate(sw.arch, v.tensors, settings.model_copy(update={"n_cpu_moe": 1}), targets)
            guess = _fewest_cpu_moe(sw, v, one)
            if guess is not None:
                low = max(guess - 1, 1)  # one layer of slack for rounding
                host_read = sum(tensor_totals(sw.arch, v.tensors).active_expert_bytes[:low])
                bound = _speed_bound(
                    sw, v, [(targets[0], v.active_bytes - host_read), (targets[-1], host_read)], sw.arch.n_layer
                )
                if bound < w.min_tokens_per_s:
                    sw.out.append(
                        candidate(
                            v,
                            needed_bytes=needed,
                            settled_by="estimate" if full is not None else "memory",
                            reason=f"{shortfall}; with the experts of about {guess} layers in system memory "
                            f"({host_label}) at most {_rate(bound)} tokens/s per user < {w.min_tokens_per_s:g}",
                        )
                    )
                    continue
                placed = (
                    one if guess == 1 and _keeps_margin(one) else _verified_cpu_moe(sw, v, settings, targets, guess)
                )
                if placed is not None:
                    _settle(
                        sw,
                        v,
                        placed,
                        targets,
                        platform,
                        priced,
                        candidate,
                        "experts",
                        gpu_layers=sw.arch.n_layer + 1,
                        n_cpu_moe=guess,
                        shortfall=shortfall,
                    )
                    continue
        plan = auto_fit(sw.arch, v.tensors, settings, targets)
        if plan.gpus_hidden or not plan.estimate.fits or plan.gpu_layers == 0:
            sw.out.append(candidate(v, needed_bytes=needed, reason=f"{shortfall}, and too little fits beside it"))
            continue
        placement: Placement = (
            "gpu" if plan.fully_on_gpu else "experts" if plan.gpu_layers > sw.arch.n_layer else "partial"
        )
        _settle(
            sw,
            v,
            plan.estimate,
            targets,
            platform,
            priced,
            candidate,
            placement,
            gpu_layers=plan.gpu_layers,
            n_cpu_moe=plan.n_cpu_moe,
            shortfall=shortfall,
        )


def _speed_bound(sw: _Sweep, v: _Variant, parts: Sequence[tuple[Target, float]], layers: int) -> float:
    """The most tokens/s per user the speed model's typical figure can give when each target of
    ``parts`` reads at least the given weight bytes per token (the first also every user's KV cache)
    over ``layers`` layers: its own formula (``decode_seconds_per_token`` with the fitted constants)
    fed lower bounds, so a configuration below it fails whatever the estimate would add."""
    model = load_speed_model()
    total = sum(w for _, w in parts) or 1.0
    seconds = 0.0
    per_layer = math.inf
    for i, (target, weights) in enumerate(parts):
        c = model.constants(target_family(target))
        read = weights + (sw.kv_read_bytes if i == 0 else 0.0)
        params = v.active_params * weights / total * sw.workload.users
        seconds += decode_seconds_per_token(read, 0, target.bandwidth_gb_s, c, params, target.fp16_tflops)
        per_layer = min(per_layer, c.per_layer_s)
    seconds += layers * per_layer
    return 1.0 / seconds if seconds > 0 else math.inf


def _keeps_margin(est: Estimate) -> bool:
    return all(d.total_bytes + DEFAULT_MARGIN_BYTES <= d.capacity_bytes for d in est.devices if d.kind == "gpu")


def _fewest_cpu_moe(sw: _Sweep, v: _Variant, full: Estimate) -> int | None:
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


def _verified_cpu_moe(
    sw: _Sweep, v: _Variant, settings: Settings, targets: list[Target], guess: int
) -> Estimate | None:
    """The estimate at ``--n-cpu-moe guess`` when it is what --fit's search would find (it keeps the
    margin and one layer fewer does not); None otherwise (the caller then runs the search)."""

    def at(n: int) -> Estimate:
        return estimate(sw.arch, v.tensors, settings.model_copy(update={"n_cpu_moe": n}), targets)

    placed = at(guess)
    if not _keeps_margin(placed):
        return None
    if guess > 0 and _keeps_margin(at(guess - 1)):
        return None
    return placed


def _offload_bound(sw: _Sweep, v: _Variant, capacity: int, count: int, gpu: Target, host: Target) -> float:
    """Tokens/s per user that no placement with part of the weights in system memory can beat: at
    least the bytes that cannot stay on the GPUs are read from host memory, the rest from the GPUs
    (:func:`_speed_bound`)."""
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
    return _speed_bound(sw, v, [(gpu, max(v.active_bytes - host_read, 0.0)), (host, host_read)], sw.arch.n_layer)


def _settle(
    sw: _Sweep,
    v: _Variant,
    est: Estimate,
    targets: list[Target],
    platform: HostPlatform,
    priced: Callable[[float], tuple[float | None, str]],
    candidate: Callable[..., Candidate],
    placement: Placement,
    gpu_layers: int | None = None,
    n_cpu_moe: int = 0,
    shortfall: str = "",
) -> None:
    """A placement that fits the GPUs: the host RAM it needs, its price, its speed, the verdict."""
    host = est.devices[-1]
    ram = next((r for r in platform.ram_options_gib if host.total_bytes + OS_RESERVE_BYTES <= r * GIB), None)
    b = budget_of(est)
    if ram is None:
        sw.out.append(
            candidate(
                v,
                needed_bytes=b.used_bytes,
                placement=placement,
                reason=f"{v.preset}: needs {_gib(host.total_bytes)} of host RAM; the {platform.label} takes at most "
                f"{platform.ram_options_gib[-1]} GiB",
            )
        )
        return
    price, note = priced(ram)
    key = (targets[0].name.split(" #")[0], v.preset)
    memo = sw.split_speed.get(key) if placement == "gpu" else None
    if memo is None:
        memo = sw.speed(v.tensors, est, targets)
        if placement == "gpu":
            sw.split_speed[key] = memo
    decode, typical = memo
    where = {
        "gpu": "fits on the GPUs" if sum(d.kind == "gpu" for d in est.devices) > 1 else "fits on the GPU",
        "experts": f"fits with the experts of {n_cpu_moe} layers in system memory",
        "partial": f"fits with {gpu_layers} of {sw.arch.n_layer + 1} layers on the GPUs",
        "cpu": "fits",
    }[placement]
    ok, reason = sw.judge_speed(v, decode, typical, b.free_bytes, where)
    if not ok and shortfall:
        reason = (
            f"{shortfall}; {where}, but about {_rate(typical)} tokens/s per user < {sw.workload.min_tokens_per_s:g}"
        )
    over = sw.over_budget(price)
    if ok and over:
        ok, reason = False, f"{v.preset}: {over}"
    sw.out.append(
        candidate(
            v,
            host_ram_gib=float(ram),
            placement=placement,
            gpu_layers=gpu_layers if gpu_layers is not None else est.gpu_layers,
            n_cpu_moe=n_cpu_moe,
            price_usd=price,
            price_note=note,
            needed_bytes=b.used_bytes,
            capacity_bytes=b.capacity_bytes,
            decode=decode,
            decode_typical=typical,
            passes=ok,
            reason=reason,
            estimate=est,
        )
    )


def _evaluate_single(sw: _Sweep, device: DeviceSpec) -> None:
    """An Apple machine, a unified-memory box or a CPU server: one memory, everything in it."""
    w = sw.workload
    is_cpu = not device.is_gpu
    category: Category = "cpu" if is_cpu else "apple" if device.vendor == "apple" else "unified"
    if is_cpu:
        platform = _platform_for_cpu(device)
        targets = [target_from_device(device)]
        settings = sw.settings["cpu"]
        rest = platform.base_usd + device.memory_gib * RAM_USD_PER_GIB
        price: float | None = device.price_usd + rest if device.price_usd else None
        note = (
            f"{_usd(device.price_usd)} CPU + {_usd(rest)} for the board, power, case, disk and "
            f"{device.memory_gib:g} GiB RAM (assumed)"
            if device.price_usd
            else "no list price in the catalog"
        )
    else:
        targets = resolve_targets(HardwareChoice(kind="catalog", device_id=device.id), _NO_MACHINE)
        settings = sw.settings["apple" if device.vendor == "apple" else "gpu"]
        price = device.price_usd
        note = "the whole computer (catalog list price)" if price else "no list price in the catalog"
    capacity = targets[0].capacity_bytes
    where_memory = "memory" if is_cpu else "GPU memory"
    if not is_cpu and device.gpu_usable_fraction < 1:
        where_memory = f"GPU memory ({device.gpu_usable_fraction:.0%} of its {device.memory_gib:g} GiB by default)"

    def candidate(v: _Variant, **kw: Any) -> Candidate:
        base: dict[str, Any] = dict(
            category=category,
            device_id=device.id,
            device_name=device.name,
            count=1,
            quant=v.preset,
            ppl_increase=v.ppl_increase,
            platform="",
            host_ram_gib=None,
            host_memory=None,
            placement="cpu" if is_cpu else "gpu",
            gpu_layers=None if is_cpu else sw.arch.n_layer + 1,
            n_cpu_moe=0,
            price_usd=price,
            price_note=note,
            needed_bytes=0,
            capacity_bytes=capacity,
            decode=None,
            decode_typical=0.0,
            users=w.users,
            passes=False,
            reason="",
        )
        base.update(kw)
        return Candidate(**base)

    for v in sw.variants:
        over = sw.over_budget(price)
        if over:
            sw.out.append(candidate(v, reason=over, settled_by="price"))
            continue
        if v.weights_bytes > capacity:
            sw.out.append(
                candidate(
                    v,
                    needed_bytes=v.weights_bytes,
                    settled_by="memory",
                    reason=f"{v.preset}: the weights alone ({_gib(v.weights_bytes)}) exceed its {where_memory}, "
                    f"{_gib(capacity)}",
                )
            )
            continue
        fastest = _speed_bound(sw, v, [(targets[0], v.active_bytes)], sw.arch.n_layer)
        if fastest < w.min_tokens_per_s:
            sw.out.append(
                candidate(
                    v,
                    needed_bytes=v.weights_bytes + sw.kv_bytes,
                    decode_typical=fastest,
                    settled_by="speed",
                    reason=f"{v.preset}: at most {_rate(fastest)} tokens/s per user < {w.min_tokens_per_s:g} "
                    f"({device.bandwidth_gb_s:g} GB/s)",
                )
            )
            continue
        sw.estimated += 1
        est = estimate(sw.arch, v.tensors, settings, targets)
        b = budget_of(est)
        if not est.fits:
            sw.out.append(
                candidate(
                    v,
                    needed_bytes=b.used_bytes,
                    reason=f"{v.preset}: needs {_gib(b.used_bytes)} of {where_memory}, has {_gib(b.capacity_bytes)}",
                )
            )
            continue
        decode, typical = sw.speed(v.tensors, est, targets)
        ok, reason = sw.judge_speed(v, decode, typical, b.free_bytes, "fits")
        sw.out.append(
            candidate(
                v,
                needed_bytes=b.used_bytes,
                capacity_bytes=b.capacity_bytes,
                decode=decode,
                decode_typical=typical,
                passes=ok,
                reason=reason,
                estimate=est,
            )
        )


def _rank_key(c: Candidate, prefer: Preference) -> tuple:
    price = c.price_usd if c.price_usd is not None else math.inf
    quality = c.ppl_increase if c.ppl_increase is not None else 9.0
    if prefer == "speed":
        return (-c.decode_typical, price, quality)
    if prefer == "headroom":
        return (-c.headroom_fraction, price, quality)
    return (price, quality, -c.decode_typical)


def advise(
    workload: Workload,
    progress: Callable[[float, str], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Advice:
    """Every catalog configuration for ``workload``, judged and ranked (see the module docstring).

    ``progress(fraction, message)`` is called as the sweep goes, ``should_stop()`` is polled between
    machines. Raises CatalogError / ModelFileError / EstimateError for a model or preset that cannot
    be read, EstimateError for settings llama.cpp refuses, AdviceCancelled when stopped.
    """
    started = time.perf_counter()
    arch, label, path, variants = _load(workload)
    controls = workload.controls()
    settings = {
        "gpu": controls.settings("x86-avx512"),
        "cpu": controls.settings("x86-avx512"),
        "apple": controls.settings("arm-neon"),
    }
    caches = kv_caches(arch, settings["gpu"])
    kv_total = sum(d.total_bytes for d, _ in caches)
    probe = estimate(arch, variants[0].tensors, settings["cpu"], [_probe_target()])
    kv_read = kv_bytes_per_token(probe) * max(workload.context_tokens // 2, 1) * workload.users
    sw = _Sweep(workload, arch, variants, settings, kv_total, kv_read)
    devices = [d for d in load_devices()]
    boxes = [
        (d, n) for d in devices if d.is_gpu and d.memory_kind == "dedicated" for n in range(1, workload.max_gpus + 1)
    ]
    singles = [d for d in devices if not (d.is_gpu and d.memory_kind == "dedicated")]
    steps = len(boxes) + len(singles)
    done = 0
    for device, count in boxes:
        if should_stop is not None and should_stop():
            raise AdviceCancelled("Stopped.")
        _evaluate_box(sw, device, count)
        done += 1
        if progress is not None and count == workload.max_gpus:
            progress(done / steps, f"{device.name}: 1-{count} GPUs")
    for device in singles:
        if should_stop is not None and should_stop():
            raise AdviceCancelled("Stopped.")
        _evaluate_single(sw, device)
        done += 1
        if progress is not None:
            progress(done / steps, device.name)
    passing = sorted((c for c in sw.out if c.passes), key=lambda c: _rank_key(c, workload.prefer))
    best: dict[tuple[str, int], Candidate] = {}
    for c in sorted(passing, key=lambda c: (c.ppl_increase if c.ppl_increase is not None else 9.0, -c.decode_typical)):
        best.setdefault((c.device_id, c.count), c)
    ranked = sorted(best.values(), key=lambda c: _rank_key(c, workload.prefer))
    failing = tuple(c for c in sw.out if not c.passes)
    return Advice(
        workload=workload,
        model_label=label,
        arch=arch,
        ranked=tuple(ranked),
        passing=tuple(passing),
        failing=failing,
        evaluated=len(sw.out),
        estimated=sw.estimated,
        seconds=time.perf_counter() - started,
        presets=tuple(v.preset for v in variants),
        assumptions=_assumptions(workload),
        model_path=path,
    )


def _probe_target() -> Target:
    return Target(name="probe", kind="cpu", capacity_bytes=1 << 62, bandwidth_gb_s=1.0, fp16_tflops=1.0)


def _assumptions(w: Workload) -> tuple[str, ...]:
    platforms = "; ".join(
        f"{p.label} for up to {p.max_gpus} GPUs: {p.cpu_name} ({_usd(p.cpu_price_usd)}) + {_usd(p.base_usd)} "
        "board, power, case and disk, "
        f"RAM {'/'.join(map(str, p.ram_options_gib))} GiB"
        for p in PLATFORMS
    )
    return (
        f"Speed per user at {w.context_tokens // 2:,} tokens into each conversation, all {w.users} user(s) at once; "
        "a configuration passes when the speed model's typical figure reaches the minimum (the range is shown).",
        f"Quality floor: {QUALITY_FLOORS[w.quality_floor][0]} (llama.cpp's published perplexity increase).",
        f"GPU boxes: llama.cpp's layer split over identical GPUs; host platforms (assumed prices): {platforms}; "
        f"DDR5 at {_usd(RAM_USD_PER_GIB)} per GiB; the smallest RAM that holds the host's share plus "
        f"{OS_RESERVE_BYTES // GIB} GiB.",
        "When the GPUs are too small: MoE experts, then whole layers, in system memory, as llama.cpp's --fit "
        "places them (1 GiB kept free per GPU).",
        "Apple and unified-memory boxes: the GPU's share of the memory by default; prices are whole computers.",
        "Prices are catalog list prices in US dollars; datacenter GPUs without a list price are ranked last and "
        "excluded by a budget.",
    )


def words_to_tokens(words_per_s: float) -> float:
    """Tokens/s for a speed in words a second (English prose, 0.75 words per token)."""
    return words_per_s / WORDS_PER_TOKEN


PREFERENCE_WORDS: dict[str, str] = {
    "price": "lowest price first",
    "speed": "fastest first",
    "headroom": "most memory to spare first",
}


def workload_sentence(w: Workload, model_label: str) -> str:
    users = f"{w.users} users" if w.users > 1 else "one user"
    budget = f", budget {_usd(w.budget_usd)}" if w.budget_usd else ""
    return (
        f"{model_label}, {w.context_tokens:,} tokens of context for each of {users}, at least "
        f"{w.min_tokens_per_s:g} tokens/s each (about {_rate(w.min_words_per_s)} words a second); "
        f"{QUALITY_FLOORS[w.quality_floor][0]}{budget}."
    )


def format_advice(advice: Advice, top: int = 10, why: Sequence[str] = ()) -> str:
    """The answer as ``fitscope advise`` prints it: the ranked machines, the best of each kind, why
    single GPUs of the ranked boxes (and ``why`` device ids) fail, and the launch command of the first."""
    w = advice.workload
    lines = [
        workload_sentence(w, advice.model_label),
        f"{advice.evaluated:,} configurations ({len(advice.presets)} presets: {', '.join(advice.presets)}) "
        f"in {advice.seconds:.2f} s; {len(advice.passing):,} pass, on {len(advice.ranked)} machines.",
        "",
    ]
    if advice.ranked:
        lines.append(
            f"Machines that do it ({PREFERENCE_WORDS[w.prefer]}; each with its best-quality preset that passes):"
        )
        lines.append(
            f"  {'#':>2}  {'machine':58} {'quant':8} {'price':>9} {'to spare':>9}  "
            f"{'tokens/s per user':>19} {'total':>6}"
        )
        for i, c in enumerate(advice.ranked[:top], 1):
            lines.append("  " + _row(i, c))
        if len(advice.ranked) > top:
            lines.append(f"  ... and {len(advice.ranked) - top} more (--top N, or --json for all).")
    else:
        lines.append("No configuration in the catalog does it.")
    lines += ["", "Best of each kind:"]
    for kind, c in advice.best_per_category().items():
        verdict = "passes" if c.passes else "does not pass"
        lines.append(f"  {CATEGORY_WORDS[kind]}: {c.label}, {c.quant}, {_price_text(c)}: {verdict}: {c.reason}.")
    asked = list(dict.fromkeys([*why, *(c.device_id for c in advice.ranked[:top] if c.count > 1)]))
    nots = [c for c in (advice.why_not(d, 1) for d in asked) if c is not None]
    if nots:
        lines += ["", "Why not one GPU:" if not why else "Why not:"]
        for c in nots:
            lines.append(f"  {c.device_name}: {c.reason}.")
    if advice.ranked:
        first = advice.ranked[0]
        llama, vllm = advice.commands(first)
        lines += ["", f"Launch #1 ({first.label}, {first.quant}):", f"  {llama}"]
        if vllm:
            lines.append(f"  {vllm}")
        lines.append(f"  Price: {first.price_note}.")
    lines += ["", "Assumptions:"] + [f"  - {a}" for a in advice.assumptions]
    return "\n".join(lines)


def _price_text(c: Candidate) -> str:
    return _usd(c.price_usd) if c.price_usd is not None else "price not listed"


def _row(i: int, c: Candidate) -> str:
    speed = f"{_rate(c.decode_typical)} ({_rate(c.decode.low)}-{_rate(c.decode.high)})" if c.decode is not None else "-"
    price = _usd(c.price_usd) if c.price_usd is not None else "unlisted"
    label = c.label if len(c.label) <= 58 else c.label[:57] + "…"
    return (
        f"{i:>2}  {label:58} {c.quant:8} {price:>9} {_gib(c.headroom_bytes):>9}  {speed:>19} "
        f"{_rate(c.total_tokens_per_s):>6}"
    )
