"""The speed model against published llama-bench results, on devices left out of the fit."""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import replace

import numpy as np
import pytest

from app.core.memory.layers import tensor_totals
from app.core.model.source import model_from_catalog
from app.core.speed.model import FAMILIES, load_speed_model, speed_family
from tests.speed_data import (
    DECODE_RELEASE,
    DECODE_RELEASE_DATE,
    ON_TOP_FAMILIES,
    constants_for,
    cross_validate,
    fit_model,
    fresh_held,
    load_rows,
    source_key,
)


@pytest.fixture(scope="module")
def rows():
    return load_rows()


@pytest.fixture(scope="module")
def fresh(rows):
    """The test set's rows predicted from the fit on ``rows`` (``fresh_held``: one fit, shared)."""
    return fresh_held(rows)


def test_families_from_names_as_printed_and_in_the_catalog():
    assert speed_family("NVIDIA GeForce RTX 4090") == "nvidia-geforce"
    assert speed_family("RTX 3090") == "nvidia-geforce"
    assert speed_family("NVIDIA RTX 6000 Ada Generation") == "nvidia-gddr"
    assert speed_family("NVIDIA L40S") == "nvidia-gddr"
    assert speed_family("NVIDIA A100-SXM4-80GB") == "nvidia-hbm"
    assert speed_family("NVIDIA H100 PCIe") == "nvidia-hbm"
    assert speed_family("AMD Radeon RX 7900 XTX (RADV NAVI31)") == "amd-rdna"
    assert speed_family("AMD Instinct MI300X") == "amd-cdna"
    assert speed_family("Apple M1 Max (32-core GPU) 64GB") == "apple-m1"
    assert speed_family("M4 Pro 20-core GPU") == "apple-m2plus"
    assert speed_family("DGX Spark (GB10)") == "unified-nvidia"
    assert speed_family("Ryzen AI Max+ 395") == "unified-amd"
    assert speed_family("Intel Arc B580") == "intel-sycl"
    assert speed_family("Intel(R) Arc(TM) B580 Graphics", "gpu", "vulkan") == "intel-vulkan"
    assert speed_family("Intel Xeon 6980P", "cpu") == "cpu-x86"
    assert speed_family("AMD EPYC 9654", "cpu") == "cpu-x86"
    assert speed_family("Radxa Dragon Q8B", "cpu") == "cpu-arm"
    assert set(load_speed_model().families) <= set(FAMILIES)


def test_every_row_is_understood_and_sourced(rows):
    assert len(rows) >= 400 and len({r.device for r in rows}) >= 50

    # A URL, or repository:path@commit for files read from a public repository, or, for public files whose
    # repository the code index does not name, a name for their author's files and the index's document number.
    def cited(source: str) -> bool:
        indexed = re.match(r"[\w.-]+:.*document \d{6,}", source) is not None
        return source.startswith("http") or ("/" in source and "@" in source) or indexed

    assert all(cited(r.source) for r in rows)
    assert {r.group for r in rows} == {"gpu", "apple", "cpu", "unified", "hybrid"}


def test_rows_are_read_as_llama_bench_prints_them(rows):
    """llama-bench prints its default -ngl (every layer on the GPU) as -1: a row with experts in RAM
    keeps its layers on the GPU and only its ``-ncmoe`` experts on the host. A laptop GPU is not the
    desktop card of its name (the laptop RTX 4070 has half the memory bus). A catalog model's shape is
    the catalog's: Qwen3.5 27B has 48 recurrent (Gated DeltaNet) layers of 64."""
    fresh = load_rows(fresh=True)
    hybrid = [r for r in rows + fresh if r.group == "hybrid"]
    assert all(r.n_layer > 0 and r.host_layers > 0 for r in hybrid)
    gpt_oss_20b = [r for r in hybrid if "B580" in r.device and abs(r.params - 20.91e9) < 0.1e9]
    # -ncmoe 2 to 24 over gpt-oss-20b's 24 layers, every layer's attention on the GPU.
    assert all(r.n_layer == 24 for r in gpt_oss_20b) and {2, 12, 24} <= {r.host_layers for r in gpt_oss_20b}
    laptop = [r for r in fresh if "4070 Laptop" in r.device]
    assert len(laptop) > 100 and {r.bandwidth_gb_s for r in laptop} == {256.0}
    qwen35 = [r for r in rows + fresh if r.group != "hybrid" and 27.0e9 < r.params < 27.5e9 and r.recurrent_layers]
    assert qwen35 and all((r.n_layer, r.recurrent_layers) == (64, 48) for r in qwen35)


