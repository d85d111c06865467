"""The fastest llama-server settings that fit: a search over what people otherwise find by trial.

For a model, a machine, a context each user must get and a number of users, it tries the settings
llama-server exposes that change speed — the KV-cache type, flash attention, the ubatch (``-ub``,
with ``-b`` at least as large) and the CPU threads (``-t``) — and for each the placement llama.cpp's
``--fit`` would choose (``auto_fit``: every layer on the GPUs, else the fewest layers' experts in
system memory, ``--n-cpu-moe``, else the most layers, ``-ngl``), keeping a free-memory margin on each
GPU. Every candidate is estimated (``estimate``) and its speed predicted (``estimate_speed``); those
that fit are ranked by decode speed, or for long prompts by the time to answer one (prefill of the
prompt plus a reply). A larger ubatch copies the host-resident weights to the GPU fewer times and
fills its matrix units better, but takes compute-buffer memory that a layer or an expert block
could have used; a quantized KV cache frees memory (more of the model on the GPU, a longer context)
at some cost in fidelity. What each of the best trades is stated beside it.

Pure: no Qt, no files. ``app.services.tuning`` builds the commands and runs the check.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from app.core.common.errors import EstimateError
from app.core.common.units import GIB
from app.core.memory.autofit import DEFAULT_MARGIN_BYTES, FitPlan, auto_fit
from app.core.memory.limits import max_context_tokens
from app.core.memory.records import Settings, Target
from app.core.model.architecture import Architecture
from app.core.model.tensors import TensorInfo
from app.core.speed.predict import SpeedEstimate, estimate_speed

Goal = Literal["decode", "prompt"]
UBATCHES = (256, 512, 1024, 2048, 4096)
# (K, V, flash attention): llama.cpp needs flash attention for a quantized V cache.
KV_CHOICES: tuple[tuple[str, str, bool], ...] = (
    ("f16", "f16", True),
    ("f16", "f16", False),
    ("q8_0", "q8_0", True),
    ("q4_0", "q4_0", True),
)
REPLY_TOKENS = 256  # the answer a "prompt" goal counts after the prompt
_KV_FIDELITY = {"f16": 0, "bf16": 0, "f32": 0, "q8_0": 1, "q4_0": 2}


@dataclass(frozen=True)
class Candidate:
    """One setting that fits: its placement (``plan``), predicted speed and what it leaves."""

    plan: FitPlan
    speed: SpeedEstimate
    score: float  # tokens/s per user (decode), or 1 / seconds to answer a prompt
    free_bytes: int  # the least memory left on any device, beyond each GPU's margin
    max_context_tokens: int = 0  # the longest context per user these settings fit (filled for the best)

    @property
    def gpu_free_bytes(self) -> int | None:
        """The least memory left on a GPU (its margin included), None without GPUs."""
        free = [d.free_bytes for d in self.plan.estimate.devices if d.kind == "gpu"]
        return min(free) if free else None

    @property
    def host_free_bytes(self) -> int:
        return self.plan.estimate.devices[-1].free_bytes

    @property
    def settings(self) -> Settings:
        return self.plan.estimate.settings

    def trades(self, best: Candidate | None = None) -> str:
        """What these settings give up or gain, in a sentence (against ``best`` when given)."""
        s = self.settings
        parts = []
        if s.cache_type_k != "f16" or s.cache_type_v != "f16":
            parts.append(f"a {s.cache_type_k}/{s.cache_type_v} KV cache (smaller, slightly less faithful)")
        if not s.flash_attn:
            parts.append("no flash attention (a larger compute buffer)")
        if self.plan.n_cpu_moe:
            parts.append(f"experts of {self.plan.n_cpu_moe} layers in system memory")
        if self.plan.on_gpu and self.plan.gpu_layers < self.plan.estimate.n_layer + 1:
            parts.append(f"{self.plan.gpu_layers} of {self.plan.estimate.n_layer + 1} layers on the GPU")
        parts.append(f"-ub {s.ubatch_tokens}")
        if best is not None and best is not self:
            d = self.speed.decode_typical / max(best.speed.decode_typical, 1e-9) - 1
            parts.append(f"decode {d:+.0%} against the first")
        gpu = self.gpu_free_bytes
        left = f"{gpu / GIB:.1f} GiB left on the GPU, " if gpu is not None else ""
        parts.append(f"{left}{self.host_free_bytes / GIB:.1f} GiB in system memory")
        if self.max_context_tokens:
            parts.append(f"up to {self.max_context_tokens:,} tokens of context per user")
        return "; ".join(parts) + "."


def fastest_settings(
    arch: Architecture,
    tensors: Sequence[TensorInfo],
    base: Settings,
    targets: list[Target],
    *,
    goal: Goal = "decode",
    prompt_tokens: int = 512,
    top: int = 3,
    margin_bytes: int = DEFAULT_MARGIN_BYTES,
    threads: Sequence[int | None] = (None,),
    depth_tokens: int | None = None,
) -> list[Candidate]:
    """The ``top`` fastest settings that fit ``targets`` for ``base``'s context and users (its
    ``context_tokens`` and ``parallel_sequences``), best first, ranked by ``goal``; decode is
    predicted ``depth_tokens`` into a conversation (default: after the prompt). ``threads`` are the
    ``-t`` values to try (None: llama.cpp's default, the physical cores). Raises EstimateError
    when no setting fits (the message says what was tried)."""
    candidates: list[Candidate] = []
    tried = 0
    for cache_k, cache_v, flash in KV_CHOICES:
        for ubatch in UBATCHES:
            if ubatch > base.context_tokens and ubatch != UBATCHES[0]:
                continue
            settings = base.model_copy(
                update={
                    "cache_type_k": cache_k,
                    "cache_type_v": cache_v,
                    "flash_attn": flash,
                    "ubatch_tokens": ubatch,
                    "batch_tokens": max(base.batch_tokens, ubatch),
                }
            )
            tried += 1
            try:
                plan = auto_fit(arch, tensors, settings, targets, margin_bytes)
            except EstimateError:
                continue
            placed = plan.estimate
            if not placed.fits or not _gpus_keep(plan, margin_bytes):
                continue
            live = [t for t in targets if t.kind == "cpu"] if plan.gpus_hidden else targets
            for n_threads in threads:
                est = placed
                if n_threads is not None:
                    est = placed.model_copy(
                        update={"settings": placed.settings.model_copy(update={"threads": n_threads})}
                    )
                speed = estimate_speed(
                    arch,
                    tensors,
                    est,
                    live,
                    prompt_tokens=min(prompt_tokens, base.context_tokens),
                    depth_tokens=depth_tokens,
                    users=base.parallel_sequences,
                )
                chosen = plan if est is placed else plan.model_copy(update={"estimate": est})
                candidates.append(
                    Candidate(chosen, speed, _score(speed, goal, prompt_tokens), _free(plan, margin_bytes))
                )
    if not candidates:
        raise EstimateError(
            f"No setting fits: {tried} combinations of KV cache, flash attention and -ub were tried with "
            f"{base.context_tokens:,} tokens of context for {base.parallel_sequences} user(s); lower the context or "
            "the users, or choose a smaller quantization."
        )
    candidates.sort(key=_rank, reverse=True)
    best = _distinct(candidates, top)
    return [_with_context(c, arch, tensors, targets) for c in best]


def _score(speed: SpeedEstimate, goal: Goal, prompt_tokens: int) -> float:
    if goal == "decode":
        return speed.decode_typical
    answer_s = prompt_tokens / max(speed.prefill_typical, 1e-9) + REPLY_TOKENS / max(speed.decode_typical, 1e-9)
    return 1.0 / answer_s


def _rank(c: Candidate) -> tuple[int, int, int, int]:
    """The goal's speed first, in steps of 1% (closer than that the model cannot tell apart), then
    prefill in the same steps, then the more faithful KV cache, then the memory left."""
    s = c.settings
    fidelity = -max(_KV_FIDELITY.get(s.cache_type_k, 2), _KV_FIDELITY.get(s.cache_type_v, 2))
    return _step(c.score), _step(c.speed.prefill_typical), fidelity, c.free_bytes


def _step(value: float) -> int:
    return int(math.log(max(value, 1e-9)) / math.log(1.01))


def _distinct(ranked: list[Candidate], top: int) -> list[Candidate]:
    """The first ``top`` that differ in placement, KV cache or flash attention, each with its best
    -ub and -t (settings that differ only there are the same choice, better or worse tuned)."""
    out: list[Candidate] = []
    seen: set[tuple[int, int, bool, str, str, bool]] = set()
    for c in ranked:
        s = c.settings
        key = (c.plan.gpu_layers, c.plan.n_cpu_moe, c.plan.gpus_hidden, s.cache_type_k, s.cache_type_v, s.flash_attn)
        if key in seen:
            continue
        seen.add(key)
        out.append(c)
        if len(out) == top:
            break
    return out


def _gpus_keep(plan: FitPlan, margin_bytes: int) -> bool:
    return all(d.total_bytes + margin_bytes <= d.capacity_bytes for d in plan.estimate.devices if d.kind == "gpu")


def _free(plan: FitPlan, margin_bytes: int) -> int:
    """The least memory left on any device, a GPU's margin counted as used."""
    free = []
    for d in plan.estimate.devices:
        free.append(d.free_bytes - (margin_bytes if d.kind == "gpu" else 0))
    return min(free)


def _with_context(c: Candidate, arch: Architecture, tensors: Sequence[TensorInfo], targets: list[Target]) -> Candidate:
    """``c`` with the longest context per user its settings and placement fit."""
    s = c.settings
    placed = s.model_copy(update={"gpu_layers": c.plan.gpu_layers, "n_cpu_moe": c.plan.n_cpu_moe})
    live = [t for t in targets if t.kind == "cpu"] if c.plan.gpus_hidden else targets
    total = max_context_tokens(arch, tensors, placed, live)
    return Candidate(c.plan, c.speed, c.score, c.free_bytes, total // max(s.parallel_sequences, 1))
