"""One model across several identical GPUs: llama.cpp's layer split and vLLM's tensor parallelism.

Two plans with their launch commands:

- :func:`llama_split_plan` runs the estimator (:func:`app.core.estimate.estimate`) over ``count``
  copies of a GPU and reports each GPU's share of llama.cpp's layer split (whole layers per GPU,
  every GPU holding its layers' weights and KV cache, plus its own compute buffer), with the
  ``llama-server`` command that reproduces it.
- :func:`vllm_plan` follows vLLM's (V1 engine) memory accounting: every GPU holds 1/TP of each
  weight matrix; a budget of ``gpu_memory_utilization`` x the memory CUDA reports is shared by the
  weights, the activation peak of a profiling forward pass and non-torch allocations; what is left
  becomes KV-cache blocks of ``block_size`` tokens. See docs/vllm-memory.md for the sources of the
  constants below and for what is approximated.

All byte figures are integers (bytes); nothing here imports Qt.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace
from math import prod
from typing import Any
from urllib.parse import urlparse

from app.core.architecture import Architecture
from app.core.commands import server_command
from app.core.devices import DeviceSpec
from app.core.errors import EstimateError
from app.core.estimate import DeviceBreakdown, Estimate, Settings, estimate, max_gpu_layers
from app.core.fit import host_ram_target, target_from_device
from app.core.layout import tensor_layout
from app.core.quant import ServingFormat, find_serving_format
from app.core.tensors import TensorInfo
from app.core.units import GIB, MIB

# -- vLLM constants ------------------------------------------------------------------------------
# Each is a published observation, not a measurement of ours (no GPU was used); docs/vllm-memory.md
# lists the logs they come from.

VLLM_CUDA_VISIBLE_FRACTION = 0.987
"""Share of the sold memory CUDA reports as total (``torch.cuda.mem_get_info``): RTX 4090 23.64-23.68
GiB of 24, H100 "80 GB" 79.18-79.22 GiB. vLLM's budget is a fraction of this total."""

VLLM_CUDA_CONTEXT_BYTES = 600 * MIB
"""Held before vLLM measures anything (CUDA context, kernels): 78.57 of 79.18 GiB free at start-up on
an H100. Outside the ``gpu_memory_utilization`` budget."""

VLLM_NON_TORCH_BYTES = int(0.16 * GIB)
"""Non-torch memory grown during profiling with TP=1 (cuBLAS workspace and the like): 0.13-0.16 GiB
in vLLM's memory-profiling logs. Inside the budget."""

VLLM_NON_TORCH_BYTES_TP = int(0.55 * GIB)
"""The same with TP>1, where NCCL and custom all-reduce buffers join it: 0.55 GiB per GPU for
Llama-3.3-70B-FP8 at TP=2 on H100s."""

VLLM_CUDA_GRAPH_BYTES = 512 * MIB
"""CUDA graphs captured after the KV cache is allocated, from the memory left outside the budget:
0.13-0.21 GiB for 1B models in V0 logs, -0.9 to +1.0 GiB as V1 estimates it on H100s."""

VLLM_SAMPLER_BYTES_PER_LOGIT = 38.5
"""Peak bytes per (sequence x vocabulary entry) of the dummy sampler run that closes vLLM's profile
(f32 logits plus the top-k/top-p sort, indices and probabilities). Fitted to the "peak activation"
of five V1 logs on H100s at max_num_seqs 1024 (Llama-3.1-8B 4.76 GiB, Qwen3-0.6B 5.56, Qwen3-32B
5.64, gpt-oss-20b 7.38, Llama-3.3-70B TP=2 4.84): every one within 2%."""

VLLM_FORWARD_HIDDEN_COPIES = 4
"""Hidden-state-wide tensors alive beside the MLP's intermediates in the profiling forward pass
(input, residual, normed input, output): an assumption, not fitted (the sampler dominated every
published profile)."""

