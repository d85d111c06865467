"""Live generation with the real llama.cpp (llama-cpp-python), in a child process.

The parent (:func:`run_live`) starts ``python -m app.adapters.llamacpp_runner`` through
:class:`~app.adapters.child_protocol.WorkerProcess`, sends it the
:class:`~app.core.speed.measure.RunSettings` and reads its events: :class:`LiveLoaded` (load time,
llama.cpp's buffer report), :class:`~app.adapters.child_protocol.Token` (text, time since the
prompt was sent), :class:`RunDone` (one repetition's figures), :class:`LiveDone` (the file's hash,
peak memory) or :class:`~app.adapters.child_protocol.Failed`. An abort inside llama.cpp therefore
ends the child only; the caller gets a :class:`RunError` with llama.cpp's own reason.

Stopping: the parent writes ``stop`` on the child's stdin; the child checks between tokens and
finishes the repetition as stopped. If it has not exited a second later (a long prefill, a stuck
backend), it is ended. If the parent dies, the child sees its stdin close and exits.

Timing in the child follows llama.cpp's ``llama_perf_context`` and llama-bench: ``generate``
mode streams a prompt's completion token by token; ``bench`` mode processes ``prompt_tokens``
random tokens as one batch (pp) and then generates ``max_tokens`` one at a time (tg), after
``depth_tokens`` of context were filled untimed.
"""

from __future__ import annotations

import codecs
import hashlib
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from app.adapters.chat_render import render_conversations
from app.adapters.child_protocol import (
    ChildChannel,
    ChildEvent,
    Done,
    Loaded,
    Token,
    WorkerProcess,
    install_llama_log,
    llama_failed,
    peak_rss_bytes,
    require_file,
    serve_child,
)
from app.adapters.contention import CpuWatch, hot_sensor
from app.adapters.cpu_topology import llama_math_threads, with_llama_threads
from app.adapters.llama_log import GGML_TYPE_IDS, parse_llama_log
from app.adapters.rpc_backend import offloads_to_local_gpu
from app.core.common.errors import FitScopeError
from app.core.quality.chat import ChatTemplateError, messages_for
from app.core.speed import llama_defaults
from app.core.speed.measure import MeasuredBuffers, RunFigures, RunResult, RunSettings, figures_from_times

HashKind = Literal["sha256", "sha256-head-tail", "unavailable"]
FULL_HASH_LIMIT_BYTES = 2 * 1024**3
HASH_SLICE_BYTES = 64 * 1024**2
FILLER_TEXT = (
    "The history of measurement is a history of agreement: a length, a weight or a second means "
    "something only because many people decided to count it the same way, and the tools that "
    "count it were checked against each other again and again. "
)

LiveRun = WorkerProcess
"""The handle :func:`run_live` (and every other worker) gives ``on_start``: ``stop()`` from any thread."""


class RunError(FitScopeError):
    """The model could not be loaded or run; the message says why in llama.cpp's words."""


class LiveLoaded(Loaded):
    """The model is loaded: what llama.cpp reported. ``threads`` is set by :func:`sweep_threads`
    (this sweep step's thread count), None otherwise."""

    started_at: float
    load_s: float
    llama_cpp_version: str
    gpu_offload_supported: bool
    model_size_bytes: int
    n_layer: int
    prompt_tokens: int
    n_threads: int
    buffers: MeasuredBuffers
    log_tail: str = ""
    threads: int | None = None
    prompt_format: Literal["chat template", "raw"] = "raw"


class RunDone(ChildEvent):
    """Repetition ``run`` is finished (or stopped): its figures."""

    event: Literal["run_done"] = "run_done"
    run: int
    figures: RunFigures


class LiveDone(Done):
    """Every repetition is finished: the file's hash (empty after a stop) and the peak memory."""

    sha256: str = ""
    hash_kind: HashKind = "sha256"
    peak_rss_bytes: int | None = None


LIVE_EVENTS = (LiveLoaded, Token, RunDone, LiveDone)


