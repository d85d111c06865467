"""Compute buffers of a graph split across devices: what each GPU and the host reserve when llama.cpp's
scheduler (ggml_backend_sched) cuts the worst-case graph into splits, one per run of nodes on one
device, and copies each split's inputs onto its device.

The single-graph peaks come from :mod:`app.core.memory.compute`; this module adds what the splits
add: the copies a split's inputs need (attention masks, the hidden state, Gemma's per-layer inputs,
caches read across devices), which the scheduler allocates at the start of the split and, with
pipeline parallelism, keeps in ``copies`` sets that are never freed."""

from __future__ import annotations

from collections.abc import Sequence

from app.core.memory import backends
from app.core.memory.compute import compute_parts, host_staging_bytes, offload_peak
from app.core.memory.kv import graph_key, layer_cache_bytes, memo_per_arch, shared_kv_copy_bytes
from app.core.memory.layers import TensorTotals
from app.core.memory.records import KVCacheDetail, Settings
from app.core.model.architecture import Architecture


def device_compute_bytes(
    arch: Architecture,
    settings: Settings,
    caches: Sequence[tuple[KVCacheDetail, list[int]]],
    layer_dev: tuple[int, ...],
    n_dev: int,
    backend: str,
    totals: TensorTotals,
    cpu_moe: int,
    masks: int,
    cells: tuple[int, int | None],
) -> list[int]:
    """Compute buffer bytes per device (GPUs in order, the host last) for ``layer_dev`` (each layer's
    device, -1 for the host, the output head last); ``cells``: (full cache cells, sliding-window
    cells or None)."""
    n_layer = arch.n_layer
    kv_cells, swa_cells = cells
    p_out, p_layers = compute_parts(arch, settings, kv_cells, swa_cells)
    peak = max(p_out, p_layers)
    n_ub = settings.graph_tokens
    row = n_ub * arch.n_embd * 4
    compute = [0] * (n_dev + 1)
    gpu_used = sorted(set(layer_dev) - {-1})
    out_dev = layer_dev[n_layer]
    all_on_gpus = n_dev > 0 and -1 not in layer_dev
    gpu_build = n_dev > 0 and backend != "cpu"
    copies = backends.pipeline_copies(backend, len(gpu_used), all_on_gpus, cpu_moe > 0) if gpu_build else 1
    p_headless = layers_peak(arch, settings, kv_cells, swa_cells) if any(g != out_dev for g in gpu_used) else 0
    kv_copies = shared_kv_copy_bytes(arch, caches, layer_dev) if arch.n_kv_shared_layers else {}
    for g in gpu_used:
        head = g == out_dev
        # Each GPU reserves its own part of the graph: the logits only where the output head is
        # (public two-GPU logs: 256 MiB without the head, 363 MiB with it, Qwen2.5-32B at 2k).
        need = max(p_layers, p_out) if head else p_headless
        copied = kv_copies.get(g, 0)
        if copied:
            # With flash attention the copies lie below the first shared layer's intermediates;
            # without it, measured peaks reach up to 22% above those (at 8k-32k cells), below the
            # copies plus the output head's peak.
            need = max(need, copied + (p_layers if settings.flash_attn else peak))
        if arch.n_embd_per_layer:
            output_phase = per_layer_input_gpu_bytes(arch, settings, masks, p_layers, head)
            if head and copied:
                # The last shared layers' cache copies can stay below the logits (Gemma 4 E4B, 10 of 43
                # layers at 8k cells and ubatch 2048: 36 MiB above the output phase alone, one full
                # layer's copy being 32 MiB): two of the largest layer's caches are counted there.
                largest = max(layer_cache_bytes(d, group) for d, group in caches)
                output_phase += min(copied, 2 * largest)
            need = max(need, output_phase)
        if copies > 1:
            piped = pipeline_gpu_bytes(arch, settings, masks, copied, p_layers if head else p_headless, head, copies)
            need = max(need + (copies - 1) * (masks + row), piped)
        compute[g] = need
    if gpu_build:
        inputs = row + copies * (n_ub * 16 + masks)
        if copies > 1:
            # The host's inputs and the token embeddings it looks up, in every copy (measured over two RPC
            # devices: exact with flash attention on Llama 3.2 1B, Qwen3 0.6B and Gemma 3 1B; without it
            # one or two masks more, f32).
            inputs += copies * row + (0 if settings.flash_attn else 2 * max_mask_bytes(settings, caches))
        if arch.n_embd_per_layer:
            # Gemma 3n's and 4's per-layer inputs are looked up where their table is, in host memory (an
            # input-layer tensor), and scaled there beside the scaled token embeddings (F32): measured
            # over an RPC device, within 1 MiB above llama.cpp's host compute buffer (tests/test_rpc.py).
            inputs += n_ub * (arch.n_embd_per_layer * arch.n_layer + arch.n_embd) * 4
        if all_on_gpus:
            compute[-1] = inputs
        else:
            compute[-1] = inputs + host_attention_bytes(arch, settings, kv_cells)
            if not backends.offloads_ops(backend, n_ub):
                compute[-1] = max(compute[-1], host_layers_bytes(arch, settings, kv_cells, swa_cells))
        if backends.offloads_ops(backend, n_ub):
            offload = offload_peak(arch, settings, totals, layer_dev, cpu_moe, masks if gpu_used else 0)
            compute[0] = max(compute[0], offload)
    elif not all_on_gpus or not gpu_used:
        compute[-1] = peak
    else:
        compute[-1] = host_staging_bytes(arch, settings)
    return compute


