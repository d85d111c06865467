"""vLLM serving one model with tensor parallelism over several identical GPUs: the plan and its command.

:func:`vllm_plan` follows vLLM's (V1 engine) memory accounting (:mod:`app.core.plans.vllm_memory`): every
GPU holds 1/TP of each weight matrix; a budget of ``gpu_memory_utilization`` x the memory CUDA
reports is shared by the weights, the activation peak of a profiling forward pass and non-torch
allocations; what is left becomes KV-cache blocks of ``block_size`` tokens. The plan says, in
vLLM's own words, why it would not start, and gives the ``vllm serve`` command. See
docs/vllm-memory.md for the sources of the constants and for what is approximated.

All byte figures are integers (bytes); nothing here imports Qt.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlparse

from app.core.common.errors import EstimateError
from app.core.hardware.devices import DeviceSpec
from app.core.model.architecture import Architecture
from app.core.model.quant import ServingFormat, find_serving_format
from app.core.plans.vllm_memory import (
    VLLM_BLOCK_SIZES,
    VLLM_CUDA_CONTEXT_BYTES,
    VLLM_CUDA_GRAPH_BYTES,
    VLLM_CUDA_VISIBLE_FRACTION,
    VLLM_SAMPLER_BYTES_PER_LOGIT,
    VllmGpu,
    cdiv,
    check_quantized_shapes,
    check_tensor_parallel,
    gib_figure,
    kv_blocks,
    kv_dtype_bytes,
    start_problems,
    vllm_activation_bytes,
    vllm_gpu,
    vllm_kv_bytes_per_token,
    vllm_non_torch_bytes,
    vllm_weights_per_gpu,
)


def hf_model_id(arch: Architecture) -> str | None:
    """The Hugging Face id ("org/name") when ``arch.source`` is a huggingface.co model URL, else None."""
    url = urlparse(arch.source)
    if url.scheme not in ("http", "https") or url.netloc.lower() not in ("huggingface.co", "www.huggingface.co"):
        return None
    parts = [p for p in url.path.split("/") if p]
    if len(parts) < 2 or parts[0] in ("datasets", "spaces", "api", "docs", "models"):
        return None
    return f"{parts[0]}/{parts[1]}"


def default_max_num_batched_tokens(gpu: DeviceSpec) -> int:
    """What ``vllm serve`` picks when --max-num-batched-tokens is not given (EngineArgs batch
    defaults): 8192 on GPUs of 70 GiB or more other than the A100, else 2048."""
    return 8192 if gpu.memory_gib >= 70 and "a100" not in gpu.name.lower() else 2048


def _sm(gpu: DeviceSpec) -> tuple[int, int] | None:
    if not gpu.compute_capability:
        return None
    try:
        major, _, minor = gpu.compute_capability.partition(".")
        return int(major), int(minor or 0)
    except ValueError:
        return None


@dataclass(frozen=True)
class VllmServing:
    """What every vLLM plan reports: the model and GPU, the resolved ``vllm serve`` settings, the KV
    cache the engine allocates (``num_gpu_blocks`` blocks of ``block_size`` tokens) and what it holds
    at ``max_model_len`` tokens per request in the terms of vLLM's start-up log, why it would not
    start, notes and the command. Filled from a :class:`VllmRequest` (:meth:`VllmRequest.plan_fields`)."""

    model_id: str
    model_name: str
    gpu_name: str
    tensor_parallel_size: int
    serving_format: str
    quantization: str | None
    dtype_flag: str
    kv_cache_dtype: str
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    block_size: int
    total_weights_bytes: int
    """Every GPU's weights together (replicated parts counted on each)."""
    num_gpu_blocks: int
    problems: tuple[str, ...]
    """Why vLLM would not start, first reason first, each in vLLM's words; empty when it starts."""
    notes: tuple[str, ...]
    command: str

    @property
    def starts(self) -> bool:
        return not self.problems

    @property
    def kv_cache_tokens(self) -> int:
        """vLLM's "GPU KV cache size: N tokens"."""
        return self.num_gpu_blocks * self.block_size

    @property
    def blocks_per_sequence(self) -> int:
        return cdiv(self.max_model_len, self.block_size)

    @property
    def max_model_len_fits(self) -> bool:
        return self.num_gpu_blocks >= self.blocks_per_sequence

    @property
    def max_concurrency(self) -> float:
        """vLLM's "Maximum concurrency for L tokens per request: Nx"."""
        return self.num_gpu_blocks / self.blocks_per_sequence

    @property
    def max_concurrent_sequences(self) -> int:
        """Sequences of ``max_model_len`` tokens the KV cache holds at once (blocks x block_size //
        max_model_len when max_model_len is a multiple of block_size)."""
        return self.num_gpu_blocks // self.blocks_per_sequence

    @property
    def estimated_max_model_len(self) -> int:
        """The longest sequence one request could have in this KV cache (vLLM's own estimate)."""
        return min(self.kv_cache_tokens, self.max_model_len) if self.num_gpu_blocks > 0 else 0

    def outcome_line(self) -> str:
        """The summary's last sentence: why vLLM would not start, or how many full-length sequences fit."""
        if self.problems:
            return f"vLLM would not start: {self.problems[0]}"
        running = min(self.max_num_seqs, self.max_concurrent_sequences)
        return (
            f"{self.max_concurrent_sequences} sequences of the full {self.max_model_len:,} tokens fit at once; "
            f"with --max-num-seqs {self.max_num_seqs}, up to {running} run together at that length "
            "(more when they are shorter)."
        )

    def _settings_json(self, parallel: dict[str, Any]) -> dict[str, Any]:
        """The model, the GPU, the parallel sizes (``tensor_parallel_size`` then ``parallel``) and
        the serve settings, in the order every plan's JSON starts with."""
        return {
            "engine": "vllm",
            "model": self.model_id,
            "model_name": self.model_name,
            "gpu": self.gpu_name,
            "tensor_parallel_size": self.tensor_parallel_size,
            **parallel,
            "serving_format": self.serving_format,
            "quantization": self.quantization,
            "dtype": self.dtype_flag,
            "kv_cache_dtype": self.kv_cache_dtype,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "block_size": self.block_size,
            "total_weights_bytes": self.total_weights_bytes,
        }

    def _capacity_json(self) -> dict[str, Any]:
        """What the KV cache holds and whether vLLM starts."""
        return {
            "kv_cache_tokens": self.kv_cache_tokens,
            "max_concurrency": self.max_concurrency,
            "max_concurrent_sequences": self.max_concurrent_sequences,
            "estimated_max_model_len": self.estimated_max_model_len,
            "starts": self.starts,
            "problems": list(self.problems),
        }