# -- parent side ---------------------------------------------------------------------------------


def run_live(
    settings: RunSettings,
    on_event: Callable[[ChildEvent], None] | None = None,
    on_start: Callable[[LiveRun], None] | None = None,
    hardware: dict[str, str] | None = None,
) -> RunResult:
    """Run ``settings`` in a llama.cpp child process and return what was measured.

    ``on_event`` receives every event as it arrives (tokens included), on the calling thread.
    ``on_start`` receives the :class:`LiveRun`, so that another thread can call ``stop()``; a
    stopped run returns the repetitions finished so far (the current one marked ``stopped``).
    Raises :class:`RunError` when the model cannot be loaded or the child dies.
    """
    require_file(settings.gguf_path, RunError)
    run_settings = with_llama_threads(settings)
    live = WorkerProcess("app.adapters.llamacpp_runner", run_settings, LIVE_EVENTS, name=Path(settings.gguf_path).name)
    if on_start is not None:
        on_start(live)
    loaded: LiveLoaded | None = None
    runs: list[RunFigures] = []
    tokens: list[float] = []
    text_parts: list[str] = []
    # What else the machine did while the model generated (a run measured then calibrates nothing).
    watch: CpuWatch | None = None

    def handle(event: ChildEvent) -> None:
        nonlocal loaded, tokens, text_parts, watch
        if isinstance(event, LiveLoaded):
            loaded = event
            if live.pid is not None:
                watch = CpuWatch(live.pid)
                watch.start()
        elif isinstance(event, Token):
            if event.run != len(runs):
                return
            tokens.append(event.t_s)
            text_parts.append(event.text)
        elif isinstance(event, RunDone):
            runs.append(event.figures)
            if watch is not None:
                watch.stop()  # the child is still there to be read; the last repetition's mark counts
            tokens = []
            if len(runs) < settings.repeat:
                text_parts = []
        if on_event is not None:
            on_event(event)

    code = live.follow(handle)
    if live.failed is None and live.done is None and not live.stop_requested:
        _raise_if_rpc_server_stopped(settings, code)
    message = live.failure("during the run")
    if message is not None or loaded is None:
        raise RunError(message or f"{live.name} sent no load report.")
    done = live.done if isinstance(live.done, LiveDone) else None
    if done is None and tokens and live.stop_requested:
        # Ended mid-repetition after a stop: keep what was streamed.
        runs.append(figures_from_times(loaded.prompt_tokens, tokens[0], tokens, stopped=True))
    final = done or LiveDone()
    return RunResult(
        settings=run_settings,
        started_at=loaded.started_at,
        llama_cpp_version=loaded.llama_cpp_version,
        gpu_offload_supported=loaded.gpu_offload_supported,
        model_size_bytes=loaded.model_size_bytes,
        model_sha256=final.sha256,
        model_hash_kind=final.hash_kind,
        n_layer=loaded.n_layer,
        load_s=loaded.load_s,
        runs=tuple(runs),
        buffers=loaded.buffers,
        peak_rss_bytes=final.peak_rss_bytes,
        output_text="".join(text_parts),
        hardware=hardware or {},
        log_tail=loaded.log_tail,
        prompt_format=loaded.prompt_format,
        n_threads_used=loaded.n_threads,
        llama_server_threads=llama_math_threads(),
        others_cpu_share=watch.others_share if watch is not None else None,
        hot_sensor=hot_sensor(),
    )


def _raise_if_rpc_server_stopped(settings: RunSettings, code: int) -> None:
    """A run across RPC servers that died: name the server that went away (llama.cpp only says
    "Remote RPC server crashed or returned malformed response" and aborts)."""
    if not settings.rpc_servers:
        return
    from app.adapters.rpc_backend import stopped_during_run_message

    gone = stopped_during_run_message(settings.rpc_servers)
    if gone:
        raise RunError(f"{Path(settings.gguf_path).name}: {gone} (llama.cpp exited with code {code}).")


