"""The one llama-server command builder: an estimate's settings and placement as llama-server flags."""

from __future__ import annotations

import math
from collections.abc import Sequence

from app.core.common.text import shell_quote
from app.core.common.units import MIB
from app.core.memory.records import Estimate

MODEL_PLACEHOLDER = "MODEL.gguf"  # the model path in a command when no file is named


def tensor_split(capacities: Sequence[int]) -> tuple[int, ...]:
    """llama.cpp's --tensor-split proportions for these capacities, in lowest terms (MiB-rounded)."""
    mib = [max(1, c // MIB) for c in capacities]
    g = math.gcd(*mib)
    return tuple(m // g for m in mib)


def server_command(
    est: Estimate,
    model_path: str,
    gpu_layers: int,
    sliding_window: bool,
    gpus_hidden: bool = False,
    tensor_split: tuple[int, ...] = (),
) -> str:
    """The one llama-server command builder: the estimate's context settings and placement as
    llama-server flags (``--n-cpu-moe`` for experts kept in RAM, ``--device none`` when the GPUs
    must be hidden, ``--swa-full`` only where the model has a sliding window, ``-md`` or
    ``--spec-type draft-mtp`` with the draft's cache types for speculative decoding). File names are
    quoted as they are on disk, bytes that are not UTF-8 included (:func:`shell_quote`)."""
    s = est.settings
    args = [
        "llama-server",
        "-m",
        shell_quote(model_path),
        "-c",
        str(s.context_tokens),
        "-np",
        str(s.parallel_sequences),
        "-b",
        str(s.batch_tokens),
        "-ub",
        str(s.ubatch_tokens),
        "-fa",
        "on" if s.flash_attn else "off",
        "-ctk",
        s.cache_type_k,
        "-ctv",
        s.cache_type_v,
        "-ngl",
        str(gpu_layers),
    ]
    if s.mmproj is not None:
        args += ["--mmproj", shell_quote(s.mmproj.file_name)]
        if not s.mmproj_offload:
            args.append("--no-mmproj-offload")
    spec = s.speculative
    if spec is not None:
        # The draft (or the model's MTP head) and its own cache types; -ngld where not every layer goes.
        args += ["--spec-type", "draft-mtp"] if spec.kind == "mtp" else ["-md", shell_quote(spec.file_name)]
        args += ["--spec-draft-n-max", str(spec.draft_max), "-ctkd", spec.cache_type_k, "-ctvd", spec.cache_type_v]
        if spec.gpu_layers is not None:
            args += ["-ngld", str(spec.gpu_layers)]
    if len(tensor_split) > 1:
        # An explicit split reproduces the estimate; without it llama.cpp splits by the memory free at
        # start-up, which differs between GPUs by whatever else (a desktop) holds memory.
        args += ["--split-mode", "layer", "--tensor-split", ",".join(str(p) for p in tensor_split)]
    if gpus_hidden:
        args += ["--device", "none"]
    if est.cpu_moe_layers:
        args += ["--cpu-moe"] if est.cpu_moe_layers >= est.n_layer else ["--n-cpu-moe", str(est.cpu_moe_layers)]
    if s.threads:
        args += ["-t", str(s.threads)]
    if not s.mmap:
        args.append("--no-mmap")
    if s.kv_unified:
        args.append("--kv-unified")
    # llama-server defaults to the small sliding-window cache; say so when the full one was estimated.
    if s.swa_full and sliding_window:
        args.append("--swa-full")
    return " ".join(args)