@dataclass(frozen=True)
class VllmPlan(VllmServing):
    """vLLM serving ``model_id`` with tensor parallelism over ``tensor_parallel_size`` identical GPUs."""

    kv_bytes_per_token: int
    """On each GPU."""
    block_bytes: int
    """One block of ``block_size`` tokens over every layer, on each GPU."""
    gpus: tuple[VllmGpu, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            **self._settings_json({}),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "block_bytes": self.block_bytes,
            "num_gpu_blocks": self.num_gpu_blocks,
            **self._capacity_json(),
            "gpus": [g.to_json() for g in self.gpus],
            "notes": list(self.notes),
            "command": self.command,
        }

    def summary_lines(self) -> list[str]:
        g = self.gpus[0]
        tp = self.tensor_parallel_size
        lines = [
            f"vLLM shards {self.model_name} ({self.serving_format}) over {tp} x {self.gpu_name} with tensor "
            f"parallelism: every GPU holds 1/{tp} of each layer and works on every token.",
            f"Each GPU: budget {gib_figure(g.budget_bytes)} GiB ({self.gpu_memory_utilization:g} of "
            f"{gib_figure(g.visible_bytes)} GiB) = weights {gib_figure(g.weights_bytes)} + activation peak "
            f"{gib_figure(g.activation_bytes)} + non-torch {gib_figure(g.non_torch_bytes)} + KV cache "
            f"{gib_figure(max(g.kv_budget_bytes, 0))} GiB; CUDA graphs and context "
            f"{gib_figure(g.cuda_graph_bytes + g.cuda_context_bytes)} GiB outside it.",
        ]
        if self.num_gpu_blocks > 0:
            lines.append(
                f"KV cache: {self.num_gpu_blocks:,} blocks of {self.block_size} tokens = "
                f"{self.kv_cache_tokens:,} tokens ({self.kv_bytes_per_token:,} bytes per token per GPU); "
                f"{self.max_concurrency:.2f}x concurrency at {self.max_model_len:,} tokens per request."
            )
        lines.append(self.outcome_line())
        return lines


