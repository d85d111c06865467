"""The hardware advisor's records: the workload asked about, one configuration's verdict, the answer.

:class:`Workload` is what the machine must do, in the user's terms; :class:`Candidate` one catalog
configuration (a machine and a quantization preset) with its placement, price, speed and the
reason it passes or fails; :class:`HardwareAdvice` every configuration of one sweep, ranked, with the best
of each kind of machine. The launch commands and the JSON are :mod:`app.core.advisor.commands`; the
sweep that fills them is :func:`app.services.advisor.advise`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from app.core.common.errors import FitScopeError
from app.core.common.units import Frozen
from app.core.memory.records import Estimate
from app.core.model.architecture import Architecture
from app.core.model.quant import quality_words
from app.core.report.choices import Controls, HardwareChoice, ModelChoice
from app.core.report.lengths import WORDS_PER_TOKEN
from app.core.speed.predict import Range

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


class Workload(Frozen):
    """What the machine must do, in the user's terms. ``context_per_user_tokens`` is each user's context;
    ``min_tokens_per_s`` each user's decode speed; ``quants`` empty means every preset meeting
    ``quality_floor``."""

    model: ModelChoice
    quants: tuple[str, ...] = ()
    context_per_user_tokens: int = Field(default=8192, ge=256, le=1 << 20)
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
        return Controls(context_per_user_tokens=self.context_per_user_tokens, users=self.users)


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
    llama_command: str = ""
    """The llama-server command of the estimate service's answer ("" when settled without one)."""

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
        """The main view's settings for this configuration: the workload's, placed by auto-fit, which
        places it as it was placed here."""
        return workload.controls()

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
class HardwareAdvice:
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


class AdviceCancelledError(FitScopeError):
    """The sweep was stopped before it finished."""


# -- words -------------------------------------------------------------------------------------------


def format_rate(x: float) -> str:
    """A speed for a sentence: whole numbers from 10 up, one decimal below."""
    return f"{x:,.0f}" if x >= 10 else f"{x:.1f}"


def format_usd(x: float) -> str:
    """US dollars, whole, with thousands separators."""
    return f"${x:,.0f}"
