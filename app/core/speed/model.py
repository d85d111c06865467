"""The speed model's terms, and its constants fitted on published llama-bench results.

Decode (one token at a time) reads every active weight once, plus the KV cache up to the current
depth, and pays a fixed cost per layer (kernel launches, synchronisation) that dominates small
models on very fast memory:

    seconds per token = bytes read / (efficiency x bandwidth) + layers x per-layer cost

Prefill (a prompt in batches) is bound by the matrix-multiply rate the device reaches for the
weight type (quantized kernels or float tensor cores):

    tokens/s = rate factor x peak FP16 FLOP/s / (2 x active parameters per token)

With weights in system memory beside a GPU (``--n-cpu-moe``, a partial ``-ngl``), a decoded token
also reads the host-resident share at the host's bandwidth, computes it on the CPU's threads, and
hands the activations between GPU and CPU at every layer that has host-resident weights:

    seconds per token += host bytes / (host efficiency x host bandwidth)
                         + host parameters x work per parameter / CPU FLOP/s + such layers x sync

and a prompt's matrix products run on the GPU, which copies the host-resident weights it needs
over PCIe for every ubatch (``ggml_backend_sched_compute_splits``: only the experts the ubatch
routes to), so a larger ``-ub`` amortises the copy:

    seconds per ubatch = ubatch tokens / GPU prefill rate + copied bytes / (PCIe efficiency x link)

Both constants are fitted per device family (``speed_family``) on published llama-bench rows
(``tests/data/llama_bench_*.json``, each with its source) by ``scripts/fit_speed.py``, which also
reports their error on devices left out of the fit (grouped cross-validation) and sets each
range from the residuals, so that about 80% of real results fall inside it. The fitted values are
in ``resources/speed_model.json``.
"""

from __future__ import annotations

import functools
import json
import math
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
    "intel-sycl",
    "intel-vulkan",
    "cpu-x86",
    "cpu-arm",
)


@functools.lru_cache(maxsize=1024)
def speed_family(name: str, kind: str = "gpu", backend: str = "") -> str:
    """The device family whose constants apply, from a device's name (catalog or as llama.cpp prints
    it). ``kind`` is "cpu" for host processors; ``backend`` the llama.cpp build, where a vendor's builds
    decode apart (Intel's SYCL build reads its weights about twice as fast as its Vulkan one)."""
    n = name.lower()
    if "dgx spark" in n or "gb10" in n:
        return "unified-nvidia"
    if "ryzen ai max" in n or "strix" in n or "8060s" in n or "gfx1151" in n or "395" in n and "ryzen" in n:
        return "unified-amd"
    if re.search(r"\bm1\b", n) and ("apple" in n or "gpu" in n or kind != "cpu"):
        return "apple-m1"
    if re.search(r"\bm[2-9]\b", n) and ("apple" in n or "gpu" in n or kind != "cpu"):
        return "apple-m2plus"
    if kind == "cpu":
        arm: tuple[str, ...] = ("cix", "radxa", "graviton", "ampere", "snapdragon", "neoverse", "qualcomm", "apple")
        arm += ("raspberry", "cortex")
        return "cpu-arm" if any(a in n for a in arm) else "cpu-x86"
    if re.search(r"\barc\b", n) or "intel" in n:
        # Intel's Xe GPUs (Arc, Arc Pro, and the integrated ones llama.cpp names "Intel(R) Graphics"):
        # the SYCL build unless it is the Vulkan one.
        return "intel-vulkan" if backend == "vulkan" else "intel-sycl"
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


# Families whose prefill kernels are the same code on the same kind of tensor cores: their prefill
# factors are fitted together, each against its own peak (``prefill_peak_multiplier``), so that a
# GeForce card's prefill is learned from workstation and datacenter cards' rows as well.
PREFILL_POOLS: dict[str, str] = {
    "nvidia-geforce": "nvidia",
    "nvidia-gddr": "nvidia",
    "nvidia-hbm": "nvidia",
    "unified-nvidia": "nvidia",
}