VLLM_ACTIVATION_DTYPE_BYTES = 2  # activations run in the 16-bit model dtype, even with 4/8-bit weights
VLLM_VOCAB_PADDING = 64  # VocabParallelEmbedding pads the vocabulary to a multiple of 64 before sharding
VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
VLLM_AWQ_GROUP = 128  # AWQ/GPTQ group size assumed by SERVING_FORMATS

_KV_DTYPE_BYTES = {"auto": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
_MODEL_PLACEHOLDER = "MODEL.gguf"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _gib(n: float) -> str:
    return f"{n / GIB:.2f}"


# -- llama.cpp: the layer split ------------------------------------------------------------------


@dataclass(frozen=True)
class SplitDevice:
    """One device's share of a llama.cpp layer split. ``layers`` counts repeating layers only;
    ``holds_output`` says whether the output layer (llama.cpp's layer ``n_layer``) is here.
    ``other_bytes`` is CPU repack + recurrent state + output buffer."""

    name: str
    kind: str
    layers: int
    holds_output: bool
    weights_bytes: int
    kv_cache_bytes: int
    compute_bytes: int
    overhead_bytes: int
    other_bytes: int
    total_bytes: int
    capacity_bytes: int

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    @classmethod
    def from_breakdown(cls, d: DeviceBreakdown, holds_output: bool) -> SplitDevice:
        return cls(
            name=d.name,
            kind=d.kind,
            layers=d.layers,
            holds_output=holds_output,
            weights_bytes=d.weights_bytes,
            kv_cache_bytes=d.kv_cache_bytes,
            compute_bytes=d.compute_bytes,
            overhead_bytes=d.overhead_bytes,
            other_bytes=d.repack_bytes + d.recurrent_state_bytes + d.output_bytes,
            total_bytes=d.total_bytes,
            capacity_bytes=d.capacity_bytes,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "layers": self.layers,
            "holds_output": self.holds_output,
            "weights_bytes": self.weights_bytes,
            "kv_cache_bytes": self.kv_cache_bytes,
            "compute_bytes": self.compute_bytes,
            "overhead_bytes": self.overhead_bytes,
            "other_bytes": self.other_bytes,
            "total_bytes": self.total_bytes,
            "capacity_bytes": self.capacity_bytes,
            "fits": self.fits,
        }


@dataclass(frozen=True)
class LlamaSplitPlan:
    """llama.cpp's ``--split-mode layer`` over ``count`` identical GPUs, as the estimator places it."""

    model_name: str
    gpu_name: str
    count: int
    estimate: Estimate
    gpus: tuple[SplitDevice, ...]
    host: SplitDevice
    tensor_split: tuple[int, ...]
    command: str
    suggested_gpu_layers: int | None
    """When the GPUs do not fit: the most layers (``-ngl``) that would; None when they fit."""

    @property
    def settings(self) -> Settings:
        return self.estimate.settings

    @property
    def gpu_layers(self) -> int:
        return self.estimate.gpu_layers

    @property
    def n_layer(self) -> int:
        return self.estimate.n_layer

    @property
    def fits(self) -> bool:
        return self.estimate.fits

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": "llama.cpp",
            "model": self.model_name,
            "gpu": self.gpu_name,
            "count": self.count,
            "split_mode": "layer",
            "tensor_split": list(self.tensor_split),
            "gpu_layers": self.gpu_layers,
            "n_layer": self.n_layer,
            "fits": self.fits,
            "suggested_gpu_layers": self.suggested_gpu_layers,
            "gpus": [g.to_json() for g in self.gpus],
            "host": self.host.to_json(),
            "settings": self.settings.model_dump(),
            "command": self.command,
        }

    def summary_lines(self) -> list[str]:
        s = self.settings
        lines = [
            f"llama.cpp splits {self.model_name} by whole layers over {self.count} x {self.gpu_name}: "
            f"{self.gpu_layers} of {self.n_layer + 1} layers (the output layer included) on the GPUs, "
            f"context {s.context_tokens:,} tokens for {s.parallel_sequences} sequence(s)."
        ]
        for g in self.gpus:
            output = " and the output layer" if g.holds_output else ""
            verdict = "fits" if g.fits else "does NOT fit"
            lines.append(
                f"{g.name}: {g.layers} layers{output}; weights {_gib(g.weights_bytes)} GiB, KV cache "
                f"{_gib(g.kv_cache_bytes)} GiB, compute {_gib(g.compute_bytes)} GiB, overhead "
                f"{_gib(g.overhead_bytes)} GiB: {_gib(g.total_bytes)} of {_gib(g.capacity_bytes)} GiB, {verdict}."
            )
        h = self.host
        held = (
            f"{h.layers} layers, the token embedding and the logits"
            if h.layers
            else "the token embedding and the logits"
        )
        lines.append(
            f"Host memory keeps {held}: {_gib(h.total_bytes)} of {_gib(h.capacity_bytes)} GiB"
            f"{'' if h.fits else ', which does NOT fit'}."
        )
        if self.suggested_gpu_layers is not None:
            if self.suggested_gpu_layers:
                lines.append(
                    f"The GPUs are too small for every layer: -ngl {self.suggested_gpu_layers} would fit, "
                    "the rest running on the CPU."
                )
            else:
                lines.append("No number of GPU layers fits these GPUs and this host with these settings.")
        lines.append("Each GPU runs its own layers in turn (no tensor parallelism): speed is about one GPU's.")
        return lines


