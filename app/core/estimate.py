"""The estimator: how much memory llama.cpp will allocate, per device, for a model and settings.

One pure function, :func:`estimate`, turns a model (architecture + tensor list), the context
settings and the target devices into a per-device breakdown. Every term follows llama.cpp
(vendored by llama-cpp-python 0.3.36) and is checked against its no-alloc dry run in
tests/test_proof.py:

- weights: each tensor's real bytes, placed as llama.cpp places them (token embedding on the CPU,
  the last ``n_gpu_layers`` layers on the GPUs, the output layer counting as layer ``n_layer``);
- CPU repack: on x86 with AVX2, Q4_0/Q4_K/IQ4_NL/MXFP4 matrices kept on the CPU are copied into an
  interleaved buffer on top of the memory-mapped file;
- KV cache: cells (context padded to 256 per sequence stream) x per-layer K and V row sizes, with
  a second, smaller cache for sliding-window layers unless ``swa_full``;
- recurrent state: Mamba conv + SSM state per sequence;
- compute buffer: the peak of live intermediates of the worst-case graph (see ``compute_bytes``);
- output buffer: n_vocab x n_seq x 4 bytes of logits, in host memory;
- runtime overhead per GPU: an explicit assumption (CUDA context, cuBLAS workspace, pools).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from typing import Literal

from pydantic import Field, model_validator

from app.core import backends
from app.core.architecture import Architecture
from app.core.backends import Backend, Consumer
from app.core.coverage import APPROXIMATE_NOTE, ArchCoverage, Status, coverage
from app.core.errors import EstimateError
from app.core.projector import ProjectorEstimate, ProjectorSpec, estimate_projector
from app.core.tensors import CACHE_TYPES, GGMLType, TensorInfo, is_quantized, row_bytes
from app.core.units import MIB, Frozen

GPU_RUNTIME_OVERHEAD_BYTES = 512 * MIB
CPU_RUNTIME_OVERHEAD_BYTES = 160 * MIB
MAX_CONTEXT_TOKENS = 16 * 1024 * 1024
_TOTALS_CACHE_SIZE = 128  # models remembered by the per-object caches below

RepackProfile = Literal["x86-avx2", "x86-avx512", "arm-neon", "none"]
_REPACK_TYPES: dict[str, frozenset[GGMLType]] = {
    "x86-avx2": frozenset({GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.IQ4_NL, GGMLType.MXFP4}),
    "x86-avx512": frozenset({GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.IQ4_NL, GGMLType.MXFP4, GGMLType.Q2_K}),
    "arm-neon": frozenset(
        {GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.IQ4_NL, GGMLType.MXFP4, GGMLType.Q8_0}
    ),
    "none": frozenset(),
}




class Settings(Frozen):
    """llama.cpp context settings, named after its command-line flags.

    The defaults are what FitScope's own runner uses: llama.cpp's context defaults (batch 2048,
    ubatch 512, flash attention on, f16 cache, one sequence), and llama-cpp-python's full-size
    sliding-window cache.
    """

    context_tokens: int = Field(default=4096, ge=1, le=MAX_CONTEXT_TOKENS)
    batch_tokens: int = Field(default=2048, ge=1, le=1 << 20)
    ubatch_tokens: int = Field(default=512, ge=1, le=1 << 20)
    flash_attn: bool = True
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    parallel_sequences: int = Field(default=1, ge=1, le=256)
    kv_unified: bool = False
    swa_full: bool = True
    gpu_layers: int | None = Field(default=None, ge=0, description="None: every layer on the GPUs")
    repack: RepackProfile = "x86-avx2"
    backend: Backend | Literal["auto"] = Field(
        default="auto", description="the llama.cpp build; auto: CUDA/ROCm/Metal by the GPUs' vendor, CPU without GPUs"
    )
    consumer: Consumer = Field(
        default="llama-cpp-python", description="llama-server reserves logits for its slots only (n_outputs_max)"
    )
    mmap: bool = True
    n_cpu_moe: int = Field(default=0, ge=0, description="--n-cpu-moe: expert tensors of the first N layers in RAM")
    mmproj: ProjectorSpec | None = Field(default=None, description="--mmproj: a vision projector beside the model")
    mmproj_offload: bool = Field(default=True, description="False: --no-mmproj-offload (the projector in host memory)")

    @model_validator(mode="after")
    def _check(self) -> Settings:
        for name in (self.cache_type_k, self.cache_type_v):
            if name not in CACHE_TYPES:
                raise ValueError(f"unknown cache type '{name}' (choose {', '.join(CACHE_TYPES)})")
        return self

    @property
    def effective_ubatch(self) -> int:
        return min(self.ubatch_tokens, self.batch_tokens)

    @property
    def n_outputs_max(self) -> int:
        """Rows of logits the worst-case graph reserves: llama-server sets ``n_outputs_max`` to its
        slots (``server_output_limits``, tools/server/server-context.cpp); llama-cpp-python leaves
        it at 0, which llama_context turns into n_batch."""
        if self.consumer == "llama-server":
            return min(self.batch_tokens, self.parallel_sequences)
        return self.batch_tokens

    def describe(self) -> str:
        fa = "on" if self.flash_attn else "off"
        return (
            f"-c {self.context_tokens} -b {self.batch_tokens} -ub {self.ubatch_tokens} -fa {fa} "
            f"-ctk {self.cache_type_k} -ctv {self.cache_type_v} -np {self.parallel_sequences}"
            + (" --kv-unified" if self.kv_unified else "")
            + (" --swa-full" if self.swa_full else " --no-swa-full")
            + ("" if self.mmap else " --no-mmap")
            + (f" --n-cpu-moe {self.n_cpu_moe}" if self.n_cpu_moe else "")
        )


class Target(Frozen):
    """A device the model's layers may go to. ``kind='cpu'`` is host memory."""

    name: str
    kind: Literal["gpu", "cpu"]
    capacity_bytes: int = Field(ge=0)
    bandwidth_gb_s: float = Field(gt=0)
    fp16_tflops: float = Field(gt=0)
    efficiency_class: Literal["nvidia", "amd", "apple", "cpu", "host-spec"] = Field(
        default="nvidia", description="cpu: a measured read bandwidth; host-spec: a DRAM spec-sheet peak"
    )
    overhead_bytes: int | None = Field(default=None, ge=0, description="None: the documented default")

    @property
    def runtime_overhead_bytes(self) -> int:
        if self.overhead_bytes is not None:
            return self.overhead_bytes
        return GPU_RUNTIME_OVERHEAD_BYTES if self.kind == "gpu" else CPU_RUNTIME_OVERHEAD_BYTES


