"""How far a quantized variant's next-token distributions are from the reference's, on a text:
the figures ``llama-perplexity --kl-divergence`` prints, each with a 95% interval.

The text is evaluated as llama-perplexity does: split into chunks of ``chunk_tokens``, each
started afresh (BOS first), and only the second half of each chunk is scored, so that every
scored position has at least half a chunk of context. At each scored position there is

- the KL divergence KL(P_ref || Q) of the variant's distribution Q from the reference's P, in nats;
- the negative log-likelihood of the text's next token under each model (their mean is the log
  of the perplexity);
- whether both models put the same token first.

From those per-position values:

- mean KL: mean ± 1.96·sd/√n (llama-perplexity prints ± 1 sd/√n);
- 99th-percentile KL: interpolated as llama-perplexity does; its interval is the nonparametric
  order-statistic one (the ranks whose binomial(n, 0.99) probability brackets 95%), with no upper
  bound when the text is too short to give one;
- perplexity of each model, and Δ perplexity = PPL(Q) − PPL(ref): the delta method on the paired
  log-likelihoods, with their covariance (what llama-perplexity's ``Mean PPL(Q)-PPL(base)`` does);
- same top token: the share of positions, with a Wilson interval.

Positions of one text are not independent: neighbouring words share context, so a hard passage
makes many positions diverge together, and intervals that treat every position as a separate
measurement are too narrow. Chunks are independent (each starts afresh from an empty cache), so
the mean KL, Δ perplexity and the same-top rate also get a chunk-level interval (batch means: the
spread of the chunks' own means, with Student's t for their number), and each figure keeps the
wider of the two. With many chunks both agree where positions are nearly independent; with few,
the t quantile keeps a handful of chunks from claiming more than they show. The 99th percentile's
interval stays the order-statistic one.

Pure arithmetic on sequences of floats; the values come from ``app.adapters.divergence_runner``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import Field

from app.core.common.units import Frozen
from app.core.quality.evidence import Z_95, wilson_interval

P99 = 0.99


class Figure(Frozen):
    """A measured value with its 95% interval; ``high`` is None where the data give no upper bound."""

    value: float
    low: float
    high: float | None

    def text(self, fmt: str = ".3f", unit: str = "") -> str:
        high = "?" if self.high is None else format(self.high, fmt)
        return f"{format(self.value, fmt)}{unit} (95% interval {format(self.low, fmt)}–{high}{unit})"


class DivergenceFigures(Frozen):
    """One variant against the reference on one text. KL in nats; perplexities as llama.cpp prints
    them; ``same_top`` as a share (0..1). The reference's own row has only the perplexities."""

    text_name: str
    positions: int = Field(ge=0, description="scored positions (n)")
    chunks: int = Field(ge=0)
    chunk_tokens: int = Field(ge=2)
    top_k: int = Field(ge=1, description="reference tokens kept per position for the KL")
    is_reference: bool = False
    reference_label: str = ""
    perplexity: Figure
    reference_perplexity: Figure
    delta_perplexity: Figure | None = None
    kl_mean: Figure | None = None
    kl_p99: Figure | None = None
    same_top: Figure | None = None


# Student's t, two-sided 95%, for 1..30 degrees of freedom.
_T_95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t_95(df: int) -> float:
    """Student's t quantile for a two-sided 95% interval with ``df`` degrees of freedom (≥ 1);
    beyond 30, 1.96 + 2.4/df (within 0.002 of the exact value)."""
    if df < 1:
        raise ValueError("at least one degree of freedom")
    return _T_95[df - 1] if df <= len(_T_95) else Z_95 + 2.4 / df


def chunk_means(values: Sequence[float], chunks: int) -> list[float] | None:
    """The mean of each chunk's values (the values in chunk order, the same number per chunk), or
    None when there are fewer than two chunks or the values do not split evenly."""
    n = len(values)
    if chunks < 2 or n < chunks or n % chunks:
        return None
    size = n // chunks
    return [math.fsum(values[i * size : (i + 1) * size]) / size for i in range(chunks)]


def _variance(values: Sequence[float]) -> float:
    mean = math.fsum(values) / len(values)
    return math.fsum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1)


def mean_interval(values: Sequence[float], z: float = Z_95, chunks: int = 1) -> Figure:
    """Mean ± z·sd/√n (sd with n − 1); with ``chunks`` (the values in chunk order), at least the
    batch-means interval t(k − 1)·sd(chunk means)/√k. Raises ValueError for an empty sequence."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    mean = math.fsum(values) / n
    if n < 2:
        return Figure(value=mean, low=mean, high=mean)
    half = z * math.sqrt(_variance(values) / n)
    means = chunk_means(values, chunks)
    if means is not None:
        half = max(half, t_95(len(means) - 1) * math.sqrt(_variance(means) / len(means)))
    return Figure(value=mean, low=mean - half, high=mean + half)


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """llama-perplexity's percentile: linear interpolation between the neighbouring order statistics."""
    if not sorted_values:
        raise ValueError("no values")
    p = fraction * (len(sorted_values) - 1)
    i = int(p)
    rest = p - i
    j = min(i + 1, len(sorted_values) - 1)
    return (1 - rest) * sorted_values[i] + rest * sorted_values[j]