def _quantization_flag(fmt: ServingFormat, gpu: DeviceSpec) -> str | None:
    sm = _sm(gpu)
    marlin = gpu.backend == "cuda" and sm is not None and sm >= (8, 0)
    if fmt.name == "FP8":
        return "fp8"
    if fmt.name == "AWQ-4bit":
        # An explicit "awq" forces the slow kernel; awq_marlin is vLLM's choice on SM 8.0+.
        return "awq_marlin" if marlin else "awq"
    if fmt.name == "GPTQ-4bit":
        return "gptq_marlin" if marlin else "gptq"
    return None  # FP16: none; INT8: vLLM reads the scheme from an INT8 checkpoint's config


@dataclass(frozen=True)
class VllmRequest:
    """What ``vllm serve`` is asked for, checked against the model and the GPU, with its flags
    resolved: the settings every GPU of a plan shares (:func:`vllm_request`)."""

    model_id: str
    serving_format: ServingFormat
    quantization: str | None
    """--quantization, or None."""
    dtype_flag: str
    kv_cache_dtype: str
    kv_dtype_bytes: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    batched_default: bool
    """max_num_batched_tokens is vllm serve's default for this GPU (the caller gave none)."""
    gpu_memory_utilization: float
    block_size: int

    def plan_fields(self) -> dict[str, Any]:
        """The :class:`VllmServing` fields these settings fill, for a plan's constructor."""
        return {
            "model_id": self.model_id,
            "serving_format": self.serving_format.name,
            "quantization": self.quantization,
            "dtype_flag": self.dtype_flag,
            "kv_cache_dtype": self.kv_cache_dtype,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "block_size": self.block_size,
        }

    def serve_command(self, tensor_parallel_size: int, pipeline_parallel_size: int = 1) -> str:
        """The ``vllm serve`` command line. With pipeline parallelism it adds
        --pipeline-parallel-size and the Ray backend that spans the nodes."""
        args = ["vllm", "serve", shlex.quote(self.model_id), "--tensor-parallel-size", str(tensor_parallel_size)]
        if pipeline_parallel_size > 1:
            args += ["--pipeline-parallel-size", str(pipeline_parallel_size), "--distributed-executor-backend", "ray"]
        args += [
            "--max-model-len",
            str(self.max_model_len),
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--max-num-batched-tokens",
            str(self.max_num_batched_tokens),
            "--gpu-memory-utilization",
            f"{self.gpu_memory_utilization:g}",
            "--dtype",
            self.dtype_flag,
        ]
        if self.block_size != 16:
            args += ["--block-size", str(self.block_size)]
        if self.kv_dtype_bytes == 1:
            args += ["--kv-cache-dtype", self.kv_cache_dtype]
        if self.quantization:
            args += ["--quantization", self.quantization]
        return " ".join(args)


