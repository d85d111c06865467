"""Measurements use llama.cpp's own thread defaults (llama-server / llama-bench), say which threads
they ran with, and only those with llama-server's count calibrate later estimates."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.adapters.cpu_topology import linux_math_threads, llama_math_threads, with_llama_threads
from app.adapters.llamacpp_runner import LiveLoaded, run_live, sweep_threads
from app.core.model.source import model_from_gguf
from app.core.report.run_vs_estimate import make_run_report
from app.core.speed.llama_defaults import choose_threads, thread_sweep
from app.core.speed.measure import RunSettings, sweep_rows
from tests.support.tiny_gguf import TINY_PROMPT, write_tiny_llama
from tests.test_runner import cpu_run_estimate


def _sysfs(root: Path, siblings: list[str]) -> Path:
    """A fake /sys/devices/system/cpu: one thread_siblings mask per logical CPU."""
    for cpu, mask in enumerate(siblings):
        topo = root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "thread_siblings").write_text(mask + "\n")
    return root


def test_physical_cores_are_counted_once_per_sibling_set(tmp_path):
    # 4 cores with SMT: CPUs 0/4, 1/5, 2/6, 3/7 share a core, as Linux numbers them.
    masks = ["11", "22", "44", "88", "11", "22", "44", "88"]
    sys_cpu = _sysfs(tmp_path / "cpu", masks)
    assert linux_math_threads(sys_cpu, tmp_path / "absent") == 4


def test_a_hybrid_cpu_counts_only_its_performance_cores(tmp_path):
    # 2 P-cores with SMT (CPUs 0-3) and 4 E-cores (4-7), as on a hybrid Intel laptop.
    masks = ["3", "3", "c", "c", "10", "20", "40", "80"]
    sys_cpu = _sysfs(tmp_path / "cpu", masks)
    (tmp_path / "cpus").write_text("0-3\n")
    assert linux_math_threads(sys_cpu, tmp_path / "cpus") == 2
    assert linux_math_threads(sys_cpu, tmp_path / "absent") == 6


def test_the_choice_says_whether_it_is_llama_servers():
    default = choose_threads(None, 8)
    assert default.n_threads == 8 and default.is_llama_default and not default.user_set
    assert default.describe() == "8 threads (like llama-server)"
    one = choose_threads(1, 8)
    assert one.n_threads == 1 and not one.is_llama_default
    assert one.describe() == "1 thread (llama-server would use 8)"
    with pytest.raises(ValueError):
        choose_threads(0, 8)


def test_the_sweep_covers_one_to_the_physical_cores_and_the_logical_cpus():
    assert thread_sweep(2, 2) == (1, 2)
    assert thread_sweep(16, 32) == (1, 2, 4, 8, 16, 32)
    assert thread_sweep(6, 12) == (1, 2, 4, 6, 12)
    assert thread_sweep(1, 1) == (1,)


def test_unset_threads_become_llama_servers_and_set_ones_stay():
    unset = RunSettings(gguf_path="x.gguf")
    assert with_llama_threads(unset).n_threads == llama_math_threads()
    assert with_llama_threads(unset.model_copy(update={"n_threads": 1})).n_threads == 1


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf", n_layer=4, n_embd=128, n_ff=256)


def _report(result, path):
    model = model_from_gguf(path)
    return make_run_report(result, model.label, cpu_run_estimate(result, path)).to_json()


@pytest.mark.llamacpp
def test_a_run_with_no_thread_option_uses_llama_servers_count_and_calibrates(tiny):
    settings = RunSettings(gguf_path=str(tiny), prompt=TINY_PROMPT, max_tokens=16, ignore_eos=True, context_tokens=512)
    result = run_live(settings)
    # llama.cpp itself reports the threads of the context it made.
    assert result.n_threads_used == llama_math_threads() == result.settings.n_threads
    assert result.threads is not None and result.threads.is_llama_default
    report = _report(result, tiny)
    assert report["threads"]["n_threads"] == llama_math_threads()
    assert report["threads"]["like_llama_server"] is True
    assert report["measured_efficiency"]["n_threads"] == llama_math_threads()
    # llama-server's threads never stop it calibrating (a disturbed run may, for its own reason).
    assert "thread" not in report.get("calibration_note", "")
    assert report["calibrates"] == ("disturbed" not in report)


@pytest.mark.llamacpp
def test_a_run_with_other_threads_is_shown_but_does_not_calibrate(tiny):
    other = 1 if llama_math_threads() != 1 else 2
    settings = RunSettings(
        gguf_path=str(tiny), prompt=TINY_PROMPT, max_tokens=16, ignore_eos=True, context_tokens=512, n_threads=other
    )
    result = run_live(settings)
    assert result.n_threads_used == other
    report = _report(result, tiny)
    assert report["threads"]["like_llama_server"] is False
    assert "measured_efficiency" not in report
    assert report["uncalibrated_efficiency"]["value"] > 0
    assert f"{other} thread" in report["calibration_note"]


@pytest.mark.llamacpp
def test_a_bench_sweep_runs_once_per_count_and_marks_the_peaks(tiny):
    settings = RunSettings(gguf_path=str(tiny), mode="bench", prompt_tokens=64, max_tokens=16, ignore_eos=True)
    counts = thread_sweep(llama_math_threads(), 1)
    seen: list[int] = []
    results = sweep_threads(settings, counts, on_event=lambda e: isinstance(e, LiveLoaded) and seen.append(e.threads))
    assert seen == list(counts)
    rows = sweep_rows(results)
    assert [r.n_threads for r in rows] == list(counts)
    assert all(r.prefill_tokens_per_s and r.decode_tokens_per_s for r in rows)
    assert sum(r.best_decode for r in rows) == 1 and sum(r.best_prefill for r in rows) == 1
    best = max(rows, key=lambda r: r.decode_tokens_per_s or 0)
    assert best.best_decode
