"""Compute buffers: the peak of the worst-case graph's live intermediates as ggml's allocator
reserves them, on the CPU and on GPUs (op offload of host-resident weights, host staging,
flash attention's scratch). Each term names the graph or function of the vendored llama.cpp it
follows."""

from __future__ import annotations

from collections.abc import Sequence

from app.core.memory import backends
from app.core.memory.graphs import MLA_ARCHS, allowance_bytes, measured_at, mla_parts, msa_layer_bytes, msa_runs
from app.core.memory.kv import cache_type, context_cells, graph_key, kv_widths, memo_per_arch, memo_per_object
from app.core.memory.layers import TensorTotals
from app.core.memory.records import KVCacheDetail, Settings
from app.core.model.architecture import GEMMA3N_ALTUP, Architecture
from app.core.model.tensors import is_quantized

# Architectures whose graph sets res->t_h_nextn (src/models/*.cpp), which llm_graph_result::set_outputs
# keeps alive as an output.
_KEEPS_NEXTN_HIDDEN = frozenset(
    {"gemma4", "gpt-oss", "glm4moe", "nemotron_h", "nemotron_h_moe", "qwen3next", "qwen35", "qwen35moe"}
)
# Those that set it before the output rows are selected (inp_out_ids after h_nextn): a row per ubatch
# token stays beside the logits (llama_model_hy_v3::graph: the normed state; llama_model_step35::graph:
# the last layer's output).
_KEEPS_WHOLE_NEXTN_HIDDEN = frozenset({"hy_v3", "step35"})


def compute_bytes(arch: Architecture, settings: Settings, kv_cells: int, swa_cells: int | None) -> int:
    """Peak of the worst-case graph's live intermediates on one device holding every layer and the
    output head (see :func:`compute_parts`)."""
    return max(compute_parts(arch, settings, kv_cells, swa_cells))


def compute_parts(arch: Architecture, settings: Settings, kv_cells: int, swa_cells: int | None) -> tuple[int, int]:
    """(output head peak, repeating layers' peak) of the worst-case graph's live intermediates (one
    ubatch of min(n_ctx, n_ubatch) tokens against a full KV window), as ggml's allocator reserves
    them on the CPU backend, with the model's measured placement allowance
    (:data:`app.core.memory.graphs.ALLOWANCE`; a negative one corrects the layers' peak only).

    The terms are the tensors alive at the three candidate peaks: the logits (output head), the
    feed-forward block, and (without flash attention) the attention scores. Remembered per
    architecture and the settings that shape the graph (not the placement: auto-fit asks it for
    every probe).
    """
    key = ("parts", *graph_key(settings), kv_cells, swa_cells)
    return memo_per_arch(arch, key, lambda: _parts(arch, settings, kv_cells, swa_cells))


def _parts(arch: Architecture, settings: Settings, kv_cells: int, swa_cells: int | None) -> tuple[int, int]:
    p_out, p_layers = _modelled_parts(arch, settings, kv_cells, swa_cells)
    extra = allowance_bytes(arch, settings, kv_cells)
    # A negative allowance (the modelled layers' peak measured high, as with llama-server's few
    # logits on MoE graphs) corrects the layers only: the larger part plus it is still at or above
    # llama.cpp wherever it was measured.
    out = p_out + max(extra, 0)
    n_ub = settings.reserve_ubatch
    off_grid = not measured_at(arch, kv_cells) or settings.graph_tokens != n_ub
    if settings.n_outputs_max >= n_ub and off_grid:
        # Logits for the whole ubatch at a cache size between two measured ones, or in a graph whose
        # tokens were rounded up to the sequences (513 for -ub 512 -np 3, never measured): ggml may
        # place them above holes no measured graph had (Gemma 4 31B at 110,000 tokens needs 21% more
        # than the allowance of 65,536 or 131,072 cells gives; gpt-oss-20b with 3 sequences 3% more
        # than that of 4), so they are taken above the layers' whole peak.
        out = max(out, p_layers + n_ub * arch.n_vocab * 4)
    return out, p_layers + extra