def test_per_layer_embeddings_are_looked_up_not_read_per_token():
    """Gemma 4 E2B's per-layer embedding table (2.3 B of its 4.6 B parameters) is an input tensor that
    llama.cpp reads with GGML_OP_GET_ROWS (llama-arch.cpp): a token's row is looked up, as in the token
    embedding. The published laptop RTX 4070 runs (256 GB/s) decode the 3.1 GB Q4_K_M file at about 130
    tokens/s, which reading all of it per token would take 400 GB/s for; what the estimate reads fits."""
    m = model_from_catalog("gemma-4-e2b", "Q4_K_M")
    t = tensor_totals(m.arch, m.tensors)
    assert sum(t.active_layer_bytes) < 0.55 * t.model_bytes and 2.2e9 < t.active_params < 2.4e9
    e2b = [r for r in load_rows(fresh=True) if "4070 Laptop" in r.device and r.test == "tg" and r.params == 4.6e9]
    assert e2b
    for r in e2b:
        assert r.weight_bytes * r.tokens_per_s > 1.2 * r.bandwidth_gb_s * 1e9  # the whole file: impossible
        assert r.bytes_per_token * r.tokens_per_s < r.bandwidth_gb_s * 1e9  # what is read: within the peak


def test_held_out_devices_meet_the_accuracy_targets(rows):
    """Folds grouped by device, as before the budget rows (hybrid, CPU-only, AMD) joined: decode keeps
    its 10% / 80%; prefill's median and coverage were 11.5% / 75% on the first 496 rows, 24% / 64% with
    the 2025-26 AMD (Strix Halo ROCm/Vulkan), MoE and GPU+RAM rows, and are 14% / 74% since the prompt
    kernels' batch efficiency, the ubatch's weight reads and NVIDIA's int8 peak are modelled; 16.2% / 75%
    with the 2025-26 CPU rows (a laptop's and two ARM hosts' prefill among them) and folds dealt by a
    checksum of each device's name; 21.0% / 74% with 141 rows from 23 more sources (discrete NVIDIA and
    AMD cards, GPUs with weights in RAM: README, "How fast"). Intel's rows are one card's: the fold that
    holds it out has no Intel constants and reads it as an NVIDIA card, so they are judged by source."""
    held = [x for x in cross_validate(rows, by="device") if x.row.family not in ON_TOP_FAMILIES]
    for test, median_limit, inside_floor in (("tg", 0.10, 0.80), ("pp", 0.215, 0.72)):
        h = [x for x in held if x.row.test == test]
        assert len(h) >= 300
        assert statistics.median(abs(x.error) for x in h) <= median_limit, test
        assert sum(x.inside for x in h) / len(h) >= inside_floor, test


