"""Live generation with the real llama.cpp (llama-cpp-python), in a child process.

The parent (:func:`run_live`) starts ``python -m app.adapters.llamacpp_runner``, sends it the
:class:`~app.core.measure.RunSettings` as one JSON line on stdin and reads one JSON event per line
from its stdout: ``loaded`` (load time, llama.cpp's buffer report), ``token`` (text, time since the
prompt was sent), ``run_done`` (one repetition's figures), ``done`` (the file's hash, peak memory)
or ``error``. An abort inside llama.cpp therefore ends the child only; the caller gets a
:class:`RunError` with llama.cpp's own reason.

Stopping: the parent writes ``stop`` on the child's stdin; the child checks between tokens and
finishes the repetition as stopped. If it has not exited a second later (a long prefill, a stuck
backend), it is killed. If the parent dies, the child sees its stdin close and exits.

Timing in the child follows llama.cpp's ``llama_perf_context`` and llama-bench: ``generate``
mode streams a prompt's completion token by token; ``bench`` mode processes ``prompt_tokens``
random tokens as one batch (pp) and then generates ``max_tokens`` one at a time (tg), after
``depth_tokens`` of context were filled untimed.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO, TypeVar

from pydantic import BaseModel

from app.adapters.child import start_child
from app.adapters.cpu_topology import llama_math_threads, with_llama_threads
from app.adapters.llamacpp_probe import GGML_TYPE_IDS, _reason, parse_llama_log
from app.adapters.rpc_servers import offloads_to_local_gpu
from app.core import llama_defaults
from app.core.errors import FitScopeError
from app.core.measure import MeasuredBuffers, RunFigures, RunResult, RunSettings, figures_from_times

STOP_GRACE_S = 1.0
FULL_HASH_LIMIT_BYTES = 2 * 1024**3
HASH_SLICE_BYTES = 64 * 1024**2
_LOG_LEVEL_INFO = 2
_LOG_LEVEL_ERROR = 4
_LOG_LEVEL_CONT = 5
FILLER_TEXT = (
    "The history of measurement is a history of agreement: a length, a weight or a second means "
    "something only because many people decided to count it the same way, and the tools that "
    "count it were checked against each other again and again. "
)

Event = dict[str, Any]


class RunError(FitScopeError):
    """The model could not be loaded or run; the message says why in llama.cpp's words."""


# -- parent side ---------------------------------------------------------------------------------


