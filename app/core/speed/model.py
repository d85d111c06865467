"""The speed model's terms, and its constants fitted on published llama-bench results.

Decode (one token at a time) reads every active weight once, plus the KV cache up to the current
depth, and pays a fixed cost per layer (kernel launches, synchronisation) that dominates small
models on very fast memory:

    seconds per token = bytes read / (efficiency x bandwidth) + layers x per-layer cost

Prefill (a prompt in batches) is bound by the matrix-multiply rate the device reaches for the
weight type (quantized kernels or float tensor cores):

    tokens/s = rate factor x peak FP16 FLOP/s / (2 x active parameters per token)

Both constants are fitted per device family (``speed_family``) on published llama-bench rows
(``tests/data/llama_bench_*.json``, each with its source) by ``scripts/fit_speed.py``, which also
reports their error on devices left out of the fit (grouped cross-validation) and sets each
range from the residuals, so that about 80% of real results fall inside it. The fitted values are
in ``resources/speed_model.json``.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from app.core.model.catalog import RESOURCES_DIR

SPEED_MODEL_PATH = RESOURCES_DIR / "speed_model.json"

FAMILIES = (
    "nvidia-geforce",
    "nvidia-gddr",
    "nvidia-hbm",
    "amd-rdna",
    "amd-cdna",
    "apple-m1",
    "apple-m2plus",
    "unified-nvidia",
    "unified-amd",
    "cpu-x86",
    "cpu-arm",
)


@functools.lru_cache(maxsize=1024)
def speed_family(name: str, kind: str = "gpu") -> str:
    """The device family whose constants apply, from a device's name (catalog or as llama.cpp prints
    it). ``kind`` is "cpu" for host processors."""
    n = name.lower()
    if "dgx spark" in n or "gb10" in n:
        return "unified-nvidia"
    if "ryzen ai max" in n or "strix halo" in n or "395" in n and "ryzen" in n:
        return "unified-amd"
    if re.search(r"\bm1\b", n) and ("apple" in n or "gpu" in n or kind != "cpu"):
        return "apple-m1"
    if re.search(r"\bm[2-9]\b", n) and ("apple" in n or "gpu" in n or kind != "cpu"):
        return "apple-m2plus"
    if kind == "cpu":
        arm = ("cix", "radxa", "graviton", "ampere", "snapdragon", "neoverse", "qualcomm", "apple")
        return "cpu-arm" if any(a in n for a in arm) else "cpu-x86"
    if re.search(r"\bmi\d{3}", n) or "instinct" in n:
        return "amd-cdna"
    if "radeon" in n or re.search(r"\brx \d", n) or "w7900" in n or n.startswith("amd"):
        return "amd-rdna"
    if re.search(r"\b(a100|h100|h200|b200|b300|gh200|v100)\b", n):
        return "nvidia-hbm"
    if "geforce" in n or re.search(r"\brtx [2-5]0[5-9]0\b", n):
        # Consumer cards: llama.cpp's quantized kernels run on integer tensor cores, which GeForce
        # runs at 4x its (halved) FP16-with-FP32-accumulate rate, workstation cards at 2x.
        return "nvidia-geforce"
    return "nvidia-gddr"


def device_group(family: str) -> str:
    """gpu, apple, cpu or unified: the groups whose ranges are set apart."""
    head = family.split("-")[0]
    return head if head in ("apple", "cpu", "unified") else "gpu"


class FamilyConstants(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    decode_efficiency: float = Field(gt=0, le=1.5, description="share of the bandwidth roofline")
    per_layer_s: float = Field(ge=0, description="fixed decode cost per layer per token, seconds")
    decode_flop_per_param: float = Field(
        default=0.0, ge=0, description="decode work per active parameter in FP16-FLOP equivalents (CPUs: dequantizing)"
    )
    prefill_quant: float = Field(gt=0, description="prefill rate factor for quantized weights")
    prefill_float: float = Field(gt=0, description="prefill rate factor for F16/BF16/F32 weights")
    rows: int = Field(ge=0, description="benchmark rows behind these constants")
    devices: int = Field(ge=0)


class SpeedModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    families: dict[str, FamilyConstants]
    fallback: dict[str, str] = Field(description="family -> the family whose constants it borrows when it has none")
    decode_interval: dict[str, tuple[float, float]] = Field(
        description="device group (gpu, apple, cpu, unified, all) -> (low, high) multipliers holding ~80% of results"
    )
    prefill_interval: dict[str, tuple[float, float]]
    source: str

    def intervals(self, family: str) -> tuple[tuple[float, float], tuple[float, float]]:
        """(decode, prefill) range multipliers for a family's device group."""
        group = device_group(family)
        return (
            self.decode_interval.get(group, self.decode_interval["all"]),
            self.prefill_interval.get(group, self.prefill_interval["all"]),
        )

    def constants(self, family: str) -> FamilyConstants:
        seen = set()
        while family not in self.families and family in self.fallback and family not in seen:
            seen.add(family)
            family = self.fallback[family]
        return self.families.get(family) or self.families["nvidia-gddr"]


@functools.cache
def load_speed_model(path: Path = SPEED_MODEL_PATH) -> SpeedModel:
    return SpeedModel.model_validate(json.loads(path.read_text(encoding="utf-8")))


def decode_seconds_per_token(
    bytes_read: float,
    n_layer: int,
    bandwidth_gb_s: float,
    c: FamilyConstants,
    active_params: float = 0.0,
    fp16_tflops: float = 0.0,
) -> float:
    """Seconds to decode one token reading ``bytes_read`` bytes through ``n_layer`` layers, plus the
    arithmetic on ``active_params`` parameters where the device's rate makes it count (CPUs)."""
    compute = c.decode_flop_per_param * active_params / (fp16_tflops * 1e12) if fp16_tflops > 0 else 0.0
    return bytes_read / (c.decode_efficiency * bandwidth_gb_s * 1e9) + n_layer * c.per_layer_s + compute


def prefill_tokens_per_s(active_params: float, fp16_tflops: float, float_weights: bool, c: FamilyConstants) -> float:
    """Prompt tokens per second for ``active_params`` parameters per token on ``fp16_tflops``."""
    factor = c.prefill_float if float_weights else c.prefill_quant
    return factor * fp16_tflops * 1e12 / (2 * active_params)
