"""What batching does on this machine: llama.cpp's decode step time for P sequences at once, the
prompt rate, and end-to-end batched runs, measured in a child process with llama.cpp's low-level API.

The parent (:func:`measure_batching`) starts ``python -m app.adapters.batch_probe`` through
:class:`~app.adapters.child_protocol.WorkerProcess`, sends the :class:`BatchSettings` and reads
its events: :class:`BatchLoaded`, :class:`~app.adapters.child_protocol.Progress` (measurements
finished of all), :class:`BatchDone` (the whole :class:`BatchProfile`) or
:class:`~app.adapters.child_protocol.Failed`. An abort inside llama.cpp therefore ends the child
only; the caller gets a :class:`BatchProbeError`.

One context serves every measurement: ``n_seq_max`` = the largest P, one KV buffer shared by all
sequences (``kv_unified``, as llama-server sets up its slots when ``-np`` is left at auto),
``n_ctx`` covering P x (prompt + generated) tokens. Threads: the physical cores unless given.
Tokens are random vocabulary ids (as llama-bench uses); generation is greedy (argmax of the
logits). Times are wall-clock seconds around ``llama_decode`` + ``llama_synchronize``; rates are
tokens per second.

- prefill: one sequence's ``prompt_tokens`` in one ``llama_decode`` (median of one sample per P and
  repetition, each taken just before that P's runs);
- decode step for P: after P prompts were prefilled, one ``llama_decode`` carrying one token for
  each of the P sequences (median over up to 16 steps per repetition);
- end-to-end run for P: P sequences start together. Their prompts go into the *same* batches, in
  sequence order, up to ``n_batch`` tokens per ``llama_decode`` -- llama-server's behaviour when
  several slots hold prompts (``update_slots`` fills one batch with every slot's pending prompt
  tokens). A sequence's first token is the argmax of its last prompt token's logits (its time to
  first token is when that batch ended); each later token costs one shared decode step.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import Field, model_validator

from app.adapters.child_protocol import (
    ChildChannel,
    ChildEvent,
    Done,
    Loaded,
    Progress,
    WorkerProcess,
    install_llama_log,
    llama_failed,
    require_file,
    serve_child,
)
from app.adapters.cpu_topology import llama_math_threads
from app.core.common.errors import FitScopeError
from app.core.common.units import Frozen
from app.core.speed import llama_defaults

MAX_STEP_SAMPLES = 16  # decode steps timed per P and repetition: enough for a stable median, cheap


class BatchProbeError(FitScopeError):
    """The batching measurement could not run; the message says why."""


class BatchSettings(Frozen):
    gguf_path: str
    parallel: tuple[int, ...] = (1, 2, 4)
    prompt_tokens: int = Field(default=64, ge=1)
    gen_tokens: int = Field(default=32, ge=1)
    context_tokens: int = Field(default=2048, ge=16)
    batch_tokens: int = Field(default=llama_defaults.N_BATCH, ge=1)
    ubatch_tokens: int = Field(default=llama_defaults.N_UBATCH, ge=1)
    n_threads: int | None = Field(default=None, ge=1)
    repeat: int = Field(default=2, ge=1, le=50)
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> BatchSettings:
        if not self.parallel or min(self.parallel) < 1:
            raise ValueError("parallel needs at least one sequence count, each at least 1")
        if len(set(self.parallel)) != len(self.parallel):
            raise ValueError(f"parallel has repeated values: {self.parallel}")
        return self

    @property
    def needed_ctx(self) -> int:
        return max(self.parallel) * (self.prompt_tokens + self.gen_tokens)


class BatchRun(Frozen):
    """One end-to-end run of P sequences started together. Seconds since the prompts were sent."""

    parallel: int
    prompt_tokens: int
    gen_tokens: int
    ttft_s: tuple[float, ...] = Field(description="per sequence: time to its first token")
    e2e_s: tuple[float, ...] = Field(description="per sequence: time to its last token")
    wall_s: float

    @property
    def tokens_per_s(self) -> float:
        """Aggregate throughput: every generated token over the run's wall time."""
        return self.parallel * self.gen_tokens / self.wall_s

    @property
    def mean_ttft_s(self) -> float:
        return statistics.fmean(self.ttft_s)

    @property
    def mean_e2e_s(self) -> float:
        return statistics.fmean(self.e2e_s)


