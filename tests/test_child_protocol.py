"""The one protocol between FitScope and its llama.cpp workers, with real child processes: a model
llama.cpp refuses reads the same in every worker, a death is reported with its stderr reason and
signal, stop and timeouts end the child and leave no process, an orphaned child leaves on its own."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from app.adapters.child_protocol import (
    END_GRACE_S,
    ORPHAN_EXIT_S,
    STOP_GRACE_S,
    ChildEvent,
    Done,
    Failed,
    LlamaLog,
    Loaded,
    LogLevel,
    Progress,
    Token,
    WorkerProcess,
    encode_event,
    event_vocabulary,
    exit_description,
    llama_reason,
    parse_event,
)
from app.adapters.llamacpp_runner import LiveLoaded, RunError, run_live
from app.core.speed.measure import MeasuredBuffers, RunSettings
from tests.support.protocol_worker import ASSERT_LINE, MODULE, Script

REPO = Path(__file__).resolve().parents[1]


def _worker(behaviour: str, **kwargs) -> WorkerProcess:
    return WorkerProcess(MODULE, Script(behaviour=behaviour), (Loaded, Progress, Done), name="model.gguf", **kwargs)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# -- the wire --------------------------------------------------------------------------------------


def test_an_event_survives_the_wire_with_its_type_and_figures():
    loaded = LiveLoaded(
        started_at=1.5,
        load_s=0.25,
        llama_cpp_version="0.3.36",
        gpu_offload_supported=False,
        model_size_bytes=123,
        n_layer=4,
        prompt_tokens=36,
        n_threads=8,
        buffers=MeasuredBuffers(kv_buffers={"CPU": 4096}),
    )
    vocabulary = event_vocabulary((LiveLoaded, Token, Done))
    again = parse_event(encode_event(loaded) + "\n", vocabulary)
    assert isinstance(again, LiveLoaded) and again == loaded and again.buffers.kv_buffers == {"CPU": 4096}
    failed = parse_event(encode_event(Failed(message="llama.cpp could not load it: bad magic")), vocabulary)
    assert isinstance(failed, Failed) and failed.message.endswith("bad magic")


def test_lines_that_are_not_this_workers_events_are_skipped():
    vocabulary = event_vocabulary((Token,))
    assert parse_event("load_tensors: CPU model buffer size = 12.00 MiB", vocabulary) is None
    assert parse_event('{"event": "token", "run": 0', vocabulary) is None  # cut short
    assert parse_event(encode_event(Progress(done=1, total=2)), vocabulary) is None  # not this worker's
    assert parse_event('{"event": "token", "t_s": "soon"}', vocabulary) is None  # does not validate
    assert parse_event("[1, 2]", vocabulary) is None


def test_one_tag_names_one_event_class_per_worker():
    class OtherLoaded(Loaded):
        chunks: int

    with pytest.raises(ValueError, match="'loaded'"):
        event_vocabulary((LiveLoaded, OtherLoaded))


def test_llama_cpp_reason_is_its_first_error_without_the_function_name():
    log = LlamaLog()
    log.receive(LogLevel.INFO, "llama_model_loader: loaded meta data\n")
    log.receive(LogLevel.ERROR, "gguf_init_from_reader: invalid magic characters: 'not ', expected 'GGUF'\n")
    log.receive(LogLevel.CONT, "  (continued)\n")
    log.receive(LogLevel.ERROR, "llama_model_load: error loading model.\n")
    assert log.reason() == "invalid magic characters: 'not ', expected 'GGUF'"
    assert len(log.error_lines) == 3  # the continuation counts at the level it continues
    assert "loaded meta data" in log.info_text()
    assert llama_reason([], "", "Model path does not exist: m.gguf") == "Model path does not exist: m.gguf"
    assert llama_reason([], "line 1\nline 2\nline 3\nline 4\n") == "line 2\nline 3\nline 4"
    assert llama_reason([]) == "no reason given in the log"


def test_a_signal_is_named_in_the_exit_description():
    assert exit_description(1) == "exit code 1"
    assert exit_description(-signal.SIGABRT) == "killed by SIGABRT"


# -- real child processes --------------------------------------------------------------------------


def test_a_worker_runs_to_the_end_and_its_events_arrive_typed_and_in_order():
    worker = _worker("finish")
    events: list[ChildEvent] = []
    assert worker.follow(events.append) == 0
    assert [type(e) for e in events] == [Loaded, Progress, Progress, Progress, Done]
    assert [e.done for e in events if isinstance(e, Progress)] == [1, 2, 3]
    assert worker.failure("while testing") is None and not worker.running


def test_a_child_that_dies_mid_run_is_reported_with_its_stderr_reason():
    worker = _worker("abort")
    worker.follow()
    assert worker.loaded is not None and worker.done is None
    assert worker.failure("while measuring model.gguf") == (
        f"llama.cpp stopped while measuring model.gguf (killed by SIGABRT): {ASSERT_LINE}"
    )


def test_stop_ends_the_child_and_no_process_is_left():
    worker = _worker("until_stop")
    asked: list[float] = []

    def stop_at_the_third_step(event: ChildEvent) -> None:
        if isinstance(event, Progress) and event.done == 3:
            asked.append(time.perf_counter())
            worker.stop()

    assert worker.follow(stop_at_the_third_step) == 0  # it finished on its own, not ended
    assert time.perf_counter() - asked[0] < STOP_GRACE_S
    assert worker.failure("while testing") is None
    assert _gone(worker.pid)


def test_a_child_that_ignores_stop_is_ended_after_the_grace():
    worker = _worker("ignore_stop")
    started = time.perf_counter()
    worker.follow(lambda event: worker.stop() if isinstance(event, Loaded) else None)
    assert STOP_GRACE_S <= time.perf_counter() - started < STOP_GRACE_S + END_GRACE_S + 2
    assert worker.exit_code == -signal.SIGTERM and _gone(worker.pid)


def test_a_stop_before_the_model_loaded_says_nothing_was_measured():
    worker = _worker("hang_before_loading")
    worker.stop()
    worker.follow()
    assert worker.failure("while testing") == "Stopped before model.gguf had loaded; nothing was measured."


def test_a_timeout_ends_the_child():
    worker = _worker("ignore_stop", timeout_s=1.0)
    started = time.perf_counter()
    worker.follow()
    assert time.perf_counter() - started < 1.0 + END_GRACE_S + 2
    assert worker.timed_out and _gone(worker.pid)
    assert worker.failure("while testing model.gguf") == (
        "llama.cpp took longer than 1 s while testing model.gguf and was stopped."
    )


def test_an_error_in_the_callback_ends_the_child_before_it_is_raised():
    worker = _worker("until_stop")

    def broken(_event: ChildEvent) -> None:
        raise KeyError("a defect in the caller")

    with pytest.raises(KeyError):
        worker.follow(broken)
    assert _gone(worker.pid)


def test_a_child_whose_parent_dies_leaves_on_its_own():
    parent_code = (
        "import time\n"
        "from app.adapters.child_protocol import WorkerProcess\n"
        "from tests.support.protocol_worker import MODULE, Script\n"
        "w = WorkerProcess(MODULE, Script(behaviour='ignore_stop'), name='x')\n"
        "print(w.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    time.sleep(0.5)  # the child reads its settings and starts watching stdin
    parent.kill()
    parent.wait()
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(pid).wait(timeout=ORPHAN_EXIT_S + 5)
    assert _gone(pid)


# -- every llama.cpp worker, one wording -----------------------------------------------------------


def _every_worker(path: Path, tmp_path: Path) -> dict[str, object]:
    from app.adapters.batch_probe import measure_batching
    from app.adapters.divergence_runner import DivergenceSettings, measure_divergence
    from app.adapters.quantizer import quantize
    from app.adapters.suite_runner import PromptJob, SuiteRunSettings, run_suite

    gguf = str(path)
    return {
        "Run tab": lambda: run_live(RunSettings(gguf_path=gguf)),
        "A/B suite": lambda: run_suite(SuiteRunSettings(gguf_path=gguf, prompts=(PromptJob(id="a", prompt="Hi"),))),
        "A/B KL": lambda: measure_divergence(gguf, [], DivergenceSettings(text="Hello there. " * 200)),
        "Load probe": lambda: measure_batching(gguf, parallel=(1,), prompt_tokens=4, gen_tokens=2, n_ctx=64),
        "quantizer": lambda: quantize(gguf, tmp_path / "out-Q8_0.gguf", "Q8_0"),
    }


def _messages(path: Path, tmp_path: Path) -> dict[str, str]:
    messages = {}
    for worker, call in _every_worker(path, tmp_path).items():
        with pytest.raises(Exception) as caught:
            call()  # type: ignore[operator]
        messages[worker] = str(caught.value)
    return messages


def test_a_missing_model_file_reads_the_same_in_every_worker(tmp_path):
    missing = tmp_path / "deleted.gguf"
    messages = _messages(missing, tmp_path)
    assert set(messages.values()) == {f"{missing} does not exist or is not a file."}, messages


@pytest.mark.llamacpp
def test_a_file_llama_cpp_cannot_load_reads_the_same_in_every_worker(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all, just text")
    messages = _messages(junk, tmp_path)
    expected = "junk.gguf: llama.cpp could not load it: invalid magic characters: 'not ', expected 'GGUF'"
    assert set(messages.values()) == {expected}, messages
    assert not (tmp_path / "out-Q8_0.gguf").exists()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.support.tiny_gguf import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf", n_layer=2, n_embd=64, n_ff=128)


@pytest.mark.llamacpp
def test_a_llama_cpp_child_killed_mid_run_is_named_by_its_signal(tiny):
    from tests.support.tiny_gguf import TINY_PROMPT

    settings = RunSettings(
        gguf_path=str(tiny), prompt=TINY_PROMPT, max_tokens=900, ignore_eos=True, context_tokens=1024
    )
    lives: list[WorkerProcess] = []

    def kill_at_the_first_token(event: ChildEvent) -> None:
        if isinstance(event, Token) and lives[0].running:
            os.kill(lives[0].pid, signal.SIGKILL)  # as the kernel's out-of-memory killer would

    with pytest.raises(RunError) as caught:
        run_live(settings, on_event=kill_at_the_first_token, on_start=lives.append)
    assert str(caught.value) == "llama.cpp stopped during the run (killed by SIGKILL)."
    assert _gone(lives[0].pid)


@pytest.mark.llamacpp
def test_the_load_probe_past_its_timeout_is_stopped_and_leaves_no_process(tiny):
    from app.adapters.batch_probe import BatchProbeError, measure_batching

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(BatchProbeError) as caught:
        measure_batching(tiny, parallel=(1,), prompt_tokens=4, gen_tokens=2, n_ctx=64, timeout_s=0.2)
    assert str(caught.value) == (
        "llama.cpp took longer than 0.2 s while measuring batching on tiny.gguf and was stopped."
    )
    assert {p.pid for p in psutil.Process().children(recursive=True)} - before == set()
