"""Live runs with the real llama.cpp in a child process: figures, llama.cpp's buffers against the
estimate, stop, bad models, the history, and the headless commands."""

from __future__ import annotations

import hashlib
import json
import threading
import time

import psutil
import pytest

from app.adapters.child_protocol import Token
from app.adapters.history import RunHistory
from app.adapters.host import detect_host
from app.adapters.llamacpp_runner import RunError, run_live
from app.core.memory.targets import cpu_target, repack_profile
from app.core.model.source import model_from_gguf
from app.core.report.run_vs_estimate import compare_buffers, estimate_for_run
from app.core.speed.measure import RunSettings, summary
from tests.support.tiny_gguf import TINY_PROMPT, write_tiny_llama

pytestmark = pytest.mark.llamacpp
MIB = 1024**2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf", n_layer=4, n_embd=128, n_ff=256)


def cpu_run_estimate(result, path):
    model = model_from_gguf(path)
    host = detect_host(measure_bandwidth=False)
    targets = [cpu_target(host)]
    return estimate_for_run(result, model.arch, model.tensors, targets, repack_profile(host))


def test_a_run_reports_every_figure_and_llama_cpp_buffers_match_the_estimate(tiny):
    events = []
    settings = RunSettings(
        gguf_path=str(tiny), prompt=TINY_PROMPT, max_tokens=24, repeat=2, ignore_eos=True, context_tokens=512
    )
    result = run_live(settings, on_event=events.append)
    assert [r.generated_tokens for r in result.runs] == [24, 24]
    first = result.runs[0]
    assert first.prompt_tokens == 36  # the tiny tokenizer: BOS + one token per word and mark
    assert 0 < first.ttft_s < 5 and first.prefill_tokens_per_s_wall > 0 and first.decode_tokens_per_s_wall > 0
    assert first.prefill_tokens_per_s_llama > 0 and first.decode_tokens_per_s_llama > 0
    assert first.itl_p50_s <= first.itl_p95_s
    assert len(first.token_times_s) == 24 and list(first.token_times_s) == sorted(first.token_times_s)
    assert sum(isinstance(e, Token) for e in events) == 48
    assert result.load_s > 0 and result.peak_rss_bytes > 10 * MIB
    assert result.model_sha256 == hashlib.sha256(tiny.read_bytes()).hexdigest()
    assert result.llama_cpp_version == "0.3.36"
    # llama.cpp's own report against the estimator for the same file and settings.
    run_est = cpu_run_estimate(result, tiny)
    rows = {c.buffer: c for c in compare_buffers(result, run_est.estimate)}
    assert rows["kv_cache"].measured_bytes == rows["kv_cache"].estimated_bytes
    assert abs(rows["weights"].difference_bytes) < 0.01 * MIB
    # The compute model is exact on real shapes (see the demo test below); on this 4-layer,
    # 128-wide toy ggml's allocator keeps about 1.1 MiB more than the modelled peak.
    assert 0 <= rows["compute"].difference_bytes < 1.5 * MIB
    assert run_est.efficiency is not None and run_est.efficiency[1] > 0


def test_bench_mode_uses_llama_bench_definitions(tiny):
    settings = RunSettings(gguf_path=str(tiny), mode="bench", prompt_tokens=128, max_tokens=32, ignore_eos=True)
    result = run_live(settings)
    run = result.runs[0]
    assert run.prompt_tokens == 128 and run.generated_tokens == 32
    assert run.prefill_tokens_per_s_llama > 0 and run.decode_tokens_per_s_llama > 0
    stats = summary(result)
    assert stats["decode_tokens_per_s"].median == pytest.approx(run.decode_tokens_per_s_llama)


def test_stop_ends_a_run_within_a_second_and_leaves_no_process(demo_gguf):
    # The demo model decodes at tens of tokens/s here: 1,500 tokens would take most of a minute.
    settings = RunSettings(
        gguf_path=str(demo_gguf), prompt="Once upon a time", max_tokens=1500, ignore_eos=True, context_tokens=2048
    )
    holder = {}
    first_token = threading.Event()

    def on_event(event):
        if isinstance(event, Token):
            first_token.set()

    def stop_soon():
        first_token.wait(30)
        holder["asked"] = time.perf_counter()
        holder["live"].stop()

    threading.Thread(target=stop_soon, daemon=True).start()
    result = run_live(settings, on_event=on_event, on_start=lambda live: holder.setdefault("live", live))
    elapsed = time.perf_counter() - holder["asked"]
    assert elapsed < 1.5
    assert result.runs[-1].stopped
    assert 0 < result.runs[-1].generated_tokens < 200
    assert not psutil.pid_exists(holder["live"].pid) or psutil.Process(holder["live"].pid).status() == "zombie"


def test_a_file_llama_cpp_cannot_load_gives_its_reason(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 64)
    with pytest.raises(RunError, match="broken.gguf") as info:
        run_live(RunSettings(gguf_path=str(bad)))
    assert "could not load" in str(info.value) or "stopped while loading" in str(info.value)
    with pytest.raises(RunError, match="does not exist"):
        run_live(RunSettings(gguf_path=str(tmp_path / "missing.gguf")))