class BatchProfile(Frozen):
    """What batching does on this machine for one model (see the module doc for the definitions)."""

    gguf_path: str
    llama_cpp_version: str
    n_threads: int
    n_ctx: int
    n_batch: int
    prompt_tokens: int
    gen_tokens: int
    repeat: int
    load_s: float
    prefill_samples_s: tuple[float, ...]
    decode_step_samples_s: dict[int, tuple[float, ...]]
    runs: tuple[BatchRun, ...] = Field(description="every end-to-end repetition, for every P")

    @property
    def parallel(self) -> tuple[int, ...]:
        return tuple(sorted(self.decode_step_samples_s))

    @property
    def prefill_s(self) -> float:
        """Median time to prefill one sequence's ``prompt_tokens``."""
        return statistics.median(self.prefill_samples_s)

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s

    @property
    def decode_step_s(self) -> dict[int, float]:
        """P -> median seconds of one step advancing P sequences by one token each."""
        return {p: statistics.median(s) for p, s in sorted(self.decode_step_samples_s.items())}

    @property
    def decode_tokens_per_s(self) -> dict[int, float]:
        return {p: p / s for p, s in self.decode_step_s.items()}

    def runs_for(self, parallel: int) -> tuple[BatchRun, ...]:
        return tuple(r for r in self.runs if r.parallel == parallel)

    def median_run_figures(self, parallel: int) -> tuple[float, float, float]:
        """P's end-to-end runs summarised figure by figure: median aggregate tokens/s, median of the
        mean time to first token, median of the mean end-to-end latency."""
        runs = self.runs_for(parallel)
        if not runs:
            raise KeyError(parallel)
        return (
            statistics.median(r.tokens_per_s for r in runs),
            statistics.median(r.mean_ttft_s for r in runs),
            statistics.median(r.mean_e2e_s for r in runs),
        )

    def run(self, parallel: int) -> BatchRun:
        """The repetition of P's end-to-end run with the median throughput; of two middle ones the
        faster, since interference from the rest of the machine only ever slows a run down."""
        runs = sorted(self.runs_for(parallel), key=lambda r: r.tokens_per_s)
        if not runs:
            raise KeyError(parallel)
        return runs[len(runs) // 2]


class BatchLoaded(Loaded):
    """The model and its context are ready."""

    load_s: float
    n_threads: int
    n_ctx: int
    llama_cpp_version: str


class BatchDone(Done):
    """Every measurement is finished."""

    profile: BatchProfile


BATCH_EVENTS = (BatchLoaded, Progress, BatchDone)


# -- parent side ---------------------------------------------------------------------------------


def measure_batching(
    gguf_path: str | os.PathLike[str],
    *,
    parallel: Sequence[int] = (1, 2, 4),
    prompt_tokens: int = 64,
    gen_tokens: int = 32,
    n_ctx: int = 2048,
    n_threads: int | None = None,
    repeat: int = 2,
    n_batch: int = llama_defaults.N_BATCH,
    seed: int = 0,
    timeout_s: float = 600.0,
    on_event: Callable[[ChildEvent], None] | None = None,
) -> BatchProfile:
    """Measure prefill, batched decode steps and batched end-to-end runs of ``gguf_path`` in a
    llama.cpp child process (CPU or whatever backend llama-cpp-python was built with).

    ``n_threads`` defaults to llama-server's count (``cpu_topology.llama_math_threads``).
    ``on_event`` receives the child's events (:class:`BatchLoaded`,
    :class:`~app.adapters.child_protocol.Progress`, ...) on the calling thread. Raises
    :class:`BatchProbeError` for impossible settings, a model llama.cpp refuses, a child that
    dies, or one that runs past ``timeout_s``.
    """
    path = require_file(gguf_path, BatchProbeError)
    try:
        settings = BatchSettings(
            gguf_path=str(path),
            parallel=tuple(parallel),
            prompt_tokens=prompt_tokens,
            gen_tokens=gen_tokens,
            context_tokens=n_ctx,
            batch_tokens=n_batch,
            n_threads=n_threads or llama_math_threads(),
            repeat=repeat,
            seed=seed,
        )
    except ValueError as exc:
        raise BatchProbeError(f"Impossible batching settings: {exc}") from exc
    if settings.needed_ctx > n_ctx:
        raise BatchProbeError(
            f"{max(settings.parallel)} sequences of {prompt_tokens} + {gen_tokens} tokens need a context of "
            f"{settings.needed_ctx} tokens, more than the {n_ctx} set; raise n_ctx or use fewer or shorter sequences."
        )

    worker = WorkerProcess("app.adapters.batch_probe", settings, BATCH_EVENTS, name=path.name, timeout_s=timeout_s)
    worker.follow(on_event)
    message = worker.failure(f"while measuring batching on {path.name}")
    if message is not None or not isinstance(worker.done, BatchDone):
        raise BatchProbeError(message or f"{path.name}: the batching measurement sent no result.")
    return worker.done.profile


# -- child side ----------------------------------------------------------------------------------


class _Engine:
    """A llama.cpp context driven one ``llama_decode`` at a time."""

    def __init__(self, lib: Any, ctx: Any, n_vocab: int, n_batch: int) -> None:
        import numpy as np

        self._np = np
        self.lib = lib
        self.ctx = ctx
        self.mem = lib.llama_get_memory(ctx)
        self.n_vocab = n_vocab
        self.n_batch = n_batch
        # One sequence id per token is all this needs, so the batch holds one seq id slot each.
        self.batch = lib.llama_batch_init(n_batch, 0, 1)

    def close(self) -> None:
        self.lib.llama_batch_free(self.batch)

    def clear(self) -> None:
        self.lib.llama_memory_clear(self.mem, True)

    def decode(self, entries: Sequence[tuple[int, int, int, bool]]) -> None:
        """(token, position, sequence, wants logits) for each token; waits for the backend."""
        b = self.batch
        b.n_tokens = len(entries)
        for i, (token, pos, seq, logits) in enumerate(entries):
            b.token[i] = token
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = logits
        rc = self.lib.llama_decode(self.ctx, b)
        self.lib.llama_synchronize(self.ctx)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} for a batch of {len(entries)} tokens")

    def argmax(self, i: int) -> int:
        logits = self._np.ctypeslib.as_array(self.lib.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,))
        return int(logits.argmax())

    def prefill(self, prompts: Sequence[Sequence[int]], t0: float) -> tuple[list[int], list[float]]:
        """Every prompt, sequence after sequence, in batches of up to ``n_batch`` tokens. Returns
        each sequence's first token and the time (since ``t0``) it was known."""
        flat = [(tok, pos, seq, pos == len(p) - 1) for seq, p in enumerate(prompts) for pos, tok in enumerate(p)]
        first = [0] * len(prompts)
        when = [0.0] * len(prompts)
        for start in range(0, len(flat), self.n_batch):
            chunk = flat[start : start + self.n_batch]
            self.decode(chunk)
            for i, (_, _, seq, last) in enumerate(chunk):
                if last:
                    first[seq] = self.argmax(i)
            now = time.perf_counter() - t0
            for _, _, seq, last in chunk:
                if last:
                    when[seq] = now
        return first, when

    def step(self, tokens: Sequence[int], pos: int) -> tuple[list[int], float]:
        """One decode step: token ``tokens[s]`` at ``pos`` for every sequence s. Returns the next
        tokens and the seconds llama_decode took."""
        t = time.perf_counter()
        self.decode([(tok, pos, seq, True) for seq, tok in enumerate(tokens)])
        took = time.perf_counter() - t
        return [self.argmax(i) for i in range(len(tokens))], took


