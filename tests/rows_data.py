"""Published runs of 1-8 rows per step (tests/data/microbatch_runs.json) as points the speed model's
cost per further decode row (``SpeedModel.decode_row_flop_per_param``) is fitted on and judged by.

Each table is one llama-bench run at ``-ub N`` (or ``ppN``): every step multiplies the weights with N
rows, as a decode step does for N users. A table counts where it starts at one row and its rows sit
at a shallow depth (a deep single sequence's rows share one cache, where N users read N caches). The
estimate's per-token rate at N users against its rate for one is compared with the published
``t/s(N) / N / t/s(1)``. The estimate's step time is its time without the further rows' arithmetic
plus the constant x (N - 1) x the parameters / the GPU's shader rate, so the constant is fitted in
closed form per point: one for CUDA and ROCm builds, one for Metal's own small-batch kernels
(``SpeedModel.row_flop_per_param``). Devices the catalog lacks come from
tests/data/microbatch_devices.json; a printed model is the catalog's model of the same shape
(``MODELS``).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from app.core.hardware.devices import DeviceSpec
from app.core.memory.targets import host_ram_target, target_from_device
from app.core.model.catalog import find_device
from app.core.report.choices import Controls, ModelChoice, load_model
from app.core.speed.model import load_speed_model
from app.core.speed.predict import vector_tflops
from app.core.speed.reads import placement
from app.services.estimate import answer

DATA = Path(__file__).parent / "data"
GIB = 1 << 30

# A printed device -> its catalog id, or an id in tests/data/microbatch_devices.json.
DEVICES = {
    "RTX 3090": "rtx-3090",
    "RTX 4090": "rtx-4090",
    "V100-PCIE-32GB": "v100-32gb",
    "M1 Pro": "m1-pro-32gb",
    "M2 Ultra": "m2-ultra-192gb",
    "Radeon 8060S Graphics": "ryzen-ai-max-395-128gb",
    "RX 9070 XT": "rx-9070-xt",
    "MI60 / MI50": "mi50",
    "MI50": "mi50",
    "MI100": "mi100",
    "RX 6800": "rx-6800",
    "RX 9060 XT": "rx-9060-xt",
}
# A printed model (llama.cpp's label) -> the catalog model of its shape: Llama 3 8B and 3.1 8B share
# one; "llama 7B" is Llama 2 7B, whose nearest catalog model is Mistral 7B (32 layers of width 4096).
MODELS = (
    ("llama 8B", "llama-3.1-8b"),
    ("llama 1B", "llama-3.2-1b"),
    ("llama 7B", "mistral-7b"),
    ("llama 3B", "llama-3.2-3b"),
    ("qwen2 7B", "qwen2.5-7b"),
    ("qwen2 14B", "qwen2.5-14b"),
    ("qwen2 1.5B", "qwen2.5-1.5b"),
    ("deepseek2 16B", "deepseek-v2-lite"),
    ("gemma4 26B.A4B", "gemma-4-26b-a4b"),
)
QUANTS = (
    *("Q2_K", "Q3_K_S", "Q4_K_S", "Q4_0", "Q4_1", "Q5_0", "Q6_K", "Q8_0"),
    *("IQ1_M", "IQ1_S", "IQ4_NL", "BF16", "F16", "F32"),
)
MAX_ROWS = 8  # the small-batch kernels' range (llama.cpp's MMVQ on CUDA and ROCm, mul_mv_ext on Metal)


@dataclass(frozen=True)
class RowPoint:
    source: str
    device: str
    model: str
    rows: int
    one_s: float  # the estimate's step time for one row
    base_s: float  # its step time for ``rows`` rows without their further arithmetic
    per_flop_s: float  # seconds each FLOP per parameter of the further rows adds
    measured: float  # published per-token rate at ``rows`` against one row's
    build: str = ""  # "metal" for Metal's own small-batch kernels; "" for CUDA and ROCm's (pooled)

    def predicted(self, row_flop_per_param: float) -> float:
        """The estimate's per-token rate at ``rows`` against one row's, at this constant."""
        return self.one_s / (self.base_s + row_flop_per_param * self.per_flop_s)

    def error(self, row_flop_per_param: float) -> float:
        """log(predicted / published): above 0, the estimate is too fast per user."""
        return math.log(self.predicted(row_flop_per_param) / self.measured)


def extra_devices() -> dict[str, DeviceSpec]:
    return {
        d["id"]: DeviceSpec(**{k: v for k, v in d.items() if k != "notes"})
        for d in json.loads((DATA / "microbatch_devices.json").read_text())
    }


OWN_BUILDS = ("metal",)  # builds whose small-batch kernels are their own, fitted apart


def own_build(backend: str) -> str:
    """The build a table's further rows are fitted for: "metal", or "" for the pooled CUDA and ROCm."""
    return backend.lower() if backend.lower() in OWN_BUILDS else ""


