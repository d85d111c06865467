"""llama.cpp's own quantizer through FitScope: variants made from a higher-precision file, with
progress, the estimator's figures for the result, cancel and bad input."""

from __future__ import annotations

import pytest

from app.adapters.quantizer import QuantizeError, default_variant_path, quantize
from app.core.model.gguf_model import read_gguf
from app.core.model.quant import find_preset, quantize_layout
from app.core.model.source import model_from_gguf
from tests.support.tiny_gguf import write_tiny_llama

pytestmark = pytest.mark.llamacpp


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    # 256-wide rows so that k-quants (blocks of 256) apply without fallbacks.
    return write_tiny_llama(tmp_path_factory.mktemp("q") / "tiny-F32.gguf", n_layer=4, n_embd=256, n_ff=512)


@pytest.mark.parametrize("preset, ftype", [("Q8_0", 7), ("Q4_K_M", 15), ("Q4_0", 2)])
def test_variants_have_the_preset_and_the_estimators_size(source, preset, ftype):
    progress = []
    out = quantize(
        source, default_variant_path(source, preset), preset, on_progress=lambda d, n: progress.append((d, n))
    )
    assert out.name == f"tiny-{preset}.gguf"
    g = read_gguf(out)
    assert g.file_type == ftype
    total = progress[-1][1]
    assert progress[-1] == (total, total) and total == len(g.tensors)
    model = model_from_gguf(out)
    assert model.quant == preset
    # The estimator's port of llama.cpp's quantizer rules predicts every tensor's type.
    predicted = {t.name: t.ggml_type for t in quantize_layout(model.arch, find_preset(preset))}
    assert predicted == {t.name: t.ggml_type for t in g.tensors}
    assert sum(t.n_bytes for t in g.tensors) < sum(t.n_bytes for t in read_gguf(source).tensors)


def test_cancel_removes_the_partial_file(source, tmp_path):
    target = tmp_path / "cancelled.gguf"

    def on_start(job):
        job.cancel()  # at once: the child is killed before it writes much

    with pytest.raises(QuantizeError, match="cancelled"):
        quantize(source, target, "Q8_0", on_start=on_start)
    assert not target.exists()


def test_bad_input_is_refused_clearly(tmp_path, source):
    with pytest.raises(QuantizeError, match="does not exist"):
        quantize(tmp_path / "missing.gguf", tmp_path / "x.gguf", "Q8_0")
    with pytest.raises(QuantizeError, match="must not replace its source"):
        quantize(source, source, "Q8_0")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model")
    # A file llama.cpp cannot load reads as it does in the Run tab.
    with pytest.raises(QuantizeError, match="junk.gguf: llama.cpp could not load it: invalid magic characters"):
        quantize(junk, tmp_path / "junk-Q8_0.gguf", "Q8_0")
    assert not (tmp_path / "junk-Q8_0.gguf").exists()


def test_default_names_replace_a_known_quant_suffix():
    assert default_variant_path("/m/llama-8b-F16.gguf", "Q4_K_M").name == "llama-8b-Q4_K_M.gguf"
    assert default_variant_path("/m/model.gguf", "Q8_0").name == "model-Q8_0.gguf"
