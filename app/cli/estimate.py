"""``fitscope estimate`` and ``fitscope demo``: memory and speed for a model, llama.cpp's settings
and hardware (catalog devices, this machine's GPUs or its CPU), as a table or JSON, with the
llama-server command that runs it.

A cold catalog estimate is the command people run most and wait for: the estimator and what it
needs are imported inside the functions, under ``_long_lived_imports``, and this machine's
hardware is probed only when it is asked about.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from app.cli.parser import build_parser
from app.core.common.errors import FitScopeError
from app.core.common.units import GIB, MIB
from app.core.report.verdict import rate_range

if TYPE_CHECKING:
    from app.core.hardware.devices import DeviceSpec
    from app.core.hardware.snapshots import GpuSnapshot, HostSnapshot
    from app.core.memory.records import GpuLayers, Target


def _int_option(flag: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise FitScopeError(f"Invalid {flag}: '{value}' is not a whole number (or 'auto').") from None


def _gpu_layers(value: str) -> GpuLayers:
    if value == "auto":
        return "auto"
    if value == "all":
        return "all"
    n = _int_option("-ngl", value)
    if n < 0:
        raise FitScopeError(f"Invalid -ngl: {n} is below 0 (use 'auto' or 'all').")
    return n


def _controls(args: argparse.Namespace):
    """The estimate service's controls for the command line's llama.cpp flags. ``-c`` is shared by
    the ``-np`` users: each gets ``-c / -np`` tokens, rounded up so the estimate is never below
    llama.cpp's. Raises FitScopeError naming the flag at fault."""
    from pydantic import ValidationError

    from app.core.report.choices import Controls

    if args.parallel < 1:
        raise FitScopeError(f"Invalid -np: {args.parallel} is below 1.")
    try:
        return Controls(
            context_per_user_tokens=-(-args.ctx_size // args.parallel),
            users=args.parallel,
            batch_tokens=args.batch_size,
            ubatch_tokens=args.ubatch_size,
            flash_attn=args.flash_attn == "on",
            cache_type_k=args.cache_type_k,
            cache_type_v=args.cache_type_v,
            kv_unified=args.kv_unified,
            swa_full=args.swa_full,
            gpu_layers=_gpu_layers(args.n_gpu_layers),
            backend=args.backend,
            consumer=args.consumer,
            mmap=not args.no_mmap,
            n_cpu_moe=(1 << 20) if args.cpu_moe else args.n_cpu_moe,
            projector=_projector(args),
            threads=args.threads,
            mmproj_offload=args.mmproj_offload,
            fit_margin_mib=args.fit_target,
            speculative=_speculative(args),
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field = {
            "context_per_user_tokens": "-c",
            "batch_tokens": "-b",
            "ubatch_tokens": "-ub",
            "users": "-np",
            "gpu_layers": "-ngl",
            "n_cpu_moe": "--n-cpu-moe",
            "fit_margin_mib": "--fit-target",
        }.get(str(first["loc"][0]) if first["loc"] else "", "a setting")
        raise FitScopeError(f"Invalid {field}: {first['msg']}.") from exc


def _batch(args: argparse.Namespace) -> dict[str, int]:
    """-b and -ub: as given, else the consumer's defaults (Ollama chooses them by the context)."""
    batch = args.batch_size
    if batch is None and args.consumer == "ollama":
        from app.core.memory.consumers import ollama_batch_tokens

        batch = ollama_batch_tokens(args.ctx_size)
        return {"batch_tokens": batch, "ubatch_tokens": args.ubatch_size or batch}
    return {"batch_tokens": batch or 2048, "ubatch_tokens": args.ubatch_size or 512}


def _projector(args: argparse.Namespace):
    """The projector --mmproj or --projector names, or None."""
    if args.mmproj and args.projector:
        raise FitScopeError("Choose --mmproj PATH or --projector, not both.")
    if getattr(args, "remote_projector", None) is not None:
        return args.remote_projector
    if args.mmproj:
        from app.core.model.projector_file import read_projector

        return read_projector(args.mmproj)
    if not args.projector:
        return None
    from app.core.model.catalog import find_projector

    if not args.model:
        raise FitScopeError("--projector adds a catalog model's own projector: use it with --model, or give --mmproj.")
    entry = find_projector(args.model)
    if entry is None:
        raise FitScopeError(f"The catalog model '{args.model}' has no vision projector (it reads text only).")
    return entry.spec()


def _speculative(args: argparse.Namespace):
    """The draft -md / --draft names, or the model's MTP head with --mtp; None without them."""
    chosen = [x for x in (args.model_draft, args.draft, args.mtp) if x]
    if not chosen:
        return None
    if len(chosen) > 1:
        raise FitScopeError("Choose one speculative decoder: -md PATH, --draft CATALOG_ID or --mtp.")
    from app.core.memory.records import SpeculativeSpec

    common = {
        "cache_type_k": args.cache_type_k_draft,
        "cache_type_v": args.cache_type_v_draft,
        "gpu_layers": args.n_gpu_layers_draft,
    }
    if args.mtp:
        return SpeculativeSpec(kind="mtp", name="the model's MTP head", **common)
    from app.core.model.source import model_from_catalog, model_from_gguf

    if args.model_draft:
        draft = model_from_gguf(args.model_draft)
        file_name = args.model_draft
    else:
        from app.core.model.catalog import find_model

        draft = model_from_catalog(args.draft, args.quant or find_model(args.draft).default_quant or "Q4_K_M")
        file_name = f"{args.draft}.gguf"
    return SpeculativeSpec(
        kind="draft",
        name=draft.label,
        file_name=file_name,
        architecture=draft.arch,
        tensors=tuple(draft.tensors),
        **common,
    )


def _model(args: argparse.Namespace):
    from app.core.model.source import model_from_catalog, model_from_gguf, model_from_hf_config

    chosen = [x for x in (args.gguf, args.hf_config, args.model, args.hf, args.ollama) if x]
    if len(chosen) != 1:
        raise FitScopeError(
            "Name one model: --gguf PATH, --hf-config PATH, --model CATALOG_ID, --hf ORG/REPO or --ollama MODEL:TAG."
        )
    if args.hf or args.ollama:
        return _remote_model(args)
    if args.gguf:
        return model_from_gguf(args.gguf)
    if args.hf_config:
        return model_from_hf_config(args.hf_config, args.quant or "Q4_K_M")
    from app.core.model.catalog import find_model

    return model_from_catalog(args.model, args.quant or find_model(args.model).default_quant or "Q4_K_M")


def _remote_model(args: argparse.Namespace):
    """--hf / --ollama: the model read from its header(s) on the server (its projector, with
    --projector, kept on ``args`` for the settings). None when --hf named a repository alone: its
    GGUF files were listed instead."""
    from app.cli.remote import estimate_remote

    found = estimate_remote(args)
    if found is None:
        return None
    model, args.remote_projector, args.remote_file = found
    return model


def _targets(args: argparse.Namespace):
    """The estimator's targets for --gpu/--cpu, this machine's host (its CPU flags choose the
    repacking), and this machine when the targets are its own hardware (else None). Raises
    FitScopeError for --cpu with --gpu, for 'local' without a detected GPU, and for a catalog CPU
    machine named beside other hardware; CatalogError for an unknown id.

    This machine (--cpu, or --gpu local, or neither) resolves as in the window
    (``resolve_targets``): its GPUs (any vendor) matched to their catalog entries, or its CPU, and its
    measured memory bandwidth. Catalog ids may be several and different, and 'local' may join them,
    which the window's one device times a count cannot say: those stay here, built from the same
    targets. A catalog-only estimate does not import the window's scenario module (a quick start)."""
    from app.adapters.host import detect_host
    from app.core.memory.targets import target_from_device
    from app.core.model.catalog import find_device
    from app.core.report.choices import Machine

    host = detect_host(measure_bandwidth=False)
    gpu_args = args.gpu or []
    if args.cpu and gpu_args:
        raise FitScopeError("Choose --cpu or --gpu, not both.")
    here = args.cpu or not gpu_args or "local" in gpu_args
    local_gpus = () if args.cpu or not here else _local_gpus(required="local" in gpu_args)
    devices: list[DeviceSpec] = []
    for gid in gpu_args:
        if gid == "local":
            continue
        device = find_device(gid)
        if not device.is_gpu and len(gpu_args) > 1:
            raise FitScopeError(f"{device.name} is a CPU machine; estimate it alone (one --gpu {gid}).")
        devices.append(device)
    link = _pcie(args)
    if not here:
        return _catalog_targets(args, devices, host), host, None
    targets = _this_machine_targets(args, host, local_gpus)
    if devices:  # this machine's GPUs, then the catalog's, then host RAM
        *gpus, host_ram = targets
        targets = [*gpus, *(target_from_device(d, link) for d in devices), host_ram]
    if link:
        targets = [
            t.model_copy(update={"pcie_gen": link[0], "pcie_lanes": link[1]}) if t.kind == "gpu" else t for t in targets
        ]
    return targets, host, Machine(gpus=local_gpus, host=host)


def _pcie(args: argparse.Namespace) -> tuple[int, int] | None:
    """--pcie as (generation, lanes), or None. Raises FitScopeError for a malformed link."""
    if not getattr(args, "pcie", None):
        return None
    from app.core.hardware.host_memory import parse_pcie

    try:
        return parse_pcie(args.pcie)
    except ValueError as exc:
        raise FitScopeError(f"Invalid --pcie: {exc}") from None


def _local_gpus(required: bool) -> tuple[GpuSnapshot, ...]:
    """This machine's GPUs (any vendor); none when none is found, unless ``required`` (then FitScopeError)."""
    from app.adapters.gpus import detect_gpus  # the drivers only for this machine's own GPUs

    status = detect_gpus()
    if not status.available and required:
        raise FitScopeError(f"{status.message} Use --cpu, or --gpu CATALOG_ID for hardware you do not own.")
    return status.gpus if status.available else ()


def _this_machine_targets(args: argparse.Namespace, host: HostSnapshot, gpus: tuple[GpuSnapshot, ...]) -> list[Target]:
    """This machine's GPUs (if any) and host RAM, or its CPU with --cpu or without GPUs, as the
    window resolves them; --host-ram-gib replaces the RAM beside the GPUs."""
    from app.adapters.host import measure_read_bandwidth_gb_s
    from app.core.report.choices import HardwareChoice, Machine, resolve_targets

    update = {"measured_read_bandwidth_gb_s": measure_read_bandwidth_gb_s(budget_s=0.3)}
    if args.host_ram_gib:
        # The RAM beside the GPUs; a CPU target counts the available RAM, left as detected.
        update["ram_total_bytes"] = int(args.host_ram_gib * GIB)
    machine = Machine(gpus=gpus, host=host.model_copy(update=update))
    return resolve_targets(HardwareChoice(kind="cpu" if args.cpu else "local"), machine, args.backend)


def _catalog_targets(args: argparse.Namespace, devices: list[DeviceSpec], host: HostSnapshot) -> list[Target]:
    """Catalog hardware: a CPU machine alone, or the GPUs beside host RAM (--host-ram-gib, default
    this machine's, at the bandwidth of --host-memory; for a unified-memory box, the rest of its
    one pool). Up to eight of one device is the window's hardware choice, resolved as the window
    resolves it; a mix of devices is built from the same target builders."""
    from app.core.memory.targets import host_ram_beside, host_ram_target, target_from_device
    from app.core.report.choices import HardwareChoice, Machine, resolve_targets

    if len({d.id for d in devices}) == 1 and len(devices) <= 8:
        choice = HardwareChoice(
            kind="catalog",
            device_id=devices[0].id,
            count=len(devices) if devices[0].is_gpu else 1,
            host_ram_gib=args.host_ram_gib,
            host_memory=args.host_memory,
            host_cores=args.host_cores,
            pcie=args.pcie,
        )
        return resolve_targets(choice, Machine(host=host), args.backend)
    if not devices[0].is_gpu:
        return [target_from_device(devices[0])]
    asked = int(args.host_ram_gib * GIB) if args.host_ram_gib else None
    ram = host_ram_beside(devices[0], asked, host.ram_total_bytes)
    link = _pcie(args)
    return [
        *(target_from_device(d, link) for d in devices),
        host_ram_target(ram, host_memory=args.host_memory, cores=args.host_cores),
    ]


@contextlib.contextmanager
def _long_lived_imports() -> Iterator[None]:
    """Runs the block's imports with the cyclic garbage collector paused and, when they imported
    anything new, freezes what is alive (gc.freeze).

    A command that estimates once imports far more than it computes: tens of thousands of modules,
    classes and validators that live as long as the process. Unfrozen, the collector walks them again
    and again while they are made and once more at exit: about a tenth of a cold ``fitscope estimate``.
    """
    imported = len(sys.modules)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if len(sys.modules) > imported:
            gc.freeze()
        if was_enabled:
            gc.enable()


def cmd_estimate(args: argparse.Namespace) -> int:
    with _long_lived_imports():
        import app.adapters.host  # noqa: F401 - host detection runs on every estimate (in _targets)
        from app.core.memory.targets import repack_of_device, repack_profile
        from app.core.model.catalog import find_device
        from app.services.estimate import answer
        from app.services.runs import machine_calibration

    model = _model(args)
    if model is None:  # --hf ORG/REPO alone: its files were listed
        return 0
    targets, host, machine = _targets(args)
    controls = _controls(args)
    catalog = [g for g in args.gpu or [] if g != "local"]
    repack = repack_of_device(find_device(catalog[0])) if machine is None else repack_profile(host)
    result = answer(
        model,
        targets,
        controls,
        repack=repack,
        prompt_tokens=args.prompt_tokens,
        efficiency=machine_calibration(machine) if machine is not None else None,
        most_gpu_layers=True,
    )
    model_file = args.gguf or getattr(args, "remote_file", None)
    if args.json:
        print(json.dumps(result.to_json(model_file), indent=2))
    else:
        print(format_answer(result))
        if result.fit_plan is not None:
            print("\nAuto fit (as llama.cpp's --fit): " + " ".join(result.fit_plan.steps))
        print(f"\nllama-server command:\n  {result.command(model_file)}")
    return 0


def format_answer(result) -> str:
    """The answer as ``fitscope estimate`` prints it: the memory per device, where it runs, the
    limits and the speed, then the assumptions."""
    from app.core.model.coverage import APPROXIMATE_NOTE

    e, s, lim = result.estimate, result.speed, result.limits
    c = result.controls
    lines = [
        f"{result.model.label} ({result.model.arch.arch}, {result.model.quant}) at {e.settings.context_tokens:,} "
        f"tokens of context (-c), {c.users} user(s) of {c.context_per_user_tokens:,} tokens each"
    ]
    vision = e.projector is not None
    draft = e.speculative is not None
    header = (
        f"{'device':38s} {'weights':>9s} {'repack':>8s} {'KV':>8s} {'state':>7s} {'compute':>8s} "
        f"{'output':>7s} {'overhd':>7s} "
        + (f"{'vision':>8s} " if vision else "")
        + (f"{'draft':>8s} " if draft else "")
        + f"{'total':>9s} {'capacity':>9s}  verdict"
    )
    lines += ["", header]
    for d in e.devices:
        lines.append(
            f"{d.name[:38]:38s} {d.weights_bytes / GIB:8.2f}G {d.repack_bytes / GIB:7.2f}G "
            f"{d.kv_cache_bytes / GIB:7.2f}G "
            f"{d.recurrent_state_bytes / MIB:6.0f}M {d.compute_bytes / MIB:7.0f}M {d.output_bytes / MIB:6.1f}M "
            f"{d.overhead_bytes / MIB:6.0f}M "
            + (f"{d.projector_bytes / MIB:7.0f}M " if vision else "")
            + (f"{d.speculative_bytes / MIB:7.0f}M " if draft else "")
            + f"{d.total_bytes / GIB:8.2f}G {d.capacity_bytes / GIB:8.2f}G  "
            + (
                f"fits ({d.free_bytes / GIB:.2f} GiB free)"
                if d.fits
                else f"DOES NOT FIT ({-d.free_bytes / GIB:.2f} GiB over)"
            )
        )
    placement = {
        "gpu": "fits on the GPU",
        "partial": f"runs partly in system memory ({e.gpu_layers} of {e.n_layer + 1} layers on the GPU"
        + (f", experts of {e.cpu_moe_layers} layers in RAM" if e.cpu_moe_layers else "")
        + ")",
        "cpu": "runs on the CPU" + (" (GPUs hidden: --device none)" if result.gpus_hidden else ""),
        "none": "does not fit",
    }[result.placement]
    build = e.backend.upper() if e.backend != "cpu" else "CPU"
    if e.projector is not None and e.projector_device is not None:
        p = e.projector
        lines += [
            "",
            f"Vision projector ({p.spec.name}) on {e.devices[e.projector_device].name}: "
            f"{p.total_bytes / MIB:,.0f} MiB = weights {p.weights_bytes / MIB:,.0f} MiB + compute "
            f"{p.compute_bytes / MIB:,.0f} MiB" + (" (approximate)" if p.approximate else "") + ".",
        ]
    if e.speculative is not None:
        sp = e.speculative
        lines += [
            "",
            f"Speculative decoding ({'MTP head' if sp.spec.kind == 'mtp' else 'draft ' + sp.spec.name}): "
            f"{sp.total_bytes / MIB:,.0f} MiB = weights {sp.weights_bytes / MIB:,.0f} MiB + KV cache "
            f"{sp.kv_cache_bytes / MIB:,.0f} MiB + compute {sp.compute_bytes / MIB:,.0f} MiB + logits "
            f"{sp.output_bytes / MIB:,.1f} MiB.",
        ]
    limits = ""
    if lim is not None:
        where = {"gpu": ", everything on the GPUs", "any": "", "fixed": f" at -ngl {c.gpu_layers}", "cpu": ""}
        limits = (
            f" Users that fit at {c.context_per_user_tokens:,} tokens each: {lim.users_that_fit}"
            f"{where[lim.scope]}; largest context per user for {c.users} user(s): "
            f"{lim.largest_context_per_user_tokens:,} tokens"
            + (
                f"; GPU layers that fit with no margin: {lim.most_gpu_layers} of {e.n_layer + 1}."
                if lim.most_gpu_layers is not None
                else "."
            )
        )
    lines += [
        "",
        f"llama.cpp build: {build}, as {e.settings.consumer} runs it; "
        f"repacked weights: {e.repack_bytes / GIB:.2f} GiB.",
    ]
    if e.reclaimable_bytes:
        lines.append(
            f"Reclaimable page cache: {e.reclaimable_bytes / GIB:.2f} GiB of the total are the mapped file pages of "
            "the repacked weights, never read after loading; the kernel drops them when memory is short, so the "
            f"verdict counts the {e.resident_bytes / GIB:.2f} GiB that must stay resident."
        )
    lines += [
        f"Verdict: {placement}" + (f" ({APPROXIMATE_NOTE})" if e.approximate else "") + "." + limits,
        f"Decode: {rate_range(s.decode_tokens_per_s)}"
        + (f" per user ({s.users} at once: {rate_range(s.decode_total_tokens_per_s)} in total)" if s.users > 1 else "")
        + f", {s.depth_tokens:,} tokens into each conversation; "
        f"prefill: {rate_range(s.prefill_tokens_per_s)}; "
        f"time to first token ({s.prompt_tokens} tokens): {s.ttft_s.low:.2f}-{s.ttft_s.high:.2f} s.",
        "",
        "Assumptions:",
    ]
    lines += [f"  - {a}" for a in list(e.assumptions) + list(s.assumptions)]
    return "\n".join(lines)


def cmd_demo(args: argparse.Namespace) -> int:
    from app.adapters.demo_model import demo_model_path

    path = demo_model_path()
    ns = build_parser().parse_args(["estimate", "--gguf", str(path)] + (["--json"] if args.json else []))
    if not args.json:
        print(f"Demo model: {path}\n")
    return cmd_estimate(ns)