def _modelled_parts(arch: Architecture, settings: Settings, kv_cells: int, swa_cells: int | None) -> tuple[int, int]:
    n_ub = settings.graph_tokens
    # Logits are reserved for n_outputs_max rows only (llama_context::sched_reserve); the last
    # layer selects those rows (inp_out_ids) before the output norm and head.
    n_out = settings.graph_outputs
    e = arch.n_embd
    vocab = arch.n_vocab
    f32 = 4
    p_out = n_out * (vocab + 2 * e) * f32

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
    if arch.arch in _KEEPS_WHOLE_NEXTN_HIDDEN:
        p_out += n_ub * e * f32
    if arch.arch == "granitehybrid":
        # Granite 4.0-H's last feed-forward block leaves its output rows below the logits: the dense
        # FFN's one embedding row per output, the routed and the shared experts' two (measured on dry
        # runs of both kinds at ubatch 512 and 2048, with and without flash attention).
        p_out += n_out * e * f32 * (2 if arch.moe is not None else 1)
    if arch.arch == "llama4":
        # Llama 4's output phase keeps an embedding row per output. Its two attention masks (chunked
        # and global) stay below the logits at some cache sizes and not at others: that part is the
        # measured allowance (graphs.ALLOWANCE), not counted here.
        p_out += n_out * e * f32
    # Nemotron-H's attention mask (n_ub x n_kv, f16 with flash attention) likewise stays below the
    # logits whole at 4k cells, three quarters at 128k with ubatch 2048 and not at all at 32k with
    # ubatch 512: measured per cache size in graphs.ALLOWANCE.

    n_kv = kv_cells
    if arch.ssm is not None and arch.attention_layers is None:
        ssm = arch.ssm
        # Mamba: in/out projections, conv window and the scan's y + state per token.
        p_ffn = n_ub * f32 * (4 * ssm.d_inner + 2 * e + ssm.d_state * 2 + (ssm.d_conv - 1))
        return p_out, p_ffn

    ff = memo_per_arch(arch, ("ff",), lambda: max(arch.ff(i) for i in range(arch.n_layer))) if arch.moe is None else 0
    p_moe_down = 0
    if arch.moe is not None:
        moe = arch.moe
        dense = memo_per_arch(
            arch,
            ("dense-ff",),
            lambda: max((arch.ff(i) for i in range(arch.n_layer) if not arch.is_moe_layer(i)), default=0),
        )
        # Routed experts: per token, n_expert_used rows of gate/up/act per expert; Gemma 4 runs its
        # dense MLP beside them (llama_model_gemma4::graph).
        routed = moe.n_expert_used * moe.expert_ff
        beside = (
            memo_per_arch(arch, ("ff",), lambda: max(arch.ff(i) for i in range(arch.n_layer)))
            if arch.arch == "gemma4"
            else moe.shared_ff
        )
        ff = max(dense, routed + beside)
        # build_moe_ffn's down projection: the activation, each expert's output and its weighted
        # copy are alive together (n_used x (ff_exp + 2 width)), which outgrows gate/up/act on models
        # with many narrow experts (Qwen3-MoE: exact on no-alloc dry runs with few output rows).
        # Nemotron 3 Super / Ultra run the experts in their latent width (moe_latent_size).
        width = moe.latent_size or e
        p_moe_down = n_ub * f32 * (moe.n_expert_used * (moe.expert_ff + 2 * width) + 3 * e)
        if arch.arch == "granitehybrid":
            # The shared expert runs after the routed ones (see _granite_moe_floats).
            ff = dense
            p_moe_down = n_ub * f32 * _granite_moe_floats(arch)
    mask = 2 if settings.flash_attn else 4
    # Gated FFNs keep gate, up and their product; Nemotron's ReLU-squared experts have no gate.
    n_rows = 2 if arch.arch == "nemotron_h_moe" else 3
    # Phi-3's FFN is fused (one up product split by views into gate and up): one embedding row fewer
    # is alive beside it (exact on Phi-3 mini dry runs at 8k-128k cells).
    # Nemotron 3's mask is not alive at its layers' peak (flat from 8k to 128k cells on the Super's
    # dry runs); where it stays below the logits is the measured allowance's part.
    layer_mask = 0 if arch.arch == "nemotron_h_moe" else n_ub * mask * n_kv
    p_ffn = n_ub * f32 * (n_rows * ff + (3 if arch.arch == "phi3" else 4) * e) + layer_mask
    p_ffn = max(p_ffn, p_moe_down + layer_mask)
    if arch.arch == "gemma3n":
        p_ffn = n_ub * f32 * _gemma3n_layer_floats(arch, ff) + layer_mask
    if swa_cells is not None:
        p_ffn += n_ub * mask * swa_cells
    if arch.arch in ("qwen3next", "qwen35", "qwen35moe") and arch.ssm is not None:
        # The gated DeltaNet layer: its convolution's input and raw output (q, k and v of every head)
        # beside the residual stream; the peak of small models when few logits are reserved
        # (Qwen3.5 0.8B with llama-server's one row per slot). The delta rule itself is ggml's fused
        # GATED_DELTA_NET on the CPU, CUDA, SYCL, Metal (value heads a multiple of 32 wide) and Vulkan
        # (16 to 128 wide) builds (llama_context's fused-op probe, each backend's supports_op; Qwen3.5's
        # and Kimi Linear's are 128 wide), so the chunked fallback of
        # delta-net-base.cpp, with its far larger intermediates, is not what these builds allocate.
        conv_dim = arch.ssm.d_state * (2 * arch.ssm.n_group + arch.ssm.n_head)
        p_ffn = max(p_ffn, n_ub * (f32 * (4 * e + 3 * conv_dim) + mask * n_kv))
    if arch.arch == "granitehybrid" and arch.ssm is not None:
        p_ffn = max(p_ffn, _mamba2_layer_bytes(arch, settings, n_ub) + n_ub * mask * n_kv)
    if msa_runs(arch, settings):
        _, streams = context_cells(settings)
        p_ffn = max(p_ffn, msa_layer_bytes(arch, n_ub, n_kv, streams))
    if arch.mla is not None and arch.arch in MLA_ARCHS:
        mla_out, mla_layer = mla_parts(arch, n_ub, n_out, n_kv, settings.flash_attn, cache_type(settings.cache_type_k))
        return mla_out, max(p_ffn, mla_layer)

    if settings.flash_attn:
        return p_out, p_ffn

    n_head = arch.max_heads()
    kv_w = max((sum(w) for w in kv_widths(arch)), default=0)
    q_width = n_head * arch.head_dim_k_eff
    if arch.arch == "gemma4":
        # Gemma 4's full-attention layer: the scores' output and its merged copy are a query wide
        # (32 x 512 on the 31B), not a KV row: measured on Gemma 4 31B / 26B-A4B dry runs.
        kv_w = q_width
    scores = n_kv * (n_head + 1)
    if isinstance(arch.n_head, list) and swa_cells is not None:
        # Per-layer heads with a window-sized SWA cache (Laguna: more heads on its sliding-window
        # layers): the widest layer's scores over its own cache.
        scores = memo_per_arch(
            arch,
            ("scores", n_kv, swa_cells),
            lambda: max(
                (arch.heads(i) + 1) * (swa_cells if arch.is_swa_layer(i) else n_kv)
                for i in range(arch.n_layer)
                if arch.is_attention_layer(i)
            ),
        )
    p_attn = n_ub * f32 * scores + n_ub * f32 * (5 * e + kv_w)
    if q_width > e or arch.arch == "llama":
        # q and its roped copy are a query wide, not an embedding: wider on Qwen3-MoE (32 x 128 heads
        # on 2048; exact on dry runs of Qwen3-30B-A3B and Qwen3-235B-A22B), narrower on Mistral Nemo
        # (32 x 128 on 5120; exact at 4k-128k cells).
        p_attn += n_ub * f32 * 2 * (q_width - e)
    if arch.arch == "phi3":
        # Phi-3's fused QKV: q, k and v are views of one product (llm_build_phi3), two embedding rows
        # fewer (exact on Phi-3 mini dry runs at 1k-128k cells).
        p_attn -= n_ub * f32 * 2 * e
    if arch.arch == "gemma3n":
        # Beside the attention: the AltUp predictions (4 rows), LAuReL's output and the per-layer inputs.
        p_attn += n_ub * f32 * (5 * e + arch.n_embd_per_layer * arch.n_layer)
    if swa_cells is not None and arch.arch in ("gemma2", "gemma3", "gemma3n", "gemma4", "llama4"):
        # The scores are reserved beside the SWA mask (f32 without flash attention): measured on
        # Gemma-3-4B/12B dry runs, and on Gemma 2 2B at 32k cells (not at 8k: up to 2% high there).
        p_attn += n_ub * swa_cells * f32
    return p_out, max(p_ffn, p_attn)


