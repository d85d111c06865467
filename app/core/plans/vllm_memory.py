"""vLLM's memory accounting per GPU under tensor parallelism, and the shapes vLLM refuses to shard.

Every GPU holds 1/TP of each weight matrix (:func:`vllm_weights_per_gpu`); a budget of
``gpu_memory_utilization`` x the memory CUDA reports is shared by the weights, the activation peak
of a profiling forward pass (:func:`vllm_activation_bytes`) and non-torch allocations; what is left
becomes KV-cache blocks (:func:`vllm_kv_bytes_per_token` per token). :func:`vllm_gpu` adds one GPU up
into a :class:`VllmGpu`. :func:`check_tensor_parallel` and :func:`check_quantized_shapes` raise, in
vLLM's words, for a model it cannot split over TP GPUs. See docs/vllm-memory.md for the sources of
the constants below and for what is approximated; the plan and its command are in
:mod:`app.core.plans.vllm`.

Under pipeline parallelism a GPU holds only its stage's layers: the weight, KV-cache and activation
functions take the stage (``layers``, ``first_stage``, ``last_stage``) and count only what vLLM
builds there (:mod:`app.core.plans.vllm_pipeline`). Their defaults are one stage holding everything.

All byte figures are integers (bytes); nothing here imports Qt.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

from app.core.common.errors import EstimateError
from app.core.common.units import GIB, MIB
from app.core.model.architecture import Architecture
from app.core.model.layout import tensor_layout
from app.core.model.quant import ServingFormat, find_serving_format

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


def cdiv(a: int, b: int) -> int:
    """``a / b`` rounded up (integers)."""
    return -(-a // b)


def gib_figure(n: float) -> str:
    """Bytes as GiB with two decimals, as vLLM's logs print them."""
    return f"{n / GIB:.2f}"


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


def vllm_non_torch_bytes(world_size: int) -> int:
    """Non-torch memory per GPU: VLLM_NON_TORCH_BYTES alone, VLLM_NON_TORCH_BYTES_TP when the GPUs
    talk to each other (``world_size`` = tensor x pipeline parallel size above 1: NCCL's buffers)."""
    return VLLM_NON_TORCH_BYTES if world_size == 1 else VLLM_NON_TORCH_BYTES_TP


def _holds(arch: Architecture, name: str, layers: range | None, first_stage: bool, last_stage: bool) -> bool:
    """Whether a stage builds tensor ``name`` (vLLM's models put a PPMissingLayer in place of the rest):
    its own decoder layers; the token embedding on the first stage, and on the last when the LM head
    is tied to it (the last stage keeps its own copy); the final norm and the LM head on the last."""
    if name.startswith("blk."):
        return layers is None or int(name.split(".")[1]) in layers
    if name == "token_embd.weight":
        return first_stage or (last_stage and arch.tied_embeddings)
    return last_stage


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


def vllm_weights_per_gpu(
    arch: Architecture,
    fmt: ServingFormat | str,
    tp: int,
    *,
    layers: range | None = None,
    first_stage: bool = True,
    last_stage: bool = True,
) -> int:
    """Weight bytes on each GPU at tensor-parallel size ``tp``.

    Linear layers (attention, MLP, experts) are cut in ``tp`` (KV projections are replicated when
    there are fewer KV heads than GPUs) and stored at ``fmt``'s bits per weight; the token
    embedding and the LM head are cut by vocabulary rows (vocabulary padded to 64) and stay 16-bit;
    norms, biases and MoE routers are replicated at 16 bits. A tied LM head shares the embedding.

    A pipeline stage passes its decoder ``layers`` and whether it is the first and the last stage:
    the first holds the token embedding, the last the final norm and the LM head (with a tied head,
    its own copy of the embedding). The defaults (every layer, first and last) are the whole model.
    """
    f = find_serving_format(fmt) if isinstance(fmt, str) else fmt
    vocab_rows = cdiv(cdiv(arch.n_vocab, VLLM_VOCAB_PADDING) * VLLM_VOCAB_PADDING, tp)
    total = 0.0
    for t in tensor_layout(arch):
        if not _holds(arch, t.name, layers, first_stage, last_stage):
            continue
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


