"""KL divergence, perplexity and same-top-token rates of quantized variants against a reference,
measured with the real llama.cpp on a text, one child process per model file, cached on disk.

How the logits are evaluated follows ``llama-perplexity --kl-divergence`` (tools/perplexity):
the text is tokenized once (BOS first), cut into chunks of ``chunk_tokens``, each chunk is decoded
from an empty cache with BOS as its first token, and the logits of the second half of each chunk
are scored against the next token. The first half is decoded without asking for logits, and the
scored half in batches of :data:`SCORE_BATCH` positions, so llama.cpp's output buffer holds at
most that many rows of logits.

What is kept of the reference, and why: llama-perplexity stores the reference's whole log-softmax
(a 16-bit number per vocabulary entry per position: 0.5 MiB a position with a 262,144-token
vocabulary, over 500 MiB for 2,000 tokens). Here the reference pass keeps, per scored position,
its ``top_k`` most likely tokens with their log-probabilities (1,024 by default: 6 MiB for 2,000
tokens) and the log-likelihood of the true next token. A variant's KL is then computed over those
tokens plus one "everything else" bin that lumps the rest of both distributions together:
KL(P||Q) ≈ Σ_top p·(log p − log q) + r_P·log(r_P / r_Q), where r is the mass outside the top-k.
Merging outcomes can only lower a KL divergence, so the figure is a lower bound; on the demo model
(Gemma 3 270M, whose top 1,024 tokens hold 99% of the mass on average) it was 2.5% below the
full-vocabulary KL at its mean and 1% at its 99th percentile, and the ranking of variants is
unchanged. The variant's own distribution is used whole (its log-sum-exp, its top token, its
probability of the true next token), so perplexity, Δ perplexity and same-top are exact.

Cache: the reference pass writes ``ref-<key>.npz`` (tokens, top-k ids and log-probabilities, the
next-token log-likelihoods), keyed by the file (path, size, modification time), the text's
SHA-256, the settings and the llama.cpp version; each variant pass writes ``var-<key>.npz`` (its
per-position KL, log-likelihood and same-top flag), keyed by its file and the reference's key. A
rerun with nothing changed starts no model at all.

Protocol: :mod:`app.adapters.child_protocol` (settings as one JSON line on stdin; events
:class:`PassLoaded`, one :class:`~app.adapters.child_protocol.Progress` per chunk, then
:class:`~app.adapters.child_protocol.Done`; ``stop`` on stdin ends it between batches).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

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
from app.adapters.cpu_topology import with_llama_threads
from app.adapters.divergence_cache import CACHE_LIMIT_BYTES, usable_cache_file
from app.adapters.llamacpp_runner import RunError, open_model
from app.adapters.paths import data_dir
from app.core.common.errors import FitScopeError
from app.core.common.files import move_aside, read_json_file
from app.core.common.units import Frozen
from app.core.memory.records import GpuLayers
from app.core.model.catalog import RESOURCES_DIR
from app.core.quality.divergence import (
    DivergenceFigures,
    MeasuredQuality,
    divergence_figures,
    paired_kl_difference,
    reference_figures,
)

SCORE_BATCH = 128
BUILTIN_TEXT = RESOURCES_DIR / "texts" / "pride-and-prejudice-1-3.txt"
BUILTIN_TEXT_NAME = "Pride and Prejudice, chapters 1-3 (Jane Austen, 1813)"

OnProgress = Callable[[float, str], None]
_log = logging.getLogger(__name__)


class DivergenceSettings(Frozen):
    """What a measurement depends on. ``max_tokens`` caps the text (0: all of it); only whole
    chunks are evaluated, as llama-perplexity does."""

    text: str
    text_name: str = "text"
    chunk_tokens: int = Field(default=512, ge=16, le=16384)
    max_tokens: int = Field(default=2048, ge=0)
    top_k: int = Field(default=1024, ge=1)
    gpu_layers: GpuLayers = 0
    flash_attn: bool = True
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    n_threads: int | None = None


class PassJob(DivergenceSettings):
    """One model file's pass, as the child receives it."""

    gguf_path: str
    role: Literal["reference", "variant"]
    reference_file: str
    output_file: str

    # llama.cpp's context for one chunk (read by ``open_model``).
    @property
    def context_tokens(self) -> int:
        return self.chunk_tokens

    @property
    def batch_tokens(self) -> int:
        return self.chunk_tokens

    @property
    def ubatch_tokens(self) -> int:
        return min(512, self.chunk_tokens)