def _measure(child: ChildChannel, settings: BatchSettings) -> int:
    import llama_cpp as lib

    log = install_llama_log(lib)
    lib.llama_backend_init()

    def failure(action: str) -> int:
        child.emit(llama_failed(action, log))
        return 1

    n_threads = settings.n_threads or llama_math_threads()
    t0 = time.perf_counter()
    mparams = lib.llama_model_default_params()
    model = lib.llama_model_load_from_file(settings.gguf_path.encode(), mparams)
    if not model:
        return failure("load it")
    cparams = lib.llama_context_default_params()
    cparams.n_ctx = settings.context_tokens
    cparams.n_batch = settings.batch_tokens
    cparams.n_ubatch = min(settings.ubatch_tokens, settings.batch_tokens)
    cparams.n_seq_max = max(settings.parallel)
    cparams.kv_unified = True
    cparams.n_threads = n_threads
    cparams.n_threads_batch = n_threads
    ctx = lib.llama_init_from_model(model, cparams)
    if not ctx:
        lib.llama_model_free(model)
        return failure("create a context")
    load_s = time.perf_counter() - t0
    if lib.llama_n_ctx(ctx) < settings.needed_ctx:
        message = (
            f"llama.cpp made a context of {lib.llama_n_ctx(ctx)} tokens, fewer than the "
            f"{settings.needed_ctx} the sequences need (the model's training context may cap it)"
        )
        lib.llama_free(ctx)
        lib.llama_model_free(model)
        return child.fail(message)
    n_vocab = int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model)))
    engine = _Engine(lib, ctx, n_vocab, settings.batch_tokens)
    child.emit(
        BatchLoaded(
            load_s=load_s, n_threads=n_threads, n_ctx=int(lib.llama_n_ctx(ctx)), llama_cpp_version=lib.__version__
        )
    )
    try:
        profile = _run_measurements(child, engine, settings, n_vocab)
    finally:
        engine.close()
        lib.llama_free(ctx)
        lib.llama_model_free(model)
    profile.update(
        gguf_path=settings.gguf_path,
        llama_cpp_version=lib.__version__,
        n_threads=n_threads,
        n_ctx=settings.context_tokens,
        n_batch=settings.batch_tokens,
        prompt_tokens=settings.prompt_tokens,
        gen_tokens=settings.gen_tokens,
        repeat=settings.repeat,
        load_s=load_s,
    )
    child.emit(BatchDone(profile=BatchProfile.model_validate(profile)))
    return 0


