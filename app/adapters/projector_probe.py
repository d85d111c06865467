"""Ground truth for vision projectors: load an mmproj GGUF with the real mtmd (llama.cpp's
multimodal library, shipped with llama-cpp-python 0.3.36) and read what it allocates.

:func:`measure_projector` runs ``python -m app.adapters.projector_probe --json ...`` in a *child*
process (an abort inside llama.cpp kills the child only). The child loads the text model without
its weights (``no_alloc``, as :mod:`app.adapters.llamacpp_probe` does), then
``mtmd_init_from_file`` with warm-up on, which loads the projector's weights and reserves its
compute buffer for the warm-up image (clip.cpp ``clip_model_loader::warmup``). It reads mtmd's log:

* ``load_tensors``/constructor debug lines ``tensor[i]: ... tensor_size=N`` — llama.cpp's own
  ``ggml_nbytes`` per tensor, summed into ``model_size_bytes`` (exact, to the byte); the INFO line
  ``model size: X MiB`` is kept too (``model_size_printed_bytes``, ±0.005 MiB);
* ``reserve_compute_meta: <buffer> compute buffer size = X MiB`` per backend buffer (±0.005 MiB each);
* ``warmup with image size = W x H``, ``flash attention is enabled|disabled`` and
  ``graph splits = S, nodes = N``.

The projector's weights are really allocated in the child (mtmd has no dry-run switch in its
public API): a sparse file of zeros takes its full size in memory for a second.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from app.adapters.child_protocol import install_llama_log, reserve_stdout
from app.adapters.cpu_topology import llama_math_threads
from app.adapters.llama_log import mib_to_bytes
from app.adapters.llamacpp_probe import ProbeError, run_json_child
from app.core.common.units import Frozen

_RE_TENSOR = re.compile(r"tensor\[\d+\]: n_dims = \d+, name = (\S+), tensor_size=(\d+),")
_RE_MODEL_SIZE = re.compile(r"model size:\s*([0-9.]+) MiB")
_RE_COMPUTE = re.compile(r"reserve_compute_meta:\s*(\S+) compute buffer size =\s*([0-9.]+) MiB")
_RE_WARMUP = re.compile(r"warmup with image size = (\d+) x (\d+)")
_RE_FA = re.compile(r"warmup: flash attention is (enabled|disabled)")
_RE_GRAPH = re.compile(r"reserve_compute_meta: graph splits = (\d+), nodes = (\d+)")
_RE_PROJECTOR = re.compile(r"projector:\s+(\S+)")


class ProjectorMeasurement(Frozen):
    """What mtmd reported for one projector file; sizes in bytes."""

    mmproj_path: str
    projector_type: str
    model_size_bytes: int
    """Sum of llama.cpp's ``ggml_nbytes`` over the file's tensors (exact)."""
    model_size_printed_bytes: int
    """The ``model size: X MiB`` line (±0.005 MiB)."""
    n_tensors: int
    compute_bytes_by_buffer: dict[str, int]
    """The last reservation's ``compute buffer size`` lines, per buffer type (±0.005 MiB each)."""
    warmup_image_size: int
    flash_attn_enabled: bool
    graph_nodes: int
    graph_splits: int
    log: str

    @property
    def compute_bytes(self) -> int:
        return sum(self.compute_bytes_by_buffer.values())


def parse_mtmd_log(text: str) -> dict[str, Any]:
    """Read mtmd's load report from its log text (pure). With flash attention on 'auto' and a
    backend that lacks it, clip.cpp reserves twice; the last reservation is the one kept."""
    tensors: dict[str, int] = {}
    compute: dict[str, int] = {}
    fields: dict[str, Any] = {}
    fresh_reservation = True
    for line in text.splitlines():
        if m := _RE_TENSOR.search(line):
            tensors[m[1]] = int(m[2])
        elif m := _RE_MODEL_SIZE.search(line):
            fields["model_size_printed_bytes"] = mib_to_bytes(m[1])
        elif m := _RE_COMPUTE.search(line):
            if fresh_reservation:
                compute = {}
                fresh_reservation = False
            compute[m[1]] = compute.get(m[1], 0) + mib_to_bytes(m[2])
        elif m := _RE_GRAPH.search(line):
            fields["graph_splits"], fields["graph_nodes"] = int(m[1]), int(m[2])
            fresh_reservation = True
        elif m := _RE_WARMUP.search(line):
            fields["warmup_image_size"] = int(m[1])
        elif m := _RE_FA.search(line):
            fields["flash_attn_enabled"] = m[1] == "enabled"
        elif (m := _RE_PROJECTOR.search(line)) and "projector_type" not in fields:
            fields["projector_type"] = m[1]
    fields["model_size_bytes"] = sum(tensors.values())
    fields["n_tensors"] = len(tensors)
    fields["compute_bytes_by_buffer"] = compute
    return fields


