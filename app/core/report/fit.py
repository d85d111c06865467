"""From "this model, these settings, this hardware" to one answer: the estimate, the speed and the
limits (largest context, most users, most GPU layers). The CLI and the window both call this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from app.core.common.errors import EstimateError
from app.core.memory.estimate import estimate
from app.core.memory.limits import max_context_tokens, max_gpu_layers, max_parallel_sequences
from app.core.memory.records import Estimate, Settings, Target
from app.core.model.source import ModelSource
from app.core.speed.predict import SpeedEstimate, estimate_speed

if TYPE_CHECKING:
    pass


# -- the answer ----------------------------------------------------------------------------------


def placement_of(est: Estimate) -> Literal["gpu", "partial", "cpu", "none"]:
    """Where an estimate runs: all on the GPUs, partly in system memory, on the CPU alone, or nowhere."""
    if not est.fits:
        return "none"
    gpus = [d for d in est.devices if d.kind == "gpu"]
    if not gpus or est.gpu_layers == 0:
        return "cpu"
    if est.gpu_layers < est.n_layer + 1 or est.cpu_moe_layers > 0:
        return "partial"
    return "gpu"


@dataclass(frozen=True)
class FitResult:
    model: ModelSource
    estimate: Estimate
    speed: SpeedEstimate
    max_context: int
    max_users: int
    max_gpu_layers: int | None
    targets: tuple[Target, ...]

    def to_json(self) -> dict[str, Any]:
        e = self.estimate
        return {
            "model": self.model.label,
            "architecture": self.model.arch.arch,
            "quant": self.model.quant,
            **estimate_json(e),
            "max_context": self.max_context,
            "max_users_at_context": self.max_users,
            "max_gpu_layers": self.max_gpu_layers,
            "decode_tokens_per_s": self.speed.decode_tokens_per_s.as_dict(),
            "decode_total_tokens_per_s": self.speed.decode_total_tokens_per_s.as_dict(),
            "users": self.speed.users,
            "prefill_tokens_per_s": self.speed.prefill_tokens_per_s.as_dict(),
            "ttft_s": self.speed.ttft_s.as_dict(),
            "assumptions": list(e.assumptions) + list(self.speed.assumptions),
        }


def projector_json(e: Estimate) -> dict[str, Any] | None:
    """The ``--mmproj`` projector's parts (bytes), or None without one."""
    p = e.projector
    if p is None:
        return None
    return {
        "name": p.spec.name,
        "projector_type": p.spec.projector_type,
        "file": p.spec.file_name,
        "source": p.spec.source,
        "device": e.devices[e.projector_device].name if e.projector_device is not None else None,
        "weights_bytes": p.weights_bytes,
        "compute_bytes": p.compute_bytes,
        "warmup_compute_bytes": p.warmup_compute_bytes,
        "total_bytes": p.total_bytes,
        "image_tokens": p.spec.image_tokens,
        "flash_attn": p.flash_attn,
        "approximate": p.approximate,
    }


def estimate_json(e: Estimate) -> dict[str, Any]:
    """An estimate's figures as ``fitscope estimate --json`` names them: bytes as unrounded
    integers, ``context_tokens`` as llama.cpp's ``-c``, one entry per device, the settings."""
    return {
        "context_tokens": e.settings.context_tokens,
        "rules": e.rules,
        "approximate": e.approximate,
        "weights_bytes": e.weights_bytes,
        "repack_bytes": e.repack_bytes,
        "kv_cache_bytes": e.kv_cache_bytes,
        "recurrent_state_bytes": e.recurrent_state_bytes,
        "compute_bytes": e.compute_bytes,
        "output_bytes": e.output_bytes,
        "overhead_bytes": e.overhead_bytes,
        "projector_bytes": e.projector_bytes,
        "total_bytes": e.total_bytes,
        "model_bytes": e.model_bytes,
        "gpu_layers": e.gpu_layers,
        "devices": [
            {
                "name": d.name,
                "kind": d.kind,
                "capacity_bytes": d.capacity_bytes,
                "total_bytes": d.total_bytes,
                "free_bytes": d.free_bytes,
                "fits": d.fits,
                "weights_bytes": d.weights_bytes,
                "repack_bytes": d.repack_bytes,
                "kv_cache_bytes": d.kv_cache_bytes,
                "recurrent_state_bytes": d.recurrent_state_bytes,
                "compute_bytes": d.compute_bytes,
                "output_bytes": d.output_bytes,
                "overhead_bytes": d.overhead_bytes,
                "projector_bytes": d.projector_bytes,
                "layers": d.layers,
            }
            for d in e.devices
        ],
        "kv_caches": [c.model_dump() | {"total_bytes": c.total_bytes} for c in e.kv_caches],
        "projector": projector_json(e),
        "fits": e.fits,
        "settings": e.settings.model_dump(),
    }


def fit(model: ModelSource, settings: Settings, targets: list[Target], prompt_tokens: int = 512) -> FitResult:
    """Estimate memory and speed, and the largest context that fits. Raises EstimateError."""
    if settings.context_tokens > 4 * max(model.arch.n_ctx_train, 1) and settings.context_tokens > 1 << 20:
        raise EstimateError(
            f"A context of {settings.context_tokens:,} tokens is far beyond what {model.label} was trained "
            f"for ({model.arch.n_ctx_train:,}); choose at most {model.arch.n_ctx_train:,}."
        )
    tensors = model.tensors
    est = estimate(model.arch, tensors, settings, targets)
    speed = estimate_speed(
        model.arch,
        tensors,
        est,
        targets,
        prompt_tokens=min(prompt_tokens, settings.context_tokens),
        users=settings.parallel_sequences,
    )
    max_ctx = max_context_tokens(model.arch, tensors, settings, targets)
    # Users who each get the chosen context (per-sequence context = -c, as llama-server's slots).
    users = max_parallel_sequences(
        model.arch,
        tensors,
        settings.model_copy(update={"kv_unified": False}),
        targets,
        settings.context_tokens,
        upper=64,
    )
    has_gpu = any(t.kind == "gpu" for t in targets)
    layers = max_gpu_layers(model.arch, tensors, settings, targets) if has_gpu else None
    return FitResult(model, est, speed, max_ctx, users, layers, tuple(targets))