def _run_measurements(child: ChildChannel, engine: _Engine, settings: BatchSettings, n_vocab: int) -> dict[str, Any]:
    rng = random.Random(settings.seed)
    n_prompt, n_gen = settings.prompt_tokens, settings.gen_tokens

    def prompts(p: int) -> list[list[int]]:
        return [[rng.randrange(n_vocab) for _ in range(n_prompt)] for _ in range(p)]

    # Warm-up: the first calls page the weights in and build the graphs.
    engine.clear()
    first, _ = engine.prefill(prompts(1), time.perf_counter())
    for k in range(2):
        first, _ = engine.step(first, n_prompt + k)

    prefill: list[float] = []
    steps: dict[int, list[float]] = {p: [] for p in settings.parallel}
    runs: list[dict[str, Any]] = []
    n_steps = min(max(n_gen - 1, 1), MAX_STEP_SAMPLES)
    total = settings.repeat * len(settings.parallel)
    for rep in range(settings.repeat):
        for i, p in enumerate(settings.parallel):
            child.emit(Progress(done=rep * len(settings.parallel) + i, total=total))
            # A lone prefill next to every P's runs rather than all in one block: whatever else the
            # machine is doing then weighs on both sides of the comparison alike.
            engine.clear()
            t = time.perf_counter()
            engine.prefill(prompts(1), t)
            prefill.append(time.perf_counter() - t)
            # Single decode steps of P sequences, at the depth the end-to-end run starts from.
            engine.clear()
            tokens, _ = engine.prefill(prompts(p), time.perf_counter())
            for k in range(n_steps):
                tokens, took = engine.step(tokens, n_prompt + k)
                steps[p].append(took)
            # The end-to-end run: P sequences sent together, as llama-server with P busy slots.
            engine.clear()
            t0 = time.perf_counter()
            tokens, ttft = engine.prefill(prompts(p), t0)
            for k in range(n_gen - 1):
                tokens, _ = engine.step(tokens, n_prompt + k)
            wall = time.perf_counter() - t0
            runs.append(
                {
                    "parallel": p,
                    "prompt_tokens": n_prompt,
                    "gen_tokens": n_gen,
                    "ttft_s": ttft,
                    "e2e_s": [wall] * p if n_gen > 1 else ttft,
                    "wall_s": wall,
                }
            )
    return {"prefill_samples_s": prefill, "decode_step_samples_s": steps, "runs": runs}


if __name__ == "__main__":
    sys.exit(serve_child(BatchSettings, _measure))