def test_held_out_sources_stay_at_what_the_readme_reports(rows):
    """Each source left out in turn (a repository, thread or page: one build, one methodology): what a
    new buyer's machine gets. The issue's targets (decode <= 10% with >= 80% inside, prefill <= 20%,
    rows with weights in RAM <= 20%, x86 CPUs <= 15%) are not all met; these bounds hold the figures the
    README reports so that they cannot silently get worse: decode 9.0%/87% and prefill 16.7%/90% on the
    other vendors' rows, whose figures the Intel rows (fitted on top of the shared constants) leave as they
    were, and 10.1%/84% and 18.3%/88% with Intel's; Intel's own are 23-50% (one card, two sources). Prefill
    met its 20% once RDNA 4 cards' quantized kernels were modelled at their packed-FP16 rate (20.2% before).
    x86 CPUs' prefill met its 15% (14.5%, from 27.6%) once each CPU computed at its own clock, which took
    decode's share inside the ranges from 87% to 84% (the CPU rows' from 85% to 80%)."""
    held = cross_validate(rows, by="source")
    for test, median_limit, inside_floor, all_limit, all_floor in (
        ("tg", 0.095, 0.86, 0.105, 0.83),
        ("pp", 0.175, 0.88, 0.19, 0.86),
    ):
        h = [x for x in held if x.row.test == test]
        assert statistics.median(abs(x.error) for x in h) <= all_limit, test
        assert sum(x.inside for x in h) / len(h) >= all_floor, test
        h = [x for x in h if x.row.family not in ON_TOP_FAMILIES]
        assert statistics.median(abs(x.error) for x in h) <= median_limit, test
        assert sum(x.inside for x in h) / len(h) >= inside_floor, test
    x86 = [x for x in held if x.row.family == "cpu-x86" and x.row.kind == "cpu" and x.row.test == "pp"]
    assert len(x86) >= 25 and statistics.median(abs(x.error) for x in x86) <= 0.15
    hybrid = [x for x in held if x.row.kind == "hybrid"]
    # 88 usable rows with weights in RAM (decode 19.4%, prefill 18.5%; together 18.5% median, 86% inside;
    # prefill was 11.5% before the shared batch constant moved from 27 to 32 rows with the CPUs' clocks);
    # with the 10 of the source left out (EXCLUDED_SOURCES), 98.
    assert len(hybrid) >= 85
    assert len(hybrid) + sum(r.group == "hybrid" for r in load_rows(excluded=True)) >= 95
    for test, limit in (("tg", 0.20), ("pp", 0.19), (None, 0.19)):
        chosen = [x for x in hybrid if test in (None, x.row.test)]
        assert statistics.median(abs(x.error) for x in chosen) <= limit, test
    inside = sum(x.inside for x in hybrid) / len(hybrid)
    assert inside >= 0.85, inside


def test_sources_kept_out_of_the_fit_are_predicted_as_the_readme_reports(fresh):
    """The 32 sources gathered after the constants were fitted (FRESH_SOURCES) stay out of the fit, a test
    set: 1,853 of their rows, from 23 of them, are rows the loader can read (device and model known), and
    the 1,631 of those that are decode, or prefill at depth 0, are judged (a second batch of 17 Intel Arc
    rows among them: decode 10.7% and prefill 28.4% with it, 10.7% and 28.3% without).
    Decode came within 11.9% (median) with 91% inside the ranges, about what leaving one source out
    of the fit's own rows says (10.3%, 87% then), and within 11.0% with 95% inside once Gemma 4's per-layer
    embeddings were read as the lookup they are (10.9% with RDNA 4's packed-FP16 rule); prefill within 29.7%
    with 79% inside, far worse than the 19.2% the fit's own sources say (a laptop RTX 4070 prefilling twice
    as fast as predicted, and one Radeon AI PRO R9700 host's experts in RAM), 28.3% once each CPU's prompt
    computed at its own clock (its four x86 CPUs from 44.6% to 22.2%; their decode from 10.9% to 2.3%).
    These bounds hold the figures the README reports."""
    held = fresh
    assert len(held) >= 1600 and len({source_key(x.row.source) for x in held}) >= 19
    for test, limit, floor in (("tg", 0.125, 0.88), ("pp", 0.29, 0.77)):
        h = [x for x in held if x.row.test == test]
        assert statistics.median(abs(x.error) for x in h) <= limit, test
        assert sum(x.inside for x in h) / len(h) >= floor, test
    for test, limit in (("pp", 0.25), ("tg", 0.05)):
        x86 = [x for x in held if x.row.family == "cpu-x86" and x.row.test == test]
        assert len(x86) >= 20 and statistics.median(abs(x.error) for x in x86) <= limit, test
    hybrid = [x for x in held if x.row.kind == "hybrid" and x.row.test == "tg"]
    assert len(hybrid) >= 300 and statistics.median(abs(x.error) for x in hybrid) <= 0.18


