"""The hardware advisor's verdict on one machine: every preset of the model placed, timed, priced.

What the advisor lists for a machine is what the estimate service says for it: every placement and
speed here is an :func:`app.services.estimate.answer` for the machine exactly as the window and
``fitscope estimate`` would build it (``resolve_targets`` of its hardware choice, auto-fit with the
same margin, the same decode depth), so opening a row in the window shows the same figures. The
sweep only adds cheap bounds (:mod:`app.core.advisor.sweep`) that settle, before any estimate,
what no placement could make work: too dear, too slow even with everything on the GPUs, weights
larger than all the memory there is, or too slow with the part that cannot stay on the GPUs.

:func:`evaluate_box` judges a box of identical GPUs on its host platform (with the smallest RAM
size that holds the host's share); :func:`evaluate_single` a machine with one memory (an Apple
machine, a unified-memory box, a CPU server). Each appends one
:class:`~app.core.advisor.records.Candidate` per preset to the sweep, passing or with its reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.core.advisor.configs import OS_RESERVE_BYTES, Variant, machine_price, platform_for_gpus
from app.core.advisor.records import Candidate, Category, Placement, format_rate
from app.core.advisor.sweep import NO_MACHINE, Sweep, fewest_cpu_moe, offload_bound, speed_bound
from app.core.common.errors import EstimateError
from app.core.common.units import GIB
from app.core.hardware.devices import DeviceSpec
from app.core.hardware.host_memory import HOST_MEMORY
from app.core.memory.estimate import estimate
from app.core.memory.layers import tensor_totals
from app.core.memory.records import Target
from app.core.model.source import ModelSource
from app.core.report.choices import HardwareChoice, repack_for, resolve_targets
from app.core.report.verdict import gib
from app.services.estimate import Answer, answer

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


def _model(sw: Sweep, v: Variant) -> ModelSource:
    return ModelSource(sw.arch, v.tensors, sw.label, v.preset)


def _answer(sw: Sweep, v: Variant, choice: HardwareChoice, cpu_moe_hint: int | None = None) -> tuple[Answer, str]:
    """The estimate service's answer for preset ``v`` on ``choice`` (as the window builds it), and
    the llama-server command that runs it. Raises EstimateError."""
    targets = sw.targets.get(choice)
    if targets is None:
        targets = sw.targets[choice] = resolve_targets(choice, NO_MACHINE)
    found = answer(
        _model(sw, v),
        targets,
        sw.workload.controls(),
        repack=repack_for(choice, NO_MACHINE),
        limits=False,
        cpu_moe_hint=cpu_moe_hint,
    )
    return found, found.command(sw.model_path or f"{sw.arch.id}-{v.preset}.gguf")


def _judge(
    sw: Sweep,
    candidate: CandidateMaker,
    v: Variant,
    found: Answer,
    command: str,
    where: str,
    price: float | None,
    shortfall: str = "",
    **placed: Any,
) -> None:
    """The verdict on a placement that fits (``where``, in words): fast enough for the workload and
    within its budget. ``shortfall`` says why everything did not fit the GPUs; ``placed`` the
    candidate's other fields."""
    b = found.budget
    decode, typical = found.speed.decode_tokens_per_s, found.speed.decode_typical
    ok, reason = sw.judge_speed(v, decode, typical, b.free_bytes, where)
    if not ok and shortfall:
        reason = (
            f"{shortfall}; {where}, but about {format_rate(typical)} tokens/s per user "
            f"(under the {format_rate(sw.workload.min_tokens_per_s)} needed)"
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
            estimate=found.estimate,
            llama_command=command,
            gpu_layers=found.gpu_layers if found.has_gpus else None,
            n_cpu_moe=found.n_cpu_moe,
            **placed,
        )
    )


