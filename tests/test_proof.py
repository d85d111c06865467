"""The estimator against llama.cpp itself: sparse synthetic GGUFs of real architectures and the real
demo model, dry-run by llama.cpp (no-alloc): every component within 2% or 8 MiB of llama.cpp (over-
estimates within 5%), and none below it beyond the 0.02 MiB it prints with.

The compute estimate includes its architecture's measured placement allowance
(app.core.memory.graphs.ALLOWANCE, resources/compute_allowance.json) where ggml's allocator places the
graph's tensors in ways the modelled peak does not follow.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.adapters.host import detect_host
from app.adapters.llamacpp_probe import dry_run
from app.core.memory.estimate import estimate
from app.core.memory.graphs import ALLOWANCE, ALLOWANCE_CELLS, ALLOWANCE_ROWS, ALLOWANCE_UBATCHES, MODEL_ALLOWANCE
from app.core.memory.records import Settings
from app.core.memory.targets import repack_profile
from app.core.model.coverage import PROVEN
from app.core.model.gguf_model import read_gguf
from app.core.model.quant import quantize_layout
from app.core.plans.rpc import PRINT_PRECISION_BYTES
from tests.support.proof import CASES, CPU_HOST, KNOWN_OVER, Case, architecture_for, compare_files, measure, run_case
from tests.support.synthetic_gguf import write_sparse_gguf

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
    # Never below llama.cpp (beyond its print precision): the compute buffers' placement allowance
    # covers what the model of the graph's peak does not.
    under = [f"{r.component} {r.error_bytes / 2**20:+.2f} MiB" for r in result.rows if r.under]
    assert not under, f"{case.label}: an under-estimate: {under}"
    # Weights (resident: MTP/NextN blocks llama.cpp skips left out) and KV are exact for every
    # architecture: no tolerance is used there.
    by_name = {r.component: r for r in result.rows}
    assert by_name["weights"].error_bytes == 0
    assert abs(by_name["kv_cache"].error_bytes) <= 2**20 // 100 * 1  # printed with 0.01 MiB precision


def test_known_over_estimates_are_proof_cases() -> None:
    """Every case listed as a known over-estimate is one of the proof's cases (a stale entry fails)."""
    assert set(KNOWN_OVER) <= {c.label for c in CASES}


def test_cases_cover_the_required_shapes() -> None:
    archs = {architecture_for(c.model_id).arch for c in CASES}
    assert {"llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3", "deepseek2", "gpt-oss", "mamba"} <= archs
    # Every architecture FitScope calls exact is proven here, and nothing else is called exact.
    assert archs == set(PROVEN)
    assert len({c.model_id for c in CASES}) >= 10
    contexts = {c.context for c in CASES}
    assert min(contexts) == 512 and max(contexts) == 131072
    assert {c.ubatch for c in CASES} >= {128, 512, 2048}
    assert {c.cache_v for c in CASES} >= {"f16", "q8_0", "q4_0"}
    assert {c.parallel for c in CASES} >= {1, 3, 4}
    assert {c.flash_attn for c in CASES} == {True, False}
    assert {c.swa_full for c in CASES} == {True, False}
    # Every architecture behind the 2026 models, with their own cases.
    assert {
        "qwen35",
        "qwen35moe",
        "gemma4",
        "deepseek32",
        "glm-dsa",
        "nemotron_h_moe",
        "granitehybrid",
        "kimi-linear",
        "smollm3",
        "laguna",
        "gemma3n",
        "mistral4",
        "minimax-m3",
        "step35",
        "hy_v3",
    } <= archs
    # Every model proven here has its own measured allowance; per-token floats, one per measured
    # ubatch and cache size, bounded by two f32 rows over the largest cache (the mask and, for sparse
    # attention, the indexer's scores) beside a feed-forward row (negative: a correction where the
    # modelled peak was measured high).
    assert {c.model_id for c in CASES} <= set(MODEL_ALLOWANCE)
    # A model measured at its trained context too (between two grid sizes: LFM2's 128,000, Qwen3's 40,960)
    # has one value more per ubatch, there; a model's other sizes are the grid's.
    for model_id, measured in MODEL_ALLOWANCE.items():
        extra = set(measured.cells) - set(ALLOWANCE_CELLS)
        assert set(ALLOWANCE_CELLS) <= set(measured.cells) and list(measured.cells) == sorted(measured.cells)
        assert extra <= {architecture_for(model_id).n_ctx_train}
        assert all(len(per_ub) == len(measured.cells) for row in measured.table for per_ub in row)
    assert MODEL_ALLOWANCE["lfm2-350m"].cells[-2] == 128000 and MODEL_ALLOWANCE["qwen3-8b"].cells[-3] == 40960
    for table in ALLOWANCE.values():
        assert len(table) == len(ALLOWANCE_ROWS)
        assert all(len(row) == len(ALLOWANCE_UBATCHES) for row in table)
        assert all(len(per_ub) == len(ALLOWANCE_CELLS) for row in table for per_ub in row)
        assert all(-160_000 <= x <= 2 * ALLOWANCE_CELLS[-1] + 32_768 for row in table for v in row for x in v)