def test_other_arc_cards_are_judged_with_their_own_published_figures(fresh):
    """The test set's second batch puts the Intel constants, fitted on one card (the Arc Pro B70), to an
    Arc B580 and an Arc A770: each is read at its own memory bandwidth and XMX rate (the catalog's B580,
    the A770's published 560 GB/s and 137.6 TFLOPS), each build on the family of its backend, and a B70
    decode from a third host is predicted within 10% by the fit that never saw it."""
    arc = [r for r in load_rows(fresh=True) if re.search(r"Arc (B580|A770|Pro B70)", r.device) and r.group == "gpu"]
    figures = {(r.device, r.family): (r.bandwidth_gb_s, r.fp16_tflops) for r in arc}
    assert figures[("Intel Arc B580", "intel-sycl")] == (456.0, 109.4)
    assert figures[("Intel Arc A770", "intel-vulkan")] == (560.0, 137.6)
    assert ("Intel Arc Pro B70", "intel-sycl") in figures
    b70 = [h for h in fresh if h.row.device == "Intel Arc Pro B70" and h.row.test == "tg"]
    assert b70 and all(abs(h.error) < 0.1 for h in b70)


def test_amd_builds_before_the_2025_prompt_kernels_are_fitted_apart(rows):
    """An AMD GPU's ROCm or Vulkan rows of a build before 7000 (autumn 2025: WMMA int8 prompt kernels for
    RDNA 3 and 4) are a build of their own; current builds keep the names FitScope predicts with, and on
    the Ryzen AI Max+ 395 current Vulkan builds prefill faster than the older ones did."""
    strix = [r for r in rows if r.family == "unified-amd" and r.test == "pp"]
    assert {r.build for r in strix if 0 < r.release < 7000} == {"rocm<7000", "vulkan<7000"}
    assert {r.build for r in strix if not 0 < r.release < 7000} == {"rocm", "vulkan"}
    assert any(r.release >= 8000 for r in strix)
    # Only AMD GPUs' builds are split by release: NVIDIA's 2024 rows are still "cuda".
    assert all("<" not in r.build for r in rows if not r.family.startswith(("amd", "unified-amd")))
    assert any(r.build == "cuda" and 0 < r.release < 7000 for r in rows)
    own = load_speed_model().families["unified-amd"].prefill_backend
    assert own["vulkan"]["quant"] > 1.3 * own["vulkan<7000"]["quant"]


def test_gpus_decode_slower_on_builds_before_the_autumn_2025_kernels(rows):
    """Every GPU family with decode rows of builds before 7000 (autumn 2025; rows that print no build:
    dated before November 2025) and of later ones shows the older ones slower than the later ones against
    one prediction, by 4-20%: the fit reads them at a rate of their own (0.88), so that the constants
    FitScope predicts with are current builds', and decode held out by source goes from 11.6% to 10.7%.
    A CPU's rows keep theirs (its decode is memory and arithmetic, not GPU kernels)."""
    model = fit_model(rows)
    assert 0.8 < model.globals.older_rate < 0.95
    plain = replace(model.globals, older_rate=1.0)
    shown = 0
    for family in sorted({r.family for r in rows}):
        c = constants_for(family, model.families)
        chosen = [r for r in rows if r.family == family and r.test == "tg" and r.group in ("gpu", "apple", "unified")]
        logs = [(r.older_kernels, math.log(r.tokens_per_s / r.predict(c, model.hybrid, plain))) for r in chosen]
        older = [x for old, x in logs if old]
        current = [x for old, x in logs if not old]
        if older and current:
            shown += 1
            assert statistics.median(older) < statistics.median(current) - 0.035, family
    assert shown >= 6
    cpu = next(r for r in rows if r.group == "cpu" and r.test == "tg" and r.older_kernels)
    c = constants_for(cpu.family, model.families)
    assert cpu.predict(c, model.hybrid, model.globals) == cpu.predict(c, model.hybrid, plain)