def evaluate_box(sw: Sweep, device: DeviceSpec, count: int) -> None:
    """Every preset on ``count`` x ``device`` on its host platform, placed by the estimate service:
    all on the GPUs when that keeps auto-fit's margin; otherwise experts (MoE) or layers in system
    memory, as llama.cpp's --fit places them."""
    w = sw.workload
    platform = platform_for_gpus(count)
    ram_max = platform.ram_options_gib[-1]

    def choice(ram_gib: float) -> HardwareChoice:
        return HardwareChoice(
            kind="catalog", device_id=device.id, count=count, host_ram_gib=ram_gib, host_memory=platform.host_memory
        )

    targets = resolve_targets(choice(ram_max), NO_MACHINE)
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

    def priced(ram_gib: float) -> tuple[float | None, str]:
        price = machine_price(device, count, ram_gib)
        return price.total_usd, price.note

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
                    f"layer on the {'GPUs' if count > 1 else 'GPU'}, under the {format_rate(w.min_tokens_per_s)} "
                    f"needed ({device.bandwidth_gb_s:g} GB/s)",
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
        needed = v.layer_bytes + sw.kv_bytes
        shortfall = f"{v.preset}: needs at least {gib(needed)} of GPU memory, has {gib(capacity)}"
        hint = None
        if needed > capacity:
            # Part of the model in system memory: the fastest it could possibly run (the speed model
            # fed the fewest bytes that must leave the GPUs) settles most cases without an estimate.
            bound = offload_bound(sw, v, capacity, count, targets[0], targets[-1])
            what = "the experts" if sw.arch.moe is not None else "the layers that do not fit"
            if bound < w.min_tokens_per_s:
                sw.out.append(_too_slow(sw, candidate, v, needed, shortfall, what, bound, host_label))
                continue
            hint = _experts_guess(sw, v, targets)
            if hint is not None:
                low = max(hint - 1, 1)  # one layer of slack for rounding
                host_read = sum(tensor_totals(sw.arch, v.tensors).active_expert_bytes[:low])
                bound = speed_bound(
                    sw, v, [(targets[0], v.active_bytes - host_read), (targets[-1], host_read)], sw.arch.n_layer
                )
                if bound < w.min_tokens_per_s:
                    moved = f"the experts of about {hint} layers"
                    sw.out.append(_too_slow(sw, candidate, v, needed, shortfall, moved, bound, host_label))
                    continue
        sw.estimated += 1
        try:
            found, command = _answer(sw, v, choice(ram_max), hint)
        except EstimateError as exc:
            sw.out.append(candidate(v, needed_bytes=needed, reason=f"{v.preset}: {exc}"))
            continue
        if found.gpus_hidden or not found.fits or found.gpu_layers == 0:
            sw.out.append(candidate(v, needed_bytes=needed, reason=f"{shortfall}, and too little fits beside it"))
            continue
        host = found.estimate.devices[-1]
        ram = next((r for r in platform.ram_options_gib if host.total_bytes + OS_RESERVE_BYTES <= r * GIB), None)
        placement: Placement = (
            "gpu" if found.placement == "gpu" else "experts" if found.gpu_layers > sw.arch.n_layer else "partial"
        )
        if ram is None:
            sw.out.append(
                candidate(
                    v,
                    needed_bytes=found.budget.used_bytes,
                    placement=placement,
                    reason=f"{v.preset}: needs {gib(host.total_bytes)} of host RAM; the {platform.label} takes at "
                    f"most {ram_max} GiB",
                )
            )
            continue
        # The machine listed has that RAM; it holds the host's share, so placement, speed and command
        # are those of this answer (tests/test_one_answer.py checks the listed machine's own estimate).
        price, note = priced(ram)
        where = {
            "gpu": "fits on the GPUs" if count > 1 else "fits on the GPU",
            "experts": f"fits with the experts of {found.n_cpu_moe} layers in system memory",
            "partial": f"fits with {found.gpu_layers} of {sw.arch.n_layer + 1} layers on the GPUs",
            "cpu": "fits",
        }[placement]
        _judge(
            sw,
            candidate,
            v,
            found,
            command,
            where,
            price,
            shortfall if placement != "gpu" else "",
            host_ram_gib=float(ram),
            placement=placement,
            price_usd=price,
            price_note=note,
        )


def _too_slow(
    sw: Sweep,
    candidate: CandidateMaker,
    v: Variant,
    needed: int,
    shortfall: str,
    moved: str,
    bound: float,
    host_label: str,
) -> Candidate:
    """With ``moved`` in system memory, even the bound's speed falls short."""
    return candidate(
        v,
        needed_bytes=needed,
        settled_by="memory",
        reason=f"{shortfall}; with {moved} in system memory ({host_label}) at most "
        f"{format_rate(bound)} tokens/s per user (under the {format_rate(sw.workload.min_tokens_per_s)} needed)",
    )


def _experts_guess(sw: Sweep, v: Variant, targets: list[Target]) -> int | None:
    """A guess at the ``--n-cpu-moe`` auto-fit will choose, from one estimate with the experts of
    one layer in system memory (the buffers change once any expert leaves the GPUs); None for a
    dense model or when the experts alone are not enough."""
    if sw.arch.moe is None or not v.expert_bytes:
        return None
    settings = sw.workload.controls().settings("x86-avx512").model_copy(update={"n_cpu_moe": 1})
    return fewest_cpu_moe(sw, v, estimate(sw.arch, v.tensors, settings, targets))


def evaluate_single(sw: Sweep, device: DeviceSpec) -> None:
    """An Apple machine, a unified-memory box or a CPU server: one memory, everything in it, placed
    by the estimate service as the window places it."""
    w = sw.workload
    is_cpu = not device.is_gpu
    category: Category = "cpu" if is_cpu else "apple" if device.vendor == "apple" else "unified"
    choice = HardwareChoice(kind="catalog", device_id=device.id)
    targets = resolve_targets(choice, NO_MACHINE)
    whole = machine_price(device)
    price, note = whole.total_usd, whole.note
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
                    reason=f"{v.preset}: at most {format_rate(fastest)} tokens/s per user, under the "
                    f"{format_rate(w.min_tokens_per_s)} needed ({device.bandwidth_gb_s:g} GB/s)",
                )
            )
            continue
        sw.estimated += 1
        try:
            found, command = _answer(sw, v, choice)
        except EstimateError as exc:
            sw.out.append(candidate(v, reason=f"{v.preset}: {exc}"))
            continue
        b = found.budget
        if not found.fits:
            sw.out.append(
                candidate(
                    v,
                    needed_bytes=b.used_bytes,
                    reason=f"{v.preset}: needs {gib(b.used_bytes)} of {where_memory}, has {gib(b.capacity_bytes)}",
                )
            )
            continue
        placement: Placement = "cpu" if is_cpu else "gpu"
        where = "fits"
        if found.placement == "partial":
            placement = "experts" if found.gpu_layers > sw.arch.n_layer else "partial"
            where = (
                f"fits with the experts of {found.n_cpu_moe} layers outside the GPU's share"
                if placement == "experts"
                else f"fits with {found.gpu_layers} of {sw.arch.n_layer + 1} layers in the GPU's share"
            )
        _judge(sw, candidate, v, found, command, where, price, placement=placement)
