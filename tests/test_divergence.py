"""KL divergence, perplexity and same-top-token rates against a reference: the statistics, and real
measurements by llama.cpp on tiny models (a model against itself, Q8_0 against Q2_K), the cache,
cancelling, the headless command and the A/B tab."""

from __future__ import annotations

import json
import math
import random
import threading

import pytest

from app.adapters.divergence_runner import (
    DivergenceSettings,
    builtin_text,
    measure_divergence,
    measured_quality,
)
from app.adapters.quantizer import default_variant_path, quantize
from app.core.common.errors import FitScopeError
from app.core.quality.divergence import (
    delta_perplexity,
    divergence_figures,
    mean_interval,
    paired_kl_difference,
    quantile_interval,
)
from tests.support.tiny_gguf import write_tiny_llama

# -- statistics ------------------------------------------------------------------------------------


def test_identical_values_give_zero_divergence_and_full_agreement():
    rng = random.Random(3)
    nll = [rng.uniform(0.5, 6.0) for _ in range(400)]
    fig = divergence_figures(
        [0.0] * 400, nll, nll, [True] * 400, text_name="t", chunks=2, chunk_tokens=402, top_k=8
    )
    assert fig.kl_mean is not None and fig.kl_mean.value == 0.0
    assert fig.same_top is not None and fig.same_top.value == 1.0 and fig.same_top.low > 0.99
    assert fig.delta_perplexity is not None and abs(fig.delta_perplexity.value) < 1e-12
    assert fig.perplexity.value == pytest.approx(math.exp(sum(nll) / 400))


def test_intervals_shrink_with_more_tokens():
    rng = random.Random(7)
    values = [rng.expovariate(10.0) for _ in range(4000)]
    small, large = mean_interval(values[:250]), mean_interval(values)
    assert small.high is not None and large.high is not None
    assert (large.high - large.low) < 0.5 * (small.high - small.low)  # about 1/4 as wide: 1/sqrt(16)
    assert large.low < 0.1 < large.high
    # The 99th percentile: 250 values cannot bound it from above; 4,000 can, around the true 0.46.
    assert quantile_interval(sorted(values[:250]), 0.99).high is None
    p99 = quantile_interval(sorted(values), 0.99)
    assert p99.high is not None and p99.low < math.log(100) / 10 < p99.high


def test_delta_perplexity_uses_the_pairing():
    # The variant is worse by the same 0.05 nats at every position: the interval excludes zero and
    # is far narrower than if the two perplexities were treated as independent measurements.
    rng = random.Random(1)
    ref = [rng.uniform(0.1, 8.0) for _ in range(300)]
    var = [x + 0.05 for x in ref]
    d = delta_perplexity(var, ref)
    assert d.value == pytest.approx(math.exp(sum(ref) / 300) * (math.exp(0.05) - 1))
    ppl_q, ppl_r = mean_interval(var), mean_interval(ref)
    assert ppl_q.high is not None and ppl_r.high is not None
    unpaired = 2 * 1.96 * math.sqrt(
        (math.exp(ppl_q.value) * (ppl_q.high - ppl_q.low) / 3.92) ** 2
        + (math.exp(ppl_r.value) * (ppl_r.high - ppl_r.low) / 3.92) ** 2
    )
    assert d.low > 0 and d.high is not None and d.high - d.low < 0.1 * unpaired
    diff = paired_kl_difference([0.2] * 50 + [0.3] * 50, [0.1] * 100)
    assert diff.low > 0


# -- real llama.cpp passes ---------------------------------------------------------------------------

pytestmark_llama = pytest.mark.llamacpp


@pytest.fixture(scope="module")
def tiny_variants(tmp_path_factory):
    root = tmp_path_factory.mktemp("kl")
    source = write_tiny_llama(root / "tiny-F32.gguf", n_layer=2, n_embd=256, n_ff=512)
    q8 = quantize(source, default_variant_path(source, "Q8_0"), "Q8_0")
    q2 = quantize(source, default_variant_path(source, "Q2_K"), "Q2_K")
    return str(source), str(q8), str(q2)


def settings(tokens: int = 512, chunk: int = 128) -> DivergenceSettings:
    text, name = builtin_text()
    return DivergenceSettings(text=text, text_name=name, max_tokens=tokens, chunk_tokens=chunk, top_k=256)


