"""The listings: ``fitscope models``, ``architectures`` and ``gpus`` (the catalogs FitScope
estimates from) and ``hw`` (what this machine has: its GPUs of any vendor with the memory they can use, CPU and
RAM, as the window's hardware box says it), as tables or JSON.
"""

from __future__ import annotations

import argparse
import json


def cmd_models(args: argparse.Namespace) -> int:
    if getattr(args, "remote", False):
        from app.cli.remote import cmd_models_remote

        return cmd_models_remote(args.json)
    from app.core.model.catalog import load_models

    models = load_models()
    if args.json:
        print(json.dumps([m.model_dump() for m in models], indent=2))
        return 0
    from app.core.memory.speculative import supports_mtp

    def mtp(m) -> str:
        """The file's MTP head: never loaded by default (load_mtp off); --mtp drafts with it where
        this llama.cpp can."""
        if not m.n_nextn_layers:
            return "-"
        return "--mtp" if supports_mtp(m) else "unused"

    print(f"{'id':26s} {'arch':14s} {'params':>8s} {'layers':>6s} {'ctx':>8s} {'MTP':>6s}  name")
    for m in models:
        size = f"{m.params_billions:g}B" if m.params_billions else "?"
        print(f"{m.id:26s} {m.arch:14s} {size:>8s} {m.n_layer:6d} {m.n_ctx_train:8d} {mtp(m):>6s}  {m.name}")
    print("MTP: the file keeps a multi-token-prediction head, not loaded unless llama-server drafts with it "
          "(--mtp: its cost is estimated); unused: this llama.cpp cannot draft with it.")
    return 0


def cmd_architectures(args: argparse.Namespace) -> int:
    from app.core.model.coverage import coverage_table, llamacpp_architectures

    version, known = llamacpp_architectures()
    rows = coverage_table()
    if args.json:
        out = {"llama_cpp_python": version, "architectures": [vars(r) for r in rows]}
        print(json.dumps(out, indent=2))
        return 0
    width = max(len(r.arch) for r in rows)
    for r in rows:
        print(f"{r.arch:<{width}}  {r.label:<16}  {r.detail if r.status != 'approximate' else ''}".rstrip())
    exact = sum(r.status == "exact" for r in rows)
    print(
        f"\nllama-cpp-python {version} loads {len(known)} architectures: {exact} with exact (proven) rules, "
        f"the rest approximate (weights exact, the rest from generic rules)."
    )
    return 0


def cmd_gpus(args: argparse.Namespace) -> int:
    from app.core.model.catalog import load_devices

    devices = load_devices()
    if args.json:
        print(json.dumps([d.model_dump() | {"capacity_bytes": d.capacity_bytes} for d in devices], indent=2))
        return 0
    print(f"{'id':22s} {'memory':>8s} {'GB/s':>7s} {'TFLOPS':>7s} {'price':>8s}  name")
    for d in devices:
        price = f"${d.price_usd:,.0f}" if d.price_usd else "-"
        print(f"{d.id:22s} {d.memory_gib:6.0f}GB {d.bandwidth_gb_s:7.0f} {d.fp16_tflops:7.1f} {price:>8s}  {d.name}")
    return 0


def cmd_hw(args: argparse.Namespace) -> int:
    from app.adapters.gpus import detect_gpus
    from app.adapters.host import detect_host
    from app.core.report.machine_text import machine_lines

    status = detect_gpus()
    host = detect_host(measure_bandwidth=True)
    if args.json:
        print(json.dumps({"gpus": status.model_dump(), "host": host.model_dump()}, indent=2))
        return 0
    print("\n".join(machine_lines(status, host)))
    return 0
