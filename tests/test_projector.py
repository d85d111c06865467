"""Vision projectors (--mmproj): the estimate against llama.cpp's mtmd, and the projector as a user
meets it in the CLI, the JSON and the window.

The llamacpp-marked tests load sparse synthetic projector files (tests/support/synthetic_mmproj.py)
with the real mtmd in a child process (app/adapters/projector_probe.py). Weights are exact to the
byte; compute buffers are held to the bounds measured on this release:
exact (llama.cpp prints 0.01 MiB) for Gemma 3's real shapes, within 2% for Pixtral / Ministral 3.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app import cli
from app.core.common.errors import CatalogError, ModelFileError
from app.core.memory.estimate import estimate
from app.core.memory.records import Settings, Target
from app.core.memory.targets import host_ram_target
from app.core.model.catalog import find_model, find_projector, load_projectors
from app.core.model.gguf_model import read_gguf
from app.core.model.projector import estimate_projector, spec_from_layout
from app.core.model.projector_file import read_projector
from app.core.model.projector_layout import mmproj_facts, projector_tensors
from app.core.model.quant import quantize_layout
from tests.support.synthetic_gguf import write_sparse_gguf
from tests.support.synthetic_mmproj import write_sparse_mmproj

MIB = 1024**2
GIB = 1024**3
PRINT_PRECISION = round(0.005 * MIB)  # one "%.2f MiB" figure


# -- catalog -------------------------------------------------------------------------------------


QWEN_VISION = {
    "qwen3.5-0.8b",
    "qwen3.5-27b",
    "qwen3.6-27b",
    "qwen3.5-35b-a3b",
    "qwen3.6-35b-a3b",
    "qwen3.5-122b-a10b",
    "qwen3.5-397b-a17b",
}


def test_catalog_projectors_are_the_vision_models_with_their_published_weights() -> None:
    ids = {p.model_id for p in load_projectors()}
    gemma, others = {"gemma-3-4b", "gemma-3-12b", "gemma-3-27b", "gemma-4-26b-a4b", "gemma-4-31b"}, {"ministral-3-8b"}
    assert ids == gemma | others | QWEN_VISION | {"kimi-k2.5", "kimi-k2.6"}
    for p in load_projectors():
        assert p.source.startswith("https://huggingface.co/") and p.source.endswith("/config.json")
        assert p.n_embd_text == find_model(p.model_id).n_embd
    # The F16 mmproj files people download: 851 MB for Gemma 3 4B (811.79 MiB, as mtmd prints it).
    assert find_projector("gemma-3-4b").spec().weights_bytes == 851_226_048
    assert find_projector("ministral-3-8b").spec().weights_bytes == 857_063_424
    # Qwen3.5: 27 SigLIP-2-sized layers with biases, two F16 patch kernels, F32 positions, the 2x2 merger.
    assert find_projector("qwen3.5-27b").spec().weights_bytes == 927_587_264
    assert find_projector("qwen3.5-35b-a3b").spec().weights_bytes == 899_263_424
    assert find_projector("qwen3.5-0.8b").spec().weights_bytes == 204_977_152
    # Gemma 4: a 2 x 10,240-entry F32 position table (94 MB) beside 27 layers of 1152.
    assert find_projector("gemma-4-31b").spec().weights_bytes == 1_198_934_208
    assert find_projector("gemma-4-26b-a4b").spec().weights_bytes == 1_193_035_968
    # Kimi K2.5 / K2.6: MoonViT's 27 layers with biases, a 64 x 64 F32 position grid, the 2x2 merger into 7168.
    assert find_projector("kimi-k2.5").spec().weights_bytes == 952_552_384
    assert find_projector("llama-3.1-8b") is None


def _collected_configs() -> list[tuple[str, dict]]:
    folder = Path(__file__).parent / "data" / "model_configs"
    records = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.json"))]
    return [(r["id"], r["config"]) for r in records if "vision_config" in r["config"]]


@pytest.mark.parametrize(("model_id", "config"), _collected_configs(), ids=[c[0] for c in _collected_configs()])
def test_a_catalog_projector_is_what_the_converter_reads_from_its_config(model_id: str, config: dict) -> None:
    facts = mmproj_facts(config)
    entry = find_projector(model_id)
    if facts is None:  # a vision encoder whose layout FitScope does not know yet: no catalog projector
        assert entry is None
        return
    assert entry is not None, f"{model_id} reads images but has no catalog projector"
    assert entry.projector_type == facts.projector_type
    assert entry.spec().shape == facts.shape and entry.image_max_pixels == facts.image_max_pixels


def test_a_projector_for_the_wrong_model_is_refused_on_load(tmp_path: Path) -> None:
    entry = find_projector("gemma-3-4b").model_dump() | {"n_embd_text": 4096}
    bad = tmp_path / "projectors.json"
    bad.write_text(json.dumps([entry]))
    from app.core.model.catalog import load_projectors as load

    with pytest.raises(CatalogError, match="outputs width 4096, but Gemma 3 4B takes 2560"):
        load.__wrapped__(bad)


# -- the estimate --------------------------------------------------------------------------------


def test_gemma3_projector_figures() -> None:
    p = estimate_projector(find_projector("gemma-3-4b").spec(), flash_attn=True)
    assert p.compute_bytes == p.warmup_compute_bytes == 127_139_840  # 121.25 MiB, as llama.cpp reserves
    assert p.total_bytes == 851_226_048 + 127_139_840
    # Without flash attention the 4096 x 4096 x 16 attention scores dominate: 1132 MiB.
    assert estimate_projector(find_projector("gemma-3-4b").spec(), flash_attn=False).compute_bytes == 1_186_988_032
    assert p.spec.image_tokens == 256


def test_pixtral_counts_the_largest_image_not_only_the_warm_up() -> None:
    p = estimate_projector(find_projector("ministral-3-8b").spec(), flash_attn=True)
    assert p.spec.warmup_image_size == 448 and p.spec.max_image == (896, 896)
    assert p.warmup_compute_bytes < p.compute_bytes
    assert p.compute_bytes == 272_629_760  # 260 MiB for a 1024-token image
    assert any("grows it to 260.0 MiB" in a for a in p.assumptions)


def test_qwen3vl_reserves_for_46_tokens_a_side_and_grows_to_4096_tokens() -> None:
    p = estimate_projector(find_projector("qwen3.5-27b").spec(), flash_attn=True)
    assert p.spec.warmup_image_size == 1472 and p.spec.max_image == (2048, 2048) and p.spec.image_tokens == 4096
    assert p.warmup_compute_bytes == 260_149_504  # 248.10 MiB, as llama.cpp reserves at load
    # A 2048 x 2048 image: 16,384 patches, the image, 7 activations and the positions (480.2 MiB).
    assert p.compute_bytes == 503_578_624
    # Without flash attention the 16,384 x 16,384 x 16 scores alone are 16 GiB.
    off = estimate_projector(find_projector("qwen3.5-27b").spec(), flash_attn=False)
    assert off.compute_bytes > 16 * GIB and off.warmup_compute_bytes == 4_884_066_560  # 4657.81 MiB


def test_gemma4_reserves_for_256_tokens_and_grows_to_1120() -> None:
    p = estimate_projector(find_projector("gemma-4-31b").spec(), flash_attn=True)
    # 16 x 16 tokens of 3 x 3 patches of 16 px at load; at most 1120 tokens, 35 x 32 of them.
    assert p.spec.warmup_image_size == 768 and p.spec.max_image == (1680, 1536) and p.spec.image_tokens == 1120
    assert p.warmup_compute_bytes == 157_943_808  # 150.63 MiB, as llama.cpp reserves at load
    # 10,080 patches: gate, up and their product (3 x 165.5 MiB) beside three activations and the image.
    assert p.compute_bytes == 691_004_160  # 659.0 MiB
    off = estimate_projector(find_projector("gemma-4-31b").spec(), flash_attn=False)
    assert off.warmup_compute_bytes == 399_919_104 and off.compute_bytes > 6 * GIB  # 381.39 MiB; 6.3 GiB


def test_kimi_k25_warms_up_with_its_largest_image() -> None:
    p = estimate_projector(find_projector("kimi-k2.5").spec(), flash_attn=True)
    # 16,384 patches of 14 px (in_patch_limit): a 1792 x 1792 image, 4096 tokens, at load already.
    assert p.spec.warmup_image_size == 1792 and p.spec.max_image == (1792, 1792) and p.spec.image_tokens == 4096
    assert p.compute_bytes == p.warmup_compute_bytes == 491_651_072  # 468.88 MiB, as llama.cpp reserves
    off = estimate_projector(find_projector("kimi-k2.5").spec(), flash_attn=False)
    assert off.compute_bytes == off.warmup_compute_bytes > 16 * GIB  # 16,384^2 x 16 heads of scores


def test_a_file_with_an_audio_encoder_is_labelled_approximate() -> None:
    # Gemma 4 E2B / E4B files hold an audio encoder too: mtmd gives it a context and a buffer of its own.
    spec = find_projector("gemma-4-31b").spec().model_copy(update={"has_audio_encoder": True})
    p = estimate_projector(spec)
    assert p.approximate and not estimate_projector(find_projector("gemma-4-31b").spec()).approximate
    assert any("audio encoder" in a for a in p.assumptions)


def _gemma(**update) -> tuple:
    arch = find_model("gemma-3-4b")
    return arch, quantize_layout(arch, "Q4_K_M")


def test_the_projector_goes_on_the_first_gpu_and_the_total_grows_by_it() -> None:
    arch, tensors = _gemma()
    spec = find_projector("gemma-3-4b").spec()
    gpu = Target(name="GPU", kind="gpu", capacity_bytes=8 * GIB, bandwidth_gb_s=272, fp16_tflops=15)
    targets = [gpu, host_ram_target(32 * GIB)]
    plain = estimate(arch, tensors, Settings(backend="cuda"), targets)
    with_vision = estimate(arch, tensors, Settings(backend="cuda", mmproj=spec), targets)
    extra = estimate_projector(spec).total_bytes
    assert with_vision.total_bytes - plain.total_bytes == extra
    assert with_vision.devices[0].projector_bytes == extra and with_vision.projector_device == 0
    assert with_vision.devices[0].total_bytes - plain.devices[0].total_bytes == extra
    # --no-mmproj-offload, or a CPU build: host memory.
    off = estimate(arch, tensors, Settings(backend="cuda", mmproj=spec, mmproj_offload=False), targets)
    assert off.devices[-1].projector_bytes == extra and off.devices[0].projector_bytes == 0


def test_a_model_that_fits_can_stop_fitting_with_its_projector() -> None:
    arch, tensors = _gemma()
    spec = find_projector("gemma-3-4b").spec()
    host = host_ram_target(64 * GIB)
    need = (
        estimate(
            arch,
            tensors,
            Settings(backend="cuda"),
            [Target(name="GPU", kind="gpu", capacity_bytes=64 * GIB, bandwidth_gb_s=272, fp16_tflops=15), host],
        )
        .devices[0]
        .total_bytes
    )
    gpu = Target(name="GPU", kind="gpu", capacity_bytes=need + 512 * MIB, bandwidth_gb_s=272, fp16_tflops=15)
    assert estimate(arch, tensors, Settings(backend="cuda"), [gpu, host]).fits
    est = estimate(arch, tensors, Settings(backend="cuda", mmproj=spec), [gpu, host])
    assert not est.fits and -est.devices[0].free_bytes == estimate_projector(spec).total_bytes - 512 * MIB


# -- files ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma_mmproj(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("mmproj") / "mmproj-gemma-3-4b-f16.gguf"
    write_sparse_mmproj(path, find_projector("gemma-3-4b").spec())
    return path


def test_a_projector_file_is_read_exactly(gemma_mmproj: Path) -> None:
    spec = read_projector(gemma_mmproj)
    catalog = find_projector("gemma-3-4b").spec()
    assert spec.weights_bytes == catalog.weights_bytes == 851_226_048
    assert (spec.projector_type, spec.n_embd_text, spec.n_merge, spec.n_layer) == ("gemma3", 2560, 4, 27)
    assert estimate_projector(spec).compute_bytes == estimate_projector(catalog).compute_bytes
    with pytest.raises(ModelFileError, match="is a vision projector"):
        read_gguf(gemma_mmproj)


def test_a_text_model_is_not_a_projector(tmp_path: Path) -> None:
    path = tmp_path / "text.gguf"
    write_sparse_gguf(path, find_model("gemma-3-270m"), "Q4_K_M")
    with pytest.raises(ModelFileError, match="not a vision projector"):
        read_projector(path)


# -- the CLI -------------------------------------------------------------------------------------


def _run(capsys, *argv: str):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out) if "--json" in argv else out


BASE = ("estimate", "--model", "gemma-3-4b", "--gpu", "rtx-4060", "--host-ram-gib", "32", "-c", "8192")


def test_cli_json_has_the_projector_and_the_total_grows_by_it(capsys) -> None:
    plain = _run(capsys, *BASE, "--json")
    vision = _run(capsys, *BASE, "--projector", "--json")
    assert plain["projector_bytes"] == 0 and plain["projector"] is None
    p = vision["projector"]
    assert vision["projector_bytes"] == p["total_bytes"] == p["weights_bytes"] + p["compute_bytes"]
    assert p["weights_bytes"] == 851_226_048 and p["device"] == vision["devices"][0]["name"]
    assert vision["devices"][0]["projector_bytes"] == p["total_bytes"]
    assert vision["total_bytes"] - plain["total_bytes"] == p["total_bytes"]
    assert "--mmproj mmproj-gemma-3-4b-f16.gguf" in vision["llama_server_command"]


def test_cli_adds_the_qwen35_projector_to_the_first_gpu(capsys) -> None:
    argv = ("estimate", "--model", "qwen3.5-27b", "--gpu", "rtx-4090", "--host-ram-gib", "64", "-c", "8192")
    plain, vision = _run(capsys, *argv, "--json"), _run(capsys, *argv, "--projector", "--json")
    p = vision["projector"]
    assert (p["weights_bytes"], p["compute_bytes"]) == (927_587_264, 503_578_624)  # 884.6 + 480.2 MiB
    assert vision["devices"][0]["projector_bytes"] == p["total_bytes"]
    assert vision["total_bytes"] - plain["total_bytes"] == p["total_bytes"]
    assert "--mmproj mmproj-qwen3.5-27b-f16.gguf" in vision["llama_server_command"]


def test_cli_text_shows_a_vision_column_and_line(capsys, gemma_mmproj: Path) -> None:
    out = _run(capsys, *BASE, "--mmproj", str(gemma_mmproj))
    assert " vision " in out.splitlines()[2]
    assert "Vision projector (" in out and "933 MiB = weights 812 MiB + compute 121 MiB" in out
    assert f"--mmproj {gemma_mmproj}" in out


def test_cli_refuses_a_projector_of_another_model(capsys, gemma_mmproj: Path) -> None:
    rc = cli.main(["estimate", "--model", "ministral-3-8b", "--cpu", "--mmproj", str(gemma_mmproj)])
    _out, err = capsys.readouterr()
    assert rc == 2 and "outputs width 2560, but" in err and "takes 4096" in err
    rc = cli.main(["estimate", "--model", "llama-3.1-8b", "--cpu", "--projector"])
    _out, err = capsys.readouterr()
    assert rc == 2 and "has no vision projector" in err


# -- the window ----------------------------------------------------------------------------------


def test_window_includes_the_projector_as_its_own_segment(qtbot, tmp_path) -> None:
    from app.core.report.choices import HardwareChoice, ModelChoice
    from tests.test_window import make_services, open_window, settle

    window = open_window(qtbot, make_services(tmp_path))
    window.choose_hardware(HardwareChoice(kind="catalog", device_id="rtx-4060", host_ram_gib=32))
    window.choose_model(ModelChoice(kind="catalog", ref="gemma-3-4b", quant="Q4_K_M"))
    before = settle(qtbot, window, lambda v: v.request.model.ref == "gemma-3-4b" and v.estimate is not None)
    assert window.vision_check.isEnabled() and not window.vision_check.isChecked()
    window.vision_check.setChecked(True)
    view = settle(qtbot, window, lambda v: v.request.controls.projector is not None)
    extra = estimate_projector(find_projector("gemma-3-4b").spec()).total_bytes
    gpu = view.estimate.devices[0]
    assert gpu.projector_bytes == extra
    assert gpu.total_bytes - before.estimate.devices[0].total_bytes == extra
    bar = window.split_chart.shown[0]
    assert bar.projector_bytes == extra
    assert float(window.split_chart.bars["projector"].opts["height"][0]) == pytest.approx(extra / GIB)
    header = [
        window.breakdown_table.horizontalHeaderItem(i).text() for i in range(window.breakdown_table.columnCount())
    ]
    col = header.index("Vision projector")
    assert window.breakdown_table.item(0, col).text() == f"{extra / GIB:.2f}"
    assert "--mmproj" in window.command_text.toPlainText()
    # A text-only model has no projector to include.
    window.choose_model(ModelChoice(kind="catalog", ref="llama-3.2-3b", quant="Q4_K_M"))
    view = settle(qtbot, window, lambda v: v.request.model.ref == "llama-3.2-3b")
    assert view.request.controls.projector is None and not window.vision_check.isEnabled()


# -- proof against llama.cpp ---------------------------------------------------------------------


PROOF = [
    # (label, catalog projector or shape overrides, flash attention, compute tolerance in bytes or fraction)
    ("gemma-3-4b fa", "gemma-3-4b", {}, True, PRINT_PRECISION),
    ("gemma-3-4b no-fa", "gemma-3-4b", {}, False, PRINT_PRECISION),
    ("gemma-3-27b fa", "gemma-3-27b", {}, True, PRINT_PRECISION),
    ("gemma3 448px", "gemma-3-4b", {"image_size": 448, "n_layer": 2}, True, PRINT_PRECISION),
    ("ministral-3-8b fa", "ministral-3-8b", {}, True, 0.02),
    ("ministral-3-8b no-fa", "ministral-3-8b", {}, False, 0.02),
    # spatial merge 4: the warm-up is the 4096-patch graph of Ministral 3's largest image.
    ("pixtral 4096 patches", "ministral-3-8b", {"n_merge": 4, "n_layer": 2}, True, 0.02),
    ("qwen3.5-27b fa", "qwen3.5-27b", {}, True, PRINT_PRECISION),
    ("qwen3.5-27b no-fa", "qwen3.5-27b", {}, False, PRINT_PRECISION),
    ("qwen3.5-0.8b fa", "qwen3.5-0.8b", {}, True, PRINT_PRECISION),
    ("qwen3.5-0.8b no-fa", "qwen3.5-0.8b", {}, False, PRINT_PRECISION),
    # An encoder narrower than the image's hole: an activation fits where the image was, the FFN peaks.
    ("qwen3vl width 640", "qwen3.5-27b", {"n_embd": 640, "n_head": 10, "n_layer": 2}, True, PRINT_PRECISION),
    ("qwen3vl width 2048 no-fa", "qwen3.5-27b", {"n_embd": 2048, "n_head": 2, "n_layer": 2}, False, PRINT_PRECISION),
    # Merge 3 only enlarges the warm-up image (2208 px, 19,044 patches, beyond the 16,384 of the largest
    # image): clip.cpp's graph merges 2x2 whatever the file says, so the file keeps the 2x2 merger.
    ("qwen3vl 19044 patches", "qwen3.5-27b", {"n_merge": 3, "n_layer": 2}, True, PRINT_PRECISION),
    ("gemma-4-31b fa", "gemma-4-31b", {}, True, PRINT_PRECISION),
    ("gemma-4-31b no-fa", "gemma-4-31b", {}, False, PRINT_PRECISION),
    ("gemma-4-26b-a4b fa", "gemma-4-26b-a4b", {}, True, PRINT_PRECISION),
    # Pooling 6: 9,216 patches, near the 10,080 of Gemma 4's largest image.
    ("gemma4v 9216 patches", "gemma-4-31b", {"n_merge": 6, "n_layer": 2}, True, PRINT_PRECISION),
    ("kimi-k2.5 fa", "kimi-k2.5", {}, True, PRINT_PRECISION),
    # Two heads keep the scores of 16,384 patches to 2 GiB.
    ("kimi-k2.5 no-fa, 2 heads", "kimi-k2.5", {"n_head": 2, "n_layer": 2}, False, PRINT_PRECISION),
    # 4,096 patches: the image is the position grid itself, nothing interpolated.
    ("kimik25 896 px", "kimi-k2.5", {"image_max_pixels": 4096 * 14 * 14, "n_layer": 2}, True, PRINT_PRECISION),
    ("kimik25 width 512", "kimi-k2.5", {"n_embd": 512, "n_head": 8, "n_ff": 1024, "n_layer": 2}, True, PRINT_PRECISION),
    # A narrow encoder whose activation fits where the image was, attention larger than the FFN.
    (
        "gemma4v width 768, narrow FFN",
        "gemma-4-31b",
        {"n_embd": 768, "n_head": 8, "n_ff": 256, "n_layer": 2},
        True,
        PRINT_PRECISION,
    ),
]


@pytest.fixture(scope="module")
def text_models(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("text")
    out = {}
    for model_id in (
        "gemma-3-4b",
        "gemma-3-27b",
        "ministral-3-8b",
        "qwen3.5-27b",
        "qwen3.5-0.8b",
        "gemma-4-31b",
        "gemma-4-26b-a4b",
        "kimi-k2.5",
    ):
        out[model_id] = folder / f"{model_id}.gguf"
        # mtmd looks Kimi's image tokens up in the text model's vocabulary: that one needs one.
        write_sparse_gguf(out[model_id], find_model(model_id), "Q4_K_M", tokenizer=model_id.startswith("kimi"))
    return out


@pytest.mark.llamacpp
@pytest.mark.parametrize(("label", "model_id", "update", "flash_attn", "tolerance"), PROOF, ids=[p[0] for p in PROOF])
def test_projector_estimate_matches_llama_cpp(label, model_id, update, flash_attn, tolerance, text_models, tmp_path):
    from app.adapters.projector_probe import measure_projector

    entry = find_projector(model_id).model_dump() | update
    entry.pop("model_id"), entry.pop("notes")
    spec = spec_from_layout(file_name="x.gguf", **entry)
    path = tmp_path / "mmproj.gguf"
    tensors = None
    if spec.projector_type == "qwen3vl_merger" and spec.n_merge != 2:
        tensors = projector_tensors(spec.projector_type, spec.shape._replace(n_merge=2))
    write_sparse_mmproj(path, spec, tensors)
    spec = read_projector(path)  # what `fitscope estimate --mmproj` reads
    measured = measure_projector(path, text_models[model_id], flash_attn=flash_attn)
    est = estimate_projector(spec, flash_attn=flash_attn)
    assert measured.flash_attn_enabled == flash_attn and measured.warmup_image_size == spec.warmup_image_size
    # Weights: llama.cpp's own ggml_nbytes, summed, to the byte; and its printed figure agrees.
    assert est.weights_bytes == measured.model_size_bytes
    assert abs(measured.model_size_printed_bytes - est.weights_bytes) <= PRINT_PRECISION
    bound = tolerance if isinstance(tolerance, int) else tolerance * measured.compute_bytes
    shown = f"{label}: estimated {est.warmup_compute_bytes / MIB:.2f} MiB, llama.cpp {measured.compute_bytes / MIB:.2f}"
    assert abs(est.warmup_compute_bytes - measured.compute_bytes) <= bound, shown
    assert est.warmup_compute_bytes >= measured.compute_bytes - PRINT_PRECISION, f"under-estimate: {shown}"


def test_the_projector_file_button_opens_a_dialog_and_loads_the_chosen_file(
    qtbot, tmp_path, gemma_mmproj: Path, monkeypatch
) -> None:
    # The button passed Qt's "checked" flag as the path: the click raised and no dialog opened.
    from PySide6.QtWidgets import QFileDialog

    from app.core.report.choices import HardwareChoice, ModelChoice
    from tests.test_window import make_services, open_window, settle

    asked = []
    monkeypatch.setattr(
        QFileDialog, "getOpenFileName", lambda *a, **k: (asked.append(a[1]) or str(gemma_mmproj), "GGUF files")
    )
    window = open_window(qtbot, make_services(tmp_path))
    window.choose_hardware(HardwareChoice(kind="catalog", device_id="rtx-4060", host_ram_gib=32))
    window.choose_model(ModelChoice(kind="catalog", ref="gemma-3-4b", quant="Q4_K_M"))
    settle(qtbot, window, lambda v: v.request.model.ref == "gemma-3-4b" and v.estimate is not None)
    window.mmproj_button.click()
    assert asked == ["Choose a vision projector"]
    view = settle(qtbot, window, lambda v: v.request.controls.projector is not None)
    assert view.estimate.devices[0].projector_bytes == estimate_projector(read_projector(gemma_mmproj)).total_bytes