@pytestmark_llama
def test_a_model_against_itself_and_two_quantizations(tiny_variants):
    source, q8, q2 = tiny_variants
    result = measure_divergence(source, [source, q8, q2], settings())
    own = result.figures[q8]
    assert own.positions == 4 * 63 and own.chunks == 4  # 512 tokens in chunks of 128, second halves
    # Against itself the reference's figures must be exactly "no difference".
    self_values = result.values[source]
    assert max(self_values.kl) < 1e-6 and all(self_values.same_top)
    assert self_values.nll == pytest.approx(self_values.nll_ref, abs=1e-5)
    # Q2_K is further from F32 than Q8_0, by KL and by same-top.
    kl8, kl2 = result.figures[q8].kl_mean, result.figures[q2].kl_mean
    assert kl8 is not None and kl2 is not None and kl2.value > 3 * kl8.value > 0
    assert result.figures[q8].same_top.value >= result.figures[q2].same_top.value  # type: ignore[union-attr]
    assert "closer to the reference than" in result.pair_sentence(q8, q2, "Q8_0", "Q2_K")


@pytestmark_llama
def test_the_cache_skips_the_model_pass_and_more_tokens_narrow_the_interval(tiny_variants):
    source, _, q2 = tiny_variants
    first = measure_divergence(source, [q2], settings(tokens=256))
    started = []
    again = measure_divergence(source, [q2], settings(tokens=256), on_start=started.append)
    assert started == [] and all(again.cached.values()) and again.seconds < 1.0
    assert again.figures[q2] == first.figures[q2]
    more = measure_divergence(source, [q2], settings(tokens=2048))
    few_kl, many_kl = first.figures[q2].kl_mean, more.figures[q2].kl_mean
    assert few_kl is not None and many_kl is not None and few_kl.high and many_kl.high
    assert more.figures[q2].positions == 8 * first.figures[q2].positions
    assert (many_kl.high - many_kl.low) < 0.6 * (few_kl.high - few_kl.low)


@pytestmark_llama
def test_cancel_stops_the_child(tiny_variants):
    source, q8, _ = tiny_variants
    stop = threading.Event()
    lives = []

    def on_progress(_fraction: float, message: str) -> None:
        if "chunk" in message:
            stop.set()
            for live in lives:
                live.stop()

    with pytest.raises(FitScopeError, match="stopped"):
        measure_divergence(
            source, [q8], settings(tokens=4096, chunk=64), on_progress=on_progress, stop=stop, on_start=lives.append
        )
    assert lives and not any(live.running for live in lives)
    # Nothing half-done was cached: the next run measures again.
    started = []
    measure_divergence(source, [q8], settings(tokens=256, chunk=64), on_start=started.append)
    assert started