def prefill_peak_multiplier(family: str, float_weights: bool) -> float:
    """The peak of llama.cpp's prompt kernels on ``family`` against the device's FP16 tensor rate with
    FP32 accumulation (the catalog's ``fp16_tflops``). On NVIDIA (since June 2024, PR #8075) quantized
    weights run on int8 tensor cores (``mul_mat_q``, ``ggml_cuda_should_use_mmq``): 4x that rate on
    GeForce and GB10, whose FP32-accumulate rate is half their FP16 one, 2x on workstation and
    datacenter cards; F16 weights run on cuBLAS with FP16 accumulation (``CUBLAS_COMPUTE_16F`` in
    ``ggml_cuda_mul_mat_cublas``), 2x on GeForce and 1x elsewhere. 1 for every other family."""
    if PREFILL_POOLS.get(family) != "nvidia":
        return 1.0
    consumer = family in ("nvidia-geforce", "unified-nvidia")
    if float_weights:
        return 2.0 if consumer else 1.0
    return 4.0 if consumer else 2.0


def device_group(family: str) -> str:
    """gpu, apple, cpu or unified: the groups whose ranges are set apart."""
    head = family.split("-")[0]
    return head if head in ("apple", "cpu", "unified") else "gpu"


class FamilyConstants(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    decode_efficiency: float = Field(gt=0, le=1.5, description="share of the bandwidth roofline")
    per_layer_s: float = Field(ge=0, description="fixed decode cost per layer per token, seconds")
    per_moe_layer_s: float = Field(
        default=0.0, ge=0, description="extra per mixture-of-experts layer: router, top-k, gather and expert kernels"
    )
    per_recurrent_layer_s: float = Field(
        default=0.0, ge=0, description="extra per recurrent (linear-attention, SSM) layer: its state-update kernels"
    )
    decode_flop_per_param: float = Field(
        default=0.0, ge=0, description="decode work per active parameter in FP16-FLOP equivalents (CPUs: dequantizing)"
    )
    decode_attention_cost: float = Field(
        default=0.0,
        ge=0,
        description="decode attention FLOPs' cost against the FP16 rate (1/its efficiency): a decoded token's "
        "attention over a long context computes more than its KV reads cost where the kernels are slow",
    )
    prefill_quant: float = Field(gt=0, description="prefill rate factor for quantized weights")
    prefill_float: float = Field(gt=0, description="prefill rate factor for F16/BF16/F32 weights")
    prefill_backend: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="a llama.cpp build (cuda, rocm, vulkan, metal, cpu) -> {'quant'|'float': its own factor}, where "
        "the rows show it apart (ROCm's hipBLASLt and Vulkan's shaders differ most on float weights)",
    )
    rows: int = Field(ge=0, description="benchmark rows behind these constants")
    devices: int = Field(ge=0)


