"""Choosing a quantization by the user's own task: real variants made by llama.cpp's quantizer,
answered by llama.cpp, scored by the suites' checks, agreement with the reference, routing advice,
the routing config, the headless command and the window's tab."""

from __future__ import annotations

import dataclasses
import json
import tomllib

import pytest

from app.adapters.ab_compare import compare_variants
from app.adapters.quantizer import default_variant_path, quantize
from app.core.common.errors import FitScopeError
from app.core.memory.targets import cpu_target
from app.core.model.catalog import find_device
from app.core.quality.quant_compare import VariantResult, recommend_quant, routing_config, to_toml
from app.core.quality.suite_checks import CheckResult
from app.core.quality.suite_reading import parse_suite
from tests.support.tiny_gguf import write_tiny_llama

pytestmark = pytest.mark.llamacpp

SUITE = parse_suite(
    """
name: smoke
task: chat
quality_floor: 0.5
prompts:
  - id: one
    prompt: "The old man went to the market"
    max_tokens: 12
    check: {regex: "."}
  - id: two
    prompt: "In the morning the family"
    max_tokens: 12
    check: {contains: "zzzz-never"}
"""
)


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    root = tmp_path_factory.mktemp("ab")
    source = write_tiny_llama(root / "tiny-F32.gguf", n_layer=4, n_embd=256, n_ff=512)
    q8 = quantize(source, default_variant_path(source, "Q8_0"), "Q8_0")
    q4 = quantize(source, default_variant_path(source, "Q4_0"), "Q4_0")
    return [str(q4), str(source), str(q8)]


def cpu_targets():
    from app.adapters.host import detect_host

    return [cpu_target(detect_host(measure_bandwidth=False))]


def test_variants_are_scored_and_compared_with_the_highest_precision_one(variants):
    progress = []
    comparison = compare_variants(
        variants, [SUITE], cpu_targets(), "this CPU", on_progress=lambda f, m: progress.append(f)
    )
    names = [v.label for v in comparison.variants]
    assert names == ["tiny-F32", "tiny-Q8_0", "tiny-Q4_0"]  # reference first, by file size
    ref, q8, q4 = comparison.variants
    assert ref.is_reference and ref.identical_token_share is None
    # A prompt that always passes and one that never does: 50% everywhere.
    assert [v.pass_rates["smoke"] for v in comparison.variants] == [0.5, 0.5, 0.5]
    assert 0.0 <= q4.top1_agreement <= 1.0 and 0.0 <= q8.identical_token_share <= 1.0
    # Q8_0 keeps closer to F32 than Q4_0 does (teacher-forced next-token agreement).
    assert q8.top1_agreement >= q4.top1_agreement
    assert q8.top1_agreement > 0.8
    assert all(v.decode_tokens_per_s and v.decode_tokens_per_s > 0 for v in comparison.variants)
    assert ref.estimated_total_bytes > q8.estimated_total_bytes > q4.estimated_total_bytes
    assert progress[-1] == 1.0 and progress == sorted(progress)
    # All three meet the 50% floor and fit: the cheapest wins, and the others are told why they lost.
    (advice,) = comparison.advice
    assert advice.chosen == "tiny-Q4_0"
    assert any("more memory than tiny-Q4_0" in r for r in advice.reasons)


def test_routing_config_as_json_and_toml(variants):
    comparison = compare_variants(variants[:2], [SUITE], cpu_targets(), "this CPU")
    config = routing_config(comparison)
    assert [v["name"] for v in config["variants"]] == ["tiny-F32", "tiny-Q4_0"]
    assert config["routes"][0]["variant"] == "tiny-Q4_0"
    parsed = tomllib.loads(to_toml(config))
    assert parsed["variants"][1]["memory_gb"] == config["variants"][1]["memory_gb"]
    assert parsed["routes"][0]["variant"] == "tiny-Q4_0"
    json.dumps(config)


