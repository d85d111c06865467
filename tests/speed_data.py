"""Published llama-bench results (tests/data/llama_bench_*.json) as rows the speed model can fit and
be judged on: the device's bandwidth and FP16 rate, the model's bytes, layers and active share, the
test (pp/tg, tokens, depth) and the published tokens/s. Used by scripts/fit_speed.py and the tests.

Device figures come from the catalog (resources/catalog/devices.json) where the device is in it,
else from the devices files collected with the rows; Apple GPU variants scale their generation's
catalog figure by GPU cores; CPUs' FP32 rate is cores x 3 GHz x SIMD lanes x 2 (FMA) x 2 (units),
the estimator's own rule (app.core.memory.targets.cpu_flops_tflops).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.core.model.catalog import load_devices
from app.core.speed.model import FamilyConstants, decode_seconds_per_token, prefill_tokens_per_s, speed_family

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
}
UNIFIED_SPECS: dict[str, tuple[float, float]] = {  # name fragment -> (GB/s, FP16 dense TFLOPS)
    "DGX Spark": (273.0, 62.5),  # GB10: 1 PFLOP FP4 sparse -> FP16 dense 1/16
    "Ryzen AI Max": (256.0, 59.4),  # 40 RDNA 3.5 CUs x 2.9 GHz x 512 FP16 FLOP/clock
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
    (r"llama 1b", 16, 16 * 8 * 64 * 4, 1.0),
    (r"llama 3b", 28, 28 * 8 * 128 * 4, 1.0),
    (r"llama (3\.1 )?8b", 32, 32 * 8 * 128 * 4, 1.0),
    (r"llama 7b", 32, 32 * 32 * 128 * 4, 1.0),
    (r"llama 13b", 40, 40 * 40 * 128 * 4, 1.0),
    (r"llama 70b", 80, 80 * 8 * 128 * 4, 1.0),
    (r"qwen2 7b", 28, 28 * 4 * 128 * 4, 1.0),
    (r"qwen3 32b", 64, 64 * 8 * 128 * 4, 1.0),
    (r"qwen3 8b", 36, 36 * 8 * 128 * 4, 1.0),
    (r"gemma3 4b", 34, 34 * 4 * 256 * 4 // 6, 1.0),
    (r"gemma3 27b", 62, 62 * 16 * 128 * 4 // 6, 1.0),
    (r"mistral3|llama 13b|nemo|12b", 40, 40 * 8 * 128 * 4, 1.0),
]
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
_TEST = re.compile(r"^(pp|tg)\s*(\d+)(?:\s*@\s*d(\d+))?$")


@dataclass(frozen=True)
class BenchRow:
    source: str
    device: str
    family: str
    group: str  # gpu | apple | cpu | unified
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

    @property
    def bytes_per_token(self) -> float:
        return self.weight_bytes * self.active_share + self.kv_bytes_per_token * self.depth

    def predict(self, c: FamilyConstants) -> float:
        if self.test == "tg":
            return 1.0 / decode_seconds_per_token(
                self.bytes_per_token,
                self.n_layer,
                self.bandwidth_gb_s,
                c,
                self.params * self.active_share,
                self.fp16_tflops,
            )
        return prefill_tokens_per_s(self.params * self.active_share, self.fp16_tflops, self.float_weights, c)


def _catalog_gpu(device: str):
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


def load_rows() -> list[BenchRow]:
    """Every published row whose device, model and test are understood (single GPU or box)."""
    gpu_dev = {d["device"]: d for d in json.loads((DATA / "llama_bench_gpu_devices.json").read_text())}
    other_dev = {d["device"]: d for d in json.loads((DATA / "llama_bench_apple_cpu_devices.json").read_text())}
    raw = [r | {"group": "gpu"} for r in json.loads((DATA / "llama_bench_gpu.json").read_text())]
    raw += json.loads((DATA / "llama_bench_apple_cpu.json").read_text())
    rows = []
    for r in raw:
        test = _TEST.match(r["test"].replace("tg ", "tg").replace("pp ", "pp").strip())
        if not r.get("size_gib") or not r.get("params_b"):
            known = _KNOWN_SIZES.get(r["model"].lower())
            if known:
                r = r | {"size_gib": known[0], "params_b": known[1]}
        if not test or (r.get("n_gpus") or 1) != 1 or not r.get("size_gib") or not r.get("params_b"):
            continue
        group = r["group"]
        device = r["device"]
        if group == "gpu":
            spec = _catalog_gpu(device)
            info = gpu_dev.get(device, {})
            bw = (spec.bandwidth_gb_s if spec else None) or info.get("bandwidth_gb_s")
            flops = (spec.fp16_tflops if spec else None) or info.get("fp16_tensor_tflops_dense")
        elif group == "apple":
            bw = other_dev.get(device, {}).get("bandwidth_gb_s")
            flops = _apple(device)
        elif group == "unified":
            frag = next((k for k in UNIFIED_SPECS if k in device), None)
            bw, flops = UNIFIED_SPECS[frag] if frag else (None, None)
        else:
            frag = next((k for k in CPU_SPECS if k in device), None)
            if frag is None:
                continue
            bw, cores, lanes = CPU_SPECS[frag]
            flops = cores * 3.0e9 * lanes * 2 * 2 / 1e12
        if not bw or not flops:
            continue
        layers, kv, share = _shape(r["model"])
        kind = "cpu" if group == "cpu" else "gpu"
        rows.append(
            BenchRow(
                source=r["source"],
                device=re.sub(r"\s*\((RADV|NVIDIA)[^)]*\)", "", device).replace("PRO", "Pro"),
                family=speed_family(device, kind),
                group=group,
                bandwidth_gb_s=float(bw),
                fp16_tflops=float(flops),
                weight_bytes=float(r["size_gib"]) * 1024**3,
                params=float(r["params_b"]) * 1e9,
                active_share=share,
                n_layer=layers,
                kv_bytes_per_token=kv,
                float_weights=bool(_FLOAT.search(r["model"])),
                test=test.group(1),
                depth=int(test.group(3) or 0),
                tokens_per_s=float(r["tokens_per_s"]),
            )
        )
    return rows


# -- fitting ---------------------------------------------------------------------------------------

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
}


def _fit_decode(rows: list[BenchRow]) -> tuple[float, float, float]:
    """(efficiency, per-layer seconds, FLOP per active parameter) minimising the squared log error of
    1/tg = x/eta + L*c + P*g, with the efficiency held to a physical 0.2-1.0 of the roofline and the
    other terms non-negative (each dropped when the rows carry no sign of it)."""
    x = np.array([r.bytes_per_token / (r.bandwidth_gb_s * 1e9) for r in rows])
    layers = np.array([float(r.n_layer) for r in rows])
    work = np.array([r.params * r.active_share / (r.fp16_tflops * 1e12) for r in rows])
    y = np.array([1.0 / r.tokens_per_s for r in rows])
    best = (float("inf"), 1.0, 0.0, 0.0)
    for eta in np.linspace(0.2, 1.0, 81):
        rest = (y - x / eta) / y
        cols = {"c": layers / y, "g": work / y}
        for keep in (("c", "g"), ("c",), ("g",), ()):
            if keep:
                a = np.column_stack([cols[k] for k in keep])
                sol, *_ = np.linalg.lstsq(a, rest, rcond=None)
                if (sol < 0).any():
                    continue
                values = dict(zip(keep, (float(v) for v in sol), strict=True))
            else:
                values = {}
            c, g = values.get("c", 0.0), values.get("g", 0.0)
            err = float(np.sum(np.log((x / eta + layers * c + work * g) / y) ** 2))
            if err < best[0]:
                best = (err, float(eta), c, g)
    return best[1], best[2], best[3]


def _fit_prefill(rows: list[BenchRow], float_weights: bool) -> float | None:
    chosen = [r for r in rows if r.float_weights == float_weights]
    if not chosen:
        return None
    ratios = [r.tokens_per_s * 2 * r.params * r.active_share / (r.fp16_tflops * 1e12) for r in chosen]
    return float(np.exp(np.median(np.log(ratios))))


def fit(rows: list[BenchRow]) -> dict[str, FamilyConstants]:
    """Constants per family from ``rows`` (depth-0 prefill only; decode at any depth)."""
    out: dict[str, FamilyConstants] = {}
    families = sorted({r.family for r in rows})
    for fam in families:
        tg = [r for r in rows if r.family == fam and r.test == "tg"]
        pp = [r for r in rows if r.family == fam and r.test == "pp" and r.depth == 0]
        if len(tg) < 3 or len({r.device for r in tg}) < 1:
            continue
        eta, c, g = _fit_decode(tg)
        quant = _fit_prefill(pp, False)
        flt = _fit_prefill(pp, True)
        if quant is None and flt is None:
            continue
        out[fam] = FamilyConstants(
            decode_efficiency=min(eta, 1.5),
            per_layer_s=c,
            decode_flop_per_param=g,
            prefill_quant=quant or (flt or 0.1) * 2,
            prefill_float=flt or (quant or 0.1) / 2,
            rows=len(tg) + len(pp),
            devices=len({r.device for r in tg + pp}),
        )
    return out


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


def interval(rows: list[BenchRow], fitted: dict[str, FamilyConstants], test: str) -> tuple[float, float]:
    """(low, high) multipliers of the prediction that hold 80% of ``rows``' results (10th and 90th
    percentiles of measured / predicted)."""
    ratios = []
    for r in rows:
        c = constants_for(r.family, fitted)
        if c is not None and r.test == test and (test == "tg" or r.depth == 0):
            ratios.append(r.tokens_per_s / r.predict(c))
    if len(ratios) < 5:
        return 0.6, 1.4
    lo, hi = np.percentile(np.log(ratios), [10, 90])
    return float(math.exp(lo)), float(math.exp(hi))


FOLDS = 5


def _folds(rows: list[BenchRow], folds: int = FOLDS) -> list[list[BenchRow]]:
    """Rows split into ``folds`` groups by device (every row of a device in one group), in a fixed
    order: devices sorted by name, dealt round-robin."""
    devices = sorted({r.device for r in rows})
    which = {d: i % folds for i, d in enumerate(devices)}
    out: list[list[BenchRow]] = [[] for _ in range(folds)]
    for r in rows:
        out[which[r.device]].append(r)
    return out


def _predict_held(train: list[BenchRow], test_rows: list[BenchRow]) -> list[tuple[BenchRow, float]]:
    fitted = fit(train)
    out = []
    for r in test_rows:
        c = constants_for(r.family, fitted)
        if c is not None and (r.test == "tg" or r.depth == 0):
            out.append((r, r.predict(c)))
    return out


def held_out_intervals(rows: list[BenchRow], test: str, folds: int = FOLDS) -> dict[str, tuple[float, float]]:
    """{"all": (low, high)}: multipliers from residuals on devices the fit did not see, the 10th and
    90th percentiles of measured / predicted over a device-grouped cross-validation of ``rows``.
    (Ranges per device group were tried and held fewer held-out results: Apple's tight residuals
    narrowed its range below what new chips do.)"""
    groups = _folds(rows, folds)
    held: list[tuple[str, float]] = []
    for k in range(folds):
        train = [r for i, g in enumerate(groups) if i != k for r in g]
        held += [(r.device, r.tokens_per_s / p) for r, p in _predict_held(train, groups[k]) if r.test == test]
    if len(held) < 20:
        return {"all": (0.6, 1.4)}
    # Each device weighs the same: the range is for a device the fit has not seen, and one board
    # benchmarked on forty models says less about the next device than forty boards do.
    per_device = Counter(d for d, _ in held)
    logs = np.log([ratio for _, ratio in held])
    weights = np.array([1.0 / per_device[d] for d, _ in held])
    lo, hi = weighted_percentiles(logs, weights, (0.10, 0.90))
    return {"all": (float(math.exp(lo)), float(math.exp(hi)))}


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    """Percentiles of ``values`` where each counts with its weight (midpoint rule on the sorted
    cumulative weights, interpolated)."""
    order = np.argsort(values)
    v, w = values[order], weights[order]
    cum = (np.cumsum(w) - 0.5 * w) / w.sum()
    return [float(np.interp(q, cum, v)) for q in qs]


def cross_validate(rows: list[BenchRow]) -> list[Held]:
    """Device-grouped 5-fold cross-validation: each fold's devices are predicted from constants
    fitted on the other folds, with a range from those folds' own held-out residuals (an inner
    cross-validation), so neither the constants nor the range ever saw the predicted devices."""
    groups = _folds(rows)
    held: list[Held] = []
    for k in range(FOLDS):
        train = [r for i, g in enumerate(groups) if i != k for r in g]
        bands = {t: held_out_intervals(train, t, FOLDS - 1) for t in ("tg", "pp")}
        for r, p in _predict_held(train, groups[k]):
            lo, hi = bands[r.test].get(r.group, bands[r.test]["all"])
            held.append(Held(r, p, p * lo, p * hi))
    return held
