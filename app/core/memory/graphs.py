"""Compute-buffer terms of the graphs with their own structure, and the measured allowance for ggml's
allocator placement.

Multi-head latent attention (DeepSeek-V2/V3, Kimi K2, GLM-4.7-Flash: ``llama_model_deepseek2::graph``;
Mistral 4, whose ``llama_model_mistral4`` reuses that graph and its tensors, src/models/models.h)
and DeepSeek sparse attention (DeepSeek-V3.2, GLM-5: ``llama_model_deepseek32::graph``,
``llama_model_glm_dsa::graph``) keep their own set of tensors alive at the peak: the query before and
after absorption into the latent space, the attention scores over every head without flash attention,
and, for sparse attention, one all-zero top-k buffer per layer that the graph creates as a leaf (so the
allocator places all of them before the first layer runs: ``build_attn`` with ``top_k``,
src/llama-graph.cpp).

ggml's allocator (``ggml_gallocr``, ggml/src/ggml-alloc.c) places each tensor in the best-fitting
free block; where the last layer's hidden state lands depends on the holes earlier tensors left, and
the logits go above it. The modelled peak is the tensors alive at it; ``ALLOWANCE`` holds, per
architecture, flash-attention mode and cache size, the largest shortfall of that model against
llama.cpp's own reservation over a grid of ubatches and sequence counts
(``scripts/fit_compute_allowance.py`` measures it with the vendored llama.cpp's dry run), so the
estimate is not below llama.cpp on those settings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from app.core.memory.kv import cache_type, context_cells, graph_key, memo_per_arch
from app.core.memory.records import Settings
from app.core.model.architecture import Architecture
from app.core.model.catalog import RESOURCES_DIR
from app.core.model.tensors import GGMLType, is_quantized, row_bytes

F32 = 4

# Architectures whose attention is DeepSeek's multi-head latent attention (mistral4: deepseek2's graph).
MLA_ARCHS = frozenset({"deepseek2", "mistral4", "deepseek32", "glm-dsa", "kimi-linear"})

ALLOWANCE_PATH = RESOURCES_DIR / "compute_allowance.json"
# The cache sizes (cells per stream of the full-attention cache) and ubatches the allowance is measured at;
# a model whose trained context lies between two of these sizes is measured there too (its own cells).
ALLOWANCE_CELLS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
ALLOWANCE_UBATCHES = (128, 512, 2048)
MEASURED_STREAMS = 4  # the sequences of the "several streams" rows
# Its rows: flash attention or not, with one stream or with several sequences in streams of their
# own, with a full-size or a window-sized SWA cache (--no-swa-full), llama-cpp-python's logits for the
# whole ubatch or llama-server's for its slots only, an f16 or a quantized K cache: 32 rows, each one
# list per ubatch and one value per cache size.
ALLOWANCE_ROWS = tuple(
    ", ".join(filter(None, (fa, streams, window, logits, cache)))
    for cache in ("", "quantized K cache")
    for logits in ("", "logits for the slots only")
    for window in ("", "window-sized SWA cache")
    for streams in ("one stream", "several streams")
    for fa in ("flash attention", "no flash attention")
)

Table = tuple[tuple[tuple[int, ...], ...], ...]


@dataclass(frozen=True)
class MeasuredAllowance:
    """One model's measured table, with what identifies its shapes and the cache sizes its values are
    at: ALLOWANCE_CELLS, with the model's trained context among them where it lies between two."""

    key: str
    n_embd: int
    n_vocab: int
    table: Table
    cells: tuple[int, ...] = ALLOWANCE_CELLS

    def on_grid(self) -> Table:
        """The table at ALLOWANCE_CELLS only."""
        keep = [self.cells.index(c) for c in ALLOWANCE_CELLS]
        return tuple(tuple(tuple(per_ub[i] for i in keep) for per_ub in row) for row in self.table)