class LiveRun:
    """One llama.cpp child process (this module's, or another ``module`` speaking the same
    protocol) given ``settings`` as its first stdin line. Use :func:`run_live` unless you need to
    stop it from another thread (``stop()`` is thread-safe)."""

    def __init__(
        self, settings: Any, gguf_path: str | None = None, module: str = "app.adapters.llamacpp_runner"
    ) -> None:
        path = gguf_path or settings.gguf_path
        if not Path(path).is_file():
            raise RunError(f"{path} does not exist or is not a file.")
        self.settings = with_llama_threads(settings)
        self._proc = start_child(module)
        self._stderr: list[str] = []
        self._stderr_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._stderr_thread.start()
        self._stop_requested = threading.Event()
        self._lock = threading.Lock()
        assert self._proc.stdin is not None
        self._proc.stdin.write(self.settings.model_dump_json() + "\n")
        self._proc.stdin.flush()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _drain_stderr(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._stderr.append(line)
            del self._stderr[:-200]

    def events(self) -> Any:
        """Yield the child's events until it exits."""
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue

    def stop(self) -> None:
        """Ask the child to stop; kill it if it has not exited within a second."""
        if self._stop_requested.is_set():
            return
        self._stop_requested.set()
        with self._lock, contextlib.suppress(OSError, ValueError):
            assert self._proc.stdin is not None
            self._proc.stdin.write("stop\n")
            self._proc.stdin.flush()
        threading.Thread(target=self._kill_after_grace, daemon=True).start()

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested.is_set()

    def _kill_after_grace(self) -> None:
        try:
            self._proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self._proc.kill()
        self.wait()

    def wait(self) -> int:
        code = self._proc.wait()
        self._stderr_thread.join(timeout=1)
        return code

    def stderr_tail(self, n: int = 8) -> str:
        return "".join(self._stderr[-n:]).strip()


def run_live(
    settings: RunSettings,
    on_event: Callable[[Event], None] | None = None,
    on_start: Callable[[LiveRun], None] | None = None,
    hardware: dict[str, str] | None = None,
) -> RunResult:
    """Run ``settings`` in a llama.cpp child process and return what was measured.

    ``on_event`` receives every event as it arrives (tokens included), on the calling thread.
    ``on_start`` receives the :class:`LiveRun`, so that another thread can call ``stop()``; a
    stopped run returns the repetitions finished so far (the current one marked ``stopped``).
    Raises :class:`RunError` when the model cannot be loaded or the child dies.
    """
    live = LiveRun(settings)
    if on_start is not None:
        on_start(live)
    loaded: Event | None = None
    runs: list[RunFigures] = []
    tokens: list[float] = []
    text_parts: list[str] = []
    done: Event | None = None
    error: Event | None = None
    try:
        for event in live.events():
            kind = event.get("event")
            if kind == "loaded":
                loaded = event
            elif kind == "token":
                if event.get("run", 0) != len(runs):
                    continue
                tokens.append(float(event["t"]))
                text_parts.append(event.get("text", ""))
            elif kind == "run_done":
                runs.append(RunFigures.model_validate(event["figures"]))
                tokens = []
                if len(runs) < settings.repeat:
                    text_parts = []
            elif kind == "done":
                done = event
            elif kind == "error":
                error = event
            if on_event is not None:
                on_event(event)
    except BaseException:
        # Interrupted (Ctrl+C, an error in a callback): nobody reads the child's pipe any more, so
        # end it now rather than wait for a child blocked on a full pipe.
        live.kill()
        raise
    finally:
        code = live.wait()
    if error is not None:
        raise RunError(f"{Path(settings.gguf_path).name}: {error['message']}")
    if loaded is None and live.stop_requested:
        raise RunError(f"Stopped before {Path(settings.gguf_path).name} had loaded; nothing was measured.")
    if loaded is None:
        tail = live.stderr_tail()
        _raise_if_rpc_server_stopped(settings, code)
        raise RunError(
            f"llama.cpp stopped while loading {Path(settings.gguf_path).name} (exit code {code})"
            + (f": {tail}" if tail else ".")
        )
    if done is None and tokens and live.stop_requested:
        # Killed mid-repetition after a stop: keep what was streamed.
        prompt_tokens = int(loaded.get("prompt_tokens", 0))
        runs.append(figures_from_times(prompt_tokens, tokens[0], tokens, stopped=True))
    if done is None and not live.stop_requested:
        tail = live.stderr_tail()
        _raise_if_rpc_server_stopped(settings, code)
        raise RunError(f"llama.cpp stopped during the run (exit code {code})" + (f": {tail}" if tail else "."))
    final = done or {}
    return RunResult(
        settings=live.settings,
        started_at=float(loaded["started_at"]),
        llama_cpp_version=str(loaded["llama_cpp_version"]),
        gpu_offload_supported=bool(loaded["gpu_offload_supported"]),
        model_size_bytes=int(loaded["model_size_bytes"]),
        model_sha256=str(final.get("sha256", "")),
        model_hash_kind=final.get("hash_kind", "sha256"),
        n_layer=int(loaded["n_layer"]),
        load_s=float(loaded["load_s"]),
        runs=tuple(runs),
        buffers=MeasuredBuffers.model_validate(loaded["buffers"]),
        peak_rss_bytes=final.get("peak_rss_bytes"),
        output_text="".join(text_parts),
        hardware=hardware or {},
        log_tail=str(loaded.get("log_tail", "")),
        n_threads_used=loaded.get("n_threads"),
        llama_server_threads=llama_math_threads(),
    )


def _raise_if_rpc_server_stopped(settings: RunSettings, code: int) -> None:
    """A run across RPC servers that died: name the server that went away (llama.cpp only says
    "Remote RPC server crashed or returned malformed response" and aborts)."""
    if not settings.rpc_servers:
        return
    from app.adapters.rpc_servers import stopped_during_run_message

    gone = stopped_during_run_message(settings.rpc_servers)
    if gone:
        raise RunError(f"{Path(settings.gguf_path).name}: {gone} (llama.cpp exited with code {code}).")


def sweep_threads(
    settings: RunSettings,
    counts: tuple[int, ...],
    on_event: Callable[[Event], None] | None = None,
    on_start: Callable[[LiveRun], None] | None = None,
) -> list[RunResult]:
    """Runs ``settings`` once per thread count in ``counts`` (one child each, in order) and returns
    the results; a stop ends the sweep after the run it interrupted. Events carry ``threads``.
    Raises :class:`RunError` as :func:`run_live` does."""
    results: list[RunResult] = []
    lives: list[LiveRun] = []

    def started(live: LiveRun) -> None:
        lives.append(live)
        if on_start is not None:
            on_start(live)

    for n in counts:

        def tagged(event: Event, n: int = n) -> None:
            if on_event is not None:
                on_event(event | {"threads": n})

        results.append(run_live(settings.model_copy(update={"n_threads": n}), on_event=tagged, on_start=started))
        if lives and lives[-1].stop_requested:
            break
    return results


# -- child side ----------------------------------------------------------------------------------


class _Child:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.stop = threading.Event()
        self.log_chunks: list[str] = []
        self.info_chunks: list[str] = []  # INFO and above: what llama.cpp prints without --verbose
        self.error_lines: list[str] = []

    def emit(self, event: Event) -> None:
        self.out.write(json.dumps(event) + "\n")
        self.out.flush()

    def watch_stdin(self) -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                self.stop.set()
        # The parent is gone: stop now, and leave if the current step does not return soon.
        self.stop.set()
        threading.Timer(3.0, lambda: os._exit(3)).start()


def _file_hash(path: Path) -> tuple[str, str]:
    size = path.stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= FULL_HASH_LIMIT_BYTES:
            for block in iter(lambda: f.read(8 * 1024**2), b""):
                digest.update(block)
            return digest.hexdigest(), "sha256"
        digest.update(f.read(HASH_SLICE_BYTES))
        f.seek(size - HASH_SLICE_BYTES)
        digest.update(f.read(HASH_SLICE_BYTES))
        digest.update(str(size).encode())
        return digest.hexdigest(), "sha256-head-tail"


_RELEVANT = (
    "buffer size",
    "offloaded",
    "llama_kv_cache:",
    "llama_kv_cache_iswa",
    "llama_context: n_",
    "flash_attn",
    "graph: nodes",
    "error",
    "failed",
    "warning",
)


def _relevant_log(log: str, limit: int = 120) -> str:
    """The load log's lines about memory and placement (the full log is hundreds of lines of metadata)."""
    lines = [ln.rstrip() for ln in log.splitlines() if any(key in ln.lower() for key in _RELEVANT)]
    return "\n".join(lines[-limit:])


def _peak_rss_bytes() -> int | None:
    try:
        import resource
    except ImportError:  # Windows
        import psutil

        info = psutil.Process().memory_info()
        return int(getattr(info, "peak_wset", info.rss))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def _prompt_tokens(llm: Any, settings: RunSettings) -> list[int]:
    if settings.prompt_tokens:
        filler = llm.tokenize(FILLER_TEXT.encode(), add_bos=False)
        tokens = llm.tokenize(b"", add_bos=True)
        while len(tokens) < settings.prompt_tokens:
            tokens += filler
        return tokens[: settings.prompt_tokens]
    return llm.tokenize((settings.prompt or "Hello").encode("utf-8"), add_bos=True)


def _perf(llama_cpp: Any, llm: Any) -> tuple[float | None, float | None, int, int]:
    data = llama_cpp.llama_perf_context(llm._ctx.ctx)
    p_ms, n_p = float(data.t_p_eval_ms), int(data.n_p_eval)
    e_ms, n_e = float(data.t_eval_ms), int(data.n_eval)
    prefill = n_p / (p_ms / 1000) if p_ms > 0 and n_p > 0 else None
    decode = n_e / (e_ms / 1000) if e_ms > 0 and n_e > 0 else None
    return prefill, decode, n_p, n_e


def _generate(child: _Child, llama_cpp: Any, llm: Any, settings: RunSettings, prompt: list[int], run: int) -> None:
    llm.reset()  # no prompt-cache reuse: every repetition pays the full prefill
    llama_cpp.llama_perf_context_reset(llm._ctx.ctx)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    times: list[float] = []
    sent = time.perf_counter()
    stopped = False
    for token in llm.generate(prompt, temp=settings.temperature, top_k=40, top_p=0.95, min_p=0.05, reset=True):
        now = time.perf_counter() - sent
        if not settings.ignore_eos and llama_cpp.llama_vocab_is_eog(vocab, token):
            break
        times.append(now)
        piece = llm.detokenize([token])
        child.emit({"event": "token", "run": run, "text": decoder.decode(piece), "t": now})
        if len(times) >= settings.max_tokens:
            break
        if child.stop.is_set():
            stopped = True
            break
    prefill_rate, decode_rate, _, _ = _perf(llama_cpp, llm)
    prefill_s = times[0] if times else time.perf_counter() - sent
    figures = figures_from_times(len(prompt), prefill_s, times, prefill_rate, decode_rate, stopped)
    child.emit({"event": "run_done", "run": run, "figures": figures.model_dump(mode="json")})


def _bench(child: _Child, llama_cpp: Any, llm: Any, settings: RunSettings, run: int) -> None:
    import random

    rng = random.Random(settings.seed + run)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(llm.model))
    llm.reset()
    llama_cpp.llama_perf_context_reset(llm._ctx.ctx)
    if settings.depth_tokens:
        llm.eval([rng.randrange(n_vocab) for _ in range(settings.depth_tokens)])
        llama_cpp.llama_perf_context_reset(llm._ctx.ctx)
    pp = settings.prompt_tokens or 512
    ctx = llm._ctx.ctx
    sent = time.perf_counter()
    llm.eval([rng.randrange(n_vocab) for _ in range(pp)])
    # Backends may run asynchronously (CUDA): time to the end of the work, and let llama.cpp
    # account it in its perf counters.
    llama_cpp.llama_synchronize(ctx)
    prefill_s = time.perf_counter() - sent
    times: list[float] = []
    stopped = False
    token = rng.randrange(n_vocab)
    for _ in range(settings.max_tokens):
        llm.eval([token])
        llama_cpp.llama_synchronize(ctx)
        now = time.perf_counter() - sent
        times.append(now)
        child.emit({"event": "token", "run": run, "text": "", "t": now})
        if child.stop.is_set():
            stopped = True
            break
    prefill_rate, decode_rate, _, _ = _perf(llama_cpp, llm)
    # In bench mode the first timed token is a decode step of its own, not the prompt's last logits.
    marks = [prefill_s, *times] if times else []
    figures = figures_from_times(pp, prefill_s, marks, prefill_rate, decode_rate, stopped)
    figures = figures.model_copy(update={"generated_tokens": len(times), "token_times_s": tuple(times)})
    child.emit({"event": "run_done", "run": run, "figures": figures.model_dump(mode="json")})


