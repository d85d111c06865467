"""What the window shows, worked out without Qt: one request (model, hardware, controls) in, one
view (the estimate, the verdict in plain words, the data of every chart, the comparison) out.

The window calls :meth:`Evaluator.evaluate` on a worker thread for every change. Whatever does
not depend on the chosen context (the memory-against-context curve, users against context, the
largest context, the quantized tensor lists) is cached, so a context-slider step costs one
estimate per quantization preset and per compared machine, about a millisecond each.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from app.core.autofit import auto_fit
from app.core.catalog import find_device, find_projector, load_devices
from app.core.coverage import approximate_sentence
from app.core.devices import DeviceSpec
from app.core.divergence import MeasuredQuality, quality_key
from app.core.errors import EstimateError, FitScopeError
from app.core.estimate import (
    MAX_CONTEXT_TOKENS,
    Estimate,
    Settings,
    Target,
    estimate,
    max_context_tokens,
    max_parallel_sequences,
)
from app.core.fit import (
    ModelSource,
    cpu_target,
    host_ram_beside,
    host_ram_target,
    model_from_catalog,
    model_from_gguf,
    model_from_hf_config,
    placement_of,
    repack_profile,
    target_from_device,
    target_from_gpu,
)
from app.core.hardware import GpuSnapshot, HostSnapshot
from app.core.projector import ProjectorSpec
from app.core.quant import PRESETS, QuantPreset, quality_words, quantize_layout
from app.core.speed import Range, SpeedEstimate, estimate_speed
from app.core.tensors import TensorInfo
from app.core.units import GIB, Frozen

MIN_CONTEXT_TOKENS = 512
MAX_USERS = 64
WORDS_PER_TOKEN = 0.75  # English prose, as commonly quoted for BPE tokenizers
AMBER_HEADROOM = 0.10  # under 10% of the memory left: it fits, but only just
# An architecture whose rules are not proven: "fits" needs a wider margin before it shows green
# (the unverified parts, KV cache and compute buffers, were off by up to 5x on hybrid models).
APPROXIMATE_HEADROOM = 0.25




class HardwareChoice(Frozen):
    """Where the model should run: this machine (its GPUs, or its CPU only) or a catalog device."""

    kind: Literal["local", "cpu", "catalog"] = "local"
    device_id: str | None = None
    count: int = Field(default=1, ge=1, le=8)
    host_ram_gib: float | None = Field(
        default=None, gt=0, le=65536, description="host memory beside catalog GPUs; None: this machine's"
    )
    host_memory: str | None = Field(
        default=None, description="a HOST_MEMORY key for catalog GPUs' host RAM; None: dual-channel DDR5"
    )

    def label(self, machine: Machine | None = None) -> str:
        if self.kind == "cpu":
            return "This machine's CPU"
        if self.kind == "local":
            if machine is not None and machine.gpus:
                names = {g.name for g in machine.gpus}
                one = names.pop() if len(names) == 1 else "GPUs"
                return (
                    f"This machine ({len(machine.gpus)}x {one})" if len(machine.gpus) > 1 else f"This machine ({one})"
                )
            return "This machine"
        device = find_device(self.device_id or "")
        return f"{self.count}x {device.name}" if self.count > 1 else device.name


class ModelChoice(Frozen):
    """The model: the built-in demo, a catalog entry (quantized with ``quant``), a GGUF file or a
    Hugging Face config.json (quantized with ``quant``)."""

    kind: Literal["demo", "catalog", "gguf", "hf_config"] = "demo"
    ref: str = ""
    quant: str = "Q4_K_M"


def catalog_projector(choice: ModelChoice) -> ProjectorSpec | None:
    """The vision projector a catalog model is served with (llama-server --mmproj); None for a
    text-only model, and for the demo, a file or a config.json (their projector is chosen)."""
    if choice.kind != "catalog":
        return None
    entry = find_projector(choice.ref)
    return entry.spec() if entry is not None else None


class Controls(Frozen):
    """The knobs, named for people: ``context_tokens`` is what each user gets; llama.cpp's ``-c`` is
    that times ``users`` (its ``-np`` slots). ``gpu_layers=None`` means "auto": the most that fit."""

    context_tokens: int = Field(default=4096, ge=1, le=MAX_CONTEXT_TOKENS)
    users: int = Field(default=1, ge=1, le=MAX_USERS)
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: bool = True
    gpu_layers: int | None = Field(default=None, ge=0)
    n_cpu_moe: int | None = Field(default=None, ge=0, description="experts of the first N layers in RAM; None: auto")
    backend: str = Field(default="auto", description="the llama.cpp build; auto: by the hardware")
    consumer: str = "llama-server"
    mmap: bool = True
    projector: ProjectorSpec | None = Field(
        default=None, description="the vision projector loaded beside the model (--mmproj); None: text only"
    )

    def settings(self, repack: str = "x86-avx2", gpu_layers: int | None = None) -> Settings:
        """llama.cpp's settings for these controls. Raises EstimateError for values it refuses."""
        total = self.context_tokens * self.users
        if total > MAX_CONTEXT_TOKENS:
            raise EstimateError(
                f"{self.users} users x {self.context_tokens:,} tokens is a llama.cpp context of {total:,} tokens, "
                f"beyond the {MAX_CONTEXT_TOKENS:,} FitScope estimates; lower the context or the users."
            )
        try:
            return Settings(
                context_tokens=total,
                parallel_sequences=self.users,
                cache_type_k=self.cache_type_k,
                cache_type_v=self.cache_type_v,
                flash_attn=self.flash_attn,
                gpu_layers=gpu_layers,
                repack=repack,  # type: ignore[arg-type]
                backend=self.backend,  # type: ignore[arg-type]
                consumer=self.consumer,  # type: ignore[arg-type]
                # llama-server defaults to a window-sized SWA cache, llama-cpp-python to a full one.
                swa_full=self.consumer != "llama-server",
                mmap=self.mmap,
                n_cpu_moe=self.n_cpu_moe or 0,
                mmproj=self.projector,
            )
        except ValidationError as exc:
            raise EstimateError(exc.errors()[0]["msg"]) from None


