"""Which models a machine runs well: the hardware advisor's question turned round. For one machine
(a catalog device, or this computer) and one workload (people, each person's conversation length,
the speed each needs, the quantization quality floor), every catalog model is tried at each
llama.cpp preset that meets the floor, best quality first, and placed and timed by the estimate
service exactly as the window would (:func:`app.services.estimate.answer`). A model passes when
its placement fits and its typical speed per person reaches the speed needed; the ones that pass
are ranked by their published answer quality (:mod:`app.core.model.benchmarks`: MMLU-Pro, the
models without a published score after those with one), then by size, then by speed.

``fitscope advise --machine ID`` prints :func:`format_models`; the "Which machine?" tab shows the
same rows.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.core.advisor.configs import machine_name, presets_for, undominated, variant_of
from app.core.advisor.records import QUALITY_FLOORS, AdviceCancelledError, QualityFloor
from app.core.common.errors import EstimateError, FitScopeError
from app.core.model.architecture import Architecture
from app.core.model.benchmarks import UNRATED, Level, Score, score_of
from app.core.model.catalog import find_device, load_models
from app.core.model.quant import quantize_layout
from app.core.model.source import ModelSource
from app.core.report.choices import Controls, HardwareChoice, Machine, repack_for, resolve_targets
from app.core.report.lengths import WORDS_PER_TOKEN
from app.core.report.verdict import gib, rate, words_range
from app.core.speed.predict import Range
from app.services.estimate import answer


@dataclass(frozen=True)
class ModelOption:
    """One catalog model on the machine: its best-quality preset that passes, or (``passes``
    False) the one that came closest, with the reason in words."""

    model_id: str
    name: str
    params_billions: float | None
    quant: str
    score: Score | None
    placement: str
    decode: Range | None
    decode_typical: float
    headroom_bytes: int
    passes: bool
    reason: str

    @property
    def level(self) -> Level:
        return self.score.level if self.score is not None else UNRATED

    @property
    def quality_text(self) -> str:
        return f"{self.level.words} ({self.score.mmlu_pro_percent:g}%)" if self.score else UNRATED.words


@dataclass(frozen=True)
class MachineModels:
    """The answer: ``ranked`` the models that pass (best answers first), ``failing`` the others."""

    hardware: HardwareChoice
    machine_label: str
    controls: Controls
    min_tokens_per_s: float
    quality_floor: QualityFloor
    ranked: tuple[ModelOption, ...]
    failing: tuple[ModelOption, ...]
    evaluated: int
    seconds: float


def _rank_key(o: ModelOption) -> tuple[float, float, float]:
    score = o.score.mmlu_pro_percent if o.score is not None else -1.0
    return (-score, -(o.params_billions or 0.0), -o.decode_typical)


def _option(
    arch: Architecture,
    hardware: HardwareChoice,
    machine: Machine,
    controls: Controls,
    min_tokens_per_s: float,
    floor: QualityFloor,
) -> tuple[ModelOption, int]:
    """The best-quality preset of ``arch`` that passes on the machine, else the closest; and how many
    presets were placed."""
    targets = resolve_targets(hardware, machine, controls.backend)
    repack = repack_for(hardware, machine)
    total = sum(t.capacity_bytes for t in targets)
    presets = sorted(presets_for(arch, floor), key=lambda p: p.ppl_increase if p.ppl_increase is not None else 0.0)
    score = score_of(arch.id)
    best_fail: tuple[float, ModelOption] | None = None
    tried = 0

    def option(quant: str, **kw: object) -> ModelOption:
        fields: dict[str, object] = {
            "placement": "none",
            "decode": None,
            "decode_typical": 0.0,
            "headroom_bytes": 0,
            "passes": False,
            "reason": "",
        } | kw
        return ModelOption(arch.id, arch.name, arch.params_billions, quant, score, **fields)  # type: ignore[arg-type]

    # Each model is placed once here: its layouts are not kept (the advisor's cache holds the last
    # 256, which for every catalog model would be hundreds of MiB held after the answer).
    variants = undominated([variant_of(arch, p.name, p.ppl_increase, tuple(quantize_layout(arch, p))) for p in presets])
    for v in variants:
        if v.weights_bytes > total:
            fail = option(v.preset, reason=f"{v.preset}: the weights alone ({gib(v.weights_bytes)}) exceed its memory")
            closeness = total / v.weights_bytes
            if best_fail is None or closeness > best_fail[0]:
                best_fail = (closeness, fail)
            continue
        tried += 1
        try:
            found = answer(
                ModelSource(arch, v.tensors, arch.name, v.preset), targets, controls, repack=repack, limits=False
            )
        except EstimateError as exc:
            fail = option(v.preset, reason=f"{v.preset}: {exc}")
            best_fail = best_fail or (0.0, fail)
            continue
        b = found.budget
        typical = found.speed.decode_typical
        common = {
            "placement": found.placement,
            "decode": found.speed.decode_tokens_per_s,
            "decode_typical": typical,
            "headroom_bytes": b.free_bytes,
        }
        if not found.fits:
            fail = option(
                v.preset, reason=f"{v.preset}: needs {gib(b.used_bytes)}, has {gib(b.capacity_bytes)}", **common
            )
            closeness = b.capacity_bytes / max(b.used_bytes, 1)
        elif typical < min_tokens_per_s:
            fail = option(
                v.preset,
                reason=f"{v.preset}: fits, but about {rate(typical * WORDS_PER_TOKEN)} words a second each, under the "
                f"{rate(min_tokens_per_s * WORDS_PER_TOKEN)} needed",
                **common,
            )
            closeness = 1.0 + typical / max(min_tokens_per_s, 1e-9)
        else:
            where = "fits on the GPU" if found.placement == "gpu" else "fits partly in system memory"
            if found.placement == "cpu":
                where = "fits"
            reason = f"{v.preset}: {where}, about {words_range(found.speed.decode_tokens_per_s)} each"
            return option(v.preset, passes=True, reason=reason, **common), tried
        if best_fail is None or closeness > best_fail[0]:
            best_fail = (closeness, fail)
    if best_fail is None:
        return option("", reason="no quantization meets the quality floor"), tried
    return best_fail[1], tried


def models_for_machine(
    hardware: HardwareChoice,
    controls: Controls,
    min_tokens_per_s: float,
    quality_floor: QualityFloor = "slight",
    machine: Machine | None = None,
    models: Sequence[Architecture] | None = None,
    progress: Callable[[float, str], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> MachineModels:
    """Every catalog model (or ``models``) on ``hardware`` for ``controls``' people and conversation
    length, judged against ``min_tokens_per_s`` per person and ranked (module docstring).
    ``machine`` is this computer (for a "local" or "cpu" choice). Raises CatalogError for an unknown
    device, EstimateError for settings llama.cpp refuses, AdviceCancelledError when stopped."""
    started = time.perf_counter()
    machine = machine or Machine()
    label = _machine_label(hardware, machine)
    archs = list(models if models is not None else load_models())
    passing: list[ModelOption] = []
    failing: list[ModelOption] = []
    evaluated = 0
    controls.settings()  # settings llama.cpp refuses fail here, once, with their sentence
    for i, arch in enumerate(archs):
        if should_stop is not None and should_stop():
            raise AdviceCancelledError("Stopped.")
        try:
            found, tried = _option(arch, hardware, machine, controls, min_tokens_per_s, quality_floor)
        except (FitScopeError, ValueError, KeyError) as exc:
            found, tried = (
                ModelOption(arch.id, arch.name, arch.params_billions, "", None, "none", None, 0.0, 0, False, str(exc)),
                0,
            )
        evaluated += tried
        (passing if found.passes else failing).append(found)
        if progress is not None:
            progress((i + 1) / len(archs), arch.name)
    return MachineModels(
        hardware=hardware,
        machine_label=label,
        controls=controls,
        min_tokens_per_s=min_tokens_per_s,
        quality_floor=quality_floor,
        ranked=tuple(sorted(passing, key=_rank_key)),
        failing=tuple(sorted(failing, key=_rank_key)),
        evaluated=evaluated,
        seconds=time.perf_counter() - started,
    )


def _machine_label(hardware: HardwareChoice, machine: Machine) -> str:
    if hardware.kind != "catalog":
        return hardware.label(machine)
    return machine_name(find_device(hardware.device_id or ""), hardware.count)


def models_sentence(result: MachineModels) -> str:
    """The question in one sentence, as the answer opens with it."""
    c = result.controls
    people = "one person" if c.users == 1 else f"{c.users} people"
    return (
        f"Models for the {result.machine_label}: {people}, {c.context_per_user_tokens:,} tokens of conversation each, "
        f"at least {rate(result.min_tokens_per_s * WORDS_PER_TOKEN)} words a second each; quantization: "
        f"{QUALITY_FLOORS[result.quality_floor][0]}."
    )


def format_models(result: MachineModels, top: int = 15) -> str:
    """The answer as ``fitscope advise --machine`` prints it: the models that pass, best answers
    first, then why the best-known ones that fail do."""
    lines = [
        models_sentence(result),
        f"{len(result.ranked)} of {len(result.ranked) + len(result.failing)} catalog models run well "
        f"({result.evaluated} placements in {result.seconds:.1f} s).",
        "",
    ]
    if result.ranked:
        lines.append(f"  {'#':>2}  {'model':32} {'answers':26} {'quant':8} {'words a second each':>22}")
        for i, o in enumerate(result.ranked[:top], 1):
            speed = words_range(o.decode) if o.decode is not None else "-"
            lines.append(f"  {i:>2}  {o.name[:32]:32} {o.quality_text[:26]:26} {o.quant:8} {speed:>22}")
        if len(result.ranked) > top:
            lines.append(f"  ... and {len(result.ranked) - top} more (--top N).")
    else:
        lines.append("No catalog model runs well on it for this workload.")
    scored_fails = [o for o in result.failing if o.score is not None][:5]
    if scored_fails:
        lines += ["", "Better-rated models that fall short:"]
        lines += [f"  {o.name}: {o.reason}." for o in scored_fails if _better_than_best(o, result)]
    lines += [
        "",
        "Answer quality: MMLU-Pro as published by each model's makers or a leaderboard (see the model's details); "
        "a model without one says 'no published score'.",
    ]
    return "\n".join(lines)


def _better_than_best(o: ModelOption, result: MachineModels) -> bool:
    best = result.ranked[0].score.mmlu_pro_percent if result.ranked and result.ranked[0].score else -math.inf
    return o.score is not None and o.score.mmlu_pro_percent > best