def open_model(llama_cpp: Any, settings: Any) -> Any:
    """``llama_cpp.Llama`` for a worker's settings (any record with the RunSettings field names;
    batch, ubatch, swa_full and seed default to llama-server's defaults when absent, threads to
    llama-server's count: :mod:`app.core.llama_defaults`). Raises ValueError or RuntimeError when
    llama.cpp refuses the file."""
    n_threads = settings.n_threads or llama_math_threads()
    return llama_cpp.Llama(
        model_path=settings.gguf_path,
        n_ctx=settings.n_ctx,
        n_batch=getattr(settings, "n_batch", llama_defaults.N_BATCH),
        n_ubatch=getattr(settings, "n_ubatch", llama_defaults.N_UBATCH),
        use_mmap=llama_defaults.USE_MMAP,
        n_gpu_layers=settings.n_gpu_layers,
        flash_attn=settings.flash_attn,
        type_k=GGML_TYPE_IDS[settings.cache_type_k],
        type_v=GGML_TYPE_IDS[settings.cache_type_v],
        swa_full=getattr(settings, "swa_full", True),
        n_threads=n_threads,
        n_threads_batch=n_threads,
        seed=getattr(settings, "seed", 0),
        tensor_split=list(getattr(settings, "tensor_split", ())) or None,
        verbose=False,
    )