def sweep_threads(
    settings: RunSettings,
    counts: tuple[int, ...],
    on_event: Callable[[ChildEvent], None] | None = None,
    on_start: Callable[[LiveRun], None] | None = None,
) -> list[RunResult]:
    """Runs ``settings`` once per thread count in ``counts`` (one child each, in order) and returns
    the results; a stop ends the sweep after the run it interrupted. Each run's
    :class:`LiveLoaded` event carries its count in ``threads``. Raises :class:`RunError` as
    :func:`run_live` does."""
    results: list[RunResult] = []
    lives: list[LiveRun] = []

    def started(live: LiveRun) -> None:
        lives.append(live)
        if on_start is not None:
            on_start(live)

    for n in counts:

        def tagged(event: ChildEvent, n: int = n) -> None:
            if on_event is None:
                return
            on_event(event.model_copy(update={"threads": n}) if isinstance(event, LiveLoaded) else event)

        results.append(run_live(settings.model_copy(update={"n_threads": n}), on_event=tagged, on_start=started))
        if lives and lives[-1].stop_requested:
            break
    return results


# -- child side ----------------------------------------------------------------------------------


def _file_hash(path: Path) -> tuple[str, HashKind]:
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


class PromptRenderer:
    """Turns a prompt into the tokens the model is given: through the model's own chat template (as
    llama-server does with ``--jinja``) when asked and the GGUF has one, else as typed. The Run tab,
    ``fitscope run --chat`` and the task suites all prompt through this. Templates are rendered in
    a child process under a time and memory budget (:mod:`app.adapters.chat_render`); call
    :meth:`render_all` first to render many prompts in one child."""

    def __init__(self, llama_cpp: Any, llm: Any, chat: bool, system_prompt: str | None = None) -> None:
        self._llm = llm
        self._system = system_prompt
        self.template: str | None = llm.metadata.get("tokenizer.chat_template") if chat else None
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        self._bos = self._token_text(llama_cpp.llama_vocab_bos(vocab))
        self._eos = self._token_text(llama_cpp.llama_vocab_eos(vocab))
        self._rendered: dict[str, str | ChatTemplateError] = {}

    @property
    def prompt_format(self) -> Literal["chat template", "raw"]:
        return "chat template" if self.template else "raw"

    def _token_text(self, token: int) -> str:
        return self._llm.detokenize([token], special=True).decode("utf-8", "replace") if token >= 0 else ""

    def render_all(self, texts: Sequence[str]) -> None:
        """Render every prompt of ``texts`` not rendered yet, in one child process."""
        if not self.template:
            return
        todo = [t for t in dict.fromkeys(texts) if t not in self._rendered]
        conversations = [messages_for(t, self._system) for t in todo]
        rendered = render_conversations(self.template, conversations, self._bos, self._eos)
        self._rendered.update(zip(todo, rendered, strict=True))

    def tokens(self, text: str) -> list[int]:
        """Raises ChatTemplateError when the template refuses the messages or goes over its budget."""
        if not self.template:
            return self._llm.tokenize(text.encode("utf-8"), add_bos=True)
        if text not in self._rendered:
            self.render_all([text])
        rendered = self._rendered[text]
        if isinstance(rendered, ChatTemplateError):
            raise ChatTemplateError(str(rendered))
        return self._llm.tokenize(rendered.encode("utf-8"), add_bos=True, special=True)


def _prompt_tokens(llm: Any, settings: RunSettings, renderer: PromptRenderer) -> list[int]:
    if settings.prompt_tokens:
        filler = llm.tokenize(FILLER_TEXT.encode(), add_bos=False)
        tokens = llm.tokenize(b"", add_bos=True)
        while len(tokens) < settings.prompt_tokens:
            tokens += filler
        return tokens[: settings.prompt_tokens]
    return renderer.tokens(settings.prompt or "Hello")


