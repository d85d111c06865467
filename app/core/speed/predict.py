"""How fast a placed model runs: decode from the memory-bandwidth roofline, prefill from FLOPs.

Decode is memory-bound: each new token reads every active weight once plus the KV cache up to
the current depth, so tokens/s <= efficiency x bandwidth / bytes read. Mixture-of-experts models
read only the routed share of their expert tensors. With partial offload, each device reads its
own share and the times add up. Prefill is compute-bound: about 2 FLOPs per active parameter per
token at the prompt kernels' batch efficiency (``prefill_batch_factor``: a mixture of experts' experts
each get few rows of a ubatch), plus attention over the context and each ubatch's read of the weights
it uses.

With weights in system memory beside a GPU (``--n-cpu-moe``, a partial ``-ngl``), the host's share
of a decoded token is read at the host's bandwidth and computed on the CPU's threads, with a
handoff between GPU and CPU at every layer holding host-resident weights; a prompt's matrix products
run on GPU 0, which copies the host-resident weights each ubatch uses over PCIe (llama.cpp's op
offload, ``ggml_backend_sched_backend_id_from_cur`` and ``ggml_backend_sched_compute_splits``), so
``-ub`` and the link matter.

The constants per device family (decode efficiency, a fixed cost per layer per token, prefill
rate factors) and for the host's share (``HybridConstants``) are fitted on published llama-bench
results (``app.core.speed.model``), for the llama.cpp builds from ``SpeedModel.builds_from`` on (a
GPU decoded about a tenth slower on older ones, which the fit reads at a rate of their own); every
figure is a range that held about 80% of published results for hardware left out of the fit, and a
later measurement on the user's machine replaces it. Several users share each decode step: the
weights are read once per step (a mixture of experts: every expert any of the users routes to), each
user's KV cache once per user, and on a GPU each further user's row costs arithmetic on the shader ALUs
(``SpeedModel.row_flop_per_param``: Metal's kernels at a cost of their own; fitted on published runs of
1-8 rows per step).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from app.core.hardware.host_memory import DEFAULT_PCIE, pcie_gb_s, pcie_label
from app.core.memory import backends
from app.core.memory.kv import memo_per_arch
from app.core.memory.layers import device_runs, tensor_totals
from app.core.memory.records import Estimate, Settings, Target
from app.core.memory.targets import NOMINAL_GHZ, busy_clock_ghz
from app.core.model.architecture import Architecture
from app.core.model.tensors import TensorInfo
from app.core.speed.model import (
    HybridConstants,
    decode_seconds_per_token,
    host_decode_seconds,
    load_speed_model,
    offload_copy_seconds,
    prefill_batch_factor,
    prefill_factor,
    speed_family,
    ubatch_read_seconds,
)
from app.core.speed.reads import (
    active_params,
    attention_flops,
    attention_layers,
    kv_read_bytes,
    placement,
    weight_mix,
)

# This machine's CPU against its own measured read bandwidth (not a spec sheet): llama.cpp's CPU
# backend reaches 0.70-0.90 of it (shared/reference: "CPUs 0.7-0.9 of a measured read bandwidth").
# Every other device uses the constants fitted on published results (app.core.speed.model).
DECODE_EFFICIENCY: dict[str, tuple[float, float]] = {"cpu": (0.70, 0.90)}


# llama.cpp builds whose cost of further decode rows (several users) published runs of 1-8 rows per
# step check little or not at all (tests/data/microbatch_runs.json, scripts/fit_rows.py): CUDA and
# ROCm builds are checked by eleven sources; Metal's own constant rests on one source's two chips, and
# no run is published for Vulkan or SYCL builds.
USERS_UNCHECKED = frozenset({"metal", "vulkan", "sycl"})
UNCHECKED_USERS_EVIDENCE = (
    "published runs of several rows per step check it on CUDA and ROCm builds (each user's share of a step "
    "within 10% of them, median, held out from the fit); Metal's own cost is fitted on one source's runs (an "
    "M1 Pro and an M2 Ultra, late 2024), each chip's within 23% of the estimate fitted on the other's (median) "
    "and up to 1.6 times as slow; none is published for Vulkan or SYCL builds"
)

# Intel's GPU families rest on two published sources that both ran one card (the Arc Pro B70). Sources
# kept out of the fit (tests/data/llama_bench_fresh.md, second batch) say how far that travels.
THIN_FAMILIES = ("intel-sycl", "intel-vulkan")
THIN_FAMILY_EVIDENCE = (
    "its constants are fitted on two published sources that both ran one card, the Arc Pro B70; on sources "
    "kept out of the fit an Arc B580 and a third B70 host prefilled 2.6-3.3 times as fast as predicted (SYCL), "
    "an Arc A770 at a quarter of it (Vulkan), and a 1.5B model decoded at 0.6 times the prediction on the B580, "
    "while 7B-31B models decoded within 3%"
)


@dataclass(frozen=True)
class Range:
    low: float
    high: float

    def as_dict(self) -> dict[str, float]:
        return {"low": round(self.low, 2), "high": round(self.high, 2)}


@dataclass(frozen=True)
class SpeedEstimate:
    decode_tokens_per_s: Range
    prefill_tokens_per_s: Range
    ttft_s: Range
    prompt_tokens: int
    depth_tokens: int
    assumptions: tuple[str, ...]
    users: int = 1
    decode_typical: float = 0.0  # tokens/s per user at the fitted constants (inside the range)
    prefill_typical: float = 0.0  # prompt tokens/s at the fitted constants (inside the range)

    @property
    def decode_total_tokens_per_s(self) -> Range:
        """Every user's tokens together (decode steps are shared by the users)."""
        return Range(self.decode_tokens_per_s.low * self.users, self.decode_tokens_per_s.high * self.users)