def usable_tables() -> list[dict]:
    """The tables that start at one row, at a shallow depth, of a model the catalog has."""
    tables = []
    for t in json.loads((DATA / "microbatch_runs.json").read_text()):
        deep = t["depth"] is not None or "@" in t["test"] or _rows_tokens(t["test"]) > 4096
        if t["usable"] and not deep and _model(t["model_as_printed"]):
            tables.append(t)
    return tables


def _rows_tokens(test: str) -> int:
    """The tokens of a table's last ``ppN`` test ("pp512", "pp1..pp4": 4); 0 where it names none."""
    found = re.findall(r"pp(\d+)", test)
    return int(found[-1]) if found else 0


def _model(label: str) -> tuple[str, str] | None:
    ref = next((ref for printed, ref in MODELS if label.startswith(printed + " ")), None)
    quant = next((q for q in QUANTS if q in label.replace("all F32", "F32").replace("Q2_K_M", "Q2_K")), None)
    return (ref, quant) if ref and quant else None


def points() -> list[RowPoint]:
    """Every table's rows 2..MAX_ROWS as the estimate sees them at the shipped constants."""
    extra = extra_devices()
    model_constants = load_speed_model()
    out = []
    for t in usable_tables():
        build = own_build(t["backend"])
        k = model_constants.row_flop_per_param(build) if build else model_constants.decode_row_flop_per_param
        ref, quant = _model(t["model_as_printed"]) or ("", "")
        device_id = DEVICES[t["device"]]
        device = extra.get(device_id) or find_device(device_id)
        gpu = target_from_device(device)
        targets = [gpu, host_ram_target(64 * GIB)]
        model = load_model(ModelChoice(kind="catalog", ref=ref, quant=quant))
        tokens = _rows_tokens(t["test"])
        published = {int(n): v for n, v in t["tokens_per_s_by_rows"].items()}
        steps = {}
        for n in sorted(r for r in published if r <= MAX_ROWS):
            found = answer(model, targets, Controls(users=n, context_per_user_tokens=max(64, tokens)), limits=False)
            params = placement(model.arch, model.tensors, found.estimate, 1).params_per_token[0]
            per_flop = (n - 1) * params / (vector_tflops(gpu) * 1e12)
            steps[n] = (1.0 / found.speed.decode_typical, per_flop)
        for n, (step, per_flop) in steps.items():
            if n > 1:
                out.append(
                    RowPoint(
                        source=t["source"],
                        device=t["device"],
                        model=t["model_as_printed"],
                        rows=n,
                        one_s=steps[1][0],
                        base_s=step - k * per_flop,
                        per_flop_s=per_flop,
                        measured=published[n] / n / published[1],
                        build=build,
                    )
                )
    return out


GRID = tuple(0.25 * 1.02**i for i in range(400))  # 0.25 .. about 690 FLOP per parameter


def fit(chosen: list[RowPoint]) -> float:
    """The constant with the least mean |log error|, each source weighing the same."""
    per_source: dict[str, int] = {}
    for p in chosen:
        per_source[p.source] = per_source.get(p.source, 0) + 1
    return min(GRID, key=lambda k: sum(abs(p.error(k)) / per_source[p.source] for p in chosen))


def fit_by_build(found: list[RowPoint]) -> tuple[float, dict[str, float]]:
    """The pooled constant (CUDA, ROCm) and each own build's (``OWN_BUILDS``), on its own points."""
    own = {b: fit([p for p in found if p.build == b]) for b in sorted({p.build for p in found} - {""})}
    return fit([p for p in found if not p.build]), own


def held_out(all_points: list[RowPoint], by: str = "source") -> list[tuple[RowPoint, float]]:
    """Each source's (or device's, ``by="device"``) points with the constant of their build fitted on the
    others of that build: (point, log error). A build with no other source (device) is left out."""
    out = []
    for key in sorted({getattr(p, by) for p in all_points}):
        here = [p for p in all_points if getattr(p, by) == key]
        others = [p for p in all_points if getattr(p, by) != key and p.build == here[0].build]
        if others:
            k = fit(others)
            out += [(p, p.error(k)) for p in here]
    return out


def summary(errors: list[float]) -> tuple[float, float]:
    """(median |error| as a share, largest over-estimate as a factor)."""
    return math.exp(statistics.median(abs(e) for e in errors)) - 1, math.exp(max(errors))
