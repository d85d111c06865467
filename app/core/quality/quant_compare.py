"""Choosing a quantization by the user's own task: score each variant's answers with the suites'
checks, set them against the highest-precision variant, and recommend, for each task profile with
a quality floor, the cheapest variant that meets it and fits the hardware.

Pure data and arithmetic; the answers come from ``app.adapters.suite_runner``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.core.common.units import GIB
from app.core.quality.divergence import DivergenceFigures, Figure
from app.core.quality.evidence import paired, wilson_interval
from app.core.quality.suite import Suite
from app.core.quality.suite_checks import CheckResult, check_answer, pass_rate

DEFAULT_FLOOR = 0.8


@dataclass(frozen=True)
class PromptAnswer:
    suite: str
    prompt_id: str
    text: str
    result: CheckResult


@dataclass(frozen=True)
class VariantResult:
    """One variant's figures. Memory in bytes, speeds in tokens/s, agreement as shares (0..1);
    agreement is None for the reference itself."""

    label: str
    quant: str
    gguf_path: str
    file_bytes: int
    estimated_total_bytes: int
    fits: bool
    peak_rss_bytes: int | None
    decode_tokens_per_s: float | None
    prefill_tokens_per_s: float | None
    ttft_s: float | None
    pass_rates: dict[str, float]
    answers: tuple[PromptAnswer, ...]
    identical_token_share: float | None = None
    top1_agreement: float | None = None
    is_reference: bool = False
    n_threads: int | None = None
    prompt_format: str = "raw"  # "chat template": through the model's own template
    divergence: DivergenceFigures | None = None  # KL / perplexity against the reference on a text


@dataclass(frozen=True)
class QuantRecommendation:
    """For one task profile: the variant to route to (None when none qualifies) and why."""

    profile: str
    floor: float
    chosen: str | None
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Comparison:
    variants: tuple[VariantResult, ...]
    suites: tuple[Suite, ...]
    advice: tuple[QuantRecommendation, ...]
    hardware: str
    notes: tuple[str, ...] = field(default=())


def score(
    suites: Sequence[Suite],
    answers: dict[tuple[str, str], str],
    errors: dict[tuple[str, str], str] | None = None,
) -> tuple[dict[str, float], tuple[PromptAnswer, ...]]:
    """Pass rate per suite and every checked answer, from ``answers[(suite, prompt id)]`` (text the
    model generated; the prompt's ``answer_prefix`` is put back in front before checking). A prompt
    in ``errors`` produced no answer: it fails, with the reason."""
    rates: dict[str, float] = {}
    checked: list[PromptAnswer] = []
    for suite in suites:
        results = []
        for p in suite.prompts:
            text = answers.get((suite.name, p.id))
            if text is None:
                continue
            error = (errors or {}).get((suite.name, p.id))
            if error:
                result = CheckResult(False, f"No answer: {error}.")
            else:
                result = check_answer(p.check, p.answer_prefix + text)
            results.append(result)
            checked.append(PromptAnswer(suite.name, p.id, text, result))
        rates[suite.name] = pass_rate(results)
    return rates, tuple(checked)


def median_or_none(values: Sequence[float | None]) -> float | None:
    real = [v for v in values if v is not None]
    return statistics.median(real) if real else None


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def suite_results(v: VariantResult, suite: str) -> dict[str, bool]:
    """Prompt id -> passed, for one variant's answers to one suite."""
    return {a.prompt_id: a.result.passed for a in v.answers if a.suite == suite}


def rate_with_interval(v: VariantResult, suite: str) -> str:
    """'80% (95% interval 49-94%, 10 prompts)'."""
    results = suite_results(v, suite)
    passed, n = sum(results.values()), len(results)
    rate = v.pass_rates.get(suite, 0.0)
    if n == 0:
        return f"{rate:.0%}"
    low, high = wilson_interval(passed, n)
    return f"{rate:.0%} (95% interval {low:.0%}-{high:.0%}, {n} prompt{'s' if n != 1 else ''})"


def recommend_quant(
    variants: Sequence[VariantResult], suites: Sequence[Suite], hardware: str
) -> tuple[QuantRecommendation, ...]:
    """For each suite (a task profile) the cheapest variant, by estimated memory, that meets the
    suite's quality floor and fits ``hardware``; ties go to the faster one. Every reason carries the
    pass rate's interval, and each other variant is set against the chosen one (or the best one)
    with a paired test on the same prompts, so that a difference of one prompt in ten is reported
    as not distinguishable rather than as a winner."""
    out = []
    for suite in suites:
        floor = suite.quality_floor if suite.quality_floor is not None else DEFAULT_FLOOR
        qualified = [v for v in variants if v.fits and v.pass_rates.get(suite.name, 0.0) >= floor]
        qualified.sort(key=lambda v: (v.estimated_total_bytes, -(v.decode_tokens_per_s or 0.0)))
        chosen = qualified[0] if qualified else None
        anchor = chosen or max(variants, key=lambda v: v.pass_rates.get(suite.name, 0.0), default=None)
        reasons = []
        for v in variants:
            rate = v.pass_rates.get(suite.name, 0.0)
            shown = rate_with_interval(v, suite.name)
            if chosen is not None and v is chosen:
                reasons.append(
                    f"{v.label}: chosen — passes {shown} (floor {floor:.0%}), needs {gib(v.estimated_total_bytes)}"
                    + (f", {v.decode_tokens_per_s:.0f} tokens/s" if v.decode_tokens_per_s else "")
                    + "."
                )
            elif not v.fits:
                reasons.append(f"{v.label}: does not fit {hardware} ({gib(v.estimated_total_bytes)} needed).")
            elif rate < floor:
                reasons.append(f"{v.label}: passes {shown}, below the {floor:.0%} floor.")
            elif chosen is not None:
                extra = v.estimated_total_bytes - chosen.estimated_total_bytes
                reasons.append(
                    f"{v.label}: also meets the floor ({shown}) but needs {gib(extra)} more memory than "
                    f"{chosen.label}."
                    if extra > 0
                    else f"{v.label}: meets the floor ({shown}) at the same memory but decodes slower."
                )
            if anchor is not None and v is not anchor and v.fits:
                verdict = paired(suite_results(anchor, suite.name), suite_results(v, suite.name))
                if verdict.n:
                    reasons.append(verdict.sentence(anchor.label, v.label))
        if chosen is None:
            reasons.insert(0, f"No variant meets the {floor:.0%} floor and fits {hardware}.")
        out.append(QuantRecommendation(suite.name, floor, chosen.label if chosen else None, tuple(reasons)))
    return tuple(out)


def routing_config(comparison: Comparison) -> dict[str, Any]:
    """What a gateway needs: every variant (name, quant, memory in GB, average tokens/s, pass rates)
    and, per task profile, the variant to route to."""
    return {
        "generated_by": "FitScope",
        "hardware": comparison.hardware,
        "variants": [
            {
                "name": v.label,
                "quant": v.quant,
                "path": v.gguf_path,
                "memory_gb": round(v.estimated_total_bytes / 1e9, 2),
                "avg_tokens_per_s": round(v.decode_tokens_per_s, 1) if v.decode_tokens_per_s else None,
                "pass_rates": {k: round(r, 3) for k, r in v.pass_rates.items()},
                "fits": v.fits,
                "distribution": _distribution_evidence(v.divergence),
            }
            for v in comparison.variants
        ],
        "routes": [
            {
                "profile": a.profile,
                "quality_floor": a.floor,
                "variant": a.chosen,
                "why": list(a.reasons),
                "evidence": _evidence(comparison, a),
            }
            for a in comparison.advice
        ],
    }


def _evidence(comparison: Comparison, advice: QuantRecommendation) -> dict[str, Any]:
    """The chosen variant's pass count, prompts and 95% interval for one route."""
    chosen = next((v for v in comparison.variants if v.label == advice.chosen), None)
    if chosen is None:
        return {}
    results = suite_results(chosen, advice.profile)
    low, high = wilson_interval(sum(results.values()), len(results))
    out: dict[str, Any] = {
        "prompts": len(results),
        "passed": sum(results.values()),
        "interval_95": [round(low, 3), round(high, 3)],
    }
    distribution = _distribution_evidence(chosen.divergence)
    if distribution:
        out["distribution"] = distribution
    return out


def _figure(f: Figure | None, digits: int = 4) -> dict[str, Any] | None:
    if f is None:
        return None
    # No upper bound (a text too short for it) is left out rather than written as null.
    return {
        "value": round(f.value, digits),
        "low_95": round(f.low, digits),
        "high_95": None if f.high is None else round(f.high, digits),
    }


def _distribution_evidence(d: DivergenceFigures | None) -> dict[str, Any] | None:
    """KL / perplexity figures with their 95% intervals and N (scored tokens), for a gateway's config."""
    if d is None:
        return None
    return {
        "text": d.text_name,
        "tokens_scored": d.positions,
        "reference": d.is_reference,
        "perplexity": _figure(d.perplexity),
        "reference_perplexity": _figure(d.reference_perplexity),
        "delta_perplexity": _figure(d.delta_perplexity),
        "kl_divergence_mean": _figure(d.kl_mean, 5),
        "kl_divergence_p99": _figure(d.kl_p99, 5),
        "same_top_token": _figure(d.same_top),
    }


def to_toml(data: dict[str, Any]) -> str:
    """A small TOML writer for the routing config: scalars first, then tables and arrays of
    tables; None values are left out (TOML has no null)."""
    lines: list[str] = []
    _toml_table(lines, [], data)
    return "\n".join(lines).strip() + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value if v is not None) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None) + " }"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else _toml_value(key)


def _toml_table(lines: list[str], path: list[str], table: dict[str, Any]) -> None:
    nested = {}
    for key, value in table.items():
        if value is None:
            continue
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            nested[key] = value
        else:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for key, items in nested.items():
        for item in items:
            lines.append("")
            lines.append(f"[[{'.'.join([*path, _toml_key(key)])}]]")
            _toml_table(lines, [*path, key], item)