def _gemma3n_layer_floats(arch: Architecture, ff: int) -> int:
    """Floats per token alive at a Gemma 3n layer's peak (llama_model_gemma3n::graph): the per-layer
    inputs of every layer ([n_embd_per_layer, n_tokens, n_layer], alive through the whole graph), and
    either the FFN's up and gate rows with gaussian_topk's centred copy beside the AltUp predictions
    (4 rows), the attention + LAuReL residual and the FFN's normed input, or altup_predict's three
    stream-wide tensors (the layer input, its product with the coefficients and that product's
    contiguous copy: 4 rows each). Where ggml's allocator leaves holes beyond this is the measured
    allowance's part."""
    e = arch.n_embd
    return arch.n_embd_per_layer * arch.n_layer + max(3 * ff + 6 * e, 3 * GEMMA3N_ALTUP * e)


def _granite_moe_floats(arch: Architecture) -> int:
    """Floats per token at the peak of Granite 4.0-H's mixture-of-experts block
    (llama_model_granite_hybrid::graph::build_layer_ffn).

    build_moe_ffn makes the experts' up, gate and SwiGLU rows (n_used x ff_exp each, in that order),
    then their down projection (n_used x n_embd). Two embedding rows freed before the block, less the
    router's logits and their argsort (n_expert each) placed there, leave a hole the up rows take when
    they fit; the gate and SwiGLU rows then go above, else all three do. The down projection takes the
    hole the rows freed below the SwiGLU product leave when it fits there; when it is wider, as on
    Granite 4.0-H-Small's size (10 x 4096 against 10 x 768), it lands above it. The shared expert runs
    once the routed output is summed, so its three rows (ff_shexp each) are never alive beside them.
    Five embedding rows stay below either: the block's input, its normed copy (kept for the shared
    expert), that hole and one more row the allocator leaves. Exact on no-alloc dry runs with n_embd
    2048-4096, 8-16 of 64 or 72 experts 512-3072 wide (the up rows fit below 2 x 4096 - 2 x 72 = 8,048
    floats: 8,040 did, 8,050 did not) and shared experts 0-32,768 wide, and on the 64-expert test
    shape."""
    moe = arch.moe
    assert moe is not None
    e = arch.n_embd
    routed = moe.n_expert_used * moe.expert_ff
    down = moe.n_expert_used * e
    rows = 2 if routed <= 2 * e - 2 * moe.n_expert else 3
    routed_peak = rows * routed + (down if down > (rows - 1) * routed else 0)
    return max(routed_peak, 3 * moe.shared_ff) + 5 * e


