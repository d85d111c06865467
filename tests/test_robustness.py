"""Hostile files, absurd options and faults: each gets one clear line, never a traceback or a hang,
and no finished run is lost."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from app import cli
from app.adapters.history import RunHistory
from app.adapters.kept_runs import keep_unsaved
from app.adapters.run_saving import record_run
from app.core.common.errors import FitScopeError, ModelFileError
from app.core.model.gguf_model import read_gguf
from app.core.model.hf_config import read_hf_config
from app.core.quality.suite import SuiteError
from app.core.quality.suite_reading import load_suite
from tests.test_gguf_reader import MINIMAL_KVS, raw_gguf, write_gguf

ROOT = Path(__file__).resolve().parents[1]


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, err.strip()


# -- GGUF headers -------------------------------------------------------------------------------


def test_tensors_beyond_block_count_are_refused_by_the_reader(tmp_path):
    # (1) The estimator used to fail with IndexError on such a file.
    path = write_gguf(
        tmp_path / "beyond.gguf",
        n_layer=1,
        tensors={"blk.3.attn_norm.weight": np.ones(64, dtype=np.float32)},
    )
    with pytest.raises(ModelFileError, match="tensors of layer 3 but .* says 1 layers"):
        read_gguf(path)


def test_a_huge_name_length_is_refused_without_copying_the_file(tmp_path):
    # (2) One bad length field: a tensor name of 240,000,000 bytes inside a file that large.
    good = raw_gguf(MINIMAL_KVS, tensors=[("zq", [32], 0, 0)])
    name_field = struct.pack("<Q", 2) + b"zq"
    assert good.count(name_field) == 1
    bad = good.replace(name_field, struct.pack("<Q", 240_000_000) + b"zq")
    path = tmp_path / "longname.gguf"
    with path.open("wb") as f:
        f.write(bad)
        f.truncate(260_000_000)  # sparse: takes no disk
    before = psutil.Process().memory_info().rss
    with pytest.raises(ModelFileError, match="names are at most 64"):
        read_gguf(path)
    assert psutil.Process().memory_info().rss - before < 50 * 1024**2


def test_a_huge_block_count_is_refused_before_any_list_is_built(tmp_path):
    kvs = [
        kv if kv[0] != "llama.block_count" else ("llama.block_count", 4, struct.pack("<I", 1 << 26))
        for kv in MINIMAL_KVS
    ]
    path = tmp_path / "layers.gguf"
    path.write_bytes(raw_gguf(kvs))
    started = time.process_time()  # CPU time: the reader's cost, whatever else the machine runs
    with pytest.raises(ModelFileError, match="block_count' is 67,108,864"):
        read_gguf(path)
    assert time.process_time() - started < 1.0


def test_a_fifo_named_as_a_model_config_or_suite_is_refused_at_once(tmp_path):
    # (3) Reading a FIFO blocked forever.
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    with pytest.raises(ModelFileError, match="pipe"):
        read_gguf(fifo)
    with pytest.raises(ModelFileError, match="pipe"):
        read_hf_config(fifo)
    with pytest.raises(SuiteError, match="pipe"):
        load_suite(fifo)


# -- config.json ----------------------------------------------------------------------------------

BASE_CONFIG = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "vocab_size": 128256,
}


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"hidden_size": 1e300}, "not a whole number"),
        ({"num_attention_heads": 0}, "num_attention_heads"),
        ({"num_attention_heads": 10**9}, "num_attention_heads"),
        ({"num_key_value_heads": 3}, "must divide"),
        ({"attention_bias": "false"}, "must be true or false"),
        ({"tie_word_embeddings": "no"}, "must be true or false"),
    ],
)
def test_config_values_are_validated_not_coerced(tmp_path, change, fragment):
    # (6) 1e300 raised OverflowError; 0 or 10^9 heads and "false" strings were accepted.
    path = tmp_path / "config.json"
    path.write_text(json.dumps(BASE_CONFIG | change))
    with pytest.raises(ModelFileError, match=fragment):
        read_hf_config(path)


def test_a_5000_digit_integer_and_a_long_layer_types_list(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(BASE_CONFIG).replace('"hidden_size": 4096', '"hidden_size": ' + "9" * 5000))
    with pytest.raises(ModelFileError, match="not a usable config.json"):
        read_hf_config(path)
    gemma = {
        "model_type": "gemma3_text",
        "hidden_size": 2560,
        "num_hidden_layers": 34,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "intermediate_size": 10240,
        "max_position_embeddings": 131072,
        "vocab_size": 262208,
        "sliding_window": 1024,
        "layer_types": ["sliding_attention"] * 100_000,
    }
    path.write_text(json.dumps(gemma))
    started = time.process_time()
    read_hf_config(path)  # used to take over 30 s of CPU (a quadratic search)
    assert time.process_time() - started < 2.0


# -- suites ---------------------------------------------------------------------------------------


def test_a_yaml_alias_bomb_is_refused_quickly(tmp_path):
    # (7) A "billion laughs" suite: MemoryError after 12 s at 1.5 GiB.
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [{', '.join(['*' + prev] * 9)}]")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    started = time.perf_counter()
    with pytest.raises(SuiteError, match="expands to more than 200,000 items"):
        load_suite(path)
    assert time.perf_counter() - started < 3.0


# -- command lines --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ("estimate", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--host-ram-gib", "nan"),
        ("estimate", "--model", "llama-3.1-8b", "-c", "-5"),
        ("plan", "--model", "llama-3.1-8b", "-c", "0"),
        ("load", "--gguf", "/no/such/file.gguf"),
        ("load", "--slots", "0"),
        ("run", "-ctk", "bogus"),
        ("bench", "-p", "-1000"),
        ("estimate", "--model", "llama-3.1-8b", "--temp", "1"),  # an option of another command
    ],
)
def test_bad_command_lines_get_one_line(capsys, argv):
    # (5) These ended in tracebacks (a bare KeyError: 'bogus' among them).
    rc, err = run_cli(capsys, *argv)
    assert rc == 2
    assert len(err.splitlines()) == 1 and err.startswith("fitscope: ")


def test_messages_from_files_are_one_printable_line(capsys, tmp_path):
    # (8) Raw control characters and ANSI escapes from a file were echoed into messages.
    path = tmp_path / "evil.gguf"
    path.write_bytes(b"\x1b[31mRED\x1b[0m\n\x07" * 2000)
    rc, err = run_cli(capsys, "estimate", "--gguf", str(path))
    assert rc == 2 and len(err.splitlines()) == 1
    assert "\x1b" not in err and "\x07" not in err and len(err) <= 510


# -- nothing lost ---------------------------------------------------------------------------------


def _result():
    from tests.test_history import _gemma_run

    return _gemma_run()


def test_a_run_the_history_cannot_take_is_kept_and_imported_later(tmp_path, monkeypatch):
    # (4) A corrupt history, or a folder at its path, threw the finished run away.
    monkeypatch.setenv("FITSCOPE_DATA_DIR", str(tmp_path))
    folder_path = tmp_path / "runs.sqlite3"
    folder_path.mkdir()
    saved = record_run(_result(), {"total_bytes": 1}, None, "host", path=folder_path)
    assert saved.history_id is None and saved.unsaved_path and Path(saved.unsaved_path).is_file()
    assert saved.message and "kept in" in saved.message
    folder_path.rmdir()
    with RunHistory() as history:  # the default history imports what was kept aside
        assert len(history.rows()) == 1
    assert not list((tmp_path / "unsaved-runs").glob("run-*.json"))


def test_keep_unsaved_writes_a_readable_file(tmp_path, monkeypatch):
    monkeypatch.setenv("FITSCOPE_DATA_DIR", str(tmp_path))
    kept = keep_unsaved(_result(), None, "disk full")
    payload = json.loads(kept.read_text())
    assert payload["reason"] == "disk full" and payload["result"]["settings"]["gguf_path"]


def _sigint_as_from_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.llamacpp
def test_sigint_to_fitscope_run_ends_it_and_its_child(tmp_path, demo_gguf):
    # (3) SIGINT to the parent alone deadlocked: the child blocked on a full pipe.
    env = os.environ | {"FITSCOPE_DATA_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "run", "-n", "4000", "--repeat", "1", "--no-save", "-c", "8192"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # As started from a terminal: a test run started in the background by a shell without job
        # control inherits SIGINT ignored, and so would the run, which Ctrl+C then cannot reach.
        preexec_fn=_sigint_as_from_a_terminal,
    )
    try:
        parent = psutil.Process(proc.pid)
        deadline = time.time() + 60
        while time.time() < deadline and not parent.children(recursive=True):
            time.sleep(0.2)
        time.sleep(4)  # the child is loaded and generating, its pipe filling
        children = parent.children(recursive=True)
        assert children
        proc.send_signal(signal.SIGINT)
        # A deadlock never ends; a loaded machine may take more than a few seconds to.
        assert proc.wait(timeout=30) == 130
        gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive
    finally:
        # Whatever failed above, nothing of this run outlives the test (and upsets the next ones).
        if proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                for p in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
                    p.kill()
        proc.wait(timeout=10)


def test_fitscope_errors_are_fitscope_errors():
    assert issubclass(ModelFileError, FitScopeError) and issubclass(SuiteError, FitScopeError)


@pytest.mark.llamacpp
def test_a_prompt_longer_than_the_context_fails_alone_and_the_suite_goes_on(tmp_path):
    # (7) One prompt too long for the context aborted the whole compare and kept nothing.
    from app.adapters.suite_runner import PromptJob, SuiteRunSettings, run_suite
    from tests.support.tiny_gguf import TINY_PROMPT, write_tiny_llama

    tiny = write_tiny_llama(tmp_path / "tiny.gguf", n_layer=2, n_embd=64, n_ff=128)
    jobs = (
        PromptJob(id="s/long", prompt=" ".join([TINY_PROMPT] * 40), max_tokens=4),
        PromptJob(id="s/short", prompt=TINY_PROMPT, max_tokens=4),
    )
    run = run_suite(SuiteRunSettings(gguf_path=str(tiny), prompts=jobs, context_tokens=256))
    by_id = {o.id: o for o in run.outcomes}
    assert set(by_id) == {"s/long", "s/short"}
    assert "more than the context of 256" in (by_id["s/long"].error or "")
    assert by_id["s/short"].error is None and len(by_id["s/short"].tokens) == 4


@pytest.mark.llamacpp
def test_a_run_whose_model_file_is_deleted_meanwhile_still_reports(tmp_path):
    # (4) The child hashed the file after the run: a deleted file threw the finished run away.
    from app.adapters.child_protocol import Loaded
    from app.adapters.llamacpp_runner import run_live
    from app.core.speed.measure import RunSettings
    from tests.support.tiny_gguf import TINY_PROMPT, write_tiny_llama

    tiny = write_tiny_llama(tmp_path / "tiny.gguf", n_layer=2, n_embd=64, n_ff=128)

    def delete_once_loaded(event):
        # The child has the model in memory; 900 tokens leave ample time before it hashes the file.
        if isinstance(event, Loaded) and tiny.exists():
            tiny.unlink()

    settings = RunSettings(
        gguf_path=str(tiny), prompt=TINY_PROMPT, max_tokens=900, ignore_eos=True, context_tokens=1024
    )
    result = run_live(settings, on_event=delete_once_loaded)
    assert not tiny.exists()
    assert result.runs[0].generated_tokens == 900 and result.model_hash_kind == "unavailable"


def test_an_interrupt_after_the_last_token_waits_until_the_run_is_saved():
    # SIGINT or SIGTERM while a finished run is being reported: the report and the save finish first.
    done = []
    before = signal.getsignal(signal.SIGINT)  # Python's handler, or ignored when started in the background
    with pytest.raises(KeyboardInterrupt), cli._signals_deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        done.append("saved")
    assert done == ["saved"]
    assert signal.getsignal(signal.SIGINT) is before


def test_sigterm_closes_the_window_and_leaves_no_process(tmp_path, demo_gguf):
    # A logout or `kill` used to leave the estimator worker and multiprocessing's resource tracker.
    env = os.environ | {
        "QT_QPA_PLATFORM": "offscreen",
        "FITSCOPE_DATA_DIR": str(tmp_path / "data"),
        "FITSCOPE_CONFIG_DIR": str(tmp_path / "config"),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "window", "--demo"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    window = psutil.Process(proc.pid)
    deadline = time.time() + 60
    while time.time() < deadline and not window.children(recursive=True):
        time.sleep(0.3)
    time.sleep(2)
    children = window.children(recursive=True)
    assert children, "the window starts its estimator worker"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0  # closed as its close button closes it
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive
    assert (tmp_path / "config" / "settings.json").is_file()  # settings were saved on the way out


def test_a_missing_qt_library_gets_the_one_install_command(monkeypatch):
    # On a fresh Debian machine Qt's xcb plugin failed with its own error; now FitScope names the fix.
    from app.ui.app import XCB_LIBRARIES, display_problem

    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setenv("DISPLAY", ":0")
    absent = {"libxcb-icccm.so.4", "libxcb-keysyms.so.1"}
    message = display_problem(lambda library: library not in absent)
    assert message is not None
    assert message.endswith("sudo apt-get install libxcb-icccm4 libxcb-keysyms1")
    assert display_problem(lambda library: True) is None
    assert len(XCB_LIBRARIES) >= 8