def test_the_shipped_constants_are_the_fit_of_the_shipped_data(rows):
    shipped = load_speed_model()
    fitted = fit_model(rows)
    for family, constants in fitted.families.items():
        assert shipped.families[family].decode_efficiency == pytest.approx(constants.decode_efficiency)
        assert shipped.families[family].prefill_quant == pytest.approx(constants.prefill_quant)
    read_rates = fitted.globals.read_rates()
    assert set(shipped.decode_format) == set(read_rates)
    for kind, rates in read_rates.items():
        assert shipped.decode_format[kind] == pytest.approx(rates)
    # The builds the constants are for, as the estimate names them, are the fit's.
    assert (shipped.builds_from, shipped.builds_from_date) == (DECODE_RELEASE, DECODE_RELEASE_DATE)
    # Physically sensible: never above the bandwidth roofline, a small fixed cost per layer.
    for c in shipped.families.values():
        assert 0.2 <= c.decode_efficiency <= 1.0 and c.per_layer_s < 1e-3


def test_the_fit_counts_a_dense_models_reads_as_the_estimate_does(rows):
    """llama-bench's size and parameter columns hold a dense model's untied token embedding, which a
    decoded token only looks up a row of. The estimate (``tensor_totals``) leaves it out, so the fit's
    rows must too: constants fitted on one count and applied to another put Llama 3.1 8B Q4_K_M 6.5%
    faster in the estimate than in the fit. Every published row of that file reads what the estimate
    reads, within 1% (the embedding taken at the file's mean bits per weight)."""
    m = model_from_catalog("llama-3.1-8b", "Q4_K_M")
    t = tensor_totals(m.arch, m.tensors)
    same_file = [
        r
        for r in rows
        if 7.9e9 < r.params < 8.1e9 and r.active_share == 1.0 and abs(r.weight_bytes / t.model_bytes - 1) < 0.005
    ]
    assert len(same_file) >= 40
    for r in same_file:
        assert r.weight_bytes - r.embedding_bytes == pytest.approx(sum(t.active_layer_bytes), rel=0.01)
        assert r.active_params == pytest.approx(t.active_params, rel=0.01)


def test_weighted_percentiles_weigh_devices_not_rows():
    """Forty rows of one device and one row each of four others: the device-weighted 10th-90th
    range spans the devices, where plain percentiles would be the one device's spread."""
    from tests.speed_data import weighted_percentiles

    values = np.array([0.0] * 40 + [-0.4, -0.2, 0.2, 0.4])
    weights = np.array([1 / 40] * 40 + [1.0] * 4)
    lo, hi = weighted_percentiles(values, weights, (0.10, 0.90))
    assert lo < -0.2 and hi > 0.2
    plain_lo, plain_hi = np.percentile(values, [10, 90])
    assert plain_lo == plain_hi == 0.0


