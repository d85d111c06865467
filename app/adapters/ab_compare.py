"""Run task suites on 2–4 variants of one model and compare them: the highest-precision variant
first (its greedy answers are the reference), then the others, each in a llama.cpp child process;
optionally, first, every variant's KL divergence, perplexity and same-top-token rate against that
reference on a text (``app.adapters.divergence_runner``, cached per file and text).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from app.adapters.child_protocol import ChildEvent, WorkerProcess
from app.adapters.divergence_runner import (
    DivergenceResult,
    DivergenceSettings,
    measure_divergence,
    record_measured_quality,
)
from app.adapters.paths import data_dir
from app.adapters.suite_runner import Agreement, PromptDone, PromptJob, SuiteRun, SuiteRunSettings, run_suite
from app.core.common.errors import FitScopeError
from app.core.memory.estimate import estimate
from app.core.memory.records import GpuLayers, Settings, Target
from app.core.model.source import model_from_gguf
from app.core.quality.divergence import MeasuredQuality, quality_key
from app.core.quality.quant_compare import Comparison, VariantResult, median_or_none, recommend_quant, score
from app.core.quality.suite import Suite
from app.core.report.verdict import budget_of

MAX_VARIANTS = 4
KEPT_ANSWER_FILES = 10
Progress = Callable[[float, str], None]


def answers_dir() -> Path:
    """Where each comparison's measured answers are kept before they are scored."""
    return data_dir() / "compare-answers"


def keep_answers(paths: Sequence[str | Path], runs: dict[int, SuiteRun]) -> Path | None:
    """Write every variant's answers and figures to a file of their own before scoring, so that a
    check that fails however it fails cannot lose what took minutes to measure; the newest
    KEPT_ANSWER_FILES are kept. Returns the file, or None when it could not be written."""
    folder = answers_dir()
    target = folder / f"answers-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.json"
    payload = {"variants": [{"gguf_path": str(paths[i]), "run": runs[i].model_dump(mode="json")} for i in runs]}
    partial = target.with_suffix(".partial")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(payload), encoding="utf-8")
        os.replace(partial, target)
    except (OSError, ValueError):
        with contextlib.suppress(OSError):
            partial.unlink()
        return None
    with contextlib.suppress(OSError):
        for old in sorted(folder.glob("answers-*.json"))[:-KEPT_ANSWER_FILES]:
            old.unlink()
    return target


def prompt_jobs(suites: Sequence[Suite]) -> tuple[PromptJob, ...]:
    return tuple(
        PromptJob(id=f"{s.name}/{p.id}", prompt=p.prompt, max_tokens=p.max_tokens) for s in suites for p in s.prompts
    )