def vector_tflops(target: Target) -> float:
    """A GPU's FP32 rate on its shader ALUs, the rate of the small-batch decode kernels; where it is not
    known, half its FP16 tensor rate (a GeForce card's ratio since 2020)."""
    return target.vector_tflops or target.fp16_tflops / 2


def decode_tflops(target: Target) -> float:
    """The FP16 rate a device's decode arithmetic is modelled at: a GPU's quantized kernels' rate where it is
    below its matrix peak (``Target.prompt_tflops``: an RDNA 4 card's packed-FP16 rate); a CPU's
    ``fp16_tflops`` (its decode kernels use every SIMD lane)."""
    if target.kind == "gpu" and target.prompt_tflops:
        return target.prompt_tflops
    return target.fp16_tflops


def thread_share(target: Target, settings: Settings) -> tuple[float, int]:
    """(share of the CPU's FLOP/s the threads reach, threads): ``-t`` of the physical cores (llama.cpp's
    default is all of them, a hybrid CPU's performance cores: ``Target.cpu_default_threads``; threads
    beyond the cores add nothing)."""
    cores = target.cpu_cores
    if not cores:
        return 1.0, settings.threads or 0
    threads = settings.threads or target.cpu_default_threads or cores
    return min(threads, cores) / cores, threads


