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
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from app.adapters.child_protocol import (
    STDERR_TAIL_LINES,
    WorkerProcess,
    failure_message,
    install_llama_log,
    reserve_stdout,
)
from app.adapters.cpu_topology import llama_math_threads
from app.adapters.llama_log import GGML_TYPE_IDS, KVCacheInfo, ProbeBuffers, RecurrentStateInfo, parse_llama_log
from app.core.common.errors import FitScopeError
from app.core.common.units import Frozen

"""Largest rounding error of one ``%.2f MiB`` figure, in bytes (5243)."""

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
    speculative: str = ""
    """"": none; "mtp": llama-server --spec-type draft-mtp (the model loaded with its MTP block and an MTP
    context beside the main one); else the path of a draft model (-md), loaded and given its own context."""
    draft_type_k: str = "f16"
    draft_type_v: str = "f16"


class SpeculativeDryRun(Frozen):
    """The second context llama-server creates for speculative decoding (common_speculative_init_result):
    a draft model's, or an MTP context on the target model; sizes in bytes, parsed from its own log."""

    model_size_bytes: int = Field(description="the draft model's file (0 for an MTP context: the target's weights)")
    unused_tensor_bytes: int = 0
    kv_cache_bytes: int
    kv_caches: tuple[KVCacheInfo, ...]
    recurrent_state_bytes: int
    compute_bytes: int
    output_bytes: int

    @property
    def resident_weights_bytes(self) -> int:
        return self.model_size_bytes - self.unused_tensor_bytes


class DryRunResult(Frozen):
    """What llama.cpp reports for one model and one set of context settings; sizes in bytes.

    ``model_size_bytes`` and ``n_params`` are exact (API). Everything else is parsed from the
    log and good to ±0.005 MiB per printed figure.
    """

    gguf_path: str
    settings: DryRunSettings
    model_size_bytes: int
    unused_tensor_bytes: int
    """Tensors of the file llama.cpp does not load (MTP/NextN blocks while load_mtp is off)."""
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
    speculative: SpeculativeDryRun | None = None
    """The draft or MTP context's own buffers, when one was asked for."""

    @property
    def resident_weights_bytes(self) -> int:
        """The weights llama.cpp loads: the file's tensors less the ones it skips."""
        return self.model_size_bytes - self.unused_tensor_bytes

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
    if s.speculative:
        spec = s.speculative if s.speculative == "mtp" else os.path.abspath(s.speculative)
        cmd += ["--speculative", spec, "--draft-type-k", s.draft_type_k, "--draft-type-v", s.draft_type_v]
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
    speculative: str = "",
    draft_type_k: str = "f16",
    draft_type_v: str = "f16",
    timeout_s: float = 120,
) -> DryRunResult:
    """Ask llama.cpp, in a child process, what this model needs with these context settings.

    ``flash_attn``: True → enabled, False → disabled, None → llama.cpp's auto.
    ``real_load``: really mmap the weights and allocate the context (see the module docstring):
    slower and memory-hungry, but reports the true CPU_REPACK size.
    ``rpc_servers``: split over these RPC servers' devices too (``tensor_split`` fixes the shares);
    the buffers are then named ``RPC0[HOST:PORT]``.
    ``speculative``: "mtp" loads the model with its MTP block and creates llama-server's MTP context
    beside the main one; a path loads that draft model and creates its context (-md), with the draft's
    cache types; the second context's buffers come back in ``speculative``.

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
        speculative=speculative,
        draft_type_k=_ggml_type(draft_type_k, "draft K"),
        draft_type_v=_ggml_type(draft_type_v, "draft V"),
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
        unused_tensor_bytes=buffers.unused_tensor_bytes,
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
        speculative=_speculative(payload.get("speculative")),
    )


def _speculative(payload: dict[str, Any] | None) -> SpeculativeDryRun | None:
    if not payload:
        return None
    buffers = parse_llama_log(payload["log"])
    return SpeculativeDryRun(
        model_size_bytes=int(payload.get("model_size_bytes", 0)),
        unused_tensor_bytes=buffers.unused_tensor_bytes,
        kv_cache_bytes=buffers.kv_cache_bytes,
        kv_caches=buffers.kv_caches,
        recurrent_state_bytes=buffers.recurrent_state_bytes,
        compute_bytes=buffers.compute_bytes,
        output_bytes=buffers.output_bytes,
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
        from app.adapters.rpc_backend import RpcError, register_rpc_servers

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
    # llama-server loads the MTP block only for --spec-type draft-mtp (common_model_params_to_llama).
    mparams.load_mtp = args.speculative == "mtp"
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
        if args.speculative:
            main_log = log.text()
            spec = _speculative_context(L, log, args, model, mparams, cparams, ctx)
            L.llama_free(ctx)
            if "error" in spec:
                return spec | {"log": main_log + log.text()}
            result["speculative"] = spec
            log.chunks[:] = [main_log]  # the main context's lines alone below
        else:
            L.llama_free(ctx)  # a really allocated context prints its compute check here
    finally:
        L.llama_model_free(model)
    L.llama_backend_free()

    text = log.text()
    result["buffers"] = parse_llama_log(text).model_dump(mode="json")
    result["log"] = text
    return result


def _speculative_context(
    L: Any,  # noqa: N803 - L is the binding, as above
    log: Any, args: argparse.Namespace, model: Any, mparams: Any, cparams: Any, ctx: Any
) -> dict[str, Any]:
    """llama-server's second context (common_speculative_init_result): the draft model's own, or an MTP
    context on the target model; as many cells as the target's, the draft cache types, logits for one
    row per slot (common_base_params_to_speculative). Child only; returns its log and sizes."""
    log.forget()
    cparams.n_ctx = L.llama_n_ctx(ctx)
    cparams.type_k = GGML_TYPE_IDS[args.draft_type_k]
    cparams.type_v = GGML_TYPE_IDS[args.draft_type_v]
    cparams.n_outputs_max = args.n_seq_max
    cparams.n_rs_seq = 0
    cparams.ctx_other = ctx
    out: dict[str, Any] = {}
    draft = None
    if args.speculative == "mtp":
        cparams.ctx_type = L.LLAMA_CONTEXT_TYPE_MTP
        target = model
    else:
        mparams.load_mtp = False
        draft = L.llama_model_load_from_file(args.speculative.encode(), mparams)
        if not draft:
            return {"error": log.reason(), "stage": "load_draft"}
        out["model_size_bytes"] = int(L.llama_model_size(draft))
        target = draft
    try:
        spec_ctx = L.llama_init_from_model(target, cparams)
        if not spec_ctx:
            return {"error": log.reason(), "stage": "create_speculative_context"}
        L.llama_free(spec_ctx)
    finally:
        if draft is not None:
            L.llama_model_free(draft)
    out["log"] = log.text()
    return out


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
    p.add_argument(
        "--speculative", default="", metavar="mtp|DRAFT.gguf", help="also create llama-server's draft context"
    )
    p.add_argument("--draft-type-k", choices=tuple(GGML_TYPE_IDS), default="f16")
    p.add_argument("--draft-type-v", choices=tuple(GGML_TYPE_IDS), default="f16")
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
