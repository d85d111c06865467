"""Which machine to buy: every catalog configuration evaluated for one workload.

The question turned round: not "does this model fit this machine" but "for this model, context,
number of users and speed per user, which hardware works, and what does it cost?". :func:`advise`
enumerates what the device catalog can build —

- boxes of 1-8 identical GPUs on a host platform (a desktop for 1-2 GPUs, a workstation for 3-4, a
  server for 5-8), with the platform's host RAM options;
- Apple machines and the other unified-memory boxes (DGX Spark, Ryzen AI Max);
- CPU servers;

— and, for each, every llama.cpp quantization preset that meets the user's quality floor (the
published perplexity increase in plain words, :func:`app.core.model.quant.quality_words`). Each one is
placed and timed by the estimate service exactly as ``fitscope estimate`` and the window do for
that machine (:func:`app.services.estimate.answer`: llama.cpp's layer split over identical GPUs;
MoE experts or whole layers moved to system memory as ``--fit`` does, with its margin; decode at
half the context for every user at once), and priced from the catalog. The passing
configurations are ranked by the user's preference, one per machine (its best-quality preset that
passes); :func:`format_advice` writes the answer as ``fitscope advise`` prints it.

Speed: the full catalog x presets x offload options is a few thousand configurations. The tensor
layout of each preset is computed once per model, the estimator remembers its per-model sums, and
configurations that cannot work are settled by cheap bounds before any estimate: the weights alone
larger than all the memory there is, or, with part of the model in system memory, a speed that
even the full bandwidth of both memories could not reach. They are still reported, with the bound
as the reason. ``scripts/bench_advisor.py`` times the whole sweep.

Prices: catalog list prices. A GPU box also needs a host; its price here is an assumption shown
with every answer (the platform's CPU from the catalog, a round figure for board, power supply,
case and disk, and DDR5 at a round price per GiB), not a quote.

The parts, by job: :mod:`app.core.advisor.records` (the workload, a configuration's verdict, the
answer), :mod:`app.core.advisor.configs` (the machines and presets swept),
:mod:`app.core.advisor.sweep` (the sweep's state and its bounds), :mod:`app.core.advisor.commands`
(launch commands and the JSON) and :mod:`app.services.advisor_evaluate` (one machine's verdicts).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from app.core.advisor.commands import launch_commands
from app.core.advisor.configs import (
    OS_RESERVE_BYTES,
    PLATFORMS,
    RAM_USD_PER_GIB,
    catalog_machines,
    load_variants,
)
from app.core.advisor.records import (
    CATEGORY_WORDS,
    QUALITY_FLOORS,
    AdviceCancelledError,
    Candidate,
    HardwareAdvice,
    Preference,
    Workload,
    format_rate,
    format_usd,
)
from app.core.advisor.sweep import Sweep
from app.core.common.units import GIB
from app.core.model.benchmarks import size_warning
from app.core.model.catalog import find_device
from app.core.report.lengths import WORDS_PER_TOKEN
from app.core.report.verdict import gib, rate
from app.core.speed.predict import UNCHECKED_USERS_EVIDENCE, USERS_UNCHECKED
from app.services.advisor_evaluate import evaluate_box, evaluate_single
from app.services.estimate import decode_depth_tokens


def _rank_key(c: Candidate, prefer: Preference) -> tuple[float, float, float]:
    """Sort key of a passing configuration: the preference first, then price, quality and speed."""
    price = c.price_usd if c.price_usd is not None else math.inf
    quality = c.ppl_increase if c.ppl_increase is not None else 9.0
    if prefer == "speed":
        return (-c.decode_typical, price, quality)
    if prefer == "headroom":
        return (-c.headroom_fraction, price, quality)
    return (price, quality, -c.decode_typical)


def advise(
    workload: Workload,
    progress: Callable[[float, str], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> HardwareAdvice:
    """Every catalog configuration for ``workload``, judged and ranked (see the module docstring).

    ``progress(fraction, message)`` is called as the sweep goes, ``should_stop()`` is polled between
    machines. Raises CatalogError / ModelFileError / EstimateError for a model or preset that cannot
    be read, EstimateError for settings llama.cpp refuses, AdviceCancelledError when stopped.
    """
    started = time.perf_counter()
    arch, label, path, variants = load_variants(workload)
    sw = Sweep.start(workload, arch, label, path, variants)
    boxes, singles = catalog_machines(workload.max_gpus)
    steps = len(boxes) + len(singles)
    done = 0
    for device, count in boxes:
        if should_stop is not None and should_stop():
            raise AdviceCancelledError("Stopped.")
        evaluate_box(sw, device, count)
        done += 1
        if progress is not None and count == workload.max_gpus:
            progress(done / steps, f"{device.name}: 1-{count} GPUs")
    for device in singles:
        if should_stop is not None and should_stop():
            raise AdviceCancelledError("Stopped.")
        evaluate_single(sw, device)
        done += 1
        if progress is not None:
            progress(done / steps, device.name)
    passing = sorted((c for c in sw.out if c.passes), key=lambda c: _rank_key(c, workload.prefer))
    best: dict[tuple[str, int], Candidate] = {}
    for c in sorted(passing, key=lambda c: (c.ppl_increase if c.ppl_increase is not None else 9.0, -c.decode_typical)):
        best.setdefault((c.device_id, c.count), c)
    ranked = sorted(best.values(), key=lambda c: _rank_key(c, workload.prefer))
    failing = tuple(c for c in sw.out if not c.passes)
    return HardwareAdvice(
        workload=workload,
        model_label=label,
        arch=arch,
        ranked=tuple(ranked),
        passing=tuple(passing),
        failing=failing,
        evaluated=len(sw.out),
        estimated=sw.estimated,
        seconds=time.perf_counter() - started,
        presets=tuple(v.preset for v in variants),
        assumptions=_assumptions(workload),
        model_path=path,
    )


def _assumptions(w: Workload) -> tuple[str, ...]:
    platforms = "; ".join(
        f"{p.label} for up to {p.max_gpus} GPUs: {p.cpu_name} ({format_usd(p.cpu_price_usd)}) + "
        f"{format_usd(p.base_usd)} board, power, case and disk, "
        f"RAM {'/'.join(map(str, p.ram_options_gib))} GiB"
        for p in PLATFORMS
    )
    return (
        f"Speed per user at {decode_depth_tokens(w.controls(), 512):,} tokens into each conversation, all {w.users} "
        "user(s) at once, as the estimate for each machine says it; a configuration passes when the speed model's "
        "typical figure reaches the minimum (the range is shown).",
        f"Quality floor: {QUALITY_FLOORS[w.quality_floor][0]} (llama.cpp's published perplexity increase).",
        f"GPU boxes: llama.cpp's layer split over identical GPUs; host platforms (assumed prices): {platforms}; "
        f"DDR5 at {format_usd(RAM_USD_PER_GIB)} per GiB; the smallest RAM that holds the host's share plus "
        f"{OS_RESERVE_BYTES // GIB} GiB.",
        "When the GPUs are too small: MoE experts, then whole layers, in system memory, as llama.cpp's --fit "
        "places them (1 GiB kept free per GPU).",
        "Apple and unified-memory boxes: the GPU's share of the memory by default; prices are whole computers.",
        "Prices are catalog list prices in US dollars; datacenter GPUs without a list price are ranked last and "
        "excluded by a budget.",
    )


def words_to_tokens(words_per_s: float) -> float:
    """Tokens/s for a speed in words a second (English prose, 0.75 words per token)."""
    return words_per_s / WORDS_PER_TOKEN


PREFERENCE_WORDS: dict[str, str] = {
    "price": "lowest price first",
    "speed": "fastest first",
    "headroom": "most memory to spare first",
}


def workload_sentence(w: Workload, model_label: str) -> str:
    """The workload in one sentence, as the answer opens with it."""
    users = f"{w.users} people" if w.users > 1 else "one person"
    budget = f", budget {format_usd(w.budget_usd)}" if w.budget_usd else ""
    return (
        f"{model_label} for {users}, {w.context_per_user_tokens:,} tokens of conversation each, at least "
        f"{rate(w.min_words_per_s)} words a second each ({rate(w.min_tokens_per_s)} tokens/s); "
        f"{QUALITY_FLOORS[w.quality_floor][0]}{budget}."
    )


def advice_warnings(advice: HardwareAdvice) -> tuple[str, ...]:
    """What to hear before the machines: a model far too small for the people it must serve, and, for
    several people, that the speed each gets on a build no published run of several rows checks may be lower."""
    w = advice.workload
    model_id = w.model.ref if w.model.kind == "catalog" else None
    warnings = [size_warning(model_id, advice.model_label, advice.arch.params_billions, w.users)]
    if w.users > 1 and any(
        c.category != "cpu" and find_device(c.device_id).backend in USERS_UNCHECKED for c in advice.ranked
    ):
        warnings.append(
            "With several people at once, the machines listed on Metal, Vulkan or SYCL builds (Macs, Intel's GPUs) "
            f"may give each person less than shown: {UNCHECKED_USERS_EVIDENCE}."
        )
    return tuple(x for x in warnings if x)


def format_advice(advice: HardwareAdvice, top: int = 10, why: Sequence[str] = ()) -> str:
    """The answer as ``fitscope advise`` prints it: the ranked machines, the best of each kind, why
    single GPUs of the ranked boxes (and ``why`` device ids) fail, and the launch command of the first."""
    w = advice.workload
    lines = [
        workload_sentence(w, advice.model_label),
        *advice_warnings(advice),
        f"{advice.evaluated:,} configurations ({len(advice.presets)} presets: {', '.join(advice.presets)}) "
        f"in {advice.seconds:.2f} s; {len(advice.passing):,} pass, on {len(advice.ranked)} machines.",
        "",
    ]
    if advice.ranked:
        lines.append(
            f"Machines that do it ({PREFERENCE_WORDS[w.prefer]}; each with its best-quality preset that passes):"
        )
        lines.append(
            f"  {'#':>2}  {'machine':58} {'quant':8} {'price':>9} {'to spare':>9}  "
            f"{'tokens/s per user':>19} {'total':>6}"
        )
        for i, c in enumerate(advice.ranked[:top], 1):
            lines.append("  " + _row(i, c))
        if len(advice.ranked) > top:
            lines.append(f"  ... and {len(advice.ranked) - top} more (--top N, or --json for all).")
    else:
        lines.append("No configuration in the catalog does it.")
    lines += ["", "Best of each kind:"]
    for kind, c in advice.best_per_category().items():
        verdict = "passes" if c.passes else "does not pass"
        lines.append(f"  {CATEGORY_WORDS[kind]}: {c.label}, {c.quant}, {_price_text(c)}: {verdict}: {c.reason}.")
    asked = list(dict.fromkeys([*why, *(c.device_id for c in advice.ranked[:top] if c.count > 1)]))
    nots = [c for c in (advice.why_not(d, 1) for d in asked) if c is not None]
    if nots:
        lines += ["", "Why not one GPU:" if not why else "Why not:"]
        for c in nots:
            lines.append(f"  {c.device_name}: {c.reason}.")
    if advice.ranked:
        first = advice.ranked[0]
        llama, vllm = launch_commands(advice, first)
        lines += ["", f"Launch #1 ({first.label}, {first.quant}):", f"  {llama}"]
        if vllm:
            lines.append(f"  {vllm}")
        lines.append(f"  Price: {first.price_note}.")
    lines += ["", "Assumptions:"] + [f"  - {a}" for a in advice.assumptions]
    return "\n".join(lines)


def _price_text(c: Candidate) -> str:
    return format_usd(c.price_usd) if c.price_usd is not None else "price not listed"


def _row(i: int, c: Candidate) -> str:
    speed = (
        f"{format_rate(c.decode_typical)} ({format_rate(c.decode.low)}-{format_rate(c.decode.high)})"
        if c.decode is not None
        else "-"
    )
    price = format_usd(c.price_usd) if c.price_usd is not None else "unlisted"
    label = c.label if len(c.label) <= 58 else c.label[:57] + "…"
    return (
        f"{i:>2}  {label:58} {c.quant:8} {price:>9} {gib(c.headroom_bytes):>9}  {speed:>19} "
        f"{format_rate(c.total_tokens_per_s):>6}"
    )