def test_advice_respects_floors_and_hardware():
    def variant(label, memory_gib, rate, fits=True, speed=50.0):
        return VariantResult(
            label,
            label,
            f"/{label}.gguf",
            0,
            int(memory_gib * 2**30),
            fits,
            None,
            speed,
            None,
            None,
            {"smoke": rate},
            (),
        )

    variants = [variant("F16", 16, 1.0, fits=False), variant("Q8_0", 8.5, 0.9), variant("Q4_K_M", 4.9, 0.6)]
    (advice,) = recommend_quant(variants, [SUITE.model_copy(update={"quality_floor": 0.85})], "an RTX 3060 12GB")
    assert advice.chosen == "Q8_0"
    assert "F16: does not fit an RTX 3060 12GB (16.0 GiB needed)." in advice.reasons
    assert "Q4_K_M: passes 60%, below the 85% floor." in advice.reasons
    (none,) = recommend_quant(variants[2:], [SUITE.model_copy(update={"quality_floor": 0.95})], "x")
    assert none.chosen is None and none.reasons[0].startswith("No variant meets the 95% floor")
    assert isinstance(CheckResult(True, "ok"), CheckResult)


def test_files_of_different_models_are_refused(tmp_path, variants):
    other = write_tiny_llama(tmp_path / "other.gguf", n_layer=3, n_embd=128, n_ff=256)
    with pytest.raises(FitScopeError, match="not variants of one model"):
        compare_variants([variants[0], str(other)], [SUITE], cpu_targets(), "x")
    with pytest.raises(FitScopeError, match="2 to 4"):
        compare_variants([variants[0]], [SUITE], cpu_targets(), "x")


def test_fitscope_compare_json_and_routing_file(variants, tmp_path, capsys):
    from app.cli import main

    suite_file = tmp_path / "smoke.yaml"
    suite_file.write_text(
        "name: smoke\ntask: chat\nquality_floor: 0.5\nprompts:\n"
        "  - id: a\n    prompt: The old man\n    max_tokens: 8\n    check: {regex: '.'}\n"
    )
    out = tmp_path / "routing.toml"
    code = main(
        [
            "compare",
            "--gguf",
            variants[0],
            "--gguf",
            variants[1],
            "--suite",
            str(suite_file),
            "--gpu",
            "rtx-4090",
            "--routing-config",
            str(out),
            "--json",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["hardware"] == find_device("rtx-4090").name
    assert {v["name"] for v in report["variants"]} == {"tiny-F32", "tiny-Q4_0"}
    assert report["details"][0]["reference"] and report["details"][1]["top1_agreement"] is not None
    assert tomllib.loads(out.read_text())["routes"][0]["profile"] == "smoke"


def test_one_prompt_in_ten_is_not_a_winner():
    # 9/10 against 8/10 on the same prompts: the advice must not pretend the difference is real.
    from app.core.quality.quant_compare import PromptAnswer

    def variant(label, memory_gib, failed):
        answers = tuple(PromptAnswer("smoke", f"p{i}", "", CheckResult(f"p{i}" not in failed, "")) for i in range(10))
        rate = sum(a.result.passed for a in answers) / 10
        return VariantResult(
            label,
            label,
            f"/{label}.gguf",
            0,
            int(memory_gib * 2**30),
            True,
            None,
            50.0,
            None,
            None,
            {"smoke": rate},
            answers,
        )

    q8 = variant("Q8_0", 8.5, {"p9"})
    q4 = variant("Q4_K_M", 4.9, {"p8", "p9"})
    (advice,) = recommend_quant([q8, q4], [SUITE.model_copy(update={"quality_floor": 0.85})], "a 24 GB GPU")
    assert advice.chosen == "Q8_0"
    text = " ".join(advice.reasons)
    assert "Q8_0 and Q4_K_M are not distinguishable with 10 prompts (p = 1.00)" in text
    assert "about 77 prompts would be needed" in text
    assert "passes 90% (95% interval 60%-98%, 10 prompts)" in text
    # With 60 prompts and the same 10-point gap (6 discordant, all one way), the test tells them apart.
    many = tuple(PromptAnswer("smoke", f"p{i}", "", CheckResult(i >= 6, "")) for i in range(60))
    better = tuple(PromptAnswer("smoke", f"p{i}", "", CheckResult(True, "")) for i in range(60))
    q8, q4 = dataclasses.replace(q8, answers=better), dataclasses.replace(q4, answers=many)
    (advice,) = recommend_quant([q8, q4], [SUITE.model_copy(update={"quality_floor": 0.85})], "a 24 GB GPU")
    assert "Q8_0 is better than Q4_K_M beyond chance (p = 0.031)" in " ".join(advice.reasons)