class DeviceBreakdown(Frozen):
    name: str
    kind: Literal["gpu", "cpu"]
    capacity_bytes: int
    weights_bytes: int
    repack_bytes: int
    kv_cache_bytes: int
    recurrent_state_bytes: int
    compute_bytes: int
    output_bytes: int
    overhead_bytes: int
    layers: int = Field(description="repeating layers placed here (the output layer not counted)")
    projector_bytes: int = Field(default=0, description="a vision projector's weights and compute buffer (--mmproj)")

    @property
    def total_bytes(self) -> int:
        return (
            self.projector_bytes
            + self.weights_bytes
            + self.repack_bytes
            + self.kv_cache_bytes
            + self.recurrent_state_bytes
            + self.compute_bytes
            + self.output_bytes
            + self.overhead_bytes
        )

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.total_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes


class KVCacheDetail(Frozen):
    """One llama.cpp KV cache (sliding-window models have two)."""

    kind: Literal["full", "swa"]
    cells: int
    streams: int
    layers: int
    k_bytes: int
    v_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.k_bytes + self.v_bytes


class Estimate(Frozen):
    settings: Settings
    devices: tuple[DeviceBreakdown, ...]
    kv_caches: tuple[KVCacheDetail, ...]
    model_bytes: int = Field(
        description="llama_model_size: every tensor in the file once, NextN layers included though they are not loaded"
    )
    gpu_layers: int
    n_layer: int
    layer_devices: tuple[int, ...] = Field(
        description="for layers 0..n_layer (n_layer = the output layer): the index in ``devices`` holding it"
    )
    assumptions: tuple[str, ...]
    backend: Backend = "cpu"
    cpu_moe_layers: int = Field(default=0, description="layers whose expert tensors stay in host memory")
    runtime_scratch_bytes: int = Field(
        default=0, description="per GPU: memory-pool scratch llama.cpp does not print (inside overhead_bytes)"
    )
    rules: Status = Field(
        default="exact",
        description="exact: the architecture's rules are proven against llama.cpp (app.core.coverage); "
        "approximate: generic rules; unknown: llama.cpp does not load this architecture",
    )
    architecture: str = Field(default="", description="llama.cpp general.architecture")
    projector: ProjectorEstimate | None = Field(default=None, description="the --mmproj projector, when one is loaded")
    projector_device: int | None = Field(default=None, description="the index in ``devices`` holding the projector")

    @property
    def approximate(self) -> bool:
        return self.rules != "exact"

    def _sum(self, field: str) -> int:
        return sum(getattr(d, field) for d in self.devices)

    @property
    def weights_bytes(self) -> int:
        return self._sum("weights_bytes")

    @property
    def repack_bytes(self) -> int:
        return self._sum("repack_bytes")

    @property
    def kv_cache_bytes(self) -> int:
        return self._sum("kv_cache_bytes")

    @property
    def recurrent_state_bytes(self) -> int:
        return self._sum("recurrent_state_bytes")

    @property
    def compute_bytes(self) -> int:
        return self._sum("compute_bytes")

    @property
    def output_bytes(self) -> int:
        return self._sum("output_bytes")

    @property
    def projector_bytes(self) -> int:
        return self._sum("projector_bytes")

    @property
    def overhead_bytes(self) -> int:
        return self._sum("overhead_bytes")

    @property
    def total_bytes(self) -> int:
        return sum(d.total_bytes for d in self.devices)

    @property
    def fits(self) -> bool:
        return all(d.fits for d in self.devices)


# -- pieces --------------------------------------------------------------------------------------


def _cache_type(name: str) -> GGMLType:
    return CACHE_TYPES[name]


