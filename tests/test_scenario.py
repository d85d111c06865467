"""The window's numbers without Qt: hardware resolution, the plain-words verdict, the curves and
the ladder agree with the estimator; saved preferences survive bad files."""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path

import pytest

from app.core.common.errors import CatalogError, EstimateError
from app.core.common.units import GIB
from app.core.hardware.snapshots import GpuSnapshot, HostSnapshot
from app.core.memory.estimate import estimate
from app.core.memory.records import MAX_CONTEXT_TOKENS
from app.core.model.catalog import find_device
from app.core.model.quant import find_preset, quality_words, quantize_layout
from app.core.model.source import model_from_catalog
from app.core.report.choices import (
    Controls,
    HardwareChoice,
    Machine,
    ModelChoice,
    match_catalog_device,
    resolve_targets,
)
from app.core.report.prefs import SCHEMA_VERSION, Preferences, load_preferences, save_preferences
from app.core.speed.model import load_speed_model
from app.core.speed.predict import UNCHECKED_USERS_EVIDENCE, USERS_UNCHECKED
from app.services.view import Evaluator, Request, context_grid

HOST = HostSnapshot(
    cpu_model="AMD Ryzen 9 7950X",
    physical_cores=16,
    logical_cores=32,
    ram_total_bytes=64 * GIB,
    ram_available_bytes=48 * GIB,
    cpu_flags=("avx2", "avx512f", "fma", "f16c"),
    measured_read_bandwidth_gb_s=62.0,
    timestamp=time.time(),
)


def gpu(free_gib: float, total_gib: float = 24.0, name: str = "NVIDIA GeForce RTX 4090") -> GpuSnapshot:
    total = int(total_gib * GIB)
    free = int(free_gib * GIB)
    return GpuSnapshot(
        index=0,
        name=name,
        memory_total_bytes=total,
        memory_used_bytes=total - free,
        memory_free_bytes=free,
        bandwidth_gb_s=1008.0,
        timestamp=time.time(),
    )


def view_of(model: ModelChoice, hardware: HardwareChoice, controls: Controls | None = None, machine=None, **kw):
    request = Request(model, hardware, controls or Controls(), machine or Machine(host=HOST), **kw)
    return Evaluator().evaluate(request)


LLAMA_8B = ModelChoice(kind="catalog", ref="llama-3.1-8b", quant="Q4_K_M")


def test_nvml_names_match_the_catalog():
    assert match_catalog_device("NVIDIA GeForce RTX 4090").id == "rtx-4090"
    assert match_catalog_device("NVIDIA GeForce RTX 4060 Ti", 16 * GIB).id == "rtx-4060-ti-16gb"
    assert match_catalog_device("NVIDIA A100-SXM4-80GB", 80 * GIB).id == "a100-80gb"
    assert match_catalog_device("NVIDIA A100-SXM4-40GB", 40 * GIB).id == "a100-40gb"
    assert match_catalog_device("NVIDIA H100 80GB HBM3", 80 * GIB).id.startswith("h100")
    assert match_catalog_device("NVIDIA H100 PCIe", 80 * GIB).id == "h100-pcie"
    assert match_catalog_device("NVIDIA L40S").id == "l40s"
    assert match_catalog_device("NVIDIA L40").id == "l40"
    assert match_catalog_device("Tesla T4").id == "t4"
    assert match_catalog_device("NVIDIA GeForce RTX 3060", 12 * GIB).id == "rtx-3060-12gb"
    assert match_catalog_device("Some Future GPU") is None


