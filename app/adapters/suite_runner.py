"""Run a task suite's prompts on one model file with the real llama.cpp, in a child process: each
prompt's greedy answer with its timings, and, given a reference variant's answers, how often this
variant agrees with them.

Agreement is measured two ways, both over the reference's greedy tokens:

- identical greedy tokens: the share of positions where this variant's own greedy answer has
  the same token as the reference's;
- top-1 agreement of next-token logits: the reference's tokens are fed to this variant one by one
  (teacher forcing), and at each position its most likely next token is compared with the
  reference's. Unlike the first, one early difference does not make every later position differ.

Quantized variants of one model share its vocabulary, so token ids compare directly.

Protocol: :mod:`app.adapters.child_protocol` (settings as one JSON line on stdin, one event per
line on stdout: :class:`SuiteLoaded`, :class:`PromptDone` and :class:`Agreement` per prompt,
:class:`SuiteDone`; ``stop`` on stdin ends it early).
"""

from __future__ import annotations

import codecs
import os
import sys
import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field

from app.adapters.child_protocol import (
    ChildChannel,
    ChildEvent,
    Done,
    Loaded,
    WorkerProcess,
    install_llama_log,
    llama_failed,
    peak_rss_bytes,
    require_file,
    serve_child,
)
from app.adapters.cpu_topology import with_llama_threads
from app.adapters.llama_log import parse_llama_log
from app.adapters.llamacpp_runner import PromptRenderer, RunError, open_model
from app.core.common.errors import FitScopeError
from app.core.common.units import Frozen
from app.core.memory.records import GpuLayers


class PromptJob(Frozen):
    id: str
    prompt: str
    max_tokens: int = Field(default=96, ge=1)


class SuiteRunSettings(Frozen):
    gguf_path: str
    prompts: tuple[PromptJob, ...]
    reference: dict[str, list[int]] | None = None
    context_tokens: int = 4096
    gpu_layers: GpuLayers = 0
    flash_attn: bool = True
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    n_threads: int | None = None
    chat: bool = Field(default=True, description="through the model's chat template when it has one")
    system_prompt: str | None = None


class PromptOutcome(Frozen):
    id: str
    text: str
    tokens: tuple[int, ...]
    prompt_tokens: int
    ttft_s: float
    prefill_tokens_per_s: float | None
    decode_tokens_per_s: float | None
    error: str | None = None  # why no answer was produced (llama.cpp's reason); the prompt then fails
    identical_tokens: int | None = None  # positions equal to the reference's greedy answer
    top1_matches: int | None = None  # teacher-forced next-token agreements with the reference
    reference_tokens: int | None = None


class SuiteRun(Frozen):
    gguf_path: str
    load_s: float
    model_size_bytes: int
    buffers: dict[str, dict[str, int]]
    peak_rss_bytes: int | None
    outcomes: tuple[PromptOutcome, ...]
    stopped: bool = False
    n_threads: int | None = None
    prompt_format: str = "raw"  # "chat template" or "raw" (a model without a template, or asked so)


class SuiteLoaded(Loaded):
    """The model is loaded: how prompts are rendered, the load time and llama.cpp's buffers
    (kind -> device -> bytes)."""

    prompt_format: str
    load_s: float
    model_size_bytes: int
    buffers: dict[str, dict[str, int]]


class PromptDone(ChildEvent):
    """One prompt's greedy answer (and its agreement with the reference's tokens)."""

    event: Literal["prompt_done"] = "prompt_done"
    outcome: PromptOutcome


class Agreement(ChildEvent):
    """Teacher-forced top-1 agreement of prompt ``id`` with the reference's answer."""

    event: Literal["agreement"] = "agreement"
    id: str
    top1_matches: int
    reference_tokens: int


class SuiteDone(Done):
    """Every prompt is answered."""

    peak_rss_bytes: int | None = None


SUITE_EVENTS = (SuiteLoaded, PromptDone, Agreement, SuiteDone)


def run_suite(
    settings: SuiteRunSettings,
    on_event: Callable[[ChildEvent], None] | None = None,
    on_start: Callable[[WorkerProcess], None] | None = None,
) -> SuiteRun:
    """Answer every prompt on ``settings.gguf_path`` (and compare with ``settings.reference``).
    Raises RunError when the model cannot be loaded or the child dies."""
    require_file(settings.gguf_path, RunError)
    name = os.path.basename(settings.gguf_path)
    live = WorkerProcess("app.adapters.suite_runner", with_llama_threads(settings), SUITE_EVENTS, name=name)
    if on_start is not None:
        on_start(live)
    loaded: SuiteLoaded | None = None
    outcomes: dict[str, PromptOutcome] = {}

    def handle(event: ChildEvent) -> None:
        nonlocal loaded
        if isinstance(event, SuiteLoaded):
            loaded = event
        elif isinstance(event, PromptDone):
            outcomes[event.outcome.id] = event.outcome
        elif isinstance(event, Agreement) and event.id in outcomes:
            outcomes[event.id] = outcomes[event.id].model_copy(
                update={"top1_matches": event.top1_matches, "reference_tokens": event.reference_tokens}
            )
        if on_event is not None:
            on_event(event)

    live.follow(handle)
    message = live.failure(f"while answering the suite on {name}")
    if message is not None or loaded is None:
        raise RunError(message or f"{name} sent no load report.")
    done = live.done if isinstance(live.done, SuiteDone) else None
    return SuiteRun(
        gguf_path=settings.gguf_path,
        load_s=loaded.load_s,
        model_size_bytes=loaded.model_size_bytes,
        buffers=loaded.buffers,
        peak_rss_bytes=done.peak_rss_bytes if done is not None else None,
        outcomes=tuple(outcomes.values()),
        stopped=done is None,
        n_threads=with_llama_threads(settings).n_threads,
        prompt_format=loaded.prompt_format,
    )


