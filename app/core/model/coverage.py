"""Which architectures FitScope's memory rules are proven for, against the llama.cpp it ships.

An architecture is *exact* when the dry-run proof (tests/test_proof.py, scripts/bench_accuracy.py)
loads sparse GGUFs of it into the real llama.cpp and finds the weights and the KV cache equal to the
estimate to the byte and the compute buffer within the proof's bounds, never below llama.cpp's (with
the measured placement allowance of app.core.memory.graphs where ggml's allocator needs one). Any
other architecture that llama.cpp loads is still estimated from its file's tensors (weights exact)
and metadata, with the
generic attention / recurrent rules, and is labelled *approximate*. An architecture llama.cpp does
not know cannot be loaded at all.

The names llama.cpp knows come from ``resources/llamacpp_architectures.json``, written from the
vendored source (``LLM_ARCH_NAMES`` in ``src/llama-arch.cpp``) by ``scripts/arch_coverage.py``.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Literal

from app.core.model.catalog import RESOURCES_DIR

ARCHITECTURES_PATH = RESOURCES_DIR / "llamacpp_architectures.json"

# Architecture -> the shapes the dry-run proof covers (tests/support/proof.py CASES).
PROVEN: dict[str, str] = {
    "llama": "Llama 3.x dense with grouped-query attention, Mixtral mixture of experts, Mistral Nemo's wide heads",
    "qwen2": "Qwen2.5 dense with attention bias, tied embeddings",
    "qwen3": "Qwen3 dense with q/k norm and explicit head width",
    "qwen3moe": "Qwen3 mixture of experts",
    "gemma2": "Gemma 2 sliding window, both --swa-full modes",
    "gemma3": "Gemma 3 sliding window (5 of 6 layers), both --swa-full modes",
    "phi3": "Phi-3 / Phi-4 fused QKV, multi-head attention",
    "deepseek2": "multi-head latent attention: DeepSeek-V2/V3.x, Kimi K2 / K2.5 / K2.6, GLM-4.7-Flash",
    "gpt-oss": "gpt-oss MXFP4 experts, sliding window, attention sinks",
    "mamba": "Mamba-1 recurrent state",
    "mistral3": "Ministral 3 with Llama 4 attention temperature",
    "seed_oss": "Seed-OSS 36B: 80 heads wider than the embedding, q/k/v bias",
    "minimax-m2": "MiniMax-M2: 256 experts with selection bias, full-width q/k norm",
    "ernie4_5-moe": "ERNIE 4.5 mixture of experts: dense first layer, shared experts, tied embeddings",
    "glm4moe": "GLM-4.5 / 4.5-Air: shared expert, q/k norm, a NextN layer in the file but not loaded",
    "lfm2": "LFM2: short-convolution layers among attention layers",
    "nemotron_h": "Nemotron-H: Mamba-2, attention and MLP blocks",
    "qwen3next": "Qwen3-Next: gated DeltaNet state, gated full attention, 512 experts, a NextN layer not loaded",
    "llama4": "Llama 4 Scout / Maverick: chunked attention, shared expert, interleaved MoE",
    "qwen35": "Qwen3.5 / 3.6 dense: gated DeltaNet state, gated full attention, an MTP block not loaded",
    "qwen35moe": "Qwen3.5 / 3.6 mixture of experts with a shared expert, gated DeltaNet, an MTP block not loaded",
    "gemma4": "Gemma 4: 256- and 512-wide heads, full-attention V from K, experts beside a dense MLP",
    "deepseek32": "DeepSeek-V3.2 sparse attention: MLA with the indexer's key cache and top-k buffers",
    "glm-dsa": "GLM-5 / 5.1 / 5.2 sparse attention: indexers on every layer or a quarter of them",
    "nemotron_h_moe": "Nemotron 3: Mamba-2, attention and ReLU-squared experts, latent experts, MTP block",
    "granitehybrid": "Granite 4.0-H: Mamba-2 and attention layers, experts with a shared expert or a dense FFN",
    "kimi-linear": "Kimi Linear: delta-attention state, latent attention every 4th layer, experts with a shared expert",
    "smollm3": "SmolLM3: Llama layout with NoPE on every fourth layer",
    "laguna": "Laguna XS.2: per-layer heads, full attention first in each period of 4, gated output",
    "gemma3n": "Gemma 3n: AltUp streams, LAuReL, per-layer inputs, KV cache on the first 20 layers only",
    "apertus": "Apertus: Llama attention with per-head q/k norms, an ungated xIELU MLP",
    "mistral4": "Mistral Small 4: DeepSeek's latent attention, experts with gate and up in one tensor, shared experts",
    "minimax-m3": "MiniMax-M3: sparse attention's block indexer and its key/value cache, experts with shared experts",
    "step35": "Step 3.5: window layers with their own heads, gated heads, experts and a shared expert, MTP blocks",
    "hy_v3": "HY V3: dense lead layers, experts with a shared expert, an MTP block whose experts stay loaded",
}

Status = Literal["exact", "approximate", "unknown"]

APPROXIMATE_NOTE = "approximate: this architecture's rules are not verified"


@dataclass(frozen=True)
class ArchCoverage:
    arch: str
    status: Status
    detail: str

    @property
    def label(self) -> str:
        return {"exact": "exact (proven)", "approximate": "approximate", "unknown": "not in llama.cpp"}[self.status]


@functools.cache
def llamacpp_architectures() -> tuple[str, tuple[str, ...]]:
    """(llama.cpp version, architecture names) the shipped llama.cpp loads; ("", ()) when the
    list is missing or unreadable."""
    try:
        raw = json.loads(ARCHITECTURES_PATH.read_text(encoding="utf-8"))
        names = tuple(str(n) for n in raw["architectures"])
        return str(raw.get("llama_cpp_python", "")), names
    except (OSError, ValueError, KeyError, TypeError):
        return "", ()


@functools.cache
def coverage(arch: str) -> ArchCoverage:
    """How FitScope's rules stand for the llama.cpp architecture ``arch``."""
    if arch in PROVEN:
        return ArchCoverage(arch, "exact", PROVEN[arch])
    version, known = llamacpp_architectures()
    if known and arch not in known:
        return ArchCoverage(
            arch,
            "unknown",
            f"the llama.cpp FitScope ships (llama-cpp-python {version}) does not know this architecture",
        )
    return ArchCoverage(
        arch,
        "approximate",
        "weights exact (summed from the file's tensors); KV cache, recurrent state and compute buffers "
        "from the generic rules, not verified against llama.cpp for this architecture",
    )


def is_exact(arch: str) -> bool:
    return arch in PROVEN


def approximate_sentence(arch: str) -> str:
    """The plain-words caveat shown beside an estimate of an unproven architecture."""
    return (
        f"Approximate: FitScope's rules for this architecture ({arch}) are not verified against llama.cpp. "
        "The weights are exact (read from the file); the conversation memory and working buffers may be off, "
        "so keep a margin."
    )


def coverage_table() -> list[ArchCoverage]:
    """Every architecture the shipped llama.cpp knows, and any proven one it does not list."""
    _, known = llamacpp_architectures()
    names = sorted(set(known) | set(PROVEN))
    return [coverage(n) for n in names]