def test_local_gpu_capacity_is_its_free_memory_and_catalog_counts_make_several_gpus():
    machine = Machine(gpus=(gpu(free_gib=20.0),), host=HOST)
    targets = resolve_targets(HardwareChoice(), machine)
    assert [t.kind for t in targets] == ["gpu", "cpu"]
    assert targets[0].capacity_bytes == 20 * GIB
    assert targets[0].fp16_tflops == find_device("rtx-4090").fp16_tflops  # from the catalog match
    assert targets[1].capacity_bytes == 64 * GIB
    assert targets[1].bandwidth_gb_s == 62.0  # this machine's host: its measured bandwidth
    two = resolve_targets(HardwareChoice(kind="catalog", device_id="rtx-3090", count=2, host_ram_gib=32), machine)
    assert [t.name for t in two][:2] == ["NVIDIA GeForce RTX 3090 #1", "NVIDIA GeForce RTX 3090 #2"]
    assert two[2].name.startswith("Host RAM (DDR5") and two[2].efficiency_class == "host-spec"
    assert two[2].capacity_bytes == 32 * GIB
    # A host we have not measured: the chosen memory's spec-sheet peak (2 x 8 bytes x 5600 MT/s).
    assert two[2].bandwidth_gb_s == 89.6
    epyc = resolve_targets(
        HardwareChoice(kind="catalog", device_id="rtx-3090", host_ram_gib=512, host_memory="ddr5-6000-12ch"), machine
    )
    assert epyc[1].bandwidth_gb_s == 576.0 and "12 channels" in epyc[1].name
    cpu = resolve_targets(HardwareChoice(kind="cpu"), machine)
    assert [t.kind for t in cpu] == ["cpu"] and cpu[0].bandwidth_gb_s == 62.0
    with pytest.raises(CatalogError):
        resolve_targets(HardwareChoice(kind="catalog", device_id="rtx-9999"), machine)


def test_apple_unified_memory_is_split_between_gpu_and_host():
    (gpu_t, host_t) = resolve_targets(HardwareChoice(kind="catalog", device_id="m3-max-128gb"), Machine(host=HOST))
    spec = find_device("m3-max-128gb")
    assert gpu_t.capacity_bytes == spec.capacity_bytes
    assert gpu_t.capacity_bytes + host_t.capacity_bytes == int(spec.memory_gib * GIB)


def test_green_verdict_has_the_estimators_headroom_and_shares():
    hw = HardwareChoice(kind="catalog", device_id="rtx-4090")
    view = view_of(LLAMA_8B, hw, Controls(context_per_user_tokens=8192))
    d = view.estimate.devices[0]
    assert view.verdict.level == "green"
    assert view.verdict.headline == f"Fits, with {(d.capacity_bytes - d.total_bytes) / GIB:,.1f} GiB to spare."
    weights_share = round(100 * d.weights_bytes / d.capacity_bytes)
    kv_share = round(100 * d.kv_cache_bytes / d.capacity_bytes)
    assert f"The model itself takes {weights_share}% of the memory" in view.verdict.text
    assert f"remembering the conversation (8,192 tokens) takes {kv_share}%" in view.verdict.text
    lo, hi = view.speed.decode_tokens_per_s.low, view.speed.decode_tokens_per_s.high
    # Words a second first, the tokens after them.
    assert f"Expect about {lo * 0.75:,.0f}-{hi * 0.75:,.0f} words a second ({lo:,.0f}-{hi:,.0f} tokens/s)" in (
        view.verdict.text
    )


def test_amber_when_under_ten_percent_is_left():
    # Llama 3.1 8B Q8_0 at 32k context on a 12 GB RTX 3060: find a context that leaves under 10%.
    model = ModelChoice(kind="catalog", ref="llama-3.1-8b", quant="Q6_K")
    hw = HardwareChoice(kind="catalog", device_id="rtx-3060-12gb")
    # The largest context with every layer asked for (no margin kept) leaves under 10%.
    limit = view_of(model, hw, Controls(context_per_user_tokens=4096, gpu_layers=33)).largest_context_per_user_tokens
    # Every layer asked for: it fits, with under 10% (and under llama.cpp's 1 GiB margin) left.
    tight = view_of(model, hw, Controls(context_per_user_tokens=limit, gpu_layers=33))
    d = tight.estimate.devices[0]
    assert d.fits and d.capacity_bytes - d.total_bytes < 0.1 * d.capacity_bytes
    assert tight.verdict.level == "amber" and tight.verdict.headline.startswith("Fits, but only just")
    # "auto" follows llama.cpp's --fit, which keeps 1 GiB free: some layers move to system memory.
    auto = view_of(model, hw, Controls(context_per_user_tokens=limit))
    gpu = auto.estimate.devices[0]
    assert gpu.capacity_bytes - gpu.total_bytes >= 1024**3 and auto.estimate.gpu_layers < 33
    assert auto.verdict.headline.startswith("Runs partly in system memory, at about ")
    # Layers as the model card counts them, the output layer said apart; the flags in the details.
    layers = auto.estimate.gpu_layers
    assert f"{layers} of the model's 32 layers are on the graphics card; the other {32 - layers} and the output " in (
        auto.verdict.headline
    )
    assert "--" not in auto.verdict.text
    assert any("keeping 1 GiB free" in t and f"-ngl {layers}" in t for t in auto.verdict.technical)