def measure_projector(
    mmproj_path: str | os.PathLike[str],
    text_model_path: str | os.PathLike[str],
    *,
    flash_attn: bool | None = True,
    use_gpu: bool = False,
    timeout_s: float = 180,
) -> ProjectorMeasurement:
    """Load ``mmproj_path`` with the real mtmd beside ``text_model_path`` (whose n_embd must match
    the projector's output) in a child process and return what it allocated.

    ``flash_attn``: True → enabled, False → disabled, None → auto (as llama-server's default).
    Raises :class:`ProbeError` when a file is missing, mtmd refuses the projector (the message
    carries its reason), the child crashes, or it runs past ``timeout_s``.
    """
    mmproj, text = Path(mmproj_path), Path(text_model_path)
    for p in (mmproj, text):
        if not p.is_file():
            raise ProbeError(f"{p} does not exist or is not a file.", path=str(p), reason="file not found")
    fa = {None: "auto", True: "on", False: "off"}[flash_attn]
    args = [
        "--mmproj",
        os.path.abspath(mmproj),  # the child starts in FitScope's folder
        "--model",
        os.path.abspath(text),
        "--flash-attn",
        fa,
        "--use-gpu" if use_gpu else "--no-use-gpu",
    ]
    payload = run_json_child(
        "app.adapters.projector_probe", args, timeout_s, f"while loading the projector {mmproj}", mmproj
    )
    log = payload.get("log", "")
    if payload.get("error"):
        raise ProbeError(
            f"mtmd could not load {mmproj} ({payload.get('stage')}): {payload['error']}",
            path=str(mmproj),
            reason=payload["error"],
            log=log,
        )
    fields = parse_mtmd_log(log)
    missing = [k for k in ("warmup_image_size", "flash_attn_enabled", "graph_nodes") if k not in fields]
    if missing or not fields["compute_bytes_by_buffer"]:
        raise ProbeError(
            f"mtmd loaded {mmproj} but its log lacks the warm-up report ({', '.join(missing) or 'compute buffer'}).",
            path=str(mmproj),
            log=log,
        )
    return ProjectorMeasurement(mmproj_path=str(mmproj), log=log, **fields)


# --------------------------------------------------------------------------------------------
# The child process
# --------------------------------------------------------------------------------------------


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    """Load the text model (no weights) and the projector in this process. Child only."""
    import llama_cpp as L  # noqa: N812 - the binding's own style
    from llama_cpp import mtmd_cpp as M  # noqa: N812

    log = install_llama_log(L, also=(M.mtmd_log_set,))
    L.llama_backend_init()

    mparams = L.llama_model_default_params()
    mparams.no_alloc = True
    mparams.load_mode = L.LLAMA_LOAD_MODE_NONE
    mparams.n_gpu_layers = 0
    model = L.llama_model_load_from_file(args.model.encode(), mparams)
    if not model:
        return {"error": log.reason("the text model did not load"), "stage": "load_text_model", "log": log.text()}
    try:
        log.forget()  # keep mtmd's part of the log only
        params = M.mtmd_context_params_default()
        params.use_gpu = args.use_gpu
        params.warmup = True
        params.print_timings = False
        params.n_threads = llama_math_threads()
        params.flash_attn_type = {
            "auto": L.LLAMA_FLASH_ATTN_TYPE_AUTO,
            "on": L.LLAMA_FLASH_ATTN_TYPE_ENABLED,
            "off": L.LLAMA_FLASH_ATTN_TYPE_DISABLED,
        }[args.flash_attn]
        ctx = M.mtmd_init_from_file(args.mmproj.encode(), model, params)
        if not ctx:
            return {"error": log.reason("mtmd refused the projector"), "stage": "mtmd_init", "log": log.text()}
        M.mtmd_free(ctx)
    finally:
        L.llama_model_free(model)
    L.llama_backend_free()
    return {"log": log.text()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m app.adapters.projector_probe",
        description="Load a vision projector with llama.cpp's mtmd and print its log as one JSON line.",
    )
    p.add_argument("--mmproj", required=True)
    p.add_argument("--model", required=True, help="a text model GGUF whose n_embd matches the projector")
    p.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto")
    p.add_argument("--use-gpu", action=argparse.BooleanOptionalAction, default=False)
    args = p.parse_args(argv)
    out = reserve_stdout()  # for the one JSON line: anything llama.cpp (or Python) prints goes to stderr
    try:
        result = _measure(args)
    except Exception as exc:  # reported to the parent as a result
        result = {"error": f"{type(exc).__name__}: {exc}", "stage": "probe", "log": ""}
    with out:
        out.write(json.dumps(result) + "\n")
    return 1 if result.get("error") else 0


if __name__ == "__main__":
    sys.exit(main())