def vllm_request(
    arch: Architecture,
    gpu: DeviceSpec,
    tensor_parallel_size: int,
    *,
    dtype: str = "FP16",
    max_model_len: int,
    max_num_seqs: int,
    gpu_memory_utilization: float = 0.90,
    kv_cache_dtype: str = "auto",
    block_size: int = 16,
    max_num_batched_tokens: int | None = None,
    model: str | None = None,
) -> VllmRequest:
    """Check what vLLM would refuse before touching memory and resolve the command's flags; the
    arguments are :func:`vllm_plan`'s. Raises EstimateError (heads not divisible by
    ``tensor_parallel_size``, unknown dtype or KV dtype, a GPU vLLM does not run on, a state-space
    model, bad arguments)."""
    if tensor_parallel_size < 1:
        raise EstimateError("Tensor parallelism needs at least one GPU.")
    if gpu.backend not in ("cuda", "rocm"):
        raise EstimateError(f"vLLM runs on NVIDIA (CUDA) and AMD (ROCm) GPUs, not on {gpu.name}.")
    if not 0 < gpu_memory_utilization <= 1:
        raise EstimateError(f"gpu_memory_utilization must be in (0, 1], not {gpu_memory_utilization}.")
    if max_model_len < 1 or max_num_seqs < 1:
        raise EstimateError("max_model_len and max_num_seqs must be at least 1.")
    if block_size not in VLLM_BLOCK_SIZES:
        raise EstimateError(f"vLLM's block size is one of {', '.join(map(str, VLLM_BLOCK_SIZES))}, not {block_size}.")
    fmt = find_serving_format(dtype)
    kv_bytes = kv_dtype_bytes(kv_cache_dtype)
    check_tensor_parallel(arch, tensor_parallel_size)
    check_quantized_shapes(arch, fmt, tensor_parallel_size)
    batched = max_num_batched_tokens if max_num_batched_tokens is not None else default_max_num_batched_tokens(gpu)
    if batched < max_num_seqs:
        raise EstimateError(
            f"max_num_batched_tokens ({batched}) must be greater than or equal to max_num_seqs ({max_num_seqs})."
        )
    sm = _sm(gpu)
    if fmt.name == "FP8" and sm is not None and sm < (8, 0):
        raise EstimateError(f"vLLM's FP8 weights need compute capability 8.0 or newer; {gpu.name} has {sm[0]}.{sm[1]}.")
    hf = model or hf_model_id(arch)
    if fmt.name in ("AWQ-4bit", "GPTQ-4bit", "INT8"):
        # A 16-bit checkpoint cannot be served as AWQ/GPTQ/INT8: vLLM needs a checkpoint quantized so.
        model_id = f"<a {fmt.name} checkpoint of {hf or arch.name}>" if model is None else model
    else:
        model_id = hf or f"<Hugging Face id of {arch.name}>"
    dtype_flag = "half" if (sm is not None and sm < (8, 0)) or fmt.name in ("AWQ-4bit", "GPTQ-4bit") else "auto"
    return VllmRequest(
        model_id=model_id,
        serving_format=fmt,
        quantization=_quantization_flag(fmt, gpu),
        dtype_flag=dtype_flag,
        kv_cache_dtype=kv_cache_dtype.strip().lower(),
        kv_dtype_bytes=kv_bytes,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=batched,
        batched_default=max_num_batched_tokens is None,
        gpu_memory_utilization=gpu_memory_utilization,
        block_size=block_size,
    )


def vllm_plan(
    arch: Architecture,
    gpu: DeviceSpec,
    count: int,
    *,
    dtype: str = "FP16",
    max_model_len: int,
    max_num_seqs: int,
    gpu_memory_utilization: float = 0.90,
    kv_cache_dtype: str = "auto",
    block_size: int = 16,
    max_num_batched_tokens: int | None = None,
    model: str | None = None,
) -> VllmPlan:
    """vLLM's memory plan for ``arch`` on ``count`` copies of ``gpu`` at tensor-parallel size ``count``.

    ``dtype`` is a SERVING_FORMATS name (weight storage); ``max_model_len`` and
    ``max_num_batched_tokens`` are tokens (None: vllm serve's default for this GPU);
    ``gpu_memory_utilization`` is a fraction of the memory CUDA reports. ``model`` overrides the
    Hugging Face id taken from the architecture's source.

    Raises EstimateError for what vLLM refuses before touching memory (heads not divisible by TP,
    unknown dtype or KV dtype, a GPU vLLM does not run on, a state-space model, bad arguments).
    Memory shortfalls are not errors: ``problems`` says, in vLLM's words, why it would not start.
    """
    request = vllm_request(
        arch,
        gpu,
        count,
        dtype=dtype,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        gpu_memory_utilization=gpu_memory_utilization,
        kv_cache_dtype=kv_cache_dtype,
        block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens,
        model=model,
    )
    tp = count
    fmt = request.serving_format
    weights = vllm_weights_per_gpu(arch, fmt, tp)
    per_token = vllm_kv_bytes_per_token(arch, tp, request.kv_dtype_bytes)
    block_bytes = per_token * block_size
    line = vllm_gpu(
        gpu.capacity_bytes,
        gpu_memory_utilization,
        weights_bytes=weights,
        activation_bytes=vllm_activation_bytes(arch, tp, request.max_num_batched_tokens, max_num_seqs),
        non_torch_bytes=vllm_non_torch_bytes(tp),
        block_bytes=block_bytes,
    )
    blocks = kv_blocks(line.kv_budget_bytes, block_bytes)
    gpus = tuple(replace(line, name=f"GPU {i}") for i in range(count))
    problems = start_problems(arch, line, max_model_len, block_size, block_bytes, blocks, gpu_memory_utilization)
    return VllmPlan(
        **request.plan_fields(),
        model_name=arch.name,
        gpu_name=gpu.name,
        tensor_parallel_size=tp,
        total_weights_bytes=weights * tp,
        kv_bytes_per_token=per_token,
        block_bytes=block_bytes,
        num_gpu_blocks=blocks,
        gpus=gpus,
        problems=tuple(problems),
        notes=tuple(vllm_notes(arch, tp, request)),
        command=request.serve_command(tp),
    )