def test_sources_are_paired_only_where_they_measured_the_same_thing(rows):
    """Two sources' decode of one model and format on one device compare as bytes read per second (a
    larger file of the same format decodes slower, not worse); another build, a prompt of another length
    or a run with weights in system memory is not the same measurement."""
    from dataclasses import replace

    from tests.speed_data import source_pairs

    base = next(r for r in rows if r.group == "gpu" and r.test == "tg" and r.depth == 0)
    other = replace(base, source="https://example.org/other", weight_bytes=base.weight_bytes * 1.1)
    # 10% more weight bytes at 80% of the tokens/s: compared per byte read, the two are 14% apart, not 25%.
    (pair,) = source_pairs([base, replace(other, tokens_per_s=base.tokens_per_s * 0.8)])
    assert pair.test == "tg" and pair.device == base.device
    expected = base.bytes_per_token / (other.bytes_per_token * 0.8)
    assert pair.ratio == pytest.approx(max(expected, 1 / expected))
    assert source_pairs([base, replace(other, backend="vulkan" if base.build != "vulkan" else "cuda")]) == []
    assert source_pairs([base, replace(other, tokens=base.tokens * 2)]) == []
    assert source_pairs([base, replace(other, group="hybrid")]) == []
    # The same source twice is one source, not a pair.
    assert source_pairs([base, replace(base, tokens_per_s=base.tokens_per_s * 2)]) == []


def test_each_further_user_costs_what_published_runs_of_several_rows_show():
    """Each further row of a decode step (another user) costs the GPU's shader ALUs a fitted amount of
    arithmetic per parameter. On published runs of 1-8 rows per step (tests/data/microbatch_runs.json:
    CUDA and ROCm on nine devices), each source predicted from the constant fitted on the others comes
    within 12% of the published per-token rate (median); without the term the estimate is more than
    twice as far off, too fast per user. Metal's small-batch kernels cost about twice as much per
    parameter (one source, an M1 Pro and an M2 Ultra): at the CUDA and ROCm constant its estimates are
    a third too fast per user, at its own each chip predicted from the other comes within 25%. The
    shipped constants are the fits on every source of each."""
    from tests.rows_data import fit_by_build, held_out, points, summary

    found = points()
    pooled = [p for p in found if not p.build]
    assert len({p.source for p in pooled}) >= 10 and len({p.device for p in pooled}) >= 8
    median, _ = summary([e for p, e in held_out(found) if not p.build])
    without, _ = summary([p.error(0.0) for p in pooled])
    assert median <= 0.12 and without > 2 * median
    assert sum(p.error(0.0) > 0 for p in found) > 0.8 * len(found)
    shipped = load_speed_model()
    k, own = fit_by_build(found)
    assert shipped.decode_row_flop_per_param == pytest.approx(k, rel=0.01)
    assert shipped.decode_row_flop_by_build == pytest.approx(own, rel=0.01)
    metal = [p for p in found if p.build == "metal"]
    assert {p.device for p in metal} == {"M1 Pro", "M2 Ultra"} and own["metal"] > 1.5 * k
    assert summary([p.error(k) for p in metal])[0] > 0.3
    assert summary([e for p, e in held_out(found, by="device") if p.build == "metal"])[0] < 0.25
    assert shipped.row_flop_per_param("metal") == own["metal"] and shipped.row_flop_per_param("cuda") == k


def test_every_catalog_gpu_gives_the_shader_rate_further_users_cost_at():
    """Further users' rows run on the shader ALUs, not the tensor units: every catalog GPU gives its FP32
    rate, at most its FP16 tensor rate (an Apple GPU's is the same) and no less than 1/31 of it (a B200's
    is 1/30), and an estimate's GPU carries it."""
    from app.core.memory.targets import target_from_device
    from app.core.model.catalog import find_device, load_devices

    gpus = [d for d in load_devices() if d.is_gpu]
    assert len(gpus) > 70 and all(d.fp32_tflops for d in gpus)
    for d in gpus:
        ratio = d.fp16_tflops / (d.fp32_tflops or 1)
        assert (ratio == 1) if d.vendor == "apple" else (1.9 <= ratio <= 31), (d.id, ratio)
    assert target_from_device(find_device("h100-sxm")).vector_tflops == 67
    assert target_from_device(find_device("rtx-3090")).vector_tflops == pytest.approx(35.58)
