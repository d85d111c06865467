"""Planning from the terminal: ``fitscope plan`` (one model on several GPUs: llama.cpp's layer
split and vLLM's tensor parallel, or llama.cpp's RPC split across machines), ``fitscope advise``
(which machine to buy for a workload) and ``fitscope load`` (latency and throughput under load,
simulated from this machine's batched-decoding measurements).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from app.core.common.errors import FitScopeError
from app.core.common.units import GIB


def cmd_plan(args: argparse.Namespace) -> int:
    from app.adapters.host import detect_host
    from app.core.memory.records import Settings
    from app.core.memory.targets import repack_profile
    from app.core.model.catalog import find_device
    from app.core.model.source import model_from_catalog
    from app.services.plans import scale_out

    if not 1 <= args.count <= 16:
        raise FitScopeError("--count must be 1 to 16 GPUs.")
    model = model_from_catalog(args.model, args.quant)
    host = detect_host(measure_bandwidth=False)
    ram = int(args.host_ram_gib * GIB) if args.host_ram_gib else host.ram_total_bytes
    settings = Settings(
        context_tokens=args.ctx_size * args.parallel, parallel_sequences=args.parallel, repack=repack_profile(host)
    )
    if args.rpc_host:
        return _plan_rpc(args, model, settings, ram)
    if not args.gpu:
        raise FitScopeError("Name the GPU (--gpu CATALOG_ID), or the machines of an RPC split (--rpc-host).")
    gpu = find_device(args.gpu)
    if args.nodes != 1:
        return _plan_nodes(args, model, gpu)
    plans = scale_out(
        model,
        settings,
        gpu,
        args.count,
        ram,
        dtype=args.dtype,
        context_per_sequence=args.ctx_size,
        max_num_seqs=args.max_num_seqs,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_dtype=args.kv_cache_dtype,
    )
    if args.json:
        print(json.dumps(plans.to_json(), indent=2))
        return 0
    print(f"llama.cpp, layer split ({model.quant}):")
    for line in plans.split.summary_lines():
        print(f"  {line}")
    print(f"  {plans.split.command}\n")
    print(f"vLLM, tensor parallel ({args.dtype}):")
    if plans.vllm is None:
        print(f"  vLLM cannot serve it this way: {plans.vllm_problem}")
        return 0
    for line in plans.vllm.summary_lines():
        print(f"  {line}")
    print(f"  {plans.vllm.command}")
    return 0


def _plan_nodes(args: argparse.Namespace, model, gpu) -> int:
    """``--nodes N``: vLLM with tensor parallelism over ``--count`` GPUs in each of N nodes and
    pipeline parallelism across them, with the Ray and vllm serve commands for each node."""
    from app.core.plans.rpc import NetworkLink
    from app.core.plans.vllm_pipeline import vllm_multinode_plan

    if not 1 <= args.nodes <= 64:
        raise FitScopeError("--nodes must be 1 to 64.")
    plan = vllm_multinode_plan(
        model.arch,
        gpu,
        args.count,
        args.nodes,
        dtype=args.dtype,
        max_model_len=args.ctx_size,
        max_num_seqs=args.max_num_seqs,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_dtype=args.kv_cache_dtype,
        head_address=args.head_address,
        link=NetworkLink(gbit_s=args.link_gbps, rtt_ms=args.rtt_ms),
    )
    if args.json:
        print(json.dumps({"vllm_multinode": plan.to_json()}, indent=2))
        return 0
    print(f"vLLM across {args.nodes} nodes ({args.dtype}): tensor parallel inside each, pipeline parallel across:")
    for line in plan.summary_lines():
        print(f"  {line}")
    print(f"\n  On the head node:   {plan.ray_head_command}")
    print(f"  On every other node: {plan.ray_worker_command}")
    print(f"  Then on the head node:\n    {plan.command}")
    print("\n  llama.cpp across machines: see --rpc-host.")
    return 0


def _plan_rpc(args: argparse.Namespace, model, settings, ram: int) -> int:
    from app.core.plans.rpc import NetworkLink, parse_host, rpc_plan

    settings = settings.model_copy(update={"consumer": "llama-server", "swa_full": False})
    plan = rpc_plan(
        model.arch,
        model.tensors,
        settings,
        [parse_host(h) for h in args.rpc_host],
        ram,
        client_gpu_id=args.gpu,
        client_gpu_count=args.count if args.gpu else 0,
        link=NetworkLink(gbit_s=args.link_gbps, rtt_ms=args.rtt_ms),
        model_path=f"{model.arch.id}-{model.quant}.gguf",
    )
    if args.json:
        print(json.dumps({"llama_cpp_rpc": plan.to_json()}, indent=2))
        return 0
    print(f"llama.cpp across machines, RPC backend ({model.quant}):")
    for line in plan.summary_lines():
        print(f"  {line}")
    print("\n  On each host:")
    for h in plan.hosts:
        print(f"    {h.endpoint}: {h.command}")
    print(f"  On the client:\n    {plan.command}")
    for note in plan.notes:
        print(f"  - {note}")
    return 0


def cmd_advise(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from app.core.advisor.commands import advice_json
    from app.core.advisor.records import Workload
    from app.core.model.catalog import find_device
    from app.core.report.choices import ModelChoice
    from app.services.advisor import advise, format_advice, words_to_tokens

    if args.machine:
        return _models_for_machine(args)
    if args.gguf:
        model = ModelChoice(kind="gguf", ref=args.gguf)
    elif args.hf_config:
        model = ModelChoice(kind="hf_config", ref=args.hf_config)
    else:
        model = ModelChoice(kind="catalog", ref=args.model)
    for device_id in args.why:
        find_device(device_id)  # an unknown id is a one-line error naming close ones
    tps = words_to_tokens(args.min_wps) if args.min_wps is not None else args.min_tps
    try:
        workload = Workload(
            model=model,
            quants=tuple(args.quant or ()),
            context_per_user_tokens=args.ctx_size,
            users=args.users,
            min_tokens_per_s=10.0 if tps is None else tps,
            budget_usd=args.budget,
            prefer=args.prefer,
            quality_floor=args.quality,
            max_gpus=args.max_gpus,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        raise FitScopeError(f"{'.'.join(map(str, first['loc']))}: {first['msg']}.") from None
    advice = advise(workload)
    if args.json:
        print(json.dumps(advice_json(advice, limit=max(args.top, 1)), indent=2))
    else:
        print(format_advice(advice, top=args.top, why=args.why))
    return 0


def _models_for_machine(args: argparse.Namespace) -> int:
    """``fitscope advise --machine ID``: the catalog's models ranked by answer quality among those
    the machine runs fast enough (app.services.model_finder)."""
    from pydantic import ValidationError

    from app.core.model.catalog import find_device
    from app.core.report.choices import Controls, HardwareChoice, Machine
    from app.services.advisor import words_to_tokens
    from app.services.model_finder import format_models, models_for_machine

    machine = Machine()
    try:
        controls = Controls(context_per_user_tokens=args.ctx_size, users=args.users)
        if args.machine == "local":
            from app.services.runs import detect_machine

            hardware = HardwareChoice(kind="local")
            machine = detect_machine(measure_bandwidth=False)
        else:
            find_device(args.machine)  # an unknown id is a one-line error naming close ones
            hardware = HardwareChoice(kind="catalog", device_id=args.machine, count=args.gpus)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise FitScopeError(f"{'.'.join(map(str, first['loc']))}: {first['msg']}.") from None
    tps = words_to_tokens(args.min_wps) if args.min_wps is not None else args.min_tps
    result = models_for_machine(hardware, controls, 10.0 if tps is None else tps, args.quality, machine)
    if args.json:
        print(json.dumps(models_json(result, args.top), indent=2))
    else:
        print(format_models(result, top=args.top))
    return 0


def models_json(result: Any, top: int) -> dict[str, Any]:
    """``fitscope advise --machine --json``: the ranked models and why the others fall short."""

    def row(o: Any) -> dict[str, Any]:
        return {
            "model": o.model_id,
            "name": o.name,
            "quant": o.quant,
            "mmlu_pro_percent": o.score.mmlu_pro_percent if o.score else None,
            "quality": o.level.words,
            "score_source": o.score.source_url if o.score else None,
            "placement": o.placement,
            "decode_tokens_per_s": o.decode.as_dict() if o.decode else None,
            "passes": o.passes,
            "reason": o.reason,
        }

    return {
        "machine": result.machine_label,
        "users": result.controls.users,
        "context_per_user_tokens": result.controls.context_per_user_tokens,
        "min_tokens_per_s": result.min_tokens_per_s,
        "ranked": [row(o) for o in result.ranked[: max(top, 1)]],
        "failing": [row(o) for o in result.failing],
    }


def cmd_load(args: argparse.Namespace) -> int:
    from app.adapters.host import detect_host
    from app.adapters.load_profile import cached_profile, measure_profile, memory_slots, profile_json
    from app.core.hardware.snapshots import machine_key
    from app.core.memory.targets import cpu_target, repack_profile
    from app.services.load import simulate_load

    try:
        users = [int(u) for u in args.users.split(",") if u.strip()]
    except ValueError:
        raise FitScopeError(f"--users takes numbers separated by commas, not {args.users!r}.") from None
    if not users or min(users) < 1:
        raise FitScopeError("--users needs at least one positive number.")
    path = args.gguf
    if not path:
        from app.adapters.demo_model import demo_model_path

        path = str(demo_model_path())
    else:
        from app.core.common.errors import ModelFileError
        from app.core.common.files import regular_file

        regular_file(Path(path).expanduser(), "model file", ModelFileError)
    host = detect_host(measure_bandwidth=False)
    key = machine_key(host)
    profile = None if args.remeasure else cached_profile(path, key)
    if profile is None:
        if not args.json:
            print("measuring batched decoding on this machine (1, 2 and 4 sequences)...", file=sys.stderr)
        profile = measure_profile(path, key)
    rates: list[float] = []
    if args.rates:
        try:
            rates = [float(r) for r in args.rates.split(",") if r.strip()]
        except ValueError:
            raise FitScopeError(f"--rates takes numbers separated by commas, not {args.rates!r}.") from None
        if not rates or min(rates) <= 0:
            raise FitScopeError("--rates needs positive numbers of requests per second.")
    targets, repack = [cpu_target(host)], repack_profile(host)
    simulation = simulate_load(
        profile,
        lambda tokens: memory_slots(path, tokens, targets, repack),
        prompt=args.prompt,
        output=args.output,
        longest_tokens=args.prompt + args.output,
        slots=args.slots,
        n_requests=args.requests,
        users=users,
        rates=rates,
        think_time_s=args.think,
    )
    max_slots, points = simulation.max_slots, simulation.points
    if args.json:
        report = {
            "gguf_path": path,
            "profile": profile_json(profile),
            "max_slots_by_memory": max_slots,
            "points": [p.model_dump() for p in points],
        }
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"{Path(path).name}: prefill {profile.prefill_tokens_per_s:.0f} tok/s; decode "
        + ", ".join(f"{n} seq {r:.1f} tok/s" for n, r in profile.decode_tokens_per_s.items())
        + f"; memory holds {max_slots} slots of {args.prompt + args.output} tokens"
    )
    print(
        f"{'load':>6s} {'batching':>8s} {'tok/s':>7s} {'req/s':>6s} {'TTFT p50':>9s} {'p95':>7s} {'e2e p50':>8s} "
        f"{'p95':>7s}"
    )
    for p in points:
        print(
            f"{load_label(p):>6s} {'yes' if p.batching else 'no':>8s} {p.tokens_per_s:7.1f} {p.requests_per_s:6.2f} "
            f"{p.ttft_p50_s:8.2f}s {p.ttft_p95_s:6.2f}s {p.e2e_p50_s:7.2f}s {p.e2e_p95_s:6.2f}s"
        )
    return 0


def load_label(point) -> str:
    """A load point: "4" users, or "0.5/s" arrivals."""
    return str(point.users) if point.users is not None else f"{point.rate_per_s:g}/s"
