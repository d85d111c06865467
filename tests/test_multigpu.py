"""Multi-GPU plans: llama.cpp's layer split (through the estimator) and vLLM's tensor parallelism."""

from __future__ import annotations

import json

import pytest

from app.core.common.errors import EstimateError
from app.core.common.units import GIB
from app.core.memory.records import Settings
from app.core.model.catalog import find_device, find_model
from app.core.model.quant import find_serving_format, serving_weights_bytes
from app.core.model.source import model_from_catalog
from app.core.plans.layer_split import llama_split_plan
from app.core.plans.vllm import hf_model_id, vllm_plan
from app.core.plans.vllm_memory import (
    VLLM_CUDA_CONTEXT_BYTES,
    VLLM_CUDA_GRAPH_BYTES,
    VLLM_CUDA_VISIBLE_FRACTION,
    VLLM_FORWARD_HIDDEN_COPIES,
    VLLM_NON_TORCH_BYTES,
    VLLM_NON_TORCH_BYTES_TP,
    VLLM_SAMPLER_BYTES_PER_LOGIT,
)

# -- llama.cpp ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def split_70b_on_two_4090s():
    model = model_from_catalog("llama-3.1-70b", "Q4_K_M")
    plan = llama_split_plan(
        model.arch, model.tensors, Settings(context_tokens=8192), find_device("rtx-4090"), 2, 64 * GIB
    )
    return model, plan


def test_llama_split_places_every_layer_once(split_70b_on_two_4090s) -> None:
    model, plan = split_70b_on_two_4090s
    assert [g.name for g in plan.gpus] == ["GPU 0", "GPU 1"]
    assert plan.gpu_layers == model.arch.n_layer + 1 == 81
    # 80 repeating layers split 41/39 (81 placed layers at 1:1, the output layer on the last GPU).
    assert sum(g.layers for g in plan.gpus) == model.arch.n_layer
    assert [g.holds_output for g in plan.gpus] == [False, True]
    assert sum(g.layers + g.holds_output for g in plan.gpus) == plan.gpu_layers
    assert plan.host.layers == 0


def test_llama_split_totals_are_the_estimators(split_70b_on_two_4090s) -> None:
    _, plan = split_70b_on_two_4090s
    devices = plan.estimate.devices
    for line, d in zip(plan.gpus, devices[:2], strict=True):
        assert line.total_bytes == d.total_bytes
        assert line.weights_bytes == d.weights_bytes and line.kv_cache_bytes == d.kv_cache_bytes
        assert line.capacity_bytes == 24 * GIB
        assert line.total_bytes == (
            line.weights_bytes + line.kv_cache_bytes + line.compute_bytes + line.overhead_bytes + line.other_bytes
        )
    assert plan.host.total_bytes == devices[-1].total_bytes
    # 80 layers x 8 KV heads x 128 x (K + V) x 2 bytes x 8192 cells = 2.5 GiB, split with the layers.
    assert sum(g.kv_cache_bytes for g in plan.gpus) == 80 * 8 * 128 * 2 * 2 * 8192
    assert plan.fits and plan.suggested_gpu_layers is None


def test_llama_split_command(split_70b_on_two_4090s) -> None:
    _, plan = split_70b_on_two_4090s
    cmd = plan.command.split()
    assert cmd[0] == "llama-server"
    for flag, value in (
        ("-ngl", "81"),
        ("--split-mode", "layer"),
        ("--tensor-split", "1,1"),
        ("-c", "8192"),
        ("-np", "1"),
        ("-fa", "on"),
        ("-ctk", "f16"),
        ("-ctv", "f16"),
        ("-ub", "512"),
        ("-b", "2048"),
    ):
        assert cmd[cmd.index(flag) + 1] == value, flag
    data = plan.to_json()
    assert json.loads(json.dumps(data)) == data
    assert all(isinstance(g["total_bytes"], int) for g in data["gpus"])
    assert any("GPU 1: 39 layers and the output layer" in s for s in plan.summary_lines())