class PassLoaded(Loaded):
    """The model is loaded and the text tokenized: ``chunks`` chunks, ``positions`` scored tokens."""

    chunks: int
    positions: int


PASS_EVENTS = (PassLoaded, Progress, Done)


@dataclass(frozen=True)
class PositionValues:
    """One variant's per-position values (all on the reference's scored positions)."""

    kl: tuple[float, ...]
    nll: tuple[float, ...]
    nll_ref: tuple[float, ...]
    same_top: tuple[bool, ...]
    chunks: int


@dataclass(frozen=True)
class DivergenceResult:
    """Figures per file (the reference's has only its perplexity), the per-position values behind
    them, and which passes came from the cache."""

    reference: str
    figures: dict[str, DivergenceFigures]
    values: dict[str, PositionValues]
    cached: dict[str, bool]
    seconds: float
    notes: tuple[str, ...] = ()  # cache files that were unusable and measured again

    def pair_sentence(self, a: str, b: str, label_a: str, label_b: str) -> str:
        """Whether two variants' KL differ beyond chance on the same positions, in a sentence."""
        d = paired_kl_difference(self.values[a].kl, self.values[b].kl, self.values[a].chunks)
        high = d.high if d.high is not None else d.value
        if d.low > 0 or high < 0:
            closer, further = (label_b, label_a) if d.value > 0 else (label_a, label_b)
            low_abs, high_abs = sorted((abs(d.low), abs(high)))
            return (
                f"{closer} is closer to the reference than {further} beyond chance on this text "
                f"(mean KL lower by {abs(d.value):.3f}, 95% interval {low_abs:.3f}-{high_abs:.3f})."
            )
        return (
            f"{label_a} and {label_b} are not distinguishable by KL on this text "
            f"(difference {d.value:+.3f}, 95% interval {d.low:+.3f} to {high:+.3f})."
        )


def builtin_text() -> tuple[str, str]:
    """(text, name) of the public-domain text shipped with FitScope."""
    return BUILTIN_TEXT.read_text(encoding="utf-8"), BUILTIN_TEXT_NAME