def test_auto_gpu_layers_fall_back_to_the_cpu_when_the_gpu_is_busy():
    # 0.3 GiB free: not even the buffers a CUDA build keeps on GPU 0 at -ngl 0 (the output head's
    # copy and its logits) fit, so the only run is on the CPU with the GPU hidden.
    machine = Machine(gpus=(gpu(free_gib=0.3),), host=HOST)
    view = view_of(ModelChoice(kind="catalog", ref="llama-3.2-1b"), HardwareChoice(), machine=machine)
    assert view.estimate.fits and view.estimate.gpu_layers == 0
    assert [d.kind for d in view.estimate.devices] == ["cpu"] and view.estimate.backend == "cpu"
    assert view.verdict.level == "amber" and view.verdict.headline.startswith("Runs on the processor only")
    assert any("--device none" in t for t in view.verdict.technical)
    # With 2 GiB free the GPU can keep those buffers, though not the whole model with a 1 GiB margin.
    roomier = Machine(gpus=(gpu(free_gib=2.2),), host=HOST)
    view = view_of(ModelChoice(kind="catalog", ref="llama-3.2-1b"), HardwareChoice(), machine=roomier)
    assert view.estimate.fits and view.estimate.devices[0].kind == "gpu"
    assert view.estimate.devices[0].compute_bytes > 0


def test_red_verdict_suggests_a_context_or_quantization_that_fits():
    hw = HardwareChoice(kind="catalog", device_id="rtx-4090", host_ram_gib=32)
    model = ModelChoice(kind="catalog", ref="llama-3.1-70b", quant="Q4_K_M")
    view = view_of(model, hw, Controls(context_per_user_tokens=8192, gpu_layers=81))
    assert view.verdict.level == "red" and view.verdict.headline.startswith("Does not fit:")
    fitting = [r for r in view.ladder if r.fits]
    assert fitting, "some 2-bit preset fits 24 GiB"
    on_gpu = [r for r in fitting if r.placement == "gpu"]
    assert on_gpu, "some 2-bit preset fits 24 GiB on the GPU"
    best = max(on_gpu, key=lambda r: r.budget_bytes)
    assert f"A smaller quantization, {best.preset}, fits on the GPU at this context (" in view.verdict.text
    # The quality cost in words beside the preset: a 2-bit preset is "much worse".
    assert quality_words(best.ppl_increase) in view.verdict.text
    # With "auto" layers the ladder says which rows run partly in system memory, with their speed,
    # and no smaller preset is shown as fitting where a larger one is not (no CPU-build repack).
    view = view_of(model, hw, Controls(context_per_user_tokens=8192))
    partial = [r for r in view.ladder if r.placement == "partial"]
    assert partial and all("runs partly in system memory at" in r.placement_words for r in partial)
    q4_0 = next(r for r in view.ladder if r.preset == "Q4_0")
    q4_1 = next(r for r in view.ladder if r.preset == "Q4_1")
    assert q4_0.budget_bytes < q4_1.budget_bytes and (q4_0.fits or not q4_1.fits)


def test_impossible_settings_are_explained():
    view = view_of(LLAMA_8B, HardwareChoice(kind="cpu"), Controls(flash_attn=False, cache_type_v="q8_0"))
    assert view.estimate is None and view.verdict.level == "red"
    assert "needs flash attention" in view.error
    huge = view_of(LLAMA_8B, HardwareChoice(kind="cpu"), Controls(context_per_user_tokens=MAX_CONTEXT_TOKENS, users=2))
    assert "far beyond what Llama 3.1 8B was trained for" in huge.error and huge.estimate is None


