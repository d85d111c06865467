"""The estimator's own behaviour, without llama.cpp: exact figures a user would check by hand."""

from __future__ import annotations

import pytest

from app.core.common.errors import EstimateError
from app.core.common.units import GIB, MIB
from app.core.memory.estimate import estimate
from app.core.memory.limits import max_context_tokens, max_gpu_layers, max_parallel_sequences
from app.core.memory.records import Settings, Target
from app.core.memory.targets import host_ram_target, target_from_device
from app.core.model.catalog import find_device, find_model, load_models
from app.core.model.quant import PRESETS, quantize_layout
from app.core.model.tensors import GGMLType
from app.core.speed.predict import estimate_speed

CPU = Target(name="CPU", kind="cpu", capacity_bytes=64 * GIB, bandwidth_gb_s=50, fp16_tflops=2, efficiency_class="cpu")


def _gpu(device_id: str) -> Target:
    return target_from_device(find_device(device_id))


def test_llama_8b_q4_k_m_on_a_4090() -> None:
    arch = find_model("llama-3.1-8b")
    tensors = quantize_layout(arch, "Q4_K_M")
    est = estimate(arch, tensors, Settings(context_tokens=8192), [_gpu("rtx-4090"), host_ram_target(32 * GIB)])
    # 32 layers x 8 KV heads x 128 dims x (K + V) x 2 bytes x 8192 cells = exactly 1 GiB.
    assert est.kv_cache_bytes == GIB
    # llama-quantize's own figure for this model is 4.58 GiB.
    assert est.weights_bytes / GIB == pytest.approx(4.58, rel=0.01)
    gpu, host = est.devices
    # The token embedding (128256 x 4096 at Q4_K) stays in host memory; everything else on the GPU.
    assert host.weights_bytes == 128256 * 4096 // 256 * 144
    assert gpu.weights_bytes + host.weights_bytes == est.model_bytes
    assert gpu.layers == 32 and est.fits


def test_q4_k_m_mixture_follows_llama_quant() -> None:
    tensors = {t.name: t.ggml_type for t in quantize_layout(find_model("llama-3.1-8b"), "Q4_K_M")}
    assert tensors["output.weight"] == GGMLType.Q6_K
    assert tensors["token_embd.weight"] == GGMLType.Q4_K
    # use_more_bits: first 4 (n/8), last 4 and every third layer in between get Q6_K.
    more = [i for i in range(32) if tensors[f"blk.{i}.ffn_down.weight"] == GGMLType.Q6_K]
    assert more == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert tensors["blk.5.attn_q.weight"] == GGMLType.Q4_K
    assert tensors["blk.5.attn_norm.weight"] == GGMLType.F32


def test_demo_model_types_reproduced_tensor_by_tensor(demo_gguf) -> None:
    from app.core.model.gguf_model import read_gguf

    real = read_gguf(demo_gguf)
    mine = quantize_layout(find_model("gemma-3-270m"), "Q4_K_M")
    assert [(t.name, t.ggml_type, t.shape) for t in mine] == sorted(
        [(t.name, t.ggml_type, t.shape) for t in real.tensors], key=lambda x: [m.name for m in mine].index(x[0])
    )


def test_every_catalog_model_and_preset_estimates() -> None:
    for arch in load_models():
        for preset in ("F16", "Q8_0", "Q4_K_M", "IQ2_XXS"):
            tensors = quantize_layout(arch, preset)
            est = estimate(arch, tensors, Settings(context_tokens=4096), [CPU])
            assert est.weights_bytes > 0 and est.total_bytes > est.weights_bytes, (arch.id, preset)
    assert len(PRESETS) >= 25


def test_smaller_presets_are_smaller() -> None:
    arch = find_model("qwen2.5-7b")
    sizes = [
        sum(t.n_bytes for t in quantize_layout(arch, p))
        for p in ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K")
    ]
    assert sizes == sorted(sizes, reverse=True)


def test_quantized_v_cache_needs_flash_attention() -> None:
    arch = find_model("llama-3.1-8b")
    with pytest.raises(EstimateError, match="flash attention"):
        estimate(arch, quantize_layout(arch, "Q4_K_M"), Settings(flash_attn=False, cache_type_v="q8_0"), [CPU])
    # A quantized K cache alone is allowed, and halves K.
    est = estimate(arch, quantize_layout(arch, "Q4_K_M"), Settings(flash_attn=False, cache_type_k="q8_0"), [CPU])
    assert est.kv_caches[0].k_bytes == est.kv_caches[0].v_bytes * 34 // 64


def test_sliding_window_cache_sizes() -> None:
    arch = find_model("gemma-3-4b")
    tensors = quantize_layout(arch, "Q4_K_M")
    full = estimate(arch, tensors, Settings(context_tokens=32768, swa_full=True), [CPU])
    small = estimate(arch, tensors, Settings(context_tokens=32768, swa_full=False), [CPU])
    kinds = {c.kind: c for c in small.kv_caches}
    assert kinds["full"].layers == 34 // 6 and kinds["swa"].layers == 34 - 34 // 6
    # window 1024 + ubatch 512, padded to 256 -> 1536 cells; full-size mode keeps all 32768.
    assert kinds["swa"].cells == 1536
    assert {c.kind: c for c in full.kv_caches}["swa"].cells == 32768
    assert small.kv_cache_bytes < full.kv_cache_bytes / 4