def read_text(path: str | os.PathLike[str]) -> tuple[str, str]:
    """(text, name) of a UTF-8 text file. Raises FitScopeError when it cannot be read or is empty."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise FitScopeError(f"Could not read {p}: {exc.strerror or exc}.") from None
    if not text.strip():
        raise FitScopeError(f"{p.name} is empty; choose a text of a few thousand words.")
    return text, p.name


def cache_dir() -> Path:
    return data_dir() / "divergence"


def measured_quality_path() -> Path:
    return data_dir() / "measured_quality.json"


def record_measured_quality(records: Sequence[MeasuredQuality]) -> None:
    """Keep the latest measurement per (model, preset) for the quantization ladder. A file that
    cannot be written is skipped: the comparison itself is unaffected."""
    path = measured_quality_path()
    kept = {(m.model_key, m.preset): m for m in measured_quality()}
    kept |= {(m.model_key, m.preset): m for m in records}
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".part")
        tmp.write_text(json.dumps([m.model_dump() for m in kept.values()], indent=1), encoding="utf-8")
        os.replace(tmp, path)


_read_cache: dict[tuple[str, int, int], tuple[MeasuredQuality, ...]] = {}


MAX_MEASURED_QUALITY_BYTES = 4 * 1024**2  # a record per model and preset: a few KiB


def measured_quality() -> tuple[MeasuredQuality, ...]:
    """Every recorded measurement (none when the file is missing or unreadable; a file that is not
    a list of measurements is moved aside as ``.bad``). Read again only when the file changes: the
    window asks on every estimate."""
    path = measured_quality_path()
    try:
        st = path.stat()
    except OSError:
        return ()
    key = (str(path), st.st_mtime_ns, st.st_size)
    if key in _read_cache:
        return _read_cache[key]
    try:
        data = read_json_file(path, "measured quality file", MAX_MEASURED_QUALITY_BYTES)
        if not isinstance(data, list):
            raise ValueError("not a list")
        records = tuple(MeasuredQuality.model_validate(m) for m in data)
    except (FitScopeError, ValueError, TypeError) as exc:
        _log.warning("%s is unreadable (%s); moved aside", path, exc)
        move_aside(path)
        return ()
    _read_cache.clear()
    _read_cache[key] = records
    return records


def _llama_version() -> str:
    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        return "unknown"


def _file_identity(path: str) -> dict[str, Any]:
    p = Path(path).resolve()
    st = p.stat()
    return {"path": str(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def reference_key(path: str, settings: DivergenceSettings) -> str:
    """The cache key of a reference pass."""
    data = settings.model_dump(exclude={"text", "text_name", "n_threads"})
    data |= {
        "file": _file_identity(path),
        "text_sha256": hashlib.sha256(settings.text.encode("utf-8")).hexdigest(),
        "llama_cpp": _llama_version(),
        "format": 1,
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:32]


def variant_key(path: str, ref_key: str) -> str:
    data = {"file": _file_identity(path), "reference": ref_key, "format": 1}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:32]


def _prune_cache(folder: Path, keep: set[Path]) -> None:
    """Oldest files first until the folder holds at most CACHE_LIMIT_BYTES."""
    with contextlib.suppress(OSError):
        files = sorted(folder.glob("*.npz"), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in files)
        for f in files:
            if total <= CACHE_LIMIT_BYTES:
                break
            if f in keep:
                continue
            total -= f.stat().st_size
            f.unlink()


def _load_values(var_file: Path) -> PositionValues:
    import numpy as np

    with np.load(var_file) as data:
        return PositionValues(
            kl=tuple(float(x) for x in data["kl"]),
            nll=tuple(float(x) for x in data["nll"]),
            nll_ref=tuple(float(x) for x in data["nll_ref"]),
            same_top=tuple(bool(x) for x in data["same_top"]),
            chunks=int(data["chunks"]),
        )


def _load_reference_nll(ref_file: Path) -> tuple[tuple[float, ...], int]:
    import numpy as np

    with np.load(ref_file) as data:
        return tuple(float(x) for x in data["nll"]), int(data["chunks"])


def _run_pass(
    job: PassJob, on_event: Callable[[ChildEvent], None], on_start: Callable[[WorkerProcess], None] | None
) -> None:
    require_file(job.gguf_path, RunError)
    name = Path(job.gguf_path).name
    live = WorkerProcess("app.adapters.divergence_runner", with_llama_threads(job), PASS_EVENTS, name=name)
    if on_start is not None:
        on_start(live)
    live.follow(on_event)
    if live.failed is None and live.stop_requested:
        raise FitScopeError("The measurement was stopped.")
    message = live.failure(f"while measuring {name}")
    if message is not None:
        raise RunError(message)


def measure_divergence(
    reference: str,
    variants: Sequence[str],
    settings: DivergenceSettings,
    labels: dict[str, str] | None = None,
    on_progress: OnProgress | None = None,
    stop: threading.Event | None = None,
    on_start: Callable[[WorkerProcess], None] | None = None,
) -> DivergenceResult:
    """Measure each of ``variants`` against ``reference`` on ``settings.text``: one pass of
    llama.cpp per file not already in the cache (the reference first). ``labels`` names files in
    sentences. Raises FitScopeError (RunError) when a file is missing or cannot be loaded, the text
    is too short, the files are not variants of one model, or the measurement is stopped."""
    for path in (reference, *variants):
        require_file(path, RunError)
    started = time.perf_counter()
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    ref_key = reference_key(reference, settings)
    ref_file = folder / f"ref-{ref_key}.npz"
    var_files = {v: folder / f"var-{variant_key(v, ref_key)}.npz" for v in variants}
    passes: list[tuple[str, Literal["reference", "variant"], Path]] = []
    notes: list[str] = []
    if not usable_cache_file(ref_file, "reference", notes):
        passes.append((reference, "reference", ref_file))
        # Variants measured against another copy of the reference must be measured again too.
        for f in var_files.values():
            with contextlib.suppress(OSError):
                f.unlink()
    passes += [(v, "variant", f) for v, f in var_files.items() if not usable_cache_file(f, "variant", notes)]
    names = labels or {}

    def label(path: str) -> str:
        return names.get(path) or Path(path).stem

    for i, (path, role, out) in enumerate(passes):
        if stop is not None and stop.is_set():
            raise FitScopeError("The measurement was stopped.")

        def on_event(event: ChildEvent, i: int = i, path: str = path) -> None:
            if on_progress is None:
                return
            if isinstance(event, Progress):
                share = event.done / max(event.total, 1)
                on_progress(
                    (i + share) / len(passes),
                    f"{label(path)}: KL and perplexity, chunk {event.done} of {event.total}",
                )
            elif isinstance(event, PassLoaded):
                on_progress(i / len(passes), f"{label(path)}: scoring {event.positions:,} tokens of the text…")

        def started_pass(live: WorkerProcess) -> None:
            if on_start is not None:
                on_start(live)
            if stop is not None and stop.is_set():
                live.stop()

        job = PassJob(
            **settings.model_dump(),
            gguf_path=str(path),
            role=role,
            reference_file=str(ref_file),
            output_file=str(out),
        )
        _run_pass(job, on_event, started_pass)
    if on_progress is not None:
        on_progress(1.0, "KL and perplexity measured.")
    _prune_cache(folder, {ref_file, *var_files.values()})
    nll_ref, chunks = _load_reference_nll(ref_file)
    common = {"text_name": settings.text_name, "chunks": chunks, "chunk_tokens": settings.chunk_tokens}
    figures = {reference: reference_figures(nll_ref, top_k=settings.top_k, **common)}  # type: ignore[arg-type]
    values: dict[str, PositionValues] = {}
    for v, f in var_files.items():
        values[v] = _load_values(f)
        if v == reference:
            continue
        figures[v] = divergence_figures(
            values[v].kl,
            values[v].nll,
            values[v].nll_ref,
            values[v].same_top,
            top_k=settings.top_k,
            reference_label=label(reference),
            **common,  # type: ignore[arg-type]
        )
    done = {p for p, _, _ in passes}
    return DivergenceResult(
        reference=reference,
        figures=figures,
        values=values,
        cached={p: p not in done for p in [reference, *variants]},
        seconds=time.perf_counter() - started,
        notes=tuple(notes),
    )


# -- child ---------------------------------------------------------------------------------------


def _decode(llama_cpp: Any, ctx: Any, batch: Any, tokens: Sequence[int], pos0: int, logits: bool) -> None:
    batch.n_tokens = len(tokens)
    for i, token in enumerate(tokens):
        batch.token[i] = token
        batch.pos[i] = pos0 + i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = logits
    code = llama_cpp.llama_decode(ctx, batch)
    if code != 0:
        raise RuntimeError(f"llama_decode returned {code}")


def _write_npz(path: str, **arrays: Any) -> None:
    import numpy as np

    tmp = path + ".part.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def _child_pass(child: ChildChannel, job: PassJob) -> int:
    import llama_cpp
    import numpy as np

    log = install_llama_log(llama_cpp)
    try:
        llm = open_model(llama_cpp, job)
    except (ValueError, RuntimeError) as exc:
        child.emit(llama_failed("load it", log, str(exc)))
        return 1
    ctx = llm._ctx.ctx
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = int(llama_cpp.llama_vocab_n_tokens(vocab))
    reference: dict[str, Any] = {}
    if job.role == "variant":
        with np.load(job.reference_file) as data:
            reference = {k: data[k] for k in data.files}
        if int(reference["n_vocab"]) != n_vocab:
            return child.fail(
                f"its vocabulary ({n_vocab:,} tokens) differs from the reference's "
                f"({int(reference['n_vocab']):,}): not a variant of the same model"
            )
        tokens = [int(t) for t in reference["tokens"]]
    else:
        tokens = llm.tokenize(job.text.encode("utf-8"), add_bos=True)
        if job.max_tokens:
            tokens = tokens[: job.max_tokens]
    chunk = job.chunk_tokens
    n_chunks = len(tokens) // chunk
    if n_chunks == 0:
        return child.fail(f"the text has {len(tokens):,} tokens; at least {chunk:,} (one chunk) are needed")
    first = chunk // 2
    scored = chunk - 1 - first
    child.emit(PassLoaded(chunks=n_chunks, positions=n_chunks * scored))
    bos = int(llama_cpp.llama_vocab_bos(vocab))
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
    batch = llama_cpp.llama_batch_init(chunk, 0, 1)
    k = min(job.top_k, n_vocab)
    top_ids: list[Any] = []
    top_logp: list[Any] = []
    nlls: list[Any] = []
    kls: list[Any] = []
    same: list[Any] = []
    try:
        for c in range(n_chunks):
            piece = tokens[c * chunk : (c + 1) * chunk]
            if add_bos:
                piece[0] = bos
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
            _decode(llama_cpp, ctx, batch, piece[:first], 0, False)
            # Logits at positions first .. chunk-2 predict the tokens at first+1 .. chunk-1.
            for start in range(first, chunk - 1, SCORE_BATCH):
                if child.stop_requested:
                    return 0
                end = min(start + SCORE_BATCH, chunk - 1)
                _decode(llama_cpp, ctx, batch, piece[start:end], start, True)
                rows = end - start
                logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx), shape=(rows, n_vocab))
                nxt = np.asarray(piece[start + 1 : end + 1])
                peak = logits.max(axis=1, keepdims=True)
                shifted = logits - peak
                np.exp(shifted, out=shifted)
                # numpy's pairwise float32 sum is accurate to ~1e-6 relative over 262,144 terms
                lse = np.log(shifted.sum(axis=1).astype(np.float64)) + peak[:, 0].astype(np.float64)
                at_next = logits[np.arange(rows), nxt].astype(np.float64)
                nlls.append(lse - at_next)
                if job.role == "reference":
                    ids = np.argpartition(-logits, k - 1, axis=1)[:, :k] if k < n_vocab else np.tile(
                        np.arange(n_vocab), (rows, 1)
                    )
                    vals = np.take_along_axis(logits, ids, axis=1)
                    order = np.argsort(-vals, axis=1, kind="stable")
                    ids = np.take_along_axis(ids, order, axis=1)
                    vals = np.take_along_axis(vals, order, axis=1)
                    top_ids.append(ids.astype(np.int32))
                    top_logp.append((vals - lse[:, None]).astype(np.float32))
                else:
                    offset = c * scored + (start - first)
                    ref_ids = reference["top_ids"][offset : offset + rows]
                    log_p = reference["top_logp"][offset : offset + rows].astype(np.float64)
                    log_q = np.take_along_axis(logits, ref_ids, axis=1).astype(np.float64) - lse[:, None]
                    p = np.exp(log_p)
                    rest_p = np.clip(1.0 - p.sum(axis=1), 0.0, 1.0)
                    rest_q = np.clip(1.0 - np.exp(log_q).sum(axis=1), 1e-12, 1.0)
                    tail = np.where(rest_p > 1e-12, rest_p * np.log(np.maximum(rest_p, 1e-12) / rest_q), 0.0)
                    kls.append(np.maximum((p * (log_p - log_q)).sum(axis=1) + tail, 0.0))
                    same.append(logits.argmax(axis=1) == ref_ids[:, 0])
            child.emit(Progress(done=c + 1, total=n_chunks))
    finally:
        llama_cpp.llama_batch_free(batch)
    if job.role == "reference":
        _write_npz(
            job.output_file,
            tokens=np.asarray(tokens[: n_chunks * chunk], dtype=np.int32),
            top_ids=np.concatenate(top_ids),
            top_logp=np.concatenate(top_logp),
            nll=np.concatenate(nlls),
            n_vocab=np.int64(n_vocab),
            chunks=np.int64(n_chunks),
        )
    else:
        _write_npz(
            job.output_file,
            kl=np.concatenate(kls),
            nll=np.concatenate(nlls),
            nll_ref=reference["nll"],
            same_top=np.concatenate(same),
            chunks=np.int64(n_chunks),
        )
    child.emit(Done())
    return 0


if __name__ == "__main__":
    sys.exit(serve_child(PassJob, _child_pass))