def test_context_curve_and_largest_context_agree_with_the_estimator():
    hw = HardwareChoice(kind="catalog", device_id="rtx-4090")
    view = view_of(LLAMA_8B, hw, Controls(context_per_user_tokens=8192))
    model = model_from_catalog("llama-3.1-8b", "Q4_K_M")
    targets = resolve_targets(hw, Machine(host=HOST))
    settings = Controls(context_per_user_tokens=8192).settings("x86-avx512")
    curve = view.context_curve
    assert curve.contexts[0] == 512 and curve.contexts[-1] == 131072
    i = curve.contexts.index(16384)
    est = estimate(model.arch, model.tensors, settings.model_copy(update={"context_tokens": 16384}), targets)
    gpu_dev = est.devices[0]
    assert curve.kv_cache_bytes[i] == gpu_dev.kv_cache_bytes
    assert (
        curve.weights_bytes[i] + curve.kv_cache_bytes[i] + curve.compute_bytes[i] + curve.overhead_bytes[i]
        == gpu_dev.total_bytes
    )
    # The largest context per user keeps every layer on the GPU with llama.cpp's 1 GiB margin free.
    limit = view.largest_context_per_user_tokens
    assert curve.max_context_tokens == limit > 8192

    def free_gpu(n: int) -> int:
        s = settings.model_copy(update={"context_tokens": n})
        return estimate(model.arch, model.tensors, s, targets).devices[0].free_bytes

    assert free_gpu(limit) >= GIB
    assert limit == model.arch.n_ctx_train or free_gpu(limit + 256) < GIB
    # Four users each get less: their caches share the same GPU.
    four = view_of(LLAMA_8B, hw, Controls(context_per_user_tokens=8192, users=4))
    per_user = four.largest_context_per_user_tokens
    assert 8192 < per_user < limit

    def free_gpu_4(n: int) -> int:
        s = Controls(context_per_user_tokens=n, users=4).settings("x86-avx512")
        return estimate(model.arch, model.tensors, s, targets).devices[0].free_bytes

    assert free_gpu_4(per_user) >= GIB > free_gpu_4(per_user + 256)


def test_ladder_rows_are_the_presets_own_estimates():
    hw = HardwareChoice(kind="catalog", device_id="rtx-4090")
    view = view_of(LLAMA_8B, hw, Controls(context_per_user_tokens=8192))
    model = model_from_catalog("llama-3.1-8b", "Q4_K_M")
    targets = resolve_targets(hw, Machine(host=HOST))
    q8 = next(r for r in view.ladder if r.preset == "Q8_0")
    tensors = quantize_layout(model.arch, find_preset("Q8_0"))
    est = estimate(model.arch, tensors, Controls(context_per_user_tokens=8192).settings("x86-avx512"), targets)
    assert q8.budget_bytes == est.devices[0].total_bytes and q8.fits
    assert [r.budget_bytes for r in view.ladder] == sorted(r.budget_bytes for r in view.ladder)
    assert sum(r.current for r in view.ladder) == 1


def test_users_share_llama_cpp_context_and_concurrency_curve_is_monotonic():
    hw = HardwareChoice(kind="catalog", device_id="rtx-4090")
    view = view_of(LLAMA_8B, hw, Controls(context_per_user_tokens=4096, users=4))
    assert view.estimate.settings.context_tokens == 16384 and view.estimate.settings.parallel_sequences == 4
    users = view.concurrency.users
    assert all(a >= b for a, b in zip(users, users[1:], strict=False))
    assert view.users_that_fit >= 4
    # The same count whatever number of users is chosen (it is counted, not read off the choice).
    for users in (1, view.users_that_fit, view.users_that_fit + 3):
        again = view_of(LLAMA_8B, hw, Controls(context_per_user_tokens=4096, users=users))
        assert again.users_that_fit == view.users_that_fit


def test_comparison_rows_carry_memory_fit_speed_and_price():
    view = view_of(
        LLAMA_8B,
        HardwareChoice(kind="catalog", device_id="rtx-4090"),
        compare=(HardwareChoice(kind="catalog", device_id="rtx-3060-12gb"), HardwareChoice(kind="cpu")),
    )
    gpu_row, cpu_row = view.comparison
    current = view.current
    assert current.label == "RTX 4090 PC (current)"  # a machine as a buyer says it, the price beside it
    assert current.decode_tokens_per_s == view.speed.decode_tokens_per_s
    # A whole computer's price: the card's and the desktop around it, as the advisor prices it.
    from app.core.advisor.configs import machine_price

    card = find_device("rtx-3060-12gb")
    assert gpu_row.fits and gpu_row.price_usd == machine_price(card).total_usd > card.price_usd
    assert gpu_row.price_kind == "PC" and f"${card.price_usd:,.0f} card" in gpu_row.price_note
    assert cpu_row.gpu_layers is None and cpu_row.price_usd is None
    assert gpu_row.decode_tokens_per_s.high > cpu_row.decode_tokens_per_s.high