def test_mla_and_recurrent_caches() -> None:
    ds = find_model("deepseek-v2-lite")
    est = estimate(ds, quantize_layout(ds, "Q4_K_M"), Settings(context_tokens=4096), [CPU])
    # One K-only cache of (512 latent + 64 rope) f16 values per token per layer.
    assert est.kv_cache_bytes == 27 * 4096 * 576 * 2
    mamba = find_model("mamba-2.8b")
    one = estimate(mamba, quantize_layout(mamba, "Q4_K_M"), Settings(context_tokens=4096), [CPU])
    four = estimate(
        mamba, quantize_layout(mamba, "Q4_K_M"), Settings(context_tokens=65536, parallel_sequences=4), [CPU]
    )
    assert one.kv_cache_bytes == 0
    assert four.recurrent_state_bytes == 4 * one.recurrent_state_bytes  # independent of context


def test_parallel_sequences_split_the_context() -> None:
    arch = find_model("llama-3.1-8b")
    t = quantize_layout(arch, "Q4_K_M")
    est = estimate(arch, t, Settings(context_tokens=16384, parallel_sequences=4), [CPU])
    cache = est.kv_caches[0]
    assert (cache.cells, cache.streams) == (4096, 4)
    assert est.output_bytes == 4 * 128256 * 4


def test_two_gpus_split_layers_and_partial_offload() -> None:
    arch = find_model("llama-3.1-70b")
    t = quantize_layout(arch, "Q4_K_M")
    gpus = [_gpu("rtx-4090"), _gpu("rtx-4090")]
    est = estimate(arch, t, Settings(context_tokens=8192), [*gpus, host_ram_target(64 * GIB)])
    a, b, host = est.devices
    # 81 placed layers (the output layer counts as one, on the last GPU) split evenly.
    assert a.layers + b.layers == 80 and abs(a.layers - (b.layers + 1)) <= 1
    assert a.kv_cache_bytes + b.kv_cache_bytes == est.kv_cache_bytes
    assert est.fits
    one = [_gpu("rtx-4090"), host_ram_target(64 * GIB)]
    assert not estimate(arch, t, Settings(context_tokens=8192), one).fits
    n = max_gpu_layers(arch, t, Settings(context_tokens=8192), one)
    assert 0 < n < 80
    partial = estimate(arch, t, Settings(context_tokens=8192, gpu_layers=n), one)
    assert partial.fits and partial.devices[1].layers == 81 - n
    gpu, host = partial.devices
    # A CUDA build: the CPU layers stay memory-mapped (nothing repacked), their matrix products run
    # on the GPU, which copies the largest of those weights into its compute buffer (the FFN
    # projection, 28672 x 8192 in Q6_K on some layers: 180.6 MiB) beside the activations.
    assert partial.backend == "cuda" and host.repack_bytes == 0
    largest_ffn = max(x.n_bytes for x in t if x.layer is not None and x.layer < 81 - n and "ffn" in x.name)
    assert largest_ffn == 28672 * 8192 // 256 * 210
    assert gpu.compute_bytes >= largest_ffn + 512 * (8192 + 28672) * 4
    # The pinned host compute buffer: embeddings, the f16 mask (8192 x 512) and q + attention out.
    assert host.compute_bytes == 512 * 8192 * 4 + 512 * 16 + 8192 * 512 * 2 + 2 * 512 * 8192 * 4


def test_a_cpu_build_repacks_and_a_cuda_build_maps_the_same_layers() -> None:
    arch = find_model("llama-3.1-70b")
    t = quantize_layout(arch, "Q4_K_M")
    one = [_gpu("rtx-4090"), host_ram_target(64 * GIB)]
    s = Settings(context_tokens=8192, gpu_layers=40)
    cuda = estimate(arch, t, s, one)
    cpu_build = estimate(arch, t, s.model_copy(update={"backend": "cpu"}), one)
    assert cuda.backend == "cuda" and cuda.repack_bytes == 0
    assert cpu_build.backend == "cpu" and cpu_build.repack_bytes > 10 * GIB
    assert cuda.devices[1].weights_bytes == cpu_build.devices[1].weights_bytes
    # Without mmap a CPU build loads repacked tensors straight into the repack buffer.
    no_mmap = estimate(arch, t, s.model_copy(update={"backend": "cpu", "mmap": False}), one)
    assert no_mmap.devices[1].weights_bytes == cpu_build.devices[1].weights_bytes - cpu_build.repack_bytes


