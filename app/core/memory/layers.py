"""Where a model's weights are: tensors summed per layer (and per kind: experts, repackable types),
and the layers llama.cpp's layer split gives each GPU."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from pydantic import Field

from app.core.common.units import Frozen
from app.core.memory.records import REPACK_TYPES, TOTALS_CACHE_SIZE
from app.core.model.architecture import Architecture
from app.core.model.tensors import TensorInfo

_EXPERT_TENSOR = re.compile(r"\.ffn_(up|down|gate_up|gate)_(ch|)exps\.")


# Tensors of a NextN/MTP layer that llama.cpp loads even while load_mtp is off, because their
# create_tensor call does not pass the layer's skip flag (the expert selection bias in
# llama_model_deepseek32 / llama_model_glm_dsa::load_arch_tensors; HY V3's and Step 3.5's whole
# feed-forward block and shared head, created TENSOR_NOT_REQUIRED only, with Step 3.5's q/k norms and
# output gate: llama_model_hy_v3 / llama_model_step35::load_arch_tensors).
_FFN_AND_HEAD = (
    ".ffn_gate.weight",
    ".ffn_down.weight",
    ".ffn_up.weight",
    ".ffn_gate_inp.weight",
    ".ffn_gate_exps.weight",
    ".ffn_down_exps.weight",
    ".ffn_up_exps.weight",
    ".ffn_gate_up_exps.weight",
    ".ffn_gate_shexp.weight",
    ".ffn_down_shexp.weight",
    ".ffn_up_shexp.weight",
    ".nextn.embed_tokens.weight",
    ".nextn.shared_head_head.weight",
    ".nextn.shared_head_norm.weight",
)
_LOADED_IN_NEXTN = {
    "deepseek32": (".exp_probs_b.bias",),
    "glm-dsa": (".exp_probs_b.bias",),
    "hy_v3": (*_FFN_AND_HEAD, ".exp_probs_b"),
    "step35": (
        *_FFN_AND_HEAD,
        ".exp_probs_b.bias",
        ".attn_q_norm.weight",
        ".attn_k_norm.weight",
        ".attn_gate.weight",
        "rope_freqs.weight",
    ),
}


def is_expert_tensor(name: str) -> bool:
    """Routed-expert weights, as llama.cpp's --cpu-moe / --n-cpu-moe patterns match them
    (``blk.N.ffn_(up|down|gate_up|gate)_(ch|)exps``, common/arg.cpp and common/fit.cpp)."""
    return _EXPERT_TENSOR.search(name) is not None


# Tables that only have a token's row looked up (llama-arch.cpp: LLM_TENSOR_LAYER_INPUT, GGML_OP_GET_ROWS),
# besides the token embedding: Gemma 3n's and 4's per-layer embeddings, 2.3 B parameters of Gemma 4 E2B's 4.6 B.
_LOOKUP_ONLY = ("per_layer_token_embd",)
# Input-layer tensors (llama-arch.cpp's LLM_TENSOR_LAYER_INPUT: token, position and token-type embeddings,
# Gemma 4 assistant's masked-embedding centroids and ordering, the per-layer embeddings): llama.cpp gives
# them the CPU's buffer types whatever -ngl says (``pimpl->dev_input = { cpu_dev, ... }``, create_tensor's
# LLM_TENSOR_LAYER_INPUT case), and none is repacked (the repack buffers take matrix products only).
_INPUT = ("token_embd", "token_types", "position", "masked_embd", *_LOOKUP_ONLY)


def _repackable_shape(t: TensorInfo, expert: bool) -> bool:
    """Whether the CPU's repack buffer can take ``t`` by its shape: a matrix (GGML_OP_MUL_MAT, 2-D) or a
    routed-expert stack (GGML_OP_MUL_MAT_ID, 3-D); the repack buffer type's supports_op refuses other 3-D
    weights (Gemma 3n's ``altup_proj``)."""
    dims = len(t.shape)
    while dims > 2 and t.shape[dims - 1] == 1:
        dims -= 1
    return dims == 2 or (dims == 3 and expert)


def _layer_of(t: TensorInfo, n_layer: int) -> int:
    """Placement layer: -1 for the input layer (token and per-layer embeddings), n_layer for the output
    layer."""
    idx = t.layer
    if idx is not None:
        return idx
    if t.name.startswith(_INPUT):
        return -1
    return n_layer


@lru_cache(maxsize=4096)
@lru_cache(maxsize=4096)
def layer_devices(n_layer: int, gpu_layers: int, capacities: tuple[int, ...]) -> tuple[int, ...]:
    """For layers 0..n_layer (n_layer = the output layer): -1 for the CPU, else the GPU index."""
    placement = _split_layers(n_layer, gpu_layers, capacities)
    return tuple(placement.get(i, -1) for i in range(n_layer + 1))


@lru_cache(maxsize=4096)
def device_runs(layer_dev: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
    """``layer_dev`` as runs of one device: (device, first layer, end layer), in layer order."""
    runs: list[tuple[int, int, int]] = []
    first = 0
    for i in range(1, len(layer_dev) + 1):
        if i == len(layer_dev) or layer_dev[i] != layer_dev[first]:
            runs.append((layer_dev[first], first, i))
            first = i
    return tuple(runs)


@lru_cache(maxsize=4096)
def breakdown_indices(layer_dev: tuple[int, ...], n_devices: int) -> tuple[int, ...]:
    """``layer_dev`` with the CPU (-1) as the last index of the breakdown."""
    return tuple(d % n_devices for d in layer_dev)


def _split_layers(n_layer: int, gpu_layers: int, capacities: tuple[int, ...]) -> dict[int, int]:
    """layer index (0..n_layer, n_layer = output) → GPU index, as llama.cpp's layer split does,
    proportional to each GPU's capacity."""
    start = max(n_layer + 1 - gpu_layers, 0)
    placed = list(range(start, n_layer + 1))
    if not capacities or not placed:
        return {}
    weights = [max(c, 1) for c in capacities]
    total = sum(weights)
    bounds, acc = [], 0
    for w in weights:
        acc += w
        bounds.append(acc / total)
    out = {}
    for k, layer in enumerate(placed):
        frac = k / len(placed)
        out[layer] = next(i for i, b in enumerate(bounds) if frac < b)
    return out


class TensorTotals(Frozen):
    """A model's tensors summed per placement layer (0..n_layer, n_layer = the output layer).

    ``input_bytes`` is what always stays in host memory (token embedding and the like);
    ``repack_bytes[profile][layer]`` is what the CPU backend would repack if that layer ran on the
    CPU; ``active_layer_bytes`` and ``active_params`` are what one decoded token reads (routed
    share of MoE experts; a tied embedding is read whole by the output head).
    """

    model_bytes: int
    unloaded_bytes: int = 0  # NextN layers: counted by llama_model_size, never allocated
    input_bytes: int
    layer_bytes: tuple[int, ...]
    repack_bytes: dict[str, tuple[int, ...]]
    token_embd_bytes: int
    has_output: bool
    active_layer_bytes: tuple[float, ...]
    active_params: float
    expert_bytes: tuple[int, ...] = ()
    active_expert_bytes: tuple[float, ...] = ()
    active_layer_params: tuple[float, ...] = Field(
        default=(), description="per layer: parameters one decoded token touches (routed share of experts)"
    )
    active_expert_params: tuple[float, ...] = ()
    largest_matmul: tuple[tuple[int, int, int], ...] = Field(
        default=(), description="per layer: (bytes, ne0, ne1) of its largest non-expert 2-D weight"
    )
    largest_expert: tuple[tuple[int, int, int], ...] = ()
    output_head: tuple[int, int, int] = (0, 0, 0)


_TOTALS_CACHE: dict[int, tuple[Sequence[TensorInfo], int, TensorTotals]] = {}


def tensor_totals(arch: Architecture, tensors: Sequence[TensorInfo]) -> TensorTotals:
    """Per-layer sums of ``tensors``. A tuple's sums are remembered (it cannot change), so that
    the many estimates behind one chart walk each tensor list once."""
    key = id(tensors)
    hit = _TOTALS_CACHE.get(key)
    if hit is not None and hit[0] is tensors and hit[1] == arch.n_layer:
        return hit[2]
    totals = _sum_tensors(arch, tensors)
    if isinstance(tensors, tuple):
        if len(_TOTALS_CACHE) >= TOTALS_CACHE_SIZE:
            _TOTALS_CACHE.pop(next(iter(_TOTALS_CACHE)))
        _TOTALS_CACHE[key] = (tensors, arch.n_layer, totals)
    return totals


def _sum_tensors(arch: Architecture, tensors: Sequence[TensorInfo]) -> TensorTotals:
    n_layer = arch.n_layer
    share = arch.moe.n_expert_used / arch.moe.n_expert if arch.moe else 1.0
    layer_bytes = [0] * (n_layer + 1)
    repack = {name: [0] * (n_layer + 1) for name in REPACK_TYPES}
    active = [0.0] * (n_layer + 1)
    experts = [0] * (n_layer + 1)
    active_experts = [0.0] * (n_layer + 1)
    layer_params = [0.0] * (n_layer + 1)
    expert_params = [0.0] * (n_layer + 1)
    largest = [(0, 0, 0)] * (n_layer + 1)
    largest_expert = [(0, 0, 0)] * (n_layer + 1)
    input_bytes = token_embd = unloaded = 0
    has_output = any(t.name == "output.weight" for t in tensors)
    output_head = (0, 0, 0)
    params = 0.0
    for t in tensors:
        if arch.is_nextn_layer(t.layer) and not t.name.endswith(_LOADED_IN_NEXTN.get(arch.arch, ())):
            unloaded += t.n_bytes  # in the file, not loaded (TENSOR_SKIP while load_mtp is off)
            continue
        layer = _layer_of(t, n_layer)
        expert = is_expert_tensor(t.name)
        shape3 = (t.n_bytes, t.shape[0], t.shape[1] if len(t.shape) > 1 else 1)
        if t.name == "output.weight" or (t.name == "token_embd.weight" and not has_output):
            output_head = shape3
        if layer >= 0 and len(t.shape) >= 2:
            if expert:
                experts[layer] += t.n_bytes
                active_experts[layer] += t.n_bytes * share
                largest_expert[layer] = max(largest_expert[layer], shape3)
            else:
                largest[layer] = max(largest[layer], shape3)
        if t.name == "token_embd.weight":
            token_embd = t.n_bytes
            if not has_output:
                active[n_layer] += t.n_bytes
                params += t.n_elements
                layer_params[n_layer] += t.n_elements
        elif t.name.startswith(_LOOKUP_ONLY):
            pass  # a token's row is looked up (GGML_OP_GET_ROWS): neither read whole nor multiplied per token
        else:
            at = n_layer if t.layer is None else t.layer
            active[at] += t.n_bytes * (share if expert else 1.0)
            params += t.n_elements * (share if expert else 1.0)
            layer_params[at] += t.n_elements * (share if expert else 1.0)
            if expert:
                expert_params[at] += t.n_elements * share
        if layer < 0:
            input_bytes += t.n_bytes
            continue
        layer_bytes[layer] += t.n_bytes
        if _repackable_shape(t, expert) and t.shape[1] % 8 == 0:
            for name, types in REPACK_TYPES.items():
                if t.ggml_type in types:
                    repack[name][layer] += t.n_bytes
    return TensorTotals(
        model_bytes=sum(layer_bytes) + input_bytes + unloaded,
        unloaded_bytes=unloaded,
        input_bytes=input_bytes,
        layer_bytes=tuple(layer_bytes),
        repack_bytes={name: tuple(v) for name, v in repack.items()},
        token_embd_bytes=token_embd,
        has_output=has_output,
        active_layer_bytes=tuple(active),
        active_params=params,
        expert_bytes=tuple(experts),
        active_expert_bytes=tuple(active_experts),
        active_layer_params=tuple(layer_params),
        active_expert_params=tuple(expert_params),
        largest_matmul=tuple(largest),
        largest_expert=tuple(largest_expert),
        output_head=output_head,
    )