class HybridConstants(BaseModel):
    """The host's share of a GPU run with weights in system memory, fitted on published rows with
    ``--n-cpu-moe``, ``-ot exps=CPU`` or a partial ``-ngl`` (tests/data/llama_bench_budget.json)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host_efficiency: float = Field(gt=0, le=1.5, description="share of the host memory's spec bandwidth reached")
    host_flop_per_param: float = Field(ge=0, description="CPU work per active host parameter, FP32-FLOP equivalents")
    format_flop_per_param: dict[str, float] = Field(
        default_factory=dict,
        description="a weight format (``weight_format``) -> the CPU's further work per host parameter of it, "
        "where the rows show one",
    )
    sync_s: float = Field(
        ge=0, description="per decoded token and layer with host-resident weights: the GPU-CPU handoff"
    )
    pcie_pinned: float = Field(
        gt=0, le=1.5, description="share of the PCIe link for weights in pinned memory (--no-mmap)"
    )
    pcie_pageable: float = Field(
        gt=0, le=1.5, description="share of the PCIe link for memory-mapped (pageable) weights"
    )
    rows: int = Field(ge=0)


DEFAULT_HYBRID = HybridConstants(
    host_efficiency=0.6, host_flop_per_param=4.0, sync_s=5e-5, pcie_pinned=0.8, pcie_pageable=0.5, rows=0
)


class SpeedModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    families: dict[str, FamilyConstants]
    hybrid: HybridConstants = DEFAULT_HYBRID
    routing_exponent: float = Field(
        default=1.0, gt=0, le=1, description="a ubatch reaches as many experts as tokens^this independent tokens would"
    )
    prefill_half_tokens: float = Field(
        default=0.0,
        ge=0,
        description="rows of a matrix product at which llama.cpp's prompt kernels reach half their full rate "
        "(``batch_efficiency``): what slows a mixture of experts' prefill and short prompts",
    )

    prefill_format: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="cpu | gpu -> a quantized weight format (``weight_format``) -> its prefill rate against the "
        "family's quantized factor: llama.cpp's prompt kernels differ by format (repacked Q4_0/Q8_0 GEMMs on CPUs, "
        "MXFP4's own tiles, K-quants' super-block scales)",
    )
    decode_format: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="gpu -> a weight format (``weight_format``, or float) -> the share of its family's decode "
        "efficiency a GPU reaches reading it: llama.cpp's matrix-vector kernels differ by format (one scale per "
        "block for Q4_0/Q8_0, super-blocks with sub-block scales for K-quants, codebooks for IQ formats)",
    )
    decode_row_flop_per_param: float = Field(
        default=0.0,
        ge=0,
        description="a GPU's work per active parameter, in FLOP at its shader ALUs' FP32 rate "
        "(``Target.vector_tflops``), for each row a decode step carries beyond the first (several users): "
        "llama.cpp's small-batch kernels multiply every weight they read with each row; fitted on published "
        "runs of 1-8 rows per step (scripts/fit_rows.py)",
    )
    decode_row_flop_by_build: dict[str, float] = Field(
        default_factory=dict,
        description="a llama.cpp build whose small-batch kernels are its own (Metal's mul_mv_ext) -> its work per "
        "active parameter for each further row, fitted on its own published runs; other builds take "
        "decode_row_flop_per_param",
    )
    fallback: dict[str, str] = Field(description="family -> the family whose constants it borrows when it has none")
    decode_interval: dict[str, tuple[float, float]] = Field(
        description="device group (gpu, apple, cpu, unified, all) -> (low, high) multipliers holding ~80% of results"
    )
    prefill_interval: dict[str, tuple[float, float]]
    builds_from: int = Field(
        description="the llama.cpp build the constants are for, and later ones: the fit reads older builds' GPU "
        "decode at a rate of its own"
    )
    builds_from_date: str = Field(description="about when that build was published (YYYY-MM)")
    source: str

    def row_flop_per_param(self, build: str) -> float:
        """FLOP per active parameter each further row of a decode step costs on ``build``'s GPU kernels."""
        return self.decode_row_flop_by_build.get(build, self.decode_row_flop_per_param)

    def intervals(self, family: str, group: str | None = None) -> tuple[tuple[float, float], tuple[float, float]]:
        """(decode, prefill) range multipliers for a family's device group, or for ``group`` ("hybrid":
        runs with weights in system memory beside a GPU)."""
        group = group or device_group(family)
        return (
            self.decode_interval.get(group, self.decode_interval["all"]),
            self.prefill_interval.get(group, self.prefill_interval["all"]),
        )

    def format_factor(self, kind: str, weight_format: str) -> float:
        """The prefill rate of quantized ``weight_format`` weights on a ``kind`` ("cpu" or "gpu") build
        against its family's quantized factor; 1 for a format without fitted rows."""
        return self.prefill_format.get(kind, {}).get(weight_format, 1.0)

    def read_factor(self, kind: str, float_share: float, quant_format: str) -> float:
        """The decode read rate of a model's weights on a ``kind`` ("gpu" or "cpu") device against its
        family's efficiency (``decode_format``): each format's factor weighted by its share of the bytes
        (``float_share`` of them float, the rest mostly ``quant_format``); 1 where none is fitted."""
        factors = self.decode_format.get(kind, {})
        if not factors:
            return 1.0
        f_float = factors.get("float", 1.0)
        f_quant = factors.get(quant_format, 1.0) if quant_format else 1.0
        return 1.0 / (float_share / f_float + (1.0 - float_share) / f_quant)

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
    n_layer: float,
    bandwidth_gb_s: float,
    c: FamilyConstants,
    active_params: float = 0.0,
    fp16_tflops: float = 0.0,
    moe_layers: float = 0.0,
    recurrent_layers: float = 0.0,
    attention_flops: float = 0.0,
    read_factor: float = 1.0,
) -> float:
    """Seconds to decode one token reading ``bytes_read`` bytes through ``n_layer`` layers, of which
    ``moe_layers`` route experts and ``recurrent_layers`` update a recurrent state (each kind with its
    own fixed cost), plus the arithmetic on ``active_params`` parameters where the device's rate makes
    it count (CPUs) and on the token's attention over its context (``attention_flops``)."""
    work = c.decode_flop_per_param * active_params + c.decode_attention_cost * attention_flops
    compute = work / (fp16_tflops * 1e12) if fp16_tflops > 0 else 0.0
    fixed = n_layer * c.per_layer_s + moe_layers * c.per_moe_layer_s + recurrent_layers * c.per_recurrent_layer_s
    return bytes_read / (c.decode_efficiency * read_factor * bandwidth_gb_s * 1e9) + fixed + compute