def test_limits_are_the_edge_of_fitting() -> None:
    arch = find_model("llama-3.1-8b")
    t = quantize_layout(arch, "Q4_K_M")
    targets = [_gpu("rtx-3060-12gb"), host_ram_target(32 * GIB)]
    s = Settings()
    n = max_context_tokens(arch, t, s, targets)
    assert 0 < n < 131072 and n % 256 == 0
    assert estimate(arch, t, s.model_copy(update={"context_tokens": n}), targets).fits
    assert not estimate(arch, t, s.model_copy(update={"context_tokens": n + 256}), targets).fits
    users = max_parallel_sequences(arch, t, s, targets, context_per_user=4096)
    assert users >= 1
    over = s.model_copy(update={"parallel_sequences": users + 1, "context_tokens": 4096 * (users + 1)})
    assert not estimate(arch, t, over, targets).fits


def test_speed_ranges_follow_bandwidth() -> None:
    arch = find_model("llama-3.1-8b")
    t = quantize_layout(arch, "Q4_K_M")
    for device_id in ("rtx-4090", "rtx-3060-12gb"):
        targets = [_gpu(device_id), host_ram_target(32 * GIB)]
        est = estimate(arch, t, Settings(context_tokens=4096), targets)
        speed = estimate_speed(arch, t, est, targets)
        bw = find_device(device_id).bandwidth_gb_s * 1e9
        # The roofline: never above bandwidth / bytes read per token.
        assert speed.decode_tokens_per_s.high < bw / (est.devices[0].weights_bytes)
        assert 0 < speed.decode_tokens_per_s.low < speed.decode_tokens_per_s.high
        assert speed.ttft_s.low < speed.ttft_s.high
    moe = find_model("qwen3-30b-a3b")
    tm = quantize_layout(moe, "Q4_K_M")
    targets = [_gpu("rtx-4090"), host_ram_target(32 * GIB)]
    moe_speed = estimate_speed(moe, tm, estimate(moe, tm, Settings(), targets), targets)
    dense_speed = estimate_speed(arch, t, estimate(arch, t, Settings(), targets), targets)
    # 3B active parameters decode faster than 8B dense, although the file is 4x larger.
    assert moe_speed.decode_tokens_per_s.low > dense_speed.decode_tokens_per_s.low


def test_settings_validation() -> None:
    with pytest.raises(ValueError):
        Settings(context_tokens=0)
    with pytest.raises(ValueError):
        Settings(cache_type_k="q3_k")
    with pytest.raises(EstimateError, match="CPU"):
        estimate(find_model("llama-3.2-1b"), [], Settings(), [_gpu("rtx-4090")])


def test_serving_formats_carry_their_group_overhead() -> None:
    from app.core.model.quant import find_serving_format, serving_weights_bytes

    arch = find_model("llama-3.1-8b")
    fp16 = serving_weights_bytes(arch, find_serving_format("FP16"))
    awq = serving_weights_bytes(arch, find_serving_format("AWQ-4bit"))
    # 8.03B parameters at 16 bits is ~14.96 GiB; AWQ keeps embeddings and head at 16 bits and adds
    # one FP16 scale + 4-bit zero per 128 weights (4.156 bits per weight in linear layers).
    assert fp16 / GIB == pytest.approx(14.96, rel=0.01)
    linear = sum(t.n_elements for t in quantize_layout(arch, "F16") if t.name.startswith("blk.") and len(t.shape) > 1)
    assert awq - (fp16 - linear * 2) == pytest.approx(linear * (4 + 20 / 128) / 8, rel=1e-6)


def test_the_estimate_service_reports_limits() -> None:
    from app.core.model.source import model_from_catalog
    from app.core.report.choices import Controls
    from app.services.estimate import answer

    model = model_from_catalog("llama-3.1-70b", "Q4_K_M")
    targets = [_gpu("rtx-4090"), host_ram_target(128 * GIB)]
    pinned = answer(model, targets, Controls(context_per_user_tokens=8192, gpu_layers="all"), most_gpu_layers=True)
    assert not pinned.fits and pinned.placement == "none"
    assert pinned.limits is not None and 0 < pinned.limits.most_gpu_layers < 81
    data = pinned.to_json()
    assert data["most_gpu_layers"] == pinned.limits.most_gpu_layers
    assert data["compute_bytes"] == sum(d["compute_bytes"] for d in data["devices"])
    # -ngl auto places it as llama-server would: fewer layers than fit with no margin, 1 GiB kept free.
    auto = answer(model, targets, Controls(context_per_user_tokens=8192))
    assert auto.fits and auto.placement == "partial"
    assert auto.gpu_layers < pinned.limits.most_gpu_layers
    assert auto.estimate.devices[0].free_bytes >= GIB


def test_demo_model_repack_matches_a_real_load(demo_gguf) -> None:
    from app.core.memory.targets import cpu_target
    from app.core.model.source import model_from_gguf

    model = model_from_gguf(demo_gguf)
    est = estimate(model.arch, list(model.tensors), Settings(repack="x86-avx2"), [cpu_target(None)])
    # A real (allocating) llama.cpp load of this file prints "CPU_REPACK model buffer size = 12.66 MiB":
    # its 27 Q4_K matrices, copied beside the memory-mapped file.
    assert est.repack_bytes == 12.65625 * MIB
    assert estimate(model.arch, list(model.tensors), Settings(repack="none"), [cpu_target(None)]).repack_bytes == 0