def load_allowance(path: Path = ALLOWANCE_PATH) -> dict[str, MeasuredAllowance]:
    """The measured tables by catalog model (resources/compute_allowance.json, written by
    scripts/fit_compute_allowance.py): floats per ubatch token, by row, ubatch and cache size."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    return {
        model_id: MeasuredAllowance(
            entry["key"],
            int(entry["n_embd"]),
            int(entry["n_vocab"]),
            _complete(tuple(tuple(tuple(int(v) for v in cells) for cells in row) for row in entry["floats_per_token"])),
            tuple(int(c) for c in entry.get("cells", ALLOWANCE_CELLS)),
        )
        for model_id, entry in raw["models"].items()
    }


def _complete(table: Table) -> Table:
    """All ALLOWANCE_ROWS: a table of 4, 8 or 16 rows lets its rows stand for the ones after them."""
    return tuple(table[r % len(table)] for r in range(len(ALLOWANCE_ROWS)))


def widest(tables: list[Table]) -> Table:
    """The larger value at every entry of ``tables``."""
    rows = [[t[r] for t in tables] for r in range(len(ALLOWANCE_ROWS))]
    return tuple(
        tuple(tuple(max(vals) for vals in zip(*per_ub, strict=True)) for per_ub in zip(*row, strict=True))
        for row in rows
    )


def by_architecture(models: dict[str, MeasuredAllowance]) -> dict[str, Table]:
    """Per architecture: the widest of its measured models' tables, for any model not measured, with
    no negative entry: a correction measured on other shapes may not hold for this one, so a model
    not measured keeps its modelled peak at least."""
    keys: dict[str, list[Table]] = {}
    for m in models.values():
        keys.setdefault(m.key, []).append(m.on_grid())
    return {
        key: tuple(tuple(tuple(max(v, 0) for v in per_ub) for per_ub in row) for row in widest(tables))
        for key, tables in keys.items()
    }


def allowance_key(arch: Architecture) -> str:
    """The ALLOWANCE entry of ``arch``: its llama.cpp architecture, with Llama-graph models whose
    attention is narrower than the embedding (Mistral Nemo: 32 x 128 on 5120) apart, since no query-sized
    hole can take their last hidden state and it lands above the attention's tensors at small contexts."""
    if arch.arch == "llama" and arch.max_heads() * arch.head_dim_k_eff < arch.n_embd:
        return "llama-narrow-attention"
    return arch.arch


def measured_tables(arch: Architecture) -> list[MeasuredAllowance]:
    """The tables measured on ``arch`` itself: its catalog model's, or, for a file of a measured model
    under another name (its GGUF's general.name), those of the models with its shapes (remembered per
    architecture: the advisor's sweeps ask it for every estimate)."""
    return memo_per_arch(arch, ("measured-tables",), lambda: _measured_tables(arch))


def _measured_tables(arch: Architecture) -> list[MeasuredAllowance]:
    shape = (allowance_key(arch), arch.n_embd, arch.n_vocab)
    own = MODEL_ALLOWANCE.get(arch.id)
    if own is not None and (own.key, own.n_embd, own.n_vocab) == shape:
        return [own]
    return [m for m in MODEL_ALLOWANCE.values() if (m.key, m.n_embd, m.n_vocab) == shape]


def allowance_row(
    flash_attn: bool, streams: int, window: bool = False, few_logits: bool = False, quantized: bool = False
) -> int:
    """The row of an ALLOWANCE entry that applies (``window``: a window-sized SWA cache; ``few_logits``:
    logits reserved for fewer rows than the ubatch, as llama-server does; ``quantized``: a quantized K
    cache)."""
    return (
        (0 if flash_attn else 1)
        + (2 if streams > 1 else 0)
        + (4 if window else 0)
        + (8 if few_logits else 0)
        + (16 if quantized else 0)
    )


def _neighbours(grid: tuple[int, ...], n: int) -> tuple[int, ...]:
    """The indices of ``grid`` whose measurement covers ``n``: its own, or the two around it (the
    first or the last beyond the grid)."""
    if n <= grid[0]:
        return (0,)
    if n >= grid[-1]:
        return (len(grid) - 1,)
    for i, g in enumerate(grid):
        if n == g:
            return (i,)
        if n < g:
            return (i - 1, i)
    return (len(grid) - 1,)


def measured_at(arch: Architecture, n_kv: int) -> bool:
    """Whether ``arch``'s allowance was measured at ``n_kv`` cells (or beyond the grid, where it scales):
    its own sizes where its model was measured, else ALLOWANCE_CELLS."""
    tables = measured_tables(arch)
    cells = set(ALLOWANCE_CELLS).union(*(m.cells for m in tables))
    return n_kv in cells or n_kv <= ALLOWANCE_CELLS[0] or n_kv >= ALLOWANCE_CELLS[-1]