def _perf(llama_cpp: Any, llm: Any) -> tuple[float | None, float | None, int, int]:
    data = llama_cpp.llama_perf_context(llm._ctx.ctx)
    p_ms, n_p = float(data.t_p_eval_ms), int(data.n_p_eval)
    e_ms, n_e = float(data.t_eval_ms), int(data.n_eval)
    prefill = n_p / (p_ms / 1000) if p_ms > 0 and n_p > 0 else None
    decode = n_e / (e_ms / 1000) if e_ms > 0 and n_e > 0 else None
    return prefill, decode, n_p, n_e


def _generate(
    child: ChildChannel, llama_cpp: Any, llm: Any, settings: RunSettings, prompt: list[int], run: int
) -> None:
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
        child.emit(Token(run=run, text=decoder.decode(piece), t_s=now))
        if len(times) >= settings.max_tokens:
            break
        if child.stop_requested:
            stopped = True
            break
    prefill_rate, decode_rate, _, _ = _perf(llama_cpp, llm)
    prefill_s = times[0] if times else time.perf_counter() - sent
    figures = figures_from_times(len(prompt), prefill_s, times, prefill_rate, decode_rate, stopped)
    child.emit(RunDone(run=run, figures=figures))


def _bench(child: ChildChannel, llama_cpp: Any, llm: Any, settings: RunSettings, run: int) -> None:
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
        child.emit(Token(run=run, t_s=now))
        if child.stop_requested:
            stopped = True
            break
    prefill_rate, decode_rate, _, _ = _perf(llama_cpp, llm)
    # In bench mode the first timed token is a decode step of its own, not the prompt's last logits.
    marks = [prefill_s, *times] if times else []
    figures = figures_from_times(pp, prefill_s, marks, prefill_rate, decode_rate, stopped)
    figures = figures.model_copy(update={"generated_tokens": len(times), "token_times_s": tuple(times)})
    child.emit(RunDone(run=run, figures=figures))


class _TemplateNotCompiled:
    """Stands in for llama-cpp-python's ``Jinja2ChatFormatter`` in a worker (see
    :func:`skip_binding_templates`)."""

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        pass

    def to_chat_handler(self) -> Any:
        def refuse(*_args: Any, **_kwargs: Any) -> Any:
            raise RuntimeError("FitScope renders chat templates itself (app.adapters.chat_render)")

        return refuse


def skip_binding_templates(llama_cpp: Any) -> None:
    """Keep llama-cpp-python from compiling the model's chat templates when ``Llama`` loads it.

    ``Llama.__init__`` compiles every ``tokenizer.chat_template*`` of the file with Jinja, without
    limits, for its chat-completion API, which FitScope never calls: a hostile template would hang
    or exhaust memory there, and one nested too deeply failed the load as "llama.cpp could not load
    it: maximum recursion depth exceeded". FitScope renders templates itself, under a budget."""
    formats = getattr(llama_cpp, "llama_chat_format", None)
    if formats is not None:
        formats.Jinja2ChatFormatter = _TemplateNotCompiled


