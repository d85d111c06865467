"""The hardware advisor's verdict on one machine: every preset of the model placed, timed, priced.

:func:`evaluate_box` judges a box of identical GPUs on its host platform: all on the GPUs when that
fits; otherwise MoE experts, then whole layers, in system memory, as llama.cpp's ``--fit`` places
them, with the smallest RAM size that holds the host's share. :func:`evaluate_single` judges a
machine with one memory (an Apple machine, a unified-memory box, a CPU server). Each settles what it
can by the bounds of :mod:`app.core.advisor.sweep` before running the estimator, and appends one
:class:`~app.core.advisor.records.Candidate` per preset to the sweep, passing or with its reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.core.advisor.configs import (
    OS_RESERVE_BYTES,
    RAM_USD_PER_GIB,
    HostPlatform,
    Variant,
    platform_for_cpu,
    platform_for_gpus,
)
from app.core.advisor.records import Candidate, Category, Placement, format_rate, format_usd
from app.core.advisor.sweep import (
    NO_MACHINE,
    Sweep,
    fewest_cpu_moe,
    keeps_margin,
    offload_bound,
    speed_bound,
    verified_cpu_moe,
)
from app.core.common.units import GIB
from app.core.hardware.devices import DeviceSpec
from app.core.hardware.host_memory import HOST_MEMORY
from app.core.memory.autofit import auto_fit
from app.core.memory.estimate import estimate
from app.core.memory.layers import tensor_totals
from app.core.memory.records import Estimate, Target
from app.core.memory.targets import target_from_device
from app.core.report.choices import HardwareChoice, resolve_targets
from app.core.report.verdict import Budget, budget_of, gib
from app.core.speed.predict import Range

CandidateMaker = Callable[..., Candidate]
"""Builds one machine's verdict for a variant; keywords give the fields that differ from a failure
settled with nothing measured."""


def _candidate_maker(sw: Sweep, **machine: Any) -> CandidateMaker:
    """A :data:`CandidateMaker` for one machine, whose fields are ``machine`` (over the defaults of
    a single device with no platform, all on the GPU)."""
    fixed: dict[str, Any] = (
        dict(
            count=1,
            platform="",
            host_ram_gib=None,
            host_memory=None,
            placement="gpu",
            gpu_layers=None,
            n_cpu_moe=0,
            price_usd=None,
            price_note="",
            needed_bytes=0,
            decode=None,
            decode_typical=0.0,
            users=sw.workload.users,
            passes=False,
            reason="",
        )
        | machine
    )

    def candidate(v: Variant, **kw: Any) -> Candidate:
        return Candidate(quant=v.preset, ppl_increase=v.ppl_increase, **(fixed | kw))

    return candidate


def _judge_fitting(
    sw: Sweep,
    candidate: CandidateMaker,
    v: Variant,
    est: Estimate,
    b: Budget,
    speed: tuple[Range, float],
    where: str,
    price: float | None,
    shortfall: str = "",
    **placed: Any,
) -> None:
    """The verdict on a placement that fits (``where``, in words): fast enough for the workload
    (``speed``: the decode range and typical tokens/s per user) and within its budget. ``shortfall``
    says why the preferred placement did not fit; ``placed`` the candidate's other fields."""
    decode, typical = speed
    ok, reason = sw.judge_speed(v, decode, typical, b.free_bytes, where)
    if not ok and shortfall:
        reason = (
            f"{shortfall}; {where}, but about {format_rate(typical)} tokens/s per user "
            f"< {sw.workload.min_tokens_per_s:g}"
        )
    over = sw.over_budget(price)
    if ok and over:
        ok, reason = False, f"{v.preset}: {over}"
    sw.out.append(
        candidate(
            v,
            needed_bytes=b.used_bytes,
            capacity_bytes=b.capacity_bytes,
            decode=decode,
            decode_typical=typical,
            passes=ok,
            reason=reason,
            estimate=est,
            **placed,
        )
    )