@dataclass(frozen=True)
class Machine:
    """What was detected here: NVIDIA GPUs (empty without a driver) and the host."""

    gpus: tuple[GpuSnapshot, ...] = ()
    host: HostSnapshot | None = None
    gpu_message: str = ""


# -- hardware ------------------------------------------------------------------------------------


_NAME_NOISE = re.compile(r"\(.*?\)|\bnvidia\b|\bgeforce\b|\btesla\b|\b\d+\s*gb\b")


def _name_tokens(name: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", _NAME_NOISE.sub(" ", name.lower()))


def _token_matches(wanted: str, tokens: list[str]) -> bool:
    # A word may carry a generation digit ("sxm" matches NVML's "sxm4"); a model number must match
    # exactly ("l4" is not "l40", "l40" is not "l40s").
    if not wanted.isalpha():
        return wanted in tokens
    return any(t == wanted or (t.startswith(wanted) and t[len(wanted) :].isdigit()) for t in tokens)


def match_catalog_device(gpu_name: str, memory_bytes: int | None = None) -> DeviceSpec | None:
    """The catalog entry for a GPU name as NVML reports it ("NVIDIA GeForce RTX 4060 Ti",
    "NVIDIA A100-SXM4-80GB"), or None. Every word of the catalog name (memory sizes aside) should
    appear in NVML's; the model number must. Ties (4060 Ti 8/16 GB) go to the closest memory size."""
    tokens = _name_tokens(gpu_name)
    best: tuple[tuple, DeviceSpec] | None = None
    for d in load_devices():
        if d.vendor != "nvidia":
            continue
        wanted = _name_tokens(d.name)
        number = next((w for w in wanted if any(c.isdigit() for c in w)), None)
        if number is None or not _token_matches(number, tokens):
            continue
        matched = sum(_token_matches(w, tokens) for w in wanted)
        # Memory in 4 GiB steps: NVML reports a little less than the box says.
        gap = round(abs(d.memory_gib * GIB - memory_bytes) / (4 * GIB)) if memory_bytes else 0
        score = (matched == len(wanted), -gap, matched)
        if best is None or score > best[0]:
            best = (score, d)
    return best[1] if best else None


def resolve_targets(choice: HardwareChoice, machine: Machine) -> list[Target]:
    """The estimator's targets for a hardware choice. Raises CatalogError for an unknown device."""
    host = machine.host
    if choice.kind == "cpu" or (choice.kind == "local" and not machine.gpus):
        return [cpu_target(host)]
    if choice.kind == "local":
        gpus = [target_from_gpu(g, match_catalog_device(g.name, g.memory_total_bytes)) for g in machine.gpus]
        ram = host.ram_total_bytes if host else 16 * GIB
        return [*gpus, host_ram_target(ram, host.measured_read_bandwidth_gb_s if host else None)]
    device = find_device(choice.device_id or "")
    base = target_from_device(device)
    if not device.is_gpu:
        return [base]
    gpus = [
        base.model_copy(update={"name": f"{base.name} #{i + 1}"}) if choice.count > 1 else base
        for i in range(choice.count)
    ]
    host_bytes = host_ram_beside(
        device,
        int(choice.host_ram_gib * GIB) if choice.host_ram_gib is not None else None,
        host.ram_total_bytes if host else 64 * GIB,
    )
    return [*gpus, host_ram_target(host_bytes, host_memory=choice.host_memory)]


def load_model(choice: ModelChoice, demo_path: str | Path | None = None) -> ModelSource:
    """The model a choice names: a catalog entry at its quantization, a config.json, a GGUF file or
    the demo model (at ``demo_path``). Raises ModelFileError / CatalogError / EstimateError."""
    if choice.kind == "catalog":
        return model_from_catalog(choice.ref, choice.quant)
    if choice.kind == "hf_config":
        return model_from_hf_config(choice.ref, choice.quant)
    path = choice.ref if choice.kind == "gguf" else (demo_path or choice.ref)
    if not path:
        raise FitScopeError("The demo model is not available; pick a catalog model or open a GGUF file.")
    return model_from_gguf(path)


# -- requests and views --------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    model: ModelChoice
    hardware: HardwareChoice
    controls: Controls
    machine: Machine
    compare: tuple[HardwareChoice, ...] = ()
    prompt_tokens: int = 512
    measured_efficiency: tuple[tuple[str, float], ...] = ()
    """(target name, decode efficiency) measured by live runs on this machine."""
    measured_quality: tuple[MeasuredQuality, ...] = ()
    """Δ perplexities measured by quantization A/B comparisons, shown on the ladder."""


@dataclass(frozen=True)
class Verdict:
    level: Literal["green", "amber", "red"]
    headline: str
    sentences: tuple[str, ...]

    @property
    def text(self) -> str:
        return " ".join((self.headline, *self.sentences))


@dataclass(frozen=True)
class Budget:
    """The memory that limits: the GPUs together when layers are on them, else host memory."""

    label: str
    used_bytes: int
    capacity_bytes: int
    weights_bytes: int
    kv_cache_bytes: int
    compute_bytes: int
    overhead_bytes: int
    projector_bytes: int = 0

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes


@dataclass(frozen=True)
class ContextCurve:
    """Memory of the limiting device against context per user (bytes, same length as ``contexts``)."""

    label: str
    contexts: tuple[int, ...]
    weights_bytes: tuple[int, ...]
    kv_cache_bytes: tuple[int, ...]
    compute_bytes: tuple[int, ...]
    overhead_bytes: tuple[int, ...]
    capacity_bytes: int
    max_context_tokens: int
    projector_bytes: tuple[int, ...] = ()
    """The vision projector's share (empty: no projector)."""


@dataclass(frozen=True)
class LadderRow:
    preset: str
    ppl_increase: float | None
    description: str
    budget_bytes: int
    capacity_bytes: int
    fits: bool
    gpu_layers: int
    decode_tokens_per_s: Range
    current: bool
    placement: Literal["gpu", "partial", "cpu", "none"] = "gpu"
    measured: MeasuredQuality | None = None
    """This model's own Δ perplexity for the preset, measured against a reference file (A/B tab)."""

    @property
    def placement_words(self) -> str:
        """What this row is, in the three words a buyer needs (plus the CPU-only case)."""
        rate = f"{self.decode_tokens_per_s.low:.0f}-{self.decode_tokens_per_s.high:.0f} tokens/s"
        return {
            "gpu": "fits on the GPU",
            "partial": f"runs partly in system memory at {rate}",
            "cpu": f"runs on the CPU at {rate}",
            "none": "does not fit",
        }[self.placement]


@dataclass(frozen=True)
class ConcurrencyCurve:
    contexts: tuple[int, ...]
    users: tuple[int, ...]


@dataclass(frozen=True)
class CompareRow:
    label: str
    budget_bytes: int
    capacity_bytes: int
    fits: bool
    gpu_layers: int | None
    n_layer: int
    decode_tokens_per_s: Range | None
    price_usd: float | None
    error: str = ""


@dataclass(frozen=True)
class View:
    """Everything the window shows for one request. ``error`` is set (and the rest may be empty)
    when the settings are impossible; the message says why in plain words."""

    request: Request
    model: ModelSource | None
    targets: tuple[Target, ...]
    estimate: Estimate | None
    speed: SpeedEstimate | None
    budget: Budget | None
    gpu_layers: int | None
    max_context_tokens: int
    max_users: int
    verdict: Verdict
    context_curve: ContextCurve | None
    ladder: tuple[LadderRow, ...]
    ladder_note: str
    concurrency: ConcurrencyCurve | None
    comparison: tuple[CompareRow, ...]
    assumptions: tuple[str, ...] = field(default=())
    error: str = ""

    @property
    def hardware_label(self) -> str:
        return self.request.hardware.label(self.request.machine)

    def portable(self) -> View:
        """This view without the model's tensor list (thousands of entries nothing downstream of the
        evaluator reads), for sending between processes."""
        if self.model is None or not self.model.tensors:
            return self
        return dataclasses.replace(self, model=dataclasses.replace(self.model, tensors=()))


# -- plain words ---------------------------------------------------------------------------------


def gib(n_bytes: float) -> str:
    return f"{n_bytes / GIB:,.1f} GiB"


def budget_of(est: Estimate) -> Budget:
    gpus = [d for d in est.devices if d.kind == "gpu" and (d.layers or d.weights_bytes)]
    chosen = gpus or [d for d in est.devices if d.kind == "cpu"]
    label = chosen[0].name if len(chosen) == 1 else f"{len(chosen)} GPUs together"

    def total(*names: str) -> int:
        return sum(getattr(d, n) for d in chosen for n in names)

    return Budget(
        label=label,
        used_bytes=total("total_bytes"),
        capacity_bytes=total("capacity_bytes"),
        weights_bytes=total("weights_bytes", "repack_bytes"),
        kv_cache_bytes=total("kv_cache_bytes", "recurrent_state_bytes"),
        compute_bytes=total("compute_bytes", "output_bytes"),
        overhead_bytes=total("overhead_bytes"),
        projector_bytes=total("projector_bytes"),
    )


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "-"


def _speed_words(decode: Range) -> str:
    lo, hi = decode.low, decode.high
    if hi <= 0:
        return ""
    if hi < 1:
        return f"Expect under one token a second ({lo:.2f}-{hi:.2f} tokens/s): too slow for a conversation."
    r = lambda x: f"{x:,.0f}" if x >= 10 else f"{x:.1f}"  # noqa: E731
    w_lo, w_hi = lo * WORDS_PER_TOKEN, hi * WORDS_PER_TOKEN
    return f"Expect about {r(lo)}-{r(hi)} tokens/s (roughly {r(w_lo)}-{r(w_hi)} words a second)."


def hardware_note(choice: HardwareChoice) -> str:
    """What a number on screen means for this hardware when it differs from the box's label."""
    if choice.kind != "catalog" or not choice.device_id:
        return ""
    device = find_device(choice.device_id)
    if device.memory_kind != "unified" or device.gpu_usable_fraction >= 1:
        return ""
    usable = device.memory_gib * device.gpu_usable_fraction
    if device.vendor == "apple":
        return (
            f"macOS lets the GPU use {usable:,.0f} of the {device.memory_gib:,.0f} GiB by default; it can be raised "
            f"(sudo sysctl iogpu.wired_limit_mb=N), leaving less for the system."
        )
    return (
        f"Of the {device.memory_gib:,.0f} GiB of shared memory, about {usable:,.0f} GiB can be given to the GPU; "
        "the rest stays with the system."
    )


def _people_sentence(users: int, controls: Controls) -> str:
    """How many conversations fit at once, each with the chosen context."""
    each = f"{controls.context_tokens:,} tokens (about {controls.context_tokens * WORDS_PER_TOKEN:,.0f} words) each"
    if users >= MAX_USERS:
        return f"At least {MAX_USERS} people can chat at once with {each} (FitScope counts up to {MAX_USERS})."
    if users == 1:
        return f"One person at a time can chat with {each}."
    return f"Up to {users} people can chat at once with {each}."


def make_verdict(
    est: Estimate,
    speed: SpeedEstimate,
    controls: Controls,
    max_context: int,
    smaller_quant: str | None,
    n_ctx_train: int = 0,
    gpus_hidden: bool = False,
) -> Verdict:
    """The answer in plain words, with a light: green (fits with room), amber (fits with under 10%
    to spare, or only partly on the GPU, or under 25% to spare on an architecture whose rules are
    approximate), red (does not fit). An approximate estimate says so first."""
    verdict = _verdict(est, speed, controls, max_context, smaller_quant, n_ctx_train, gpus_hidden)
    if est.repack_bytes >= 0.1 * GIB:
        verdict = Verdict(
            verdict.level,
            verdict.headline,
            (
                *verdict.sentences,
                f"On a CPU, llama.cpp also keeps a rearranged copy of {gib(est.repack_bytes)} of the weights for "
                "faster arithmetic, so the same model needs more memory here than on a graphics card.",
            ),
        )
    if not est.approximate:
        return verdict
    caveat = approximate_sentence(est.architecture or "unknown")
    if est.rules == "unknown":
        caveat = (
            f"The llama.cpp FitScope ships cannot load this architecture ({est.architecture}); the figures below "
            "come from generic rules. " + caveat
        )
    level = verdict.level
    if level == "green" and budget_of(est).free_bytes < APPROXIMATE_HEADROOM * budget_of(est).capacity_bytes:
        level = "amber"
    return Verdict(level, verdict.headline, (caveat, *verdict.sentences))


def _verdict(
    est: Estimate,
    speed: SpeedEstimate,
    controls: Controls,
    max_context: int,
    smaller_quant: str | None,
    n_ctx_train: int,
    gpus_hidden: bool,
) -> Verdict:
    budget = budget_of(est)
    convo = (
        f"remembering the conversation ({controls.context_tokens:,} tokens)"
        if controls.users == 1
        else f"remembering {controls.users} conversations of {controls.context_tokens:,} tokens each"
    )
    shares = (
        f"The model itself takes {_percent(budget.weights_bytes, budget.capacity_bytes)} of the memory; "
        f"{convo} takes {_percent(budget.kv_cache_bytes, budget.capacity_bytes)}."
    )
    if not est.fits:
        over = [d for d in est.devices if not d.fits]
        worst = max(over, key=lambda d: -d.free_bytes)
        headline = (
            f"Does not fit: {worst.name} needs {gib(worst.total_bytes)} but has {gib(worst.capacity_bytes)} "
            f"({gib(-worst.free_bytes)} short)."
        )
        shares = f"The model itself needs {gib(budget.weights_bytes)}; {convo} needs {gib(budget.kv_cache_bytes)}."
        advice = []
        if max_context >= MIN_CONTEXT_TOKENS and max_context < controls.context_tokens:
            advice.append(f"The largest context that fits is {max_context:,} tokens per user.")
        if smaller_quant:
            advice.append(smaller_quant)
        if not advice:
            advice.append("Choose a smaller model, or hardware with more memory.")
        return Verdict("red", headline, (shares, *advice))
    gpu_devices = [d for d in est.devices if d.kind == "gpu"]
    partial = gpu_devices and (est.gpu_layers < est.n_layer + 1 or est.cpu_moe_layers > 0)
    speed_text = _speed_words(speed.decode_tokens_per_s)
    if speed_text:
        who = "for each of the users" if controls.users > 1 else "for one user"
        total = speed.decode_total_tokens_per_s
        speed_text = speed_text[:-1] + (
            f" {who}, {speed.depth_tokens:,} tokens into the conversation"
            + (f"; {total.low:,.0f}-{total.high:,.0f} tokens/s in total" if controls.users > 1 else "")
            + "."
        )
    if gpus_hidden:
        headline = (
            "Runs on the CPU only: the GPU has too little free memory even for the working buffers llama.cpp "
            "keeps on it, so hide it (llama-server --device none)."
        )
        return Verdict("amber", headline, tuple(s for s in (shares, speed_text) if s))
    beyond = ""
    if n_ctx_train and controls.context_tokens > n_ctx_train:
        beyond = (
            f"That is beyond the {n_ctx_train:,} tokens the model was trained on: answers degrade there unless "
            "the model supports context extension."
        )
    if partial:
        gpus = "GPUs" if len(gpu_devices) > 1 else "GPU"
        rate = f"{speed.decode_tokens_per_s.low:.0f}-{speed.decode_tokens_per_s.high:.0f} tokens/s"
        if est.gpu_layers >= est.n_layer + 1:
            headline = (
                f"Runs partly in system memory, at about {rate}: every layer is on the {gpus}, but the experts of "
                f"{est.cpu_moe_layers} of {est.n_layer} layers stay in system memory (--n-cpu-moe "
                f"{est.cpu_moe_layers})."
            )
        elif controls.gpu_layers is None:
            headline = (
                f"Runs partly in system memory, at about {rate}: {est.gpu_layers} of {est.n_layer + 1} layers fit "
                f"on the {gpus} (keeping 1 GiB free, as llama.cpp's --fit does); the rest run on the CPU."
            )
        else:
            headline = (
                f"Runs partly in system memory, at about {rate}: {est.gpu_layers} of {est.n_layer + 1} layers on "
                f"the {gpus}, as chosen; the rest run on the CPU."
            )
        return Verdict("amber", headline, tuple(s for s in (shares, speed_text, beyond) if s))
    level: Literal["green", "amber"] = "green"
    headline = f"Fits, with {gib(budget.free_bytes)} to spare."
    if budget.free_bytes < AMBER_HEADROOM * budget.capacity_bytes:
        level = "amber"
        share = _percent(budget.free_bytes, budget.capacity_bytes)
        headline = f"Fits, but only just: {gib(budget.free_bytes)} to spare ({share})."
    return Verdict(level, headline, tuple(s for s in (shares, speed_text, beyond) if s))


# -- the evaluator -------------------------------------------------------------------------------


def context_grid(n_ctx_train: int, points_per_octave: int = 4) -> tuple[int, ...]:
    """Context lengths from 512 to the trained context, evenly spaced on a log scale."""
    top = max(MIN_CONTEXT_TOKENS, min(n_ctx_train, MAX_CONTEXT_TOKENS))
    octaves = math.log2(top / MIN_CONTEXT_TOKENS)
    n = max(2, int(round(octaves * points_per_octave)) + 1)
    out = sorted({int(round(MIN_CONTEXT_TOKENS * 2 ** (octaves * i / (n - 1)))) for i in range(n)})
    out[-1] = top
    return tuple(out)


class Evaluator:
    """Turns requests into views, remembering what a context change does not alter. Not thread
    safe: the window keeps one per worker thread."""

    def __init__(self) -> None:
        self._models: dict[ModelChoice, ModelSource] = {}
        self._ladder_tensors: dict[tuple[str, str], tuple[TensorInfo, ...] | str] = {}
        self._curves: dict[tuple, tuple[ContextCurve, ConcurrencyCurve, int]] = {}
        self._efficiency: dict[str, float] = {}
        self._measured_quality: dict[tuple[str, str], MeasuredQuality] = {}

    # Model loading is the slow, failing part (files); the window calls it first to report errors.
    def model(self, choice: ModelChoice, demo_path: str | None = None) -> ModelSource:
        """The model for a choice. Raises ModelFileError / CatalogError / EstimateError."""
        cached = self._models.get(choice)
        if cached is not None:
            return cached
        source = load_model(choice, demo_path)
        if len(self._models) > 32:
            self._models.pop(next(iter(self._models)))
        self._models[choice] = source
        return source

    def _preset_tensors(self, model: ModelSource, preset: QuantPreset) -> tuple[TensorInfo, ...] | str:
        key = (model.arch.id + "|" + model.label + "|" + str(model.path), preset.name)
        hit = self._ladder_tensors.get(key)
        if hit is None:
            if model.quant == preset.name:
                hit = model.tensors
            else:
                try:
                    hit = tuple(quantize_layout(model.arch, preset))
                except (EstimateError, FitScopeError, ValueError, KeyError) as exc:
                    hit = str(exc)
            self._ladder_tensors[key] = hit
        return hit

    def evaluate(self, request: Request, demo_path: str | None = None) -> View:
        """The view for a request. Raises FitScopeError only when the model cannot be loaded."""
        model = self.model(request.model, demo_path)
        self._efficiency = dict(request.measured_efficiency)
        self._measured_quality = {(m.model_key, m.preset): m for m in request.measured_quality}
        machine = request.machine
        targets = resolve_targets(request.hardware, machine)
        repack = repack_profile(machine.host)
        c = request.controls
        if c.projector is not None and c.projector.n_embd_text != model.arch.n_embd:
            return _error_view(
                request,
                model,
                targets,
                f"The vision projector {c.projector.name} outputs width {c.projector.n_embd_text}, but "
                f"{model.label} takes {model.arch.n_embd}: it belongs to another model (llama-server refuses it).",
            )
        try:
            est, layers = self._placed(model.arch, model.tensors, c, targets, repack)
        except EstimateError as exc:
            return _error_view(request, model, targets, str(exc))
        speed = estimate_speed(
            model.arch,
            model.tensors,
            est,
            targets,
            prompt_tokens=min(request.prompt_tokens, est.settings.context_tokens),
            # A conversation half-way through its context, with every user talking at once.
            depth_tokens=max(c.context_tokens // 2, min(request.prompt_tokens, c.context_tokens)),
            measured_efficiency=self._efficiency,
            users=c.users,
        )
        curve, concurrency, max_ctx = self._context_curves(model, c, targets, repack, est.gpu_layers)
        users = max_parallel_sequences(
            model.arch,
            model.tensors,
            est.settings.model_copy(update={"kv_unified": False}),
            targets,
            c.context_tokens,
            upper=MAX_USERS,
        )
        ladder, note = self._ladder(model, c, targets, repack)
        smaller = None
        if not est.fits:
            # The best-quality preset that fits where the current one does not, on the GPU if any
            # does; otherwise one that runs partly in system memory, said as such with its speed.
            fitting = [r for r in ladder if r.fits and r.budget_bytes < budget_of(est).used_bytes]
            on_gpu = [r for r in fitting if r.placement == "gpu"]
            if on_gpu:
                best = on_gpu[-1]
                smaller = (
                    f"A smaller quantization, {best.preset}, fits on the GPU at this context "
                    f"({quality_words(best.ppl_increase)})."
                )
            elif fitting:
                best = fitting[-1]
                smaller = (
                    f"A smaller quantization, {best.preset}, {best.placement_words} "
                    f"({quality_words(best.ppl_increase)})."
                )
        hidden = (
            bool(targets) and any(t.kind == "gpu" for t in targets) and not any(d.kind == "gpu" for d in est.devices)
        )
        verdict = make_verdict(est, speed, c, max_ctx, smaller, model.arch.n_ctx_train, gpus_hidden=hidden)
        if est.fits and users >= 1:
            verdict = Verdict(verdict.level, verdict.headline, (*verdict.sentences, _people_sentence(users, c)))
        note = hardware_note(request.hardware)
        if note:
            verdict = Verdict(verdict.level, verdict.headline, (*verdict.sentences, note))
        comparison = tuple(self._compare_row(model, c, choice, machine, repack) for choice in request.compare)
        return View(
            request=request,
            model=model,
            targets=tuple(targets),
            estimate=est,
            speed=speed,
            budget=budget_of(est),
            gpu_layers=layers,
            max_context_tokens=max_ctx,
            max_users=users,
            verdict=verdict,
            context_curve=curve,
            ladder=ladder,
            ladder_note=note,
            concurrency=concurrency,
            comparison=comparison,
            assumptions=tuple(est.assumptions) + tuple(speed.assumptions),
        )

    @staticmethod
    def _placed(
        arch, tensors: Sequence[TensorInfo], c: Controls, targets: list[Target], repack: str
    ) -> tuple[Estimate, int | None]:
        """The estimate with the asked GPU layers, or with the most that fit ("auto")."""
        has_gpu = any(t.kind == "gpu" for t in targets)
        settings = c.settings(repack)
        if c.gpu_layers is not None or not has_gpu:
            layers = c.gpu_layers if has_gpu else None
            return estimate(arch, tensors, settings.model_copy(update={"gpu_layers": layers}), targets), layers
        # "auto": llama.cpp's --fit (a margin per GPU, experts to system memory before layers).
        plan = auto_fit(arch, tensors, settings, targets, fixed_cpu_moe=c.n_cpu_moe)
        if plan.estimate.fits:
            return plan.estimate, plan.gpu_layers
        # Nothing that fits: show the full-offload picture, which says how far the GPU is from enough.
        full = estimate(arch, tensors, settings.model_copy(update={"gpu_layers": None}), targets)
        return full, arch.n_layer + 1

    def _context_curves(
        self, model: ModelSource, c: Controls, targets: list[Target], repack: str, gpu_layers: int
    ) -> tuple[ContextCurve, ConcurrencyCurve, int]:
        key = (id(model), model.label, c.model_copy(update={"context_tokens": 1}), tuple(targets), repack, gpu_layers)
        hit = self._curves.get(key)
        if hit is not None:
            return hit
        arch, tensors = model.arch, model.tensors
        base = c.settings(repack, gpu_layers=gpu_layers)
        grid = context_grid(arch.n_ctx_train)
        budgets = []
        for n in grid:
            s = base.model_copy(update={"context_tokens": min(n * c.users, MAX_CONTEXT_TOKENS)})
            budgets.append(budget_of(estimate(arch, tensors, s, targets)))
        per_user_limit = (
            max_context_tokens(arch, tensors, base, targets, upper=min(arch.n_ctx_train * c.users, MAX_CONTEXT_TOKENS))
            // c.users
        )
        first = budgets[0]
        curve = ContextCurve(
            label=first.label,
            contexts=grid,
            weights_bytes=tuple(b.weights_bytes for b in budgets),
            kv_cache_bytes=tuple(b.kv_cache_bytes for b in budgets),
            compute_bytes=tuple(b.compute_bytes for b in budgets),
            overhead_bytes=tuple(b.overhead_bytes for b in budgets),
            capacity_bytes=first.capacity_bytes,
            max_context_tokens=per_user_limit,
            projector_bytes=tuple(b.projector_bytes for b in budgets) if c.projector is not None else (),
        )
        users_grid = context_grid(arch.n_ctx_train, points_per_octave=2)
        no_unified = base.model_copy(update={"kv_unified": False})
        users = tuple(
            max_parallel_sequences(arch, tensors, no_unified, targets, n, upper=MAX_USERS) for n in users_grid
        )
        result = (curve, ConcurrencyCurve(users_grid, users), per_user_limit)
        if len(self._curves) > 64:
            self._curves.pop(next(iter(self._curves)))
        self._curves[key] = result
        return result

    def _ladder(
        self, model: ModelSource, c: Controls, targets: list[Target], repack: str
    ) -> tuple[tuple[LadderRow, ...], str]:
        rows = []
        failures = []
        key = quality_key(model.arch.arch, model.arch.n_layer, model.arch.n_embd, model.arch.n_vocab)
        for preset in PRESETS:
            if preset.name in ("F32", "MXFP4_MOE") and preset.name != model.quant:
                continue
            tensors = self._preset_tensors(model, preset)
            if isinstance(tensors, str):
                failures.append(preset.name)
                continue
            try:
                est, layers = self._placed(model.arch, tensors, c, targets, repack)
            except EstimateError:
                continue
            speed = estimate_speed(
                model.arch,
                tensors,
                est,
                targets,
                prompt_tokens=min(512, est.settings.context_tokens),
                measured_efficiency=self._efficiency,
            )
            b = budget_of(est)
            rows.append(
                LadderRow(
                    placement=placement_of(est),
                    preset=preset.name,
                    ppl_increase=preset.ppl_increase,
                    description=preset.description,
                    budget_bytes=b.used_bytes,
                    capacity_bytes=b.capacity_bytes,
                    fits=est.fits,
                    gpu_layers=est.gpu_layers,
                    decode_tokens_per_s=speed.decode_tokens_per_s,
                    current=preset.name == model.quant,
                    measured=self._measured_quality.get((key, preset.name)),
                )
            )
        rows.sort(key=lambda r: r.budget_bytes)
        note = ""
        if model.quant not in {r.preset for r in rows} and model.path is not None:
            note = f"This file's quantization ({model.quant}) is not a llama.cpp preset; the ladder shows the presets."
        if failures and not rows:
            note = f"The quantization ladder is not available for the {model.arch.arch} architecture."
        return tuple(rows), note

    def _compare_row(
        self, model: ModelSource, c: Controls, choice: HardwareChoice, machine: Machine, repack: str
    ) -> CompareRow:
        try:
            label = choice.label(machine)
            targets = resolve_targets(choice, machine)
            est, _ = self._placed(model.arch, model.tensors, c, targets, repack)
            speed = estimate_speed(
                model.arch,
                model.tensors,
                est,
                targets,
                prompt_tokens=min(512, est.settings.context_tokens),
                measured_efficiency=self._efficiency,
            )
        except FitScopeError as exc:
            return CompareRow(
                choice.device_id or choice.kind, 0, 0, False, None, model.arch.n_layer, None, None, str(exc)
            )
        price = None
        if choice.kind == "catalog":
            device = find_device(choice.device_id or "")
            price = device.price_usd * choice.count if device.price_usd else None
        b = budget_of(est)
        has_gpu = any(t.kind == "gpu" for t in targets)
        return CompareRow(
            label=label,
            budget_bytes=b.used_bytes,
            capacity_bytes=b.capacity_bytes,
            fits=est.fits,
            gpu_layers=est.gpu_layers if has_gpu else None,
            n_layer=model.arch.n_layer,
            decode_tokens_per_s=speed.decode_tokens_per_s,
            price_usd=price,
        )


def _error_view(request: Request, model: ModelSource, targets: list[Target], message: str) -> View:
    return View(
        request=request,
        model=model,
        targets=tuple(targets),
        estimate=None,
        speed=None,
        budget=None,
        gpu_layers=None,
        max_context_tokens=0,
        max_users=0,
        verdict=Verdict("red", "These settings are not possible.", (message,)),
        context_curve=None,
        ladder=(),
        ladder_note="",
        concurrency=None,
        comparison=(),
        error=message,
    )


# -- one evaluator per worker process ------------------------------------------------------------

_PROCESS_EVALUATOR: Evaluator | None = None
_DEMO_PATH: str | None = None


def evaluate_in_worker(request: Request, demo_path: Callable[[], Path] | None = None) -> View:
    """:meth:`Evaluator.evaluate` with this process's evaluator (its caches live as long as the
    process), returning a :meth:`View.portable` view. ``demo_path`` is called once, when the demo
    model is first asked for."""
    global _PROCESS_EVALUATOR, _DEMO_PATH
    if _PROCESS_EVALUATOR is None:
        _PROCESS_EVALUATOR = Evaluator()
    if request.model.kind == "demo" and _DEMO_PATH is None and demo_path is not None:
        _DEMO_PATH = str(demo_path())
    return _PROCESS_EVALUATOR.evaluate(request, _DEMO_PATH).portable()