def test_llama_split_too_small_suggests_fewer_layers() -> None:
    model = model_from_catalog("llama-3.1-70b", "Q4_K_M")
    plan = llama_split_plan(
        model.arch, model.tensors, Settings(context_tokens=8192), find_device("rtx-3060-12gb"), 2, 128 * GIB
    )
    assert not plan.fits
    assert plan.suggested_gpu_layers is not None and 0 < plan.suggested_gpu_layers < 81


# -- vLLM -----------------------------------------------------------------------------------------

A100 = find_device("a100-80gb")


def _llama_8b_params() -> int:
    """Parameters of Llama 3.1 8B from its config: embeddings, head and 32 decoder layers."""
    e, ff, vocab, kv = 4096, 14336, 128256, 1024
    layer = e * (e + 2 * kv) + e * e + 3 * e * ff + 2 * e  # q/k/v, o, gate/up/down, two norms
    return 2 * vocab * e + 32 * layer + e


def test_vllm_llama_8b_fp16_on_one_a100() -> None:
    arch = find_model("llama-3.1-8b")
    plan = vllm_plan(arch, A100, 1, max_model_len=8192, max_num_seqs=256)
    g = plan.gpus[0]
    assert _llama_8b_params() == pytest.approx(8.03e9, rel=0.001)
    assert g.weights_bytes == pytest.approx(_llama_8b_params() * 2, rel=0.02)
    assert g.weights_bytes == pytest.approx(serving_weights_bytes(arch, find_serving_format("FP16")), rel=0.001)
    assert plan.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072
    assert plan.block_bytes == 131072 * 16

    # The A100 keeps vllm serve's small defaults: 2048 batched tokens, so the sampler (256 sequences
    # over the 128256-entry vocabulary) is the activation peak.
    assert plan.max_num_batched_tokens == 2048
    sampler = int(256 * 128256 * VLLM_SAMPLER_BYTES_PER_LOGIT) + 2048 * 4096 * 2
    forward = 2048 * 2 * (VLLM_FORWARD_HIDDEN_COPIES * 4096 + 3 * 14336)
    assert g.activation_bytes == max(sampler, forward) == sampler
    visible = int(80 * GIB * VLLM_CUDA_VISIBLE_FRACTION)
    budget = int(visible * 0.9)
    kv_budget = budget - g.weights_bytes - sampler - VLLM_NON_TORCH_BYTES
    assert (g.visible_bytes, g.budget_bytes, g.kv_budget_bytes) == (visible, budget, kv_budget)
    blocks = kv_budget // (131072 * 16)
    assert plan.num_gpu_blocks == blocks
    assert plan.kv_cache_tokens == blocks * 16
    assert plan.max_concurrent_sequences == blocks * 16 // 8192
    assert g.kv_cache_bytes == blocks * 131072 * 16 <= kv_budget
    assert g.total_bytes == (
        g.weights_bytes
        + sampler
        + VLLM_NON_TORCH_BYTES
        + g.kv_cache_bytes
        + VLLM_CUDA_GRAPH_BYTES
        + VLLM_CUDA_CONTEXT_BYTES
    )
    assert plan.starts and g.fits
    assert plan.max_concurrent_sequences == 54  # 28,033 blocks of 16 tokens


