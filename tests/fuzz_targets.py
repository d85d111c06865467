"""What the fuzz harness feeds FitScope, and how each case ended.

Three targets, each a plain function of one input that never raises: GGUF headers (written to a
file and read, then estimated when accepted), config.json contents (read, then estimated) and
command lines (``fitscope`` in this process, output captured). An outcome is one of:

- ``clean``: refused with FitScope's own one-line message;
- ``accepted``: read and estimated without complaint;
- ``traceback``: any other exception (a defect);
- ``hang``: longer than HANG_S seconds (a defect);
- ``memory``: Python allocations above MEMORY_LIMIT_BYTES while reading a header-only input.

Used by tests/test_fuzz.py (a quick Hypothesis run) and scripts/fuzz.py (a long run with counts).
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import signal
import struct
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app import cli
from app.core.common.errors import FitScopeError
from app.core.memory.estimate import estimate
from app.core.memory.records import MAX_CONTEXT_TOKENS, Settings, Target
from app.core.model.gguf_model import read_gguf
from app.core.model.hf_config import read_hf_config

HANG_S = 5.0
MEMORY_LIMIT_BYTES = 300 * 1024**2
_CPU = Target(name="CPU", kind="cpu", capacity_bytes=1 << 40, bandwidth_gb_s=50, fp16_tflops=1, efficiency_class="cpu")


@dataclass(frozen=True)
class Outcome:
    kind: str  # clean | accepted | traceback | hang | memory
    seconds: float
    peak_bytes: int
    detail: str = ""


class _HangError(Exception):
    pass


def _alarm(_signum: int, _frame: Any) -> None:
    raise _HangError


def _guarded(work) -> Outcome:
    """Runs ``work()`` (which returns "clean" or "accepted") under a time limit and allocation
    tracking; any other exception is a traceback outcome."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        kind, detail = work(), ""
    except _HangError:
        kind, detail = "hang", ""
    except Exception as exc:
        kind, detail = "traceback", f"{type(exc).__name__}: {str(exc)[:200]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    seconds = time.perf_counter() - started
    if kind in ("clean", "accepted") and peak > MEMORY_LIMIT_BYTES:
        kind = "memory"
    return Outcome(kind, seconds, peak, detail)


def _estimate_small(arch, tensors) -> None:
    ctx = max(256, min(4096, arch.n_ctx_train, MAX_CONTEXT_TOKENS))
    estimate(arch, tensors, Settings(context_tokens=ctx), [_CPU])


# -- GGUF headers ---------------------------------------------------------------------------------


def gguf_case(data: bytes, path: Path) -> Outcome:
    path.write_bytes(data)

    def work() -> str:
        try:
            model = read_gguf(path)
            _estimate_small(model.architecture, model.tensors)
        except FitScopeError:
            return "clean"
        return "accepted"

    return _guarded(work)


def mutate_gguf(seed: bytes, rng: random.Random) -> bytes:
    """Structure-aware mutations of a GGUF: length and count fields set to extreme values, bytes
    flipped, the file cut or a region repeated."""
    data = bytearray(seed)
    for _ in range(rng.randint(1, 4)):
        header_end = min(len(data), 4096)
        kind = rng.random()
        if kind < 0.45 and header_end > 16:
            # A u64 or u32 field (lengths, counts, dims, offsets) at an aligned-ish position.
            pos = rng.randrange(4, header_end - 8)
            value = rng.choice(
                [0, 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**64 - 1, 240_000_000, rng.randrange(1 << 20)]
            )
            if rng.random() < 0.5:
                data[pos : pos + 8] = struct.pack("<Q", value % (1 << 64))
            else:
                data[pos : pos + 4] = struct.pack("<I", value % (1 << 32))
        elif kind < 0.75 and header_end > 0:
            pos = rng.randrange(header_end)
            data[pos] = rng.randrange(256)
        elif kind < 0.9:
            del data[rng.randrange(max(1, len(data))) :]
        else:
            start = rng.randrange(max(1, header_end))
            end = min(len(data), start + rng.randrange(1, 64))
            data[start:start] = data[start:end] * rng.randint(1, 4)
    return bytes(data)


# -- config.json ----------------------------------------------------------------------------------

CONFIG_KEYS = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "max_position_embeddings",
    "vocab_size",
    "head_dim",
    "sliding_window",
    "layer_types",
    "attention_bias",
    "tie_word_embeddings",
    "num_local_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "text_config",
)
MODEL_TYPES = (
    "llama",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "gemma3_text",
    "gemma2",
    "mistral",
    "phi3",
    "gpt_oss",
    "mamba",
    "x",
)