def evaluate_box(sw: Sweep, device: DeviceSpec, count: int) -> None:
    """Every preset on ``count`` x ``device`` on its host platform: all on the GPUs when that fits;
    otherwise experts (MoE) or layers in system memory, as llama.cpp's --fit would place them."""
    w = sw.workload
    platform = platform_for_gpus(count)
    ram_max = platform.ram_options_gib[-1]
    gpu_price = device.price_usd * count if device.price_usd else None
    choice = HardwareChoice(
        kind="catalog", device_id=device.id, count=count, host_ram_gib=ram_max, host_memory=platform.host_memory
    )
    targets = resolve_targets(choice, NO_MACHINE)
    settings = sw.settings["gpu"]
    capacity = sum(t.capacity_bytes for t in targets if t.kind == "gpu")
    host_label = HOST_MEMORY[platform.host_memory][0]
    category: Category = "multi-gpu" if count > 1 else "gpu"

    candidate = _candidate_maker(
        sw,
        category=category,
        device_id=device.id,
        device_name=device.name,
        count=count,
        platform=platform.label,
        host_memory=platform.host_memory,
        capacity_bytes=capacity,
    )
    cpu_name = platform.cpu_name

    def priced(ram_gib: float) -> tuple[float | None, str]:
        if gpu_price is None:
            return None, "no list price for this GPU in the catalog"
        host = platform.price_usd(ram_gib)
        return gpu_price + host, (
            f"{count} x {format_usd(device.price_usd or 0)} GPUs + {format_usd(host)} for the {platform.label} "
            f"around them ({cpu_name}, {ram_gib:g} GiB RAM; assumed)"
        )

    def too_slow(v: Variant, needed: int, estimated: bool, shortfall: str, moved: str, bound: float) -> Candidate:
        # With ``moved`` in system memory, even the bound's speed falls short.
        return candidate(
            v,
            needed_bytes=needed,
            settled_by="estimate" if estimated else "memory",
            reason=f"{shortfall}; with {moved} in system memory ({host_label}) at most "
            f"{format_rate(bound)} tokens/s per user < {w.min_tokens_per_s:g}",
        )

    lowest_price, _ = priced(platform.ram_options_gib[0])
    for v in sw.variants:
        over = sw.over_budget(lowest_price)
        if over:
            sw.out.append(candidate(v, reason=over, price_usd=lowest_price, settled_by="price"))
            continue
        fastest = speed_bound(sw, v, [(targets[0], v.active_bytes)], sw.arch.n_layer)
        if fastest < w.min_tokens_per_s:
            least = v.layer_bytes + sw.kv_bytes
            memory = f"needs at least {gib(least)} of GPU memory, has {gib(capacity)}, and " if least > capacity else ""
            sw.out.append(
                candidate(
                    v,
                    needed_bytes=least,
                    decode_typical=fastest,
                    settled_by="speed",
                    reason=f"{v.preset}: {memory}at most {format_rate(fastest)} tokens/s per user even with every "
                    f"layer on the {'GPUs' if count > 1 else 'GPU'} < {w.min_tokens_per_s:g} "
                    f"({device.bandwidth_gb_s:g} GB/s)",
                )
            )
            continue
        total_memory = capacity + ram_max * GIB
        if v.weights_bytes > total_memory:
            sw.out.append(
                candidate(
                    v,
                    needed_bytes=v.weights_bytes,
                    settled_by="memory",
                    capacity_bytes=total_memory,
                    reason=f"{v.preset}: the weights alone ({gib(v.weights_bytes)}) exceed the GPUs and the largest "
                    f"host RAM together ({gib(total_memory)})",
                )
            )
            continue
        full: Estimate | None = None
        needed = v.layer_bytes + sw.kv_bytes
        if needed <= capacity:
            sw.estimated += 1
            full = estimate(sw.arch, v.tensors, settings, targets)
            if full.fits:
                _settle(sw, v, full, targets, platform, priced, candidate, "gpu")
                continue
            needed = budget_of(full).used_bytes
        at_least = "" if full is not None else "at least "
        shortfall = f"{v.preset}: needs {at_least}{gib(needed)} of GPU memory, has {gib(capacity)}"
        # Part of the model in system memory: the fastest it could possibly run (the speed model fed
        # the fewest bytes that must leave the GPUs) settles most cases without an estimate.
        bound = offload_bound(sw, v, capacity, count, targets[0], targets[-1])
        if bound < w.min_tokens_per_s:
            what = "the experts" if sw.arch.moe is not None else "the layers that do not fit"
            sw.out.append(too_slow(v, needed, full is not None, shortfall, what, bound))
            continue
        sw.estimated += 1
        if sw.arch.moe is not None and v.expert_bytes:
            # The buffers change once any expert leaves the GPUs (fewer pipeline copies of the graph
            # inputs), so the prediction starts from one layer's experts in system memory.
            one = estimate(sw.arch, v.tensors, settings.model_copy(update={"n_cpu_moe": 1}), targets)
            guess = fewest_cpu_moe(sw, v, one)
            if guess is not None:
                low = max(guess - 1, 1)  # one layer of slack for rounding
                host_read = sum(tensor_totals(sw.arch, v.tensors).active_expert_bytes[:low])
                bound = speed_bound(
                    sw, v, [(targets[0], v.active_bytes - host_read), (targets[-1], host_read)], sw.arch.n_layer
                )
                if bound < w.min_tokens_per_s:
                    moved = f"the experts of about {guess} layers"
                    sw.out.append(too_slow(v, needed, full is not None, shortfall, moved, bound))
                    continue
                placed = one if guess == 1 and keeps_margin(one) else verified_cpu_moe(sw, v, settings, targets, guess)
                if placed is not None:
                    _settle(
                        sw,
                        v,
                        placed,
                        targets,
                        platform,
                        priced,
                        candidate,
                        "experts",
                        gpu_layers=sw.arch.n_layer + 1,
                        n_cpu_moe=guess,
                        shortfall=shortfall,
                    )
                    continue
        plan = auto_fit(sw.arch, v.tensors, settings, targets)
        if plan.gpus_hidden or not plan.estimate.fits or plan.gpu_layers == 0:
            sw.out.append(candidate(v, needed_bytes=needed, reason=f"{shortfall}, and too little fits beside it"))
            continue
        placement: Placement = (
            "gpu" if plan.fully_on_gpu else "experts" if plan.gpu_layers > sw.arch.n_layer else "partial"
        )
        _settle(
            sw,
            v,
            plan.estimate,
            targets,
            platform,
            priced,
            candidate,
            placement,
            gpu_layers=plan.gpu_layers,
            n_cpu_moe=plan.n_cpu_moe,
            shortfall=shortfall,
        )


