"""What a live run measured, and how it compares with the estimate. Pure data and arithmetic: the
runner (``app.adapters.llamacpp_runner``) fills these records in from a llama.cpp child process.

Definitions (the same as llama.cpp's own ``llama_perf_context_print`` and llama-bench):

- load time: from starting to load the file to a ready context;
- time to first token (TTFT): from submitting the prompt to the first generated token, i.e. the
  whole prefill plus one decode step;
- prefill tokens/s: prompt tokens / prefill time; decode tokens/s: generated tokens after the
  first / the time they took; both from llama.cpp's timings when it reports them (``*_llama``)
  and from the wall clock around the calls (``*_wall``);
- inter-token latency: the wall-clock gaps between consecutive generated tokens (p50 / p95).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from app.core.common.units import Frozen
from app.core.memory.records import GpuLayers
from app.core.speed import llama_defaults
from app.core.speed.llama_defaults import ThreadChoice, choose_threads

_OLDER_NAMES = {
    "n_ctx": "context_tokens",
    "n_batch": "batch_tokens",
    "n_ubatch": "ubatch_tokens",
    "n_gpu_layers": "gpu_layers",
}


class RunSettings(Frozen):
    """One live run: the model file, llama.cpp's context settings and the generation."""

    gguf_path: str
    mode: Literal["generate", "bench"] = "generate"
    context_tokens: int = Field(default=4096, ge=16, le=1 << 24)
    batch_tokens: int = Field(default=llama_defaults.N_BATCH, ge=1)
    ubatch_tokens: int = Field(default=llama_defaults.N_UBATCH, ge=1)
    flash_attn: bool = llama_defaults.FLASH_ATTN
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    swa_full: bool = True
    gpu_layers: GpuLayers = Field(default=0, description='-ngl: layers on the GPU, or "all" ("auto" is refused)')
    n_threads: int | None = Field(default=None, ge=1, description="None: llama-server's default, set when it starts")
    prompt: str | None = None
    chat: bool = Field(default=False, description="the prompt as one user turn through the model's chat template")
    system_prompt: str | None = Field(default=None, max_length=100_000, description="with chat: a system turn first")
    prompt_tokens: int | None = Field(
        default=None, ge=1, le=1 << 24, description="a synthetic prompt of exactly N tokens"
    )
    max_tokens: int = Field(default=128, ge=1, le=1 << 20)
    temperature: float = Field(default=0.0, ge=0.0, le=5.0)
    seed: int = 0
    repeat: int = Field(default=1, ge=1, le=100)
    ignore_eos: bool = False
    depth_tokens: int = Field(default=0, ge=0, le=1 << 24, description="bench: context already in the cache")
    rpc_servers: tuple[str, ...] = Field(
        default=(), max_length=16, description="llama.cpp --rpc: HOST:PORT of each RPC server, first device first"
    )
    tensor_split: tuple[float, ...] = Field(
        default=(), max_length=16, description="llama.cpp --tensor-split: the layer share of each device; (): by memory"
    )

    @model_validator(mode="before")
    @classmethod
    def _read_older_names(cls, data: Any) -> Any:
        """Runs kept by earlier FitScope versions named these fields after llama.cpp's C API."""
        if isinstance(data, dict):
            data = {_OLDER_NAMES.get(k, k): v for k, v in data.items()}
            if data.get("gpu_layers") == -1:
                data["gpu_layers"] = "all"
        return data

    @field_validator("gpu_layers")
    @classmethod
    def _placed(cls, value: GpuLayers) -> GpuLayers:
        if value == "auto":
            raise ValueError("a live run takes a number of GPU layers or 'all', not 'auto'")
        return value

    @property
    def n_gpu_layers(self) -> int:
        """llama-cpp-python's ``n_gpu_layers`` (-1: all)."""
        return -1 if self.gpu_layers == "all" else int(self.gpu_layers)


class RunFigures(Frozen):
    """One repetition. Times in seconds, rates in tokens per second."""

    prompt_tokens: int
    generated_tokens: int
    ttft_s: float
    prefill_s: float
    decode_s: float
    prefill_tokens_per_s_wall: float | None = None
    decode_tokens_per_s_wall: float | None = None
    prefill_tokens_per_s_llama: float | None = None
    decode_tokens_per_s_llama: float | None = None
    itl_p50_s: float | None = None
    itl_p95_s: float | None = None
    token_times_s: tuple[float, ...] = Field(default=(), description="each token's time since the prompt was sent")
    stopped: bool = False


class MeasuredBuffers(Frozen):
    """llama.cpp's own report of what it allocated (bytes, per device name as it prints them)."""

    model_buffers: dict[str, int] = {}
    kv_buffers: dict[str, int] = {}
    rs_buffers: dict[str, int] = {}
    compute_buffers: dict[str, int] = {}
    output_buffers: dict[str, int] = {}
    layers_offloaded: int | None = None
    layers_offloadable: int | None = None

    def total(self, kind: str) -> int:
        return sum(getattr(self, f"{kind}_buffers").values())


