"""Live runs: ``fitscope run`` (generate with llama.cpp and time the first token, prefill and
decode; also across llama.cpp RPC servers with --rpc / --rpc-local) and ``fitscope bench``
(llama-bench's pp and tg, optionally swept over thread counts).

A finished run is held against the estimate and kept in the history by ``app.services.runs``, the
same flow the window runs; this module turns arguments into ``RunSettings``, prints progress on
stderr and the report on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys

from app.cli import _signals_deferred
from app.core.common.errors import FitScopeError
from app.core.common.units import MIB


def _run_settings(args: argparse.Namespace, mode: str):
    from pydantic import ValidationError

    from app.core.speed.measure import RunSettings

    path = args.gguf
    if not path:
        from app.adapters.demo_model import demo_model_path

        path = str(demo_model_path())
    fields = {
        "gguf_path": path,
        "mode": mode,
        "context_tokens": args.ctx_size,
        "batch_tokens": args.batch_size,
        "ubatch_tokens": args.ubatch_size,
        "flash_attn": args.flash_attn == "on",
        "cache_type_k": args.cache_type_k,
        "cache_type_v": args.cache_type_v,
        "gpu_layers": args.n_gpu_layers,
        "n_threads": args.threads,
        "repeat": args.repeat,
    }
    if mode == "bench":
        fields |= {
            "prompt_tokens": args.n_prompt,
            "max_tokens": args.n_gen,
            "depth_tokens": args.depth,
            "ignore_eos": True,
        }
    else:
        fields |= {
            "prompt": args.prompt,
            "prompt_tokens": args.prompt_tokens,
            "max_tokens": args.n_predict,
            "temperature": args.temp,
            "chat": args.chat,
            "system_prompt": args.system,
        }
        if args.system and not args.chat:
            raise FitScopeError("--system goes with --chat (a system prompt is part of a chat).")
    # A synthetic prompt's length is known: held against the context before any model is loaded.
    known = fields.get("prompt_tokens") or (512 if mode == "bench" else 0)
    if known:
        needed = known + fields["max_tokens"] + fields.get("depth_tokens", 0)
        if needed > args.ctx_size:
            raise FitScopeError(
                f"The prompt ({known:,} tokens) and {fields['max_tokens']:,} new tokens need a context of "
                f"{needed:,}, more than the {args.ctx_size:,} set (-c); raise the context or shorten the prompt."
            )
    try:
        return RunSettings(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise FitScopeError(f"Invalid {first['loc'][0] if first['loc'] else 'setting'}: {first['msg']}.") from exc


def _measure_and_report(args: argparse.Namespace, mode: str) -> int:
    from app.adapters.child_protocol import ChildEvent
    from app.adapters.llamacpp_runner import LiveLoaded, RunDone, run_live
    from app.core.model.source import model_from_gguf
    from app.services.runs import detect_machine

    settings = _run_settings(args, mode)
    model = model_from_gguf(settings.gguf_path)
    machine = detect_machine(measure_bandwidth=False)
    assert machine.host is not None
    hardware = {"label": machine.host.cpu_model, "cpu": machine.host.cpu_model}
    if machine.gpus:
        hardware["gpus"] = ", ".join(g.name for g in machine.gpus)
        hardware["label"] = hardware["gpus"]

    def progress(event: ChildEvent) -> None:
        if args.json:
            return
        if isinstance(event, LiveLoaded):
            print(f"loaded {model.label} in {event.load_s:.2f} s", file=sys.stderr)
        elif isinstance(event, RunDone):
            f = event.figures

            def rate(value: float | None) -> str:
                return "-" if value is None else f"{value:.1f} tok/s"

            print(
                f"  run {event.run + 1}: TTFT {f.ttft_s * 1000:.0f} ms, prefill {rate(f.prefill_tokens_per_s_wall)}, "
                f"decode {rate(f.decode_tokens_per_s_wall)}",
                file=sys.stderr,
            )

    sweep = None
    if getattr(args, "sweep_threads", False):
        from app.adapters.cpu_topology import llama_math_threads, logical_cpus
        from app.adapters.llamacpp_runner import sweep_threads
        from app.core.speed.llama_defaults import thread_sweep
        from app.core.speed.measure import sweep_rows

        counts = thread_sweep(llama_math_threads(), logical_cpus())
        if not args.json:
            print(f"sweeping threads: {', '.join(map(str, counts))}", file=sys.stderr)
        results = sweep_threads(settings, counts, on_event=progress)
        sweep = sweep_rows(results)
        # The report and the calibration follow the run with llama-server's threads.
        result = next((r for r in results if r.threads and r.threads.is_llama_default), results[-1])
        result = result.model_copy(update={"hardware": hardware})
    else:
        result = run_live(settings, on_event=progress, hardware=hardware)
    with _signals_deferred():  # the run is finished: report and save it before any interrupt
        return _report_run(args, result, machine, sweep)


def _report_run(args, result, machine, sweep) -> int:
    """Hold the finished run against the estimate on ``machine``, save it (unless --no-save) and print it."""
    import dataclasses

    from app.adapters.host import measure_read_bandwidth_gb_s
    from app.services.runs import finish_run, ran_on_gpu, save_run

    if not ran_on_gpu(result, machine) and machine.host is not None:
        # On the CPU: its memory bandwidth, measured now, sets the estimate; the GPUs still name the
        # machine its calibration is kept for.
        bandwidth = measure_read_bandwidth_gb_s(budget_s=0.3)
        host = machine.host.model_copy(update={"measured_read_bandwidth_gb_s": bandwidth})
        machine = dataclasses.replace(machine, host=host)
    report = finish_run(result, machine, sweep or ())
    if not args.no_save:
        report = save_run(report, machine)
        if report.save_message:
            print(f"fitscope: {report.save_message}", file=sys.stderr)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(format_run_report(report.to_json()))
    return 0


def format_run_report(r: dict) -> str:
    def fmt(v, unit="", scale=1.0, digits=1):
        return "-" if v is None else f"{v * scale:,.{digits}f}{unit}"

    lines = [
        f"{r['model']} ({r['mode']}), llama-cpp-python {r['llama_cpp_version']}",
        f"load {fmt(r['load_s'], ' s', digits=2)}; TTFT {fmt(r['ttft_s'], ' ms', 1000, 0)}; "
        f"prefill {fmt(r['prefill_tokens_per_s'], ' tok/s')}; decode {fmt(r['decode_tokens_per_s'], ' tok/s')}; "
        f"inter-token p50 {fmt(r['itl_p50_s'], ' ms', 1000)} / p95 {fmt(r['itl_p95_s'], ' ms', 1000)}; "
        f"peak RSS {fmt(r['peak_rss_bytes'], ' MiB', 1 / MIB, 0)}",
    ]
    if r.get("threads"):
        lines.append(f"threads: {r['threads']['text']}")
    if r.get("prompt_format") == "chat template":
        lines.append("prompt: one user turn through the model's chat template")
    for row in r.get("thread_sweep") or []:
        pp, tg = row["prefill_tokens_per_s"], row["decode_tokens_per_s"]
        lines.append(
            f"  {row['n_threads']:3d} thread{'s' if row['n_threads'] != 1 else ' '}: "
            f"pp {fmt(pp, ' tok/s')}{' (peak)' if row['best_prefill'] else ''}, "
            f"tg {fmt(tg, ' tok/s')}{' (peak)' if row['best_decode'] else ''}"
        )
    if r.get("calibration_note"):
        lines.append(r["calibration_note"])
    est = r.get("estimate")
    if est:
        from app.core.report.verdict import rate_range
        from app.core.speed.predict import Range

        d = est["decode_tokens_per_s"]
        lines.append(f"estimated decode {rate_range(Range(d['low'], d['high']))}")
    if r.get("comparison"):
        # A run across RPC servers is held against the RPC plan, device by device.
        width, against = (36, "plan") if "rpc" in r else (16, "estimate")
        lines.append("")
        lines.append(f"{'buffer':{width}s} {'llama.cpp':>12s} {against:>12s} {'difference':>12s}")
        for c in r["comparison"]:
            pct = "" if c["difference_percent"] is None else f" ({c['difference_percent']:+.1f}%)"
            lines.append(
                f"{c['buffer']:{width}s} {c['measured_bytes'] / MIB:9.2f} MiB {c['estimated_bytes'] / MIB:9.2f} MiB "
                f"{c['difference_bytes'] / MIB:+9.2f} MiB{pct}"
            )
    for sentence in r.get("diagnosis", []):
        lines.append(f"\n{sentence}")
    if "history_id" in r:
        lines.append(f"\nSaved as run #{r['history_id']} in the history.")
    return "\n".join(lines)


def cmd_run(args: argparse.Namespace) -> int:
    if args.rpc or args.rpc_local:
        return _run_rpc(args)
    return _measure_and_report(args, "generate")


def _run_rpc(args: argparse.Namespace) -> int:
    """``fitscope run --rpc`` / ``--rpc-local``: the run across RPC servers, every per-device
    buffer llama.cpp printed beside the RPC plan's. Not saved in the history (its speed includes
    the network and must not calibrate this machine)."""
    from app.adapters.rpc_backend import parse_endpoints
    from app.adapters.rpc_servers import run_across_rpc
    from app.services.runs import rpc_run_report

    settings = _run_settings(args, "generate")

    def servers(endpoints: tuple[str, ...]) -> None:
        if not args.json and args.rpc_local:
            print(f"started {len(endpoints)} RPC servers: {', '.join(endpoints)}", file=sys.stderr)

    def progress(event: object) -> None:
        from app.adapters.llamacpp_runner import LiveLoaded

        if not args.json and isinstance(event, LiveLoaded):
            print(f"loaded in {event.load_s:.2f} s", file=sys.stderr)

    outcome = run_across_rpc(
        settings,
        endpoints=parse_endpoints(args.rpc) if args.rpc else (),
        local_servers=args.rpc_local or 0,
        on_event=progress,
        on_servers=servers,
    )
    report = rpc_run_report(outcome).to_json()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(format_run_report(report))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    return _measure_and_report(args, "bench")
