from __future__ import annotations

import csv
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from app.adapters import history as history_module
from app.adapters.history import DEFAULT_DB_NAME, SCHEMA_VERSION, HistoryRow, RunHistory, default_history_path
from app.core.common.errors import FitScopeError
from app.core.common.units import MIB
from app.core.speed import measure
from app.core.speed.measure import MeasuredBuffers, RunResult, RunSettings

REPO_ROOT = Path(__file__).resolve().parents[1]
GEMMA_PATH = "/home/me/models/gemma-3-270m-it-Q4_K_M.gguf"
GEMMA_SHA = "3f1c" + "0" * 60
T0 = 1_746_000_000.0  # an afternoon in 2025, seconds since the epoch


def _token_times(ttft_s: float, n: int, tokens_per_s: float) -> list[float]:
    return [ttft_s + i / tokens_per_s for i in range(n)]


def _gemma_run(
    started_at: float = T0,
    decode_tokens_per_s: float = 80.0,
    repeat: int = 1,
    n_ctx: int = 4096,
    n_gpu_layers: int = 0,
    hardware: dict[str, str] | None = None,
    stopped_last: bool = False,
) -> RunResult:
    """A Gemma 3 270M Q4_K_M generate run on a CPU: 38 prompt tokens prefilled in 0.05 s, then 64
    tokens; each repetition slightly slower than the one before, like a warming CPU."""
    runs = []
    for i in range(repeat):
        prefill_s = 0.05 + 0.002 * i
        rate = decode_tokens_per_s * (1 - 0.01 * i)
        runs.append(
            measure.figures_from_times(
                38,
                prefill_s,
                _token_times(prefill_s + 1 / rate, 64, rate),
                stopped=stopped_last and i == repeat - 1,
            )
        )
    return RunResult(
        settings=RunSettings(
            gguf_path=GEMMA_PATH,
            context_tokens=n_ctx,
            gpu_layers=n_gpu_layers,
            prompt="Write a haiku about the sea.",
            max_tokens=64,
            repeat=repeat,
        ),
        started_at=started_at,
        llama_cpp_version="0.3.36",
        gpu_offload_supported=False,
        model_size_bytes=253_114_432,
        model_sha256=GEMMA_SHA,
        n_layer=18,
        load_s=0.21,
        runs=tuple(runs),
        buffers=MeasuredBuffers(
            model_buffers={"CPU_Mapped": 241 * MIB},
            kv_buffers={"CPU": 36 * MIB},
            compute_buffers={"CPU": 258 * MIB},
            output_buffers={"CPU_Host": 1 * MIB},
        ),
        peak_rss_bytes=612 * MIB,
        output_text="Waves fold into foam,\nsalt wind carries gull voices,\nthe tide keeps its time.",
        hardware=hardware if hardware is not None else {"cpu_model": "AMD Ryzen 7 7840U"},
        log_tail="llama_context: n_ctx = 4096",
    )


ESTIMATE = {"decode_tokens_per_s": {"low": 60.0, "high": 110.0}, "total_bytes": 540_000_000}


@pytest.fixture
def store(tmp_path: Path):
    h = RunHistory(tmp_path / "nested" / DEFAULT_DB_NAME)
    yield h
    h.close()


def test_default_path_follows_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FITSCOPE_DATA_DIR", str(tmp_path / "data"))
    assert default_history_path() == tmp_path / "data" / "runs.sqlite3"
    h = RunHistory()
    try:
        assert (tmp_path / "data" / "runs.sqlite3").is_file()
    finally:
        h.close()


def test_schema_version_and_wal(store: RunHistory) -> None:
    conn = sqlite3.connect(store.path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"runs", "efficiency"} <= tables
    finally:
        conn.close()


def test_add_get_round_trip(store: RunHistory) -> None:
    original = _gemma_run(repeat=3)
    run_id = store.add(original, ESTIMATE)
    again, estimate = store.get(run_id)
    assert again == original
    assert estimate == ESTIMATE

    bare = store.add(_gemma_run(started_at=T0 + 60))
    assert store.get(bare)[1] is None

    with pytest.raises(KeyError):
        store.get(9999)


def test_round_trip_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / DEFAULT_DB_NAME
    original = _gemma_run()
    with RunHistory(path) as h:
        run_id = h.add(original, ESTIMATE)
    with RunHistory(path) as h:
        assert h.get(run_id) == (original, ESTIMATE)