def allowance_per_token(
    arch: Architecture,
    n_kv: int,
    n_ub: int,
    flash_attn: bool,
    streams: int = 1,
    window: bool = False,
    few_logits: bool = False,
    quantized: bool = False,
    smallest_cache: bool = False,
) -> float:
    """The measured allowance (floats per ubatch token) at ``n_kv`` cells per stream and ``n_ub`` tokens
    per ubatch: the value measured at those sizes, or the largest of the measured sizes around them
    (the model's own sizes: its trained context is one where it lies between two of ALLOWANCE_CELLS;
    ``smallest_cache``: the one measured at the smallest cache, whatever ``n_kv``). Negative where the
    modelled peak was measured above llama.cpp's everywhere around."""
    key = allowance_key(arch)
    measured = [(m.cells, m.table) for m in measured_tables(arch)]
    tables = measured or ([(ALLOWANCE_CELLS, ALLOWANCE[key])] if key in ALLOWANCE else [])
    if not tables:
        return 0.0
    r = allowance_row(flash_attn, streams, window, few_logits, quantized)
    # The largest over the tables (several models of these shapes) and the measured sizes around.
    ubs = _neighbours(ALLOWANCE_UBATCHES, n_ub)
    value = max(
        t[r][u][c] for cells, t in tables for u in ubs for c in ((0,) if smallest_cache else _neighbours(cells, n_kv))
    )
    # Beyond the largest cache measured a positive allowance (a mask kept below the logits) grows with
    # the cache; a negative one (a modelled term measured high) does not.
    return value * n_kv / ALLOWANCE_CELLS[-1] if value > 0 and n_kv > ALLOWANCE_CELLS[-1] else float(value)


def allowance_bytes(arch: Architecture, settings: Settings, n_kv: int) -> int:
    """The measured placement allowance for ``arch`` under ``settings`` against ``n_kv`` cells per stream
    of its full-attention cache (bytes), remembered per architecture and graph settings."""
    key = ("allowance", *graph_key(settings), n_kv)
    return memo_per_arch(arch, key, lambda: _allowance_bytes(arch, settings, n_kv))


def _allowance_bytes(arch: Architecture, settings: Settings, n_kv: int) -> int:
    n_ub = settings.reserve_ubatch  # the measured ubatch; the graph's tokens (rounded to the sequences) scale it
    n_tokens = settings.graph_tokens
    _, streams = context_cells(settings)
    window = memo_per_arch(arch, ("uses-swa",), lambda: arch.uses_swa) and not settings.swa_full
    few = settings.n_outputs_max < n_ub
    quantized = is_quantized(cache_type(settings.cache_type_k))
    # MiniMax-M3 with a unified cache over several sequences attends densely (flash attention on, one
    # stream), as no measured row does beyond the smallest cache, where sparse attention's terms are a
    # few MiB: the allowance measured there stands for the dense graph's, without its negative
    # corrections (they were up to 3% too deep at 32k-128k cells on dry runs).
    if is_msa(arch) and settings.flash_attn and not msa_runs(arch, settings):
        value = allowance_per_token(arch, n_kv, n_ub, True, streams, window, few, quantized, smallest_cache=True)
        return int(n_tokens * F32 * max(value, 0.0))
    value = allowance_per_token(arch, n_kv, n_ub, settings.flash_attn, streams, window, few, quantized)
    if arch.indexer is not None and streams not in (1, MEASURED_STREAMS):
        # A sparse-attention indexer's graph at a number of sequences the table was not measured at
        # (MiniMax-M3's shape was 7-9% under at two and three with the four-sequence row): the larger of
        # the one- and the several-stream rows, never a correction below the modelled peak.
        one = allowance_per_token(arch, n_kv, n_ub, settings.flash_attn, 1, window, few, quantized)
        value = max(value, one, 0.0)
    return int(n_tokens * F32 * value)


def is_msa(arch: Architecture) -> bool:
    """MiniMax sparse attention (MiniMax-M3): an indexer that ranks blocks of positions."""
    return arch.indexer is not None and arch.indexer.block_size is not None


def msa_runs(arch: Architecture, settings: Settings) -> bool:
    """Whether MiniMax sparse attention runs: only with flash attention and a stream per sequence
    (msa_enabled in llama_model_minimax_m3::graph); otherwise its layers attend densely."""
    return is_msa(arch) and settings.flash_attn and (settings.parallel_sequences == 1 or not settings.kv_unified)