# -- child ---------------------------------------------------------------------------------------


def _logits_argmax(llama_cpp: Any, llm: Any, n_vocab: int) -> int:
    import numpy as np

    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(n_vocab,))))


def _refused(prompt_id: str, prompt_tokens: int, reason: str) -> PromptOutcome:
    """A prompt that got no answer, and why."""
    return PromptOutcome(
        id=prompt_id,
        text="",
        tokens=(),
        prompt_tokens=prompt_tokens,
        ttft_s=0.0,
        prefill_tokens_per_s=None,
        decode_tokens_per_s=None,
        error=reason,
    )


def _child_run(child: ChildChannel, settings: SuiteRunSettings) -> int:
    import llama_cpp

    log = install_llama_log(llama_cpp)
    t0 = time.perf_counter()
    try:
        llm = open_model(llama_cpp, settings)
    except (ValueError, RuntimeError) as exc:
        child.emit(llama_failed("load it", log, str(exc)))
        return 1
    parsed = parse_llama_log(log.text())
    renderer = PromptRenderer(llama_cpp, llm, settings.chat, settings.system_prompt)
    prompt_tokens = renderer.tokens
    vocab = llama_cpp.llama_model_get_vocab(llm.model)

    child.emit(
        SuiteLoaded(
            prompt_format=renderer.prompt_format,
            load_s=time.perf_counter() - t0,
            model_size_bytes=int(llama_cpp.llama_model_size(llm.model)),
            buffers={
                "model": parsed.model_buffers,
                "kv": parsed.kv_buffers,
                "compute": parsed.compute_buffers,
                "output": parsed.output_buffers,
            },
        )
    )
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    renderer.render_all([job.prompt for job in settings.prompts])
    for job in settings.prompts:
        if child.stop_requested:
            return 0
        try:
            prompt = prompt_tokens(job.prompt)
        except FitScopeError as exc:
            # The template refused this prompt (or went over its budget): the prompt fails with
            # that sentence, and the other prompts and variants go on.
            child.emit(PromptDone(outcome=_refused(job.id, 0, str(exc))))
            continue
        if len(prompt) + 1 >= llm.n_ctx():
            # Answering is impossible; the other prompts still are (a compare keeps what it has).
            reason = (
                f"the prompt has {len(prompt):,} tokens, more than the context of "
                f"{llm.n_ctx():,} holds with room for an answer"
            )
            child.emit(PromptDone(outcome=_refused(job.id, len(prompt), reason)))
            continue
        budget = max(1, min(job.max_tokens, llm.n_ctx() - len(prompt) - 1))
        llm.reset()
        llama_cpp.llama_perf_context_reset(llm._ctx.ctx)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        tokens: list[int] = []
        text: list[str] = []
        times: list[float] = []
        sent = time.perf_counter()
        for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
            if llama_cpp.llama_vocab_is_eog(vocab, token):
                break
            times.append(time.perf_counter() - sent)
            tokens.append(int(token))
            text.append(decoder.decode(llm.detokenize([token])))
            if len(tokens) >= budget or child.stop_requested:
                break
        perf = llama_cpp.llama_perf_context(llm._ctx.ctx)
        reference = (settings.reference or {}).get(job.id)
        outcome = PromptOutcome(
            id=job.id,
            text="".join(text) + decoder.decode(b"", final=True),
            tokens=tuple(tokens),
            prompt_tokens=len(prompt),
            ttft_s=times[0] if times else time.perf_counter() - sent,
            prefill_tokens_per_s=perf.n_p_eval / (perf.t_p_eval_ms / 1000) if perf.t_p_eval_ms > 0 else None,
            decode_tokens_per_s=perf.n_eval / (perf.t_eval_ms / 1000) if perf.t_eval_ms > 0 else None,
            identical_tokens=None
            if reference is None
            else sum(a == b for a, b in zip(tokens, reference, strict=False)),
            reference_tokens=None if reference is None else len(reference),
        )
        child.emit(PromptDone(outcome=outcome))
        if reference:
            # Teacher forcing: this variant's most likely next token after each reference prefix.
            llm.reset()
            llm.eval(prompt)
            matches = 0
            for ref_token in reference:
                if _logits_argmax(llama_cpp, llm, n_vocab) == ref_token:
                    matches += 1
                llm.eval([ref_token])
            child.emit(Agreement(id=job.id, top1_matches=matches, reference_tokens=len(reference)))
    child.emit(SuiteDone(peak_rss_bytes=peak_rss_bytes()))
    return 0


if __name__ == "__main__":
    sys.exit(serve_child(SuiteRunSettings, _child_run))