def _binomial_cdf_table(n: int, p: float) -> list[float]:
    """[P(B ≤ k) for k = 0..n], B ~ binomial(n, p), 0 < p < 1."""
    log_p, log_q, log_n = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    total = 0.0
    out = []
    for k in range(n + 1):
        total += math.exp(log_n - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_p + (n - k) * log_q)
        out.append(min(total, 1.0))
    return out


def quantile_interval(sorted_values: Sequence[float], fraction: float, confidence: float = 0.95) -> Figure:
    """The ``fraction`` quantile with its distribution-free interval [x(l), x(u)] (1-based order
    statistics): l is the largest rank with P(B < l) ≤ α/2 and u the smallest with P(B ≥ u) ≤ α/2,
    B ~ binomial(n, fraction). ``high`` is None when even the maximum is not a bound (n too small).
    Raises ValueError for an empty sequence."""
    n = len(sorted_values)
    value = percentile(sorted_values, fraction)
    alpha = (1 - confidence) / 2
    cdf = _binomial_cdf_table(n, fraction)
    lower_rank = 0
    for rank in range(1, n + 1):
        if cdf[rank - 1] > alpha:
            break
        lower_rank = rank
    upper_rank = next((rank for rank in range(1, n + 1) if 1 - cdf[rank - 1] <= alpha), None)
    low = sorted_values[lower_rank - 1] if lower_rank else sorted_values[0]
    high = sorted_values[upper_rank - 1] if upper_rank is not None else None
    return Figure(value=value, low=min(low, value), high=None if high is None else max(high, value))


def _perplexity(nll: Sequence[float]) -> tuple[float, float]:
    """(PPL, standard error of ln PPL)."""
    n = len(nll)
    mean = math.fsum(nll) / n
    var = math.fsum((v - mean) ** 2 for v in nll) / max(n - 1, 1)
    return math.exp(mean), math.sqrt(var / n)


def _ppl_figure(nll: Sequence[float]) -> Figure:
    ppl, se = _perplexity(nll)
    return Figure(value=ppl, low=math.exp(math.log(ppl) - Z_95 * se), high=math.exp(math.log(ppl) + Z_95 * se))


def _delta_ppl_half_width(nll: Sequence[float], nll_ref: Sequence[float], ppl_q: float, ppl_r: float) -> float:
    """The delta method's standard error of PPL(Q) − PPL(ref) from paired mean log-likelihoods."""
    n = len(nll)
    mean_q, mean_r = math.fsum(nll) / n, math.fsum(nll_ref) / n
    denom = max(n - 1, 1)
    var_q = math.fsum((a - mean_q) ** 2 for a in nll) / denom / n
    var_r = math.fsum((b - mean_r) ** 2 for b in nll_ref) / denom / n
    cov = math.fsum((a - mean_q) * (b - mean_r) for a, b in zip(nll, nll_ref, strict=True)) / denom / n
    var = ppl_q * ppl_q * var_q + ppl_r * ppl_r * var_r - 2 * ppl_q * ppl_r * cov
    return math.sqrt(max(var, 0.0))


def delta_perplexity(nll: Sequence[float], nll_ref: Sequence[float], chunks: int = 1) -> Figure:
    """PPL(Q) − PPL(ref) with the delta-method interval on the paired log-likelihoods; with
    ``chunks``, at least the same on the chunks' mean log-likelihoods with Student's t.
    Raises ValueError when the sequences differ in length or are empty."""
    n = len(nll)
    if n == 0 or n != len(nll_ref):
        raise ValueError("the variant and the reference must be scored on the same positions")
    ppl_q, _ = _perplexity(nll)
    ppl_r, _ = _perplexity(nll_ref)
    half = Z_95 * _delta_ppl_half_width(nll, nll_ref, ppl_q, ppl_r)
    means_q, means_r = chunk_means(nll, chunks), chunk_means(nll_ref, chunks)
    if means_q is not None and means_r is not None:
        k = len(means_q)
        half = max(half, t_95(k - 1) * _delta_ppl_half_width(means_q, means_r, ppl_q, ppl_r))
    delta = ppl_q - ppl_r
    return Figure(value=delta, low=delta - half, high=delta + half)


def share_interval(flags: Sequence[bool], chunks: int = 1) -> Figure:
    """The share of True with its Wilson interval; with ``chunks``, widened to at least the
    batch-means interval of the chunks' own shares."""
    n = len(flags)
    share = sum(1 for f in flags if f) / n if n else 0.0
    low, high = wilson_interval(sum(1 for f in flags if f), n)
    means = chunk_means([1.0 if f else 0.0 for f in flags], chunks)
    if means is not None:
        half = t_95(len(means) - 1) * math.sqrt(_variance(means) / len(means))
        low, high = max(0.0, min(low, share - half)), min(1.0, max(high, share + half))
    return Figure(value=share, low=low, high=high)