def test_context_grid_is_log_spaced_from_512_to_the_trained_context():
    grid = context_grid(131072)
    assert grid[0] == 512 and grid[-1] == 131072 and len(grid) == 33
    assert context_grid(300) == (512, 512) or context_grid(300)[0] == 512


def test_a_bad_model_choice_raises_a_readable_error(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"nope")
    with pytest.raises(Exception, match="x.gguf"):
        Evaluator().evaluate(Request(ModelChoice(kind="gguf", ref=str(bad)), HardwareChoice(), Controls(), Machine()))


def test_view_portable_drops_tensors_only():
    view = view_of(LLAMA_8B, HardwareChoice(kind="cpu"))
    light = view.portable()
    assert light.model.tensors == () and light.model.arch == view.model.arch
    assert light.estimate == view.estimate and light.verdict == view.verdict


# -- preferences ---------------------------------------------------------------------------------


def test_preferences_round_trip(tmp_path):
    path = tmp_path / "cfg" / "settings.json"
    prefs = Preferences(
        hardware=HardwareChoice(kind="catalog", device_id="l40s", count=2),
        model=ModelChoice(kind="catalog", ref="qwen3-8b", quant="Q5_K_M"),
        controls=Controls(context_per_user_tokens=20480, users=3, cache_type_k="q8_0"),
        presentation=True,
    )
    save_preferences(prefs, path)
    assert load_preferences(path) == (prefs, "")
    assert json.loads(path.read_text())["schema_version"] == SCHEMA_VERSION


@pytest.mark.parametrize(
    "content",
    ["{not json", "[]", '{"schema_version": 99}', '{"schema_version": 1, "controls": {"users": 0}}'],
    ids=["not-json", "not-object", "newer-schema", "invalid-value"],
)
def test_unreadable_preferences_give_defaults_and_a_reason(tmp_path, content):
    path = tmp_path / "settings.json"
    path.write_text(content)
    prefs, note = load_preferences(path)
    assert prefs == Preferences()
    assert note.startswith("Your saved settings could not be read")
    assert not path.exists() and path.with_name("settings.json.bad").exists()


def test_estimate_error_is_a_fitscope_error():
    with pytest.raises(EstimateError):
        Controls(context_per_user_tokens=MAX_CONTEXT_TOKENS, users=2).settings()


def test_settings_live_in_the_platform_config_folder(monkeypatch, tmp_path):
    from app.adapters.paths import preferences_path

    monkeypatch.delenv("FITSCOPE_CONFIG_DIR", raising=False)
    monkeypatch.setattr("sys.platform", "linux")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert preferences_path() == tmp_path / "xdg" / "fitscope" / "settings.json"
    monkeypatch.setenv("FITSCOPE_CONFIG_DIR", str(tmp_path / "portable"))
    assert preferences_path() == tmp_path / "portable" / "settings.json"


def test_a_measured_efficiency_replaces_the_prior_and_says_so():
    hw = HardwareChoice(kind="cpu")
    machine = Machine(host=HOST)
    target = resolve_targets(hw, machine)[0].name
    prior = view_of(LLAMA_8B, hw, machine=machine)
    measured = Evaluator().evaluate(Request(LLAMA_8B, hw, Controls(), machine, measured_efficiency=((target, 0.35),)))
    lo = prior.speed.decode_tokens_per_s.low
    mlo, mhi = measured.speed.decode_tokens_per_s.low, measured.speed.decode_tokens_per_s.high
    assert mhi < lo  # 0.35 of the roofline is below the CPU prior's 0.70-0.90
    assert mhi / mlo == pytest.approx(1.1 / 0.9, rel=0.05)  # +-10% around the measurement
    assert any("measured on this machine" in a for a in measured.assumptions)
    assert f"{mlo:,.1f}" in measured.verdict.text or f"{mlo:,.0f}" in measured.verdict.text