def test_rows_newest_first_with_medians(store: RunHistory) -> None:
    older = _gemma_run(started_at=T0, repeat=3)
    newer = _gemma_run(
        started_at=T0 + 3600,
        decode_tokens_per_s=100.0,
        n_ctx=8192,
        n_gpu_layers=-1,
        hardware={"label": "NVIDIA GeForce RTX 4090", "cpu_model": "AMD Ryzen 9 7950X"},
    )
    # Added out of order: the list follows start time, not insertion.
    id_newer = store.add(newer)
    id_older = store.add(older)

    rows = store.rows()
    assert [r.run_id for r in rows] == [id_newer, id_older]

    first, second = rows
    s = measure.summary(newer)
    assert first == HistoryRow(
        run_id=id_newer,
        started_at=T0 + 3600,
        model_name="gemma-3-270m-it-Q4_K_M.gguf",
        model_sha256=GEMMA_SHA,
        hardware="NVIDIA GeForce RTX 4090",
        mode="generate",
        n_ctx=8192,
        n_gpu_layers=-1,
        repeat=1,
        ttft_s=s["ttft_s"].median,
        prefill_tokens_per_s=s["prefill_tokens_per_s"].median,
        decode_tokens_per_s=s["decode_tokens_per_s"].median,
        peak_rss_bytes=612 * MIB,
        llama_cpp_version="0.3.36",
    )
    s = measure.summary(older)
    assert second.hardware == "AMD Ryzen 7 7840U"
    assert second.repeat == 3
    assert second.ttft_s == pytest.approx(s["ttft_s"].median)
    assert second.prefill_tokens_per_s == pytest.approx(38 / 0.052)  # the middle of 0.050, 0.052, 0.054 s
    assert second.decode_tokens_per_s == pytest.approx(s["decode_tokens_per_s"].median)
    assert second.decode_tokens_per_s == pytest.approx(79.2)

    assert [r.run_id for r in store.rows(limit=1)] == [id_newer]


def test_repeat_counts_completed_repetitions(store: RunHistory) -> None:
    run_id = store.add(_gemma_run(repeat=3, stopped_last=True))
    (row,) = store.rows()
    assert row.run_id == run_id
    assert row.repeat == 2


def test_compare_gives_change_as_fraction(store: RunHistory) -> None:
    a = store.add(_gemma_run(decode_tokens_per_s=80.0))
    faster = _gemma_run(started_at=T0 + 10, decode_tokens_per_s=100.0).model_copy(
        update={"load_s": 0.42, "peak_rss_bytes": None}
    )
    b = store.add(faster)
    table = {name: (va, vb, change) for name, va, vb, change in store.compare(a, b)}

    assert list(table) == list(history_module.COMPARE_FIGURES)
    va, vb, change = table["decode_tokens_per_s"]
    assert (va, vb) == (pytest.approx(80.0), pytest.approx(100.0))
    assert change == pytest.approx(0.25)
    assert table["load_s"] == (0.21, 0.42, pytest.approx(1.0))
    assert table["prefill_tokens_per_s"][2] == pytest.approx(0.0)
    assert table["peak_rss_bytes"] == (612 * MIB, None, None)
    assert table["kv_buffer_bytes"] == (36 * MIB, 36 * MIB, 0.0)
    assert table["model_buffer_bytes"][0] == 241 * MIB
    assert table["compute_buffer_bytes"][0] == 258 * MIB
    assert table["output_buffer_bytes"][0] == 1 * MIB
    assert table["rs_buffer_bytes"] == (None, None, None)  # a transformer has no recurrent state

    with pytest.raises(KeyError):
        store.compare(a, 9999)