def _settle(
    sw: Sweep,
    v: Variant,
    est: Estimate,
    targets: list[Target],
    platform: HostPlatform,
    priced: Callable[[float], tuple[float | None, str]],
    candidate: CandidateMaker,
    placement: Placement,
    gpu_layers: int | None = None,
    n_cpu_moe: int = 0,
    shortfall: str = "",
) -> None:
    """A placement that fits the GPUs: the host RAM it needs, its price, its speed, the verdict."""
    host = est.devices[-1]
    ram = next((r for r in platform.ram_options_gib if host.total_bytes + OS_RESERVE_BYTES <= r * GIB), None)
    b = budget_of(est)
    if ram is None:
        sw.out.append(
            candidate(
                v,
                needed_bytes=b.used_bytes,
                placement=placement,
                reason=f"{v.preset}: needs {gib(host.total_bytes)} of host RAM; the {platform.label} takes at most "
                f"{platform.ram_options_gib[-1]} GiB",
            )
        )
        return
    price, note = priced(ram)
    key = (targets[0].name.split(" #")[0], v.preset)
    memo = sw.split_speed.get(key) if placement == "gpu" else None
    if memo is None:
        memo = sw.speed(v.tensors, est, targets)
        if placement == "gpu":
            sw.split_speed[key] = memo
    where = {
        "gpu": "fits on the GPUs" if sum(d.kind == "gpu" for d in est.devices) > 1 else "fits on the GPU",
        "experts": f"fits with the experts of {n_cpu_moe} layers in system memory",
        "partial": f"fits with {gpu_layers} of {sw.arch.n_layer + 1} layers on the GPUs",
        "cpu": "fits",
    }[placement]
    _judge_fitting(
        sw,
        candidate,
        v,
        est,
        b,
        speed=memo,
        where=where,
        price=price,
        shortfall=shortfall,
        host_ram_gib=float(ram),
        placement=placement,
        gpu_layers=gpu_layers if gpu_layers is not None else est.gpu_layers,
        n_cpu_moe=n_cpu_moe,
        price_usd=price,
        price_note=note,
    )