def max_mask_bytes(settings: Settings, caches: Sequence[tuple[KVCacheDetail, list[int]]]) -> int:
    """The largest single attention mask (n_kv x n_ubatch, f16 with flash attention, f32 without)."""
    per = 2 if settings.flash_attn else 4
    return max((d.cells for d, _ in caches), default=0) * settings.graph_tokens * per


def pipeline_gpu_bytes(
    arch: Architecture, settings: Settings, masks: int, kv_copied: int, p_layers: int, head: bool, copies: int
) -> int:
    """A GPU's compute buffer under pipeline parallelism (several GPUs, every layer offloaded): the
    scheduler keeps ``copies`` sets of each split's inputs (ggml_backend_sched_split_graph: "add input
    copies as leafs so that they are allocated first", marked as outputs so they are never freed): the
    masks, the hidden state handed over, positions and cache indices, Gemma's per-layer inputs and the
    caches read across devices. The layers' peak sits above them, less the one set a single graph already
    counts; on the GPU with the output head, the logits sit above them too, with five embedding rows
    (and four rows of the query's excess over the embedding; seven rows more without flash attention)
    below them.

    Measured over two RPC devices at 4k-32k cells, ubatch 512-2048 (tests/test_rpc.py): with flash
    attention the GPU without the head exact on Llama 3.2 1B and Qwen3 0.6B, the one with it exact on
    Llama 3.2 1B, Qwen3 0.6B and Gemma 3 1B, where the single-graph figures plus three copies of masks
    and hidden state were up to 8% under (Gemma 4 E2B: up to 70%, its shared layers reading the other
    GPU's caches); without flash attention and on Gemma 4 E2B at or above, by up to 30%."""
    n_ub = settings.graph_tokens
    e = arch.n_embd
    per_layer = arch.n_embd_per_layer * arch.n_layer
    q_excess = max(0, arch.max_heads() * arch.head_dim_k_eff - e)
    # Per token: the hidden state, the per-layer inputs, and 64 bytes of small inputs (positions, output
    # ids, each cache's K and V indices: int64).
    inputs = masks + n_ub * (e + 16 + per_layer) * 4
    bottom = copies * (inputs + kv_copied)
    # Above the copies: the layers' own peak, with (measured) three more per-layer-input rows for the
    # prologue that projects, normalises and sums them, one row of the query's excess over the embedding
    # (Gemma 3 270M's 384), and without flash attention three embedding rows and four of the query's
    # excess more (four more rows on the GPU with the head, which selects the output rows in its last
    # layer).
    above = 3 * per_layer + q_excess + (0 if settings.flash_attn else (7 if head else 3) * e + 4 * q_excess)
    layers = bottom - inputs + p_layers + n_ub * above * 4
    if not head:
        return layers
    beside = 5 * e + 4 * q_excess + (0 if settings.flash_attn else 7 * e)
    return max(layers, bottom + settings.graph_outputs * arch.n_vocab * 4 + n_ub * beside * 4)


