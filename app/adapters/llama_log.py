"""llama.cpp's log lines read as figures: the buffers it allocated per device (model, KV, recurrent
state, compute, output), its KV caches, the layers it offloaded, its graph and its context
parameters. The live runner, the suites, the dry run and the projector probe all read llama.cpp's
log through :func:`parse_llama_log`, so one wording change in llama.cpp is fixed in one place.
"""

from __future__ import annotations

import re
from typing import Any

from app.core.common.units import MIB, Frozen
from app.core.model.tensors import CACHE_TYPES

MIB_PRECISION_BYTES = round(0.005 * MIB)


GGML_TYPE_IDS: dict[str, int] = {name: int(t) for name, t in CACHE_TYPES.items()}


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
    unused_tensor_bytes: int = 0
    """Tensors in the file the loader skips ("model has unused tensor ... -- ignoring": MTP/NextN
    blocks while load_mtp is off): counted by llama_model_size, never allocated."""
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
_RE_UNUSED = re.compile(r"model has unused tensor \S+ \(size = (\d+) bytes\)")


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
        elif m := _RE_UNUSED.search(line):
            fields["unused_tensor_bytes"] = fields.get("unused_tensor_bytes", 0) + int(m[1])
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
