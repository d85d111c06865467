"""Architectures without proven rules are estimated, and say they are approximate everywhere a
user reads the figures: the verdict, the CLI and the JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from app.core.model.catalog import find_model
from app.core.model.coverage import PROVEN, coverage, coverage_table, llamacpp_architectures
from app.core.model.quant import quantize_layout
from app.core.report.choices import Controls, HardwareChoice, ModelChoice
from tests.support.synthetic_gguf import write_sparse_gguf
from tests.test_scenario import view_of


def _gguf_as(path: Path, arch_name: str) -> Path:
    """Llama 3.2 1B's tensors under another architecture name (a shape llama.cpp's generic rules
    cover, but not proven for that architecture)."""
    base = find_model("llama-3.2-1b")
    tensors = quantize_layout(base, "Q4_K_M")
    write_sparse_gguf(path, base.model_copy(update={"arch": arch_name}), "Q4_K_M", tensors)
    return path


def test_every_proven_architecture_is_one_llama_cpp_loads() -> None:
    version, known = llamacpp_architectures()
    assert version and len(known) > 100
    assert set(PROVEN) <= set(known)
    statuses = {r.arch: r.status for r in coverage_table()}
    assert statuses["falcon-h1"] == "approximate" and statuses["llama"] == "exact"
    assert statuses["granitehybrid"] == "exact" and statuses["gemma3n"] == "exact"
    assert coverage("not-an-architecture").status == "unknown"


def test_catalog_models_are_all_proven() -> None:
    from app.core.model.catalog import load_models

    assert {m.arch for m in load_models()} <= set(PROVEN)


@pytest.fixture(scope="module")
def smol_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _gguf_as(tmp_path_factory.mktemp("arch") / "olmo.gguf", "olmo2")


def test_unproven_architecture_is_labelled_in_json_and_text(smol_gguf: Path, capsys) -> None:
    assert main(["estimate", "--gguf", str(smol_gguf), "-c", "4096", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["architecture"] == "olmo2"
    assert out["rules"] == "approximate" and out["approximate"] is True
    assert any(a.startswith("Approximate: this architecture's rules are not verified") for a in out["assumptions"])

    assert main(["estimate", "--gguf", str(smol_gguf), "-c", "4096"]) == 0
    text = capsys.readouterr().out
    assert "(approximate: this architecture's rules are not verified)" in text


def test_proven_architecture_says_nothing_of_the_kind(tmp_path: Path, capsys) -> None:
    path = _gguf_as(tmp_path / "llama.gguf", "llama")
    assert main(["estimate", "--gguf", str(path), "-c", "4096", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rules"] == "exact" and out["approximate"] is False
    assert not any("pproximate" in a for a in out["assumptions"])


def test_verdict_says_approximate_and_wants_a_wider_margin(smol_gguf: Path, tmp_path: Path) -> None:
    cpu = HardwareChoice(kind="cpu")
    smol = view_of(ModelChoice(kind="gguf", ref=str(smol_gguf)), cpu)
    llama = view_of(ModelChoice(kind="gguf", ref=str(_gguf_as(tmp_path / "l.gguf", "llama"))), cpu)
    assert smol.verdict.sentences[0].startswith("Approximate: FitScope's rules for this architecture (olmo2)")
    assert not any("pproximate" in s for s in llama.verdict.sentences)
    # Same bytes, same hardware: the figures agree but for the compute allowance measured on Llama's
    # graph (an architecture without measurements gets none); the label and the margin differ.
    assert llama.estimate.compute_allowance_bytes > 0 and smol.estimate.compute_allowance_bytes == 0
    assert smol.estimate.total_bytes == llama.estimate.total_bytes - llama.estimate.compute_allowance_bytes


def test_unknown_architecture_says_llama_cpp_cannot_load_it(tmp_path: Path) -> None:
    path = _gguf_as(tmp_path / "odd.gguf", "not-a-real-arch")
    view = view_of(
        ModelChoice(kind="gguf", ref=str(path)), HardwareChoice(kind="cpu"), Controls(context_per_user_tokens=4096)
    )
    assert view.estimate.rules == "unknown"
    assert "cannot load this architecture (not-a-real-arch)" in view.verdict.sentences[0]


@pytest.mark.llamacpp
def test_coverage_report_matches_the_installed_llama_cpp() -> None:
    """The report lists every architecture, and each name is one the installed library holds."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, str(root / "scripts" / "arch_coverage.py")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every name present" in done.stdout
    lines = [line.split() for line in done.stdout.splitlines() if line.strip()]
    exact = {parts[0] for parts in lines if parts[1:3] == ["exact", "(proven)"]}
    assert exact == set(PROVEN)


def _one_model_per_architecture() -> list[str]:
    """A catalog model of each architecture, and the proof's synthetic shapes of architectures without
    a catalog entry (tests.support.proof.TEST_SHAPES)."""
    from app.core.model.catalog import load_models
    from tests.support.proof import TEST_SHAPES

    seen: dict[str, str] = {}
    for m in load_models():
        seen.setdefault(m.arch, m.id)
    return sorted(set(seen.values()) | set(TEST_SHAPES))


@pytest.mark.parametrize("model_id", _one_model_per_architecture())
def test_a_gguf_of_each_proven_architecture_reads_back_to_the_same_estimate(model_id: str, tmp_path: Path) -> None:
    """The file path (a user's GGUF) and the catalog path give the same bytes for every part: the
    reader recovers hybrid layouts, NextN layers, MoE interleaving and short convolutions."""
    from app.core.memory.estimate import estimate
    from app.core.memory.records import Settings
    from app.core.model.gguf_model import read_gguf
    from tests.support.proof import CPU_HOST, architecture_for

    arch = architecture_for(model_id)
    tensors = quantize_layout(arch, "Q4_K_M")
    path = write_sparse_gguf(tmp_path / f"{model_id}.gguf", arch, "Q4_K_M", tensors) and tmp_path / f"{model_id}.gguf"
    model = read_gguf(path)
    settings = Settings(context_tokens=8192, parallel_sequences=2, repack="none")
    a = estimate(arch, tensors, settings, [CPU_HOST])
    b = estimate(model.architecture, list(model.tensors), settings, [CPU_HOST])
    parts = ("model_bytes", "kv_cache_bytes", "recurrent_state_bytes", "compute_bytes", "output_bytes", "total_bytes")
    assert {p: getattr(b, p) for p in parts} == {p: getattr(a, p) for p in parts}
    assert b.rules == "exact"
