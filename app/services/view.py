"""What the window shows, worked out without Qt: one request (model, hardware, controls) in, one
view (the answer, the verdict in plain words, the data of every chart, the ladder, the comparison)
out. Every figure is an :func:`app.services.estimate.answer`: the main one, each quantization
preset's and each compared machine's, so the window, the command line and the advisor agree.

The window calls :meth:`Evaluator.evaluate` in a worker process for every change. What does not
depend on the chosen context per user (the memory-against-context curve, users against context,
the largest context) is cached, so a context-slider step costs one answer per preset and per
compared machine.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from app.core.advisor.configs import MachinePrice, machine_price
from app.core.common.errors import EstimateError, FitScopeError
from app.core.memory.estimate import estimate
from app.core.memory.records import MAX_CONTEXT_TOKENS, Estimate, RepackProfile, Target
from app.core.model.catalog import find_device
from app.core.model.quant import PRESETS, QuantPreset, quality_words, quantize_layout
from app.core.model.source import ModelSource
from app.core.model.tensors import TensorInfo
from app.core.quality.divergence import MeasuredQuality, quality_key
from app.core.report.choices import (
    MIN_CONTEXT_TOKENS,
    Controls,
    HardwareChoice,
    Machine,
    ModelChoice,
    RemoteLoader,
    load_model,
    repack_for,
    resolve_targets,
)
from app.core.report.verdict import (
    Budget,
    Verdict,
    budget_of,
    hardware_note,
    make_verdict,
    people_sentence,
    rate_range,
)
from app.core.speed.predict import Range, SpeedEstimate
from app.services.estimate import Answer, LimitScope, answer, largest_context_per_user, place, users_that_fit
from app.services.room import buyer_warnings, hardware_words, machine_label, room_headline

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
    min_tokens_per_s: float | None = None
    """The speed each person needs (the shared workload settings); None: not asked."""


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
    speculative_bytes: tuple[int, ...] = ()
    """The draft model's or MTP head's share (empty: no speculative decoding)."""


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
    weights_bytes: int = 0
    """The model's weights at this preset (what "smaller" means: the file, wherever it runs)."""
    measured: MeasuredQuality | None = None
    """This model's own Δ perplexity for the preset, measured against a reference file (A/B tab)."""

    @property
    def placement_words(self) -> str:
        """What this row is, in the three words a buyer needs (plus the CPU-only case)."""
        speed = rate_range(self.decode_tokens_per_s)
        return {
            "gpu": "fits on the GPU",
            "partial": f"runs partly in system memory at {speed}",
            "cpu": f"runs on the processor at {speed}",
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
    price_note: str = ""
    """What the whole-computer price is made of (:func:`app.core.advisor.configs.machine_price`)."""
    price_kind: str = ""
    """"PC", "computer", "server"...: what the price buys ("" without a price)."""


@dataclass(frozen=True)
class View:
    """Everything the window shows for one request. ``error`` is set (and ``answer`` None) when the
    settings are impossible; the message says why in plain words."""

    request: Request
    model: ModelSource | None
    answer: Answer | None
    verdict: Verdict
    context_curve: ContextCurve | None
    ladder: tuple[LadderRow, ...]
    ladder_note: str
    concurrency: ConcurrencyCurve | None
    comparison: tuple[CompareRow, ...]
    """The compared machines (the current hardware is ``current``)."""
    current: CompareRow | None = None
    """The current hardware as a row of the comparison, from the same answer (its label ends "(current)")."""
    targets: tuple[Target, ...] = ()
    error: str = ""
    room_headline: str = ""
    """The answer for a room: the model, the machine, the people, yes or no and how fast."""

    @property
    def hardware_label(self) -> str:
        return self.request.hardware.label(self.request.machine)

    @property
    def estimate(self) -> Estimate | None:
        return self.answer.estimate if self.answer else None

    @property
    def speed(self) -> SpeedEstimate | None:
        return self.answer.speed if self.answer else None

    @property
    def budget(self) -> Budget | None:
        return self.answer.budget if self.answer else None

    @property
    def users_that_fit(self) -> int:
        return self.answer.limits.users_that_fit if self.answer and self.answer.limits else 0

    @property
    def largest_context_per_user_tokens(self) -> int:
        return self.answer.limits.largest_context_per_user_tokens if self.answer and self.answer.limits else 0

    @property
    def assumptions(self) -> tuple[str, ...]:
        if self.answer is None:
            return ()
        return tuple(self.answer.estimate.assumptions) + tuple(self.answer.speed.assumptions)

    def portable(self) -> View:
        """This view without the model's tensor list (thousands of entries nothing downstream of the
        evaluator reads), for sending between processes."""
        if self.model is None or not self.model.tensors:
            return self
        return dataclasses.replace(
            self,
            model=dataclasses.replace(self.model, tensors=()),
            answer=self.answer.portable() if self.answer else None,
        )


# -- the evaluator -------------------------------------------------------------------------------


def context_grid(n_ctx_train: int, points_per_octave: int = 4, chosen: int = 0) -> tuple[int, ...]:
    """Context lengths from 512 to the trained context (or to ``chosen``, when that is longer, so
    that a chart always shows the choice), evenly spaced on a log scale."""
    top = max(MIN_CONTEXT_TOKENS, min(max(n_ctx_train, chosen), MAX_CONTEXT_TOKENS))
    octaves = math.log2(top / MIN_CONTEXT_TOKENS)
    n = max(2, int(round(octaves * points_per_octave)) + 1)
    out = sorted({int(round(MIN_CONTEXT_TOKENS * 2 ** (octaves * i / (n - 1)))) for i in range(n)})
    out[-1] = top
    return tuple(out)


class Evaluator:
    """Turns requests into views, remembering what a context change does not alter. Not thread
    safe: the window keeps one per worker."""

    def __init__(self, remote: RemoteLoader | None = None) -> None:
        self._remote = remote  # reads a model on a server (app.services.remote); None: refused
        self._models: dict[ModelChoice, ModelSource] = {}
        self._ladder_tensors: dict[tuple[str, str], tuple[TensorInfo, ...] | str] = {}
        self._curves: dict[tuple[object, ...], tuple[ContextCurve, ConcurrencyCurve]] = {}
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

    def _preset_model(self, model: ModelSource, preset: QuantPreset) -> ModelSource | str:
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
        if isinstance(hit, str):
            return hit
        return dataclasses.replace(model, tensors=hit, quant=preset.name)

    def _answer(
        self,
        model: ModelSource,
        targets: list[Target],
        request: Request,
        limits: bool,
        hardware: HardwareChoice | None = None,
    ) -> Answer:
        return answer(
            model,
            targets,
            request.controls,
            repack=repack_for(request.hardware if hardware is None else hardware, request.machine),
            prompt_tokens=request.prompt_tokens,
            efficiency=self._efficiency,
            limits=limits,
        )

    def evaluate(self, request: Request, demo_path: str | None = None) -> View:
        """The view for a request. Raises FitScopeError only when the model cannot be loaded."""
        model = self.model(request.model, demo_path)
        self._efficiency = dict(request.measured_efficiency)
        self._measured_quality = {(m.model_key, m.preset): m for m in request.measured_quality}
        targets = resolve_targets(request.hardware, request.machine, request.controls.backend)
        c = request.controls
        try:
            main = self._answer(model, targets, request, limits=True)
        except EstimateError as exc:
            return _error_view(request, model, targets, str(exc))
        assert main.limits is not None
        curve, concurrency = self._context_curves(model, targets, request, main.limits.scope)
        ladder, ladder_note = self._ladder(model, targets, request)
        smaller = _smaller_quant(main, ladder)
        est = main.estimate
        verdict = make_verdict(
            est,
            main.speed,
            c,
            main.limits.largest_context_per_user_tokens,
            smaller,
            model.arch.n_ctx_train,
            gpus_hidden=main.gpus_hidden,
        )
        if est.fits and main.limits.users_that_fit >= 1:
            verdict = verdict.adding(people_sentence(main.limits.users_that_fit, c, main.limits.scope, main.placement))
        verdict = verdict.adding(hardware_note(request.hardware, request.machine, c.backend))
        name = self._name(model, request)
        warnings = buyer_warnings(
            request.model, name, model.arch.params_billions, c.users, main, request.min_tokens_per_s
        )
        verdict = Verdict(verdict.level, verdict.headline, (*warnings, *verdict.sentences), verdict.technical)
        headline = room_headline(
            name,
            hardware_words(request.hardware, request.machine),
            c.users,
            main,
            verdict.level,
            request.min_tokens_per_s,
        )
        current = _compare_row(machine_label(request.hardware, request.machine) + " (current)", main, request.hardware)
        comparison = tuple(self._compare_row(model, request, choice) for choice in request.compare)
        return View(
            request=request,
            model=model,
            answer=main,
            verdict=verdict,
            context_curve=curve,
            ladder=ladder,
            ladder_note=ladder_note,
            concurrency=concurrency,
            comparison=comparison,
            current=current,
            targets=main.targets,
            room_headline=headline,
        )

    @staticmethod
    def _name(model: ModelSource, request: Request) -> str:
        """The model as people call it: the catalog's name, else the file's label."""
        if request.model.kind == "demo":
            return "Gemma 3 270M (the demo)"
        return model.arch.name if request.model.kind == "catalog" else model.label

    def _context_curves(
        self, model: ModelSource, targets: list[Target], request: Request, scope: LimitScope
    ) -> tuple[ContextCurve, ConcurrencyCurve]:
        c = request.controls
        repack = repack_for(request.hardware, request.machine)
        arch = model.arch
        # A context beyond the trained one widens the charts to the next power of two (not at every
        # step of the slider), so the choice is always on them.
        chosen = c.context_per_user_tokens
        reach = 2 ** math.ceil(math.log2(chosen)) if chosen > arch.n_ctx_train else 0
        unchanging = c.model_copy(update={"context_per_user_tokens": 1})
        key = (id(model), model.label, unchanging, tuple(targets), repack, reach)
        hit = self._curves.get(key)
        if hit is not None:
            return hit
        grid = context_grid(arch.n_ctx_train, chosen=reach)
        budgets = []
        for n in grid:
            at = c.model_copy(update={"context_per_user_tokens": min(n, MAX_CONTEXT_TOKENS // c.users)})
            budgets.append(budget_of(_curve_estimate(model, targets, at, repack, scope)))
        largest = largest_context_per_user(model, targets, c, repack, scope)
        first = budgets[0]
        curve = ContextCurve(
            label=first.label,
            contexts=grid,
            weights_bytes=tuple(b.weights_bytes for b in budgets),
            kv_cache_bytes=tuple(b.kv_cache_bytes for b in budgets),
            compute_bytes=tuple(b.compute_bytes for b in budgets),
            overhead_bytes=tuple(b.overhead_bytes for b in budgets),
            capacity_bytes=first.capacity_bytes,
            max_context_tokens=largest,
            projector_bytes=tuple(b.projector_bytes for b in budgets) if c.projector is not None else (),
            speculative_bytes=tuple(b.speculative_bytes for b in budgets) if c.speculative is not None else (),
        )
        users_grid = context_grid(arch.n_ctx_train, points_per_octave=2, chosen=reach)
        users = tuple(
            users_that_fit(
                model,
                targets,
                c.model_copy(update={"context_per_user_tokens": min(n, MAX_CONTEXT_TOKENS)}),
                repack,
                scope,
            )
            for n in users_grid
        )
        result = (curve, ConcurrencyCurve(users_grid, users))
        if len(self._curves) > 64:
            self._curves.pop(next(iter(self._curves)))
        self._curves[key] = result
        return result

    def _ladder(self, model: ModelSource, targets: list[Target], request: Request) -> tuple[tuple[LadderRow, ...], str]:
        rows = []
        failures = []
        key = quality_key(model.arch.arch, model.arch.n_layer, model.arch.n_embd, model.arch.n_vocab)
        for preset in PRESETS:
            if preset.name in ("F32", "MXFP4_MOE") and preset.name != model.quant:
                continue
            variant = self._preset_model(model, preset)
            if isinstance(variant, str):
                failures.append(preset.name)
                continue
            try:
                a = self._answer(variant, targets, request, limits=False)
            except EstimateError:
                continue
            b = a.budget
            rows.append(
                LadderRow(
                    placement=a.placement,
                    preset=preset.name,
                    ppl_increase=preset.ppl_increase,
                    description=preset.description,
                    budget_bytes=b.used_bytes,
                    capacity_bytes=b.capacity_bytes,
                    fits=a.fits,
                    gpu_layers=a.estimate.gpu_layers,
                    decode_tokens_per_s=a.speed.decode_tokens_per_s,
                    current=preset.name == model.quant,
                    weights_bytes=_weights_bytes(a.estimate),
                    measured=self._measured_quality.get((key, preset.name)),
                )
            )
        rows.sort(key=lambda r: (r.weights_bytes, r.budget_bytes))
        note = ""
        if model.quant not in {r.preset for r in rows} and model.path is not None:
            note = f"This file's quantization ({model.quant}) is not a llama.cpp preset; the ladder shows the presets."
        if failures and not rows:
            note = f"The quantization ladder is not available for the {model.arch.arch} architecture."
        return tuple(rows), note

    def _compare_row(self, model: ModelSource, request: Request, choice: HardwareChoice) -> CompareRow:
        try:
            label = machine_label(choice, request.machine)
            targets = resolve_targets(choice, request.machine, request.controls.backend)
            a = self._answer(model, targets, request, limits=False, hardware=choice)
        except FitScopeError as exc:
            return CompareRow(
                choice.device_id or choice.kind, 0, 0, False, None, model.arch.n_layer, None, None, str(exc)
            )
        return _compare_row(label, a, choice)


def _curve_estimate(
    model: ModelSource, targets: list[Target], controls: Controls, repack: RepackProfile, scope: LimitScope
) -> Estimate:
    """The memory-against-context chart's estimate at one context, placed by the rule that decides
    what fits (so the curve crosses the capacity where the largest context that fits is): every
    layer on the GPUs ("gpu"), the chosen layers ("fixed"), auto-fit's placement ("any")."""
    if scope == "any":
        try:
            return place(model, targets, controls, repack)[0]
        except EstimateError:
            pass
    layers = controls.gpu_layers if scope == "fixed" and controls.gpu_layers != "auto" else "all"
    return estimate(model.arch, model.tensors, controls.settings(repack, layers), targets)


def _price(choice: HardwareChoice) -> MachinePrice | None:
    """The whole-computer price of a catalog choice (None for this machine)."""
    if choice.kind != "catalog" or not choice.device_id:
        return None
    try:
        device = find_device(choice.device_id)
    except FitScopeError:
        return None
    return machine_price(device, choice.count, choice.host_ram_gib)


def _compare_row(label: str, a: Answer, choice: HardwareChoice) -> CompareRow:
    b = a.budget
    price = _price(choice)
    return CompareRow(
        label=label,
        budget_bytes=b.used_bytes,
        capacity_bytes=b.capacity_bytes,
        fits=a.fits,
        gpu_layers=a.estimate.gpu_layers if a.has_gpus else None,
        n_layer=a.estimate.n_layer,
        decode_tokens_per_s=a.speed.decode_tokens_per_s,
        price_usd=price.total_usd if price is not None else None,
        price_note=price.note if price is not None else "",
        price_kind=price.kind if price is not None and price.total_usd is not None else "",
    )


def _weights_bytes(est: Estimate) -> int:
    """The model's weights wherever they are placed (the file's size, more or less)."""
    return sum(d.weights_bytes for d in est.devices)


def _smaller_quant(main: Answer, ladder: tuple[LadderRow, ...]) -> str | None:
    """When the model does not fit: the best-quality preset with smaller weights that fits (the
    ladder runs from the smallest), on the GPU if any does; otherwise one that runs partly in system
    memory, said as such with its speed. Never a "smaller" preset that is not smaller."""
    if main.fits:
        return None
    weights = _weights_bytes(main.estimate)
    fitting = [r for r in ladder if r.fits and r.weights_bytes < weights]
    on_gpu = [r for r in fitting if r.placement == "gpu"]
    if on_gpu:
        best = on_gpu[-1]
        return (
            f"A smaller quantization, {best.preset}, fits on the GPU at this context "
            f"({quality_words(best.ppl_increase)})."
        )
    if fitting:
        best = fitting[-1]
        return f"A smaller quantization, {best.preset}, {best.placement_words} ({quality_words(best.ppl_increase)})."
    return None


def _error_view(request: Request, model: ModelSource, targets: list[Target], message: str) -> View:
    return View(
        request=request,
        model=model,
        answer=None,
        verdict=Verdict("red", "These settings are not possible.", (message,)),
        context_curve=None,
        ladder=(),
        ladder_note="",
        concurrency=None,
        comparison=(),
        targets=tuple(targets),
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