def open_model(llama_cpp: Any, settings: Any) -> Any:
    """``llama_cpp.Llama`` for a worker's settings (any record with the RunSettings field names;
    batch, ubatch, swa_full and seed default to llama-server's defaults when absent, threads to
    llama-server's count: :mod:`app.core.speed.llama_defaults`). Raises ValueError or RuntimeError when
    llama.cpp refuses the file."""
    n_threads = settings.n_threads or llama_math_threads()
    skip_binding_templates(llama_cpp)
    return llama_cpp.Llama(
        model_path=settings.gguf_path,
        n_ctx=settings.context_tokens,
        n_batch=getattr(settings, "batch_tokens", llama_defaults.N_BATCH),
        n_ubatch=getattr(settings, "ubatch_tokens", llama_defaults.N_UBATCH),
        use_mmap=llama_defaults.USE_MMAP,
        n_gpu_layers=-1 if settings.gpu_layers == "all" else settings.gpu_layers,
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


def _context_sentence(n_prompt: int, settings: RunSettings, n_ctx: int) -> str:
    needed = n_prompt + settings.max_tokens + settings.depth_tokens
    return (
        f"the prompt ({n_prompt} tokens) and {settings.max_tokens} new tokens need a context "
        f"of {needed}, more than the {n_ctx} set; raise the context or shorten the prompt"
    )


def _child_run(child: ChildChannel, settings: RunSettings) -> int:
    started_at = time.time()
    import llama_cpp

    log = install_llama_log(llama_cpp)
    gpu_ok = offloads_to_local_gpu(llama_cpp)  # before RPC devices join the list
    if settings.rpc_servers:
        from app.adapters.rpc_backend import RpcError, load_models_on, register_rpc_servers

        try:
            devices = register_rpc_servers(settings.rpc_servers)
        except RpcError as exc:
            return child.fail(str(exc))
        load_models_on(llama_cpp, devices)
    t0 = time.perf_counter()
    try:
        llm = open_model(llama_cpp, settings)
    except (ValueError, RuntimeError) as exc:
        child.emit(llama_failed("load it", log, str(exc)))
        return 1
    load_s = time.perf_counter() - t0
    parsed = parse_llama_log(log.text())
    if settings.prompt_tokens or settings.mode == "bench":
        # A synthetic prompt's length is known: refuse it before building it (a billion tokens
        # would take gigabytes just to be refused afterwards).
        known = settings.prompt_tokens or 512
        if known + settings.max_tokens + settings.depth_tokens > llm.n_ctx():
            return child.fail(_context_sentence(known, settings, llm.n_ctx()))
    renderer = PromptRenderer(llama_cpp, llm, settings.chat and not settings.prompt_tokens, settings.system_prompt)
    try:
        prompt = _prompt_tokens(llm, settings, renderer) if settings.mode == "generate" else []
    except ChatTemplateError as exc:
        return child.fail(str(exc))
    n_prompt = len(prompt) if settings.mode == "generate" else (settings.prompt_tokens or 512)
    needed = n_prompt + settings.max_tokens + settings.depth_tokens
    child.emit(
        LiveLoaded(
            started_at=started_at,
            load_s=load_s,
            llama_cpp_version=llama_cpp.__version__,
            gpu_offload_supported=gpu_ok,
            model_size_bytes=int(llama_cpp.llama_model_size(llm.model)),
            n_layer=int(llama_cpp.llama_model_n_layer(llm.model)),
            prompt_tokens=n_prompt,
            n_threads=int(llama_cpp.llama_n_threads(llm._ctx.ctx)),
            buffers=MeasuredBuffers(
                model_buffers=parsed.model_buffers,
                kv_buffers=parsed.kv_buffers,
                rs_buffers=parsed.rs_buffers,
                compute_buffers=parsed.compute_buffers,
                output_buffers=parsed.output_buffers,
                layers_offloaded=parsed.layers_offloaded,
                layers_offloadable=parsed.layers_offloadable,
            ),
            log_tail=_relevant_log(log.info_text()),
            prompt_format=renderer.prompt_format if settings.mode == "generate" else "raw",
        )
    )
    if needed > llm.n_ctx():
        return child.fail(_context_sentence(n_prompt, settings, llm.n_ctx()))
    for run in range(settings.repeat):
        if settings.mode == "bench":
            _bench(child, llama_cpp, llm, settings, run)
        else:
            _generate(child, llama_cpp, llm, settings, prompt, run)
        if child.stop_requested:
            break
    sha: str = ""
    kind: HashKind = "sha256"
    if not child.stop_requested:
        try:
            sha, kind = _file_hash(Path(settings.gguf_path))
        except OSError:  # the file was moved or deleted during the run: the figures still stand
            sha, kind = "", "unavailable"
    child.emit(LiveDone(sha256=sha, hash_kind=kind, peak_rss_bytes=peak_rss_bytes()))
    return 0


if __name__ == "__main__":
    sys.exit(serve_child(RunSettings, _child_run))