def per_layer_input_gpu_bytes(arch: Architecture, settings: Settings, masks: int, p_layers: int, head: bool) -> int:
    """A lower bound on the compute buffer of a GPU holding layers of a model with per-layer inputs
    (Gemma 3n, Gemma 4 E2B/E4B); ``head``: it holds the output head too.

    Their per-layer inputs are looked up in host memory (the table is an input-layer tensor), so the
    GPU's part of the graph begins with copies of them and of the attention masks, which ggml-backend's
    scheduler places at the start of the split (ggml_backend_sched_split_graph: "allocated by ggml-alloc
    at the start of the split"). They stay below everything the layers allocate, and the logits land
    above the last layer's output: the masks, the per-layer inputs (n_embd_per_layer x n_layer per
    token), three embedding rows, the small inputs (positions, output ids) and, without flash
    attention, the last attention's output (a query wide) lie below them. Without flash attention the
    layers' own peak also sits two embedding rows above the CPU's.

    Measured over an RPC device (GGML_RPC no-alloc dry runs of the vendored llama.cpp, 2k-32k cells,
    ubatch 128-2048, with and without flash attention): at or above every figure for Gemma 4 E2B and
    E4B and the Gemma 3n 30- and 35-layer shapes, exact to 64 bytes per token on E4B and E2B at 8k
    cells with flash attention (two rows on E2B, three on E4B at the other sizes: ggml's holes), where
    the CPU-measured figures alone were up to 12% under."""
    n_ub = settings.graph_tokens
    row = n_ub * arch.n_embd * 4
    layers = p_layers + (0 if settings.flash_attn else 2 * row)
    if not head:
        return layers
    beside = arch.n_embd_per_layer * arch.n_layer + 16
    if not settings.flash_attn:
        beside += arch.max_heads() * arch.head_dim_k_eff
    return max(layers, settings.graph_outputs * arch.n_vocab * 4 + masks + n_ub * beside * 4 + 3 * row)


def layers_peak(arch: Architecture, settings: Settings, kv_cells: int, swa_cells: int | None) -> int:
    """The repeating layers' peak on a device without the output head: where it was measured without the
    logits above it (the allowance of few output rows, as llama-server reserves) or with them, whichever
    is larger (the layers' part of an allowance measured under the logits is not pinned down)."""

    def peak() -> int:
        few = settings.model_copy(update={"consumer": "llama-server"})
        return max(compute_parts(arch, s, kv_cells, swa_cells)[1] for s in (settings, few))

    return memo_per_arch(arch, ("layers-peak", *graph_key(settings), kv_cells, swa_cells), peak)


def host_layers_bytes(arch: Architecture, settings: Settings, kv_cells: int, swa_cells: int | None) -> int:
    """The host's compute buffer for layers left on the CPU by a build without op offload (RPC, Metal):
    they run there whole, feed-forward block and masks included, without the output head
    (:func:`layers_peak`); a model with per-layer inputs (Gemma 3n / 4) computes them there too, beside
    the scaled token embeddings. Measured over an RPC device with 8 layers offloaded at 4k-32k cells,
    ubatch 512 and 2048: Llama 3.2 1B and Qwen3 0.6B within 0.5 MiB (96 MiB for Llama at 32k where the
    inputs and attention alone were counted, 44.5), Gemma 3 1B and Gemma 4 E2B at or above, by up to
    42% (57 MiB at ubatch 512)."""
    layers = layers_peak(arch, settings, kv_cells, swa_cells)
    if arch.n_embd_per_layer:
        layers += settings.graph_tokens * (arch.n_embd_per_layer * arch.n_layer + 2 * arch.n_embd) * 4
    return layers


def host_attention_bytes(arch: Architecture, settings: Settings, n_kv: int) -> int:
    """With layers left on the CPU, their attention runs there (its matrix products are offloaded,
    the attention itself has no weight): q and the attention output, or without flash attention
    the scores over the whole KV window."""
    n_ub = settings.graph_tokens
    q_width = arch.max_heads() * arch.head_dim_k_eff
    if settings.flash_attn:
        return 2 * n_ub * q_width * 4
    return n_ub * n_kv * 4 * (arch.max_heads() + 1)