def test_vllm_tensor_parallel_divides_weights_and_kv_heads() -> None:
    arch = find_model("llama-3.1-8b")
    one = vllm_plan(arch, A100, 1, max_model_len=8192, max_num_seqs=256)
    four = vllm_plan(arch, A100, 4, max_model_len=8192, max_num_seqs=256)
    assert [g.name for g in four.gpus] == ["GPU 0", "GPU 1", "GPU 2", "GPU 3"]
    # Norms are replicated, so each shard is a hair over a quarter.
    assert four.gpus[0].weights_bytes == pytest.approx(one.gpus[0].weights_bytes / 4, rel=0.001)
    assert four.gpus[0].weights_bytes > one.gpus[0].weights_bytes // 4
    assert four.kv_bytes_per_token == 2 * 32 * (8 // 4) * 128 * 2 == one.kv_bytes_per_token // 4
    assert four.gpus[0].non_torch_bytes == VLLM_NON_TORCH_BYTES_TP
    assert four.num_gpu_blocks > 4 * one.num_gpu_blocks  # the weights freed on each GPU turn into KV cache


def test_vllm_replicates_kv_heads_beyond_their_count() -> None:
    arch = find_model("llama-3.1-405b")  # 128 heads, 8 KV heads
    plan = vllm_plan(arch, find_device("h200"), 16, dtype="FP8", max_model_len=8192, max_num_seqs=64)
    assert plan.kv_bytes_per_token == 2 * arch.n_layer * 1 * 128 * 2
    assert any("replicates each KV head on 2 GPUs" in n for n in plan.notes)


def test_vllm_invalid_tensor_parallel_size() -> None:
    with pytest.raises(EstimateError, match=r"attention heads \(32\) must be divisible by tensor parallel size \(3\)"):
        vllm_plan(find_model("llama-3.1-8b"), A100, 3, max_model_len=8192, max_num_seqs=256)


def test_vllm_max_model_len_that_does_not_fit_is_reported() -> None:
    plan = vllm_plan(find_model("llama-3.1-70b"), A100, 2, max_model_len=131072, max_num_seqs=256)
    assert not plan.starts and not plan.max_model_len_fits
    assert plan.num_gpu_blocks > 0 and plan.max_concurrent_sequences == 0
    message = plan.problems[0]
    assert "To serve at least one request with the model's max seq len (131072)" in message
    assert f"estimated maximum model length is {plan.estimated_max_model_len}" in message
    assert 0 < plan.estimated_max_model_len < 131072
    assert "would not start" in plan.summary_lines()[-1]


def test_vllm_weights_that_leave_no_cache_are_reported() -> None:
    too_big = vllm_plan(find_model("llama-3.1-70b"), A100, 1, max_model_len=8192, max_num_seqs=256)
    assert not too_big.starts and too_big.num_gpu_blocks == 0
    assert too_big.problems[0].startswith("CUDA out of memory while loading the weights")
    # Published: Llama-3.3-70B FP8 at TP=1 on an H100 loads (67.72 GiB) and then fails with
    # "No available memory for the cache blocks" (KV budget -1.44 GiB).
    no_cache = vllm_plan(
        find_model("llama-3.3-70b"), find_device("h100-sxm"), 1, dtype="FP8", max_model_len=16000, max_num_seqs=1024
    )
    assert no_cache.problems[0].startswith("No available memory for the cache blocks.")
    assert no_cache.gpus[0].kv_budget_bytes / GIB == pytest.approx(-1.44, abs=0.3)
    assert not no_cache.gpus[0].fits


def test_vllm_command_line() -> None:
    plan = vllm_plan(
        find_model("llama-3.1-70b"),
        A100,
        4,
        dtype="FP8",
        max_model_len=8192,
        max_num_seqs=128,
        gpu_memory_utilization=0.92,
        kv_cache_dtype="fp8",
    )
    cmd = plan.command.split()
    assert cmd[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-70B"]
    for flag, value in (
        ("--tensor-parallel-size", "4"),
        ("--max-model-len", "8192"),
        ("--max-num-seqs", "128"),
        ("--gpu-memory-utilization", "0.92"),
        ("--dtype", "auto"),
        ("--kv-cache-dtype", "fp8"),
        ("--quantization", "fp8"),
    ):
        assert cmd[cmd.index(flag) + 1] == value, flag
    assert plan.kv_bytes_per_token == 2 * 80 * 2 * 128 * 1

    awq = vllm_plan(find_model("llama-3.1-8b"), A100, 2, dtype="AWQ-4bit", max_model_len=8192, max_num_seqs=64)
    assert "--quantization awq_marlin" in awq.command and "--dtype half" in awq.command
    assert "--kv-cache-dtype" not in awq.command
    assert awq.model_id.startswith("<a AWQ-4bit checkpoint of meta-llama/Llama-3.1-8B")

    t4 = vllm_plan(find_model("llama-3.2-1b"), find_device("t4"), 1, max_model_len=4096, max_num_seqs=32)
    assert "--dtype half" in t4.command  # no bfloat16 below compute capability 8.0


def test_vllm_mla_cache_is_not_sharded() -> None:
    arch = find_model("deepseek-v2-lite")
    assert arch.mla is not None
    one = vllm_plan(arch, A100, 1, max_model_len=8192, max_num_seqs=64)
    two = vllm_plan(arch, A100, 2, max_model_len=8192, max_num_seqs=64)
    assert one.kv_bytes_per_token == two.kv_bytes_per_token == arch.n_layer * (512 + 64) * 2


def test_vllm_plan_json_and_summary() -> None:
    plan = vllm_plan(find_model("llama-3.1-8b"), A100, 2, max_model_len=8192, max_num_seqs=256)
    data = plan.to_json()
    assert json.loads(json.dumps(data)) == data
    for g in data["gpus"]:
        assert all(isinstance(v, int) for k, v in g.items() if k.endswith("_bytes"))
    assert data["max_concurrent_sequences"] == plan.max_concurrent_sequences
    assert all(isinstance(s, str) and s.endswith(".") for s in plan.summary_lines())


@pytest.mark.parametrize(
    ("model_id", "fmt", "tp", "published_kv_gib"),
    [
        # vLLM V1 on H100 (79.18 GiB), --max-model-len 16000, defaults (8192 batched tokens, 1024 sequences):
        # "Available KV cache memory" from llm-d-benchmark's config_explorer/empirical-vllm-memory-results.md.
        ("llama-3.1-8b", "FP16", 1, 51.38),
        ("qwen3-0.6b", "FP16", 1, 64.45),
        ("qwen3-32b", "FP16", 1, 4.45),
        ("llama-3.3-70b", "FP8", 2, 32.0),
    ],
)
def test_vllm_reproduces_published_kv_budgets(model_id: str, fmt: str, tp: int, published_kv_gib: float) -> None:
    # The sampler constant was fitted to these very logs: this guards the arithmetic, not the model.
    plan = vllm_plan(
        find_model(model_id), find_device("h100-sxm"), tp, dtype=fmt, max_model_len=16000, max_num_seqs=1024
    )
    assert plan.gpus[0].kv_budget_bytes / GIB == pytest.approx(published_kv_gib, abs=0.3)


def test_hf_model_id() -> None:
    assert hf_model_id(find_model("llama-3.1-8b")) == "meta-llama/Llama-3.1-8B"
    arch = find_model("llama-3.1-8b").model_copy(update={"source": "https://example.com/config.json"})
    assert hf_model_id(arch) is None
    plan = vllm_plan(arch, A100, 1, max_model_len=4096, max_num_seqs=16)
    assert "'<Hugging Face id of Llama 3.1 8B>'" in plan.command


def test_vllm_refuses_what_it_cannot_run() -> None:
    with pytest.raises(EstimateError, match="not on Apple"):
        vllm_plan(find_model("llama-3.1-8b"), find_device("m2-ultra-192gb"), 1, max_model_len=4096, max_num_seqs=16)
    with pytest.raises(EstimateError, match="Mamba"):
        vllm_plan(find_model("mamba-2.8b"), A100, 1, max_model_len=4096, max_num_seqs=16)
    with pytest.raises(EstimateError, match="KV cache dtype"):
        vllm_plan(find_model("llama-3.1-8b"), A100, 1, max_model_len=4096, max_num_seqs=16, kv_cache_dtype="int4")
    with pytest.raises(EstimateError, match="max_num_batched_tokens"):
        vllm_plan(find_model("llama-3.1-8b"), A100, 1, max_model_len=4096, max_num_seqs=4096)