def vllm_notes(arch: Architecture, tp: int, request: VllmRequest, world_size: int | None = None) -> list[str]:
    """What a plan approximates and what its command implies, one sentence each; ``world_size``
    (tensor x pipeline parallel size, default ``tp``) sets the non-torch allowance."""
    fmt, quant, dtype_flag = request.serving_format, request.quantization, request.dtype_flag
    batched = request.max_num_batched_tokens
    non_torch = vllm_non_torch_bytes(tp if world_size is None else world_size)
    out = [
        f"Budget = gpu_memory_utilization x the memory CUDA reports ({VLLM_CUDA_VISIBLE_FRACTION:g} of the sold "
        "memory); the weights, the profiled activation peak and non-torch memory come out of it, the rest is "
        "KV cache.",
        f"Activation peak: the larger of a {batched:,}-token forward pass and the sampler over "
        f"min(max_num_seqs, {batched:,}) sequences at {VLLM_SAMPLER_BYTES_PER_LOGIT:g} bytes per vocabulary entry "
        "(fitted to published vLLM V1 profiles on H100s).",
        f"Non-torch memory {gib_figure(non_torch)} GiB per GPU; "
        f"CUDA context {gib_figure(VLLM_CUDA_CONTEXT_BYTES)} GiB and CUDA graphs "
        f"{gib_figure(VLLM_CUDA_GRAPH_BYTES)} GiB "
        "outside the budget (published logs; vary by vLLM version).",
        "Embedding and LM head are split by vocabulary rows across the GPUs; norms are replicated on each.",
    ]
    if request.batched_default:
        out.append(f"--max-num-batched-tokens {batched} is what vllm serve picks on this GPU when not given.")
    if arch.mla is None:
        kv = max(arch.kv_heads(i) for i in range(arch.n_layer))
        if 0 < kv < tp:
            out.append(
                f"{kv} KV heads over {tp} GPUs: vLLM replicates each KV head on {tp // kv} GPUs, so the KV cache per "
                "GPU stops shrinking with more GPUs."
            )
    else:
        out.append("MLA: every GPU keeps the whole latent KV cache (one row per token and layer); it is not sharded.")
    if arch.uses_swa:
        out.append(
            "Sliding-window layers are counted at full length; vLLM's hybrid KV cache manager keeps only the window "
            "for them, so it holds more (and longer) sequences than shown."
        )
    if fmt.name in ("AWQ-4bit", "GPTQ-4bit", "INT8"):
        out.append(f"{fmt.name} needs a checkpoint quantized so; vLLM reads the scheme from its config.")
    if quant == "fp8":
        out.append("--quantization fp8 quantizes a 16-bit checkpoint's weights to FP8 at load (dynamic scales).")
    if dtype_flag == "half" and fmt.name not in ("AWQ-4bit", "GPTQ-4bit"):
        out.append("This GPU has no bfloat16 (compute capability below 8.0): --dtype half.")
    return out