def vllm_kv_bytes_per_token(arch: Architecture, tp: int, dtype_bytes: int, *, layers: range | None = None) -> int:
    """KV-cache bytes one token takes on each GPU: 2 (K and V) x layers x max(1, n_head_kv / TP)
    x head_dim x dtype bytes. MLA keeps one latent row (kv_lora_rank + rope dims) per layer, the
    same on every GPU (vLLM does not shard it). Sliding-window layers count at full length.
    ``layers``: a pipeline stage's decoder layers (default: all of them)."""
    held = range(arch.n_layer) if layers is None else layers
    if arch.mla is not None:
        width = arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim
        return sum(width for i in held if arch.is_attention_layer(i)) * dtype_bytes
    total = 0
    for i in held:
        kv = arch.kv_heads(i)
        if kv:
            total += max(kv // tp, 1) * (arch.head_dim_k_eff + arch.head_dim_v_eff)
    return total * dtype_bytes


def _widest_ffn_per_gpu(arch: Architecture, tp: int) -> int:
    dense = max((arch.ff(i) for i in range(arch.n_layer) if not arch.is_moe_layer(i)), default=0)
    routed = 0
    if arch.moe is not None:
        routed = arch.moe.n_expert_used * arch.moe.expert_ff + arch.moe.shared_ff
    return cdiv(max(dense, routed), tp)


def vllm_pipeline_state_bytes(arch: Architecture, tokens: int) -> int:
    """Bytes one pipeline stage hands the next for ``tokens`` tokens: vLLM's decoder models pass
    ``IntermediateTensors`` of two hidden-state-wide tensors, ``hidden_states`` and ``residual``
    (``LlamaModel.forward`` and its kin), in the 16-bit model dtype."""
    return 2 * tokens * arch.n_embd * VLLM_ACTIVATION_DTYPE_BYTES


def vllm_activation_bytes(
    arch: Architecture,
    tp: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    *,
    first_stage: bool = True,
    last_stage: bool = True,
) -> int:
    """Peak of vLLM's profiling run on each GPU: the larger of the forward pass over
    ``max_num_batched_tokens`` tokens and the sampler over min(max_num_seqs, tokens) sequences.

    forward = tokens x 2 bytes x (VLLM_FORWARD_HIDDEN_COPIES x n_embd + 3 x MLP width / TP)
    (gate+up output and the activated half); sampler = sequences x n_vocab x
    VLLM_SAMPLER_BYTES_PER_LOGIT + the tokens' hidden states. Every GPU samples the full
    vocabulary (logits are gathered), so the sampler term does not shrink with TP.

    Under pipeline parallelism only the last stage samples (``GPUModelRunner.profile_run`` runs the
    dummy sampler when ``get_pp_group().is_last_rank``), and every stage but the first keeps a
    buffer for the hidden state it receives, sized for ``max_num_batched_tokens``
    (``GPUModelRunner._dummy_run``: ``make_empty_intermediate_tensors``), on top of its peak.
    """
    t = max_num_batched_tokens
    seqs = min(max_num_seqs, t)
    hidden = t * arch.n_embd * VLLM_ACTIVATION_DTYPE_BYTES
    sampler = int(seqs * arch.n_vocab * VLLM_SAMPLER_BYTES_PER_LOGIT) + hidden if last_stage else 0
    forward = (
        t * VLLM_ACTIVATION_DTYPE_BYTES * (VLLM_FORWARD_HIDDEN_COPIES * arch.n_embd + 3 * _widest_ffn_per_gpu(arch, tp))
    )
    received = 0 if first_stage else vllm_pipeline_state_bytes(arch, t)
    return max(forward, sampler) + received


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


def kv_blocks(kv_budget_bytes: int, block_bytes: int) -> int:
    """Whole KV-cache blocks of ``block_bytes`` in a KV budget (0 when the budget is negative)."""
    return max(kv_budget_bytes, 0) // block_bytes if block_bytes else 0


def vllm_gpu(
    capacity_bytes: int,
    gpu_memory_utilization: float,
    *,
    weights_bytes: int,
    activation_bytes: int,
    non_torch_bytes: int,
    block_bytes: int,
    name: str = "",
) -> VllmGpu:
    """One GPU of ``capacity_bytes`` (the memory sold) under vLLM: CUDA reports
    VLLM_CUDA_VISIBLE_FRACTION of it, the budget is ``gpu_memory_utilization`` of that, and what the
    weights, the activation peak and non-torch memory leave of the budget becomes whole KV blocks
    of ``block_bytes``; the CUDA context and graphs come on top."""
    visible = int(capacity_bytes * VLLM_CUDA_VISIBLE_FRACTION)
    budget = int(visible * gpu_memory_utilization)
    kv_budget = budget - weights_bytes - activation_bytes - non_torch_bytes
    return VllmGpu(
        name=name,
        capacity_bytes=capacity_bytes,
        visible_bytes=visible,
        budget_bytes=budget,
        weights_bytes=weights_bytes,
        activation_bytes=activation_bytes,
        non_torch_bytes=non_torch_bytes,
        kv_budget_bytes=kv_budget,
        kv_cache_bytes=kv_blocks(kv_budget, block_bytes) * block_bytes,
        cuda_graph_bytes=VLLM_CUDA_GRAPH_BYTES,
        cuda_context_bytes=VLLM_CUDA_CONTEXT_BYTES,
    )


def check_quantized_shapes(arch: Architecture, fmt: ServingFormat, tp: int) -> None:
    """Raise EstimateError, in vLLM's words, when an AWQ/GPTQ format's weight groups do not divide
    the input rows each of ``tp`` GPUs gets."""
    if fmt.name not in ("AWQ-4bit", "GPTQ-4bit"):
        return
    rows = {arch.heads(0) * arch.head_dim_v_eff // tp, _widest_ffn_per_gpu(arch, tp)}
    if arch.moe is not None:
        rows.add(cdiv(arch.moe.expert_ff, tp))
    for r in sorted(rows):
        if r % VLLM_AWQ_GROUP:
            raise EstimateError(
                "The input size is not aligned with the quantized weight shape. This can be caused by too large "
                f"tensor parallel size ({tp}): {r} input rows per GPU are not a multiple of the "
                f"{VLLM_AWQ_GROUP}-weight {fmt.name} groups."
            )


def start_problems(
    arch: Architecture,
    g: VllmGpu,
    max_model_len: int,
    block_size: int,
    block_bytes: int,
    blocks: int,
    utilization: float,
) -> list[str]:
    """Why vLLM would not start with one GPU like ``g`` (every GPU of the plan, or of a pipeline
    stage, holds the same; ``block_bytes`` and ``blocks`` are that GPU's), in the order it meets the
    failures and in its own words; empty when it starts."""
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
            f"Free memory on device ({gib_figure(free_at_start)}/{gib_figure(g.visible_bytes)} GiB) on startup is "
            f"less than desired GPU memory utilization ({utilization:g}, {gib_figure(g.budget_bytes)} GiB). "
            "Decrease GPU memory utilization or reduce GPU memory used by other processes."
        )
        return out
    if g.weights_bytes > free_at_start:
        out.append(
            f"CUDA out of memory while loading the weights: {gib_figure(g.weights_bytes)} GiB per GPU, "
            f"{gib_figure(free_at_start)} GiB free. Use more GPUs (a larger --tensor-parallel-size) or a smaller "
            "format."
        )
        return out
    if g.kv_budget_bytes <= 0:
        out.append(
            "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
            f"initializing the engine (weights {gib_figure(g.weights_bytes)} GiB + activations "
            f"{gib_figure(g.activation_bytes)} GiB + non-torch {gib_figure(g.non_torch_bytes)} GiB exceed the "
            f"{gib_figure(g.budget_bytes)} GiB budget)."
        )
        return out
    needed = cdiv(max_model_len, block_size) * block_bytes
    if needed > g.kv_budget_bytes:
        estimated = min(blocks * block_size, max_model_len)
        hint = (
            f"Based on the available memory, the estimated maximum model length is {estimated}. " if estimated else ""
        )
        out.append(
            f"To serve at least one request with the model's max seq len ({max_model_len}), "
            f"({gib_figure(needed)} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({gib_figure(g.kv_budget_bytes)} GiB). {hint}Try increasing `gpu_memory_utilization` or decreasing "
            "`max_model_len` when initializing the engine."
        )
        return out
    if g.total_bytes > g.visible_bytes:
        out.append(
            "CUDA out of memory during CUDA graph capture: the budget leaves "
            f"{gib_figure(g.visible_bytes - g.budget_bytes)} GiB for about "
            f"{gib_figure(g.cuda_graph_bytes + g.cuda_context_bytes)} GiB of CUDA context and graphs. "
            "Decrease `gpu_memory_utilization` or add --enforce-eager."
        )
    return out
