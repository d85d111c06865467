"""What the window shows, worked out without Qt: one request (model, hardware, controls) in, one
view (the estimate, the verdict in plain words, the data of every chart, the comparison) out. The
choices themselves are ``app.core.report.choices``, the verdict's words ``app.core.report.verdict``; their
names are importable from here too.

The window calls :meth:`Evaluator.evaluate` on a worker thread for every change. Whatever does
not depend on the chosen context (the memory-against-context curve, users against context, the
largest context, the quantized tensor lists) is cached, so a context-slider step costs one
estimate per quantization preset and per compared machine, about a millisecond each.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from app.core.common.errors import EstimateError, FitScopeError
from app.core.memory.autofit import auto_fit
from app.core.memory.estimate import estimate
from app.core.memory.limits import max_context_tokens, max_parallel_sequences
from app.core.memory.records import MAX_CONTEXT_TOKENS, Estimate, Target
from app.core.memory.targets import repack_profile
from app.core.model.catalog import find_device
from app.core.model.quant import PRESETS, QuantPreset, quality_words, quantize_layout
from app.core.model.source import ModelSource
from app.core.model.tensors import TensorInfo
from app.core.quality.divergence import MeasuredQuality, quality_key
from app.core.report.choices import (
    MAX_USERS,
    MIN_CONTEXT_TOKENS,
    Controls,
    HardwareChoice,
    Machine,
    ModelChoice,
    RemoteLoader,
    load_model,
    resolve_targets,
)
from app.core.report.fit import placement_of
from app.core.report.verdict import (
    Budget,
    Verdict,
    budget_of,
    hardware_note,
    make_verdict,
    people_sentence,
)
from app.core.speed.predict import Range, SpeedEstimate, estimate_speed

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

    def __init__(self, remote: RemoteLoader | None = None) -> None:
        self._remote = remote  # reads a model on a server (app.services.remote); None: refused
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
        source = load_model(choice, demo_path, self._remote)
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
            verdict = Verdict(verdict.level, verdict.headline, (*verdict.sentences, people_sentence(users, c)))
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


def evaluate_in_worker(
    request: Request, demo_path: Callable[[], Path] | None = None, remote: RemoteLoader | None = None
) -> View:
    """:meth:`Evaluator.evaluate` with this process's evaluator (its caches live as long as the
    process), returning a :meth:`View.portable` view. ``demo_path`` is called once, when the demo
    model is first asked for; ``remote`` reads models on servers."""
    global _PROCESS_EVALUATOR, _DEMO_PATH
    if _PROCESS_EVALUATOR is None:
        _PROCESS_EVALUATOR = Evaluator(remote)
    if request.model.kind == "demo" and _DEMO_PATH is None and demo_path is not None:
        _DEMO_PATH = str(demo_path())
    return _PROCESS_EVALUATOR.evaluate(request, _DEMO_PATH).portable()