def estimate_speed(
    arch: Architecture,
    tensors: Sequence[TensorInfo],
    est: Estimate,
    targets: list[Target],
    prompt_tokens: int = 512,
    depth_tokens: int | None = None,
    measured_efficiency: dict[str, float] | None = None,
    users: int = 1,
) -> SpeedEstimate:
    """Decode and prefill tokens/s ranges and time to first token for ``prompt_tokens``.

    ``depth_tokens`` is the context already in the cache when decoding (default: the prompt).
    ``measured_efficiency`` maps a target name to a decode efficiency measured on this machine,
    which then replaces the class range (±10%).
    """
    settings: Settings = est.settings
    depth = prompt_tokens if depth_tokens is None else depth_tokens
    by_name = {t.name: t for t in targets}
    n_ub = max(1, min(settings.effective_ubatch, prompt_tokens))
    model = load_speed_model()
    where = placement(arch, tensors, est, n_ub, model.routing_exponent, rows=users)
    weights = where.bytes_per_token
    kv_read = kv_read_bytes(est, depth)
    kv_cpu_read = kv_read_bytes(est, depth, as_f16=True)
    n_attn_layers = attention_layers(arch)
    assumptions = []

    h = model.hybrid
    params = active_params(arch, tensors)
    group = "hybrid" if where.hybrid else None
    bands = []
    t_mid = 0.0  # seconds per token at the fitted constants
    t_low = t_high = 0.0  # seconds per token, optimistic / pessimistic
    t_roof = 0.0  # the physical floor: every byte at full bandwidth
    prefill_s_per_flop = 0.0  # seconds per FLOP of a prompt token, summed over the devices' shares
    narrow_prompt = ""  # a CPU whose AVX-512 the quantized prompt kernels do not use
    packed_prompt = ""  # a GPU whose quantized kernels run below its matrix peak (RDNA 4)
    clocked: tuple[str, float] | None = None  # a CPU whose clocks are known, and the clock it computes at
    unchecked_users = ""  # a GPU on a build whose slowdown with several users no published run checks
    thin = ""  # a GPU whose family's constants rest on one card's runs (THIN_FAMILIES)
    rows_gpu: Target | None = None  # the first GPU computing users' rows
    row_flop = model.row_flop_per_param(est.backend)  # FLOP per parameter of each further user's row
    float_share, quant_format = weight_mix(tensors)
    host = len(est.devices) - 1
    moe_here, recurrent_here = _layer_kinds(arch, est)
    # The ubatch's matrix rate against the kernels' full rate: each routed expert gets a few of its rows.
    routed = sum(tensor_totals(arch, tensors).active_expert_params)
    moe = arch.moe
    batch_factor = prefill_batch_factor(
        n_ub,
        moe.n_expert_used if moe else 0,
        moe.n_expert if moe else 0,
        routed / params if params else 0.0,
        model.prefill_half_tokens,
        model.routing_exponent,
    )
    read_s = 0.0  # seconds a prompt ubatch spends reading the weights, summed over the devices
    gpu0 = by_name.get(est.devices[0].name) if est.devices[0].kind == "gpu" else None
    offloaded = gpu0 is not None and backends.offloads_ops(est.backend, n_ub)
    for i, (d, w) in enumerate(zip(est.devices, weights, strict=True)):
        target = by_name.get(d.name)
        if target is None or (w == 0 and d.kind == "gpu"):
            continue
        family = target_family(target, est.backend)
        c = model.constants(family)
        if d.kind == "gpu" and family in THIN_FAMILIES:
            thin = thin or target.name
        if users > 1 and d.kind == "gpu" and est.backend in USERS_UNCHECKED:
            unchecked_users = unchecked_users or f"{target.name} ({est.backend})"
        (d_lo, d_hi), band_pp = model.intervals(family, group)
        kv_share = (kv_cpu_read if d.kind == "cpu" and not where.hybrid else kv_read) * (d.layers / n_attn_layers)
        # Each user's decoded token attends over its own cache (what a slow attention kernel costs).
        attn_here = attention_flops(arch, est, depth) * min(d.layers / n_attn_layers, 1.0) * users
        # One decode step reads the weights once for every user, and each user's own KV cache.
        bytes_read = w + kv_share * users
        bw = target.bandwidth_gb_s * 1e9
        t_roof += bytes_read / bw
        threads, n_threads = thread_share(target, settings) if d.kind == "cpu" else (1.0, 0)
        # The weights' formats read at their own rates on a GPU (``SpeedModel.decode_format``).
        read_factor = model.read_factor(memory_kind(target), float_share, quant_format)
        host_share = i == host and where.hybrid
        # A CPU running the model alone computes at the clock its busy cores hold (``busy_clock_ghz``; nominal
        # where not known). A GPU's host keeps the nominal clock its constants were fitted at: counted at the
        # hosts' own clocks, the published runs with weights in RAM decoded further from their predictions.
        clock = 0.0
        if d.kind == "cpu":
            known = target.cpu_clocks_ghz if not host_share else None
            clock = busy_clock_ghz(n_threads or None, target.cpu_cores, known)
            if known:
                clocked = (target.name, clock)
        tflops = decode_tflops(target) * threads * (clock / NOMINAL_GHZ if clock else 1.0)
        # A GPU computes the first row at its family's constants and each further row (another user) at
        # the work published runs of 1-8 rows per step show, on its shader ALUs (``decode_row_flop_per_param``);
        # a CPU computes every user's row at its family's constants.
        gpu_rows = d.kind == "gpu" and not host_share
        params_here = where.params_per_token[i] * (1 if gpu_rows else users)
        rows_s = 0.0
        if gpu_rows:
            rows_gpu = rows_gpu or target
            rows_s = (users - 1) * row_flop * params_here / (vector_tflops(target) * 1e12)
        measured = bool(measured_efficiency and d.name in measured_efficiency)
        measured_read = False  # this device's decode range is its read at this machine's measured bandwidth

        if host_share:
            eff = None
            if measured:
                eff = (measured_efficiency or {})[d.name]
            elif target.efficiency_class == "cpu":
                eff = sum(DECODE_EFFICIENCY["cpu"]) / 2
            t = host_decode_seconds(
                bytes_read, target.bandwidth_gb_s, params_here, tflops, where.host_layers, h, eff, quant_format
            )
            # Memory named without its speed: the fast end reads at its generation's fastest common grade,
            # the slow end at the grade modules run without a faster profile.
            t_slow = t_fast = t
            span = target.bandwidth_span_gb_s
            if span:
                t_slow, t_fast = (
                    host_decode_seconds(bytes_read, bw, params_here, tflops, where.host_layers, h, eff, quant_format)
                    for bw in span
                )
            t_mid += t
            t_low += t_fast / d_hi
            t_high += t_slow / d_lo
            assumptions.append(
                f"{d.name}: reads {w / 1e9:.2f} GB of host-resident weights per token at {target.bandwidth_gb_s:.0f} "
                f"GB/s ({eff if eff is not None else h.host_efficiency:.2f} of it), computed on "
                f"{n_threads or 'all'} CPU thread(s) ({tflops:.1f} TFLOPS{_format_work(h, quant_format)}), with a "
                f"GPU-CPU handoff at each of {where.host_layers} layers ({h.sync_s * 1e6:.0f} us each; fitted on "
                f"{h.rows} published rows with weights in system memory)."
            )
            if span:
                assumptions.append(
                    f"The host memory's speed is not stated: the decode range reads it at {span[0]:.0f}-{span[1]:.0f} "
                    "GB/s (its generation's base grade, as modules run with no XMP/EXPO profile, to its fastest "
                    "common one); naming the speed narrows it."
                )
        elif measured:
            m = (measured_efficiency or {})[d.name]
            t_low += bytes_read / (min(1.0, m * 1.1) * bw) + rows_s / d_hi
            t_high += bytes_read / (m * 0.9 * bw) + rows_s / d_lo
            t_mid += bytes_read / (m * bw) + rows_s
            assumptions.append(f"{d.name}: decode efficiency {m:.2f} measured on this machine.")
        elif target.efficiency_class == "cpu":
            # This machine's measured read bandwidth: llama.cpp's CPU backend reaches 0.70-0.90 of it;
            # the CPU family's fixed cost per layer and its arithmetic on the threads come on top.
            eff_lo, eff_hi = DECODE_EFFICIENCY["cpu"]
            fixed = decode_seconds_per_token(
                0.0,
                max(d.layers, 1),
                target.bandwidth_gb_s,
                c,
                params_here,
                tflops,
                moe_here[i],
                recurrent_here[i],
                attn_here,
            )
            # The fitted cost varies between CPUs as the published ones' held-out results do.
            t_low += bytes_read / (eff_hi * bw) + fixed / d_hi
            t_high += bytes_read / (eff_lo * bw) + fixed / d_lo
            t_mid += bytes_read / ((eff_lo + eff_hi) / 2 * bw) + fixed
            measured_read = True
            assumptions.append(
                f"{d.name}: reads {w / 1e9:.2f} GB of weights per token at a measured "
                f"{target.bandwidth_gb_s:.0f} GB/s, efficiency {eff_lo:.2f}-{eff_hi:.2f}, plus {fixed * 1e3:.1f} ms of "
                f"fixed and arithmetic cost per token ({family} constants, {n_threads or 'all'} thread(s))."
            )
        else:
            t = rows_s + decode_seconds_per_token(
                bytes_read,
                max(d.layers, 1),
                target.bandwidth_gb_s,
                c,
                params_here,
                tflops,
                moe_here[i],
                recurrent_here[i],
                attn_here,
                read_factor,
            )
            t_mid += t
            t_low += t / d_hi
            t_high += t / d_lo
            assumptions.append(
                f"{d.name}: reads {w / 1e9:.2f} GB of weights per token at {target.bandwidth_gb_s:.0f} GB/s; "
                f"{family} constants for llama.cpp builds from {model.builds_from} on ({model.builds_from_date}), "
                "fitted on published "
                f"llama-bench results ({c.devices} devices): "
                f"{c.decode_efficiency * read_factor:.2f} of the bandwidth"
                + (f" for {_format_words(float_share, quant_format)}" if read_factor != 1.0 else "")
                + f", {c.per_layer_s * 1e6:.0f} us per layer."
            )
        bands.append(((d_lo, d_hi), band_pp, w if not host_share else 0.0, measured_read))
        # Prefill: this device's share of the parameters, at its own rate, or at GPU 0's when the
        # host's matrix products are offloaded there.
        share = where.params_per_token[i] / max(sum(where.params_per_token), 1.0)
        rate_target, rate_c = target, c
        if host_share and offloaded and gpu0 is not None:
            rate_target, rate_c = gpu0, model.constants(target_family(gpu0, est.backend))
        rate_tflops = rate_target.fp16_tflops * (
            threads * clock / NOMINAL_GHZ if rate_target is target and clock else 1.0
        )
        build = est.backend if rate_target.kind == "gpu" else "cpu"
        # The quantized weights at their format's rate (``SpeedModel.prefill_format``), the float ones at the
        # family's float factor.
        quant_factor = prefill_factor(rate_c, False, build) * model.format_factor(
            "cpu" if build == "cpu" else "gpu", quant_format
        )
        if rate_target.prompt_tflops and float_share < 1.0:
            # Quantized prompt kernels below the device's peak (``Target.prompt_tflops``): a CPU's at AVX2's
            # width (``targets.PROMPT_LANES``), an RDNA 4 card's at its packed-FP16 rate.
            quant_factor *= rate_target.prompt_tflops / rate_target.fp16_tflops
            if rate_target.prompt_tflops < rate_target.fp16_tflops:
                if build == "cpu":
                    narrow_prompt = rate_target.name
                else:
                    packed_prompt = rate_target.name
        factor = prefill_factor(rate_c, True, build) * float_share + quant_factor * (1 - float_share)
        prefill_s_per_flop += share / (factor * rate_tflops * 1e12)
        if i < len(where.ubatch_bytes):
            read_s += ubatch_read_seconds(
                where.ubatch_bytes[i], target.bandwidth_gb_s, c, read_factor if not measured else 1.0
            )
    # Per user: one decode step gives each of the users one token.
    t_low = max(t_low, t_roof)
    t_mid = max(t_mid, t_roof)
    decode = Range(1.0 / t_high if t_high else 0.0, 1.0 / t_low if t_low else 0.0)
    decode_mid = 1.0 / t_mid if t_mid else 0.0

    attn_flops = attention_flops(arch, est, prompt_tokens // 2)
    flops_per_token = 2 * params / max(batch_factor, 1e-9) + attn_flops
    # The range of the device doing most of the work.
    (d_lo, d_hi), (p_lo, p_hi), _, measured_read = (
        max(bands, key=lambda b: b[2]) if bands else ((1.0, 1.0), (1.0, 1.0), 0, False)
    )
    ubatch_s = n_ub * flops_per_token * prefill_s_per_flop + read_s
    copy_s = slow_copy_s = 0.0
    if where.hybrid and offloaded and gpu0 is not None:
        gen, lanes = (gpu0.pcie_gen, gpu0.pcie_lanes) if gpu0.pcie_gen and gpu0.pcie_lanes else DEFAULT_PCIE
        pinned = not settings.mmap
        copy_s = slow_copy_s = offload_copy_seconds(where.copy_bytes, pcie_gb_s(gen, lanes), pinned, h)
        assumptions.append(
            f"Prompt: the CPU-held weights' matrix products run on {gpu0.name}, which copies "
            f"{where.copy_bytes / 1e9:.1f} GB of them per ubatch of {n_ub} tokens over {pcie_label(gen, lanes)} "
            f"({h.pcie_pinned if pinned else h.pcie_pageable:.2f} of the link, "
            + ("pinned memory with --no-mmap" if pinned else "memory-mapped pages; --no-mmap pins them")
            + "): a larger -ub copies them fewer times."
        )
        if not gpu0.pcie_stated and lanes > 1:
            # The card's link as sold; the board may give it half (a second slot wired x8, or a board
            # one generation older): the low end copies at that, as the fit judges hosts it is not told.
            slow_copy_s = offload_copy_seconds(where.copy_bytes, pcie_gb_s(gen, lanes // 2), pinned, h)
            assumptions.append(
                f"The slot's link is not known: the low end of the prefill range copies over "
                f"{pcie_label(gen, lanes // 2)} (a slot wired x{lanes // 2}, or a board one PCIe generation older); "
                "setting the PCIe link narrows it."
            )
    busy = ubatch_s + copy_s
    rate = n_ub / busy if busy > 0 and bands else 0.0
    slow_rate = n_ub / (ubatch_s + slow_copy_s) if busy > 0 and bands else 0.0
    prefill = Range(slow_rate * p_lo, rate * p_hi)
    if prefill.high and decode.high:
        # Prefill can never be slower per token than decoding the same tokens one by one.
        prefill = Range(max(prefill.low, decode.low), max(prefill.high, decode.high))
    ttft = Range(
        prompt_tokens / prefill.high + 1 / max(decode.high, 1e-9) if prefill.high else 0.0,
        prompt_tokens / prefill.low + 1 / max(decode.low, 1e-9) if prefill.low else 0.0,
    )
    assumptions.append(
        f"Decode at a depth of {depth} tokens (KV read {kv_read / 1e6:.1f} MB per token); "
        f"prefill of {prompt_tokens} tokens at {flops_per_token / 1e9:.1f} GFLOP per token; ubatch "
        f"{settings.effective_ubatch}."
    )
    if clocked:
        assumptions.append(
            f"{clocked[0]}: computes at {clocked[1]:.1f} GHz, the clock its busy cores hold (its base clock with "
            "every core working, nearer its boost clock on fewer threads)."
        )
    if narrow_prompt:
        assumptions.append(
            f"{narrow_prompt}: llama.cpp's prompt kernels for quantized weights work at AVX2's width "
            "(8 FP32 lanes), so AVX-512 does not double the prefill rate."
        )
    if packed_prompt:
        assumptions.append(
            f"{packed_prompt}: llama.cpp's kernels for quantized weights are modelled at its shaders' packed-FP16 "
            "rate, half its matrix peak: published RDNA 4 runs measure there (float weights run at the peak)."
        )
    if thin:
        assumptions.append(f"{thin}: read these speeds as rough: {THIN_FAMILY_EVIDENCE}.")
    if arch.moe:
        assumptions.append(
            f"Mixture of experts: {arch.moe.n_expert_used} of {arch.moe.n_expert} experts read per token."
        )
    if users > 1 and bands:
        assumptions.append(
            f"Several users: each decode step reads the weights once for all {users} (a mixture of experts: every "
            f"expert any of them routes to), each user's cache apart; "
            + (
                f"each further user's token costs {row_flop:.1f} FLOP per parameter on "
                f"the GPU's shader ALUs ({vector_tflops(rows_gpu):.1f} TFLOPS FP32), fitted on published runs "
                "of 1-8 rows per step"
                + (f" of {est.backend.capitalize()} builds" if est.backend in model.decode_row_flop_by_build else "")
                if rows_gpu
                else "on the CPU each user's token costs its arithmetic per parameter again"
            )
            + (
                f"; for {unchecked_users} it is checked little or not at all: {UNCHECKED_USERS_EVIDENCE}, so the "
                "speed per user may be lower."
                if unchecked_users
                else "."
            )
        )
    assumptions.append(
        "Ranges hold about 80% of published results for hardware the model was not fitted on "
        + (
            f"(decode: the fixed and arithmetic cost x{d_lo:.2f}-x{d_hi:.2f}, the read at the measured bandwidth's "
            "efficiency above; "
            if measured_read
            else f"(decode x{d_lo:.2f}-x{d_hi:.2f}, "
        )
        + f"prefill x{p_lo:.2f}-x{p_hi:.2f}"
        + (", from runs with weights in system memory" if where.hybrid else "")
        + f"); for {users} user(s) at once."
    )
    return SpeedEstimate(
        decode,
        prefill,
        ttft,
        prompt_tokens,
        depth,
        tuple(assumptions),
        users=users,
        decode_typical=decode_mid,
        prefill_typical=max(rate, decode_mid),
    )


def memory_kind(target: Target) -> str:
    """ "cpu" for a processor's own memory (this machine's CPU, a catalog host), "gpu" otherwise."""
    return "cpu" if target.efficiency_class in ("cpu", "host-spec") else "gpu"


def _format_words(float_share: float, quant_format: str) -> str:
    """The weights' format in words, for an assumption line."""
    names = {"simple": "Q4_0/Q8_0-type", "kquant": "K-quant", "iquant": "IQ", "mxfp4": "MXFP4"}
    if float_share >= 0.5 or not quant_format:
        return "float weights"
    return f"{names.get(quant_format, quant_format)} weights"


def _layer_kinds(arch: Architecture, est: Estimate) -> tuple[list[int], list[int]]:
    """Per device of ``est``: its mixture-of-experts layers and its recurrent (linear-attention, SSM)
    layers, whose fixed decode costs exceed a plain layer's (``FamilyConstants``)."""
    moe = [0] * len(est.devices)
    recurrent = [0] * len(est.devices)
    # Running counts over the layers: kinds[n] is (MoE layers, recurrent layers) among the first n.
    kinds = memo_per_arch(
        arch,
        ("layer-kind-counts",),
        lambda: list(
            accumulate(
                ((int(arch.is_moe_layer(i)), int(arch.is_recurrent_layer(i))) for i in range(arch.n_layer)),
                lambda a, b: (a[0] + b[0], a[1] + b[1]),
                initial=(0, 0),
            )
        ),
    )
    for device, first, end in device_runs(est.layer_devices[: arch.n_layer]):
        moe[device] += kinds[end][0] - kinds[first][0]
        recurrent[device] += kinds[end][1] - kinds[first][1]
    return moe, recurrent


def target_family(target: Target, backend: str = "") -> str:
    """The device family whose fitted speed constants apply to ``target`` run by a ``backend`` build."""
    if memory_kind(target) == "cpu":
        return speed_family(target.name, "cpu")
    return speed_family(target.name, "gpu", backend)


def _format_work(h: HybridConstants, weight_format: str) -> str:
    """The clause naming the CPU's further work per parameter of ``weight_format``, where one is fitted."""
    extra = h.format_flop_per_param.get(weight_format, 0.0)
    if not extra:
        return ""
    return f"; {weight_format} weights take {extra:.1f} FLOP per parameter on top of {h.host_flop_per_param:.1f}"