@pytestmark_llama
def test_compare_json_carries_every_figure(tiny_variants, tmp_path, capsys):
    from app.cli import main

    source, _, q2 = tiny_variants
    suite_file = tmp_path / "smoke.yaml"
    suite_file.write_text(
        "name: smoke\ntask: chat\nquality_floor: 0.5\nprompts:\n"
        "  - id: a\n    prompt: The old man\n    max_tokens: 4\n    check: {regex: '.'}\n"
    )
    code = main(
        ["compare", "--gguf", source, "--gguf", q2, "--suite", str(suite_file), "--kl-tokens", "512"]
        + ["--kl-chunk", "128", "--json"]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    ref, var = report["details"]
    assert ref["divergence"]["is_reference"] and ref["divergence"]["kl_mean"] is None
    d = var["divergence"]
    for name in ("kl_mean", "kl_p99", "delta_perplexity", "same_top", "perplexity", "reference_perplexity"):
        assert d[name]["low"] <= d[name]["value"], name
    assert d["positions"] == 252 and d["kl_mean"]["value"] > 0
    # The routing config keeps its keys and adds the distribution evidence beside each choice.
    variant = next(v for v in report["variants"] if v["name"] == "tiny-Q2_K")
    assert variant["distribution"]["tokens_scored"] == 252
    route = report["routes"][0]
    assert {"prompts", "passed", "interval_95"} <= route["evidence"].keys()
    assert route["evidence"]["distribution"]["kl_divergence_mean"]["value"] == pytest.approx(
        d["kl_mean"]["value"], abs=1e-4
    )
    # The measured Δ perplexity is kept for the quantization ladder.
    assert any(m.preset == "Q2_K" and m.reference_preset == "F32" for m in measured_quality())


@pytestmark_llama
def test_the_ab_tab_shows_the_figures_in_plain_words(qtbot, tiny_variants):
    from PySide6.QtCore import Qt

    from app.adapters.host import detect_host
    from app.core.memory.targets import cpu_target
    from app.core.quality.suite_reading import parse_suite
    from app.ui.ab_panel import AbPanel

    source, q8, _ = tiny_variants
    targets = [cpu_target(detect_host(measure_bandwidth=False))]
    panel = AbPanel(lambda: (targets, "this CPU", "x86-avx2"))
    qtbot.addWidget(panel)
    panel.add_variant(source)
    panel.add_variant(q8)
    panel.suites.add_suite(
        parse_suite(
            "name: quick\ntask: chat\nprompts:\n  - id: a\n    prompt: The old man\n    max_tokens: 2\n"
            "    check: {regex: '.'}\n"
        )
    )
    for i in range(panel.suites.suite_list.count()):  # only the one short suite keeps the test quick
        item = panel.suites.suite_list.item(i)
        quick = item.text().startswith("quick")
        item.setCheckState(Qt.CheckState.Checked if quick else Qt.CheckState.Unchecked)
    panel.kl_tokens.setValue(512)
    with qtbot.waitSignal(panel.comparison_finished, timeout=120000) as blocker:
        panel.compare_button.click()
    comparison = blocker.args[0]
    d = comparison.variants[1].divergence
    assert d is not None and d.kl_mean is not None and d.same_top is not None
    headers = [panel.table.horizontalHeaderItem(c).text() for c in range(panel.table.columnCount())]
    kl_col, same_col = headers.index("KL mean (95%)"), headers.index("Same top token (95%)")
    assert panel.table.item(1, kl_col).text().startswith(f"{d.kl_mean.value:.4f} (")
    assert panel.table.item(1, same_col).text().startswith(f"{d.same_top.value:.1%}")
    assert panel.table.item(0, kl_col).text() == "—"
    text = panel.advice.text()
    assert "Measured on this model" in text
    assert f"Picks the same next token as tiny-F32 {d.same_top.value:.0%} of the time" in text


# -- intervals that respect the correlation of neighbouring positions ---------------------------


def test_students_t_for_a_few_chunks_and_its_approximation_beyond_the_table():
    from app.core.quality.divergence import t_95

    assert t_95(1) == 12.706 and t_95(7) == 2.365 and t_95(30) == 2.042
    assert abs(t_95(60) - 2.000) < 0.002 and abs(t_95(120) - 1.980) < 0.002


def _correlated_text(rng, chunks: int, per_chunk: int, rho: float) -> list[float]:
    """Per-position values whose neighbours move together (AR(1) within each chunk; chunks
    independent, as chunks started afresh are), true mean 0."""
    values = []
    for _ in range(chunks):
        x = rng.gauss(0, 1)
        for _ in range(per_chunk):
            x = rho * x + math.sqrt(1 - rho * rho) * rng.gauss(0, 1)
            values.append(x)
    return values


def test_chunk_level_intervals_keep_their_95_percent_when_neighbouring_positions_move_together():
    rng = random.Random(7)
    covered_positions = covered_chunks = 0
    trials = 300
    for _ in range(trials):
        values = _correlated_text(rng, chunks=16, per_chunk=64, rho=0.9)
        naive, chunked = mean_interval(values), mean_interval(values, chunks=16)
        covered_positions += naive.low <= 0 <= naive.high
        covered_chunks += chunked.low <= 0 <= chunked.high
    # Treating 1,024 correlated positions as independent claims far more than the text shows.
    assert covered_positions / trials < 0.6
    assert 0.9 <= covered_chunks / trials <= 0.99


def test_independent_positions_keep_about_the_same_interval():
    rng = random.Random(3)
    values = [rng.gauss(0, 1) for _ in range(40 * 50)]
    naive, chunked = mean_interval(values), mean_interval(values, chunks=40)
    assert naive.high - naive.low <= chunked.high - chunked.low <= 1.4 * (naive.high - naive.low)


def test_delta_perplexity_and_same_top_widen_for_a_text_of_few_correlated_chunks():
    from app.core.quality.divergence import share_interval

    rng = random.Random(11)
    offsets = _correlated_text(rng, chunks=6, per_chunk=100, rho=0.95)
    ref = [2.0 + 0.3 * abs(o) for o in offsets]
    var = [r + 0.05 + 0.05 * o for r, o in zip(ref, offsets, strict=True)]
    naive, chunked = delta_perplexity(var, ref), delta_perplexity(var, ref, chunks=6)
    assert chunked.value == naive.value
    assert chunked.high - chunked.low > 1.5 * (naive.high - naive.low)
    same = [o > 0.5 for o in offsets]
    naive_share, chunked_share = share_interval(same), share_interval(same, chunks=6)
    assert chunked_share.value == naive_share.value
    assert chunked_share.low <= naive_share.low and chunked_share.high >= naive_share.high
    assert chunked_share.high - chunked_share.low > 1.5 * (naive_share.high - naive_share.low)
