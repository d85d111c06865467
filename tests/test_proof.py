"""The estimator against llama.cpp itself: sparse synthetic GGUFs of real architectures and the real
demo model, dry-run by llama.cpp (no-alloc), every component within 2% or 8 MiB.

Shapes listed in KNOWN_COMPUTE_GAPS keep their measured, wider bound for the compute buffer only.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.memory.estimate import estimate
from app.core.memory.records import Settings
from app.core.model.coverage import PROVEN
from app.core.model.gguf_model import read_gguf
from tests.support.proof import CASES, CPU_HOST, KNOWN_COMPUTE_GAPS, Case, compare_files, measure, run_case

pytestmark = pytest.mark.llamacpp


@pytest.fixture(scope="session")
def synthetic_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("synthetic-gguf")


@pytest.mark.parametrize("case", CASES, ids=[c.label for c in CASES])
def test_estimate_matches_llama_cpp(case: Case, synthetic_dir: Path) -> None:
    result = run_case(case, synthetic_dir)
    failures = [
        f"{r.component}: estimated {r.estimated_bytes / 2**20:.2f} MiB, llama.cpp {r.measured_bytes / 2**20:.2f} MiB "
        f"({r.error_percent:+.1f}%, allowed ±{r.tolerance_bytes / 2**20:.1f} MiB)"
        for r in result.rows
        if not r.ok
    ]
    assert not failures, f"{case.label}: " + "; ".join(failures)
    # Weights and KV are exact for every architecture: no tolerance is used there.
    by_name = {r.component: r for r in result.rows}
    assert by_name["weights"].error_bytes == 0
    assert abs(by_name["kv_cache"].error_bytes) <= 2**20 // 100 * 1  # printed with 0.01 MiB precision


def test_cases_cover_the_required_shapes() -> None:
    from app.core.model.catalog import find_model

    archs = {find_model(c.model_id).arch for c in CASES}
    assert {"llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3", "deepseek2", "gpt-oss", "mamba"} <= archs
    # Every architecture FitScope calls exact is proven here, and nothing else is called exact.
    assert archs == set(PROVEN)
    assert len({c.model_id for c in CASES}) >= 10
    contexts = {c.context for c in CASES}
    assert min(contexts) == 512 and max(contexts) == 131072
    assert {c.ubatch for c in CASES} >= {128, 512, 2048}
    assert {c.cache_v for c in CASES} >= {"f16", "q8_0", "q4_0"}
    assert {c.parallel for c in CASES} >= {1, 4}
    assert {c.flash_attn for c in CASES} == {True, False}
    assert {c.swa_full for c in CASES} == {True, False}
    # The known gaps stay few and bounded.
    assert len(KNOWN_COMPUTE_GAPS) <= 9 and max(KNOWN_COMPUTE_GAPS.values()) <= 0.20


@pytest.mark.parametrize(
    "settings",
    [
        Settings(context_tokens=4096),
        Settings(context_tokens=32768, flash_attn=False),
        Settings(context_tokens=8192, swa_full=False, parallel_sequences=4),
        Settings(context_tokens=2048, ubatch_tokens=128, cache_type_k="q8_0", cache_type_v="q8_0"),
    ],
    ids=["4k", "32k-no-fa", "8k-np4-no-swa-full", "2k-ub128-q8"],
)
def test_demo_model_matches_llama_cpp(demo_gguf: Path, settings: Settings) -> None:
    model = read_gguf(demo_gguf)
    tensors = list(model.tensors)
    est = estimate(model.architecture, tensors, settings.model_copy(update={"repack": "none"}), [CPU_HOST])
    measured = measure(demo_gguf, settings)
    rows = compare_files(tensors, est, measured)
    bad = [f"{r.component} {r.estimated_bytes} vs {r.measured_bytes}" for r in rows if not r.ok]
    assert not bad
    assert est.model_bytes == measured.model_size_bytes == 246_587_904
    # Two caches (3 full-attention layers, 15 sliding-window layers), as llama.cpp builds them.
    assert sorted(c.layers for c in est.kv_caches) == sorted(c.layers for c in measured.kv_caches) == [3, 15]
