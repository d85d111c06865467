"""The limits of a placement: the largest context, the most concurrent users and the most GPU layers
that fit, each found by bisection over the estimator (memory only grows with each)."""

from __future__ import annotations

from collections.abc import Sequence

from app.core.memory.estimate import estimate
from app.core.memory.records import MAX_CONTEXT_TOKENS, Estimate, Settings, Target
from app.core.model.architecture import Architecture
from app.core.model.tensors import TensorInfo


def max_context_tokens(
    arch: Architecture,
    tensors: Sequence[TensorInfo],
    settings: Settings,
    targets: list[Target],
    upper: int | None = None,
) -> int:
    """The largest context (a multiple of 256) that fits every target; 0 when even 256 does not."""
    limit = min(upper or arch.n_ctx_train, MAX_CONTEXT_TOKENS)

    def fits(n: int) -> bool:
        return estimate(arch, tensors, settings.model_copy(update={"context_tokens": n}), targets).fits

    lo, hi = 0, limit // 256
    if hi == 0 or not fits(256):
        return 0
    if fits(hi * 256):
        return hi * 256
    lo = 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid * 256):
            lo = mid
        else:
            hi = mid
    return lo * 256


def max_parallel_sequences(
    arch: Architecture,
    tensors: Sequence[TensorInfo],
    settings: Settings,
    targets: list[Target],
    context_per_user: int,
    upper: int = 256,
) -> int:
    """Most concurrent users, each with ``context_per_user`` tokens, that fit; 0 if not one."""

    def fits(n: int) -> bool:
        s = settings.model_copy(update={"parallel_sequences": n, "context_tokens": context_per_user * n})
        if s.context_tokens > MAX_CONTEXT_TOKENS:
            return False
        return estimate(arch, tensors, s, targets).fits

    if not fits(1):
        return 0
    lo, hi = 1, upper + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def max_gpu_layers(arch: Architecture, tensors: Sequence[TensorInfo], settings: Settings, targets: list[Target]) -> int:
    """The largest n_gpu_layers (0..n_layer+1) whose estimate fits every target; 0 when none does.

    GPU use only grows with n_gpu_layers and host use only shrinks, so the layers that fit form
    one run: the answer is the largest count whose GPUs fit, when the host fits there too.
    """

    def at(n: int) -> Estimate:
        return estimate(arch, tensors, settings.model_copy(update={"gpu_layers": n}), targets)

    def gpus_fit(e: Estimate) -> bool:
        return all(d.fits for d in e.devices if d.kind == "gpu")

    top = arch.n_layer + 1
    best = at(top)
    if gpus_fit(best):
        return top if best.fits else 0
    lo, hi = 0, top  # gpus fit at lo (nothing on them), not at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if gpus_fit(at(mid)):
            lo = mid
        else:
            hi = mid
    return lo if at(lo).fits else 0
