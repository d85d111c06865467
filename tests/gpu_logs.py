"""Public llama.cpp load logs held against the estimator: which printed buffer is which estimate.

Each log in ``tests/data/gpu_load_logs.json`` that carries a ``fitscope_case`` (the catalog model
and quantization it ran, the GPUs' free memory, and the placement flags) is estimated with the
same settings, and every printed buffer the estimator models is compared: ``CUDA<i> model`` with
GPU i's weights, ``CUDA<i> KV``, ``CUDA<i> compute``, ``CUDA_Host compute`` (plus ``CPU compute``
where an older build printed one) with host compute. Used by ``scripts/bench_gpu_logs.py`` and
the tests.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from app.core.memory.estimate import estimate
from app.core.memory.kv import mask_bytes
from app.core.memory.records import Estimate, Settings, Target
from app.core.model.catalog import find_model
from app.core.model.quant import find_preset, quantize_layout

MIB = 1024**2
GIB = 1024**3


class BufferCheck(BaseModel):
    model_config = ConfigDict(frozen=True)

    log_id: str
    buffer: str  # as printed, e.g. "CUDA0 compute"
    kind: str  # weights | kv | compute | host_compute
    printed_mib: float
    estimated_mib: float
    build: str | None
    date: str | None

    @property
    def error_mib(self) -> float:
        return self.estimated_mib - self.printed_mib

    @property
    def error_fraction(self) -> float:
        return self.error_mib / self.printed_mib if self.printed_mib else 0.0

    def within(self, fraction: float = 0.05, mib: float = 32.0) -> bool:
        """llama.cpp-exactness target for compute buffers: 5% or 32 MiB, whichever is larger."""
        return abs(self.error_mib) <= max(fraction * self.printed_mib, mib)


def load_logs(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))


def _split_capacities(case: dict, n_layer: int) -> list[int]:
    """GPU capacities that reproduce the log's layer split: llama.cpp splits by free memory."""
    if case.get("split_layers"):
        return [int(n * GIB) for n in case["split_layers"]]
    return [int(m * MIB) for m in case["gpus_free_mib"]]


def estimate_for(log: dict) -> Estimate:
    """The estimate for a log's ``fitscope_case``. Raises KeyError without one."""
    case = log["fitscope_case"]
    s = log["settings"]
    arch = find_model(case["model"])
    tensors = quantize_layout(arch, find_preset(case["quant"]))
    capacities = _split_capacities(case, arch.n_layer)
    gpus = [
        Target(name=f"CUDA{i}", kind="gpu", capacity_bytes=c, bandwidth_gb_s=900, fp16_tflops=70)
        for i, c in enumerate(capacities)
    ]
    host = Target(
        name="host", kind="cpu", capacity_bytes=1 << 50, bandwidth_gb_s=60, fp16_tflops=1, efficiency_class="cpu"
    )
    settings = Settings(
        context_tokens=int(s["n_ctx"]),
        batch_tokens=int(case.get("n_batch") or s.get("n_batch") or 2048),
        ubatch_tokens=int(s.get("n_ubatch") or 512),
        flash_attn=bool(s.get("flash_attn")),
        cache_type_k=s.get("type_k") or "f16",
        cache_type_v=s.get("type_v") or "f16",
        parallel_sequences=int(s.get("n_seq_max") or 1),
        gpu_layers=min(int(case["n_gpu_layers"]), arch.n_layer + 1),
        backend="cuda",
        consumer=case["consumer"],
        mmap=bool(case.get("mmap", True)),
        n_cpu_moe=int(case.get("n_cpu_moe") or 0),
        swa_full=True,
    )
    return estimate(arch, tensors, settings, [*gpus, host])


_PRINTED = re.compile(r"^(CUDA(\d+)|CUDA_Host|CPU|CPU_Mapped) (model|KV|compute)$")


def checks_for(log: dict, est: Estimate) -> list[BufferCheck]:
    """Every printed buffer of ``log`` that the estimate models, side by side."""
    out = []
    case = log["fitscope_case"]
    host = est.devices[-1]
    # A CPU_Mapped buffer is the file range its tensors span, which interleaves GPU tensors: only
    # loaded (--no-mmap) host buffers measure what the host holds.
    host_weights = [v for k, v in log["buffers_mib"].items() if k in ("CPU model", "CUDA_Host model")]
    if host_weights and not case.get("mmap", True) and case.get("compare_weights", True):
        out.append(_check(log, "host model (loaded)", "weights", sum(host_weights), host.weights_bytes))
    host_extra = gpu_extra = 0
    if case.get("mask_f32") and est.settings.flash_attn:
        # Builds of that time made the mask in f32 and cast it to f16 for flash attention
        # (self_kq_mask_cnv): 2 more bytes a cell on the host, and on each GPU with attention
        # layers the f32 copy beside the f16 cast. The vendored build makes it in f16 directly.
        f16 = mask_bytes(est.settings, est.kv_caches)
        host_extra, gpu_extra = f16, 2 * f16
    for name, printed in log["buffers_mib"].items():
        m = _PRINTED.match(name)
        if not m:
            continue
        device, index, what = m.group(1), m.group(2), m.group(3)
        if what == "compute" and device in ("CPU", "CUDA_Host"):
            if device == "CPU" and "CUDA_Host compute" in log["buffers_mib"]:
                continue  # a second host buffer of older builds (see the case note), not modelled
            out.append(_check(log, name, "host_compute", printed, host.compute_bytes + host_extra))
            continue
        if index is None:
            continue
        d = est.devices[int(index)]
        if what == "compute":
            extra = gpu_extra if d.layers else 0
            out.append(_check(log, name, "compute", printed, d.compute_bytes + extra))
        elif what == "KV":
            out.append(_check(log, name, "kv", printed, d.kv_cache_bytes))
        elif what == "model" and case.get("compare_weights", True):
            out.append(_check(log, name, "weights", printed, d.weights_bytes))
    return out


def _check(log: dict, name: str, kind: str, printed_mib: float, estimated_bytes: int) -> BufferCheck:
    return BufferCheck(
        log_id=log["id"],
        buffer=name,
        kind=kind,
        printed_mib=float(printed_mib),
        estimated_mib=estimated_bytes / MIB,
        build=log.get("build"),
        date=log.get("date"),
    )


def all_checks(logs: Iterable[dict]) -> list[BufferCheck]:
    out: list[BufferCheck] = []
    for log in logs:
        if "fitscope_case" in log:
            out += checks_for(log, estimate_for(log))
    return out