def test_a_cpu_whose_arithmetic_dominates_is_not_quoted_to_a_few_percent():
    """On this machine's CPU the weights are read at 0.70-0.90 of its measured bandwidth, and the fixed
    and arithmetic cost per token comes from constants fitted on published CPUs: the decode range
    carries that cost's held-out spread as well. On one thread Llama 3.1 8B's arithmetic outweighs its
    read, and the range is as wide as the published CPUs' spread, not the bandwidth's alone."""
    hw = HardwareChoice(kind="cpu")

    def decode(threads):
        view = view_of(LLAMA_8B, hw, Controls(threads=threads))
        return view.speed.decode_tokens_per_s, view.assumptions

    (one, words), (all_cores, _) = decode(1), decode(None)
    bandwidth_only = 0.90 / 0.70
    assert one.high / one.low > 1.5 > bandwidth_only
    # With every core the read dominates again and the range narrows toward the bandwidth's.
    assert bandwidth_only <= all_cores.high / all_cores.low < one.high / one.low
    assert any("the fixed and arithmetic cost x0." in a for a in words)


def test_several_users_slow_each_other_as_published_microbatches_do():
    """N users share a decode step: the weights are read once, the matrix products carry N rows. A
    published llama-bench run at -ub 1 to 8 (tests/data/multi_user_decode.json: an RTX 3090, Llama 3
    8B Q4_0, flash attention) measured what N rows cost per token: at 8 rows each token took 2.1 times
    as long as alone. The estimate's per-user decode falls with the users within 20% of those ratios
    (each further row's cost is fitted on published runs of several rows, this one among them; with
    the single-row constants alone the 8-user ratio was 0.64 where 0.47 was measured), and the single
    row and the 8 rows' per-token rate fall inside its ranges."""
    for run in json.loads((Path(__file__).parent / "data" / "multi_user_decode.json").read_text()):
        published = {int(n): v for n, v in run["tokens_per_s_by_rows"].items()}
        model = ModelChoice(kind="catalog", ref=run["model"], quant=run["quant"])
        hw = HardwareChoice(kind="catalog", device_id=run["device"])
        speeds = {n: view_of(model, hw, Controls(users=n, context_per_user_tokens=512)).speed for n in published}
        for n, tokens_per_s in published.items():
            predicted = speeds[n].decode_typical / speeds[1].decode_typical
            measured = tokens_per_s / n / published[1]
            assert abs(math.log(predicted / measured)) < 0.2, (n, predicted, measured)
        for n in (1, max(published)):
            r = speeds[n].decode_tokens_per_s
            assert r.low <= published[n] / n <= r.high, (n, r)


def test_several_users_on_builds_no_published_run_checks_are_told_it_may_be_slower():
    """Each further user's token costs the GPU arithmetic fitted on published runs of 1-8 rows per step
    (tests/data/microbatch_runs.json, scripts/fit_rows.py), which check it on CUDA and ROCm builds; the
    Metal runs of one source (an M1 Pro and an M2 Ultra) give Metal's own constant, and no run is
    published for Vulkan or SYCL builds. Several users on a Mac or an Intel GPU are told so; on CUDA and
    ROCm builds, or for one user, they are not. The figures the statement gives are the data's: the
    held-out median error on CUDA and ROCm, and on Metal each chip predicted from the other's."""
    small = ModelChoice(kind="catalog", ref="llama-3.2-1b", quant="Q4_0")

    def lines(device_id, users):
        hw = HardwareChoice(kind="catalog", device_id=device_id)
        view = view_of(small, hw, Controls(users=users, context_per_user_tokens=512))
        return [a for a in view.assumptions if a.startswith("Several users:")]

    for device_id, users in (("m1-pro-32gb", 4), ("arc-b580", 2)):
        said = lines(device_id, users)
        assert len(said) == 1 and "may be lower" in said[0], (device_id, said)
    for device_id, users in (("rtx-3090", 4), ("ryzen-ai-max-395-128gb", 8), ("rtx-pro-6000", 2), ("mi300x", 8)):
        said = lines(device_id, users)
        assert len(said) == 1 and "may be lower" not in said[0] and "FLOP per parameter" in said[0], device_id
    assert lines("m1-pro-32gb", 1) == [] and lines("arc-b580", 1) == []
    # A CPU computes every user's row itself: no GPU shader rate is claimed for it.
    cpu = lines("epyc-9655", 4)
    assert len(cpu) == 1 and "shader" not in cpu[0] and "on the CPU" in cpu[0]
    from tests.rows_data import held_out, points, usable_tables

    # The builds the published runs check are the ones the estimate does not warn for.
    assert {t["backend"].lower() for t in usable_tables()} == {"cuda", "rocm", "metal"}
    assert USERS_UNCHECKED.isdisjoint({"cuda", "rocm"}) and {"metal", "vulkan", "sycl"} <= USERS_UNCHECKED
    found = points()
    checked = [e for p, e in held_out(found) if not p.build]
    assert f"within {100 * (math.exp(statistics.median(abs(e) for e in checked)) - 1):.0f}% of them" in (
        UNCHECKED_USERS_EVIDENCE
    )
    # Metal's constant rests on one source: each of its two chips predicted from the other's.
    metal = [e for p, e in held_out(found, by="device") if p.build == "metal"]
    assert len({p.source for p in found if p.build == "metal"}) == 1
    assert f"within {100 * (math.exp(statistics.median(abs(e) for e in metal)) - 1):.0f}% of the estimate" in (
        UNCHECKED_USERS_EVIDENCE
    )
    assert max(metal) > math.log(1.25) and f"up to {math.exp(max(metal)):.1f} times as slow" in UNCHECKED_USERS_EVIDENCE


