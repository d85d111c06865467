"""From "this model, these settings, this hardware" to one answer: the estimate, the speed and the
limits (largest context, most users, most GPU layers). The CLI and the window both call this.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from app.core.architecture import Architecture
from app.core.catalog import find_model
from app.core.devices import DeviceSpec
from app.core.errors import EstimateError
from app.core.estimate import (
    CPU_RUNTIME_OVERHEAD_BYTES,
    Estimate,
    RepackProfile,
    Settings,
    Target,
    estimate,
    max_context_tokens,
    max_gpu_layers,
    max_parallel_sequences,
)
from app.core.host_memory import DEFAULT_HOST_MEMORY, HOST_MEMORY
from app.core.quant import find_preset, preset_for_ftype, quantize_layout
from app.core.speed import SpeedEstimate, estimate_speed
from app.core.tensors import TensorInfo
from app.core.units import GIB

if TYPE_CHECKING:
    from app.core.hardware import GpuSnapshot, HostSnapshot


@dataclass(frozen=True)
class ModelSource:
    """A model ready to estimate: its architecture, its tensors and where they came from."""

    arch: Architecture
    tensors: tuple[TensorInfo, ...]
    label: str
    quant: str
    path: Path | None = None


def model_from_catalog(model_id: str, quant: str = "Q4_K_M") -> ModelSource:
    """A catalog model quantized with a llama.cpp preset. Raises CatalogError / EstimateError."""
    arch = find_model(model_id)
    preset = find_preset(quant)
    return ModelSource(arch, tuple(quantize_layout(arch, preset)), arch.name, preset.name)


def model_from_gguf(path: str | Path) -> ModelSource:
    """A local GGUF file: its real tensors. Raises ModelFileError with a readable message."""
    from app.core.gguf_reader import read_gguf  # a catalog model's estimate never reads a file

    g = read_gguf(path)
    preset = preset_for_ftype(g.file_type)
    return ModelSource(g.architecture, g.tensors, g.name, preset.name if preset else "file", Path(path))


def model_from_hf_config(path: str | Path, quant: str = "Q4_K_M") -> ModelSource:
    """A Hugging Face config.json, quantized with a llama.cpp preset."""
    from app.core.hf_config import read_hf_config

    arch = read_hf_config(path)
    preset = find_preset(quant)
    return ModelSource(arch, tuple(quantize_layout(arch, preset)), arch.name, preset.name, Path(path))


# -- targets -------------------------------------------------------------------------------------


def target_from_device(device: DeviceSpec) -> Target:
    # A catalog CPU's bandwidth is its memory's spec-sheet peak, not a measurement.
    cls = "host-spec"
    if device.is_gpu:
        cls = {"nvidia": "nvidia", "amd": "amd", "apple": "apple"}.get(device.vendor, "cpu")
    return Target(
        name=device.name,
        kind="gpu" if device.is_gpu else "cpu",
        capacity_bytes=device.capacity_bytes,
        bandwidth_gb_s=device.bandwidth_gb_s,
        fp16_tflops=device.fp16_tflops,
        efficiency_class=cls,  # type: ignore[arg-type]
    )


def target_from_gpu(gpu: GpuSnapshot, fallback: DeviceSpec | None = None) -> Target:
    """A detected NVIDIA GPU. Capacity is the memory free now (other processes hold the rest)."""
    bandwidth = gpu.bandwidth_gb_s or (fallback.bandwidth_gb_s if fallback else 500.0)
    tflops = fallback.fp16_tflops if fallback else 50.0
    return Target(
        name=f"GPU {gpu.index}: {gpu.name}",
        kind="gpu",
        capacity_bytes=gpu.memory_free_bytes,
        bandwidth_gb_s=bandwidth,
        fp16_tflops=tflops,
        efficiency_class="nvidia",
    )


def cpu_flops_tflops(host: HostSnapshot) -> float:
    """Peak FP32 FMA throughput of the host: cores x 3 GHz x lanes x 2 (an order of magnitude)."""
    cores = host.physical_cores or host.logical_cores
    lanes = 16 if "avx512f" in host.cpu_flags else 8 if "avx2" in host.cpu_flags else 4
    return cores * 3.0e9 * lanes * 2 * 2 / 1e12


def repack_profile(host: HostSnapshot | None) -> RepackProfile:
    if host is None:
        return "x86-avx2"
    flags = set(host.cpu_flags)
    if "neon" in flags:
        return "arm-neon"
    if "avx512f" in flags:
        return "x86-avx512"
    if "avx2" in flags:
        return "x86-avx2"
    return "none"


def cpu_target(host: HostSnapshot | None) -> Target:
    """Host memory as a target: what is available now (plus our own overhead, counted separately)."""
    if host is None:
        return Target(
            name="CPU (unknown host)",
            kind="cpu",
            capacity_bytes=16 * 1024**3,
            bandwidth_gb_s=40.0,
            fp16_tflops=1.0,
            efficiency_class="cpu",
        )
    bandwidth = host.measured_read_bandwidth_gb_s or 30.0
    return Target(
        name=f"CPU: {host.cpu_model}",
        kind="cpu",
        capacity_bytes=host.ram_available_bytes + CPU_RUNTIME_OVERHEAD_BYTES,
        bandwidth_gb_s=bandwidth,
        fp16_tflops=cpu_flops_tflops(host),
        efficiency_class="cpu",
    )


def host_ram_target(capacity_bytes: int, bandwidth_gb_s: float | None = None, host_memory: str | None = None) -> Target:
    """Host memory beside GPUs (its size does not limit GPU memory, only spills). ``bandwidth_gb_s``
    is this machine's measured read bandwidth when the host is this machine; otherwise the
    theoretical peak of ``host_memory`` (a HOST_MEMORY key, default dual-channel DDR5), which the
    speed model discounts as a spec-sheet figure. Raises KeyError for an unknown ``host_memory``."""
    if bandwidth_gb_s:
        return Target(
            name="Host RAM",
            kind="cpu",
            capacity_bytes=capacity_bytes,
            bandwidth_gb_s=bandwidth_gb_s,
            fp16_tflops=1.0,
            efficiency_class="cpu",
        )
    label, peak = HOST_MEMORY[host_memory or DEFAULT_HOST_MEMORY]
    return Target(
        name=f"Host RAM ({label})",
        kind="cpu",
        capacity_bytes=capacity_bytes,
        bandwidth_gb_s=peak,
        fp16_tflops=1.0,
        efficiency_class="host-spec",
    )


def host_ram_beside(device: DeviceSpec, host_ram_bytes: int | None, fallback_bytes: int) -> int:
    """The host memory beside catalog GPU ``device``: for a unified-memory device, what its GPU may
    not take of the one pool (the rest of the box); otherwise ``host_ram_bytes`` when given, else
    ``fallback_bytes``."""
    if device.memory_kind == "unified":
        return int(device.memory_gib * GIB) - device.capacity_bytes
    return host_ram_bytes if host_ram_bytes is not None else fallback_bytes


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