class RunResult(Frozen):
    """A finished (or stopped) run: settings, load, every repetition, what llama.cpp allocated."""

    settings: RunSettings
    started_at: float = Field(description="seconds since the epoch")
    llama_cpp_version: str
    gpu_offload_supported: bool
    model_size_bytes: int
    model_sha256: str
    model_hash_kind: Literal["sha256", "sha256-head-tail", "unavailable"] = "sha256"
    n_layer: int
    load_s: float
    runs: tuple[RunFigures, ...]
    buffers: MeasuredBuffers
    peak_rss_bytes: int | None = None
    output_text: str = ""
    hardware: dict[str, str] = {}
    log_tail: str = ""
    prompt_format: Literal["chat template", "raw"] = Field(
        default="raw", description="how the prompt reached the model (raw: as typed, or a model without a template)"
    )
    n_threads_used: int | None = Field(default=None, description="llama_n_threads() of the run's context")
    llama_server_threads: int | None = Field(
        default=None, description="the threads llama-server uses on the machine that ran it (None: not recorded)"
    )
    others_cpu_share: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="the share of all the machine's CPUs other programs used while the model generated (None: not "
        "measured)",
    )
    hot_sensor: str | None = Field(
        default=None, max_length=200, description="a temperature sensor at or above its high mark when it ended"
    )

    @property
    def threads(self) -> ThreadChoice | None:
        """The run's threads against llama-server's default, when both were recorded."""
        used = self.n_threads_used or self.settings.n_threads
        if used is None or self.llama_server_threads is None:
            return None
        return choose_threads(used, self.llama_server_threads)

    @property
    def completed_runs(self) -> tuple[RunFigures, ...]:
        return tuple(r for r in self.runs if not r.stopped)


class Spread(Frozen):
    median: float
    low: float
    high: float
    n: int


def spread(values: Sequence[float | None]) -> Spread | None:
    """Median and range of the values that exist; None when there are none."""
    real = [v for v in values if v is not None]
    if not real:
        return None
    return Spread(median=statistics.median(real), low=min(real), high=max(real), n=len(real))


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def figures_from_times(
    prompt_tokens: int,
    prefill_s: float,
    token_times_s: Sequence[float],
    llama_prefill_tokens_per_s: float | None = None,
    llama_decode_tokens_per_s: float | None = None,
    stopped: bool = False,
) -> RunFigures:
    """One repetition's figures from the wall-clock times of its tokens (seconds since the prompt
    was sent; the first one is the time to first token) and the prefill time."""
    n = len(token_times_s)
    ttft = token_times_s[0] if n else prefill_s
    gaps = [b - a for a, b in zip(token_times_s, token_times_s[1:], strict=False)]
    decode_s = (token_times_s[-1] - token_times_s[0]) if n > 1 else 0.0
    return RunFigures(
        prompt_tokens=prompt_tokens,
        generated_tokens=n,
        ttft_s=ttft,
        prefill_s=prefill_s,
        decode_s=decode_s,
        prefill_tokens_per_s_wall=prompt_tokens / prefill_s if prefill_s > 0 else None,
        decode_tokens_per_s_wall=(n - 1) / decode_s if decode_s > 0 else None,
        prefill_tokens_per_s_llama=llama_prefill_tokens_per_s,
        decode_tokens_per_s_llama=llama_decode_tokens_per_s,
        itl_p50_s=percentile(gaps, 0.50),
        itl_p95_s=percentile(gaps, 0.95),
        token_times_s=tuple(token_times_s),
        stopped=stopped,
    )


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def summary(result: RunResult) -> dict[str, Spread | None]:
    """Median and spread over the completed repetitions (over the stopped ones when none
    completed), under the JSON key names. llama.cpp's own timings are preferred to the wall clock."""
    runs = result.completed_runs or result.runs
    return {
        "ttft_s": spread([r.ttft_s for r in runs]),
        "prefill_tokens_per_s": spread(
            [_first(r.prefill_tokens_per_s_llama, r.prefill_tokens_per_s_wall) for r in runs]
        ),
        "decode_tokens_per_s": spread([_first(r.decode_tokens_per_s_llama, r.decode_tokens_per_s_wall) for r in runs]),
        "prefill_tokens_per_s_wall": spread([r.prefill_tokens_per_s_wall for r in runs]),
        "decode_tokens_per_s_wall": spread([r.decode_tokens_per_s_wall for r in runs]),
        "itl_p50_s": spread([r.itl_p50_s for r in runs]),
        "itl_p95_s": spread([r.itl_p95_s for r in runs]),
    }


class SweepRow(Frozen):
    """One thread count of a benchmark sweep: median prefill (pp) and decode (tg) tokens/s."""

    n_threads: int
    prefill_tokens_per_s: float | None
    decode_tokens_per_s: float | None
    best_prefill: bool = False
    best_decode: bool = False


def sweep_rows(results: Sequence[RunResult]) -> tuple[SweepRow, ...]:
    """A thread sweep's table, in thread order, with the peaks of prefill and decode marked."""
    rows = []
    for r in results:
        stats = summary(r)
        pp, tg = stats["prefill_tokens_per_s"], stats["decode_tokens_per_s"]
        rows.append(
            SweepRow(
                n_threads=r.n_threads_used or r.settings.n_threads or 0,
                prefill_tokens_per_s=pp.median if pp else None,
                decode_tokens_per_s=tg.median if tg else None,
            )
        )
    rows.sort(key=lambda row: row.n_threads)
    best_pp = max((r for r in rows if r.prefill_tokens_per_s), key=lambda r: r.prefill_tokens_per_s or 0, default=None)
    best_tg = max((r for r in rows if r.decode_tokens_per_s), key=lambda r: r.decode_tokens_per_s or 0, default=None)
    return tuple(r.model_copy(update={"best_prefill": r is best_pp, "best_decode": r is best_tg}) for r in rows)
