"""Published llama-bench results (tests/data/llama_bench_*.json) as rows the speed model can fit and
be judged on: the device's bandwidth and FP16 rate, the model's bytes, layers and active share, the
test (pp/tg, tokens, depth) and the published tokens/s. Used by scripts/fit_speed.py and the tests.

Device figures come from the catalog (resources/catalog/devices.json) where the device is in it,
else from the devices files collected with the rows; Apple GPU variants scale their generation's
catalog figure by GPU cores; CPUs' FP32 rate is threads (at most the cores) x 3 GHz x SIMD lanes x
2 (FMA) x 2 (units), the estimator's own rule (app.core.memory.targets.cores_flops_tflops), at the clock
the CPU's busy cores hold instead where its clocks are known (``CPU_CLOCKS``, ``targets.busy_clock_ghz``;
a GPU's host keeps 3 GHz).

Rows with weights in system memory beside a GPU (group "hybrid", tests/data/llama_bench_budget.json)
are split as llama.cpp places them: the routed experts of the first ``--n-cpu-moe`` layers (or of
every layer with ``-ot exps=CPU``) and the layers a partial ``-ngl`` leaves behind are read and
computed on the host (tests/data/budget_hosts.json: its cores, SIMD and memory), and copied to the
GPU for each prompt ubatch over the card's PCIe link. A model's expert and active shares come from
the catalog's tensors where the model is in the catalog, else from its published parameter counts.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import multiprocessing
import os
import re
import zlib
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from app.core.hardware.devices import default_pcie
from app.core.hardware.host_memory import DEFAULT_HOST_MEMORY, HOST_CPU, HOST_MEMORY, parse_pcie, pcie_gb_s
from app.core.memory.targets import NOMINAL_GHZ, busy_clock_ghz, cores_flops_tflops, kernel_tflops, prompt_tflops
from app.core.model.catalog import load_devices
from app.core.speed.model import (
    DEFAULT_HYBRID,
    PREFILL_POOLS,
    WEIGHT_FORMATS,
    FamilyConstants,
    HybridConstants,
    decode_seconds_per_token,
    expert_coverage,
    host_decode_seconds,
    offload_copy_seconds,
    prefill_batch_factor,
    prefill_peak_multiplier,
    prefill_tokens_per_s,
    speed_family,
    ubatch_read_seconds,
    weight_format,
)

DATA = Path(__file__).parent / "data"

# CPU memory systems not in the collected device files: channels x 8 bytes x MT/s (JEDEC grades
# of the platform's supported memory), and physical cores (vendor spec pages).
CPU_SPECS: dict[str, tuple[float, int, int]] = {  # name fragment -> (GB/s, cores, SIMD fp32 lanes)
    "Ryzen 9 7950X": (83.2, 16, 16),
    "Threadripper PRO 5975WX": (204.8, 32, 8),
    "Threadripper PRO 5995WX": (204.8, 64, 8),
    "Threadripper 3970X": (102.4, 32, 8),
    "Xeon Platinum 8480": (307.2, 56, 16),
    "N100": (38.4, 4, 8),
    "i5-4278U": (25.6, 2, 8),
    "Ryzen 7 8840U": (89.6, 8, 16),
    "i3-1315U": (83.2, 6, 8),
    "i5-1135G7": (68.3, 4, 16),
    "i5-9500": (42.7, 6, 8),
    "i7-7820HQ": (38.4, 4, 8),
    "i7-8550U": (38.4, 4, 8),  # ark.intel.com: DDR4-2400, 2 channels
}
# CPUs' (base, boost) clocks in GHz, for their arithmetic (``targets.busy_clock_ghz``): the makers' spec
# pages (ark.intel.com, amd.com), for the Intel N100 (whose page states no base clock) notebookcheck.net's
# review, for the Google-only EPYC 9B14 Google Cloud's C3D machine page, for the Xeon 8480 engineering sample
# the Xeon Platinum 8480+'s. A hybrid Intel CPU's are its performance cores'. ARM server and board CPUs run at
# one clock.
CPU_CLOCKS: dict[str, tuple[float, float]] = {  # name fragment -> (base, boost)
    "N100": (1.0, 3.4),
    "5995WX": (2.7, 4.5),
    "5975WX": (3.6, 4.5),
    "8550U": (1.8, 4.0),
    "4278U": (2.6, 3.1),
    "HX 370": (2.0, 5.1),
    "Xeon Platinum 8480": (2.0, 3.8),
    "Ryzen 9 7950X": (4.5, 5.7),
    "3970X": (3.7, 4.5),
    "EPYC 9B14": (2.6, 3.7),
    "i3-1315U": (1.2, 4.5),
    "i7-7820HQ": (2.9, 3.9),
    "i5-9500": (3.0, 4.4),
    "8840U": (3.3, 5.1),
    "i5-1135G7": (2.4, 4.2),
    "i3-14100": (3.5, 4.7),
    "EPYC 9554": (3.1, 3.75),
    "i9-14900HX": (2.2, 5.8),
    "i9-13900H": (2.6, 5.4),
    "EPYC 9374F": (3.85, 4.3),
    "Ryzen AI MAX+ 395": (3.0, 5.1),
    "Ryzen 9 7900 ": (3.7, 5.4),
    "i7-1360P": (2.2, 5.0),
    "Ryzen 9 9950X": (4.3, 5.7),
    "EPYC 9655": (2.6, 4.5),
    "Ryzen Z1": (3.2, 4.9),
    "Ryzen 5 3500": (3.6, 4.1),
    "i5-12600K": (3.7, 4.9),
    "i9-10900X": (3.7, 4.5),
    "Ryzen 7 7700X": (4.5, 5.4),
    "Ryzen 7 5700X": (3.4, 4.6),
    "Ultra 7 265K": (3.9, 5.5),
    "BCM2712": (2.4, 2.4),  # Raspberry Pi 5 and CM5: Raspberry Pi's product briefs
    "Raspberry Pi 5": (2.4, 2.4),
    "Ampere Altra": (3.0, 3.0),  # Oracle Cloud's A1 shapes: Altra Q80-30
    "Graviton4": (2.8, 2.8),  # AWS's Graviton4 page
}


def cpu_clocks(name: str) -> tuple[float, float] | None:
    """A collected CPU's (base, boost) GHz (``CPU_CLOCKS``), None where its name is not there."""
    return next((v for k, v in CPU_CLOCKS.items() if k.lower() in name.lower()), None)


UNIFIED_SPECS: dict[str, tuple[float, float]] = {  # name fragment -> (GB/s, FP16 dense TFLOPS)
    "DGX Spark": (273.0, 62.5),  # GB10: 1 PFLOP FP4 sparse -> FP16 dense 1/16
    "Ryzen AI Max": (256.0, 59.4),  # 40 RDNA 3.5 CUs x 2.9 GHz x 512 FP16 FLOP/clock
    "8060S": (256.0, 59.4),  # the Ryzen AI Max+ 395's GPU, as llama.cpp prints it
}
# GPUs of budget rows that are in neither the catalog nor the devices file: (GB/s, FP16 TFLOPS) from
# the vendor's figures (CUDA cores / SMs, boost clock, memory bus and speed), by the catalog's rule
# for GeForce tensor FP16 (SMs x boost x 512); the GTX 1650 SUPER has no tensor cores (2 x FP32).
EXTRA_GPUS: dict[str, tuple[float, float]] = {
    "rtx 3050": (168.0, 13.5),  # 6 GB: 18 SMs at 1.47 GHz, 96-bit GDDR6 at 14 Gbps
    "gtx 1650 super": (192.0, 8.8),  # 1280 cores at 1.725 GHz, 128-bit GDDR6 at 12 Gbps
    "arc pro b70": (608.0, 183.5),  # 256 XMX engines x 256 FP16 FLOP/clock at 2.8 GHz; 256-bit GDDR6, 19 Gbps
    "arc a770": (560.0, 137.6),  # 16 GB: 512 XMX engines x 128 FP16 FLOP/clock at 2.1 GHz; 256-bit GDDR6, 17.5 Gbps
    "a100-sxm4-40gb": (1555.0, 312.0),  # NVIDIA's A100 datasheet: HBM2 at 1,555 GB/s, 312 dense FP16 tensor TFLOPS
    "gb10": (273.0, 62.5),  # the DGX Spark's chip as CUDA prints it: the catalog's DGX Spark figures
    # 188 SMs as the full card's 503.8, at the 300 W edition's 2,280 MHz boost instead of 2,617
    "rtx pro 6000 blackwell max-q": (1792.0, 438.9),
    # NVIDIA's laptop RTX 4070: 36 SMs at the top of its 1.23-2.175 GHz boost range (the maker sets it by
    # the laptop's power limit), 128-bit GDDR6 at 16 Gbps
    "rtx 4070 laptop": (256.0, 40.1),
    "rtx 2060": (336.0, 25.8),  # 30 SMs at 1.68 GHz x 512, 192-bit GDDR6 at 14 Gbps
    "quadro rtx 5000": (448.0, 89.2),  # NVIDIA's tensor figure (48 SMs at 1.815 GHz x 1024), 256-bit at 14 Gbps
    # RDNA 1/2 have no matrix cores: packed FP16 on 64 lanes, 256 FLOP per CU per clock at the boost clock
    "rx 6700 xt": (384.0, 26.4),  # 40 CUs at 2.581 GHz, 192-bit at 16 Gbps
    "rx 6800 xt": (512.0, 41.5),  # 72 CUs at 2.25 GHz, 256-bit at 16 Gbps
    "rx 5700 xt": (448.0, 19.5),  # 40 CUs at 1.905 GHz, 256-bit at 14 Gbps
}
# Hosts of budget rows, by a fragment of the row's host or device name -> budget_hosts.json "cpu".
HOSTS: dict[str, str] = {
    "i5-12600k": "Intel Core i5-12600K",
    "i9-10900x": "Intel Core i9-10900X",
    "ryzen 9 7900 ": "AMD Ryzen 9 7900 12-Core Processor",
    "i7-1360p": "Intel Core i7-1360P (laptop)",
    "9950x": "AMD Ryzen 9 9950X",
    "epyc 9655": "AMD EPYC 9655 96-Core Processor",
    "epyc 9b14": "AMD EPYC 9B14",
    "raspberry pi 5": "Raspberry Pi 5 16GB (Broadcom BCM2712, 4x Cortex-A76)",
    "ryzen 5 3500": "AMD Ryzen 5 3500",
    "ryzen 9 7950x": "AMD Ryzen 9 7950X",
    "i7-8550u": "Intel(R) Core(TM) i7-8550U CPU @ 1.80GHz",
    "hx 370": "AMD Ryzen AI 9 HX 370 (GPD Pocket 4)",
    "oracle cloud a1": "Ampere Altra (Oracle Cloud A1 VM)",
    "graviton4": "AWS Graviton4 (c8g.4xlarge, 16 vCPU)",
    "epyc 9554": "AMD EPYC 9554 64-Core Processor",
    "i3-14100": "Intel(R) Core(TM) i3-14100",
    "7700x": "AMD Ryzen 7 7700X",
    "i9-14900hx": "Intel Core i9-14900HX",
    "i9-13900h": "Intel Core i9-13900H",
    "epyc 9374f": "AMD EPYC 9374F",
    "5700x": "AMD Ryzen 7 5700X",
    "ultra 7 265k": "Intel Core Ultra 7 265K",
}

