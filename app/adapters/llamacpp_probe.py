"""Ground truth: ask the real llama.cpp (llama-cpp-python 0.3.36) what a model would allocate.

Two layers:

* :func:`parse_llama_log` — a pure parser of llama.cpp's log text into :class:`ProbeBuffers`
  (bytes per buffer and per device, KV and recurrent caches, graph size, perf timings).
* :func:`dry_run` — runs llama.cpp in a *child* process (``python -m app.adapters.llamacpp_probe
  --json ...``) with model param ``no_alloc = true`` and ``load_mode = LLAMA_LOAD_MODE_NONE``,
  creates a context with the requested settings, and returns a :class:`DryRunResult`. An abort
  inside llama.cpp (``GGML_ASSERT``) therefore kills the child only; the caller gets a
  :class:`ProbeError`. Nothing big is allocated and a dry run takes about a second.

Precision. llama.cpp prints sizes as MiB with two decimals (``%8.2f``), so every byte figure
parsed from a ``... = X MiB`` line is ``round(X * 1048576)`` and carries an error of up to
±0.005 MiB (±5243 bytes) per line; sums of n lines carry up to n times that. The
``llama_kv_cache: size = ...`` line even formats a 32-bit float. Exact values come only from
the API (``llama_model_size``, ``llama_model_n_params``). The only 4-decimal figure is the
"compute buffer size is X MiB, matches expectation" line printed when a *really allocated*
context is freed (``real_load=True``), kept in ``compute_buffers_precise`` (±52 bytes).

What a dry run really prints (CPU-only build of llama-cpp-python 0.3.36, x86-64, REPACK = 1;
observed on gemma-3-270m Q4_K_M):

* Model buffers are *placeholders*: ``CPU model buffer size = 0.00 MiB`` and, when
  ``use_extra_bufts`` is on, ``CPU_REPACK model buffer size = 0.00 MiB``. The CPU_REPACK line
  shows that some weights would be repacked, but not how many bytes, so :attr:`DryRunResult.
  repack_bytes` is ``None`` in a dry run (the log's ``print_info: no_alloc = 1`` tells the parser
  the sizes are placeholders). There is no ``CPU_Mapped`` line: ``load_mode = none`` maps nothing.
  Use ``llama_model_size()`` (``model_size_bytes``) for the weights.
* ``KV buffer size`` lines print 0.00 MiB too (dummy buffers); the ``llama_kv_cache: size = X
  MiB (N cells, L layers, s/S seqs), K (type): X MiB, V (type): X MiB`` lines are the real sizes.
  Sliding-window models print one such line per cache, each preceded by ``llama_kv_cache_iswa:
  creating non-SWA KV cache`` / ``creating     SWA KV cache``; both are kept in ``kv_caches`` and
  summed in ``kv_cache_bytes``.
* ``CPU  output buffer size`` and ``CPU compute buffer size`` are real (the output buffer is
  actually allocated, the compute size is the scheduler's reservation).
* ``offloaded N/M layers to GPU`` is printed only by builds that support GPU offload; on the
  CPU-only build ``layers_offloaded`` is ``None``.
* ``graph: nodes = N, splits = S, ...`` (or ``graph (pp bs=.., tg bs=..): nodes = a / b, ...``
  when the prompt and token graphs differ) is printed at the end of the reservation.
* ``llama_perf_context_print`` timings appear only after decoding, so never in a dry run; the
  parser reads them when present.

With ``real_load=True`` the model is really mmapped (``load_mode = mmap``, ``no_alloc = false``)
and the context really allocated: the log then shows ``CPU_Mapped model buffer size`` (the
mapped file region, 235.16 MiB for the demo model) and ``CPU_REPACK model buffer size`` with
its true size (12.66 MiB for the demo model: anonymous memory on top of the mapping), which
becomes ``repack_bytes``. That costs real memory and time; use it on small models only.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.adapters.child_protocol import (
    STDERR_TAIL_LINES,
    WorkerProcess,
    failure_message,
    install_llama_log,
    reserve_stdout,
)
from app.adapters.cpu_topology import llama_math_threads
from app.core.common.errors import FitScopeError
from app.core.common.units import MIB, Frozen
from app.core.model.tensors import CACHE_TYPES

MIB_PRECISION_BYTES = round(0.005 * MIB)
"""Largest rounding error of one ``%.2f MiB`` figure, in bytes (5243)."""

GGML_TYPE_IDS: dict[str, int] = {name: int(t) for name, t in CACHE_TYPES.items()}
"""KV cache types llama.cpp accepts (ggml_type ids)."""



class ProbeError(FitScopeError):
    """llama.cpp could not load the model or create the context, crashed, or timed out.

    ``str(error)`` names the file and the reason; ``reason`` is llama.cpp's own words when it
    gave any, ``log`` the captured log (may be empty).
    """

    def __init__(self, message: str, *, path: str = "", reason: str = "", log: str = "") -> None:
        super().__init__(message)
        self.path = path
        self.reason = reason
        self.log = log




class KVCacheInfo(Frozen):
    """One ``llama_kv_cache: size = ...`` line (one cache; SWA models have two)."""

    kind: str = "full"
    """"full" (or the only cache), "swa", or "indexer", from the preceding "creating ..." line."""
    size_bytes: int
    cells: int
    layers: int
    n_seq_max: int
    n_stream: int
    k_type: str
    k_bytes: int
    v_type: str
    v_bytes: int


class RecurrentStateInfo(Frozen):
    """One ``llama_memory_recurrent: size = ...`` line (Mamba, RWKV, hybrid models)."""

    size_bytes: int
    cells: int
    layers: int
    n_seq_max: int
    n_rs_seq: int | None = None
    r_type: str
    r_bytes: int
    s_type: str
    s_bytes: int
    p_bytes: int = 0


class ProbeBuffers(Frozen):
    """Everything :func:`parse_llama_log` reads from a llama.cpp log, sizes in bytes.

    Byte figures come from ``%.2f MiB`` prints: each is exact to ±0.005 MiB only
    (``MIB_PRECISION_BYTES``). Buffers of the same device are summed (an SWA model prints two
    ``CPU KV buffer size`` lines).
    """

    no_alloc: bool | None = None
    """From ``print_info: no_alloc = 1``: model and KV buffer sizes are 0.00 placeholders."""
    model_buffers: dict[str, int] = {}
    kv_buffers: dict[str, int] = {}
    rs_buffers: dict[str, int] = {}
    compute_buffers: dict[str, int] = {}
    compute_buffers_precise: dict[str, int] = {}
    """From the 4-decimal "compute buffer size is X MiB, matches expectation" lines (real loads)."""
    output_buffers: dict[str, int] = {}
    kv_caches: tuple[KVCacheInfo, ...] = ()
    recurrent_states: tuple[RecurrentStateInfo, ...] = ()
    layers_offloaded: int | None = None
    layers_offloadable: int | None = None
    graph_nodes: int | None = None
    """Nodes of the prompt-processing graph (the first figure when pp and tg differ)."""
    graph_splits: int | None = None
    graph_nodes_tg: int | None = None
    graph_splits_tg: int | None = None
    n_ctx: int | None = None
    n_ctx_seq: int | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    n_seq_max: int | None = None
    flash_attn_setting: str | None = None
    """As printed by llama_context: "auto", "enabled" or "disabled"."""
    flash_attn_enabled: bool | None = None
    """The resolved choice (auto resolves to enabled/disabled during reservation)."""
    perf: dict[str, float] = {}
    """llama_perf_context_print figures: load_ms, prompt_eval_ms, prompt_eval_tokens, eval_ms,
    eval_runs, total_ms, total_tokens, graphs_reused (only the ones printed)."""

    @property
    def kv_cache_bytes(self) -> int:
        return sum(c.size_bytes for c in self.kv_caches)

    @property
    def recurrent_state_bytes(self) -> int:
        return sum(s.size_bytes for s in self.recurrent_states)

    @property
    def compute_bytes(self) -> int:
        return sum(self.compute_buffers.values())

    @property
    def output_bytes(self) -> int:
        return sum(self.output_buffers.values())

    @property
    def has_repack_buffer(self) -> bool:
        return any(name.endswith("_REPACK") for name in self.model_buffers)

    @property
    def repack_bytes(self) -> int | None:
        """Bytes of ``*_REPACK`` model buffers; None when absent or when sizes are placeholders."""
        if self.no_alloc or not self.has_repack_buffer:
            return None
        return sum(v for k, v in self.model_buffers.items() if k.endswith("_REPACK"))


def mib_to_bytes(text: str) -> int:
    """A printed MiB figure ("514.50") → bytes, rounded to int."""
    return round(float(text) * MIB)


_NUM = r"([0-9]+(?:\.[0-9]+)?)"
_RE_MODEL_BUF = re.compile(rf"(\S+) model buffer size\s*=\s*{_NUM} MiB")
_RE_KV_BUF = re.compile(rf"(\S+) KV buffer size\s*=\s*{_NUM} MiB")
_RE_RS_BUF = re.compile(rf"(\S+) RS buffer size\s*=\s*{_NUM} MiB")
_RE_COMPUTE = re.compile(rf"(\S+) compute buffer size\s*=\s*{_NUM} MiB")
_RE_COMPUTE_PRECISE = re.compile(
    rf"(\S+) compute buffer size (?:is|of)\s+{_NUM} MiB, (?:matches|does not match) expectation"
)
_RE_OUTPUT = re.compile(rf"(\S+)\s+output buffer size\s*=\s*{_NUM} MiB")
_RE_KV_CACHE = re.compile(
    rf"size =\s*{_NUM} MiB \(\s*(\d+) cells,\s*(\d+) layers,\s*(\d+)/\s*(\d+) seqs\), "
    rf"K \((\w+)\):\s*{_NUM} MiB, V \((\w+)\):\s*{_NUM} MiB"
)
_RE_RECURRENT = re.compile(
    rf"size =\s*{_NUM} MiB \(\s*(\d+) cells,\s*(\d+) layers,\s*(\d+) seqs(?:\s+(\d+) rs_seq)?\), "
    rf"R \((\w+)\):\s*{_NUM} MiB, S \((\w+)\):\s*{_NUM} MiB(?:, P \((\w+)\):\s*{_NUM} MiB)?"
)
_RE_CREATING = re.compile(r"creating\s+(non-SWA|SWA|indexer) KV cache")
_RE_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_RE_GRAPH = re.compile(r"graph(?: \(pp bs=\d+, tg bs=\d+\))?: nodes = (\d+)(?: / (\d+))?, splits = (\d+)(?: / (\d+))?")
_RE_GRAPH_NODES_OLD = re.compile(r"graph nodes\s*=\s*(\d+)")
_RE_GRAPH_SPLITS_OLD = re.compile(r"graph splits\s*=\s*(\d+)")
_RE_CPARAM = re.compile(r"^llama_context: (n_ctx|n_ctx_seq|n_batch|n_ubatch|n_seq_max)\s*=\s*(\d+)\s*$")
_RE_FA_SETTING = re.compile(r"^llama_context: flash_attn\s*=\s*(\w+)")
_RE_FA_RESOLVED = re.compile(
    r"Flash Attention (?:was auto, set to )?(enabled|disabled)|Flash Attention (not supported)"
)
_RE_NO_ALLOC = re.compile(r"print_info: no_alloc\s*=\s*(\d)")
_RE_PERF = {
    "load": re.compile(r"llama_perf_context_print:\s+load time =\s*([0-9.]+) ms"),
    "prompt_eval": re.compile(r"llama_perf_context_print: prompt eval time =\s*([0-9.]+) ms /\s*(\d+) tokens"),
    "eval": re.compile(r"llama_perf_context_print:\s+eval time =\s*([0-9.]+) ms /\s*(\d+) runs"),
    "total": re.compile(r"llama_perf_context_print:\s+total time =\s*([0-9.]+) ms /\s*(\d+) tokens"),
    "reused": re.compile(r"llama_perf_context_print:\s+graphs reused =\s*(\d+)"),
}


def _add(d: dict[str, int], key: str, value: int) -> None:
    d[key] = d.get(key, 0) + value


def parse_llama_log(text: str) -> ProbeBuffers:
    """Read llama.cpp's allocation report from its log text (pure; no llama.cpp needed).

    Every MiB figure becomes ``round(X * 1048576)`` bytes; llama.cpp prints two decimals, so
    each figure is only good to ±0.005 MiB. Unknown lines are ignored.
    """
    model: dict[str, int] = {}
    kv: dict[str, int] = {}
    rs: dict[str, int] = {}
    compute: dict[str, int] = {}
    compute_precise: dict[str, int] = {}
    output: dict[str, int] = {}
    kv_caches: list[KVCacheInfo] = []
    states: list[RecurrentStateInfo] = []
    perf: dict[str, float] = {}
    fields: dict[str, Any] = {}
    pending_kind: str | None = None

    for line in text.splitlines():
        if m := _RE_MODEL_BUF.search(line):
            _add(model, m[1], mib_to_bytes(m[2]))
        elif m := _RE_KV_BUF.search(line):
            _add(kv, m[1], mib_to_bytes(m[2]))
        elif m := _RE_RS_BUF.search(line):
            _add(rs, m[1], mib_to_bytes(m[2]))
        elif m := _RE_COMPUTE.search(line):
            _add(compute, m[1], mib_to_bytes(m[2]))
        elif m := _RE_COMPUTE_PRECISE.search(line):
            _add(compute_precise, m[1], mib_to_bytes(m[2]))
        elif m := _RE_OUTPUT.search(line):
            _add(output, m[1], mib_to_bytes(m[2]))
        elif m := _RE_CREATING.search(line):
            pending_kind = {"non-SWA": "full", "SWA": "swa", "indexer": "indexer"}[m[1]]
        elif m := _RE_KV_CACHE.search(line):
            kv_caches.append(
                KVCacheInfo(
                    kind=pending_kind or "full",
                    size_bytes=mib_to_bytes(m[1]),
                    cells=int(m[2]),
                    layers=int(m[3]),
                    n_seq_max=int(m[4]),
                    n_stream=int(m[5]),
                    k_type=m[6],
                    k_bytes=mib_to_bytes(m[7]),
                    v_type=m[8],
                    v_bytes=mib_to_bytes(m[9]),
                )
            )
            pending_kind = None
        elif m := _RE_RECURRENT.search(line):
            states.append(
                RecurrentStateInfo(
                    size_bytes=mib_to_bytes(m[1]),
                    cells=int(m[2]),
                    layers=int(m[3]),
                    n_seq_max=int(m[4]),
                    n_rs_seq=int(m[5]) if m[5] is not None else None,
                    r_type=m[6],
                    r_bytes=mib_to_bytes(m[7]),
                    s_type=m[8],
                    s_bytes=mib_to_bytes(m[9]),
                    p_bytes=mib_to_bytes(m[11]) if m[11] is not None else 0,
                )
            )
        elif m := _RE_OFFLOADED.search(line):
            fields["layers_offloaded"] = int(m[1])
            fields["layers_offloadable"] = int(m[2])
        elif m := _RE_GRAPH.search(line):
            fields["graph_nodes"] = int(m[1])
            fields["graph_nodes_tg"] = int(m[2] or m[1])
            fields["graph_splits"] = int(m[3])
            fields["graph_splits_tg"] = int(m[4] or m[3])
        elif m := _RE_GRAPH_NODES_OLD.search(line):
            fields["graph_nodes"] = int(m[1])
        elif m := _RE_GRAPH_SPLITS_OLD.search(line):
            fields["graph_splits"] = int(m[1])
        elif m := _RE_CPARAM.search(line):
            fields[m[1]] = int(m[2])
        elif m := _RE_FA_SETTING.search(line):
            fields["flash_attn_setting"] = m[1]
            if m[1] in ("enabled", "disabled"):
                fields["flash_attn_enabled"] = m[1] == "enabled"
        elif m := _RE_FA_RESOLVED.search(line):
            fields["flash_attn_enabled"] = m[1] == "enabled"
        elif m := _RE_NO_ALLOC.search(line):
            fields["no_alloc"] = m[1] == "1"
        elif "llama_perf_context_print" in line:
            if m := _RE_PERF["load"].search(line):
                perf["load_ms"] = float(m[1])
            elif m := _RE_PERF["prompt_eval"].search(line):
                perf["prompt_eval_ms"], perf["prompt_eval_tokens"] = float(m[1]), float(m[2])
            elif m := _RE_PERF["eval"].search(line):
                perf["eval_ms"], perf["eval_runs"] = float(m[1]), float(m[2])
            elif m := _RE_PERF["total"].search(line):
                perf["total_ms"], perf["total_tokens"] = float(m[1]), float(m[2])
            elif m := _RE_PERF["reused"].search(line):
                perf["graphs_reused"] = float(m[1])

    return ProbeBuffers(
        model_buffers=model,
        kv_buffers=kv,
        rs_buffers=rs,
        compute_buffers=compute,
        compute_buffers_precise=compute_precise,
        output_buffers=output,
        kv_caches=tuple(kv_caches),
        recurrent_states=tuple(states),
        perf=perf,
        **fields,
    )


# --------------------------------------------------------------------------------------------
# The dry run
# --------------------------------------------------------------------------------------------


class DryRunSettings(Frozen):
    """The settings a dry run was asked for (llama.cpp may pad n_ctx; see DryRunResult.n_ctx)."""

    n_ctx: int
    n_batch: int = 2048
    n_ubatch: int = 512
    flash_attn: bool | None = None
    type_k: str = "f16"
    type_v: str = "f16"
    n_seq_max: int = 1
    kv_unified: bool = False
    swa_full: bool = True
    n_gpu_layers: int = 0
    use_extra_bufts: bool = True
    real_load: bool = False
    n_outputs_max: int = 0  # 0: n_batch (llama-cpp-python); llama-server sets its slot count
    rpc_servers: tuple[str, ...] = ()
    """llama.cpp --rpc: HOST:PORT of RPC servers whose devices come first (app.adapters.rpc_servers)."""
    tensor_split: tuple[float, ...] = ()
    """llama.cpp --tensor-split over the devices; (): by their free memory."""


class DryRunResult(Frozen):
    """What llama.cpp reports for one model and one set of context settings; sizes in bytes.

    ``model_size_bytes`` and ``n_params`` are exact (API). Everything else is parsed from the
    log and good to ±0.005 MiB per printed figure.
    """

    gguf_path: str
    settings: DryRunSettings
    model_size_bytes: int
    n_params: int
    n_layers_total: int
    """Repeating layers (llama_model_n_layer); the GPU offload count M is n_layers_total + 1."""
    n_ctx: int
    """The context llama.cpp actually created (padded)."""
    flash_attn_enabled: bool | None
    kv_cache_bytes: int
    kv_caches: tuple[KVCacheInfo, ...]
    recurrent_state_bytes: int
    recurrent_states: tuple[RecurrentStateInfo, ...]
    compute_bytes_by_device: dict[str, int]
    compute_bytes: int
    output_bytes_by_device: dict[str, int]
    output_bytes: int
    model_buffers_by_device: dict[str, int]
    """Placeholders (0) in a dry run; real with real_load=True."""
    kv_buffers_by_device: dict[str, int]
    """Placeholders (0) in a dry run; real with real_load=True."""
    rs_buffers_by_device: dict[str, int]
    """Recurrent-state buffers: llama.cpp allocates these for real even in a dry run."""
    compute_bytes_precise: int | None
    """4-decimal compute size llama.cpp checks when freeing a real context (real_load=True only)."""
    has_repack_buffer: bool
    repack_bytes: int | None
    """Real CPU_REPACK bytes with real_load=True; None in a dry run (llama.cpp prints 0.00)."""
    layers_offloaded: int | None
    layers_offloadable: int | None
    graph_nodes: int | None
    graph_splits: int | None
    log: str

    @property
    def context_bytes(self) -> int:
        """KV cache + recurrent state + compute + output buffers."""
        return self.kv_cache_bytes + self.recurrent_state_bytes + self.compute_bytes + self.output_bytes

    def kv_cache(self, kind: str) -> KVCacheInfo | None:
        """The first cache of that kind ("full", "swa", "indexer"), if any."""
        return next((c for c in self.kv_caches if c.kind == kind), None)


def _ggml_type(name: str, which: str) -> str:
    key = name.lower()
    if key not in GGML_TYPE_IDS:
        raise ValueError(f"Unknown {which} cache type {name!r}; use one of {', '.join(GGML_TYPE_IDS)}.")
    return key


def _probe_args(gguf_path: str, s: DryRunSettings) -> list[str]:
    """The probe child's command line (the child starts in FitScope's folder: the path is made absolute)."""
    fa = {None: "auto", True: "on", False: "off"}[s.flash_attn]
    cmd = [
        "--json",
        "--model",
        os.path.abspath(gguf_path),
        "--n-ctx",
        str(s.n_ctx),
        "--n-batch",
        str(s.n_batch),
        "--n-ubatch",
        str(s.n_ubatch),
        "--flash-attn",
        fa,
        "--type-k",
        s.type_k,
        "--type-v",
        s.type_v,
        "--n-seq-max",
        str(s.n_seq_max),
        "--n-gpu-layers",
        str(s.n_gpu_layers),
        "--kv-unified" if s.kv_unified else "--no-kv-unified",
        "--swa-full" if s.swa_full else "--no-swa-full",
        "--use-extra-bufts" if s.use_extra_bufts else "--no-use-extra-bufts",
        "--n-outputs-max",
        str(s.n_outputs_max),
    ]
    if s.real_load:
        cmd.append("--real-load")
    if s.rpc_servers:
        cmd += ["--rpc", ",".join(s.rpc_servers)]
    if s.tensor_split:
        cmd += ["--tensor-split", ",".join(f"{x:g}" for x in s.tensor_split)]
    return cmd


def _describe_settings(s: DryRunSettings) -> str:
    fa = {None: "auto", True: "on", False: "off"}[s.flash_attn]
    return (
        f"n_ctx={s.n_ctx}, n_batch={s.n_batch}, n_ubatch={s.n_ubatch}, flash_attn={fa}, "
        f"type_k={s.type_k}, type_v={s.type_v}, n_seq_max={s.n_seq_max}"
    )


def run_json_child(
    module: str, args: Sequence[str], timeout_s: float, activity: str, path: str | os.PathLike[str]
) -> dict[str, Any]:
    """Run a probe child (``module`` with command-line ``args``) and return the JSON object it
    answers with on its last ``{`` line. Raises ProbeError in
    :meth:`~app.adapters.child_protocol.WorkerProcess.failure`'s words: "llama.cpp took longer
    than T s ``activity`` and was stopped." past ``timeout_s``, "llama.cpp stopped ``activity``
    (killed by SIGABRT): <the end of its stderr>" when it died without an answer."""
    worker = WorkerProcess(module, None, name=str(path), timeout_s=timeout_s, args=args)
    payload = worker.json_answer()
    if payload is not None and not worker.timed_out:
        return payload
    tail = worker.stderr_tail()
    message = worker.failure(activity) or failure_message(activity, worker.wait(), tail)
    raise ProbeError(
        message,
        path=str(path),
        reason="timeout" if worker.timed_out else tail,
        log=worker.stderr_tail(STDERR_TAIL_LINES),
    )


def dry_run(
    gguf_path: str | os.PathLike[str],
    *,
    n_ctx: int,
    n_batch: int = 2048,
    n_ubatch: int = 512,
    flash_attn: bool | None,
    type_k: str = "f16",
    type_v: str = "f16",
    n_seq_max: int = 1,
    kv_unified: bool = False,
    swa_full: bool = True,
    n_gpu_layers: int = 0,
    use_extra_bufts: bool = True,
    real_load: bool = False,
    n_outputs_max: int = 0,
    rpc_servers: tuple[str, ...] = (),
    tensor_split: tuple[float, ...] = (),
    timeout_s: float = 120,
) -> DryRunResult:
    """Ask llama.cpp, in a child process, what this model needs with these context settings.

    ``flash_attn``: True → enabled, False → disabled, None → llama.cpp's auto.
    ``real_load``: really mmap the weights and allocate the context (see the module docstring):
    slower and memory-hungry, but reports the true CPU_REPACK size.
    ``rpc_servers``: split over these RPC servers' devices too (``tensor_split`` fixes the shares);
    the buffers are then named ``RPC0[HOST:PORT]``.

    Raises :class:`ProbeError` when the file is missing, llama.cpp refuses the model or the
    settings (the message carries llama.cpp's reason), the child crashes, or it runs past
    ``timeout_s``. Raises ValueError for an unknown cache type name.
    """
    path = Path(gguf_path)
    settings = DryRunSettings(
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_ubatch=n_ubatch,
        flash_attn=flash_attn,
        type_k=_ggml_type(type_k, "K"),
        type_v=_ggml_type(type_v, "V"),
        n_seq_max=n_seq_max,
        kv_unified=kv_unified,
        swa_full=swa_full,
        n_gpu_layers=n_gpu_layers,
        use_extra_bufts=use_extra_bufts,
        real_load=real_load,
        n_outputs_max=n_outputs_max,
        rpc_servers=tuple(rpc_servers),
        tensor_split=tuple(tensor_split),
    )
    if not path.exists():
        raise ProbeError(f"Model file {path} does not exist.", path=str(path), reason="file not found")
    if not path.is_file():
        raise ProbeError(f"{path} is not a file, so llama.cpp cannot load it.", path=str(path))

    payload = run_json_child(
        "app.adapters.llamacpp_probe",
        _probe_args(str(path), settings),
        timeout_s,
        f"while probing {path} with {_describe_settings(settings)}",
        path,
    )

    log = payload.get("log", "")
    if payload.get("error"):
        reason = payload["error"]
        if payload.get("stage") == "load_model":
            hint = " Is it a GGUF model file?" if "magic" in reason or "header" in reason else ""
            message = f"llama.cpp could not load {path}: {reason}.{hint}"
        elif payload.get("stage") == "create_context":
            message = f"llama.cpp refused to create a context for {path} with {_describe_settings(settings)}: {reason}."
        else:
            message = f"The llama.cpp probe of {path} failed: {reason}."
        raise ProbeError(message, path=str(path), reason=reason, log=log)

    buffers = ProbeBuffers.model_validate(payload["buffers"])
    return DryRunResult(
        gguf_path=str(path),
        settings=settings,
        model_size_bytes=int(payload["model_size_bytes"]),
        n_params=int(payload["n_params"]),
        n_layers_total=int(payload["n_layer"]),
        n_ctx=int(payload["n_ctx"]),
        flash_attn_enabled=buffers.flash_attn_enabled,
        kv_cache_bytes=buffers.kv_cache_bytes,
        kv_caches=buffers.kv_caches,
        recurrent_state_bytes=buffers.recurrent_state_bytes,
        recurrent_states=buffers.recurrent_states,
        compute_bytes_by_device=buffers.compute_buffers,
        compute_bytes=buffers.compute_bytes,
        output_bytes_by_device=buffers.output_buffers,
        output_bytes=buffers.output_bytes,
        model_buffers_by_device=buffers.model_buffers,
        kv_buffers_by_device=buffers.kv_buffers,
        rs_buffers_by_device=buffers.rs_buffers,
        compute_bytes_precise=sum(buffers.compute_buffers_precise.values()) or None,
        has_repack_buffer=buffers.has_repack_buffer,
        repack_bytes=buffers.repack_bytes,
        layers_offloaded=buffers.layers_offloaded,
        layers_offloadable=buffers.layers_offloadable,
        graph_nodes=buffers.graph_nodes,
        graph_splits=buffers.graph_splits,
        log=log,
    )


# --------------------------------------------------------------------------------------------
# The child process
# --------------------------------------------------------------------------------------------


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run llama.cpp in this process. Only ever called in the child."""
    import llama_cpp as L  # noqa: N812 - the binding's own style

    log = install_llama_log(L)
    L.llama_backend_init()
    if args.rpc:
        from app.adapters.rpc_servers import RpcError, register_rpc_servers

        try:
            rpc_devices = register_rpc_servers(tuple(e for e in args.rpc.split(",") if e))
        except RpcError as exc:
            return {"error": str(exc), "stage": "rpc", "log": log.text()}

    mparams = L.llama_model_default_params()
    if args.real_load:
        mparams.no_alloc = False
        mparams.load_mode = L.LLAMA_LOAD_MODE_MMAP
    else:
        mparams.no_alloc = True
        mparams.load_mode = L.LLAMA_LOAD_MODE_NONE
    mparams.n_gpu_layers = args.n_gpu_layers
    mparams.use_extra_bufts = args.use_extra_bufts
    split = [float(x) for x in args.tensor_split.split(",")] if args.tensor_split else []
    c_split = (ctypes.c_float * max(L.LLAMA_MAX_DEVICES, len(split)))(*split)  # referenced until loaded
    if split:
        mparams.tensor_split = c_split
    if args.rpc:
        mparams.devices = ctypes.cast(rpc_devices, ctypes.c_void_p)

    model = L.llama_model_load_from_file(args.model.encode(), mparams)
    if not model:
        return {"error": log.reason(), "stage": "load_model", "log": log.text()}
    try:
        result: dict[str, Any] = {
            "model_size_bytes": int(L.llama_model_size(model)),
            "n_params": int(L.llama_model_n_params(model)),
            "n_layer": int(L.llama_model_n_layer(model)),
        }
        cparams = L.llama_context_default_params()
        cparams.n_ctx = args.n_ctx
        cparams.n_batch = args.n_batch
        cparams.n_ubatch = args.n_ubatch
        cparams.n_seq_max = args.n_seq_max
        # Threads change no allocation; llama-server's count keeps the dry run like the real one.
        cparams.n_threads = cparams.n_threads_batch = llama_math_threads()
        cparams.flash_attn_type = {
            "auto": L.LLAMA_FLASH_ATTN_TYPE_AUTO,
            "on": L.LLAMA_FLASH_ATTN_TYPE_ENABLED,
            "off": L.LLAMA_FLASH_ATTN_TYPE_DISABLED,
        }[args.flash_attn]
        cparams.type_k = GGML_TYPE_IDS[args.type_k]
        cparams.type_v = GGML_TYPE_IDS[args.type_v]
        cparams.kv_unified = args.kv_unified
        cparams.swa_full = args.swa_full
        cparams.n_outputs_max = args.n_outputs_max

        log.forget_errors()
        ctx = L.llama_init_from_model(model, cparams)
        if not ctx:
            return {"error": log.reason(), "stage": "create_context", "log": log.text()}
        result["n_ctx"] = int(L.llama_n_ctx(ctx))
        L.llama_free(ctx)  # a really allocated context prints its compute check here
    finally:
        L.llama_model_free(model)
    L.llama_backend_free()

    text = log.text()
    result["buffers"] = parse_llama_log(text).model_dump(mode="json")
    result["log"] = text
    return result


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m app.adapters.llamacpp_probe",
        description="Dry-run llama.cpp on a GGUF file and report what it would allocate.",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (for dry_run())")
    p.add_argument("--model", required=True)
    p.add_argument("--n-ctx", type=int, required=True)
    p.add_argument("--n-batch", type=int, default=2048)
    p.add_argument("--n-ubatch", type=int, default=512)
    p.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto")
    p.add_argument("--type-k", choices=tuple(GGML_TYPE_IDS), default="f16")
    p.add_argument("--type-v", choices=tuple(GGML_TYPE_IDS), default="f16")
    p.add_argument("--n-seq-max", type=int, default=1)
    p.add_argument("--n-gpu-layers", type=int, default=0)
    p.add_argument("--kv-unified", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--swa-full", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--use-extra-bufts", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--real-load", action="store_true")
    p.add_argument("--n-outputs-max", type=int, default=0)
    p.add_argument("--rpc", default="", metavar="HOST:PORT,...", help="RPC servers whose devices come first")
    p.add_argument("--tensor-split", default="", metavar="A,B,...", help="the devices' layer shares")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    out = reserve_stdout()  # for the one JSON line: anything llama.cpp (or Python) prints goes to stderr
    try:
        result = _measure(args)
    except Exception as exc:  # reported to the parent as a result
        result = {"error": f"{type(exc).__name__}: {exc}", "stage": "probe", "log": ""}
    with out:
        if args.json:
            out.write(json.dumps(result) + "\n")
        else:
            result.pop("log", None)
            out.write(json.dumps(result, indent=2) + "\n")
    return 1 if result.get("error") else 0


if __name__ == "__main__":
    sys.exit(main())