def test_several_users_of_a_mixture_of_experts_read_every_expert_any_of_them_routes_to():
    """One token of Qwen3-30B-A3B reads 8 of each layer's 128 experts; four users' conversations route
    apart, so a step of their four tokens reads 1 - (120/128)^4 of them, 3.6 times as many expert bytes,
    and each user gets less than the dense part alone would suggest. A published run of 2 and 4 rows of
    one prompt (Gemma 4 26B-A4B on an RTX 3090: a prompt's tokens share more experts than users do) ran
    no slower per token than the estimate for that many users."""
    from app.core.memory.layers import tensor_totals
    from app.core.speed.reads import placement
    from tests.rows_data import points

    model = model_from_catalog("qwen3-30b-a3b", "Q4_K_M")
    hw = HardwareChoice(kind="catalog", device_id="rtx-4090")
    view = view_of(ModelChoice(kind="catalog", ref="qwen3-30b-a3b", quant="Q4_K_M"), hw, Controls(users=4))
    est = view.estimate
    one = placement(model.arch, model.tensors, est, 1).bytes_per_token[0]
    four = placement(model.arch, model.tensors, est, 1, rows=4).bytes_per_token[0]
    totals = tensor_totals(model.arch, model.tensors)
    experts_one = sum(totals.active_expert_bytes)
    experts_four = sum(totals.expert_bytes) * (1 - (120 / 128) ** 4)
    assert four - one == pytest.approx(experts_four - experts_one, rel=0.01)
    assert experts_four / experts_one == pytest.approx(3.64, abs=0.01)
    gemma = [p for p in points() if p.model.startswith("gemma4")]
    assert {p.rows for p in gemma} == {2, 4}
    k = load_speed_model().decode_row_flop_per_param
    assert all(p.predicted(k) <= p.measured for p in gemma)


def test_quality_in_words_follows_the_published_perplexity_order():
    from app.core.model.quant import find_preset

    words = {name: quality_words(find_preset(name).ppl_increase) for name in ("Q8_0", "Q4_K_M", "Q3_K_M", "Q2_K")}
    assert words == {
        "Q8_0": "practically the same quality",
        "Q4_K_M": "slightly worse quality",
        "Q3_K_M": "noticeably worse quality",
        "Q2_K": "much worse quality",
    }
    assert quality_words(None) == "quality loss not published"


def test_a_mac_says_how_much_of_its_memory_the_gpu_may_use():
    view = view_of(LLAMA_8B, HardwareChoice(kind="catalog", device_id="m2-ultra-192gb"), Controls())
    assert "macOS lets the GPU use 144 of the 192 GiB by default" in view.verdict.text
    assert "iogpu.wired_limit_mb" in view.verdict.text
    pc = view_of(LLAMA_8B, HardwareChoice(kind="catalog", device_id="rtx-4090"), Controls())
    assert "macOS" not in pc.verdict.text