def _mamba2_layer_bytes(arch: Architecture, settings: Settings, n_ub: int) -> int:
    """The Mamba-2 mixer's peak (llm_build_mamba_base::build_mamba2_layer, src/models/mamba-base.cpp), at
    its gated output (ggml_swiglu_split): per token the residual stream, six rows of d_inner (z's share
    of the input projection, the convolved x, the scan's y, y + x D, the contiguous z and the gated
    product), eight of the groups' d_state (B and C in the projection, the convolution's input and
    output, and its activation) and the heads' dt; per sequence the scan's new state (d_state x
    d_inner). Fitted on dry runs of granitehybrid shapes with n_embd 768 and 1536 at ubatch 256 and 512,
    where it is llama.cpp's per-token slope to the float; what a sequence adds beyond the state is the
    measured allowance's part."""
    ssm = arch.ssm
    assert ssm is not None
    groups = ssm.n_group * ssm.d_state
    _, n_seqs = context_cells(settings)
    per_token = arch.n_embd + 6 * ssm.d_inner + 8 * groups + ssm.n_head
    return 4 * (n_ub * per_token + n_seqs * ssm.d_state * ssm.d_inner)


def offload_peak(
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
    n_ub = settings.graph_tokens
    n_out = settings.graph_outputs
    f32 = 4
    n_layer = arch.n_layer
    # Host-resident layers are the first ones (-ngl offloads the last): a prefix of the layers, as are
    # the layers whose experts --n-cpu-moe keeps in host memory.
    host_end = next((i for i in range(n_layer) if layer_dev[i] != -1), n_layer)
    matmul_best, expert_best = _offload_prefix_peaks(arch, totals, n_ub)
    best = max(matmul_best[host_end], expert_best[max(host_end, cpu_moe)])
    if layer_dev[n_layer] == -1 and totals.output_head[0]:
        size, k, n = totals.output_head
        best = max(best, size + n_out * f32 * (k + n))
    if not best:
        return 0
    return best + n_ub * arch.n_embd * f32 + gpu_masks


def _offload_prefix_peaks(arch: Architecture, totals: TensorTotals, n_ub: int) -> tuple[list[int], list[int]]:
    """For each n, the largest copied weight plus its product's input and output over the first n
    layers: (non-expert matrices, routed-expert stacks), remembered per tensor totals and ubatch."""

    def make() -> tuple[list[int], list[int]]:
        n_used = arch.moe.n_expert_used if arch.moe is not None else 1
        matmul, expert = [0], [0]
        for layer in range(arch.n_layer):
            size, k, n = totals.largest_matmul[layer]
            matmul.append(max(matmul[-1], size + n_ub * 4 * (k + n) if size else 0))
            size, k, n = totals.largest_expert[layer] if totals.largest_expert else (0, 0, 0)
            expert.append(max(expert[-1], size + n_used * n_ub * 4 * (k + n) if size else 0))
        return matmul, expert

    return memo_per_object(totals, ("offload-prefix", n_ub), make)


def fa_scratch_bytes(arch: Architecture, settings: Settings, caches: Sequence[KVCacheDetail], backend: str) -> int:
    """ggml-cuda's flash attention converts a quantized K/V view of one layer to f16 in its pool
    (launch_fattn, ggml/src/ggml-cuda/fattn-common.cuh): the largest layer at the full KV length."""
    if not (settings.flash_attn and backends.converts_quantized_kv(backend)):
        return 0
    quant_k = is_quantized(cache_type(settings.cache_type_k))
    quant_v = is_quantized(cache_type(settings.cache_type_v))
    if not (quant_k or quant_v):
        return 0
    widths = kv_widths(arch)
    cells = max((c.cells for c in caches), default=0)
    k_w = max((w[0] for w in widths), default=0) if quant_k else 0
    v_w = max((w[1] for w in widths), default=0) if quant_v else 0
    return cells * (k_w + v_w) * 2


def host_staging_bytes(arch: Architecture, settings: Settings) -> int:
    n_ub = settings.graph_tokens
    return n_ub * arch.n_embd * 4 + n_ub * 16