def test_export_csv(store: RunHistory, tmp_path: Path) -> None:
    a = store.add(_gemma_run(started_at=T0, decode_tokens_per_s=80.0), ESTIMATE)
    b = store.add(_gemma_run(started_at=T0 + 60, decode_tokens_per_s=100.0))
    c = store.add(_gemma_run(started_at=T0 + 120, repeat=2))

    out = tmp_path / "runs.csv"
    assert store.export_csv(out) == 3
    with out.open(newline="", encoding="utf-8") as fh:
        lines = list(csv.DictReader(fh))
    assert [int(r["run_id"]) for r in lines] == [c, b, a]
    assert list(lines[0]) == [*(f for f in HistoryRow.__dataclass_fields__), "settings"]

    by_id = {int(r["run_id"]): r for r in lines}
    assert float(by_id[b]["decode_tokens_per_s"]) == pytest.approx(100.0)
    assert float(by_id[a]["started_at"]) == T0
    assert by_id[a]["model_name"] == "gemma-3-270m-it-Q4_K_M.gguf"
    assert by_id[a]["llama_cpp_version"] == "0.3.36"
    assert int(by_id[a]["peak_rss_bytes"]) == 612 * MIB
    assert int(by_id[c]["repeat"]) == 2
    settings = json.loads(by_id[a]["settings"])
    assert settings["gguf_path"] == GEMMA_PATH
    assert settings["context_tokens"] == 4096
    assert RunSettings.model_validate(settings) == _gemma_run().settings
    # A run kept by an earlier version named the fields after llama.cpp's C API; it still reads.
    names = {"context_tokens": "n_ctx", "gpu_layers": "n_gpu_layers"}
    older = {names.get(k, k): v for k, v in settings.items()}
    assert RunSettings.model_validate(older | {"n_gpu_layers": -1}).gpu_layers == "all"
    assert RunSettings.model_validate(older).context_tokens == 4096

    chosen = tmp_path / "two.csv"
    assert store.export_csv(chosen, [a, 9999, b]) == 2
    with chosen.open(newline="", encoding="utf-8") as fh:
        assert [int(r["run_id"]) for r in csv.DictReader(fh)] == [a, b]
    assert not (tmp_path / "two.csv.partial").exists()


def test_calibration_is_the_median_of_the_good_runs_per_target(store: RunHistory) -> None:
    r1 = store.add(_gemma_run(started_at=T0))
    r2 = store.add(_gemma_run(started_at=T0 + 60))
    r3 = store.add(_gemma_run(started_at=T0 + 120))
    store.set_efficiency("host-a", "CPU", 0.55, r1, 2)
    store.set_efficiency("host-a", "NVIDIA GeForce RTX 4090", 0.71, r1, 2)
    store.set_efficiency("host-a", "CPU", 0.62, r2, 2)
    store.set_efficiency("host-b", "CPU", 0.40, r2, 2)

    assert store.efficiencies("host-a", 2) == {"CPU": pytest.approx(0.585), "NVIDIA GeForce RTX 4090": 0.71}
    assert store.efficiencies("host-b", 2) == {"CPU": 0.40}
    assert store.efficiencies("nowhere", 2) == {}
    # One bad run (1% of the roofline) beside two good ones moves the median to the middle good one.
    store.set_efficiency("host-a", "CPU", 0.01, r3, 2)
    assert store.efficiencies("host-a", 2)["CPU"] == 0.55
    cpu = store.calibration("host-a", 2)["CPU"]
    assert (cpu.efficiency, cpu.runs) == (0.55, 3) and cpu.latest_s >= T0

    with pytest.raises(KeyError):
        store.set_efficiency("host-a", "CPU", 0.5, 9999, 2)
    with pytest.raises(ValueError):
        store.set_efficiency("host-a", "CPU", float("nan"), r1, 2)

    # Deleting the run a calibration came from takes its value with it.
    store.delete(r3)
    store.delete(r2)
    assert store.efficiencies("host-a", 2) == {"CPU": 0.55, "NVIDIA GeForce RTX 4090": 0.71}
    assert store.efficiencies("host-b", 2) == {}


def test_reset_forgets_a_machines_calibration_and_keeps_its_runs(store: RunHistory) -> None:
    run = store.add(_gemma_run(started_at=T0))
    store.set_efficiency("host-a", "CPU", 0.55, run, 2)
    store.set_efficiency("host-a", "CPU", 0.60, run, 1)
    store.set_efficiency("host-b", "CPU", 0.40, run, 2)
    assert store.reset_calibration("host-a") == 2
    assert store.efficiencies("host-a", 2) == {} and store.efficiencies("host-a", 1) == {}
    assert store.efficiencies("host-b", 2) == {"CPU": 0.40}
    assert [r.run_id for r in store.rows()] == [run]