def context_cells(settings: Settings) -> tuple[int, int]:
    """(cells per stream, streams) of the KV cache, as llama_context pads them."""
    n_ctx = _pad(settings.context_tokens, 256)
    if settings.kv_unified:
        return n_ctx, 1
    n_seq = settings.parallel_sequences
    per_seq = _pad(n_ctx // n_seq, 256)
    return per_seq, n_seq


def _pad(n: int, to: int) -> int:
    return -(-n // to) * to


def _kv_layer_widths(arch: Architecture, layer: int) -> tuple[int, int]:
    """(K elements, V elements) per cell for one layer; (0, 0) for a layer without KV."""
    if arch.is_nextn_layer(layer):
        # The main context's cache skips NextN layers (filter il < n_layer(), llama_model::create_memory).
        return 0, 0
    if arch.mla is not None:
        return arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim, 0
    n_kv = arch.kv_heads(layer)
    return n_kv * arch.head_dim_k_eff, n_kv * arch.head_dim_v_eff


_WIDTHS_CACHE: dict[int, tuple[Architecture, tuple[tuple[int, int], ...]]] = {}


def _all_kv_widths(arch: Architecture) -> tuple[tuple[int, int], ...]:
    """``_kv_layer_widths`` of every layer, remembered per architecture object (they are frozen)."""
    hit = _WIDTHS_CACHE.get(id(arch))
    if hit is not None and hit[0] is arch:
        return hit[1]
    widths = tuple(_kv_layer_widths(arch, i) for i in range(arch.n_layer))
    if len(_WIDTHS_CACHE) >= _TOTALS_CACHE_SIZE:
        _WIDTHS_CACHE.pop(next(iter(_WIDTHS_CACHE)))
    _WIDTHS_CACHE[id(arch)] = (arch, widths)
    return widths


_ARCH_MEMO: dict[tuple, tuple[Architecture, object]] = {}


def _memo(arch: Architecture, key: tuple, make):
    """``make()`` remembered per architecture object and ``key``: the sweeps behind one chart ask
    the same per-layer questions thousands of times."""
    full_key = (id(arch), *key)
    hit = _ARCH_MEMO.get(full_key)
    if hit is not None and hit[0] is arch:
        return hit[1]
    value = make()
    if len(_ARCH_MEMO) >= 64 * _TOTALS_CACHE_SIZE:
        _ARCH_MEMO.pop(next(iter(_ARCH_MEMO)))
    _ARCH_MEMO[full_key] = (arch, value)
    return value


def kv_caches(arch: Architecture, settings: Settings) -> list[tuple[KVCacheDetail, list[int]]]:
    """The KV caches llama.cpp creates, each with the layers it holds (callers must not change them).

    Raises EstimateError for a quantized V cache without flash attention (llama.cpp refuses it).
    """
    key = (
        "kv",
        settings.context_tokens,
        settings.parallel_sequences,
        settings.kv_unified,
        settings.swa_full,
        settings.flash_attn,
        settings.cache_type_k,
        settings.cache_type_v,
        settings.effective_ubatch,
    )
    return _memo(arch, key, lambda: _kv_caches(arch, settings))


def _kv_caches(arch: Architecture, settings: Settings) -> list[tuple[KVCacheDetail, list[int]]]:
    type_k, type_v = _cache_type(settings.cache_type_k), _cache_type(settings.cache_type_v)
    if is_quantized(type_v) and not settings.flash_attn:
        raise EstimateError(
            "A quantized V cache needs flash attention: llama.cpp refuses -ctv "
            f"{settings.cache_type_v} with -fa off. Turn flash attention on or use an f16 V cache."
        )
    cells, streams = context_cells(settings)
    widths = _all_kv_widths(arch)
    layers = [i for i in range(arch.n_layer) if any(widths[i])]
    if not layers:
        return []
    v_trans = not settings.flash_attn
    v_width_max = max(widths[i][1] for i in layers)

    def build(kind: Literal["full", "swa"], group: list[int], n_cells: int) -> tuple[KVCacheDetail, list[int]]:
        k_bytes = v_bytes = 0
        for i in group:
            k_w, v_w = widths[i]
            k_bytes += row_bytes(type_k, k_w) * n_cells * streams
            if v_w:
                width = v_width_max if v_trans else v_w
                v_bytes += row_bytes(type_v, width) * n_cells * streams
        detail = KVCacheDetail(
            kind=kind, cells=n_cells, streams=streams, layers=len(group), k_bytes=k_bytes, v_bytes=v_bytes
        )
        return detail, group

    swa_layers = [i for i in layers if arch.is_swa_layer(i)]
    if not swa_layers:
        return [build("full", layers, cells)]
    full_layers = [i for i in layers if not arch.is_swa_layer(i)]
    assert arch.sliding_window is not None
    n_seq = settings.parallel_sequences
    swa_cells = cells
    if not settings.swa_full:
        window = arch.sliding_window * (n_seq if settings.kv_unified else 1) + settings.effective_ubatch
        swa_cells = _pad(min(cells, window), 256)
    out = []
    if full_layers:
        out.append(build("full", full_layers, cells))
    out.append(build("swa", swa_layers, swa_cells))
    return out


def recurrent_state_bytes_per_layer(arch: Architecture, settings: Settings) -> int:
    """Mamba conv + SSM state, or a short convolution's history (f32), for every sequence, one layer
    (llama_hparams::n_embd_r / n_embd_s; llama_memory_recurrent keeps max(1, n_seq_max) rows)."""
    n_seq = max(1, settings.parallel_sequences)
    if arch.conv_l_cache is not None:
        return arch.n_embd * (arch.conv_l_cache - 1) * 4 * n_seq
    ssm = arch.ssm
    if ssm is None:
        return 0
    conv = (ssm.d_conv - 1) * (ssm.d_inner + 2 * ssm.n_group * ssm.d_state)
    state = ssm.d_state * ssm.d_inner
    return (conv + state) * 4 * n_seq


# Architectures whose graph sets res->t_h_nextn (src/models/*.cpp), which llm_graph_result::set_outputs
# keeps alive as an output.
_KEEPS_NEXTN_HIDDEN = frozenset(
    {"deepseek2", "gpt-oss", "glm4moe", "nemotron_h", "nemotron_h_moe", "qwen3next", "qwen35", "qwen35moe"}
)


def compute_bytes(arch: Architecture, settings: Settings, kv_cells: int, swa_cells: int | None) -> int:
    """Peak of the worst-case graph's live intermediates on one device holding every layer and the
    output head (see :func:`compute_parts`)."""
    return max(compute_parts(arch, settings, kv_cells, swa_cells))


def compute_parts(arch: Architecture, settings: Settings, kv_cells: int, swa_cells: int | None) -> tuple[int, int]:
    """(output head peak, repeating layers' peak) of the worst-case graph's live intermediates (one
    ubatch of min(n_ctx, n_ubatch) tokens against a full KV window), as ggml's allocator reserves
    them on the CPU backend.

    The terms are the tensors alive at the three candidate peaks: the logits (output head), the
    feed-forward block, and (without flash attention) the attention scores.
    """
    n_ctx_total = _pad(settings.context_tokens, 256)
    n_ub = min(settings.effective_ubatch, n_ctx_total)
    # Logits are reserved for n_outputs_max rows only (llama_context::sched_reserve); the last
    # layer selects those rows (inp_out_ids) before the output norm and head.
    n_out = min(n_ub, settings.n_outputs_max)
    e = arch.n_embd
    vocab = arch.n_vocab
    f32 = 4
    p_out = n_out * (vocab + 2 * e) * f32
    if arch.mla is not None:
        # MLA keeps each head's absorbed query (latent + rope + nope dims, f32) alive into the output
        # phase: exact on DeepSeek-V2's dry run, 4% low on V2-Lite's.
        mla = arch.mla
        p_out += n_ub * f32 * arch.max_heads() * (mla.kv_lora_rank + mla.qk_nope_head_dim + mla.qk_rope_head_dim)

    if arch.arch == "ernie4_5-moe" and arch.moe is not None:
        # ERNIE 4.5's last MoE block leaves its routed gate/up/activation rows (n_used x ff_exp x 3)
        # beside the logits, in place of the two embedding-wide rows: the peak is exactly
        # n_out x (vocab + 3 x n_used x ff_exp) floats at ubatch 128, 512 and 1024, with and without
        # flash attention.
        routed_rows = 3 * arch.moe.n_expert_used * arch.moe.expert_ff
        p_out += n_out * f32 * max(0, routed_rows - 2 * e)

    if arch.arch in _KEEPS_NEXTN_HIDDEN:
        # These graphs hand the output-normed hidden state to a multi-token-prediction head
        # (res->t_h_nextn), which llm_graph_result marks as an output whether or not it is used: one
        # embedding row per output stays beside the logits.
        kept = n_out * e
        if arch.arch == "glm4moe" and settings.flash_attn and arch.qk_norm:
            # With flash attention and q/k norm the last layer's normed Q (n_head x head_dim per
            # token) is what stays below them instead: exact on GLM-4.5 dry runs at ubatch 128-2048.
            kept = max(kept, n_ub * arch.max_heads() * arch.head_dim_k_eff)
        p_out += kept * f32
    if arch.arch == "llama4":
        # Llama 4's output phase keeps an embedding row per output and, at long contexts, the two
        # attention masks (chunked and global) below the logits: counted whole (exact at 64k without
        # --swa-full, up to 8% high with a full-size chunked cache).
        mask = 2 if settings.flash_attn else f32
        p_out += n_out * e * f32 + n_ub * mask * (kv_cells + (swa_cells or 0))
    if arch.arch in ("nemotron_h", "nemotron_h_moe"):
        # Nemotron-H's attention mask is still placed below the logits (n_ub x n_kv, f16 with flash
        # attention): exact at 4k cells, up to a quarter of it high at 32k-128k.
        p_out += n_ub * kv_cells * (2 if settings.flash_attn else f32)

    n_kv = kv_cells
    if arch.ssm is not None and arch.attention_layers is None:
        ssm = arch.ssm
        # Mamba: in/out projections, conv window and the scan's y + state per token.
        p_ffn = n_ub * f32 * (4 * ssm.d_inner + 2 * e + ssm.d_state * 2 + (ssm.d_conv - 1))
        return p_out, p_ffn

    ff = _memo(arch, ("ff",), lambda: max(arch.ff(i) for i in range(arch.n_layer))) if arch.moe is None else 0
    p_moe_down = 0
    if arch.moe is not None:
        moe = arch.moe
        dense = max((arch.ff(i) for i in range(arch.n_layer) if not arch.is_moe_layer(i)), default=0)
        # Routed experts: per token, n_expert_used rows of gate/up/act per expert.
        routed = moe.n_expert_used * moe.expert_ff
        ff = max(dense, routed + moe.shared_ff)
        # build_moe_ffn's down projection: the activation, each expert's output and its weighted
        # copy are alive together (n_used x (ff_exp + 2 e)), which outgrows gate/up/act on models
        # with many narrow experts (Qwen3-MoE: exact on no-alloc dry runs with few output rows).
        p_moe_down = n_ub * f32 * (moe.n_expert_used * (moe.expert_ff + 2 * e) + 3 * e)
    mask = 2 if settings.flash_attn else 4
    p_ffn = n_ub * (f32 * (3 * ff + 4 * e) + mask * n_kv)
    p_ffn = max(p_ffn, p_moe_down + n_ub * mask * n_kv)
    if swa_cells is not None:
        p_ffn += n_ub * mask * swa_cells

    if settings.flash_attn:
        return p_out, p_ffn

    n_head = arch.max_heads()
    kv_w = max((sum(w) for w in _all_kv_widths(arch)), default=0)
    p_attn = n_ub * n_kv * f32 * (n_head + 1) + n_ub * f32 * (5 * e + kv_w)
    q_width = n_head * arch.head_dim_k_eff
    if q_width > e:
        # q (and its roped copy) wider than the embedding (Qwen3-MoE: 32 x 128 heads on 2048):
        # exact on dry runs of Qwen3-30B-A3B and Qwen3-235B-A22B.
        p_attn += n_ub * f32 * 2 * (q_width - e)
    if swa_cells is not None and arch.arch in ("gemma3", "llama4"):
        # Gemma 3's scores are reserved beside its SWA mask (f32 without flash attention);
        # measured on Gemma-3-4B/12B dry runs, where Gemma 2's are not.
        p_attn += n_ub * swa_cells * f32
    return p_out, max(p_ffn, p_attn)


_EXPERT_TENSOR = re.compile(r"\.ffn_(up|down|gate_up|gate)_(ch|)exps\.")


def is_expert_tensor(name: str) -> bool:
    """Routed-expert weights, as llama.cpp's --cpu-moe / --n-cpu-moe patterns match them
    (``blk.N.ffn_(up|down|gate_up|gate)_(ch|)exps``, common/arg.cpp and common/fit.cpp)."""
    return _EXPERT_TENSOR.search(name) is not None


def _layer_of(t: TensorInfo, n_layer: int) -> int:
    """Placement layer: -1 for the input (token embedding), n_layer for the output layer."""
    idx = t.layer
    if idx is not None:
        return idx
    if t.name.startswith("token_embd") or t.name.startswith("token_types") or t.name.startswith("position"):
        return -1
    return n_layer


@lru_cache(maxsize=4096)
def _layer_devices(n_layer: int, gpu_layers: int, capacities: tuple[int, ...]) -> tuple[int, ...]:
    """For layers 0..n_layer (n_layer = the output layer): -1 for the CPU, else the GPU index."""
    placement = _split_layers(n_layer, gpu_layers, capacities)
    return tuple(placement.get(i, -1) for i in range(n_layer + 1))


@lru_cache(maxsize=4096)
def _breakdown_indices(layer_dev: tuple[int, ...], n_devices: int) -> tuple[int, ...]:
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
        if len(_TOTALS_CACHE) >= _TOTALS_CACHE_SIZE:
            _TOTALS_CACHE.pop(next(iter(_TOTALS_CACHE)))
        _TOTALS_CACHE[key] = (tensors, arch.n_layer, totals)
    return totals


def _sum_tensors(arch: Architecture, tensors: Sequence[TensorInfo]) -> TensorTotals:
    n_layer = arch.n_layer
    share = arch.moe.n_expert_used / arch.moe.n_expert if arch.moe else 1.0
    layer_bytes = [0] * (n_layer + 1)
    repack = {name: [0] * (n_layer + 1) for name in _REPACK_TYPES}
    active = [0.0] * (n_layer + 1)
    experts = [0] * (n_layer + 1)
    active_experts = [0.0] * (n_layer + 1)
    largest = [(0, 0, 0)] * (n_layer + 1)
    largest_expert = [(0, 0, 0)] * (n_layer + 1)
    input_bytes = token_embd = unloaded = 0
    has_output = any(t.name == "output.weight" for t in tensors)
    output_head = (0, 0, 0)
    params = 0.0
    for t in tensors:
        if arch.is_nextn_layer(t.layer):
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
        else:
            active[n_layer if t.layer is None else t.layer] += t.n_bytes * (share if expert else 1.0)
            params += t.n_elements * (share if expert else 1.0)
        if layer < 0:
            input_bytes += t.n_bytes
            continue
        layer_bytes[layer] += t.n_bytes
        if len(t.shape) >= 2 and t.shape[1] % 8 == 0:
            for name, types in _REPACK_TYPES.items():
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
        largest_matmul=tuple(largest),
        largest_expert=tuple(largest_expert),
        output_head=output_head,
    )


def resolve_backend(settings: Settings, gpus: Sequence[Target]) -> Backend:
    """The llama.cpp build an estimate models: the one asked for, or by the GPUs' vendor (CPU
    without GPUs). A GPU build with no GPU target behaves as the CPU build."""
    if not gpus:
        return "cpu"
    if settings.backend != "auto":
        return settings.backend
    return backends.default_backend(gpus[0].efficiency_class)


def mask_bytes(settings: Settings, caches: Sequence[KVCacheDetail]) -> int:
    """The graph's attention masks: one per KV cache, n_kv x n_ubatch, f16 with flash attention and
    f32 without (``build_attn_inp_kq_mask``, src/llama-graph.cpp)."""
    n_ub = min(settings.effective_ubatch, _pad(settings.context_tokens, 256))
    per = 2 if settings.flash_attn else 4
    return sum(c.cells * n_ub * per for c in caches)


def estimate(
    arch: Architecture,
    tensors: Sequence[TensorInfo],
    settings: Settings,
    targets: list[Target],
) -> Estimate:
    """Memory llama.cpp will use on each target for ``arch`` with ``tensors`` under ``settings``.

    ``targets`` holds zero or more GPUs and exactly one CPU (host memory) entry; with no GPU, the
    whole model runs on the CPU. All figures are bytes. With GPUs, the buffers follow the build in
    ``settings.backend`` (see :mod:`app.core.backends`): no repacking beside a host buffer type, op
    offload into GPU 0's compute buffer, the pinned host compute buffer, pipeline-parallel copies.

    Raises EstimateError for settings llama.cpp refuses (a quantized V cache without flash
    attention, a context beyond MAX_CONTEXT_TOKENS) or a target list without a CPU.
    """
    cpus = [t for t in targets if t.kind == "cpu"]
    gpus = [t for t in targets if t.kind == "gpu"]
    if len(cpus) != 1:
        raise EstimateError("An estimate needs exactly one CPU (host memory) target.")
    cpu = cpus[0]
    n_layer = arch.n_layer
    backend = resolve_backend(settings, gpus)
    ngl = (n_layer + 1) if settings.gpu_layers is None else min(settings.gpu_layers, n_layer + 1)
    if not gpus:
        ngl = 0
    layer_dev = _layer_devices(n_layer, ngl, tuple(g.capacity_bytes for g in gpus))
    device_of = layer_dev.__getitem__
    layer_counts = Counter(layer_dev[:n_layer])

    n_dev = len(gpus)
    totals = tensor_totals(arch, tensors)
    cpu_moe = min(settings.n_cpu_moe, n_layer) if arch.moe is not None and gpus else 0
    # Host-resident weights take the GPU's pinned host buffer type before the repack types
    # (make_cpu_buft_list): a CUDA/ROCm/Vulkan build repacks nothing.
    repacks = settings.repack != "none" and not (gpus and backends.has_host_buffer(backend))
    weights = [0] * (n_dev + 1)  # index -1 → CPU (last slot)
    repack = 0
    repack_by_layer = totals.repack_bytes[settings.repack]
    weights[-1] += totals.input_bytes
    for layer in range(n_layer + 1):
        dev = device_of(layer)
        layer_weights = totals.layer_bytes[layer]
        if layer < cpu_moe and dev != -1:
            # --n-cpu-moe: this layer's routed experts stay in host memory.
            weights[-1] += totals.expert_bytes[layer]
            layer_weights -= totals.expert_bytes[layer]
        weights[dev] += layer_weights
        if dev == -1 and repacks:
            repack += repack_by_layer[layer]
    if repacks and not settings.mmap:
        # Without mmap a repacked tensor is loaded straight into the repack buffer: no second copy.
        weights[-1] -= repack
    out_dev = device_of(n_layer)
    if not totals.has_output and out_dev != -1:
        # Tied embeddings: the output layer on a GPU gets its own copy of the token embedding.
        weights[out_dev] += totals.token_embd_bytes

    caches = kv_caches(arch, settings)
    kv = [0] * (n_dev + 1)
    for detail, group in caches:
        per_layer_k = detail.k_bytes // max(1, len(group))
        per_layer_v = detail.v_bytes // max(1, len(group))
        for i in group:
            kv[device_of(i)] += per_layer_k + per_layer_v
    state = [0] * (n_dev + 1)
    per_layer_state = recurrent_state_bytes_per_layer(arch, settings)
    recurrent = _memo(arch, ("recurrent",), lambda: [i for i in range(n_layer) if arch.is_recurrent_layer(i)])
    for i in recurrent:
        state[device_of(i)] += per_layer_state

    cells, _ = context_cells(settings)
    details = [d for d, _ in caches]
    swa_cells = next((d.cells for d in details if d.kind == "swa"), None)
    full_cells = next((d.cells for d in details if d.kind == "full"), cells)
    p_out, p_layers = compute_parts(arch, settings, full_cells if caches else cells, swa_cells)
    peak = max(p_out, p_layers)
    compute = [0] * (n_dev + 1)
    gpu_used = sorted(set(layer_dev) - {-1})
    all_on_gpus = bool(gpus) and ngl >= n_layer + 1
    for g in gpu_used:
        # Each GPU reserves its own part of the graph: the logits only where the output head is
        # (public two-GPU logs: 256 MiB without the head, 363 MiB with it, Qwen2.5-32B at 2k).
        compute[g] = max(p_layers, p_out if g == out_dev else 0)
    n_ub = min(settings.effective_ubatch, _pad(settings.context_tokens, 256))
    masks = mask_bytes(settings, details)
    gpu_build = bool(gpus) and backend != "cpu"
    if gpu_build:
        copies = backends.pipeline_copies(backend, len(gpu_used), all_on_gpus, cpu_moe > 0)
        inputs = n_ub * arch.n_embd * 4 + copies * (n_ub * 16 + masks)
        if copies > 1:
            for g in gpu_used:
                compute[g] += (copies - 1) * (masks + n_ub * arch.n_embd * 4)
        if all_on_gpus:
            compute[-1] = inputs
        else:
            compute[-1] = inputs + _host_attention_bytes(arch, settings, full_cells if caches else cells)
        if backends.offloads_ops(backend, n_ub):
            offload = _offload_peak(arch, settings, totals, layer_dev, cpu_moe, masks if gpu_used else 0)
            compute[0] = max(compute[0], offload)
    elif ngl < n_layer + 1 or not gpu_used:
        compute[-1] = peak
    else:
        compute[-1] = _host_staging_bytes(arch, settings)
    output = max(1, settings.parallel_sequences) * arch.n_vocab * 4
    scratch = _fa_scratch_bytes(arch, settings, details, backend) if gpu_build else 0

    breakdown = []
    for g, target in enumerate(gpus):
        layers_here = layer_counts[g]
        busy = g in gpu_used or compute[g] > 0
        breakdown.append(
            DeviceBreakdown(
                name=target.name,
                kind="gpu",
                capacity_bytes=target.capacity_bytes,
                weights_bytes=weights[g],
                repack_bytes=0,
                kv_cache_bytes=kv[g],
                recurrent_state_bytes=state[g],
                compute_bytes=compute[g],
                output_bytes=0,
                overhead_bytes=(target.runtime_overhead_bytes + (scratch if g in gpu_used else 0)) if busy else 0,
                layers=layers_here,
            )
        )
    breakdown.append(
        DeviceBreakdown(
            name=cpu.name,
            kind="cpu",
            capacity_bytes=cpu.capacity_bytes,
            weights_bytes=weights[-1],
            repack_bytes=repack,
            kv_cache_bytes=kv[-1],
            recurrent_state_bytes=state[-1],
            compute_bytes=compute[-1],
            output_bytes=output,
            overhead_bytes=cpu.runtime_overhead_bytes,
            layers=layer_counts[-1],
        )
    )
    projector, projector_device = _place_projector(settings, breakdown, gpu_build)
    rules = coverage(arch.arch)
    return Estimate(
        settings=settings,
        devices=tuple(breakdown),
        kv_caches=tuple(details),
        model_bytes=totals.model_bytes,
        gpu_layers=ngl,
        n_layer=n_layer,
        layer_devices=_breakdown_indices(layer_dev, len(breakdown)),
        assumptions=tuple(_assumptions(settings, gpus, cpu, backend, repacks, cpu_moe, rules))
        + _projector_notes(projector, projector_device, breakdown),
        backend=backend,
        cpu_moe_layers=cpu_moe,
        runtime_scratch_bytes=scratch,
        rules=rules.status,
        architecture=arch.arch,
        projector=projector,
        projector_device=projector_device,
    )


def _place_projector(
    settings: Settings, breakdown: list[DeviceBreakdown], gpu_build: bool
) -> tuple[ProjectorEstimate | None, int | None]:
    """Add the ``--mmproj`` projector to the device mtmd puts it on: the first GPU with a GPU build
    and offload on (``clip_ctx`` takes the first GPU backend when ``use_gpu``), else host memory
    (the last entry of ``breakdown``, which is changed in place)."""
    if settings.mmproj is None:
        return None, None
    projector = _projector_estimate(settings.mmproj, settings.flash_attn)
    index = 0 if gpu_build and settings.mmproj_offload else len(breakdown) - 1
    device = breakdown[index]
    breakdown[index] = device.model_copy(update={"projector_bytes": projector.total_bytes})
    return projector, index


def _projector_notes(
    projector: ProjectorEstimate | None, index: int | None, breakdown: list[DeviceBreakdown]
) -> tuple[str, ...]:
    if projector is None or index is None:
        return ()
    where = breakdown[index]
    place = (
        f"The vision projector goes on {where.name}, as mtmd places it (the first GPU unless "
        "--no-mmproj-offload; not yet checked on a GPU)."
        if where.kind == "gpu"
        else f"The vision projector runs in host memory ({where.name})."
    )
    return (*projector.assumptions, place)


@lru_cache(maxsize=32)
def _projector_estimate(spec: ProjectorSpec, flash_attn: bool) -> ProjectorEstimate:
    return estimate_projector(spec, flash_attn)


def _offload_peak(
    arch: Architecture,
    settings: Settings,
    totals: TensorTotals,
    layer_dev: tuple[int, ...],
    cpu_moe: int,
    gpu_masks: int,
) -> int:
    """GPU 0's compute buffer when host-resident weights' batched products run there: each such
    weight is copied into the buffer for its own split (ggml_backend_sched_split_graph), beside the
    product's input and output and the residual stream; with layers on the GPU, the attention
    masks' copies live there too."""
    n_ub = min(settings.effective_ubatch, _pad(settings.context_tokens, 256))
    n_out = min(n_ub, settings.n_outputs_max)
    f32 = 4
    n_used = arch.moe.n_expert_used if arch.moe is not None else 1
    n_layer = arch.n_layer
    best = 0
    for layer in range(n_layer):
        on_host = layer_dev[layer] == -1
        if on_host:
            size, k, n = totals.largest_matmul[layer]
            if size:
                best = max(best, size + n_ub * f32 * (k + n))
        if (on_host or layer < cpu_moe) and totals.largest_expert:
            size, k, n = totals.largest_expert[layer]
            if size:
                best = max(best, size + n_used * n_ub * f32 * (k + n))
    if layer_dev[n_layer] == -1 and totals.output_head[0]:
        size, k, n = totals.output_head
        best = max(best, size + n_out * f32 * (k + n))
    if not best:
        return 0
    return best + n_ub * arch.n_embd * f32 + gpu_masks


def _host_attention_bytes(arch: Architecture, settings: Settings, n_kv: int) -> int:
    """With layers left on the CPU, their attention runs there (its matrix products are offloaded,
    the attention itself has no weight): q and the attention output, or without flash attention
    the scores over the whole KV window."""
    n_ub = min(settings.effective_ubatch, _pad(settings.context_tokens, 256))
    q_width = arch.max_heads() * arch.head_dim_k_eff
    if settings.flash_attn:
        return 2 * n_ub * q_width * 4
    return n_ub * n_kv * 4 * (arch.max_heads() + 1)


def _fa_scratch_bytes(arch: Architecture, settings: Settings, caches: Sequence[KVCacheDetail], backend: str) -> int:
    """ggml-cuda's flash attention converts a quantized K/V view of one layer to f16 in its pool
    (launch_fattn, ggml/src/ggml-cuda/fattn-common.cuh): the largest layer at the full KV length."""
    if not (settings.flash_attn and backends.converts_quantized_kv(backend)):
        return 0
    quant_k = is_quantized(_cache_type(settings.cache_type_k))
    quant_v = is_quantized(_cache_type(settings.cache_type_v))
    if not (quant_k or quant_v):
        return 0
    widths = _all_kv_widths(arch)
    cells = max((c.cells for c in caches), default=0)
    k_w = max((w[0] for w in widths), default=0) if quant_k else 0
    v_w = max((w[1] for w in widths), default=0) if quant_v else 0
    return cells * (k_w + v_w) * 2


def _host_staging_bytes(arch: Architecture, settings: Settings) -> int:
    n_ub = min(settings.effective_ubatch, _pad(settings.context_tokens, 256))
    return n_ub * arch.n_embd * 4 + n_ub * 16


def _assumptions(
    settings: Settings,
    gpus: list[Target],
    cpu: Target,
    backend: str,
    repacks: bool,
    cpu_moe: int,
    rules: ArchCoverage,
) -> list[str]:
    out = [] if rules.status == "exact" else [f"{APPROXIMATE_NOTE.capitalize()} ({rules.arch}): {rules.detail}."]
    out += [
        f"llama.cpp settings: {settings.describe()}; a {backend.upper() if backend != 'cpu' else 'CPU'} build "
        f"of llama.cpp, as {settings.consumer} uses it.",
        "Weights are summed tensor by tensor; the token embedding always stays in host memory.",
        f"Host runtime overhead (process, libraries, threads): {CPU_RUNTIME_OVERHEAD_BYTES // MIB} MiB.",
    ]
    if settings.consumer == "llama-server":
        out.append(
            f"llama-server reserves logits for its {settings.parallel_sequences} slot(s) only (n_outputs_max), "
            "so its compute and output buffers are smaller than llama-cpp-python's."
        )
    if gpus and not repacks and backends.has_host_buffer(backend):
        out.append(
            "Weights left in host memory are "
            + ("memory-mapped from the file" if settings.mmap else "in pinned host memory (--no-mmap)")
            + "; a GPU build repacks nothing."
        )
    if cpu_moe:
        out.append(f"The routed experts of the first {cpu_moe} layers stay in host memory (--n-cpu-moe {cpu_moe}).")
    if gpus:
        out.append(
            f"Per-GPU runtime overhead not printed by llama.cpp (CUDA context, cuBLAS workspace, memory pool): "
            f"{gpus[0].runtime_overhead_bytes // MIB} MiB each (public logs show 0.3-0.6 GiB)."
        )
        out.append("Layers are split across GPUs in proportion to their memory, as llama.cpp's default split.")
    if repacks:
        out.append(
            f"CPU weight repacking ({settings.repack}): repacked matrices take extra host memory beside "
            "the memory-mapped file."
        )
    return out


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
