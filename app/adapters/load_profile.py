"""This machine's batching figures for a model file, measured once and kept, and the number of
slots its memory allows — the two inputs of the load simulation."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from app.adapters.batch_probe import BatchProfile, measure_batching
from app.adapters.child_protocol import ChildEvent
from app.adapters.cpu_topology import llama_math_threads
from app.adapters.paths import data_dir
from app.core.memory.limits import max_parallel_sequences
from app.core.memory.records import MAX_CONTEXT_TOKENS, Settings, Target
from app.core.model.source import model_from_gguf

PARALLEL = (1, 2, 4)


def _cache_path(gguf_path: str | os.PathLike[str], machine_key: str) -> Path:
    st = Path(gguf_path).stat()
    key = f"{Path(gguf_path).resolve()}|{st.st_size}|{int(st.st_mtime)}|{machine_key}"
    return data_dir() / "batch_profiles" / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")


def cached_profile(gguf_path: str | os.PathLike[str], machine_key: str) -> BatchProfile | None:
    """The profile measured earlier for this file on this machine with llama-server's thread count,
    if any (one measured with other threads describes another configuration)."""
    path = _cache_path(gguf_path, machine_key)
    with contextlib.suppress(OSError, ValueError):
        profile = BatchProfile.model_validate_json(path.read_text(encoding="utf-8"))
        if profile.n_threads == llama_math_threads():
            return profile
    return None


def measure_profile(
    gguf_path: str | os.PathLike[str],
    machine_key: str,
    on_event: Callable[[ChildEvent], None] | None = None,
) -> BatchProfile:
    """Measure prefill and batched decode steps (1, 2 and 4 sequences) and keep the result.
    Raises BatchProbeError (a FitScopeError) when llama.cpp cannot run the file."""
    profile = measure_batching(gguf_path, parallel=PARALLEL, on_event=on_event)
    path = _cache_path(gguf_path, machine_key)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(profile.model_dump_json(), encoding="utf-8")
    return profile


def memory_slots(
    gguf_path: str | os.PathLike[str], tokens_per_slot: int, targets: list[Target], repack: str, upper: int = 256
) -> int:
    """How many slots of ``tokens_per_slot`` tokens of context fit in memory (llama-server's -np
    with -c = slots x tokens), from the estimator."""
    model = model_from_gguf(Path(gguf_path))
    settings = Settings(context_tokens=min(tokens_per_slot, MAX_CONTEXT_TOKENS), repack=repack)  # type: ignore[arg-type]
    return max_parallel_sequences(model.arch, model.tensors, settings, targets, tokens_per_slot, upper=upper)


def profile_json(profile: BatchProfile) -> dict:
    return json.loads(profile.model_dump_json()) | {
        "prefill_tokens_per_s": profile.prefill_tokens_per_s,
        "decode_step_s": profile.decode_step_s,
        "decode_tokens_per_s": profile.decode_tokens_per_s,
    }