# Quantized weight formats whose prompt kernels differ, by ggml type name (or llama-bench's label).
WEIGHT_FORMATS = ("simple", "kquant", "iquant", "mxfp4")


def weight_format(type_name: str) -> str:
    """The format class of a ggml quantization type or a llama-bench model label: "simple" for the
    block formats with one scale (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: llama.cpp repacks Q4_0 and Q8_0 for the
    CPU's GEMMs), "kquant" (Q2_K-Q6_K: super-blocks with sub-block scales), "iquant" (IQ1-IQ4: lattice
    codebooks), "mxfp4" (gpt-oss's experts), "float" (F16, BF16, F32), "" when none is named."""
    t = type_name.upper()
    if "MXFP4" in t:
        return "mxfp4"
    if re.search(r"\bIQ\d", t):
        return "iquant"
    if re.search(r"\bQ\d_K", t):
        return "kquant"
    if re.search(r"\bQ[458]_[01]\b", t):
        return "simple"
    if re.search(r"\b(BF16|F16|F32)\b", t):
        return "float"
    return ""


def prefill_factor(c: FamilyConstants, float_weights: bool, backend: str = "") -> float:
    """The family's prefill rate factor for float or quantized weights, the build's own where fitted."""
    kind = "float" if float_weights else "quant"
    own = c.prefill_backend.get(backend, {}).get(kind)
    return own if own else (c.prefill_float if float_weights else c.prefill_quant)


def prefill_tokens_per_s(
    active_params: float,
    fp16_tflops: float,
    float_weights: bool,
    c: FamilyConstants,
    moe_factor: float = 1.0,
    backend: str = "",
    attention_flops: float = 0.0,
    format_factor: float = 1.0,
) -> float:
    """Prompt tokens per second for ``active_params`` parameters per token on ``fp16_tflops``;
    ``moe_factor`` is ``prefill_batch_factor``'s for the ubatch (it slows the weights' matrix products),
    ``backend`` the llama.cpp build (its own factor where one was fitted), ``attention_flops`` a prompt
    token's attention over the tokens before it, ``format_factor`` the quantized format's
    (``SpeedModel.format_factor``; float weights have their own factor)."""
    flops = 2 * active_params / max(moe_factor, 1e-9) + attention_flops
    own = 1.0 if float_weights else format_factor
    return prefill_factor(c, float_weights, backend) * own * fp16_tflops * 1e12 / flops


def batch_efficiency(tokens: float, half_tokens: float) -> float:
    """Share of a matrix kernel's full rate reached when it multiplies a weight matrix by ``tokens``
    rows: t / (t + half), since its tiles are sized for many rows and a few rows leave them mostly
    empty (llama.cpp's ``mul_mat_q`` tiles, the CPU's repacked GEMM blocks)."""
    if half_tokens <= 0:
        return 1.0
    return tokens / (tokens + half_tokens) if tokens > 0 else 0.0