def test_gemma_4_31b_at_128k_on_an_rtx_5090_has_llama_cpps_kv_cache(synthetic_dir: Path, capsys) -> None:
    """`fitscope estimate --model gemma-4-31b -c 131072 --gpu rtx-5090`: the KV cache it prints is the
    one llama.cpp's dry run of the same shape makes (llama-server: a window-sized SWA cache)."""
    import json

    from app import cli

    assert cli.main(["estimate", "--model", "gemma-4-31b", "-c", "131072", "--gpu", "rtx-5090", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    case = Case("gemma-4-31b", context=131072, swa_full=False, consumer="llama-server")
    measured = run_case(case, synthetic_dir)
    kv = next(r for r in measured.rows if r.component == "kv_cache")
    assert out["kv_cache_bytes"] == kv.estimated_bytes
    assert abs(out["kv_cache_bytes"] - kv.measured_bytes) <= 2**20 // 100
    # 10 full-attention layers over 131,072 cells and 50 sliding-window layers over 1,536
    assert sorted((c["kind"], c["layers"], c["cells"]) for c in out["kv_caches"]) == [
        ("full", 10, 131072),
        ("swa", 50, 1536),
    ]


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


# One synthetic file of each structure the CPU's repack buffer meets: tied and untied embeddings, Q4_0,
# Gemma 3n's 3-D AltUp projections and per-layer embeddings (Gemma 4's too), routed-expert stacks beside
# linear attention and beside full attention, Mamba, LFM2's convolutions and a Mamba-2 hybrid.
REPACK_CASES = (
    ("llama-3.2-1b", "Q4_K_M"),
    ("qwen2.5-0.5b", "Q4_0"),
    ("gemma3n-30l-shape", "Q4_K_M"),
    ("gemma-4-e2b", "Q4_K_M"),
    ("kimi-linear-small-shape", "Q4_K_M"),
    ("hy-v3-small-shape", "Q4_K_M"),
    ("mamba-2.8b", "Q4_K_M"),
    ("lfm2-1.2b", "Q4_K_M"),
    ("nemotron-nano-9b-v2", "Q4_K_M"),
)


@pytest.mark.parametrize(("model_id", "quant"), REPACK_CASES, ids=[f"{m}-{q}" for m, q in REPACK_CASES])
def test_cpu_repack_matches_a_real_llama_cpp_load(model_id: str, quant: str, synthetic_dir: Path) -> None:
    """A CPU build copies the weights its GEMMs take repacked into the CPU_REPACK buffer (resident memory
    beside the mapped file): llama.cpp's real load of each structure (mmap on, this machine's CPU) prints
    exactly the bytes the estimate counts. Its repack buffer takes 2-D matrices and routed-expert stacks
    only (``supports_op``: GGML_OP_MUL_MAT, MUL_MAT_ID), and never the input layer: Gemma 3n's 3-D AltUp
    projections and Gemma 3n's and 4's per-layer embeddings (GET_ROWS) stay in the mapped file. Counted
    as repacked, they put Gemma 4 E2B's repack at 2,128 MiB where llama.cpp makes 868."""
    host = detect_host(measure_bandwidth=False)
    profile = repack_profile(host)
    if profile not in ("x86-avx2", "x86-avx512"):
        pytest.skip(f"the repack cases are for x86 CPUs with AVX2 (this one: {profile})")
    arch = architecture_for(model_id)
    tensors = quantize_layout(arch, quant)
    path = synthetic_dir / f"{model_id}-{quant}.gguf"
    if not path.exists():
        write_sparse_gguf(path, arch, quant, tensors)
    est = estimate(arch, tensors, Settings(context_tokens=512, repack=profile), [CPU_HOST])
    measured = dry_run(path, n_ctx=512, flash_attn=True, real_load=True, timeout_s=600)
    assert measured.repack_bytes is not None and measured.repack_bytes > 0
    assert abs(est.devices[0].repack_bytes - measured.repack_bytes) <= PRINT_PRECISION_BYTES, (
        est.devices[0].repack_bytes / 2**20,
        measured.repack_bytes / 2**20,
    )
