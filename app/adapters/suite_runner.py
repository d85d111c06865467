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

Protocol: the same as ``app.adapters.llamacpp_runner`` (settings as one JSON line on stdin, one
JSON event per line on stdout, ``stop`` on stdin ends it early).
"""

from __future__ import annotations

import codecs
import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from pydantic import Field

from app.adapters.llamacpp_probe import parse_llama_log
from app.adapters.llamacpp_runner import LiveRun, RunError, _Child, _peak_rss_bytes, open_model
from app.core.chat import messages_for, render_chat
from app.core.errors import FitScopeError
from app.core.units import Frozen

Event = dict[str, Any]




class PromptJob(Frozen):
    id: str
    prompt: str
    max_tokens: int = Field(default=96, ge=1)


class SuiteRunSettings(Frozen):
    gguf_path: str
    prompts: tuple[PromptJob, ...]
    reference: dict[str, list[int]] | None = None
    n_ctx: int = 4096
    n_gpu_layers: int = 0
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


def run_suite(
    settings: SuiteRunSettings,
    on_event: Callable[[Event], None] | None = None,
    on_start: Callable[[LiveRun], None] | None = None,
) -> SuiteRun:
    """Answer every prompt on ``settings.gguf_path`` (and compare with ``settings.reference``).
    Raises RunError when the model cannot be loaded or the child dies."""
    live = LiveRun(settings, settings.gguf_path, module="app.adapters.suite_runner")
    if on_start is not None:
        on_start(live)
    loaded: Event | None = None
    outcomes: dict[str, dict[str, Any]] = {}
    done: Event | None = None
    error: Event | None = None
    try:
        for event in live.events():
            kind = event.get("event")
            if kind == "loaded":
                loaded = event
            elif kind == "prompt_done":
                outcomes[event["id"]] = {k: v for k, v in event.items() if k != "event"}
            elif kind == "agreement":
                outcomes.setdefault(event["id"], {}).update(
                    top1_matches=event["top1_matches"], reference_tokens=event["reference_tokens"]
                )
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
    name = os.path.basename(settings.gguf_path)
    if error is not None:
        raise RunError(f"{name}: {error['message']}")
    if loaded is None:
        raise RunError(f"llama.cpp stopped while loading {name} (exit code {code}).")
    if done is None and not live.stop_requested:
        raise RunError(f"llama.cpp stopped while answering the suite on {name} (exit code {code}).")
    complete = [PromptOutcome.model_validate(o) for o in outcomes.values() if "text" in o]
    return SuiteRun(
        gguf_path=settings.gguf_path,
        load_s=float(loaded["load_s"]),
        model_size_bytes=int(loaded["model_size_bytes"]),
        buffers=loaded["buffers"],
        peak_rss_bytes=(done or {}).get("peak_rss_bytes"),
        outcomes=tuple(complete),
        stopped=done is None,
        n_threads=live.settings.n_threads,
        prompt_format=str(loaded.get("prompt_format", "raw")),
    )


# -- child ---------------------------------------------------------------------------------------


def _logits_argmax(llama_cpp: Any, llm: Any, n_vocab: int) -> int:
    import numpy as np

    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(n_vocab,))))


def _child() -> int:
    events_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    child = _Child(os.fdopen(events_fd, "w", encoding="utf-8", buffering=1))
    settings = SuiteRunSettings.model_validate_json(sys.stdin.readline())
    threading.Thread(target=child.watch_stdin, daemon=True).start()
    import llama_cpp

    chunks: list[str] = []

    def on_log(_level: int, text: bytes | None, _user: ctypes.c_void_p) -> None:
        chunks.append((text or b"").decode("utf-8", "replace"))

    callback = llama_cpp.llama_log_callback(on_log)  # referenced while llama.cpp may log
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
    t0 = time.perf_counter()
    try:
        llm = open_model(llama_cpp, settings)
    except (ValueError, RuntimeError) as exc:
        child.emit({"event": "error", "message": f"llama.cpp could not load it: {exc}"})
        return 1
    parsed = parse_llama_log("".join(chunks))
    template = llm.metadata.get("tokenizer.chat_template") if settings.chat else None
    vocab = llama_cpp.llama_model_get_vocab(llm.model)

    def token_text(token: int) -> str:
        return llm.detokenize([token], special=True).decode("utf-8", "replace") if token >= 0 else ""

    bos_text = token_text(llama_cpp.llama_vocab_bos(vocab))
    eos_text = token_text(llama_cpp.llama_vocab_eos(vocab))

    def prompt_tokens(text: str) -> list[int]:
        if not template:
            return llm.tokenize(text.encode("utf-8"), add_bos=True)
        rendered = render_chat(template, messages_for(text, settings.system_prompt), bos_text, eos_text)
        return llm.tokenize(rendered.encode("utf-8"), add_bos=True, special=True)

    child.emit(
        {
            "event": "loaded",
            "prompt_format": "chat template" if template else "raw",
            "load_s": time.perf_counter() - t0,
            "model_size_bytes": int(llama_cpp.llama_model_size(llm.model)),
            "buffers": {
                "model": parsed.model_buffers,
                "kv": parsed.kv_buffers,
                "compute": parsed.compute_buffers,
                "output": parsed.output_buffers,
            },
        }
    )
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    for job in settings.prompts:
        if child.stop.is_set():
            return 0
        try:
            prompt = prompt_tokens(job.prompt)
        except FitScopeError as exc:
            child.emit({"event": "error", "message": str(exc)})
            return 1
        if len(prompt) + 1 >= llm.n_ctx():
            # Answering is impossible; the other prompts still are (a compare keeps what it has).
            child.emit(
                {
                    "event": "prompt_done",
                    "id": job.id,
                    "text": "",
                    "tokens": [],
                    "prompt_tokens": len(prompt),
                    "ttft_s": 0.0,
                    "prefill_tokens_per_s": None,
                    "decode_tokens_per_s": None,
                    "error": f"the prompt has {len(prompt):,} tokens, more than the context of "
                    f"{llm.n_ctx():,} holds with room for an answer",
                }
            )
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
            if len(tokens) >= budget or child.stop.is_set():
                break
        perf = llama_cpp.llama_perf_context(llm._ctx.ctx)
        outcome: Event = {
            "event": "prompt_done",
            "id": job.id,
            "text": "".join(text) + decoder.decode(b"", final=True),
            "tokens": tokens,
            "prompt_tokens": len(prompt),
            "ttft_s": times[0] if times else time.perf_counter() - sent,
            "prefill_tokens_per_s": perf.n_p_eval / (perf.t_p_eval_ms / 1000) if perf.t_p_eval_ms > 0 else None,
            "decode_tokens_per_s": perf.n_eval / (perf.t_eval_ms / 1000) if perf.t_eval_ms > 0 else None,
        }
        reference = (settings.reference or {}).get(job.id)
        if reference is not None:
            outcome["identical_tokens"] = sum(a == b for a, b in zip(tokens, reference, strict=False))
            outcome["reference_tokens"] = len(reference)
        child.emit(outcome)
        if reference:
            # Teacher forcing: this variant's most likely next token after each reference prefix.
            llm.reset()
            llm.eval(prompt)
            matches = 0
            for ref_token in reference:
                if _logits_argmax(llama_cpp, llm, n_vocab) == ref_token:
                    matches += 1
                llm.eval([ref_token])
            child.emit(
                {"event": "agreement", "id": job.id, "top1_matches": matches, "reference_tokens": len(reference)}
            )
    child.emit({"event": "done", "peak_rss_bytes": _peak_rss_bytes()})
    return 0


if __name__ == "__main__":
    sys.exit(_child())