def prefill_batch_factor(
    ubatch_tokens: int, used: int, experts: int, routed_share: float, half_tokens: float, exponent: float = 1.0
) -> float:
    """A ubatch's matrix rate against the kernels' full rate: the dense matrices (attention, shared
    experts, every matrix of a dense model) get all ``ubatch_tokens`` rows; each expert the ubatch
    routes to gets ubatch x used / (experts x the share of experts it reaches, ``expert_coverage``) of
    them (``ggml_mul_mat_id``: one matrix product per expert), so a mixture of experts prefills slower
    than a dense model of its active size unless ``-ub`` is large."""
    n = max(ubatch_tokens, 1)
    dense = batch_efficiency(n, half_tokens)
    if routed_share <= 0 or experts <= 0 or used <= 0:
        return dense
    per_expert = n * min(used, experts) / (experts * max(expert_coverage(n, used, experts, exponent), 1e-9))
    routed = batch_efficiency(per_expert, half_tokens)
    return 1.0 / ((1 - routed_share) / max(dense, 1e-9) + routed_share / max(routed, 1e-9))


def ubatch_read_seconds(
    ubatch_bytes: float, bandwidth_gb_s: float, c: FamilyConstants, read_factor: float = 1.0
) -> float:
    """Seconds a prompt ubatch spends reading ``ubatch_bytes`` of weights from the device's memory, at
    the family's decode efficiency: each weight matrix is read once per ubatch (a mixture of experts'
    only for the experts the ubatch routes to), which dominates small ubatches (a short prompt, ``-ub``
    below 512) and large mixtures of experts on slow memory."""
    if not ubatch_bytes or not bandwidth_gb_s:
        return 0.0
    return ubatch_bytes / (c.decode_efficiency * read_factor * bandwidth_gb_s * 1e9)


def host_decode_seconds(
    host_bytes: float,
    host_bandwidth_gb_s: float,
    host_params: float,
    host_tflops: float,
    host_layers: int,
    h: HybridConstants,
    efficiency: float | None = None,
    weight_format: str = "",
) -> float:
    """Seconds a decoded token spends on the host's share of a GPU run: reading ``host_bytes`` at
    ``efficiency`` (default the fitted share of a spec bandwidth) of the host's bandwidth, the CPU's
    arithmetic on ``host_params`` at ``host_tflops`` (the threads in use), and the handoff at each of
    ``host_layers`` layers with host-resident weights."""
    eta = efficiency if efficiency is not None else h.host_efficiency
    read = host_bytes / (eta * host_bandwidth_gb_s * 1e9) if host_bytes else 0.0
    per_param = h.host_flop_per_param + h.format_flop_per_param.get(weight_format, 0.0)
    work = per_param * host_params / (host_tflops * 1e12) if host_tflops > 0 else 0.0
    return read + work + host_layers * h.sync_s


def expert_coverage(tokens: int, used: int, experts: int, exponent: float = 1.0) -> float:
    """Expected share of a layer's experts that ``tokens`` route to, each picking ``used`` of
    ``experts``: 1 - (1 - used/experts)^(tokens^exponent). Independent uniform routing is exponent 1;
    a prompt's tokens route alike (neighbouring tokens favour the same experts), so they reach as many
    experts as fewer independent tokens would: ``SpeedModel.routing_exponent``, fitted on published
    runs whose time is mostly copying or reading the experts a ubatch reaches."""
    if experts <= 0 or used <= 0:
        return 1.0
    independent = math.pow(max(tokens, 0), exponent)
    return 1.0 - math.pow(1.0 - min(used, experts) / experts, independent)


def offload_copy_seconds(copy_bytes: float, link_gb_s: float, pinned: bool, h: HybridConstants) -> float:
    """Seconds to copy ``copy_bytes`` of host-resident weights to the GPU over a ``link_gb_s`` PCIe link:
    pinned memory (``--no-mmap``: the GPU's host buffer) streams faster than memory-mapped pages."""
    share = h.pcie_pinned if pinned else h.pcie_pageable
    return copy_bytes / (share * link_gb_s * 1e9) if copy_bytes else 0.0