def divergence_figures(
    kl: Sequence[float],
    nll: Sequence[float],
    nll_ref: Sequence[float],
    same_top: Sequence[bool],
    *,
    text_name: str,
    chunks: int,
    chunk_tokens: int,
    top_k: int,
    reference_label: str = "",
) -> DivergenceFigures:
    """Every figure for one variant from its per-position values (all on the same positions).
    Raises ValueError when the sequences are empty or differ in length."""
    n = len(kl)
    if n == 0 or not n == len(nll) == len(nll_ref) == len(same_top):
        raise ValueError("the per-position values must be non-empty and of one length")
    return DivergenceFigures(
        text_name=text_name,
        positions=n,
        chunks=chunks,
        chunk_tokens=chunk_tokens,
        top_k=top_k,
        reference_label=reference_label,
        perplexity=_ppl_figure(nll),
        reference_perplexity=_ppl_figure(nll_ref),
        delta_perplexity=delta_perplexity(nll, nll_ref, chunks),
        kl_mean=mean_interval(kl, chunks=chunks),
        kl_p99=quantile_interval(sorted(kl), P99),
        same_top=share_interval(same_top, chunks),
    )


def reference_figures(
    nll_ref: Sequence[float], *, text_name: str, chunks: int, chunk_tokens: int, top_k: int
) -> DivergenceFigures:
    """The reference's own row: its perplexity on the text. Raises ValueError when empty."""
    if not nll_ref:
        raise ValueError("no scored positions")
    ppl = _ppl_figure(nll_ref)
    return DivergenceFigures(
        text_name=text_name,
        positions=len(nll_ref),
        chunks=chunks,
        chunk_tokens=chunk_tokens,
        top_k=top_k,
        is_reference=True,
        perplexity=ppl,
        reference_perplexity=ppl,
    )


def paired_kl_difference(kl_a: Sequence[float], kl_b: Sequence[float], chunks: int = 1) -> Figure:
    """Mean of KL(a) − KL(b) over the same positions, with its 95% interval: when the interval
    excludes 0, the two variants differ beyond chance on this text. Raises ValueError on a length mismatch."""
    if len(kl_a) != len(kl_b):
        raise ValueError("the two variants must be scored on the same positions")
    return mean_interval([a - b for a, b in zip(kl_a, kl_b, strict=True)], chunks=chunks)


class MeasuredQuality(Frozen):
    """A measured Δ perplexity of one preset of one model against a reference file, for the
    quantization ladder ("measured on this model" beside the published figure)."""

    model_key: str
    preset: str
    delta_perplexity: float
    low: float
    high: float
    reference_preset: str
    tokens: int = Field(ge=1)
    text_name: str


def quality_key(arch: str, n_layer: int, n_embd: int, n_vocab: int) -> str:
    """What makes files variants of one model (the test ``fitscope compare`` applies)."""
    return f"{arch}/{n_layer}/{n_embd}/{n_vocab}"


def closeness_words(kl_mean: float) -> str:
    """Mean KL divergence in words. Rough landmarks from llama.cpp users' published tables on
    7-8B models: Q8_0 ≈ 0.001, Q6_K ≈ 0.005, Q4_K_M ≈ 0.03, Q3_K_S ≈ 0.1-0.2, Q2_K ≈ 0.3 and more."""
    if kl_mean < 0.005:
        return "indistinguishable from the reference in practice"
    if kl_mean < 0.03:
        return "very close to the reference"
    if kl_mean < 0.1:
        return "close to the reference, with small differences"
    if kl_mean < 0.3:
        return "noticeably different from the reference"
    return "far from the reference"


def meaning(fig: DivergenceFigures) -> str:
    """One plain sentence on what the figures mean for a user."""
    if fig.is_reference or fig.kl_mean is None or fig.same_top is None or fig.delta_perplexity is None:
        return (
            f"Reference: perplexity {fig.perplexity.value:.2f} on {fig.text_name} "
            f"({fig.positions:,} scored tokens)."
        )
    ref = fig.reference_label or "the reference"
    d = fig.delta_perplexity
    change = d.value / fig.reference_perplexity.value if fig.reference_perplexity.value else 0.0
    certain = (
        ""
        if d.low > 0 or (d.high is not None and d.high < 0)
        else " (not distinguishable from no change on this text)"
    )
    return (
        f"Picks the same next token as {ref} {fig.same_top.value:.0%} of the time "
        f"({fig.same_top.low:.0%}–{fig.same_top.high or 1:.0%}); perplexity {change:+.1%}{certain}; "
        f"mean KL {fig.kl_mean.value:.3f} nats: {closeness_words(fig.kl_mean.value)} "
        f"(measured on {fig.positions:,} tokens of {fig.text_name})."
    )
