"""Hold a live run against the estimate for the same file and settings: buffer by buffer, speed
against the roofline, and a plain-words guess at what went wrong when they disagree."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.core.memory.estimate import estimate
from app.core.memory.records import Estimate, Settings, Target, estimate_json
from app.core.model.architecture import Architecture
from app.core.model.tensors import TensorInfo
from app.core.report.verdict import rate, rate_range
from app.core.speed.measure import RunResult, RunSettings, Spread, SweepRow, summary
from app.core.speed.predict import SpeedEstimate, estimate_speed
from app.core.speed.reads import active_bytes_by_device, kv_read_bytes

CUDA_INSTALL_HINT = 'CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir llama-cpp-python==0.3.36'
# The llama-cpp-python build each vendor's GPUs need, with its CMake switches (llama-cpp-python's
# README: Metal, hipBLAS for ROCm, SYCL with Intel's oneAPI compilers).
GPU_BUILDS: dict[str, tuple[str, str, str]] = {
    "nvidia": ("NVIDIA", "CUDA", "-DGGML_CUDA=on"),
    "apple": ("Apple", "Metal", "-DGGML_METAL=on"),
    "amd": ("AMD", "ROCm", "-DGGML_HIP=on"),
    "intel": ("Intel", "SYCL", "-DGGML_SYCL=on -DCMAKE_C_COMPILER=icx -DCMAKE_CXX_COMPILER=icpx"),
}


def gpu_build_advice(vendor: str | None) -> tuple[str, str]:
    """(sentence, install command) for a CPU-only llama-cpp-python on a machine whose GPU is of
    ``vendor`` (None: no GPU found, NVIDIA's CUDA build named). AMD and Intel GPUs also run the
    Vulkan build (-DGGML_VULKAN=on)."""
    maker, name, switches = GPU_BUILDS.get(vendor or "nvidia", GPU_BUILDS["nvidia"])
    where = "" if vendor else " (and no GPU was found)"
    vulkan = " (or the Vulkan build, -DGGML_VULKAN=on)" if vendor in ("amd", "intel") else ""
    sentence = f"This llama-cpp-python runs on the CPU only{where}. For an {maker} GPU, install the {name} build"
    sentence += f"{vulkan}:"
    command = f'CMAKE_ARGS="{switches}" pip install --force-reinstall --no-cache-dir llama-cpp-python==0.3.36'
    return sentence, command


def estimate_settings(run: RunSettings, repack: str) -> Settings:
    """The estimator's settings for a run (``-ngl -1`` means every layer)."""
    return Settings(
        context_tokens=run.context_tokens,
        batch_tokens=run.batch_tokens,
        ubatch_tokens=run.ubatch_tokens,
        flash_attn=run.flash_attn,
        cache_type_k=run.cache_type_k,
        cache_type_v=run.cache_type_v,
        swa_full=run.swa_full,
        gpu_layers=run.gpu_layers,
        repack=repack,  # type: ignore[arg-type]
    )


@dataclass(frozen=True)
class BufferRow:
    """One line of the buffer table: what llama.cpp allocated against what was estimated (or, for
    a run across RPC servers, planned). ``buffer`` is weights, repack, kv_cache, recurrent_state,
    compute or output (for RPC: the device and the buffer)."""

    buffer: str
    measured_bytes: int
    estimated_bytes: int

    @property
    def difference_bytes(self) -> int:
        return self.measured_bytes - self.estimated_bytes

    @property
    def difference_percent(self) -> float | None:
        if self.estimated_bytes == 0:
            return None
        return 100.0 * self.difference_bytes / self.estimated_bytes

    def to_json(self) -> dict[str, Any]:
        percent = self.difference_percent
        return {
            "buffer": self.buffer,
            "measured_bytes": self.measured_bytes,
            "estimated_bytes": self.estimated_bytes,
            "difference_bytes": self.difference_bytes,
            "difference_percent": round(percent, 2) if percent is not None else None,
        }


def compare_buffers(result: RunResult, est: Estimate) -> list[BufferRow]:
    """llama.cpp's reported buffers (all devices summed) against the estimate's, by kind. The
    model buffers are the mapped or loaded weights; ``*_REPACK`` ones are the CPU's repacked copy."""
    b = result.buffers
    weights = sum(v for k, v in b.model_buffers.items() if not k.endswith("_REPACK"))
    repack = sum(v for k, v in b.model_buffers.items() if k.endswith("_REPACK"))
    rows = [
        BufferRow("weights", weights, est.weights_bytes),
        BufferRow("repack", repack, est.repack_bytes),
        BufferRow("kv_cache", b.total("kv"), est.kv_cache_bytes),
        BufferRow("recurrent_state", b.total("rs"), est.recurrent_state_bytes),
        BufferRow("compute", b.total("compute"), est.compute_bytes),
        BufferRow("output", b.total("output"), est.output_bytes),
    ]
    return [r for r in rows if r.measured_bytes or r.estimated_bytes]


def measured_efficiency(decode_tokens_per_s: float, bytes_per_token: float, bandwidth_gb_s: float) -> float:
    """Share of the bandwidth roofline a measured decode speed reached (0..1, may exceed 1 when
    caches help on small models)."""
    if bandwidth_gb_s <= 0:
        return 0.0
    return decode_tokens_per_s * bytes_per_token / (bandwidth_gb_s * 1e9)


def diagnose(result: RunResult, est: Estimate | None, speed: SpeedEstimate | None) -> list[str]:
    """Sentences saying what probably happened when the run and the estimate disagree."""
    out = []
    s = result.settings
    if s.gpu_layers != 0 and not result.gpu_offload_supported and not s.rpc_servers:
        out.append(
            "This llama-cpp-python was built without GPU support, so every layer ran on the CPU. For an "
            f"NVIDIA GPU install the CUDA build: {CUDA_INSTALL_HINT}"
        )
    b = result.buffers
    wanted = b.layers_offloadable if s.gpu_layers == "all" else s.gpu_layers if s.gpu_layers != "auto" else None
    if (
        b.layers_offloaded is not None
        and wanted is not None
        and b.layers_offloaded < min(wanted, b.layers_offloadable or wanted)
    ):
        out.append(
            f"Only {b.layers_offloaded} of the {wanted} layers asked for were offloaded to the GPU; the rest ran "
            "on the CPU."
        )
    decode: Spread | None = summary(result)["decode_tokens_per_s"]
    if decode is not None and speed is not None and speed.decode_tokens_per_s.high > 0:
        lo, hi = speed.decode_tokens_per_s.low, speed.decode_tokens_per_s.high
        estimated = rate_range(speed.decode_tokens_per_s)
        if decode.median < 0.5 * lo:
            on_gpu = s.gpu_layers != 0 and result.gpu_offload_supported
            causes = (
                "layers spilling into system memory (on NVIDIA, shared GPU memory), other programs using the GPU, "
                "or fewer layers on the GPU than planned"
                if on_gpu
                else "other programs using the CPU, a memory bandwidth below the one measured, or fixed costs per "
                "token that weigh heavily on small models"
            )
            out.append(
                f"Decoding ran at {rate(decode.median)} tokens/s, far below the {estimated} "
                f"estimated. Likely causes: {causes}."
            )
        elif decode.median > 1.5 * hi:
            out.append(
                f"Decoding ran at {rate(decode.median)} tokens/s, well above the {estimated} "
                "estimated: the estimate is cautious for this machine."
            )
    if est is not None and not est.fits:
        out.append("The estimate said these settings do not fit; the run shows what actually happened.")
    return out


CONTENDED_SHARE = 0.25  # other programs used a quarter of the machine's CPUs or more
SLOW_FACTOR = 0.5  # decode below half the lowest the estimate allows
IMPLAUSIBLE_FACTOR = 0.2  # decode below a fifth of it: nothing about this machine's memory explains that
UNSTEADY_RATIO = 1.5  # repetitions whose decode speeds differ by more than half


def disturbance(result: RunResult, speed: SpeedEstimate | None) -> str | None:
    """Why a run must not calibrate this machine's estimates, or None when nothing disturbed it: it
    ran slow while other programs used the processor or the machine was running hot, it ran at under
    a fifth of the slowest speed the estimate allows (something else was slowing the machine, or the
    model is too small for its speed to say anything about larger ones), or its repetitions
    disagreed by more than half. A sentence a person can act on."""
    decode = summary(result)["decode_tokens_per_s"]
    if decode is None:
        return None
    low = speed.decode_tokens_per_s.low if speed is not None else 0.0
    slow = low > 0 and decode.median < SLOW_FACTOR * low
    share = result.others_cpu_share
    if slow and share is not None and share >= CONTENDED_SHARE:
        return (
            f"other programs used {share:.0%} of the processor while it ran, and it decoded at {rate(decode.median)} "
            f"tokens/s against {rate_range(speed.decode_tokens_per_s) if speed else 'the estimate'}"
        )
    if slow and result.hot_sensor:
        return f"the machine was running hot ({result.hot_sensor}) and it decoded at {rate(decode.median)} tokens/s"
    if low > 0 and decode.median < IMPLAUSIBLE_FACTOR * low:
        assert speed is not None
        return (
            f"it decoded at {rate(decode.median)} tokens/s, under a fifth of the slowest the estimate allows "
            f"({rate_range(speed.decode_tokens_per_s)}): something else was slowing the machine, or the model is too "
            "small for its speed to say anything about larger ones"
        )
    speeds = [r.decode_tokens_per_s_llama or r.decode_tokens_per_s_wall or 0.0 for r in result.completed_runs]
    speeds = [v for v in speeds if v > 0]
    if len(speeds) >= 3 and max(speeds) > UNSTEADY_RATIO * min(speeds):
        return (
            f"its speed changed by more than half between repetitions ({rate(min(speeds))} to {rate(max(speeds))} "
            "tokens/s): something else was using the machine"
        )
    return None


@dataclass(frozen=True)
class RunEstimate:
    estimate: Estimate
    speed: SpeedEstimate
    efficiency: tuple[str, float] | None  # (target name, measured decode efficiency) when one device did the work


def estimate_for_run(
    result: RunResult,
    arch: Architecture,
    tensors: Sequence[TensorInfo],
    targets: list[Target],
    repack: str,
) -> RunEstimate:
    """The estimate and speed estimate for the run's own settings and prompt, and, when a single
    device held every layer, the decode efficiency the run reached on it."""
    s = result.settings
    est = estimate(arch, tensors, estimate_settings(s, repack), targets)
    prompt = result.runs[0].prompt_tokens if result.runs else (s.prompt_tokens or 512)
    depth = prompt + s.depth_tokens
    speed = estimate_speed(arch, tensors, est, targets, prompt_tokens=max(prompt, 1), depth_tokens=depth)
    efficiency = None
    decode = summary(result)["decode_tokens_per_s"]
    reading = active_bytes_by_device(arch, tensors, est)
    busy = [i for i, w in enumerate(reading) if w > 0]
    if decode is not None and len(busy) == 1:
        device = est.devices[busy[0]]
        target = next((t for t in targets if t.name == device.name), None)
        if target is not None:
            per_token = reading[busy[0]] + kv_read_bytes(est, depth)
            efficiency = (target.name, measured_efficiency(decode.median, per_token, target.bandwidth_gb_s))
    return RunEstimate(est, speed, efficiency)


@dataclass(frozen=True)
class Efficiency:
    """The share of the bandwidth roofline a run's decode reached on ``target``."""

    target: str
    value: float
    n_threads: int | None = None


@dataclass(frozen=True)
class RunReport:
    """A finished live run, held against the estimate for its own settings: what the Run tab shows,
    what ``fitscope run`` prints, and what the history keeps. Built by ``make_run_report``; saving
    fills ``history_id`` (or ``unsaved_path`` and ``save_message``) in a copy."""

    result: RunResult
    model_label: str
    run_estimate: RunEstimate | None = None
    comparison: tuple[BufferRow, ...] = ()
    diagnosis: tuple[str, ...] = ()
    # Measured with llama-server's threads, one device busy: calibrates this machine's estimates
    # unless the run was disturbed (``disturbed`` says how; then ``calibrates`` is False).
    measured_efficiency: Efficiency | None = None
    # Reached with other threads: shown, never used for calibration; calibration_note says why.
    uncalibrated_efficiency: Efficiency | None = None
    calibration_note: str | None = None
    thread_sweep: tuple[SweepRow, ...] = ()
    disturbed: str | None = None
    """Why the run must not calibrate (:func:`disturbance`); None when nothing disturbed it."""
    rpc: dict[str, Any] | None = None  # the RPC plan and servers of a run across machines
    history_id: int | None = None
    unsaved_path: str | None = None
    save_message: str | None = None

    @property
    def estimate(self) -> Estimate | None:
        return self.run_estimate.estimate if self.run_estimate is not None else None

    @property
    def calibrates(self) -> bool:
        """Whether this run's efficiency calibrates this machine's estimates."""
        return self.measured_efficiency is not None and self.disturbed is None and self.rpc is None

    def estimate_json(self) -> dict[str, Any] | None:
        """The estimate as ``fitscope estimate --json`` names it, with the speed ranges."""
        if self.run_estimate is None:
            return None
        speed = self.run_estimate.speed
        return estimate_json(self.run_estimate.estimate) | {
            "decode_tokens_per_s": speed.decode_tokens_per_s.as_dict(),
            "prefill_tokens_per_s": speed.prefill_tokens_per_s.as_dict(),
            "ttft_s": speed.ttft_s.as_dict(),
        }

    def notes(self) -> list[str]:
        """The sentences under the figures: the diagnosis, then why the run does not calibrate."""
        return list(self.diagnosis) + ([self.calibration_note] if self.calibration_note else [])

    def to_json(self) -> dict[str, Any]:
        """The headless JSON: measured figures (medians, with every repetition), llama.cpp's reported
        buffers and the estimate side by side, named as ``fitscope estimate --json`` names them."""
        result = self.result
        stats = summary(result)

        def median(key: str) -> float | None:
            value = stats[key]
            return round(value.median, 4) if value is not None else None

        b = result.buffers
        threads = result.threads
        out: dict[str, Any] = {
            "model": self.model_label,
            "gguf_path": result.settings.gguf_path,
            "model_sha256": result.model_sha256,
            "mode": result.settings.mode,
            "settings": result.settings.model_dump(),
            "llama_cpp_version": result.llama_cpp_version,
            "threads": None
            if threads is None
            else {
                "n_threads": threads.n_threads,
                "llama_server_threads": threads.llama_server_threads,
                "like_llama_server": threads.is_llama_default,
                "text": threads.describe(),
            },
            "gpu_offload_supported": result.gpu_offload_supported,
            "prompt_format": result.prompt_format,
            "load_s": round(result.load_s, 4),
            "ttft_s": median("ttft_s"),
            "prefill_tokens_per_s": median("prefill_tokens_per_s"),
            "decode_tokens_per_s": median("decode_tokens_per_s"),
            "prefill_tokens_per_s_wall": median("prefill_tokens_per_s_wall"),
            "decode_tokens_per_s_wall": median("decode_tokens_per_s_wall"),
            "itl_p50_s": median("itl_p50_s"),
            "itl_p95_s": median("itl_p95_s"),
            "peak_rss_bytes": result.peak_rss_bytes,
            "spread": {k: (v.model_dump() if v is not None else None) for k, v in stats.items()},
            "runs": [r.model_dump(exclude={"token_times_s"}) for r in result.runs],
            "measured_buffers": {
                "model_buffers": b.model_buffers,
                "kv_buffers": b.kv_buffers,
                "rs_buffers": b.rs_buffers,
                "compute_buffers": b.compute_buffers,
                "output_buffers": b.output_buffers,
                "layers_offloaded": b.layers_offloaded,
            },
        }
        estimate = self.estimate_json()
        if estimate is not None:
            out["estimate"] = estimate
        if estimate is not None or self.comparison:
            out["comparison"] = [row.to_json() for row in self.comparison]
        out["calibrates"] = self.calibrates
        if self.disturbed is not None:
            out["disturbed"] = self.disturbed
        if self.measured_efficiency is not None:
            e = self.measured_efficiency
            out["measured_efficiency"] = {"target": e.target, "value": e.value, "n_threads": e.n_threads}
        if self.uncalibrated_efficiency is not None:
            e = self.uncalibrated_efficiency
            out["uncalibrated_efficiency"] = {"target": e.target, "value": e.value}
        if self.calibration_note:
            out["calibration_note"] = self.calibration_note
        out["diagnosis"] = list(self.diagnosis)
        if self.thread_sweep:
            out["thread_sweep"] = [row.model_dump() for row in self.thread_sweep]
        if self.rpc is not None:
            out["rpc"] = self.rpc
        if self.history_id is not None:
            out["history_id"] = self.history_id
        if self.save_message is not None:
            out["unsaved_path"] = self.unsaved_path
            out["message"] = self.save_message
        return out


def make_run_report(
    result: RunResult,
    model_label: str,
    run_estimate: RunEstimate | None,
    thread_sweep: Sequence[SweepRow] = (),
) -> RunReport:
    """The report for a finished run against the estimate for its own settings (None when no
    estimate could be made: the measured figures still stand)."""
    if run_estimate is None:
        return RunReport(
            result, model_label, None, diagnosis=tuple(diagnose(result, None, None)), thread_sweep=tuple(thread_sweep)
        )
    est = run_estimate.estimate
    comparison = tuple(compare_buffers(result, est))
    measured = uncalibrated = None
    note = None
    disturbed = disturbance(result, run_estimate.speed)
    threads = result.threads
    if run_estimate.efficiency is not None:
        target, value = run_estimate.efficiency
        if threads is None or threads.is_llama_default:
            measured = Efficiency(target, value, threads.n_threads if threads else None)
        else:
            # A run with other threads than llama-server's measures another configuration: shown,
            # never mixed into this machine's calibration.
            uncalibrated = Efficiency(target, value)
            note = f"Not used to calibrate this machine's estimates: it ran with {threads.describe()}."
    if disturbed is not None and note is None:
        note = f"Not used to calibrate this machine's estimates: {disturbed}. Run it again when the machine is idle."
    return RunReport(
        result,
        model_label,
        run_estimate,
        comparison=comparison,
        diagnosis=tuple(diagnose(result, est, run_estimate.speed)),
        measured_efficiency=measured,
        uncalibrated_efficiency=uncalibrated,
        calibration_note=note,
        thread_sweep=tuple(thread_sweep),
        disturbed=disturbed,
    )


def time_left(done: int, total: int, elapsed_s: float) -> str:
    """How long the rest of a multi-repeat run will take, from the repetitions done so far ("about 2
    min 40 s left"); "" before the first is done or after the last."""
    if done <= 0 or done >= total or elapsed_s <= 0:
        return ""
    seconds = round(elapsed_s / done * (total - done))
    if seconds < 60:
        return f"about {max(seconds, 1)} s left"
    minutes, rest = divmod(seconds, 60)
    if minutes >= 10:
        return f"about {minutes + (rest >= 30)} min left"
    return f"about {minutes} min {rest} s left" if rest else f"about {minutes} min left"