def test_an_efficiency_measured_with_other_threads_never_calibrates(store: RunHistory) -> None:
    default_run = store.add(_gemma_run(started_at=T0))
    one_thread = store.add(_gemma_run(started_at=T0 + 60))
    store.set_efficiency("host-a", "CPU", 0.60, default_run, 2)
    store.set_efficiency("host-a", "CPU", 0.45, one_thread, 1)  # newer, but another configuration
    assert store.efficiencies("host-a", 2) == {"CPU": 0.60}
    assert store.efficiencies("host-a", 1) == {"CPU": 0.45}


def test_a_version_1_history_keeps_its_runs_and_drops_their_thread_less_calibration(tmp_path: Path) -> None:
    from app.adapters import history

    path = tmp_path / "runs.sqlite3"
    version_1 = history._SCHEMA.replace(",\n    n_threads INTEGER", "")
    assert "n_threads" not in version_1
    conn = sqlite3.connect(path)
    conn.executescript(version_1)
    conn.execute("INSERT INTO efficiency VALUES (1, 'host-a', 'CPU', 0.41, 1, 0)")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    with RunHistory(path) as store:
        # Measured with llama-cpp-python's one-thread default: not this machine's llama-server speed.
        assert store.efficiencies("host-a", 2) == {}
        assert store.efficiencies("host-a", 1) == {}


def test_delete(store: RunHistory) -> None:
    keep = store.add(_gemma_run(started_at=T0))
    drop = store.add(_gemma_run(started_at=T0 + 60))
    store.delete(drop)
    assert [r.run_id for r in store.rows()] == [keep]
    with pytest.raises(KeyError):
        store.get(drop)
    with pytest.raises(KeyError):
        store.delete(drop)
    assert store.get(keep)[0] == _gemma_run(started_at=T0)


def test_adds_from_several_threads(store: RunHistory) -> None:
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for i in range(5):
                store.add(_gemma_run(started_at=T0 + 10 * k + i))
        except BaseException as exc:  # surfaced below: an exception in a thread would pass silently
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len({r.run_id for r in store.rows()}) == 20


_CRASHING_CHILD = """
import os, signal, sys
from pathlib import Path
from app.adapters.history import RunHistory
from app.core.speed.measure import RunResult

history = RunHistory(Path(sys.argv[1]))
run_id = history.add(RunResult.model_validate_json(sys.stdin.read()), {"decode_tokens_per_s": 75.0})
print(run_id, flush=True)
if hasattr(signal, "SIGKILL"):
    os.kill(os.getpid(), signal.SIGKILL)
os._exit(1)
"""


def test_run_survives_a_crash_right_after_add(tmp_path: Path) -> None:
    path = tmp_path / DEFAULT_DB_NAME
    original = _gemma_run(repeat=2)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    child = subprocess.run(
        [sys.executable, "-c", _CRASHING_CHILD, str(path)],
        input=original.model_dump_json(),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=60,
    )
    expected_rc = -signal.SIGKILL if hasattr(signal, "SIGKILL") else 1
    assert child.returncode == expected_rc, child.stderr
    run_id = int(child.stdout.strip())
    # The run is still only in the write-ahead log: nothing checkpointed it into the main file.
    assert (tmp_path / f"{DEFAULT_DB_NAME}-wal").stat().st_size > 0

    with RunHistory(path) as h:
        assert h.get(run_id) == (original, {"decode_tokens_per_s": 75.0})
        assert [r.run_id for r in h.rows()] == [run_id]


def test_garbage_file_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / DEFAULT_DB_NAME
    garbage = bytes(range(256)) * 16
    path.write_bytes(garbage)

    with pytest.raises(FitScopeError) as caught:
        RunHistory(path)
    message = str(caught.value)
    assert str(path) in message
    aside = list(tmp_path.glob(f"{DEFAULT_DB_NAME}.corrupt-*"))
    assert len(aside) == 1
    assert aside[0].name in message
    assert "moved aside" in message
    assert aside[0].read_bytes() == garbage  # kept as it was, for whoever wants to look

    with RunHistory(path) as h:
        assert h.rows() == []
        h.add(_gemma_run())
        assert len(h.rows()) == 1


def test_newer_schema_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / DEFAULT_DB_NAME
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, something_new TEXT)")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    before = path.read_bytes()

    with pytest.raises(FitScopeError, match="newer FitScope") as caught:
        RunHistory(path)
    assert str(path) in str(caught.value)
    assert path.read_bytes() == before
    assert not list(tmp_path.glob("*.corrupt-*"))
    assert not (tmp_path / f"{DEFAULT_DB_NAME}-wal").exists()