# Model shapes by llama-bench's model string: layers, f16 KV bytes per token of depth, active share.
_SHAPES: list[tuple[str, int, int, float]] = [
    (r"gpt-oss.?120b", 36, 36 * 8 * 64 * 4 // 2, 5.13 / 116.83),
    (r"gpt-oss.?(20b|\?b)", 24, 24 * 8 * 64 * 4 // 2, 3.61 / 20.91),
    (r"qwen3moe 30b", 48, 48 * 4 * 128 * 4, 3.3 / 30.5),
    (r"qwen3moe 235b", 94, 94 * 4 * 128 * 4, 22.0 / 235.1),
    (r"glm4moe 106b", 46, 46 * 8 * 128 * 4, 12.0 / 106.0),
    (r"deepseek2 16b", 27, 27 * 576 * 2, 2.4 / 15.7),
    (r"deepseek2 671b", 61, 61 * 576 * 2, 37.0 / 671.0),
    (r"deepseek2 30b\.a3b", 47, 47 * 576 * 2, 3.0 / 29.9),  # GLM-4.7-Flash
    (r"hunyuan-moe a13b", 32, 32 * 8 * 128 * 4, 13.0 / 80.4),
    (r"dots1 142b", 62, 62 * 32 * 128 * 4, 14.0 / 142.8),
    (r"llama4 17b", 48, 48 * 8 * 128 * 4, 17.0 / 107.8),
    (r"qwen3next 80b", 48, 12 * 2 * 256 * 4, 3.0 / 79.67),  # 12 of 48 layers have attention
    (r"qwen35moe 35b", 40, 10 * 2 * 256 * 4, 3.0 / 35.0),  # 10 of 40 layers have attention
    (r"gemma4 26b", 30, 30 * 8 * 256 * 4 // 2, 4.0 / 25.23),
    (r"gemma4 31b", 60, 60 * 16 * 256 * 4 // 2, 1.0),
    # Authors' own labels ("Llama 3.1 70B Q4_K_M", "TinyLlama 1.1B") as well as llama-bench's strings.
    (r"tinyllama", 22, 22 * 4 * 64 * 4, 1.0),
    (r"llama (3\.\d )?1b", 16, 16 * 8 * 64 * 4, 1.0),
    (r"llama (3\.\d )?3b", 28, 28 * 8 * 128 * 4, 1.0),
    (r"llama (3\.\d )?8b", 32, 32 * 8 * 128 * 4, 1.0),
    (r"llama (2 )?7b", 32, 32 * 32 * 128 * 4, 1.0),
    (r"llama 13b", 40, 40 * 40 * 128 * 4, 1.0),
    (r"llama (3\.\d )?70b", 80, 80 * 8 * 128 * 4, 1.0),
    (r"qwen2(\.5)? 1\.5b", 28, 28 * 2 * 128 * 4, 1.0),
    (r"qwen2(\.5)? 3b", 36, 36 * 2 * 128 * 4, 1.0),
    (r"qwen2(\.5)?(-coder)? 7b", 28, 28 * 4 * 128 * 4, 1.0),
    (r"qwen2(\.5)? 14b", 48, 48 * 8 * 128 * 4, 1.0),
    (r"qwen2(\.5)? 32b", 64, 64 * 8 * 128 * 4, 1.0),
    (r"qwen3 32b", 64, 64 * 8 * 128 * 4, 1.0),
    (r"qwen3 8b", 36, 36 * 8 * 128 * 4, 1.0),
    (r"qwen3 1\.7b", 28, 28 * 8 * 128 * 4, 1.0),
    (r"gemma3 4b", 34, 34 * 4 * 256 * 4 // 6, 1.0),
    (r"gemma3 27b", 62, 62 * 16 * 128 * 4 // 6, 1.0),
    # Nemotron 3 Nano: 52 layers, of which 6 have attention (2 KV heads of 128), 23 route experts.
    (r"nemotron_h_moe 31b", 52, 6 * 2 * 128 * 4, 3.5 / 31.58),
    (r"mistral3|llama 13b|\bnemo\b|12b|14b", 40, 40 * 8 * 128 * 4, 1.0),
]
# Query heads per KV head (n_head / n_head_kv, resources/catalog/models.json and the models' configs):
# a token's attention FLOPs per token of context are its f16 KV bytes x this (4 x layers x heads x
# head size). Multi-head latent attention (deepseek2) computes 2 x heads x (576 + 512) per layer against
# 576 x 2 cached bytes. Others: 4.
_GQA: list[tuple[str, float]] = [
    (r"gpt-oss", 8),
    (r"qwen3moe 235b|qwen3-235b|qwen3\.5-122b|qwen35moe 122b", 16),
    (r"qwen3moe 30b|qwen3-30b|qwen3 30b|qwen3-coder-30b|qwen3next|qwen3-coder-next|qwen3\.[56]-35b|qwen35moe", 8),
    (r"glm4moe|glm-4\.5", 12),
    (r"deepseek2 671b", 2 * 128 * 1088 / 1152),
    (r"deepseek2|deepseek-coder-v2", 2 * 16 * 1088 / 1152),
    (r"dots1|llama 7b|llama 2 7b|llama 13b", 1),
    (r"hunyuan|llama (3\.\d )?8b|llama-3\.1-8b|mistral|nemo|phi-4|ministral", 4),
    (r"llama4", 5),
    (r"gemma|qwen3 1\.7b", 2),
    (r"tinyllama|llama (3\.\d )?70b|qwen3 32b|bailingmoe2|ling-flash", 8),
    (r"llama (3\.\d )?1b", 4),
    (r"llama (3\.\d )?3b", 3),
    (r"qwen2(\.5)?(-coder)? 7b", 7),
    (r"qwen2(\.5)? 1\.5b", 6),
    (r"qwen2(\.5)? 3b", 8),
    (r"qwen2(\.5)?[ -](coder-)?(14|32)b|qwen3-14b", 5),
]


# Dense models whose token embedding is not the output head (tie_word_embeddings false in the models'
# config.json): vocabulary x hidden size. llama-bench's parameter count and file size hold the embedding,
# but a token only looks up its row, so FitScope's reads and arithmetic (``tensor_totals``) leave it out,
# and the fit leaves it out of these rows too. A mixture of experts' active count is published without it
# or taken from the catalog's tensors; tied and unknown models keep their count.
_UNTIED_EMBEDDINGS: list[tuple[str, int, int]] = [
    (r"tinyllama", 32000, 2048),
    (r"llama (3\.\d )?8b|llama-3\.1-8b", 128256, 4096),
    (r"llama (2 )?7b", 32000, 4096),
    # llama.cpp names every 40-layer llama "13B": Llama 2 13B (13.0 B parameters) and, with Mistral's
    # 131072-token vocabulary, Mistral Nemo (12.2 B) and Mistral Small 24B (23.6 B) (``untied_embedding``).
    (r"llama 13b", 0, 5120),
    # Llama 2 70B (32000 tokens, 69.0 B) or Llama 3 70B (128256, 70.6 B) (``untied_embedding``).
    (r"llama (3\.\d )?70b", 0, 8192),
    (r"phi3 14b|phi-4", 100352, 5120),
    (r"qwen2(\.5)?(-coder)? 7b", 152064, 3584),
    (r"qwen2(\.5)?[ -](coder-)?(14|32)b", 152064, 5120),
    (r"qwen3 8b", 151936, 4096),
    (r"qwen3[ -](14|32)b", 151936, 5120),
    (r"qwen35 27b", 248320, 5120),
    (r"glm4 32b", 151552, 6144),
]


def untied_embedding(label: str, params_b: float) -> float:
    """Parameters of a dense model's untied token embedding (``_UNTIED_EMBEDDINGS``; 0 if tied or unknown)."""
    t = label.lower()
    for pattern, vocab, hidden in _UNTIED_EMBEDDINGS:
        if re.search(pattern, t):
            if not vocab:
                vocab = (
                    (32000 if 12.5 < params_b < 14 else 131072)
                    if hidden == 5120
                    else (32000 if params_b < 69.5 else 128256)
                )
            return float(vocab * hidden)
    return 0.0


def _gqa(label: str) -> float:
    t = label.lower()
    return next((g for pattern, g in _GQA if re.search(pattern, t)), 4.0)


# llama-bench's size and params columns for rows that were posted without them (the same files
# appear with both columns elsewhere in the data: LLaMA-2 7B, Llama 3.x 8B/1B, gpt-oss-120b MXFP4).
_KNOWN_SIZES: dict[str, tuple[float, float]] = {
    "llama 7b q4_0": (3.56, 6.74),
    "llama 7b q8_0": (6.67, 6.74),
    "llama 7b f16": (12.55, 6.74),
    "llama 8b q4_0": (4.33, 8.03),
    "llama 8b q8_0": (7.95, 8.03),
    "llama 8b q4_k_m": (4.58, 8.03),
    "llama 3.1 8b q4_k_m": (4.58, 8.03),
    "llama 8b q5_0": (5.21, 8.03),
    "llama 1b q4_k - medium": (0.75, 1.24),
    "gpt-oss-120b": (59.02, 116.83),
}
_FLOAT = re.compile(r"\b(f16|bf16|f32)\b", re.I)
_TEST = re.compile(r"^(pp|tg)\s*(\d+)?(?:\s*@\s*d(\d+))?$")
MAX_PREFILL_TOKENS = 4096  # longer single-device prompts are attention-bound, which the data's shapes omit


@dataclass(frozen=True)
class ModelShape:
    """A model of the budget rows: the catalog entry whose tensors give its shares, or its published
    parameter counts (``total_b``, ``active_b``) and routing (``used`` of ``experts``)."""

    n_layer: int
    kv: int  # f16 KV bytes per token of depth
    total_b: float
    active_b: float
    used: int = 0
    experts: int = 0
    catalog: str | None = None
    quant: str = "Q4_K_M"
    recurrent: int = 0  # linear-attention / SSM layers
    dense_lead: int = 0  # leading layers without routed experts

    @property
    def moe_layers(self) -> int:
        return self.n_layer - self.dense_lead if self.experts else 0


# By a fragment of llama-bench's model string or the file name, lower case.
_MODELS: list[tuple[str, ModelShape]] = [
    (r"gpt-oss.?120b|gpt-oss 120b", ModelShape(36, 36 * 8 * 64 * 2, 116.83, 5.13, 4, 128, "gpt-oss-120b", "MXFP4_MOE")),
    (r"gpt-oss.?20b|gpt-oss 20b", ModelShape(24, 24 * 8 * 64 * 2, 20.91, 3.61, 4, 32, "gpt-oss-20b", "MXFP4_MOE")),
    (
        r"qwen3-coder-next|qwen3next",
        ModelShape(48, 12 * 2 * 256 * 4, 79.67, 3.0, 10, 512, "qwen3-next-80b-a3b", recurrent=36),
    ),
    (r"qwen3\.5-122b|qwen35moe 122b", ModelShape(48, 12 * 2 * 256 * 4, 122.0, 10.0, 8, 256, recurrent=36)),
    (r"qwen3\.[56]-35b|qwen35moe 35b", ModelShape(40, 10 * 2 * 256 * 4, 35.0, 3.0, 8, 256, recurrent=30)),
    (
        r"qwen3-30b-a3b|qwen3 30b-a3b|qwen3moe 30b|qwen3-coder-30b",
        ModelShape(48, 48 * 4 * 128 * 4, 30.53, 3.3, 8, 128, "qwen3-30b-a3b"),
    ),
    (
        r"glm-4\.5-air|glm4moe 106b",
        ModelShape(46, 46 * 8 * 128 * 4, 110.47, 12.0, 8, 128, "glm-4.5-air", "Q4_K_S", dense_lead=1),
    ),
    (
        r"deepseek-coder-v2-lite|deepseek2 16b",
        ModelShape(27, 27 * 576 * 2, 15.7, 2.4, 6, 64, "deepseek-v2-lite", dense_lead=1),
    ),
    (r"ling-flash|bailingmoe2", ModelShape(32, 32 * 4 * 128 * 4, 102.89, 6.1, 8, 256, dense_lead=1)),
    (r"hunyuan", ModelShape(32, 32 * 8 * 128 * 4, 80.39, 13.0, 8, 64)),
    (r"mistral-small-24b", ModelShape(40, 40 * 8 * 128 * 4, 23.57, 23.57, catalog="mistral-small-24b")),
    (r"gemma-3-12b", ModelShape(48, 48 * 8 * 256 * 4 // 6, 11.77, 11.77, catalog="gemma-3-12b")),
    (r"gemma-2-9b", ModelShape(42, 42 * 8 * 256 * 4, 9.24, 9.24, catalog="gemma-2-9b")),
    (r"qwen3-14b", ModelShape(40, 40 * 8 * 128 * 4, 14.77, 14.77, catalog="qwen3-14b")),
    (r"qwen2\.5-(coder-)?14b", ModelShape(48, 48 * 8 * 128 * 4, 14.77, 14.77, catalog="qwen2.5-14b")),
    (r"phi-4", ModelShape(40, 40 * 10 * 128 * 4, 14.66, 14.66, catalog="phi-4")),
    (r"llama 3\.1 8b|llama-3\.1-8b", ModelShape(32, 32 * 8 * 128 * 4, 8.03, 8.03, catalog="llama-3.1-8b")),
    (r"gemma4 26b|gemma-4-26b", ModelShape(30, 30 * 8 * 256 * 4 // 2, 25.23, 4.0, 8, 128)),
    (r"llama4 17b", ModelShape(48, 48 * 8 * 128 * 4, 107.8, 17.0, 1, 16)),
    (r"dots1 142b", ModelShape(62, 62 * 32 * 128 * 4, 142.8, 14.0, 6, 128, dense_lead=1)),
    (r"qwen3moe 235b", ModelShape(94, 94 * 4 * 128 * 4, 235.1, 22.0, 8, 128)),
    (r"deepseek2 671b", ModelShape(61, 61 * 576 * 2, 671.0, 37.0, 8, 256, dense_lead=3)),
    (r"deepseek2 30b\.a3b", ModelShape(47, 47 * 576 * 2, 29.9, 3.0, 4, 64, dense_lead=1)),
]


# File sizes (GiB) of quantizations of models outside the catalog, where a row gives none: the same
# file's size printed by llama-bench elsewhere in the data (Qwen3.6-35B-A3B UD-Q4_K_M / UD-Q4_K_XL on
# Strix Halo), or Q8_0's definition (8.5 bits per weight: 32 int8 and one f16 scale per block).
_QUANT_SIZES: dict[str, dict[str, float]] = {
    "qwen3.5-35b": {"q4_k_m": 20.6, "q4_k_xl": 21.27, "q8_0": 35.0e9 * 8.5 / 8 / 1024**3},
    "qwen3.6-35b": {"q4_k_m": 20.6, "q4_k_xl": 21.27, "q8_0": 35.0e9 * 8.5 / 8 / 1024**3},
}


def _quant_size(label: str) -> float | None:
    t = label.lower()
    for model, sizes in _QUANT_SIZES.items():
        if model in t:
            return next((size for quant, size in sizes.items() if quant in t), None)
    return None


@dataclass(frozen=True)
class ModelFigures:
    size_gib: float
    params_b: float
    expert_share: float  # of the file's bytes in routed experts
    active_share: float  # of the file's bytes read per decoded token
    expert_params_b: float  # routed expert parameters in total
    dense_active_b: float  # parameters every token computes besides the routed experts
    used_ratio: float = 0.0  # experts used per token / experts

    @property
    def routed_share(self) -> float:
        """Of the parameters a token computes, the share in routed experts."""
        routed = self.expert_params_b * self.used_ratio
        return routed / (routed + self.dense_active_b) if routed else 0.0


@functools.cache
def model_figures(shape: ModelShape) -> ModelFigures:
    """A model's shares, from the catalog's tensors (its quantization preset) or from its parameter
    counts (experts = (total - active) / (1 - used/experts), bytes taken as uniform per parameter)."""
    if shape.catalog:
        from app.core.memory.layers import tensor_totals
        from app.core.model.source import model_from_catalog

        m = model_from_catalog(shape.catalog, shape.quant)
        t = tensor_totals(m.arch, m.tensors)
        expert_params = sum(t.active_expert_params) / (shape.used / shape.experts) if shape.experts else 0.0
        return ModelFigures(
            size_gib=t.model_bytes / 1024**3,
            params_b=sum(x.n_elements for x in m.tensors) / 1e9,
            expert_share=sum(t.expert_bytes) / t.model_bytes,
            active_share=sum(t.active_layer_bytes) / t.model_bytes,
            expert_params_b=expert_params / 1e9,
            dense_active_b=(t.active_params - sum(t.active_expert_params)) / 1e9,
            used_ratio=shape.used / shape.experts if shape.experts else 0.0,
        )
    ratio = shape.used / shape.experts if shape.experts else 1.0
    experts = (shape.total_b - shape.active_b) / (1 - ratio) if shape.experts else 0.0
    return ModelFigures(
        size_gib=0.0,
        params_b=shape.total_b,
        expert_share=experts / shape.total_b,
        active_share=shape.active_b / shape.total_b,
        expert_params_b=experts,
        dense_active_b=shape.total_b - experts,
        used_ratio=ratio if shape.experts else 0.0,
    )


# Dense (and hybrid recurrent) models of the catalog, by a fragment of llama-bench's model string or the
# file's name: their shape is the catalog architecture's (``_catalog_shape``).
_CATALOG_MODELS: list[tuple[str, str]] = [
    (r"qwen3\.5-0\.8b|qwen35 0\.8b", "qwen3.5-0.8b"),
    (r"qwen3\.6-27b|qwen36 27b", "qwen3.6-27b"),
    (r"qwen3\.5-27b|qwen35 27b", "qwen3.5-27b"),
    (r"gemma-4-e2b|gemma4 e2b", "gemma-4-e2b"),
    (r"gemma-4-e4b|gemma4 e4b", "gemma-4-e4b"),
    (r"ministral-3-3b", "ministral-3-3b"),
    (r"ministral-3-8b", "ministral-3-8b"),
    (r"nemotron_h 9b|nemotron-nano-9b", "nemotron-nano-9b-v2"),
    (r"gemma3 1b|gemma-3-1b", "gemma-3-1b"),
    (r"gemma2 2b|gemma-2-2b", "gemma-2-2b"),
]


@functools.cache
def _catalog_shape(catalog: str) -> ModelShape:
    """A dense catalog model's shape from its architecture: its layers (less NextN ones), f16 KV bytes
    per token of depth (``kv_widths``: none on recurrent layers and on layers sharing an earlier cache),
    its recurrent layers and its parameters."""
    from app.core.memory.kv import kv_widths
    from app.core.model.source import model_from_catalog

    m = model_from_catalog(catalog, "Q4_K_M")
    a = m.arch
    layers = [i for i in range(a.n_layer) if not a.is_nextn_layer(i)]
    kv = 2 * sum(k + v for k, v in kv_widths(a))
    params = sum(t.n_elements for t in m.tensors) / 1e9
    recurrent = sum(1 for i in layers if a.is_recurrent_layer(i))
    return ModelShape(len(layers), kv, params, params, catalog=catalog, recurrent=recurrent)


def _shape_of(text: str, size_gib: float | None = None) -> ModelShape | None:
    t = text.lower()
    if "gpt-oss ?b" in t and size_gib:
        # Builds of August 2025 printed gpt-oss's size class as "?B": the file's size tells which.
        t = t.replace("?b", "120b" if size_gib > 30 else "20b")
    shape = next((shape for pattern, shape in _MODELS if re.search(pattern, t)), None)
    if shape is None:
        catalog = next((cid for pattern, cid in _CATALOG_MODELS if re.search(pattern, t)), None)
        shape = _catalog_shape(catalog) if catalog else None
    return shape


# The fit evaluates these for every row at every trial of the shared constants; rows share their arguments.
_coverage = functools.lru_cache(maxsize=65536)(expert_coverage)
_batch_factor = functools.lru_cache(maxsize=65536)(prefill_batch_factor)


@dataclass(frozen=True)
class Globals:
    """The constant every family shares (``SpeedModel.prefill_half_tokens``)."""

    half_tokens: float = 0.0
    routing_exponent: float = 1.0  # ``expert_coverage``'s
    # ((cpu | gpu, weight format), prefill factor against the family's quantized one): ``SpeedModel.prefill_format``
    prefill_format: tuple[tuple[tuple[str, str], float], ...] = ()
    # ((gpu, weight format), decode read rate against the family's efficiency): ``SpeedModel.decode_format``
    decode_format: tuple[tuple[tuple[str, str], float], ...] = ()
    # A GPU's decode read rate with a build older than DECODE_RELEASE against current builds' (the ones
    # FitScope predicts for): fitted, never shipped.
    older_rate: float = 1.0

    @functools.cached_property
    def _read_rate(self) -> dict[tuple[str, str], float]:
        return dict(self.decode_format)

    @functools.cached_property
    def _prompt_rate(self) -> dict[tuple[str, str], float]:
        return dict(self.prefill_format)

    def decode_factor(self, r: BenchRow) -> float:
        """A row's weight format's decode read rate against its family's efficiency (1 where none is fitted)."""
        return self._read_rate.get((r.format_kind, r.weight_format), 1.0)

    def token_rate(self, r: BenchRow) -> float:
        """A decoded token's read rate against its family's efficiency: its format's (``decode_factor``)
        and, on a GPU with an older build (``_older_kernels``), that build's."""
        older = r.older_kernels and r.format_kind in DECODE_FORMAT_KINDS
        return self.decode_factor(r) * (self.older_rate if older else 1.0)

    def format_factor(self, r: BenchRow) -> float:
        """A row's quantized format's prefill factor (1 for float GEMMs and formats without one)."""
        if r.gemm_float:
            return 1.0
        return self._prompt_rate.get((r.format_kind, r.weight_format), 1.0)

    def formats(self) -> dict[str, dict[str, float]]:
        """The prefill factors as ``SpeedModel.prefill_format`` holds them."""
        return _by_kind(self.prefill_format)

    def read_rates(self) -> dict[str, dict[str, float]]:
        """The decode read rates as ``SpeedModel.decode_format`` holds them."""
        return _by_kind(self.decode_format)


def _by_kind(factors: tuple[tuple[tuple[str, str], float], ...]) -> dict[str, dict[str, float]]:
    """((kind, format), factor) pairs as {kind: {format: factor}}."""
    out: dict[str, dict[str, float]] = {}
    for (kind, fmt), v in factors:
        out.setdefault(kind, {})[fmt] = v
    return out


@dataclass(frozen=True)
class BenchRow:
    source: str
    device: str
    family: str
    group: str  # gpu | apple | cpu | unified | hybrid
    bandwidth_gb_s: float
    fp16_tflops: float
    weight_bytes: float
    params: float
    active_share: float
    n_layer: int
    kv_bytes_per_token: int
    float_weights: bool
    test: str  # pp | tg
    depth: int
    tokens_per_s: float
    backend: str = ""
    tokens: int = 512  # prompt tokens of a pp test
    moe_layers: int = 0
    recurrent_layers: int = 0
    # The host's share of a hybrid row (weights in system memory beside the GPU).
    host_bytes: float = 0.0  # host-resident weight bytes read per decoded token
    host_bandwidth_gb_s: float = 0.0
    host_params: float = 0.0  # host-resident parameters computed per decoded token
    host_tflops: float = 0.0
    host_layers: int = 0
    # Host-resident weight bytes one ubatch copies to the GPU: all the dense ones, the experts' as far as
    # the ubatch reaches them (``expert_coverage``).
    copy_dense_bytes: float = 0.0
    copy_expert_bytes: float = 0.0
    ubatch_tokens: int = 512
    link_gb_s: float = 0.0
    pinned: bool = False
    # Prefill: the weight bytes one ubatch reads on the device (a mixture of experts' routed share,
    # ``expert_coverage``), and whether the prompt's matrix products ran on float kernels.
    read_dense_bytes: float = 0.0
    read_expert_bytes: float = 0.0
    gemm_float: bool = False
    experts_used: int = 0
    experts: int = 0
    routed_share: float = 0.0  # of the active parameters, in routed experts
    gqa: float = 4.0  # query heads per KV head
    host_stated: bool = True  # a hybrid row's source names its host (CPU, memory)
    weight_format: str = ""  # ``weight_format`` of the model's label: simple, kquant, iquant, mxfp4, float
    mmap_stated: bool = True  # a hybrid row's source says whether the weights were memory-mapped
    release: int = 0  # the llama.cpp build number the source printed (0 where it printed none)
    older_kernels: bool = False  # built before DECODE_RELEASE (``_older_kernels``)
    # A dense model's untied token embedding, held in ``params`` and ``weight_bytes`` but only looked up
    # (``untied_embedding``): left out of the parameters computed and the bytes read per token.
    embedding_params: float = 0.0
    embedding_bytes: float = 0.0

    @property
    def attention_flops(self) -> float:
        """A token's attention FLOPs: a prompt token's over the depth and, on average, half the prompt
        before it; a decoded token's over the cache it reads (``mean_depth``)."""
        context = self.depth + self.tokens / 2 if self.test == "pp" else self.mean_depth
        return self.kv_bytes_per_token * self.gqa * context

    def coverage(self, g: Globals) -> float:
        """Share of the experts one ubatch reaches (``expert_coverage``)."""
        n_ub = max(1, min(self.ubatch_tokens, self.tokens))
        return _coverage(n_ub, self.experts_used, self.experts, g.routing_exponent) if self.experts else 1.0

    def copy_bytes(self, g: Globals) -> float:
        return self.copy_dense_bytes + self.copy_expert_bytes * self.coverage(g)

    def ubatch_bytes(self, g: Globals) -> float:
        return self.read_dense_bytes + self.read_expert_bytes * self.coverage(g)

    def moe_factor(self, g: Globals) -> float:
        """The ubatch's matrix rate against the kernels' full rate (``prefill_batch_factor``)."""
        n_ub = max(1, min(self.ubatch_tokens, self.tokens))
        return _batch_factor(
            n_ub, self.experts_used, self.experts, self.routed_share, g.half_tokens, g.routing_exponent
        )

    @property
    def active_params(self) -> float:
        """Parameters a token computes: the active ones less an untied embedding (``embedding_params``)."""
        return self.params * self.active_share - self.embedding_params

    @property
    def bytes_per_token(self) -> float:
        return self.weight_bytes * self.active_share - self.embedding_bytes + self.kv_bytes_per_token * self.mean_depth

    @property
    def mean_depth(self) -> float:
        """Tokens in the cache while the test runs, on average: a decode test (tgN @ dD) generates N
        tokens after D, so the KV cache it reads grows from D to D + N (half of N on average)."""
        return self.depth + (self.tokens / 2 if self.test == "tg" else 0.0)

    @property
    def format_kind(self) -> str:
        """Whose prompt kernels run the matrix products: "cpu" for a CPU build, "gpu" otherwise (a GPU
        with weights in system memory runs them on the GPU)."""
        return "cpu" if self.group == "cpu" else "gpu"

    @property
    def build(self) -> str:
        """The llama.cpp build as FitScope names it (cuda, rocm, vulkan, metal, cpu); an AMD GPU's ROCm or
        Vulkan build older than ``AMD_PROMPT_RELEASE`` is a build of its own (``rocm<7000``), so that
        its prompt rate is fitted apart from current builds', the ones FitScope predicts for."""
        b = self.backend.split(",")[0]
        b = {"mtl": "metal", "blas": "metal" if self.group == "apple" else "cpu", "hip": "rocm"}.get(b, b)
        old = 0 < self.release < AMD_PROMPT_RELEASE
        if old and b in ("rocm", "vulkan") and self.family.startswith(("amd", "unified-amd")):
            return f"{b}<{AMD_PROMPT_RELEASE}"
        return b

    @property
    def kind(self) -> str:
        """hybrid, cpu, amd or other: the groups the cross-validation reports apart."""
        if self.group == "hybrid":
            return "hybrid"
        if self.group == "cpu":
            return "cpu"
        return "amd" if self.family.startswith(("amd", "unified-amd")) else "other"

    def predict(self, c: FamilyConstants, h: HybridConstants = DEFAULT_HYBRID, g: Globals | None = None) -> float:
        g = g or Globals()
        active = self.active_params
        moe = self.moe_factor(g)
        if self.group == "hybrid":
            if self.test == "tg":
                gpu = decode_seconds_per_token(
                    self.bytes_per_token - self.host_bytes,
                    self.n_layer,
                    self.bandwidth_gb_s,
                    c,
                    active - self.host_params,
                    self.fp16_tflops,
                    self.moe_layers,
                    self.recurrent_layers,
                    self.attention_flops,
                    g.token_rate(self),
                )
                host = host_decode_seconds(
                    self.host_bytes,
                    self.host_bandwidth_gb_s,
                    self.host_params,
                    self.host_tflops,
                    self.host_layers,
                    h,
                    weight_format=self.weight_format,
                )
                return 1.0 / (gpu + host)
            compute = self.ubatch_tokens / prefill_tokens_per_s(
                active,
                self.fp16_tflops,
                self.gemm_float,
                c,
                moe,
                self.build,
                self.attention_flops,
                g.format_factor(self),
            )
            copy = offload_copy_seconds(self.copy_bytes(g), self.link_gb_s, self.pinned, h)
            read = ubatch_read_seconds(self.ubatch_bytes(g), self.bandwidth_gb_s, c, g.decode_factor(self))
            return self.ubatch_tokens / (compute + copy + read)
        if self.test == "tg":
            return 1.0 / decode_seconds_per_token(
                self.bytes_per_token,
                self.n_layer,
                self.bandwidth_gb_s,
                c,
                active,
                self.fp16_tflops,
                self.moe_layers,
                self.recurrent_layers,
                self.attention_flops,
                g.token_rate(self),
            )
        n_ub = max(1, min(self.ubatch_tokens, self.tokens))
        compute = n_ub / prefill_tokens_per_s(
            active, self.fp16_tflops, self.gemm_float, c, moe, self.build, self.attention_flops, g.format_factor(self)
        )
        read = ubatch_read_seconds(self.ubatch_bytes(g), self.bandwidth_gb_s, c, g.decode_factor(self))
        return n_ub / (compute + read)


def _catalog_gpu(device: str):
    """The catalog's card a printed device name is; a laptop GPU is none of the desktop cards of its name
    (NVIDIA's laptop RTX 4070 has half the desktop card's memory bus and fewer SMs)."""
    if re.search(r"laptop|mobile", device.lower()):
        return None
    name = re.sub(r"\s*\(.*?\)", "", device).replace("NVIDIA ", "").replace("GeForce ", "").strip().lower()
    name = name.replace("-sxm4-80gb", " 80gb sxm").replace("v100-pcie-32gb", "v100")
    key = name.replace("amd ", "")
    exact, prefixes, longer = None, [], []
    for d in load_devices():
        cat = d.name.lower().replace("nvidia ", "").replace("geforce ", "").replace("amd ", "")
        if cat == key:
            exact = d
        elif key.startswith(cat + " "):
            prefixes.append((len(cat), d))  # "rtx 3060" for a printed "rtx 3060" with more words
        elif cat.startswith(key + " "):
            longer.append((len(cat), d))  # "rtx 3060 12gb" for a printed "rtx 3060"
    if exact is not None:
        return exact
    if prefixes:
        return max(prefixes, key=lambda x: x[0])[1]
    # A printed "RTX 3080" is the base card (10GB), never the Ti or SUPER.
    base = [(n, d) for n, d in longer if not re.search(r"\b(ti|super|xt|xtx|gre)\b", d.name.lower()[len(key) :])]
    return min(base or longer, key=lambda x: x[0])[1] if (base or longer) else None


def _apple(device: str):
    m = re.match(r"(M\d)( Pro| Max| Ultra)? (\d+)-core GPU", device)
    if not m:
        return None
    gen, tier, cores = m.group(1), (m.group(2) or "").strip(), int(m.group(3))
    for d in load_devices():
        dm = re.match(rf"Apple {gen}( Pro| Max| Ultra)? \((\d+)-core GPU\)", d.name)
        if dm and (dm.group(1) or "").strip() == tier:
            return d.fp16_tflops / int(dm.group(2)) * cores
    for d in load_devices():  # same generation, another tier: per-core rate
        dm = re.match(rf"Apple {gen}( Pro| Max| Ultra)? \((\d+)-core GPU\)", d.name)
        if dm:
            return d.fp16_tflops / int(dm.group(2)) * cores
    return None


def _shape(model: str) -> tuple[int, int, float]:
    m = model.lower()
    for pattern, layers, kv, share in _SHAPES:
        if re.search(pattern, m):
            return layers, kv, share
    moe = re.search(r"(\d+(?:\.\d+)?)b\.a(\d+(?:\.\d+)?)b", m)
    return 32, 131072, (float(moe.group(2)) / float(moe.group(1)) if moe else 1.0)


def _float(label: str) -> bool:
    """Whether a file's matrices are F16/BF16/F32 (cuBLAS-class kernels); gpt-oss's "F16" files keep
    their experts, nearly all the arithmetic, in MXFP4."""
    t = label.lower()
    # "all F32 (guessed)" is what llama.cpp prints for a file whose type it cannot name (a custom mix of
    # quantized types: 9.6 GiB for Qwen3-30B-A3B is 2.7 bits per weight), not float weights.
    return bool(_FLOAT.search(label)) and "gpt-oss" not in t and "mxfp4" not in t and "guessed" not in t


def _parse_test(text: str) -> tuple[str, int, int] | None:
    """(pp|tg, tokens, depth) of a llama-bench test name ("pp512 @ d4096"); a stated generation of
    unstated length counts as tg at depth 0."""
    t = text.replace("tg ", "tg").replace("pp ", "pp").strip()
    m = _TEST.match(t)
    if m:
        return m.group(1), int(m.group(2) or 0), int(m.group(3) or 0)
    if t.startswith("tg("):
        return "tg", 0, 0
    return None


def _kernel_flops(flops: float | None, spec, quantized: bool) -> float | None:
    """A GPU row's FP16 rate: for a decode or a prompt of quantized weights, the rate llama.cpp's quantized
    kernels run at where it is below the card's matrix peak (``targets.kernel_tflops``: an RDNA 4 card's
    packed-FP16 rate), as FitScope predicts them; the peak otherwise."""
    own = kernel_tflops(spec) if quantized and spec is not None else None
    return own or flops


def _gpu_spec(device: str, gpu_dev: dict) -> tuple[float | None, float | None, object]:
    spec = _catalog_gpu(device)
    info = gpu_dev.get(device, {})
    extra = next((v for k, v in EXTRA_GPUS.items() if k in device.lower()), None)
    bw = (spec.bandwidth_gb_s if spec else None) or info.get("bandwidth_gb_s") or (extra[0] if extra else None)
    flops = (
        (spec.fp16_tflops if spec else None) or info.get("fp16_tensor_tflops_dense") or (extra[1] if extra else None)
    )
    return bw, flops, spec


@functools.cache
def _hosts() -> dict[str, dict]:
    return {h["cpu"]: h for h in json.loads((DATA / "budget_hosts.json").read_text())}


def host_of(text: str | None) -> dict | None:
    """The budget host whose name fragment appears in ``text`` (a row's host CPU or device)."""
    t = (text or "").lower() + " "
    name = next((cpu for frag, cpu in HOSTS.items() if frag in t), None)
    return _hosts().get(name) if name else None


def _host_figures(host: dict | None) -> tuple[float, int, int]:
    """(GB/s, cores, FP32 lanes) of a budget host; FitScope's default host (dual-channel DDR5-5600,
    an 8-core AVX2 CPU) where the source does not name one."""
    if host is None:
        cores, avx512 = HOST_CPU[DEFAULT_HOST_MEMORY]
        return HOST_MEMORY[DEFAULT_HOST_MEMORY][1], cores, 16 if avx512 else 8
    bw = host.get("bandwidth_gb_s")
    if not bw and host.get("memory_mt_s"):
        bw = (host.get("memory_channels") or 2) * 8 * host["memory_mt_s"] / 1000
    if not bw:
        bw = next((v[0] for k, v in CPU_SPECS.items() if k.lower() in host["cpu"].lower()), None)
    lanes = {"avx512": 16, "avx2": 8}.get(host.get("simd") or "", 4)
    return float(bw or 0.0), int(host["cores"]), lanes


def _cpu_device_specs(device: str, other_dev: dict) -> tuple[float, int, int] | None:
    frag = next((k for k in CPU_SPECS if k in device), None)
    if frag is not None:
        return CPU_SPECS[frag]
    info = other_dev.get(device)
    if info and info.get("bandwidth_gb_s") and info.get("cores"):
        lanes = {"avx512": 16, "avx2": 8}.get((info.get("simd") or "").lower(), 4)
        return float(info["bandwidth_gb_s"]), int(info["cores"]), lanes
    host = host_of(device)
    if host is not None:
        bw, cores, lanes = _host_figures(host)
        return (bw, cores, lanes) if bw else None
    return None


# Sources whose rows the fit leaves out, and why (tests/data/llama_bench_budget.md lists the caveats).
EXCLUDED_SOURCES: dict[str, str] = {
    "pestopoppa/epyc-inference-research": "a llama.cpp branch build (feature/paged-attention), run on a two-NUMA-node "
    "box with 775 GiB of page cache in use: 70B decode at a tenth of the memory's bandwidth, varying run to run",
    "AlexsJones/llmfit": "not llama-bench: llama-server generation speeds after a chat prompt, averaged by a "
    "third-party harness, with the offload taken from each pull request's text rather than a run log (the rows' notes)",
    "ArmDeveloperEcosystem/arm-learning-paths": "a llama-bench table that is not the output of the command printed "
    "above it (other model, threads and prompt sizes), so its host (the learning path's Graviton4 instance) is "
    "inferred, not stated",
}


# The sources gathered in one batch after the constants were fitted (December 2026,
# tests/data/llama_bench_fresh.md), kept out of the fit as a test set: ``fresh_held`` predicts their rows
# from the fit on the other sources, a standing answer to how the model does on sources it never saw.
FRESH_SOURCES: frozenset[str] = frozenset(
    (
        "66666kbit/vulkan-slowpath-rx9070xt",
        "FlagOpen/FlagScale",
        "OSH-2026/9P-Walkers",
        "OSH-2026/IronHook",
        "Orion-zhen/llama-bench-dashboard",
        "chrisdesrochers/MoEArc",
        "daimonionnn/AMD-RDNA-LLM-Tuning-Toolkit",
        "gaperton/cicero-home-ai",
        "ggml-org/llama.cpp#13885",
        "ggml-org/llama.cpp#14001",
        "ggml-org/llama.cpp#16095",
        "ggml-org/llama.cpp#17576",
        "ggml-org/llama.cpp#17879",
        "ggml-org/llama.cpp#17917",
        "ggml-org/llama.cpp#18537",
        "ggml-org/llama.cpp#18666",
        "ggml-org/llama.cpp#22078",
        "ggml-org/llama.cpp#22880",
        "ggml-org/llama.cpp#26705",
        "ghost91-/llama-bench",
        "github-document-52043577398",
        "github-document-53143770214",
        "github-document-60236002535",
        "github-document-60384482074",
        "github-document-60478284340",
        "ikawrakow/ik_llama.cpp#180",
        "ikawrakow/ik_llama.cpp#334",
        "ikawrakow/ik_llama.cpp#683",
        "jbettcher-wg/omarchy-ppc64le-packaging",
        "jiegec/kb",
        "kennel-org/llama-bench-tuner",
        "michal-konik-human/radeon-r9700-rocm-notes",
    )
)


def load_rows(excluded: bool = False, fresh: bool = False) -> list[BenchRow]:
    """The rows the constants are fitted on: every published row whose device, model and test are
    understood (single GPUs and boxes, CPUs, and GPUs with weights in system memory) less the
    EXCLUDED_SOURCES (or only those, ``excluded``) and the FRESH_SOURCES (or only those, ``fresh``)."""
    rows = _all_rows()
    return [
        r
        for r in rows
        if (source_key(r.source) in EXCLUDED_SOURCES) == excluded and (source_key(r.source) in FRESH_SOURCES) == fresh
    ]


@functools.cache
def _all_rows() -> tuple[BenchRow, ...]:
    return tuple(_single_device_rows() + _budget_rows())


def _single_device_rows() -> list[BenchRow]:
    gpu_dev = {d["device"]: d for d in json.loads((DATA / "llama_bench_gpu_devices.json").read_text())}
    other_dev = {d["device"]: d for d in json.loads((DATA / "llama_bench_apple_cpu_devices.json").read_text())}
    raw = [r | {"group": "gpu"} for r in json.loads((DATA / "llama_bench_gpu.json").read_text())]
    raw += json.loads((DATA / "llama_bench_apple_cpu.json").read_text())
    budget = json.loads((DATA / "llama_bench_budget.json").read_text())
    raw += [r for r in budget if r["group"] in ("cpu", "amd")]
    rows = []
    for r in raw:
        test = _parse_test(r["test"])
        label = r.get("model") or r.get("model_name") or ""
        if not r.get("size_gib") or not r.get("params_b"):
            known = _KNOWN_SIZES.get(label.lower())
            shape = _shape_of(label)
            if known:
                r = r | {"size_gib": known[0], "params_b": known[1]}
            elif shape is not None and shape.catalog:
                fig = model_figures(shape)
                r = r | {"size_gib": r.get("size_gib") or fig.size_gib, "params_b": r.get("params_b") or fig.params_b}
        if not test or (r.get("n_gpus") or 1) != 1 or not r.get("size_gib") or not r.get("params_b"):
            continue
        kind_test, tokens, depth = test
        if kind_test == "pp" and (tokens > MAX_PREFILL_TOKENS or tokens == 0):
            continue
        group = "unified" if r["group"] == "amd" and "8060s" in r["device"].lower() else r["group"]
        group = "gpu" if group == "amd" else group
        device = r["device"]
        threads = r.get("threads")
        if group == "gpu":
            bw, flops, spec = _gpu_spec(device, gpu_dev)
            flops = _kernel_flops(flops, spec, kind_test == "tg" or not _float(label))
        elif group == "apple":
            bw = other_dev.get(device, {}).get("bandwidth_gb_s")
            flops = _apple(device)
        elif group == "unified":
            frag = next((k for k in UNIFIED_SPECS if k in device), None)
            bw, flops = UNIFIED_SPECS[frag] if frag else (None, None)
        else:
            specs = _cpu_device_specs(device, other_dev)
            if specs is None:
                continue
            bw, cores, lanes = specs
            n = min(threads or cores, cores)
            # A prompt of quantized weights at the width of llama.cpp's kernels for it (PROMPT_LANES).
            narrow = kind_test == "pp" and not _float(label)
            flops = prompt_tflops(n, lanes) if narrow else cores_flops_tflops(n, lanes)
            # At the clock its busy cores hold (``busy_clock_ghz``; the nominal one where not known).
            flops *= busy_clock_ghz(n, cores, cpu_clocks(device)) / NOMINAL_GHZ
        if not bw or not flops:
            continue
        layers, kv, share = _shape(label)
        shape = _shape_of(label, r.get("size_gib"))
        moe_layers, recurrent = (layers if share < 0.5 else 0), 0
        expert_share, used, experts, routed = 0.0, 0, 0, 0.0
        if shape is not None:
            fig = model_figures(shape)
            layers, kv, share = shape.n_layer, shape.kv, fig.active_share
            moe_layers, recurrent = shape.moe_layers, shape.recurrent
            expert_share, used, experts, routed = fig.expert_share, shape.used, shape.experts, fig.routed_share
        kind = "cpu" if group == "cpu" else "gpu"
        n_ub = _ubatch(r, tokens or 512) if kind_test == "pp" else 1
        size = float(r["size_gib"]) * 1024**3
        # A dense model's untied embedding, at the file's mean bytes per parameter (the file's name
        # tells what llama.cpp's label does not: TinyLlama and Llama 3.2 1B are both "llama 1B").
        named = f"{r.get('model') or ''} {r.get('model_name') or ''}"
        embedding = untied_embedding(named, float(r["params_b"])) if share >= 1.0 else 0.0
        embedding_bytes = embedding * size / (float(r["params_b"]) * 1e9)
        read_dense, read_expert = size * (1 - expert_share) - embedding_bytes, size * expert_share
        backend = (r.get("backend") or "").lower()
        family = speed_family(device, kind, backend)
        gemm_float = _float(label)
        if not gemm_float and family.startswith(("nvidia", "unified-nvidia")) and _before_mmq(r):
            # CUDA builds before June 2024 (PR #8075) dequantized the weights to F16 for cuBLAS at each
            # ubatch: the F16 copy is written and read again (4 bytes per parameter).
            gemm_float = True
            read_dense += 4 * float(r["params_b"]) * 1e9 * share
        rows.append(
            BenchRow(
                source=r["source"],
                device=_device_name(device),
                family=family,
                group=group,
                bandwidth_gb_s=float(bw),
                fp16_tflops=float(flops),
                weight_bytes=float(r["size_gib"]) * 1024**3,
                params=float(r["params_b"]) * 1e9,
                active_share=share,
                n_layer=layers,
                kv_bytes_per_token=kv,
                float_weights=_float(label),
                test=kind_test,
                depth=depth,
                tokens_per_s=float(r["tokens_per_s"]),
                backend=backend,
                tokens=tokens or (512 if kind_test == "pp" else 128),
                moe_layers=moe_layers,
                recurrent_layers=recurrent,
                ubatch_tokens=n_ub,
                read_dense_bytes=read_dense if kind_test == "pp" else 0.0,
                read_expert_bytes=read_expert if kind_test == "pp" else 0.0,
                gemm_float=gemm_float,
                experts_used=used,
                experts=experts,
                routed_share=routed,
                gqa=_gqa(label),
                weight_format=_format_of(r),
                release=_release(r),
                older_kernels=_older_kernels(r),
                embedding_params=embedding,
                embedding_bytes=embedding_bytes,
            )
        )
    return rows


def _format_of(r: dict) -> str:
    """The weight format of a row's model, from llama-bench's label or else the file's name. A label
    that says float where the matrices are not (``_float``) names the format of the other tensors:
    gpt-oss's "F16" files (60.9 GiB for 116.8 B parameters) keep their experts in MXFP4, and a
    "guessed" type is a mix of quantized ones."""
    fmt = weight_format(r.get("model") or "") or weight_format(r.get("model_name") or "")
    label = f"{r.get('model') or ''} {r.get('model_name') or ''}"
    if fmt == "float" and not _float(label):
        return "mxfp4" if "gpt-oss" in label.lower() else ""
    return fmt


def _ubatch(r: dict, tokens: int) -> int:
    """The tokens of one prompt ubatch: -ub (llama-bench's default 512), at most -b (default 2048; a
    row that raises -ub past it raised -b with it) and at most the prompt."""
    ub = r.get("n_ubatch") or 512
    return max(1, min(ub, tokens, r.get("n_batch") or max(2048, ub)))


# AMD GPUs' prompt kernels changed in the autumn of 2025: WMMA int8 matrix kernels (MMQ) for RDNA 4
# (llama.cpp PR #17156, November 2025) and RDNA 3 (#17576), and Vulkan's shaders over the same months.
# The rows show the step between builds 6645 and 7147 (Ryzen AI Max+ 395 prefill about 1.2-2.5x slower
# than current builds' prediction before it, about 0.8x after); builds before it are fitted apart.
AMD_PROMPT_RELEASE = 7000


def _release(r: dict) -> int:
    """The llama.cpp build number of a row (``b7423`` or ``abc1234 (7423)``), 0 where none is printed."""
    m = re.search(r"\((\d{3,5})\)|\bb(\d{4,5})\b", r.get("build") or "")
    return int(m.group(1) or m.group(2)) if m else 0


# A GPU's decode kernels were reworked through the autumn of 2025 (fused operators in CUDA graphs, the
# matrix-vector kernels of Vulkan and ROCm); the rows of builds before it decode slower than current
# builds' prediction on every GPU family that shows both. One step, at the same build as AMD_PROMPT_RELEASE.
DECODE_RELEASE = AMD_PROMPT_RELEASE
DECODE_RELEASE_DATE = "2025-11"  # about when build 7000 was published, for rows that print no build


def _built_before(r: dict, release: int, date: str) -> bool:
    """Whether a row's llama.cpp build predates build ``release``: by its build number, else by its
    source's date against ``date`` (neither printed: a current build)."""
    if printed := _release(r):
        return printed < release
    return bool(r.get("date")) and r["date"] < date


def _older_kernels(r: dict) -> bool:
    """Whether a row's llama.cpp build predates DECODE_RELEASE."""
    return _built_before(r, DECODE_RELEASE, DECODE_RELEASE_DATE)


def _before_mmq(r: dict) -> bool:
    """Whether a row's llama.cpp build predates int8 tensor-core prompt kernels by default on NVIDIA
    (PR #8075, merged 2024-06-24, about build 3200)."""
    return _built_before(r, 3200, "2024-06-24")


def _device_name(device: str) -> str:
    if speed_family(device) == "unified-amd":
        return "Ryzen AI Max+ 395"  # printed as its GPU (Radeon 8060S, gfx1151) by each backend its own way
    name = re.sub(r"\s*\((RADV|NVIDIA|radv|AMD open)[^)]*\)", "", device).replace("PRO", "Pro")
    return re.sub(r"\s*\(x\d\)|\s*\(\d+ ?G[^)]*\)|\s*\d+GB$", "", name).strip()


def _budget_rows() -> list[BenchRow]:
    """The hybrid rows: a GPU with weights in system memory (``--n-cpu-moe``, ``-ot exps=CPU``, a
    partial ``-ngl``), split as llama.cpp places them."""
    gpu_dev = {d["device"]: d for d in json.loads((DATA / "llama_bench_gpu_devices.json").read_text())}
    rows = []
    for r in json.loads((DATA / "llama_bench_budget.json").read_text()):
        if r["group"] != "hybrid":
            continue
        test = _parse_test(r["test"])
        label = r.get("model") or r.get("model_name") or ""
        shape = _shape_of(label) or _shape_of(r.get("model_name") or "")
        if test is None or shape is None:
            continue
        kind_test, tokens, depth = test
        fig = model_figures(shape)
        size_gib = r.get("size_gib") or _quant_size(label) or fig.size_gib
        params_b = r.get("params_b") or fig.params_b
        bw, flops, spec = _gpu_spec(r["device"], gpu_dev)
        flops = _kernel_flops(flops, spec, kind_test == "tg" or not _float(label))
        if not bw or not flops or not size_gib:
            continue
        host = host_of(r.get("host_cpu"))
        host_bw, cores, lanes = _host_figures(host)
        if host is None and r.get("memory_mt_s"):
            # The memory is stated though the CPU is not: its bandwidth, on the threads the row used.
            host_bw = (r.get("memory_channels") or 2) * 8 * r["memory_mt_s"] / 1000
            cores = r.get("threads") or cores
        host_stated = host is not None or bool(r.get("memory_mt_s"))
        threads = r.get("threads") or cores
        size = size_gib * 1024**3
        scale = params_b / fig.params_b  # the row's file against the shape's parameters
        n = shape.n_layer
        experts_in_ram = 0
        if shape.experts:
            ot = (r.get("override_tensors") or "").lower()
            experts_in_ram = min(r.get("n_cpu_moe") or 0, n)
            if not experts_in_ram and "exps" in ot and "=cpu" in ot:
                experts_in_ram = n  # -ot exps=CPU: every layer's routed experts
        ngl = r.get("ngl")
        # llama-bench prints its default (every layer on the GPU) as -1 since 2025.
        layers_in_ram = max(0, n + 1 - ngl) if ngl is not None and 0 <= ngl <= n else 0
        expert_layer = size * fig.expert_share / n
        dense_layer = size * (1 - fig.expert_share) / n
        ratio = shape.used / shape.experts if shape.experts else 0.0
        expert_params_layer = fig.expert_params_b * 1e9 * scale / n
        dense_params_layer = fig.dense_active_b * 1e9 * scale / n
        # A row that raises -ub past llama-bench's default -b 2048 raised -b with it (-ub is capped at -b).
        n_ub = min(r.get("n_ubatch") or 512, tokens or 512, r.get("n_batch") or max(2048, r.get("n_ubatch") or 0))
        only_experts = max(0, experts_in_ram - layers_in_ram) if layers_in_ram else experts_in_ram
        host_bytes = only_experts * expert_layer * ratio + layers_in_ram * (dense_layer + expert_layer * ratio)
        host_params = only_experts * expert_params_layer * ratio + layers_in_ram * (
            dense_params_layer + expert_params_layer * ratio
        )
        copy_dense = layers_in_ram * dense_layer
        copy_expert = (only_experts + layers_in_ram) * expert_layer
        host_layers = only_experts + layers_in_ram
        in_ram = only_experts * expert_layer + layers_in_ram * (dense_layer + expert_layer)
        if not host_layers or (r.get("host_ram_gib") and in_ram > (r["host_ram_gib"] - 2) * 1024**3):
            # Nothing in RAM, or more than the RAM holds beside the system: the weights stream from disk.
            continue
        link = _link(r.get("pcie"), spec, r["device"])
        # What a prompt ubatch reads of the weights that stay on the GPU.
        gpu_layers = n - layers_in_ram
        read_dense = gpu_layers * dense_layer
        read_expert = max(0, gpu_layers - only_experts) * expert_layer
        backend = (r.get("backend") or "").lower()
        rows.append(
            BenchRow(
                source=r["source"],
                device=_device_name(r["device"]),
                family=speed_family(r["device"], "gpu", backend),
                group="hybrid",
                bandwidth_gb_s=float(bw),
                fp16_tflops=float(flops),
                weight_bytes=size,
                params=params_b * 1e9,
                active_share=fig.active_share,
                n_layer=n - layers_in_ram,
                kv_bytes_per_token=shape.kv if (r.get("type_k") or "f16") == "f16" else shape.kv // 2,
                float_weights=_float(label),
                test=kind_test,
                depth=depth,
                tokens_per_s=float(r["tokens_per_s"]),
                backend=backend,
                tokens=tokens or (512 if kind_test == "pp" else 128),
                moe_layers=shape.moe_layers,
                recurrent_layers=shape.recurrent,
                host_bytes=host_bytes,
                host_bandwidth_gb_s=host_bw,
                host_params=host_params,
                # At the nominal clock (``busy_clock_ghz`` is for a CPU running a model alone): counted at the
                # hosts' own clocks, these rows' decode came out further from their results (19.4% -> 21.2%).
                host_tflops=cores_flops_tflops(min(threads, cores), lanes),
                host_layers=host_layers,
                copy_dense_bytes=copy_dense,
                copy_expert_bytes=copy_expert,
                ubatch_tokens=n_ub,
                link_gb_s=pcie_gb_s(*link),
                pinned=r.get("mmap") == 0,
                read_dense_bytes=read_dense if kind_test == "pp" else 0.0,
                read_expert_bytes=read_expert if kind_test == "pp" else 0.0,
                gemm_float=_float(label),
                experts_used=shape.used,
                experts=shape.experts,
                routed_share=fig.routed_share,
                gqa=_gqa(label),
                host_stated=host_stated,
                weight_format=_format_of(r),
                release=_release(r),
                older_kernels=_older_kernels(r),
                # llama-bench maps the file unless told --mmap 0; informal results may not be llama-bench's.
                mmap_stated=r.get("mmap") is not None or "informal" not in (r.get("notes") or ""),
            )
        )
    return rows


def _link(text: str | None, spec, device: str) -> tuple[int, int]:
    """A row's PCIe link: as stated, else the card's own (``default_pcie``), else PCIe 3.0 x16 for the
    Turing cards (GTX 16, RTX 20, Quadro RTX) and 4.0 x16 otherwise."""
    if text:
        try:
            return parse_pcie(re.sub(r"\s*\(.*", "", text))
        except ValueError:
            pass
    if spec is not None:
        link = default_pcie(spec)
        if link:
            return link
    return (3, 16) if re.search(r"gtx 16\d0|rtx 20\d0|quadro rtx", device.lower()) else (4, 16)


@functools.cache
def source_key(source: str) -> str:
    """The publication a row comes from, for folds grouped by source: a repository (its files, its
    PRs and issues by the same maintainers), or, in repositories that collect many people's results
    (llama.cpp's and ik_llama.cpp's threads, benchmark-submission issues), one thread; a web page."""
    if "://" not in source:
        return source.split(":")[0]  # owner/repo:path@commit
    url = urlparse(source)
    parts = [p for p in url.path.split("/") if p]
    if url.netloc == "github.com" and len(parts) >= 2:
        repo = f"{parts[0]}/{parts[1]}"
        community = repo in ("ggml-org/llama.cpp", "ikawrakow/ik_llama.cpp", "brand-o/normiebench")
        if community and len(parts) >= 4 and parts[2] in ("issues", "pull", "discussions"):
            return f"{repo}#{parts[3]}"
        return repo
    if "reddit" in url.netloc or "r/LocalLLaMA" in url.path:
        post = next((p for p in parts if re.fullmatch(r"[0-9a-z]{6,8}", p) and p != "comments"), url.path)
        return f"reddit:{post}"
    return url.netloc + url.path


# -- fitting ---------------------------------------------------------------------------------------

# Families fitted on top of the constants every family shares (the prompt kernels' batch constant, the
# routing exponent, the formats' factors) without moving them: Intel's, whose rows are one card's from
# two sources and whose mixtures of experts prefill at half the rate the shared constants give the
# other vendors' (llama.cpp's SYCL and Vulkan expert kernels).
ON_TOP_FAMILIES = ("intel-sycl", "intel-vulkan")

GROUP_FALLBACK = {
    "nvidia-geforce": "nvidia-gddr",
    "nvidia-gddr": "nvidia-geforce",
    "nvidia-hbm": "nvidia-gddr",
    "amd-cdna": "amd-rdna",
    "amd-rdna": "nvidia-gddr",
    "apple-m1": "apple-m2plus",
    "apple-m2plus": "apple-m1",
    "unified-nvidia": "nvidia-gddr",
    "unified-amd": "amd-rdna",
    "cpu-arm": "cpu-x86",
    "cpu-x86": "cpu-arm",
    "intel-vulkan": "intel-sycl",
    "intel-sycl": "nvidia-gddr",
}


def _fit_decode(rows: list[BenchRow], g: Globals | None = None) -> tuple[float, dict[str, float], float]:
    """(efficiency, {fixed costs per layer kind and FLOP per parameter}, squared log error) minimising
    the squared log error of 1/tg = x/eta + L*c + M*c_moe + R*c_rec + P*g, with the efficiency held
    to a physical 0.2-1.0 of the roofline and the other terms non-negative (each dropped when the
    rows carry no sign of it); each row's bytes read at its weight format's and build's rate (``g.token_rate``)."""
    g = g or Globals()
    x = np.array([r.bytes_per_token / (r.bandwidth_gb_s * 1e9 * g.token_rate(r)) for r in rows])
    cols = {
        "c": np.array([float(r.n_layer) for r in rows]),
        "m": np.array([float(r.moe_layers) for r in rows]),
        "r": np.array([float(r.recurrent_layers) for r in rows]),
        "g": np.array([r.active_params / (r.fp16_tflops * 1e12) for r in rows]),
        "a": np.array([r.attention_flops / (r.fp16_tflops * 1e12) for r in rows]),
    }
    # A layer kind's own cost only where the family's rows show it: enough rows, from several sources;
    # attention's where decode rows at a long context (2,048 tokens and more) show it.
    for key, has in (("m", lambda r: r.moe_layers), ("r", lambda r: r.recurrent_layers), ("a", _long_context)):
        if not _shown(rows, has):
            cols[key] = np.zeros_like(x)
    y = np.array([1.0 / r.tokens_per_s for r in rows])
    return _fit_roofline(x, cols, y, np.zeros_like(y))


def _long_context(r: BenchRow) -> bool:
    """A decode row deep enough into its context (2,048 tokens and more) to show attention's cost."""
    return r.mean_depth >= 2048


def _shown(rows: list[BenchRow], has) -> bool:
    """Whether ``rows`` show a term: enough rows with it (MIN_KIND_ROWS), from two sources at least."""
    chosen = [r for r in rows if has(r)]
    return len(chosen) >= MIN_KIND_ROWS and len({source_key(r.source) for r in chosen}) >= 2


def source_weights(rows: list[BenchRow]) -> np.ndarray:
    """Each row's weight in a prefill fit: 1/sqrt(the rows of its source), so that a source weighs as the
    square root of its rows rather than in proportion (a source is one build, one methodology and usually
    one machine, and forty rows of one say less about the next source than forty sources do)."""
    per = Counter(source_key(r.source) for r in rows)
    return np.array([1.0 / per[source_key(r.source)] ** 0.5 for r in rows])


def _fit_roofline(
    x: np.ndarray, cols: dict[str, np.ndarray], y: np.ndarray, offset: np.ndarray
) -> tuple[float, dict[str, float], float]:
    """(eta, coefficients, error) minimising sum log((offset + x/eta + sum cols_k * k) / y)^2, eta on a
    grid of 0.2-1.0 and the coefficients >= 0 by least squares on the relative residual (every subset
    of the columns that carry any signal is tried, so a term the rows cannot tell apart drops out)."""
    names = [k for k, v in cols.items() if np.any(v)]
    subsets = [tuple(k for i, k in enumerate(names) if mask >> i & 1) for mask in range(1 << len(names))]
    best: tuple[float, float, dict[str, float]] = (float("inf"), 1.0, {})
    etas = np.linspace(0.2, 1.0, 41)
    rests = (y[:, None] - offset[:, None] - x[:, None] / etas[None, :]) / y[:, None]  # one column per eta
    # Each subset's least squares for every eta at once (the design matrix does not depend on eta).
    solutions = {
        keep: np.linalg.lstsq(np.column_stack([cols[k] / y for k in keep]), rests, rcond=None)[0]
        for keep in subsets
        if keep
    }
    for j, eta in enumerate(etas):
        for keep in subsets:
            values: dict[str, float] = {}
            if keep:
                sol = solutions[keep][:, j]
                if (sol < 0).any():
                    continue
                values = dict(zip(keep, (float(v) for v in sol), strict=True))
            pred = offset + x / eta + sum((cols[k] * v for k, v in values.items()), np.zeros_like(y))
            if (pred <= 0).any():
                continue
            err = float(np.sum(np.log(pred / y) ** 2))
            if err < best[0]:
                best = (err, float(eta), values)
    return best[1], best[2], best[0]


_Parts = tuple[int, float, float, float, tuple[int, int, int, float, float]]


def _prefill_parts(r: BenchRow, g: Globals, efficiency: float) -> _Parts | None:
    """What ``_ratio_at`` needs of a prefill row that does not depend on the prompt kernels' batch constant
    (``Globals.half_tokens``, which the fit tries many values of): the ubatch's tokens, twice its active
    parameters, its attention FLOPs per token, its arithmetic time x peak, and ``prefill_batch_factor``'s
    arguments but the constant; None where the weight reads take half of the time or more."""
    n_ub = max(1, min(r.ubatch_tokens, r.tokens))
    t = n_ub / r.tokens_per_s
    read = r.ubatch_bytes(g) / (efficiency * g.decode_factor(r) * r.bandwidth_gb_s * 1e9)
    if not read < 0.5 * t:
        return None
    t = max(t - read, 0.1 * t)
    peak = r.fp16_tflops * 1e12 * prefill_peak_multiplier(r.family, r.gemm_float) * g.format_factor(r)
    batch = (n_ub, r.experts_used, r.experts, r.routed_share, g.routing_exponent)
    return n_ub, 2 * r.active_params, r.attention_flops, t * peak, batch


def _ratio_at(parts: _Parts | None, half_tokens: float) -> float | None:
    """The rate factor a prefill row implies against its family's peak (``prefill_peak_multiplier``
    x FP16 FLOP/s), from its ``_prefill_parts`` at the batch constant ``half_tokens``: prompt tokens x 2 x
    active parameters over the ubatch's time once its weight reads are taken off. None where those reads
    take half of the time or more: only rows whose time is mostly arithmetic tell the rate factor (a
    prompt of a few tokens is a batched decode, read-bound)."""
    if parts is None:
        return None
    n_ub, work, attention, time_peak, (n, used, experts, routed, exponent) = parts
    return n_ub * (work / _batch_factor(n, used, experts, routed, half_tokens, exponent) + attention) / time_peak


def _compute_bound(r: BenchRow, efficiency: float, g: Globals) -> bool:
    """Whether most of a prefill row's time is arithmetic (``_prefill_parts`` has its parts)."""
    return _prefill_parts(r, g, efficiency) is not None


def _fit_prefill(rows: list[BenchRow], float_weights: bool, ratios: dict[int, float | None]) -> float | None:
    """The source-weighted median rate factor (``_ratio_at``) of ``rows``' compute-bound prefill
    results on float (or quantized) kernels."""
    chosen = [r for r in rows if r.gemm_float == float_weights and ratios[id(r)] is not None]
    if not chosen:
        return None
    logs = np.log([ratios[id(r)] for r in chosen])
    return float(np.exp(weighted_percentiles(logs, source_weights(chosen), (0.5,))[0]))


@dataclass(frozen=True)
class Fitted:
    families: dict[str, FamilyConstants]
    hybrid: HybridConstants
    globals: Globals


CPU_FAMILIES = ("cpu-x86", "cpu-arm")
MIN_BUILD_ROWS = 4  # prefill rows of one build (from two sources at least) for its own factor
MIN_FORMAT_ROWS = 3  # decode rows of one weight format with weights in RAM, for its own CPU work
MIN_KIND_ROWS = 6  # decode rows with MoE (or recurrent) layers (from two sources at least) for their own cost


def fit_model(rows: list[BenchRow]) -> Fitted:
    """Constants per family from ``rows``' single-device results (depth-0 prefill only; decode at any
    depth), a mixture of experts' prefill rate against its family's dense one (shared by all), then
    the host's share of the hybrid rows on top."""
    single = [r for r in rows if r.group != "hybrid"]
    families = sorted({r.family for r in single})
    tg = {f: [r for r in single if r.family == f and r.test == "tg"] for f in families}
    pp = {f: [r for r in single if r.family == f and r.test == "pp" and r.depth == 0] for f in families}
    decode = {f: _fit_decode(tg[f]) for f in families if len(tg[f]) >= 3}
    # A CPU family whose own rows are too few at long contexts to show attention's cost is fitted on the
    # long-context rows of every CPU family together: ggml's CPU attention is one code path whatever the
    # vendor, and leaving the term out would call a CPU at 24k tokens as fast as at 0 (GPU families keep
    # their own: their attention kernels differ by backend, and their rows mostly show none).
    # Where the CPU rows together cannot show it either, the median of the families whose rows do: a
    # decoded token's attention runs at a small share of any device's peak.
    cpu_tg = [r for f in CPU_FAMILIES if f in tg for r in tg[f]]
    shown = [k.get("a", 0.0) for f, (_, k, _) in decode.items() if _shown(tg[f], _long_context)]
    pooled = _fit_decode(cpu_tg)[1].get("a", 0.0) if _shown(cpu_tg, _long_context) else None
    if pooled is None and shown:
        pooled = float(np.median(shown))
    decode = _pool_attention(decode, tg, pooled)
    # Each weight format's read rate on GPUs (llama.cpp's matrix-vector kernels differ by format) and older
    # builds' (DECODE_RELEASE), then the families' decode constants again with them (twice over: they are
    # fitted on the same rows).
    with_rates = Globals()
    tg_rows = [r for f in families for r in tg[f]]
    for _ in range(FORMAT_ROUNDS):
        # The older builds' rate is fitted afresh each round, on residuals without it.
        with_rates = Globals(decode_format=_fit_decode_formats(tg_rows, decode, with_rates))
        with_rates = replace(with_rates, older_rate=_fit_older_rate(tg_rows, decode, with_rates))
        refit = {f: _fit_decode(tg[f], with_rates) for f in decode}
        decode = _pool_attention(refit, tg, pooled)
    eff = {f: min(d[0], 1.0) for f, d in decode.items()}
    # How alike a prompt's tokens route (``expert_coverage``'s exponent): the value whose fit explains the
    # prefill rows best, single devices (the experts a ubatch reads) and GPUs with experts in RAM (the
    # experts a ubatch copies) together, each source weighing as the square root of its rows (``source_weights``).
    best_fit: tuple[float, Fitted | None] = (float("inf"), None)
    judged = [r for r in rows if r.test == "pp" and r.depth == 0 and r.family not in ON_TOP_FAMILIES]
    for routing in ROUTING_EXPONENTS:
        g, out = _fit_prefill_constants(decode, tg, pp, families, eff, routing, decoding=with_rates)
        fitted = Fitted(out, fit_hybrid(rows, out, g), g)
        res, wts = [], []
        for r in judged:
            c = constants_for(r.family, out)
            if c is not None:
                res.append(np.log(r.predict(c, fitted.hybrid, g) / r.tokens_per_s))
                wts.append(r)
        err = float(np.sum(source_weights(wts) * np.array(res) ** 2)) if res else 0.0
        if err < best_fit[0]:
            best_fit = (err, fitted)
    assert best_fit[1] is not None
    fitted = best_fit[1]
    # Each quantized format's prompt kernels against the family's quantized factor, then the family
    # factors again with those applied (twice over: the two are fitted on the same rows).
    for _ in range(FORMAT_ROUNDS):
        formats = _fit_formats(judged, fitted)
        g, out = _fit_prefill_constants(
            decode, tg, pp, families, eff, fitted.globals.routing_exponent, formats, with_rates
        )
        fitted = Fitted(out, fit_hybrid(rows, out, g), g)
    return fitted


FORMAT_ROUNDS = 2
FORMAT_PRIOR = 2.0  # source weights (``source_weights``: a source of n rows weighs sqrt(n)) pulling a factor to 1
DECODE_FORMAT_KINDS = ("gpu",)  # a CPU's formats differ in arithmetic (``decode_flop_per_param``), not in reads


def _pool_attention(decode: dict, tg: dict, pooled: float | None) -> dict:
    """``decode`` with the pooled attention cost for each CPU family whose own rows do not show one."""
    if pooled is None:
        return decode
    return {
        f: (eta, k if f not in CPU_FAMILIES or _shown(tg[f], _long_context) else k | {"a": pooled}, err)
        for f, (eta, k, err) in decode.items()
    }


def _decode_constants(eta: float, k: dict[str, float]) -> FamilyConstants:
    """A family's decode constants from ``_fit_decode``'s result (prefill factors left at 1)."""
    return FamilyConstants(
        decode_efficiency=min(eta, 1.5),
        per_layer_s=k.get("c", 0.0),
        per_moe_layer_s=k.get("m", 0.0),
        per_recurrent_layer_s=k.get("r", 0.0),
        decode_attention_cost=k.get("a", 0.0),
        decode_flop_per_param=k.get("g", 0.0),
        prefill_quant=1.0,
        prefill_float=1.0,
        rows=0,
        devices=0,
    )


def _decode_residuals(rows: list[BenchRow], decode: dict, g: Globals) -> list[tuple[BenchRow, float]]:
    """The single-device GPU decode rows of ``rows`` (DECODE_FORMAT_KINDS) with their log ratio of
    measured to predicted at the families' decode constants (``decode``, fitted with ``g``'s rates)."""
    out = []
    for r in rows:
        if r.format_kind in DECODE_FORMAT_KINDS and r.family in decode:
            eta, k, _ = decode[r.family]
            out.append((r, float(np.log(r.tokens_per_s / r.predict(_decode_constants(eta, k), DEFAULT_HYBRID, g)))))
    return out


def _fit_decode_formats(
    rows: list[BenchRow], decode: dict, previous: Globals
) -> tuple[tuple[tuple[str, str], float], ...]:
    """Each (gpu, weight format)'s decode read rate on top of the families' decode constants
    (``decode``, fitted with ``previous``' rates): ``_shrunk_factors`` of the decode rows' residuals."""
    chosen = [(r, x) for r, x in _decode_residuals(rows, decode, previous) if r.weight_format]
    return _shrunk_factors(chosen, dict(previous.decode_format)) if chosen else previous.decode_format


def _fit_older_rate(rows: list[BenchRow], decode: dict, previous: Globals) -> float:
    """Older builds' decode read rate (``Globals.older_rate``): ``_shrunk_factors`` of the decode rows'
    residuals with the builds before DECODE_RELEASE and the later ones as its two kinds, over the later ones'."""
    chosen = _decode_residuals(rows, decode, previous)
    if not any(r.older_kernels for r, _ in chosen) or all(r.older_kernels for r, _ in chosen):
        return previous.older_rate
    old = {("build", "older"): previous.older_rate}
    rates = dict(_shrunk_factors(chosen, old, lambda r: ("build", "older" if r.older_kernels else "current")))
    return rates[("build", "older")] / rates[("build", "current")]


def _format_key(r: BenchRow) -> tuple[str, str]:
    return r.format_kind, r.weight_format


def _shrunk_factors(
    chosen: list[tuple[BenchRow, float]],
    old: dict[tuple[str, str], float],
    key: Callable[[BenchRow], tuple[str, str]] = _format_key,
) -> tuple[tuple[tuple[str, str], float], ...]:
    """Per (kind, class) of ``chosen``'s rows (``key``: by default (cpu | gpu, weight format)), with each
    row's log ratio of measured to predicted at the ``old`` factors: the old factor moved by the
    source-weighted mean log ratio of its rows, pulled toward 1 by FORMAT_PRIOR (a class that few sources
    show stays near the family's rate), the factors of one kind then centred on their rows (the family
    constants carry the level)."""
    w = source_weights([r for r, _ in chosen])
    keys = [key(r) for r, _ in chosen]
    out: dict[tuple[str, str], float] = {}
    for kind in sorted({k for k, _ in keys}):
        idx = [i for i, (k, _) in enumerate(keys) if k == kind]
        logs: dict[str, float] = {}
        for cls in sorted({keys[i][1] for i in idx}):
            sel = [i for i in idx if keys[i][1] == cls]
            prior = np.log(old.get((kind, cls), 1.0))
            total = sum(w[i] * (prior + chosen[i][1]) for i in sel)
            logs[cls] = float(total / (sum(w[i] for i in sel) + FORMAT_PRIOR))
        centre = sum(w[i] * logs[keys[i][1]] for i in idx) / sum(w[i] for i in idx)
        out |= {(kind, cls): float(np.exp(v - centre)) for cls, v in logs.items()}
    return tuple(sorted(out.items()))


def _fit_formats(rows: list[BenchRow], fitted: Fitted) -> tuple[tuple[tuple[str, str], float], ...]:
    """Each (cpu | gpu, quantized weight format)'s prefill factor on top of ``fitted``'s: ``_shrunk_factors``
    of the single-device rows at depth 0 whose time is mostly arithmetic."""
    g = fitted.globals
    chosen = []
    for r in rows:
        c = constants_for(r.family, fitted.families)
        if r.group == "hybrid" or r.gemm_float or r.weight_format not in WEIGHT_FORMATS or c is None:
            continue
        if _compute_bound(r, c.decode_efficiency, g):
            chosen.append((r, float(np.log(r.tokens_per_s / r.predict(c, fitted.hybrid, g)))))
    return _shrunk_factors(chosen, dict(g.prefill_format)) if chosen else g.prefill_format


# Routing exponents tried (1: independent tokens).
ROUTING_EXPONENTS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.85, 1.0)


def _fit_prefill_constants(
    decode: dict,
    tg: dict,
    pp: dict,
    families: list[str],
    eff: dict[str, float],
    routing: float,
    formats: tuple[tuple[tuple[str, str], float], ...] = (),
    decoding: Globals | None = None,
) -> tuple[Globals, dict[str, FamilyConstants]]:
    """The prefill half of ``fit_model`` at one routing exponent: the shared batch constant, then each
    family's constants (its decode ones from ``decode``, fitted with ``decoding``'s read rates). Prefill
    factors are fitted per pool of families with the same kernels (PREFILL_POOLS), each row against its
    own family's peak; a family outside any pool is its own pool."""
    pool_of = {f: PREFILL_POOLS.get(f, f) for f in families}
    pools = {p: [r for f in families if pool_of[f] == p for r in pp[f]] for p in set(pool_of.values())}
    # The rows at which the prompt kernels reach half their rate (``batch_efficiency``): the value that
    # best explains the rows' rates against their pool's (``source_weights``), shown
    # mostly by mixtures of experts, whose experts get a few rows each.
    base = replace(decoding or Globals(), routing_exponent=routing, prefill_format=formats)
    best: tuple[float, float, dict[int, float | None]] = (float("inf"), 0.0, {})
    chosen_rows = [
        (p, r) for p, pr in pools.items() for r in pr if not r.gemm_float and r.family not in ON_TOP_FAMILIES
    ]
    all_pp = [r for pr in pools.values() for r in pr]
    parts = {id(r): _prefill_parts(r, base, eff.get(r.family, 0.8)) for r in all_pp}
    for half in [0.0, *np.geomspace(1, 512, 37)]:
        ratios = {k: _ratio_at(v, float(half)) for k, v in parts.items()}
        factor = {p: _fit_prefill(pr, False, ratios) for p, pr in pools.items()}
        res, wts = [], []
        for p, r in chosen_rows:
            ratio = ratios[id(r)]
            if factor.get(p) and ratio is not None:
                res.append(np.log(ratio / factor[p]))  # type: ignore[operator]
                wts.append(r)
        err = float(np.sum(source_weights(wts) * np.array(res) ** 2)) if res else 0.0
        if err < best[0]:
            best = (err, float(half), ratios)
    g = replace(base, half_tokens=best[1])
    ratios = best[2]
    out: dict[str, FamilyConstants] = {}
    for fam, (eta, k, _) in decode.items():
        chosen_pp = pools.get(pool_of.get(fam, fam), pp.get(fam, []))
        m_quant, m_float = prefill_peak_multiplier(fam, False), prefill_peak_multiplier(fam, True)
        quant = _fit_prefill(chosen_pp, False, ratios)
        flt = _fit_prefill(chosen_pp, True, ratios)
        if quant is None and flt is None:
            continue
        by_build: dict[str, dict[str, float]] = {}
        for build in sorted({r.build for r in chosen_pp if r.build}):
            for kind, is_float, mult in (("quant", False, m_quant), ("float", True, m_float)):
                chosen = [r for r in chosen_pp if r.build == build and r.gemm_float == is_float]
                if len(chosen) >= MIN_BUILD_ROWS and len({source_key(r.source) for r in chosen}) >= 2:
                    by_build.setdefault(build, {})[kind] = (_fit_prefill(chosen, is_float, ratios) or 0.0) * mult
        # A path without rows is taken to run as fast as the other one (on NVIDIA the int8 kernels reach
        # a smaller share of a higher peak: about FP16 cuBLAS's speed, llama.cpp PRs #7676 and #8075).
        quant_n = quant or (flt or 0.1) * m_float / m_quant
        flt_n = flt or (quant or 0.1) * m_quant / m_float
        out[fam] = _decode_constants(eta, k).model_copy(
            update={
                "prefill_quant": quant_n * m_quant,
                "prefill_float": flt_n * m_float,
                "prefill_backend": by_build,
                "rows": len(tg[fam]) + len(pp[fam]),
                "devices": len({r.device for r in tg[fam] + pp[fam]}),
            }
        )
    return g, out


def fit(rows: list[BenchRow]) -> dict[str, FamilyConstants]:
    """The family constants of ``fit_model``."""
    return fit_model(rows).families


def _gpu_part(r: BenchRow, c: FamilyConstants, g: Globals | None = None) -> float:
    """Seconds per token of a hybrid row's GPU share at the family's constants."""
    active = r.active_params
    return decode_seconds_per_token(
        r.bytes_per_token - r.host_bytes,
        r.n_layer,
        r.bandwidth_gb_s,
        c,
        active - r.host_params,
        r.fp16_tflops,
        r.moe_layers,
        r.recurrent_layers,
        r.attention_flops,
        (g or Globals()).token_rate(r),
    )


def fit_hybrid(rows: list[BenchRow], fitted: dict[str, FamilyConstants], g: Globals | None = None) -> HybridConstants:
    """The host's share of hybrid rows, on top of the GPU families' constants: decode efficiency of
    the host memory, CPU work per parameter and the handoff per host layer (the roofline fit with the
    GPU's time as an offset); the PCIe efficiency, pinned and memory-mapped apart, as the median of
    what each prefill row implies once its GPU compute time is taken off."""
    g = g or Globals()
    hybrid = [r for r in rows if r.group == "hybrid" and constants_for(r.family, fitted) is not None]
    tg = [r for r in hybrid if r.test == "tg"]
    eta, sync, work = DEFAULT_HYBRID.host_efficiency, DEFAULT_HYBRID.sync_s, DEFAULT_HYBRID.host_flop_per_param
    by_format: dict[str, float] = {}
    if len(tg) >= 5:
        offset = np.array([_gpu_part(r, constants_for(r.family, fitted), g) for r in tg])  # type: ignore[arg-type]
        x = np.array([r.host_bytes / (r.host_bandwidth_gb_s * 1e9) for r in tg])
        cols = {
            "c": np.array([float(r.host_layers) for r in tg]),
            "g": np.array([r.host_params / (r.host_tflops * 1e12) for r in tg]),
        }
        for fmt in sorted({r.weight_format for r in tg if r.weight_format}):
            of_fmt = np.array([r.weight_format == fmt for r in tg])
            if of_fmt.sum() >= MIN_FORMAT_ROWS:
                cols[f"f:{fmt}"] = np.where(of_fmt, cols["g"], 0.0)
        y = np.array([1.0 / r.tokens_per_s for r in tg])
        eta, k, _ = _fit_roofline(x, cols, y, offset)
        sync, work = k.get("c", 0.0), k.get("g", 0.0)
        by_format = {name[2:]: v for name, v in k.items() if name.startswith("f:") and v > 0}
    shares = {}
    for pinned in (True, False):
        implied, chosen = [], []
        for r in hybrid:
            if r.test != "pp" or r.pinned != pinned or not r.copy_bytes(g) or not r.mmap_stated:
                continue
            c = constants_for(r.family, fitted)
            assert c is not None
            moe = r.moe_factor(g)
            active = r.active_params
            rate = prefill_tokens_per_s(
                active, r.fp16_tflops, r.gemm_float, c, moe, r.build, r.attention_flops, g.format_factor(r)
            )
            read = ubatch_read_seconds(r.ubatch_bytes(g), r.bandwidth_gb_s, c, g.decode_factor(r))
            copy_s = r.ubatch_tokens / r.tokens_per_s - r.ubatch_tokens / rate - read
            if copy_s > 0:
                implied.append(r.copy_bytes(g) / (copy_s * r.link_gb_s * 1e9))
                chosen.append(r)
        # The median over sources (``source_weights``), not rows: a source's rows share its host and slot.
        mid = weighted_percentiles(np.log(implied), source_weights(chosen), (0.5,))[0] if implied else None
        shares[pinned] = float(np.clip(np.exp(mid), 0.05, 1.5)) if mid is not None else None
    pinned_share = shares[True] or (shares[False] or DEFAULT_HYBRID.pcie_pageable) * 1.5
    pageable_share = shares[False] or pinned_share / 1.5
    return HybridConstants(
        host_efficiency=float(eta),
        host_flop_per_param=float(work),
        format_flop_per_param=by_format,
        sync_s=float(sync),
        pcie_pinned=min(pinned_share, 1.5),
        pcie_pageable=min(pageable_share, 1.5),
        rows=len(hybrid),
    )


def constants_for(family: str, fitted: dict[str, FamilyConstants]) -> FamilyConstants | None:
    seen = set()
    while family not in fitted and family in GROUP_FALLBACK and family not in seen:
        seen.add(family)
        family = GROUP_FALLBACK[family]
    return fitted.get(family)


@dataclass(frozen=True)
class Held:
    row: BenchRow
    predicted: float
    low: float
    high: float

    @property
    def error(self) -> float:
        return (self.predicted - self.row.tokens_per_s) / self.row.tokens_per_s

    @property
    def inside(self) -> bool:
        return self.low <= self.row.tokens_per_s <= self.high


def _judged(r: BenchRow) -> bool:
    """Rows the model is judged on: decode at any depth, prefill at depth 0."""
    return r.test == "tg" or r.depth == 0


def interval(rows: list[BenchRow], model: Fitted, test: str) -> tuple[float, float]:
    """(low, high) multipliers of the prediction that hold 80% of ``rows``' results (10th and 90th
    percentiles of measured / predicted)."""
    ratios = []
    for r in rows:
        c = constants_for(r.family, model.families)
        if c is not None and r.test == test and _judged(r):
            ratios.append(r.tokens_per_s / r.predict(c, model.hybrid, model.globals))
    if len(ratios) < 5:
        return 0.6, 1.4
    lo, hi = np.percentile(np.log(ratios), [10, 90])
    return float(math.exp(lo)), float(math.exp(hi))


FOLDS = 5
FOLD_KEYS = {"device": lambda r: r.device, "source": lambda r: source_key(r.source)}


def _folds(rows: list[BenchRow], folds: int = FOLDS, by: str = "device") -> list[list[BenchRow]]:
    """Rows split into ``folds`` groups by device or by source (every row of one in one group): each
    key's group is a checksum of its name, so a source or device added to the data leaves every other
    one in its group (a deal of the sorted names would reshuffle them all)."""
    key = FOLD_KEYS[by]
    which = {k: zlib.crc32(k.encode()) % folds for k in {key(r) for r in rows}}
    out: list[list[BenchRow]] = [[] for _ in range(folds)]
    for r in rows:
        out[which[key(r)]].append(r)
    return out


def _predict_held(train: list[BenchRow], test_rows: list[BenchRow]) -> list[tuple[BenchRow, float]]:
    return _predicted(fit_model(train), test_rows)


def _predicted(model: Fitted, test_rows: list[BenchRow]) -> list[tuple[BenchRow, float]]:
    """The judged rows of ``test_rows`` (``_judged``) with ``model``'s predictions."""
    out = []
    for r in test_rows:
        c = constants_for(r.family, model.families)
        if c is not None and _judged(r):
            out.append((r, r.predict(c, model.hybrid, model.globals)))
    return out


def held_out_intervals(
    rows: list[BenchRow], folds: int = FOLDS, by: str = "source"
) -> dict[str, dict[str, tuple[float, float]]]:
    """{"tg" | "pp": {"all": (low, high), "hybrid": (low, high)}}: multipliers from residuals on rows the
    fit did not see, the 10th and 90th percentiles of measured / predicted over one cross-validation of
    ``rows`` grouped ``by`` source or device; "hybrid" from the rows with weights in system memory alone.
    (Ranges per device group were tried and held fewer held-out results: Apple's tight residuals
    narrowed its range below what new chips do.)"""
    return _intervals(_inner_held(rows, folds, by), by)


def _inner_held(rows: list[BenchRow], folds: int, by: str) -> list[tuple[BenchRow, float]]:
    """Every row of ``rows`` predicted by a ``folds``-fold cross-validation grouped ``by`` source or device."""
    groups = _folds(rows, folds, by)
    held: list[tuple[BenchRow, float]] = []
    for k in range(folds):
        train = [r for i, g in enumerate(groups) if i != k for r in g]
        held += _predict_held(train, groups[k])
    return held


def _intervals(held: list[tuple[BenchRow, float]], by: str) -> dict[str, dict[str, tuple[float, float]]]:
    """``held_out_intervals`` from one cross-validation's predictions."""
    key = FOLD_KEYS[by]
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for test in ("tg", "pp"):
        ratios = [(key(r), r.tokens_per_s / p, r.group == "hybrid") for r, p in held if r.test == test]
        out[test] = {"all": (0.6, 1.4), "hybrid": (0.6, 1.4)}
        for name, chosen in (("all", [x for x in ratios if not x[2]]), ("hybrid", [x for x in ratios if x[2]])):
            if len(chosen) < 20:
                continue
            # Each device (or source) weighs the same: the range is for one the fit has not seen, and one
            # board benchmarked on forty models says less about the next than forty boards do.
            per_key = Counter(k for k, _, _ in chosen)
            logs = np.log([ratio for _, ratio, _ in chosen])
            weights = np.array([1.0 / per_key[k] for k, _, _ in chosen])
            lo, hi = weighted_percentiles(logs, weights, (0.10, 0.90))
            out[test][name] = (float(math.exp(lo)), float(math.exp(hi)))
    return out


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    """Percentiles of ``values`` where each counts with its weight (midpoint rule on the sorted
    cumulative weights, interpolated)."""
    order = np.argsort(values)
    v, w = values[order], weights[order]
    cum = (np.cumsum(w) - 0.5 * w) / w.sum()
    return [float(np.interp(q, cum, v)) for q in qs]


def cross_validate(rows: list[BenchRow], by: str = "device", workers: int | None = None) -> list[Held]:
    """Cross-validation grouped ``by`` source or device: by source, each source's rows are predicted
    from constants fitted on every other source (leave one source out: a figure that does not depend on
    which sources happen to share a fold, and a source is what a new buyer's machine is); by device, 5
    folds of whole devices. Each prediction's range comes from the training rows' own held-out
    residuals (an inner 5-fold cross-validation grouped the same way), so neither the constants nor the
    range ever saw the predicted source (or device). The folds are independent fits, run on ``workers``
    processes (default: one per CPU the process may use)."""
    if by == "source":
        keys = sorted({source_key(r.source) for r in rows})
        groups = [[r for r in rows if source_key(r.source) == k] for k in keys]
    else:
        groups = _folds(rows, by=by)
    workers = min(workers or len(os.sched_getaffinity(0)), len(groups))
    if workers <= 1:
        return [x for k in range(len(groups)) for x in _held_fold(groups, k, by)]
    # Fresh interpreters ("spawn"): a forked copy of a process with threads running (a Qt test's) can
    # inherit a lock some other thread held.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_folds, initargs=(groups, by)) as pool:
        return [x for held in pool.map(_worker_fold, range(len(groups))) for x in held]


def fresh_held(rows: list[BenchRow]) -> list[Held]:
    """The FRESH_SOURCES' rows predicted from constants (and ranges) fitted on ``rows`` (``load_rows()``,
    which leaves them out)."""
    return _held_fold([rows, load_rows(fresh=True)], 1, "source")


_WORKER: tuple[list[list[BenchRow]], str] = ([], "device")


def _worker_folds(groups: list[list[BenchRow]], by: str) -> None:
    global _WORKER
    _WORKER = (groups, by)


def _worker_fold(k: int) -> list[Held]:
    return _held_fold(_WORKER[0], k, _WORKER[1])


def _held_fold(groups: list[list[BenchRow]], k: int, by: str) -> list[Held]:
    """The predictions and ranges for ``groups[k]``'s rows from a fit on every other group."""
    test_rows = groups[k]
    train = [r for i, g in enumerate(groups) if i != k for r in g]
    bands = held_out_intervals(train, FOLDS, by)
    model = fit_model(train)
    held: list[Held] = []
    for r, p in _predicted(model, test_rows):
        lo, hi = bands[r.test]["hybrid" if r.group == "hybrid" else "all"]
        p_lo, p_hi = p, p
        if r.group == "hybrid" and not (r.host_stated and r.mmap_stated):
            # A host the source does not name, or weights it does not say were memory-mapped or not:
            # the range spans the desktop hosts and the copies (pinned or pageable) it could be.
            c = constants_for(r.family, model.families)
            preds = [v.predict(c, model.hybrid, model.globals) for v in unstated_hosts(r)]  # type: ignore[arg-type]
            p_lo, p_hi = min(preds + [p]), max(preds + [p])
        held.append(Held(r, p, p_lo * lo, p_hi * hi))
    return held


# The desktops a GPU with weights in RAM may sit in when its source does not say: dual-channel DDR4-3200
# to DDR5-6400 (HOST_MEMORY's desktop presets and the fastest common kit), the card's slot at x8 or x16.
UNSTATED_HOST_GB_S = (51.2, 102.4)
UNSTATED_LANES = (8, 16)


def unstated_hosts(r: BenchRow) -> list[BenchRow]:
    """A hybrid row as it would run on each desktop its unnamed host could be (``UNSTATED_HOST_GB_S``,
    ``UNSTATED_LANES``) and with its weights copied pinned or pageable when the source does not say
    whether they were memory-mapped: the extremes of what the source leaves open."""
    from dataclasses import replace

    hosts = [(bw, lanes) for bw in UNSTATED_HOST_GB_S for lanes in UNSTATED_LANES] if not r.host_stated else [None]
    pinned = (True, False) if not r.mmap_stated else (r.pinned,)
    return [
        replace(r, host_bandwidth_gb_s=h[0], link_gb_s=r.link_gb_s * h[1] / 16, pinned=pin)
        if h
        else replace(r, pinned=pin)
        for h in hosts
        for pin in pinned
    ]


@dataclass(frozen=True)
class SourcePair:
    """Two sources' results for the same measurement: one device, build, model (parameters and active
    share), weight format and test (prompt, depth, ubatch), each source's the median of its rows."""

    test: str
    device: str
    sources: tuple[str, str]
    ratio: float  # the larger over the smaller: decode as weight and cache bytes read per second


def source_pairs(rows: list[BenchRow]) -> list[SourcePair]:
    """Every pair of sources that measured the same thing on one device (``SourcePair``): how far apart
    two sources are where no model of the device can tell them apart, the floor under any held-out error.
    Decode compares bytes read per second, so that two files of one format and model but different sizes
    (a Q4_K_M and a Q4_K_S) compare too; rows with weights in system memory are left out (their hosts differ)."""
    by_key: dict[tuple, dict[str, list[float]]] = {}
    for r in rows:
        if r.group == "hybrid":
            continue
        key = (r.device, r.build, round(r.params / 1e8), round(r.active_share, 2), r.weight_format, r.test)
        key += (r.tokens, r.depth, r.ubatch_tokens if r.test == "pp" else 0)
        rate = r.tokens_per_s * (r.bytes_per_token if r.test == "tg" else 1.0)
        by_key.setdefault(key, {}).setdefault(source_key(r.source), []).append(rate)
    pairs = []
    for key, per_source in by_key.items():
        medians = [(s, float(np.median(v))) for s, v in sorted(per_source.items())]
        for (a, ra), (b, rb) in itertools.combinations(medians, 2):
            pairs.append(SourcePair(key[5], key[0], (a, b), max(ra, rb) / min(ra, rb)))
    return pairs