def evaluate_single(sw: Sweep, device: DeviceSpec) -> None:
    """An Apple machine, a unified-memory box or a CPU server: one memory, everything in it."""
    w = sw.workload
    is_cpu = not device.is_gpu
    category: Category = "cpu" if is_cpu else "apple" if device.vendor == "apple" else "unified"
    if is_cpu:
        platform = platform_for_cpu(device)
        targets = [target_from_device(device)]
        settings = sw.settings["cpu"]
        rest = platform.base_usd + device.memory_gib * RAM_USD_PER_GIB
        price: float | None = device.price_usd + rest if device.price_usd else None
        note = (
            f"{format_usd(device.price_usd)} CPU + {format_usd(rest)} for the board, power, case, disk and "
            f"{device.memory_gib:g} GiB RAM (assumed)"
            if device.price_usd
            else "no list price in the catalog"
        )
    else:
        targets = resolve_targets(HardwareChoice(kind="catalog", device_id=device.id), NO_MACHINE)
        settings = sw.settings["apple" if device.vendor == "apple" else "gpu"]
        price = device.price_usd
        note = "the whole computer (catalog list price)" if price else "no list price in the catalog"
    capacity = targets[0].capacity_bytes
    where_memory = "memory" if is_cpu else "GPU memory"
    if not is_cpu and device.gpu_usable_fraction < 1:
        where_memory = f"GPU memory ({device.gpu_usable_fraction:.0%} of its {device.memory_gib:g} GiB by default)"

    candidate = _candidate_maker(
        sw,
        category=category,
        device_id=device.id,
        device_name=device.name,
        placement="cpu" if is_cpu else "gpu",
        gpu_layers=None if is_cpu else sw.arch.n_layer + 1,
        price_usd=price,
        price_note=note,
        capacity_bytes=capacity,
    )

    for v in sw.variants:
        over = sw.over_budget(price)
        if over:
            sw.out.append(candidate(v, reason=over, settled_by="price"))
            continue
        if v.weights_bytes > capacity:
            sw.out.append(
                candidate(
                    v,
                    needed_bytes=v.weights_bytes,
                    settled_by="memory",
                    reason=f"{v.preset}: the weights alone ({gib(v.weights_bytes)}) exceed its {where_memory}, "
                    f"{gib(capacity)}",
                )
            )
            continue
        fastest = speed_bound(sw, v, [(targets[0], v.active_bytes)], sw.arch.n_layer)
        if fastest < w.min_tokens_per_s:
            sw.out.append(
                candidate(
                    v,
                    needed_bytes=v.weights_bytes + sw.kv_bytes,
                    decode_typical=fastest,
                    settled_by="speed",
                    reason=f"{v.preset}: at most {format_rate(fastest)} tokens/s per user < {w.min_tokens_per_s:g} "
                    f"({device.bandwidth_gb_s:g} GB/s)",
                )
            )
            continue
        sw.estimated += 1
        est = estimate(sw.arch, v.tensors, settings, targets)
        b = budget_of(est)
        if not est.fits:
            sw.out.append(
                candidate(
                    v,
                    needed_bytes=b.used_bytes,
                    reason=f"{v.preset}: needs {gib(b.used_bytes)} of {where_memory}, has {gib(b.capacity_bytes)}",
                )
            )
            continue
        _judge_fitting(sw, candidate, v, est, b, sw.speed(v.tensors, est, targets), "fits", price)