_M = TypeVar("_M", bound=BaseModel)


def serve_child(settings_type: type[_M], run: Callable[[_Child, _M], int]) -> int:
    """The body of every llama.cpp child: events on the original stdout (anything llama.cpp or
    Python prints goes to stderr), its settings from the first line of stdin, "stop" watched on
    stdin, and any failure reported as an error event rather than raised."""
    events_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    child = _Child(os.fdopen(events_fd, "w", encoding="utf-8", buffering=1))
    try:
        settings = settings_type.model_validate_json(sys.stdin.readline())
    except Exception as exc:  # the parent sent nothing usable
        child.emit({"event": "error", "message": f"bad settings: {exc}"})
        return 2
    threading.Thread(target=child.watch_stdin, daemon=True).start()
    try:
        return run(child, settings)
    except Exception as exc:  # reported, not raised: the parent shows it
        child.emit({"event": "error", "message": f"{type(exc).__name__}: {exc}"})
        return 1


def _child_main() -> int:
    return serve_child(RunSettings, _child_run)


def _child_run(child: _Child, settings: RunSettings) -> int:
    started_at = time.time()
    import llama_cpp

    last_level = [0]

    def on_log(level: int, text: bytes | None, _user: ctypes.c_void_p) -> None:
        s = (text or b"").decode("utf-8", "replace")
        child.log_chunks.append(s)
        effective = last_level[0] if level == _LOG_LEVEL_CONT else level
        if effective == _LOG_LEVEL_ERROR:
            child.error_lines.append(s)
        if effective >= _LOG_LEVEL_INFO:
            child.info_chunks.append(s)
        last_level[0] = effective

    callback = llama_cpp.llama_log_callback(on_log)  # referenced for as long as llama.cpp may log
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
    gpu_ok = offloads_to_local_gpu(llama_cpp)  # before RPC devices join the list
    if settings.rpc_servers:
        from app.adapters.rpc_servers import RpcError, load_models_on, register_rpc_servers

        try:
            devices = register_rpc_servers(settings.rpc_servers)
        except RpcError as exc:
            child.emit({"event": "error", "message": str(exc)})
            return 1
        load_models_on(llama_cpp, devices)
    t0 = time.perf_counter()
    try:
        llm = open_model(llama_cpp, settings)
    except (ValueError, RuntimeError) as exc:
        reason = _reason(child.error_lines, "".join(child.log_chunks)) if child.error_lines else str(exc)
        child.emit({"event": "error", "message": f"llama.cpp could not load it: {reason}"})
        return 1
    load_s = time.perf_counter() - t0
    log = "".join(child.log_chunks)
    parsed = parse_llama_log(log)
    prompt = _prompt_tokens(llm, settings) if settings.mode == "generate" else []
    n_prompt = len(prompt) if settings.mode == "generate" else (settings.prompt_tokens or 512)
    needed = n_prompt + settings.max_tokens + settings.depth_tokens
    child.emit(
        {
            "event": "loaded",
            "started_at": started_at,
            "load_s": load_s,
            "llama_cpp_version": llama_cpp.__version__,
            "gpu_offload_supported": gpu_ok,
            "model_size_bytes": int(llama_cpp.llama_model_size(llm.model)),
            "n_layer": int(llama_cpp.llama_model_n_layer(llm.model)),
            "prompt_tokens": n_prompt,
            "n_threads": int(llama_cpp.llama_n_threads(llm._ctx.ctx)),
            "buffers": MeasuredBuffers(
                model_buffers=parsed.model_buffers,
                kv_buffers=parsed.kv_buffers,
                rs_buffers=parsed.rs_buffers,
                compute_buffers=parsed.compute_buffers,
                output_buffers=parsed.output_buffers,
                layers_offloaded=parsed.layers_offloaded,
                layers_offloadable=parsed.layers_offloadable,
            ).model_dump(mode="json"),
            "log_tail": _relevant_log("".join(child.info_chunks)),
        }
    )
    if needed > llm.n_ctx():
        child.emit(
            {
                "event": "error",
                "message": f"the prompt ({n_prompt} tokens) and {settings.max_tokens} new tokens need a context "
                f"of {needed}, more than the {llm.n_ctx()} set; raise the context or shorten the prompt",
            }
        )
        return 1
    for run in range(settings.repeat):
        if settings.mode == "bench":
            _bench(child, llama_cpp, llm, settings, run)
        else:
            _generate(child, llama_cpp, llm, settings, prompt, run)
        if child.stop.is_set():
            break
    sha, kind = "", "sha256"
    if not child.stop.is_set():
        try:
            sha, kind = _file_hash(Path(settings.gguf_path))
        except OSError:  # the file was moved or deleted during the run: the figures still stand
            sha, kind = "", "unavailable"
    child.emit({"event": "done", "sha256": sha, "hash_kind": kind, "peak_rss_bytes": _peak_rss_bytes()})
    return 0


if __name__ == "__main__":
    sys.exit(_child_main())