def _tensor_split(capacities: Sequence[int]) -> tuple[int, ...]:
    """llama.cpp's --tensor-split proportions for these capacities, in lowest terms (MiB-rounded)."""
    mib = [max(1, c // MIB) for c in capacities]
    g = math.gcd(*mib)
    return tuple(m // g for m in mib)


def llama_split_plan(
    arch: Architecture,
    tensors: Sequence[TensorInfo],
    settings: Settings,
    gpu: DeviceSpec,
    count: int,
    host_ram_bytes: int,
    *,
    model_path: str | None = None,
) -> LlamaSplitPlan:
    """llama.cpp's layer split of ``arch`` (``tensors``) over ``count`` copies of ``gpu`` (named
    "GPU 0".."GPU n-1") beside ``host_ram_bytes`` of host memory, under ``settings``.

    Raises EstimateError for fewer than one GPU, a device that is not a GPU, or settings
    llama.cpp refuses.
    """
    if count < 1:
        raise EstimateError("A multi-GPU plan needs at least one GPU.")
    if not gpu.is_gpu:
        raise EstimateError(f"{gpu.name} is not a GPU: a layer split needs GPUs.")
    base = target_from_device(gpu)
    gpus = [base.model_copy(update={"name": f"GPU {i}"}) for i in range(count)]
    targets = [*gpus, host_ram_target(host_ram_bytes)]
    est = estimate(arch, tensors, settings, targets)
    out_dev = est.layer_devices[est.n_layer] if est.gpu_layers else -1
    lines = tuple(SplitDevice.from_breakdown(d, out_dev == i) for i, d in enumerate(est.devices[:count]))
    host = SplitDevice.from_breakdown(est.devices[-1], False)
    split = _tensor_split([t.capacity_bytes for t in gpus])
    suggested = None
    if not all(g.fits for g in lines):
        suggested = max_gpu_layers(arch, tensors, settings, targets)
    command = server_command(
        est, model_path or _MODEL_PLACEHOLDER, est.gpu_layers, arch.sliding_window is not None, tensor_split=split
    )
    return LlamaSplitPlan(arch.name, gpu.name, count, est, lines, host, split, command, suggested)


# -- vLLM: tensor parallelism ---------------------------------------------------------------------


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


def check_tensor_parallel(arch: Architecture, tp: int) -> None:
    """Raise EstimateError, in vLLM's words, when vLLM cannot shard ``arch`` over ``tp`` GPUs.

    Attention heads must divide by TP. KV heads must divide by TP, or TP by them: with fewer KV
    heads than GPUs vLLM replicates each KV head on TP / n_head_kv GPUs. MLP (and expert) widths
    must divide by TP too.
    """
    if tp < 1:
        raise EstimateError("Tensor parallelism needs at least one GPU.")
    if arch.ssm is not None:
        raise EstimateError(
            f"{arch.name} is a state-space (Mamba) model: FitScope's vLLM plan covers attention models only."
        )
    heads = sorted({arch.heads(i) for i in range(arch.n_layer)})
    for n in heads:
        if n % tp:
            raise EstimateError(
                f"Total number of attention heads ({n}) must be divisible by tensor parallel size ({tp}) "
                f"(vLLM refuses {arch.name} at --tensor-parallel-size {tp}); choose a divisor of {n}."
            )
    if arch.mla is None:
        for kv in sorted({arch.kv_heads(i) for i in range(arch.n_layer)} - {0}):
            if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
                raise EstimateError(
                    f"{arch.name} has {kv} key/value heads: vLLM splits them over the GPUs when TP divides "
                    f"them and replicates them when they divide TP; {tp} does neither."
                )
    widths = {arch.ff(i) for i in range(arch.n_layer) if not arch.is_moe_layer(i)}
    if arch.moe is not None:
        widths.add(arch.moe.expert_ff)
        if arch.moe.shared_ff:
            widths.add(arch.moe.shared_ff)
    for w in sorted(widths - {0}):
        if w % tp:
            raise EstimateError(f"The MLP width {w} of {arch.name} is not divisible by tensor parallel size {tp}.")


def _shard_share(arch: Architecture, name: str, tp: int) -> float:
    """Share of one weight matrix held by each of ``tp`` GPUs, as vLLM's parallel layers cut it."""
    if name.endswith(("attn_q_a.weight", "attn_kv_a_mqa.weight")):
        return 1.0  # MLA's low-rank down-projections are ReplicatedLinear
    layer = int(name.split(".")[1]) if name.startswith("blk.") else 0
    kv = arch.kv_heads(layer)
    kv_share = max(kv // tp, 1) / kv if kv else 1.0
    if name.endswith(("attn_k.weight", "attn_v.weight")):
        return kv_share
    if name.endswith("attn_qkv.weight"):
        n_q = arch.heads(layer) * arch.head_dim_k_eff
        n_kv = kv * (arch.head_dim_k_eff + arch.head_dim_v_eff)
        return (n_q / tp + n_kv * kv_share) / (n_q + n_kv)
    return 1.0 / tp


def vllm_weights_per_gpu(arch: Architecture, fmt: ServingFormat | str, tp: int) -> int:
    """Weight bytes on each GPU at tensor-parallel size ``tp``.

    Linear layers (attention, MLP, experts) are cut in ``tp`` (KV projections are replicated when
    there are fewer KV heads than GPUs) and stored at ``fmt``'s bits per weight; the token
    embedding and the LM head are cut by vocabulary rows (vocabulary padded to 64) and stay 16-bit;
    norms, biases and MoE routers are replicated at 16 bits. A tied LM head shares the embedding.
    """
    f = find_serving_format(fmt) if isinstance(fmt, str) else fmt
    vocab_rows = _cdiv(_cdiv(arch.n_vocab, VLLM_VOCAB_PADDING) * VLLM_VOCAB_PADDING, tp)
    total = 0.0
    for t in tensor_layout(arch):
        if t.name in ("token_embd.weight", "output.weight"):
            total += vocab_rows * arch.n_embd * 2
        elif len(t.shape) < 2 or t.keep_f32:
            total += prod(t.shape) * 2
        else:
            total += prod(t.shape) * _shard_share(arch, t.name, tp) * f.bits_per_weight / 8
    return int(total)


def kv_dtype_bytes(kv_cache_dtype: str) -> int:
    """Bytes per KV element for vLLM's --kv-cache-dtype ("auto" is the 16-bit model dtype)."""
    try:
        return _KV_DTYPE_BYTES[kv_cache_dtype.strip().lower()]
    except KeyError:
        raise EstimateError(
            f"Unknown KV cache dtype '{kv_cache_dtype}' (choose {', '.join(_KV_DTYPE_BYTES)})."
        ) from None


def vllm_kv_bytes_per_token(arch: Architecture, tp: int, dtype_bytes: int) -> int:
    """KV-cache bytes one token takes on each GPU: 2 (K and V) x layers x max(1, n_head_kv / TP)
    x head_dim x dtype bytes. MLA keeps one latent row (kv_lora_rank + rope dims) per layer, the
    same on every GPU (vLLM does not shard it). Sliding-window layers count at full length."""
    if arch.mla is not None:
        width = arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim
        return sum(width for i in range(arch.n_layer) if arch.is_attention_layer(i)) * dtype_bytes
    total = 0
    for i in range(arch.n_layer):
        kv = arch.kv_heads(i)
        if kv:
            total += max(kv // tp, 1) * (arch.head_dim_k_eff + arch.head_dim_v_eff)
    return total * dtype_bytes


def _widest_ffn_per_gpu(arch: Architecture, tp: int) -> int:
    dense = max((arch.ff(i) for i in range(arch.n_layer) if not arch.is_moe_layer(i)), default=0)
    routed = 0
    if arch.moe is not None:
        routed = arch.moe.n_expert_used * arch.moe.expert_ff + arch.moe.shared_ff
    return _cdiv(max(dense, routed), tp)


def vllm_activation_bytes(arch: Architecture, tp: int, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    """Peak of vLLM's profiling run on each GPU: the larger of the forward pass over
    ``max_num_batched_tokens`` tokens and the sampler over min(max_num_seqs, tokens) sequences.

    forward = tokens x 2 bytes x (VLLM_FORWARD_HIDDEN_COPIES x n_embd + 3 x MLP width / TP)
    (gate+up output and the activated half); sampler = sequences x n_vocab x
    VLLM_SAMPLER_BYTES_PER_LOGIT + the tokens' hidden states. Every GPU samples the full
    vocabulary (logits are gathered), so the sampler term does not shrink with TP.
    """
    t = max_num_batched_tokens
    seqs = min(max_num_seqs, t)
    hidden = t * arch.n_embd * VLLM_ACTIVATION_DTYPE_BYTES
    sampler = int(seqs * arch.n_vocab * VLLM_SAMPLER_BYTES_PER_LOGIT) + hidden
    forward = (
        t * VLLM_ACTIVATION_DTYPE_BYTES * (VLLM_FORWARD_HIDDEN_COPIES * arch.n_embd + 3 * _widest_ffn_per_gpu(arch, tp))
    )
    return max(forward, sampler)


@dataclass(frozen=True)
class VllmGpu:
    """One GPU under vLLM. ``budget_bytes`` = gpu_memory_utilization x ``visible_bytes`` holds the
    weights, the activation peak, non-torch memory and the KV cache; the CUDA context and CUDA
    graphs live in what the budget leaves. ``kv_cache_bytes`` is what the whole blocks take
    (at most ``kv_budget_bytes``, 0 when that is negative)."""

    name: str
    capacity_bytes: int
    visible_bytes: int
    budget_bytes: int
    weights_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    kv_budget_bytes: int
    kv_cache_bytes: int
    cuda_graph_bytes: int
    cuda_context_bytes: int

    @property
    def total_bytes(self) -> int:
        return (
            self.weights_bytes
            + self.activation_bytes
            + self.non_torch_bytes
            + self.kv_cache_bytes
            + self.cuda_graph_bytes
            + self.cuda_context_bytes
        )

    @property
    def fits(self) -> bool:
        return self.kv_budget_bytes > 0 and self.total_bytes <= self.visible_bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "capacity_bytes": self.capacity_bytes,
            "visible_bytes": self.visible_bytes,
            "budget_bytes": self.budget_bytes,
            "weights_bytes": self.weights_bytes,
            "activation_bytes": self.activation_bytes,
            "non_torch_bytes": self.non_torch_bytes,
            "kv_budget_bytes": self.kv_budget_bytes,
            "kv_cache_bytes": self.kv_cache_bytes,
            "cuda_graph_bytes": self.cuda_graph_bytes,
            "cuda_context_bytes": self.cuda_context_bytes,
            "total_bytes": self.total_bytes,
            "fits": self.fits,
        }


@dataclass(frozen=True)
class VllmPlan:
    """vLLM serving ``model_id`` with tensor parallelism over ``tensor_parallel_size`` identical GPUs."""

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
    kv_bytes_per_token: int
    """On each GPU."""
    block_bytes: int
    """One block of ``block_size`` tokens over every layer, on each GPU."""
    num_gpu_blocks: int
    gpus: tuple[VllmGpu, ...]
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
        return _cdiv(self.max_model_len, self.block_size)

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

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": "vllm",
            "model": self.model_id,
            "model_name": self.model_name,
            "gpu": self.gpu_name,
            "tensor_parallel_size": self.tensor_parallel_size,
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
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "block_bytes": self.block_bytes,
            "num_gpu_blocks": self.num_gpu_blocks,
            "kv_cache_tokens": self.kv_cache_tokens,
            "max_concurrency": self.max_concurrency,
            "max_concurrent_sequences": self.max_concurrent_sequences,
            "estimated_max_model_len": self.estimated_max_model_len,
            "starts": self.starts,
            "problems": list(self.problems),
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
            f"Each GPU: budget {_gib(g.budget_bytes)} GiB ({self.gpu_memory_utilization:g} of "
            f"{_gib(g.visible_bytes)} GiB) = weights {_gib(g.weights_bytes)} + activation peak "
            f"{_gib(g.activation_bytes)} + non-torch {_gib(g.non_torch_bytes)} + KV cache "
            f"{_gib(max(g.kv_budget_bytes, 0))} GiB; CUDA graphs and context "
            f"{_gib(g.cuda_graph_bytes + g.cuda_context_bytes)} GiB outside it.",
        ]
        if self.num_gpu_blocks > 0:
            lines.append(
                f"KV cache: {self.num_gpu_blocks:,} blocks of {self.block_size} tokens = "
                f"{self.kv_cache_tokens:,} tokens ({self.kv_bytes_per_token:,} bytes per token per GPU); "
                f"{self.max_concurrency:.2f}x concurrency at {self.max_model_len:,} tokens per request."
            )
        if self.problems:
            lines.append(f"vLLM would not start: {self.problems[0]}")
        else:
            running = min(self.max_num_seqs, self.max_concurrent_sequences)
            lines.append(
                f"{self.max_concurrent_sequences} sequences of the full {self.max_model_len:,} tokens fit at once; "
                f"with --max-num-seqs {self.max_num_seqs}, up to {running} run together at that length "
                "(more when they are shorter)."
            )
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


def _check_quantized_shapes(arch: Architecture, fmt: ServingFormat, tp: int) -> None:
    if fmt.name not in ("AWQ-4bit", "GPTQ-4bit"):
        return
    rows = {arch.heads(0) * arch.head_dim_v_eff // tp, _widest_ffn_per_gpu(arch, tp)}
    if arch.moe is not None:
        rows.add(_cdiv(arch.moe.expert_ff, tp))
    for r in sorted(rows):
        if r % VLLM_AWQ_GROUP:
            raise EstimateError(
                "The input size is not aligned with the quantized weight shape. This can be caused by too large "
                f"tensor parallel size ({tp}): {r} input rows per GPU are not a multiple of the "
                f"{VLLM_AWQ_GROUP}-weight {fmt.name} groups."
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
    if count < 1:
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
    tp = count
    check_tensor_parallel(arch, tp)
    _check_quantized_shapes(arch, fmt, tp)
    batched = max_num_batched_tokens if max_num_batched_tokens is not None else default_max_num_batched_tokens(gpu)
    if batched < max_num_seqs:
        raise EstimateError(
            f"max_num_batched_tokens ({batched}) must be greater than or equal to max_num_seqs ({max_num_seqs})."
        )
    sm = _sm(gpu)
    notes: list[str] = []
    if fmt.name == "FP8" and sm is not None and sm < (8, 0):
        raise EstimateError(f"vLLM's FP8 weights need compute capability 8.0 or newer; {gpu.name} has {sm[0]}.{sm[1]}.")

    weights = vllm_weights_per_gpu(arch, fmt, tp)
    activation = vllm_activation_bytes(arch, tp, batched, max_num_seqs)
    non_torch = VLLM_NON_TORCH_BYTES if tp == 1 else VLLM_NON_TORCH_BYTES_TP
    visible = int(gpu.capacity_bytes * VLLM_CUDA_VISIBLE_FRACTION)
    budget = int(visible * gpu_memory_utilization)
    kv_budget = budget - weights - activation - non_torch
    per_token = vllm_kv_bytes_per_token(arch, tp, kv_bytes)
    block_bytes = per_token * block_size
    blocks = max(kv_budget, 0) // block_bytes if block_bytes else 0
    line = VllmGpu(
        name="",
        capacity_bytes=gpu.capacity_bytes,
        visible_bytes=visible,
        budget_bytes=budget,
        weights_bytes=weights,
        activation_bytes=activation,
        non_torch_bytes=non_torch,
        kv_budget_bytes=kv_budget,
        kv_cache_bytes=blocks * block_bytes,
        cuda_graph_bytes=VLLM_CUDA_GRAPH_BYTES,
        cuda_context_bytes=VLLM_CUDA_CONTEXT_BYTES,
    )
    gpus = tuple(replace(line, name=f"GPU {i}") for i in range(count))

    problems = _start_problems(arch, line, max_model_len, block_size, block_bytes, blocks, gpu_memory_utilization)
    hf = model or hf_model_id(arch)
    if fmt.name in ("AWQ-4bit", "GPTQ-4bit", "INT8"):
        # A 16-bit checkpoint cannot be served as AWQ/GPTQ/INT8: vLLM needs a checkpoint quantized so.
        model_id = f"<a {fmt.name} checkpoint of {hf or arch.name}>" if model is None else model
    else:
        model_id = hf or f"<Hugging Face id of {arch.name}>"
    quant = _quantization_flag(fmt, gpu)
    dtype_flag = "half" if (sm is not None and sm < (8, 0)) or fmt.name in ("AWQ-4bit", "GPTQ-4bit") else "auto"
    notes += _vllm_notes(arch, tp, fmt, quant, dtype_flag, batched, max_num_batched_tokens is None)
    args = [
        "vllm",
        "serve",
        shlex.quote(model_id),
        "--tensor-parallel-size",
        str(tp),
        "--max-model-len",
        str(max_model_len),
        "--max-num-seqs",
        str(max_num_seqs),
        "--max-num-batched-tokens",
        str(batched),
        "--gpu-memory-utilization",
        f"{gpu_memory_utilization:g}",
        "--dtype",
        dtype_flag,
    ]
    if block_size != 16:
        args += ["--block-size", str(block_size)]
    if kv_bytes == 1:
        args += ["--kv-cache-dtype", kv_cache_dtype.strip().lower()]
    if quant:
        args += ["--quantization", quant]
    return VllmPlan(
        model_id=model_id,
        model_name=arch.name,
        gpu_name=gpu.name,
        tensor_parallel_size=tp,
        serving_format=fmt.name,
        quantization=quant,
        dtype_flag=dtype_flag,
        kv_cache_dtype=kv_cache_dtype.strip().lower(),
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=batched,
        gpu_memory_utilization=gpu_memory_utilization,
        block_size=block_size,
        total_weights_bytes=weights * tp,
        kv_bytes_per_token=per_token,
        block_bytes=block_bytes,
        num_gpu_blocks=blocks,
        gpus=gpus,
        problems=tuple(problems),
        notes=tuple(notes),
        command=" ".join(args),
    )


def _start_problems(
    arch: Architecture,
    g: VllmGpu,
    max_model_len: int,
    block_size: int,
    block_bytes: int,
    blocks: int,
    utilization: float,
) -> list[str]:
    """vLLM's start-up failures, in the order it meets them, in its own words."""
    out: list[str] = []
    if max_model_len > arch.n_ctx_train:
        out.append(
            f"User-specified max_model_len ({max_model_len}) is greater than the derived max_model_len "
            f"(max_position_embeddings={arch.n_ctx_train} in model's config.json). To allow overriding this "
            "maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (outputs may be wrong)."
        )
    free_at_start = g.visible_bytes - g.cuda_context_bytes
    if free_at_start < g.budget_bytes:
        out.append(
            f"Free memory on device ({_gib(free_at_start)}/{_gib(g.visible_bytes)} GiB) on startup is less than "
            f"desired GPU memory utilization ({utilization:g}, {_gib(g.budget_bytes)} GiB). Decrease GPU memory "
            "utilization or reduce GPU memory used by other processes."
        )
        return out
    if g.weights_bytes > free_at_start:
        out.append(
            f"CUDA out of memory while loading the weights: {_gib(g.weights_bytes)} GiB per GPU, "
            f"{_gib(free_at_start)} GiB free. Use more GPUs (a larger --tensor-parallel-size) or a smaller format."
        )
        return out
    if g.kv_budget_bytes <= 0:
        out.append(
            "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
            f"initializing the engine (weights {_gib(g.weights_bytes)} GiB + activations "
            f"{_gib(g.activation_bytes)} GiB + non-torch {_gib(g.non_torch_bytes)} GiB exceed the "
            f"{_gib(g.budget_bytes)} GiB budget)."
        )
        return out
    needed = _cdiv(max_model_len, block_size) * block_bytes
    if needed > g.kv_budget_bytes:
        estimated = min(blocks * block_size, max_model_len)
        hint = (
            f"Based on the available memory, the estimated maximum model length is {estimated}. " if estimated else ""
        )
        out.append(
            f"To serve at least one request with the model's max seq len ({max_model_len}), "
            f"({_gib(needed)} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({_gib(g.kv_budget_bytes)} GiB). {hint}Try increasing `gpu_memory_utilization` or decreasing "
            "`max_model_len` when initializing the engine."
        )
        return out
    if g.total_bytes > g.visible_bytes:
        out.append(
            f"CUDA out of memory during CUDA graph capture: the budget leaves {_gib(g.visible_bytes - g.budget_bytes)} "
            f"GiB for about {_gib(g.cuda_graph_bytes + g.cuda_context_bytes)} GiB of CUDA context and graphs. "
            "Decrease `gpu_memory_utilization` or add --enforce-eager."
        )
    return out


def _vllm_notes(
    arch: Architecture,
    tp: int,
    fmt: ServingFormat,
    quant: str | None,
    dtype_flag: str,
    batched: int,
    batched_default: bool,
) -> list[str]:
    out = [
        f"Budget = gpu_memory_utilization x the memory CUDA reports ({VLLM_CUDA_VISIBLE_FRACTION:g} of the sold "
        "memory); the weights, the profiled activation peak and non-torch memory come out of it, the rest is "
        "KV cache.",
        f"Activation peak: the larger of a {batched:,}-token forward pass and the sampler over "
        f"min(max_num_seqs, {batched:,}) sequences at {VLLM_SAMPLER_BYTES_PER_LOGIT:g} bytes per vocabulary entry "
        "(fitted to published vLLM V1 profiles on H100s).",
        f"Non-torch memory {_gib(VLLM_NON_TORCH_BYTES if tp == 1 else VLLM_NON_TORCH_BYTES_TP)} GiB per GPU; "
        f"CUDA context {_gib(VLLM_CUDA_CONTEXT_BYTES)} GiB and CUDA graphs {_gib(VLLM_CUDA_GRAPH_BYTES)} GiB "
        "outside the budget (published logs; vary by vLLM version).",
        "Embedding and LM head are split by vocabulary rows across the GPUs; norms are replicated on each.",
    ]
    if batched_default:
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