def config_case(config: Any) -> Outcome:
    def work() -> str:
        try:
            arch = read_hf_config(config if isinstance(config, dict) else {"model_type": config})
            from app.core.model.quant import find_preset, quantize_layout

            _estimate_small(arch, quantize_layout(arch, find_preset("Q4_K_M")))
        except FitScopeError:
            return "clean"
        return "accepted"

    return _guarded(work)


def random_config(rng: random.Random) -> dict:
    base = {
        "model_type": rng.choice(MODEL_TYPES),
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 512,
        "max_position_embeddings": 2048,
        "vocab_size": 1000,
    }
    values = [
        0,
        -1,
        1,
        7,
        2**31,
        10**9,
        10**30,
        1e300,
        float("nan"),
        float("inf"),
        -0.5,
        "false",
        "no",
        "12",
        None,
        True,
        [],
        [1, 2],
        {"a": 1},
        ["sliding_attention"] * rng.randint(0, 5000),
    ]
    for _ in range(rng.randint(1, 5)):
        base[rng.choice(CONFIG_KEYS)] = rng.choice(values)
    return base


# -- command lines -------------------------------------------------------------------------------

_FLAG_VALUES = (
    "0",
    "-1",
    "1",
    "nan",
    "inf",
    "-inf",
    "1e300",
    "99999999999999",
    "abc",
    "",
    "q8_0",
    "f16",
    "\x1b[31m",
    "auto",
)
_ESTIMATE_FLAGS = (
    "-c",
    "-b",
    "-ub",
    "-np",
    "-ngl",
    "-ctk",
    "-ctv",
    "-fa",
    "--host-ram-gib",
    "--quant",
    "--n-cpu-moe",
    "--fit-target",
    "--backend",
    "--consumer",
    "-p",
)


def random_command(rng: random.Random, scratch: Path) -> list[str]:
    command = rng.choice(["estimate", "estimate", "estimate", "plan", "models", "gpus"])
    argv = [command]
    if command in ("estimate", "plan"):
        argv += ["--model", rng.choice(["llama-3.1-8b", "qwen3-30b-a3b", "gpt-oss-20b", "nope", "mamba-130m"])]
        if command == "estimate":
            argv += rng.choice([["--gpu", "rtx-4090"], ["--gpu", "dgx-spark"], ["--gpu", "epyc-9655"], ["--gpu", "x"]])
        else:
            argv += ["--gpu", rng.choice(["rtx-4090", "h100-sxm", "zz"])]
        for _ in range(rng.randint(0, 4)):
            argv += [rng.choice(_ESTIMATE_FLAGS), rng.choice(_FLAG_VALUES)]
    if rng.random() < 0.3:
        argv.append("--json")
    if rng.random() < 0.1:
        argv += ["--gguf", rng.choice([str(scratch / "missing.gguf"), str(scratch), "/dev/null"])]
    return argv


def command_case(argv: list[str]) -> Outcome:
    def work() -> str:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(argv)
        text = err.getvalue().strip()
        if rc == 1 or "Traceback" in text:
            raise RuntimeError(f"fitscope {' '.join(argv)!r} -> {text[:200]}")
        if rc not in (0, 2) or (rc == 2 and (len(text.splitlines()) != 1 or not text.startswith("fitscope"))):
            raise RuntimeError(f"fitscope {' '.join(argv)!r} exited {rc}: {text[:200]!r}")
        if rc == 0 and "--json" in argv:
            json.loads(out.getvalue())
        return "accepted" if rc == 0 else "clean"

    return _guarded(work)


def small_seeds(folder: Path) -> list[bytes]:
    """Small valid GGUFs of three shapes (dense, tied, MoE) written into ``folder``, as bytes."""
    from tests.test_gguf_reader import write_gguf

    files = [
        write_gguf(folder / "llama.gguf"),
        write_gguf(folder / "tied.gguf", tied=True, n_layer=2),
        write_gguf(
            folder / "moe.gguf",
            extra=lambda w: (w.add_expert_count(4), w.add_expert_used_count(2)),
            tensors={"blk.0.ffn_up_exps.weight": np.zeros((4, 128, 64), dtype=np.float32)},
        ),
    ]
    return [p.read_bytes() for p in files]