# Floats per ubatch token added to the modelled peak. Where the last hidden state and the logits land
# depends on the holes the attention mask and the layers' tensors leave, which changes with the mask's
# size, the ubatch, the cache type and the mask's split into streams in steps no simple rule follows:
# GLM-4.5-Air keeps its f16 mask below the logits at 2k-4k and at 64k cells, not at 16k-32k;
# Nemotron-H keeps all of it at up to 16k cells, none at 32k, and at 128k none with ubatch 512 but
# three quarters with 2048; Mistral Nemo's last hidden state lands above the attention's tensors up to
# 8k cells with one sequence. Measured by scripts/fit_compute_allowance.py as the largest
# (llama.cpp - model) / (n_ubatch x 4 bytes) over both --swa-full modes and cache types, per catalog
# model, with llama-cpp-python's logits reservation and llama-server's; any other model of an
# architecture gets the widest of its measured models' (no negative entry); architectures not listed need none.
MODEL_ALLOWANCE: dict[str, MeasuredAllowance] = load_allowance()
ALLOWANCE: dict[str, Table] = by_architecture(MODEL_ALLOWANCE)


def mla_parts(
    arch: Architecture, n_ub: int, n_out: int, n_kv: int, flash_attn: bool, cache_k_type: GGMLType
) -> tuple[int, int]:
    """(output head peak, layer peak) of an MLA graph, bytes.

    Output: the logits of ``n_out`` rows above the token embeddings and the last hidden state, which
    lands above two more embedding rows (measured: Kimi K2, DeepSeek-V3 at 2k-32k cells).
    Layer, with flash attention: the normed input, q_pe, q (nope + rope), the absorbed query, Qcur
    (latent + rope per head) and the mask; without: the scores of every head over the whole cache
    (f32), Qcur, the freed q and absorbed query below it, and the latent V the graph makes
    contiguous (``v_cont``, in the cache type)."""
    mla = arch.mla
    assert mla is not None
    e = arch.n_embd
    h = arch.max_heads()
    q = h * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
    absorbed = h * mla.kv_lora_rank
    q_cur = h * (mla.kv_lora_rank + mla.qk_rope_head_dim)
    p_out = n_out * F32 * arch.n_vocab + n_ub * F32 * 4 * e
    if flash_attn:
        layer = n_ub * F32 * (5 * e + h * mla.qk_rope_head_dim + q + absorbed + q_cur) + n_ub * n_kv * 2
    else:
        layer = n_ub * F32 * (2 * e + n_kv + q + h * (mla.kv_lora_rank + mla.qk_nope_head_dim + mla.qk_rope_head_dim))
        layer += n_ub * F32 * (q_cur + h * n_kv) + row_bytes(cache_k_type, mla.kv_lora_rank) * n_kv
    ix = arch.indexer
    if ix is not None and mla.q_lora_rank:
        # Sparse attention: the low-rank query (kept for the indexer), the indexer's own mask and one
        # f32 top-k buffer per layer, all placed before the first layer (graph leaves); top-k keeps at
        # most the cache's cells (n_top_k = min(n_kv, indexer_top_k): llama_model_deepseek32::graph).
        trunk = arch.n_layer - arch.n_nextn_layers
        layer += n_ub * F32 * (mla.q_lora_rank + trunk * min(ix.top_k, n_kv)) + n_ub * n_kv * 2
    return p_out, layer


def msa_layer_bytes(arch: Architecture, n_ub: int, n_kv: int, streams: int) -> int:
    """A MiniMax sparse attention layer's peak with flash attention (``llama_model_minimax_m3::graph``,
    batch path, one stream at a time), bytes. Per cell and token: the block mask expanded to cells for
    every indexer head (``ggml_get_rows`` of the block mask, F32) beside its contiguous transpose (F32),
    with the f32 copy of the attention mask (``msa_mf``) and the f16 mask itself over every stream; per
    cell and stream the cell -> block map (I32); per token the residual, the normed input and the
    projected K/V rows (three embedding rows) and the query twice (Q and its normed, roped copy). Exact
    to a few hundred floats per token on dry runs of two minimax-m3 shapes at 16k-256k cells, one to four
    streams, ubatch 128-2048; the rest (where the allocator's holes put the block tensors) is the
    measured allowance's part."""
    ix = arch.indexer
    assert ix is not None
    n_tps = n_ub // max(1, streams)
    q_width = arch.max_heads() * arch.head_dim_k_eff
    per_cell = n_tps * ix.n_head * 2 * F32 + n_ub * (F32 + 2) + streams * 4
    return n_kv * per_cell + n_ub * F32 * (3 * arch.n_embd + 2 * q_width)