def compare_variants(
    paths: Sequence[str | Path],
    suites: Sequence[Suite],
    targets: list[Target],
    hardware: str,
    repack: str = "x86-avx2",
    context_tokens: int = 4096,
    gpu_layers: GpuLayers = 0,
    on_progress: Progress | None = None,
    stop: threading.Event | None = None,
    on_start: Callable[[WorkerProcess], None] | None = None,
    divergence: DivergenceSettings | None = None,
) -> Comparison:
    """Answer every suite on every variant and compare. ``targets`` is the hardware the advice must
    fit (the estimator's targets); ``divergence`` (a text and its settings) adds each variant's KL
    divergence and perplexity against the reference. Raises FitScopeError for fewer than 2 or more
    than 4 variants, a file that cannot be read or loaded, or a stop."""
    if not 2 <= len(paths) <= MAX_VARIANTS:
        raise FitScopeError(f"Compare 2 to {MAX_VARIANTS} variants of one model (got {len(paths)}).")
    models = [model_from_gguf(p) for p in paths]
    archs = {(m.arch.arch, m.arch.n_layer, m.arch.n_embd, m.arch.n_vocab) for m in models}
    if len(archs) > 1:
        raise FitScopeError("These files are not variants of one model (their architectures differ).")
    settings = Settings(context_tokens=context_tokens, repack=repack)  # type: ignore[arg-type]
    sizes = [Path(p).stat().st_size for p in paths]
    order = sorted(range(len(paths)), key=lambda i: -sizes[i])  # highest precision first
    jobs = prompt_jobs(suites)
    total_steps = len(jobs) * (2 * len(paths) - 1)
    done_steps = 0
    runs: dict[int, SuiteRun] = {}
    reference: dict[str, list[int]] | None = None

    # With a text, its passes take the first half of the progress bar and the suites the second.
    div_share = 0.5 if divergence is not None else 0.0

    def progress(message: str) -> None:
        if on_progress is not None:
            on_progress(div_share + (1 - div_share) * min(done_steps / max(total_steps, 1), 1.0), message)

    measured: DivergenceResult | None = None
    if divergence is not None:
        ordered = [str(paths[i]) for i in order]
        measured = measure_divergence(
            ordered[0],
            ordered[1:],
            divergence.model_copy(update={"gpu_layers": gpu_layers}),
            labels={str(p): Path(p).stem for p in paths},
            on_progress=(lambda f, m: on_progress(div_share * f, m)) if on_progress is not None else None,
            stop=stop,
            on_start=on_start,
        )

    for rank, i in enumerate(order):
        name = Path(paths[i]).name
        progress(f"Loading {name}…")

        def on_event(event: ChildEvent, name: str = name) -> None:
            nonlocal done_steps
            if isinstance(event, PromptDone | Agreement):
                done_steps += 1
                progress(f"{name}: {event.outcome.id if isinstance(event, PromptDone) else event.id}")

        def started(live: WorkerProcess) -> None:
            if on_start is not None:
                on_start(live)
            if stop is not None and stop.is_set():
                live.stop()

        run = run_suite(
            SuiteRunSettings(
                gguf_path=str(paths[i]),
                prompts=jobs,
                reference=reference,
                context_tokens=context_tokens,
                gpu_layers=gpu_layers,
            ),
            on_event=on_event,
            on_start=started,
        )
        if run.stopped or (stop is not None and stop.is_set()):
            raise FitScopeError("The comparison was stopped.")
        runs[i] = run
        if rank == 0:
            reference = {o.id: list(o.tokens) for o in run.outcomes}

    kept = keep_answers(paths, runs)
    variants = []
    for i in order:
        run, model = runs[i], models[i]
        est = estimate(model.arch, model.tensors, settings, targets)
        answers = {tuple(o.id.split("/", 1)): o.text for o in run.outcomes}
        errors = {tuple(o.id.split("/", 1)): o.error for o in run.outcomes if o.error}
        try:
            rates, checked = score(suites, answers, errors)  # type: ignore[arg-type]
        except (RecursionError, MemoryError, ValueError, TypeError) as exc:  # a check must never lose the runs
            where = f"; the answers are kept in {kept}" if kept is not None else ""
            raise FitScopeError(f"Scoring the answers of {Path(paths[i]).name} failed ({exc}){where}.") from exc
        ref_tokens = sum(o.reference_tokens or 0 for o in run.outcomes)
        is_reference = i == order[0]
        variants.append(
            VariantResult(
                label=Path(paths[i]).stem,
                quant=model.quant,
                gguf_path=str(paths[i]),
                file_bytes=sizes[i],
                estimated_total_bytes=budget_of(est).used_bytes,
                fits=est.fits,
                peak_rss_bytes=run.peak_rss_bytes,
                decode_tokens_per_s=median_or_none([o.decode_tokens_per_s for o in run.outcomes]),
                prefill_tokens_per_s=median_or_none([o.prefill_tokens_per_s for o in run.outcomes]),
                ttft_s=median_or_none([o.ttft_s for o in run.outcomes]),
                pass_rates=rates,
                answers=checked,
                identical_token_share=None
                if is_reference or not ref_tokens
                else sum(o.identical_tokens or 0 for o in run.outcomes) / ref_tokens,
                top1_agreement=None
                if is_reference or not ref_tokens
                else sum(o.top1_matches or 0 for o in run.outcomes) / ref_tokens,
                is_reference=is_reference,
                n_threads=run.n_threads,
                prompt_format=run.prompt_format,
            )
        )
    notes = [f"Reference (highest precision): {variants[0].label}."]
    if measured is not None:
        notes += measured.notes
    if measured is not None:
        variants = [dataclasses.replace(v, divergence=measured.figures.get(v.gguf_path)) for v in variants]
        others = [v for v in variants if not v.is_reference]
        arch = models[0].arch
        key = quality_key(arch.arch, arch.n_layer, arch.n_embd, arch.n_vocab)
        record_measured_quality(
            [
                MeasuredQuality(
                    model_key=key,
                    preset=v.quant,
                    delta_perplexity=d.value,
                    low=d.low,
                    high=d.high if d.high is not None else d.value,
                    reference_preset=variants[0].quant,
                    tokens=v.divergence.positions,
                    text_name=v.divergence.text_name,
                )
                for v in others
                if v.divergence is not None and (d := v.divergence.delta_perplexity) is not None
            ]
        )
        for a, b in zip(others, others[1:], strict=False):
            notes.append(measured.pair_sentence(a.gguf_path, b.gguf_path, a.label, b.label))
    progress("Done.")
    return Comparison(
        variants=tuple(variants),
        suites=tuple(suites),
        advice=recommend_quant(variants, suites, hardware),
        hardware=hardware,
        notes=tuple(notes),
    )