def test_a_prompt_longer_than_the_context_is_refused_clearly(tiny):
    settings = RunSettings(gguf_path=str(tiny), prompt_tokens=400, max_tokens=200, context_tokens=256)
    with pytest.raises(RunError, match="need a context of 600"):
        run_live(settings)


def test_fitscope_bench_json_on_a_tiny_model(tiny, capsys):
    from app.cli import main

    code = main(["bench", "--gguf", str(tiny), "-p", "64", "-n", "16", "--repeat", "2", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["mode"] == "bench" and len(report["runs"]) == 2
    for key in ("ttft_s", "prefill_tokens_per_s", "decode_tokens_per_s", "peak_rss_bytes", "load_s"):
        assert report[key] is not None and report[key] > 0
    assert report["estimate"]["kv_cache_bytes"] == sum(report["measured_buffers"]["kv_buffers"].values())
    rows = RunHistory().rows()
    assert rows[0].run_id == report["history_id"] and rows[0].mode == "bench"


def test_demo_model_end_to_end(demo_gguf, capsys):
    """The real demo model: figures plausible, buffers parsed and equal to the estimate, history kept."""
    from app.cli import main

    code = main(
        [
            "run",
            "--gguf",
            str(demo_gguf),
            "-p",
            "The capital of France is",
            "-n",
            "24",
            "--repeat",
            "1",
            "-c",
            "2048",
            "--json",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert 0 < report["ttft_s"] < 10
    # A real decode speed (its expected range is the benchmarks' business: this one holds on a busy machine).
    assert 0.1 < report["decode_tokens_per_s"] < 5000
    assert report["peak_rss_bytes"] > 200 * MIB  # the mapped weights alone are 235 MiB
    by_kind = {c["buffer"]: c for c in report["comparison"]}
    assert by_kind["weights"]["measured_bytes"] == pytest.approx(235.16 * MIB, abs=0.01 * MIB)
    for kind in ("weights", "kv_cache", "compute", "output"):
        assert abs(by_kind[kind]["difference_bytes"]) < 0.02 * MIB, kind
    saved, estimate = RunHistory().get(report["history_id"])
    assert (
        saved.model_sha256 == report["model_sha256"]
        and estimate["kv_cache_bytes"] == by_kind["kv_cache"]["estimated_bytes"]
    )


def test_a_model_path_relative_to_the_working_folder_runs_whatever_that_folder_holds(tiny, tmp_path, monkeypatch):
    (tmp_path / "model.gguf").write_bytes(tiny.read_bytes())
    # A folder of the user's own named like FitScope's package must not stand in for it.
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text("raise SystemExit('not FitScope')\n")
    monkeypatch.chdir(tmp_path)
    result = run_live(RunSettings(gguf_path="model.gguf", prompt=TINY_PROMPT, max_tokens=4, context_tokens=256))
    assert result.runs[0].generated_tokens > 0 and result.settings.gguf_path == "model.gguf"


def test_a_cpu_run_on_a_machine_with_gpus_calibrates_that_machine(tiny, monkeypatch, capsys):
    # `fitscope run` on the CPU of a machine with an NVIDIA GPU keeps its efficiency under the
    # machine's own key (its CPU and GPUs), where the window looks for it.
    from app.adapters.cpu_topology import llama_math_threads
    from app.cli.parser import build_parser
    from app.cli.runs import _report_run
    from app.core.hardware.snapshots import GpuSnapshot, machine_key
    from app.core.report.choices import Machine

    gpu = GpuSnapshot(
        index=0,
        name="NVIDIA GeForce RTX 4090",
        memory_total_bytes=24_564 * MIB,
        memory_used_bytes=512 * MIB,
        memory_free_bytes=24_052 * MIB,
        timestamp=time.time(),
    )
    machine = Machine(gpus=(gpu,), host=detect_host(measure_bandwidth=False))
    monkeypatch.setattr("app.adapters.host.measure_read_bandwidth_gb_s", lambda budget_s=0.3: 20.0)
    result = run_live(RunSettings(gguf_path=str(tiny), prompt=TINY_PROMPT, max_tokens=8, context_tokens=256))
    args = build_parser().parse_args(["run", "--gguf", str(tiny), "--json"])
    assert _report_run(args, result, machine, None) == 0
    report = json.loads(capsys.readouterr().out)
    target = report["measured_efficiency"]["target"]
    assert target
    with RunHistory() as history:
        found = history.efficiencies(machine_key(machine.host, machine.gpus), llama_math_threads())
    # Kept under the machine's key when nothing disturbed the run; a disturbed run calibrates nothing.
    assert report["calibrates"] == ("disturbed" not in report) == (target in found)
    if target in found:
        assert found[target] == pytest.approx(report["measured_efficiency"]["value"])
