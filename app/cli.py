"""The ``fitscope`` command: estimates, catalogs and detected hardware from the terminal.

Flags follow llama.cpp's own names (-c, -b, -ub, -fa, -ctk, -ctv, -np, -ngl) so a command can be
carried over to llama-server unchanged.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import re
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NoReturn

from app.core.errors import FitScopeError
from app.core.host_memory import HOST_MEMORY
from app.core.tensors import CACHE_TYPES
from app.core.units import GIB, MIB

CACHE_TYPE_NAMES = list(CACHE_TYPES)



def _add_estimate_args(p: argparse.ArgumentParser) -> None:
    src = p.add_argument_group("model (one of)")
    src.add_argument("--gguf", metavar="PATH", help="a local GGUF file (its real tensors are summed)")
    src.add_argument("--hf-config", metavar="PATH", help="a Hugging Face config.json")
    src.add_argument("--model", metavar="CATALOG_ID", help="a catalog model, e.g. llama-3.1-8b")
    src.add_argument(
        "--mmproj",
        metavar="PATH",
        help="a vision projector GGUF loaded beside the model (as llama-server --mmproj)",
    )
    src.add_argument(
        "--projector",
        action="store_true",
        help="add the catalog model's vision projector (F16, as published beside its GGUF)",
    )
    src.add_argument(
        "--no-mmproj-offload",
        dest="mmproj_offload",
        action="store_false",
        help="keep the projector in host memory (llama-server's flag)",
    )
    src.add_argument(
        "--quant",
        default=None,
        help="llama.cpp preset for --model/--hf-config (default Q4_K_M; MXFP4_MOE for models released in MXFP4)",
    )
    dev = p.add_argument_group("hardware")
    dev.add_argument(
        "--gpu",
        action="append",
        metavar="local|CATALOG_ID",
        help="'local' for the detected NVIDIA GPUs, or a catalog id (GPUs, Apple, unified-memory boxes, CPU "
        "servers: fitscope gpus lists them); repeat for several GPUs",
    )
    dev.add_argument("--cpu", action="store_true", help="run on the CPU only (host memory)")
    dev.add_argument(
        "--host-memory",
        choices=sorted(HOST_MEMORY),
        default=None,
        help="host RAM beside catalog GPUs, for its bandwidth (default ddr5-5600-2ch)",
    )
    dev.add_argument(
        "--host-ram-gib", type=float, default=None, help="host memory beside catalog GPUs (default: this machine's)"
    )
    llm = p.add_argument_group("llama.cpp settings (same flags as llama-server)")
    llm.add_argument("-c", "--ctx-size", type=int, default=4096, help="context length in tokens (default 4096)")
    llm.add_argument("-b", "--batch-size", type=int, default=2048)
    llm.add_argument("-ub", "--ubatch-size", type=int, default=512)
    llm.add_argument("-fa", "--flash-attn", choices=["on", "off"], default="on")
    llm.add_argument("-ctk", "--cache-type-k", default="f16", choices=CACHE_TYPE_NAMES)
    llm.add_argument("-ctv", "--cache-type-v", default="f16", choices=CACHE_TYPE_NAMES)
    llm.add_argument("-np", "--parallel", type=int, default=1)
    llm.add_argument("--kv-unified", action="store_true")
    swa = llm.add_mutually_exclusive_group()
    swa.add_argument(
        "--swa-full",
        dest="swa_full",
        action="store_true",
        default=None,
        help="full-size sliding-window cache (llama-cpp-python's default)",
    )
    swa.add_argument("--no-swa-full", dest="swa_full", action="store_false", help="llama-server's default")
    llm.add_argument(
        "-ngl",
        "--n-gpu-layers",
        default=None,
        help="layers on the GPUs: a number, or 'auto' as llama.cpp's --fit chooses (default: all)",
    )
    moe = llm.add_mutually_exclusive_group()
    moe.add_argument("--n-cpu-moe", type=int, default=None, help="keep the experts of the first N layers in RAM")
    moe.add_argument("--cpu-moe", action="store_true", help="keep every layer's experts in RAM")
    llm.add_argument("--fit-target", type=int, default=1024, help="MiB kept free per GPU by -ngl auto (default 1024)")
    llm.add_argument("--no-mmap", action="store_true", help="load the weights instead of mapping them")
    build = p.add_argument_group("llama.cpp build and program")
    build.add_argument(
        "--backend",
        choices=["auto", "cpu", "cuda", "rocm", "vulkan", "metal"],
        default="auto",
        help="the llama.cpp build (default: by the GPUs' vendor; the CPU build without GPUs)",
    )
    build.add_argument(
        "--consumer",
        choices=["llama-server", "llama-cpp-python"],
        default="llama-server",
        help="who runs llama.cpp: llama-server (default) or llama-cpp-python (FitScope's own runs)",
    )
    p.add_argument("-p", "--prompt-tokens", type=int, default=512, help="prompt length for time to first token")
    p.add_argument("--json", action="store_true", help="machine-readable output (bytes as integers)")


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gguf", metavar="PATH", help="the GGUF file to run (default: the built-in demo model)")
    p.add_argument("-c", "--ctx-size", type=int, default=4096)
    p.add_argument("-b", "--batch-size", type=int, default=2048)
    p.add_argument("-ub", "--ubatch-size", type=int, default=512)
    p.add_argument("-fa", "--flash-attn", choices=["on", "off"], default="on")
    p.add_argument("-ctk", "--cache-type-k", default="f16", choices=CACHE_TYPE_NAMES)
    p.add_argument("-ctv", "--cache-type-v", default="f16", choices=CACHE_TYPE_NAMES)
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, help="layers on the GPU (-1: all; default 0)")
    p.add_argument(
        "-t", "--threads", type=int, default=None, help="CPU threads (default: llama-server's, the physical cores)"
    )
    p.add_argument("--no-save", action="store_true", help="do not add the run to the history")
    p.add_argument("--json", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fitscope", description="Will this language model run on this machine, and how fast?")
    sub = parser.add_subparsers(dest="command")
    est = sub.add_parser("estimate", help="memory and speed for a model, settings and hardware")
    _add_estimate_args(est)
    models = sub.add_parser("models", help="list the model catalog")
    models.add_argument("--json", action="store_true")
    archs = sub.add_parser(
        "architectures", help="the llama.cpp architectures and whether FitScope's memory rules are exact for each"
    )
    archs.add_argument("--json", action="store_true")
    gpus = sub.add_parser("gpus", help="list the GPU/device catalog")
    gpus.add_argument("--json", action="store_true")
    hw = sub.add_parser("hw", help="what this machine has: NVIDIA GPUs and the CPU/RAM")
    hw.add_argument("--json", action="store_true")
    demo = sub.add_parser("demo", help="estimate the built-in demo model (Gemma 3 270M Q4_K_M) on this machine")
    demo.add_argument("--json", action="store_true")
    run = sub.add_parser("run", help="generate with llama.cpp and measure TTFT, prefill and decode speed")
    _add_run_args(run)
    prompt = run.add_mutually_exclusive_group()
    prompt.add_argument("-p", "--prompt", help="the prompt text (default: a short sentence)")
    prompt.add_argument("--prompt-tokens", type=int, help="a synthetic prompt of exactly N tokens")
    run.add_argument("-n", "--n-predict", type=int, default=128, help="tokens to generate (default 128)")
    run.add_argument("--temp", type=float, default=0.0, help="temperature (default 0: greedy)")
    run.add_argument("--repeat", type=int, default=3, help="repetitions; medians are reported (default 3)")
    run.add_argument(
        "--chat",
        action="store_true",
        help="send the prompt as one user turn through the model's own chat template (as llama-server --jinja)",
    )
    run.add_argument("--system", metavar="TEXT", help="with --chat: a system prompt before the user turn")
    rpc = run.add_mutually_exclusive_group()
    rpc.add_argument(
        "--rpc",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="split the model across these llama.cpp RPC servers (ggml-rpc-server), as llama.cpp's --rpc",
    )
    rpc.add_argument(
        "--rpc-local", type=int, metavar="N", help="start N RPC servers on this machine and split the model across them"
    )
    bench = sub.add_parser("bench", help="llama-bench style: pp (prompt processing) and tg (generation) tokens/s")
    _add_run_args(bench)
    bench.add_argument("-p", "--n-prompt", type=int, default=512, help="pp: prompt tokens in one batch (default 512)")
    bench.add_argument("-n", "--n-gen", type=int, default=128, help="tg: tokens generated one by one (default 128)")
    bench.add_argument("-d", "--depth", type=int, default=0, help="context already filled before timing (default 0)")
    bench.add_argument("--repeat", type=int, default=3, help="repetitions (default 3; llama-bench uses 5)")
    bench.add_argument(
        "--sweep-threads",
        action="store_true",
        help="run once per thread count (1 to the physical cores, and the logical CPUs) to find the peaks",
    )
    cmp_ = sub.add_parser("compare", help="run task suites on 2-4 quantized variants and recommend one per task")
    cmp_.add_argument("--gguf", action="append", metavar="PATH", required=True, help="a variant (repeat: 2-4)")
    cmp_.add_argument(
        "--suite",
        action="append",
        metavar="NAME|PATH",
        help="a built-in suite, one of yours (see `fitscope suites`) or a JSON/YAML file (repeatable; "
        "default: every built-in suite and yours)",
    )
    cmp_.add_argument("--gpu", metavar="CATALOG_ID", help="advise for catalog hardware (default: this machine)")
    cmp_.add_argument("-c", "--ctx-size", type=int, default=4096)
    cmp_.add_argument("-ngl", "--n-gpu-layers", type=int, default=0)
    cmp_.add_argument("--routing-config", metavar="PATH", help="also write the routing config (.json or .toml)")
    cmp_.add_argument(
        "--kl-text",
        metavar="PATH|builtin",
        default="builtin",
        help="text for KL divergence and perplexity against the reference (default: the built-in public-domain text)",
    )
    cmp_.add_argument(
        "--kl-tokens", type=int, default=2048, help="tokens of the text to evaluate (0: all; default 2048)"
    )
    cmp_.add_argument("--kl-chunk", type=int, default=512, help="chunk size, as llama-perplexity's -c (default 512)")
    cmp_.add_argument("--no-kl", action="store_true", help="skip the KL divergence and perplexity measurement")
    cmp_.add_argument("--json", action="store_true")
    suites = sub.add_parser("suites", help="list the task suites for compare, and add examples of your own task")
    suites.add_argument(
        "--add", metavar="PROMPT", help="add an example to your suite: the prompt as the model gets it ('-': stdin)"
    )
    suites.add_argument("--expect", metavar="ANSWER", help="with --add: the answer you expect")
    suites.add_argument(
        "--check",
        choices=("contains", "exact", "similar"),
        default="contains",
        help="with --add: pass when the answer contains the expected one, is exactly it, or says the same "
        "(content-word F1 >= 0.4) (default: contains)",
    )
    suites.add_argument(
        "--to", metavar="NAME", default="my-examples", help="with --add: your suite (default my-examples)"
    )
    qz = sub.add_parser("quantize", help="make a quantized variant of a GGUF file with llama.cpp's quantizer")
    qz.add_argument("--gguf", metavar="PATH", required=True, help="the source (F16/BF16/Q8_0...)")
    qz.add_argument("--type", required=True, help="llama.cpp preset: Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q4_0, ...")
    qz.add_argument("-o", "--output", metavar="PATH", help="default: beside the source, named after the preset")
    plan = sub.add_parser("plan", help="one model on several GPUs: llama.cpp's layer split and vLLM's tensor parallel")
    plan.add_argument("--model", required=True, metavar="CATALOG_ID")
    plan.add_argument("--gpu", metavar="CATALOG_ID", help="the GPUs (with --rpc-host: the client's own, optional)")
    plan.add_argument("--count", type=int, default=2, help="number of GPUs (default 2)")
    plan.add_argument("--quant", default="Q4_K_M", help="llama.cpp preset for the layer split (default Q4_K_M)")
    plan.add_argument("--dtype", default="FP16", help="vLLM weights: FP16, FP8, INT8, AWQ, GPTQ (default FP16)")
    plan.add_argument("-c", "--ctx-size", type=int, default=8192, help="context per sequence (default 8192)")
    plan.add_argument("-np", "--parallel", type=int, default=1, help="llama.cpp sequences (default 1)")
    plan.add_argument("--max-num-seqs", type=int, default=256, help="vLLM's --max-num-seqs (default 256)")
    plan.add_argument("--gpu-memory-utilization", type=float, default=0.90)
    plan.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"])
    plan.add_argument("--host-ram-gib", type=float, default=None)
    plan.add_argument(
        "--rpc-host",
        action="append",
        metavar="HOST[:PORT]=CATALOG_ID[xN]",
        help="a machine running ggml-rpc-server (repeat): plan llama.cpp's RPC split across machines instead",
    )
    plan.add_argument("--link-gbps", type=float, default=10.0, help="network speed for --rpc-host (default 10)")
    plan.add_argument("--rtt-ms", type=float, default=0.2, help="network round trip for --rpc-host (default 0.2)")
    plan.add_argument("--json", action="store_true")
    adv = sub.add_parser("advise", help="which machine to buy: every catalog configuration for a workload, ranked")
    adv_model = adv.add_mutually_exclusive_group(required=True)
    adv_model.add_argument("--model", metavar="CATALOG_ID")
    adv_model.add_argument("--gguf", metavar="PATH")
    adv_model.add_argument("--hf-config", metavar="PATH")
    adv.add_argument("--quant", action="append", metavar="PRESET", help="only these presets (repeatable)")
    adv.add_argument("-c", "--ctx-size", type=int, default=8192, help="context per user (default 8192)")
    adv.add_argument("--users", type=int, default=1, help="concurrent users (default 1)")
    adv_speed = adv.add_mutually_exclusive_group()
    adv_speed.add_argument("--min-tps", type=float, help="tokens/s each user needs at least (default 10)")
    adv_speed.add_argument("--min-wps", type=float, help="the same in words a second (0.75 words per token)")
    adv.add_argument("--budget", type=float, help="US dollars at most")
    adv.add_argument("--prefer", choices=["price", "speed", "headroom"], default="price")
    adv.add_argument(
        "--quality", choices=["same", "slight", "noticeable", "any"], default="slight", help="quality floor"
    )
    adv.add_argument("--max-gpus", type=int, default=8, help="GPUs per box at most (1-8, default 8)")
    adv.add_argument("--top", type=int, default=10, help="machines listed (default 10)")
    adv.add_argument("--why", action="append", default=[], metavar="CATALOG_ID", help="say why one of these fails")
    adv.add_argument("--json", action="store_true")
    load = sub.add_parser("load", help="latency and throughput under load, simulated from this machine's measurements")
    load.add_argument("--gguf", metavar="PATH", help="the model file (default: the built-in demo model)")
    load.add_argument("--users", default="1,2,4,8", help="concurrent users, comma-separated (default 1,2,4,8)")
    load.add_argument("--prompt", type=int, default=256, help="prompt tokens per request (default 256)")
    load.add_argument("--output", type=int, default=128, help="generated tokens per request (default 128)")
    load.add_argument("--slots", type=int, default=4, help="parallel sequences, llama-server's -np (default 4)")
    load.add_argument("--think", type=float, default=0.0, help="seconds a user waits between requests")
    load.add_argument(
        "--rates", help="instead of users: random arrivals at these rates, requests/s, comma-separated (e.g. 0.2,0.5,1)"
    )
    load.add_argument("--requests", type=int, default=300, help="requests simulated per point (default 300)")
    load.add_argument("--remeasure", action="store_true", help="measure again instead of using the kept figures")
    load.add_argument("--json", action="store_true")
    win = sub.add_parser("window", help="open the desktop window (what `fitscope` alone does)")
    win.add_argument("path", nargs="?", help="a .gguf model or a config.json to open")
    win.add_argument("--demo", action="store_true", help="start on the built-in demo model")
    return parser


# -- commands ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block ends (then interrupt as usual): what was measured is
    reported and saved first. Only in the main thread, where Python handles signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _frame: caught.append(signum)) for s in _STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if caught:
            raise KeyboardInterrupt


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error, like every other message of the command."""

    def error(self, message: str) -> NoReturn:
        self.exit(
            2,
            f"fitscope: {self.prog.removeprefix('fitscope ')}: {clean_message(message, 300)} "
            f"(see {self.prog} --help)\n",
        )


def _int_option(flag: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise FitScopeError(f"Invalid {flag}: '{value}' is not a whole number (or 'auto').") from None


def _settings(args: argparse.Namespace, host_profile: str):
    from pydantic import ValidationError

    from app.core.estimate import Settings

    try:
        return Settings(
            context_tokens=args.ctx_size,
            batch_tokens=args.batch_size,
            ubatch_tokens=args.ubatch_size,
            flash_attn=args.flash_attn == "on",
            cache_type_k=args.cache_type_k,
            cache_type_v=args.cache_type_v,
            parallel_sequences=args.parallel,
            kv_unified=args.kv_unified,
            swa_full=args.swa_full if args.swa_full is not None else args.consumer != "llama-server",
            gpu_layers=None if args.n_gpu_layers in (None, "auto") else _int_option("-ngl", args.n_gpu_layers),
            repack=host_profile,  # type: ignore[arg-type]
            backend=args.backend,
            consumer=args.consumer,
            mmap=not args.no_mmap,
            n_cpu_moe=(1 << 20) if args.cpu_moe else (args.n_cpu_moe or 0),
            mmproj=_projector(args),
            mmproj_offload=args.mmproj_offload,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field = {
            "context_tokens": "-c",
            "batch_tokens": "-b",
            "ubatch_tokens": "-ub",
            "parallel_sequences": "-np",
            "gpu_layers": "-ngl",
        }.get(str(first["loc"][0]) if first["loc"] else "", "a setting")
        raise FitScopeError(f"Invalid {field}: {first['msg']}.") from exc


def _projector(args: argparse.Namespace):
    """The projector --mmproj or --projector names, or None."""
    if args.mmproj and args.projector:
        raise FitScopeError("Choose --mmproj PATH or --projector, not both.")
    if args.mmproj:
        from app.core.projector import read_projector

        return read_projector(args.mmproj)
    if not args.projector:
        return None
    from app.core.catalog import find_projector

    if not args.model:
        raise FitScopeError("--projector adds a catalog model's own projector: use it with --model, or give --mmproj.")
    entry = find_projector(args.model)
    if entry is None:
        raise FitScopeError(f"The catalog model '{args.model}' has no vision projector (it reads text only).")
    return entry.spec()


def _model(args: argparse.Namespace):
    from app.core import fit

    chosen = [x for x in (args.gguf, args.hf_config, args.model) if x]
    if len(chosen) != 1:
        raise FitScopeError("Name one model: --gguf PATH, --hf-config PATH or --model CATALOG_ID.")
    if args.gguf:
        return fit.model_from_gguf(args.gguf)
    if args.hf_config:
        return fit.model_from_hf_config(args.hf_config, args.quant or "Q4_K_M")
    from app.core.catalog import find_model

    return fit.model_from_catalog(args.model, args.quant or find_model(args.model).default_quant or "Q4_K_M")


def _targets(args: argparse.Namespace):
    from app.adapters.host import detect_host, measure_read_bandwidth_gb_s
    from app.core import fit
    from app.core.catalog import find_device

    host = detect_host(measure_bandwidth=False)
    gpu_args = args.gpu or []
    if args.cpu and gpu_args:
        raise FitScopeError("Choose --cpu or --gpu, not both.")
    targets = []
    local_requested = "local" in gpu_args or (not gpu_args and not args.cpu)
    if local_requested:
        from app.adapters.nvml import NvmlMonitor  # pynvml only for this machine's own GPUs

        status = NvmlMonitor().status()
        if status.available:
            targets += [fit.target_from_gpu(g) for g in status.gpus]
        elif "local" in gpu_args:
            raise FitScopeError(f"{status.message} Use --cpu, or --gpu CATALOG_ID for hardware you do not own.")
    for gid in gpu_args:
        if gid == "local":
            continue
        device = find_device(gid)
        if not device.is_gpu:
            # A catalog CPU box: its memory is the only target.
            if len(gpu_args) > 1:
                raise FitScopeError(f"{device.name} is a CPU machine; estimate it alone (one --gpu {gid}).")
            return [fit.target_from_device(device)], host
        targets.append(fit.target_from_device(device))
    if targets:
        ram = int(args.host_ram_gib * GIB) if args.host_ram_gib else host.ram_total_bytes
        if "local" in gpu_args or not gpu_args:
            targets.append(fit.host_ram_target(ram, measure_read_bandwidth_gb_s(budget_s=0.3)))
        else:
            targets.append(fit.host_ram_target(ram, host_memory=args.host_memory))
    else:
        bw = measure_read_bandwidth_gb_s(budget_s=0.3)
        targets.append(fit.cpu_target(host.model_copy(update={"measured_read_bandwidth_gb_s": bw})))
    return targets, host


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
        from app.core import fit
        from app.core.commands import server_command

    model = _model(args)
    targets, host = _targets(args)
    settings = _settings(args, fit.repack_profile(host))
    _check_projector_width(settings, model.arch)
    plan = None
    if args.n_gpu_layers == "auto":
        from app.core.autofit import auto_fit

        fixed = settings.n_cpu_moe if (args.cpu_moe or args.n_cpu_moe is not None) else None
        plan = auto_fit(model.arch, model.tensors, settings, targets, args.fit_target * MIB, fixed_cpu_moe=fixed)
        settings = plan.estimate.settings
        if plan.gpus_hidden:
            targets = [t for t in targets if t.kind == "cpu"]
    result = fit.fit(model, settings, targets, prompt_tokens=args.prompt_tokens)
    gpu_layers = result.estimate.gpu_layers if any(t.kind == "gpu" for t in targets) else 0
    command = server_command(
        result.estimate,
        args.gguf or "MODEL.gguf",
        gpu_layers,
        model.arch.sliding_window is not None,
        plan is not None and plan.gpus_hidden,
    )
    if args.json:
        out = result.to_json() | {"llama_server_command": command}
        if plan is not None:
            out["auto_fit"] = {
                "gpu_layers": plan.gpu_layers,
                "n_cpu_moe": plan.n_cpu_moe,
                "margin_bytes": plan.margin_bytes,
                "gpus_hidden": plan.gpus_hidden,
                "steps": list(plan.steps),
            }
        print(json.dumps(out, indent=2))
    else:
        print(format_result(result))
        if plan is not None:
            print("\nAuto fit (as llama.cpp's --fit): " + " ".join(plan.steps))
        print(f"\nllama-server command:\n  {command}")
    return 0


def _check_projector_width(settings, arch) -> None:
    p = settings.mmproj
    if p is not None and p.n_embd_text != arch.n_embd:
        # mtmd refuses it too: "mismatch between text model (n_embd = ...) and mmproj".
        raise FitScopeError(
            f"The projector {p.name} outputs width {p.n_embd_text}, but {arch.name} takes {arch.n_embd}: "
            "it belongs to another model (llama-server would refuse it)."
        )


def format_result(result) -> str:
    e = result.estimate
    lines = [
        f"{result.model.label} ({result.model.arch.arch}, {result.model.quant}) at {e.settings.context_tokens:,} "
        f"tokens of context, {e.settings.parallel_sequences} sequence(s)"
    ]
    vision = e.projector is not None
    header = (
        f"{'device':38s} {'weights':>9s} {'repack':>8s} {'KV':>8s} {'state':>7s} {'compute':>8s} "
        f"{'output':>7s} {'overhd':>7s} "
        + (f"{'vision':>8s} " if vision else "")
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
            + f"{d.total_bytes / GIB:8.2f}G {d.capacity_bytes / GIB:8.2f}G  "
            + (
                f"fits ({d.free_bytes / GIB:.2f} GiB free)"
                if d.fits
                else f"DOES NOT FIT ({-d.free_bytes / GIB:.2f} GiB over)"
            )
        )
    s = result.speed
    from app.core.coverage import APPROXIMATE_NOTE
    from app.core.fit import placement_of

    placement = {
        "gpu": "fits on the GPU",
        "partial": f"runs partly in system memory ({e.gpu_layers} of {e.n_layer + 1} layers on the GPU"
        + (f", experts of {e.cpu_moe_layers} layers in RAM" if e.cpu_moe_layers else "")
        + ")",
        "cpu": "runs on the CPU",
        "none": "does not fit",
    }[placement_of(e)]
    build = e.backend.upper() if e.backend != "cpu" else "CPU"
    if e.projector is not None and e.projector_device is not None:
        p = e.projector
        lines += [
            "",
            f"Vision projector ({p.spec.name}) on {e.devices[e.projector_device].name}: "
            f"{p.total_bytes / MIB:,.0f} MiB = weights {p.weights_bytes / MIB:,.0f} MiB + compute "
            f"{p.compute_bytes / MIB:,.0f} MiB" + (" (approximate)" if p.approximate else "") + ".",
        ]
    lines += [
        "",
        f"llama.cpp build: {build}, as {e.settings.consumer} runs it; "
        f"repacked weights: {e.repack_bytes / GIB:.2f} GiB.",
        f"Verdict: {placement}"
        + (f" ({APPROXIMATE_NOTE})" if e.approximate else "")
        + f". Largest context that fits: {result.max_context:,} tokens; "
        f"concurrent users at {e.settings.context_tokens:,} tokens each: {result.max_users}"
        + (
            f"; GPU layers that fit with no margin: {result.max_gpu_layers} of {e.n_layer + 1}."
            if result.max_gpu_layers is not None
            else "."
        ),
        f"Decode: {s.decode_tokens_per_s.low:.1f}-{s.decode_tokens_per_s.high:.1f} tokens/s"
        + (
            f" per user ({s.users} at once: {s.decode_total_tokens_per_s.low:.0f}-"
            f"{s.decode_total_tokens_per_s.high:.0f} in total)"
            if s.users > 1
            else ""
        )
        + "; "
        f"prefill: {s.prefill_tokens_per_s.low:.0f}-{s.prefill_tokens_per_s.high:.0f} tokens/s; "
        f"time to first token ({s.prompt_tokens} tokens): {s.ttft_s.low:.2f}-{s.ttft_s.high:.2f} s.",
        "",
        "Assumptions:",
    ]
    lines += [f"  - {a}" for a in list(e.assumptions) + list(s.assumptions)]
    return "\n".join(lines)


def cmd_models(args: argparse.Namespace) -> int:
    from app.core.catalog import load_models

    models = load_models()
    if args.json:
        print(json.dumps([m.model_dump() for m in models], indent=2))
        return 0
    print(f"{'id':24s} {'arch':10s} {'params':>8s} {'layers':>6s} {'ctx':>8s}  name")
    for m in models:
        size = f"{m.params_billions:g}B" if m.params_billions else "?"
        print(f"{m.id:24s} {m.arch:10s} {size:>8s} {m.n_layer:6d} {m.n_ctx_train:8d}  {m.name}")
    return 0


def cmd_architectures(args: argparse.Namespace) -> int:
    from app.core.coverage import coverage_table, llamacpp_architectures

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
    from app.core.catalog import load_devices

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
    from app.adapters.host import detect_host
    from app.adapters.nvml import NvmlMonitor

    status = NvmlMonitor().status()
    host = detect_host(measure_bandwidth=True)
    if args.json:
        print(json.dumps({"nvml": status.model_dump(), "host": host.model_dump()}, indent=2))
        return 0
    if status.available:
        for g in status.gpus:
            print(
                f"GPU {g.index}: {g.name}  {g.memory_used_bytes / GIB:.1f}/{g.memory_total_bytes / GIB:.1f} GiB used, "
                f"{g.bandwidth_gb_s or 0:.0f} GB/s, driver {g.driver_version}, CUDA {g.cuda_version}"
            )
    else:
        print(status.message)
    bw = (
        f"{host.measured_read_bandwidth_gb_s:.1f} GB/s measured"
        if host.measured_read_bandwidth_gb_s
        else "not measured"
    )
    print(
        f"CPU: {host.cpu_model}, {host.physical_cores or '?'} cores / {host.logical_cores} threads; "
        f"RAM {host.ram_available_bytes / GIB:.1f} of {host.ram_total_bytes / GIB:.1f} GiB available; "
        f"memory read bandwidth {bw}"
    )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from app.adapters.demo_model import demo_model_path

    path = demo_model_path()
    ns = build_parser().parse_args(["estimate", "--gguf", str(path)] + (["--json"] if args.json else []))
    if not args.json:
        print(f"Demo model: {path}\n")
    return cmd_estimate(ns)


def _run_settings(args: argparse.Namespace, mode: str):
    from pydantic import ValidationError

    from app.core.measure import RunSettings

    path = args.gguf
    if not path:
        from app.adapters.demo_model import demo_model_path

        path = str(demo_model_path())
    fields = {
        "gguf_path": path,
        "mode": mode,
        "n_ctx": args.ctx_size,
        "n_batch": args.batch_size,
        "n_ubatch": args.ubatch_size,
        "flash_attn": args.flash_attn == "on",
        "cache_type_k": args.cache_type_k,
        "cache_type_v": args.cache_type_v,
        "n_gpu_layers": args.n_gpu_layers,
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
    try:
        return RunSettings(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise FitScopeError(f"Invalid {first['loc'][0] if first['loc'] else 'setting'}: {first['msg']}.") from exc


def _measure_and_report(args: argparse.Namespace, mode: str) -> int:
    from app.adapters.child_protocol import ChildEvent
    from app.adapters.host import detect_host
    from app.adapters.llamacpp_runner import LiveLoaded, RunDone, run_live
    from app.adapters.nvml import NvmlMonitor
    from app.core import fit

    settings = _run_settings(args, mode)
    model = fit.model_from_gguf(settings.gguf_path)
    host = detect_host(measure_bandwidth=False)
    status = NvmlMonitor().status()
    hardware = {"label": host.cpu_model, "cpu": host.cpu_model}
    if status.available:
        hardware["gpus"] = ", ".join(g.name for g in status.gpus)
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
        from app.core.llama_defaults import thread_sweep
        from app.core.measure import sweep_rows

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
        return _report_run(args, result, model, host, status, sweep)


def _report_run(args, result, model, host, status, sweep) -> int:
    from app.adapters.host import measure_read_bandwidth_gb_s
    from app.core.scenario import Machine
    from app.services.runs import finish_run, ran_on_gpu, save_run

    machine = Machine(gpus=status.gpus if status.available else (), host=host, gpu_message=status.message)
    if not ran_on_gpu(result, machine):
        bw = measure_read_bandwidth_gb_s(budget_s=0.3)
        machine = Machine(host=host.model_copy(update={"measured_read_bandwidth_gb_s": bw}))
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
        d = est["decode_tokens_per_s"]
        lines.append(f"estimated decode {d['low']:.0f}-{d['high']:.0f} tok/s")
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
    from app.adapters.rpc_servers import parse_endpoints, run_across_rpc
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


def cmd_quantize(args: argparse.Namespace) -> int:
    from app.adapters.quantizer import default_variant_path, quantize

    target = args.output or default_variant_path(args.gguf, args.type)
    last = [-1]

    def progress(done: int, total: int) -> None:
        percent = 100 * done // max(total, 1)
        if percent // 10 != last[0] // 10:
            print(f"  {percent:3d}% ({done}/{total} tensors)", file=sys.stderr)
            last[0] = percent

    out = quantize(args.gguf, target, args.type, on_progress=progress)
    print(f"{out} ({out.stat().st_size / MIB:,.1f} MiB)")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from app.adapters.ab_compare import compare_variants
    from app.adapters.host import detect_host
    from app.adapters.user_suites import load_user_suites
    from app.core import fit
    from app.core.catalog import find_device
    from app.core.quant_compare import routing_config, to_toml
    from app.core.suites import builtin_suites, find_suite

    yours = [u.suite for u in load_user_suites()[0]]
    suites = [find_suite(s, yours) for s in args.suite] if args.suite else [*builtin_suites().values(), *yours]
    host = detect_host(measure_bandwidth=False)
    if args.gpu:
        device = find_device(args.gpu)
        targets = [fit.target_from_device(device), fit.host_ram_target(host.ram_total_bytes)]
        hardware = device.name
    else:
        targets = [fit.cpu_target(host)]
        hardware = f"this machine's CPU ({host.cpu_model})"

    def progress(fraction: float, message: str) -> None:
        if not args.json:
            print(f"  {fraction:4.0%} {message}", file=sys.stderr)

    divergence = None
    if not args.no_kl:
        from app.adapters.divergence_runner import DivergenceSettings, builtin_text, read_text

        text, text_name = builtin_text() if args.kl_text == "builtin" else read_text(args.kl_text)
        divergence = DivergenceSettings(
            text=text, text_name=text_name, max_tokens=args.kl_tokens, chunk_tokens=args.kl_chunk
        )
    comparison = compare_variants(
        args.gguf,
        suites,
        targets,
        hardware,
        repack=fit.repack_profile(host),
        n_ctx=args.ctx_size,
        n_gpu_layers=args.n_gpu_layers,
        on_progress=progress,
        divergence=divergence,
    )
    config = routing_config(comparison)
    if args.routing_config:
        path = args.routing_config
        text = to_toml(config) if path.endswith(".toml") else json.dumps(config, indent=2)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    report = config | {
        "suites": [{"name": s.name, "task": s.task, "quality_floor": s.quality_floor} for s in suites],
        "details": [
            {
                "name": v.label,
                "reference": v.is_reference,
                "file_bytes": v.file_bytes,
                "estimated_total_bytes": v.estimated_total_bytes,
                "peak_rss_bytes": v.peak_rss_bytes,
                "decode_tokens_per_s": v.decode_tokens_per_s,
                "prefill_tokens_per_s": v.prefill_tokens_per_s,
                "ttft_s": v.ttft_s,
                "n_threads": v.n_threads,
                "prompt_format": v.prompt_format,
                "identical_token_share": v.identical_token_share,
                "top1_agreement": v.top1_agreement,
                "divergence": v.divergence.model_dump(mode="json") if v.divergence else None,
                "answers": [
                    {
                        "suite": a.suite,
                        "prompt": a.prompt_id,
                        "passed": a.result.passed,
                        "reason": a.result.reason,
                        "text": a.text,
                    }
                    for a in v.answers
                ],
            }
            for v in comparison.variants
        ],
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    names = [s.name for s in suites]
    print(f"{'variant':28s} {'memory':>9s} {'tok/s':>7s} {'same tok':>8s} {'top-1':>6s}  " + "  ".join(names))
    for v in comparison.variants:
        same = "ref" if v.is_reference else f"{v.identical_token_share or 0:.0%}"
        top1 = "ref" if v.is_reference else f"{v.top1_agreement or 0:.0%}"
        rates = "  ".join(f"{v.pass_rates.get(n, 0):>{len(n)}.0%}" for n in names)
        print(
            f"{v.label[:28]:28s} {v.estimated_total_bytes / GIB:8.2f}G {v.decode_tokens_per_s or 0:7.1f} "
            f"{same:>8s} {top1:>6s}  {rates}"
        )
    if any(v.divergence for v in comparison.variants):
        from app.core.divergence import meaning

        print("\nMeasured on this model (95% intervals):")
        for v in comparison.variants:
            d = v.divergence
            if d is None:
                continue
            if d.is_reference or d.kl_mean is None:
                print(f"  {v.label}: reference, perplexity {d.perplexity.text('.3f')}")
                continue
            p99 = d.kl_p99.text(".3f") if d.kl_p99 else "-"
            print(
                f"  {v.label}: KL mean {d.kl_mean.text('.4f')}, 99th percentile {p99}"
                f"\n    Δ perplexity {d.delta_perplexity.text('+.3f') if d.delta_perplexity else '-'}, "
                f"same top token {d.same_top.text('.1%') if d.same_top else '-'}\n    {meaning(d)}"
            )
        for note in comparison.notes[1:]:
            print(f"  {note}")
    for advice in comparison.advice:
        print(f"\n{advice.profile} (floor {advice.floor:.0%}): {advice.chosen or 'no variant qualifies'}")
        for reason in advice.reasons:
            print(f"  - {reason}")
    return 0


def cmd_suites(args: argparse.Namespace) -> int:
    from app.adapters.user_suites import add_example, load_user_suites, user_suites_dir
    from app.core.errors import FitScopeError
    from app.core.suites import builtin_suites

    if args.add is not None:
        if not args.expect:
            raise FitScopeError("--add needs --expect: the answer you expect to the prompt.")
        prompt = sys.stdin.read() if args.add == "-" else args.add
        saved = add_example(prompt, args.expect, args.check, suite_name=args.to)
        added = saved.suite.prompts[-1]
        count = len(saved.suite.prompts)
        noun = "prompt" if count == 1 else "prompts"
        print(f"Added '{added.id}' ({args.check}) to {saved.suite.name}: {count} {noun} in {saved.path}")
        print(f"Use it: fitscope compare --gguf A.gguf --gguf B.gguf --suite {saved.suite.name}")
        return 0
    yours, problems = load_user_suites()
    rows = [(s, "built-in") for s in builtin_suites().values()] + [(u.suite, str(u.path)) for u in yours]
    print(f"{'suite':16s} {'task':13s} {'prompts':>7s} {'floor':>5s}  checks / where")
    for suite, where in rows:
        floor = f"{suite.quality_floor:.0%}" if suite.quality_floor is not None else "-"
        kinds = ", ".join(sorted({p.check.kind for p in suite.prompts}))
        print(f"{suite.name[:16]:16s} {suite.task:13s} {len(suite.prompts):7d} {floor:>5s}  {kinds} / {where}")
    if not yours:
        print(f"\nNo suites of yours yet in {user_suites_dir()}; add an example with")
        print('  fitscope suites --add "PROMPT" --expect "ANSWER" [--check contains|exact|similar]')
    for problem in problems:
        print(f"fitscope: {clean_message(problem)}", file=sys.stderr)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from app.adapters.host import detect_host
    from app.core import fit
    from app.core.catalog import find_device
    from app.core.estimate import Settings
    from app.services.plans import scale_out

    if not 1 <= args.count <= 16:
        raise FitScopeError("--count must be 1 to 16 GPUs.")
    model = fit.model_from_catalog(args.model, args.quant)
    host = detect_host(measure_bandwidth=False)
    ram = int(args.host_ram_gib * GIB) if args.host_ram_gib else host.ram_total_bytes
    settings = Settings(
        context_tokens=args.ctx_size * args.parallel, parallel_sequences=args.parallel, repack=fit.repack_profile(host)
    )
    if args.rpc_host:
        return _plan_rpc(args, model, settings, ram)
    if not args.gpu:
        raise FitScopeError("Name the GPU (--gpu CATALOG_ID), or the machines of an RPC split (--rpc-host).")
    gpu = find_device(args.gpu)
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


def _plan_rpc(args: argparse.Namespace, model, settings, ram: int) -> int:
    from app.core.rpc import NetworkLink, parse_host, rpc_plan

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

    from app.core.advisor import Workload, advise, format_advice, words_to_tokens
    from app.core.catalog import find_device
    from app.core.scenario import ModelChoice

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
            context_tokens=args.ctx_size,
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
        print(json.dumps(advice.to_json(limit=max(args.top, 1)), indent=2))
    else:
        print(format_advice(advice, top=args.top, why=args.why))
    return 0


def cmd_load(args: argparse.Namespace) -> int:
    from app.adapters.host import detect_host
    from app.adapters.load_profile import cached_profile, measure_profile, memory_slots, profile_json
    from app.core import fit
    from app.core.hardware import machine_key
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
        from app.core.errors import ModelFileError
        from app.core.files import regular_file

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
    targets, repack = [fit.cpu_target(host)], fit.repack_profile(host)
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


def cmd_window(args: argparse.Namespace) -> int:
    try:
        from app.ui.app import run_window
    except ImportError as exc:
        raise FitScopeError(
            f"The window needs PySide6 and pyqtgraph ({exc}); the other commands work without them."
        ) from exc
    return run_window(open_path=args.path, demo=args.demo)


COMMANDS = {
    "estimate": cmd_estimate,
    "models": cmd_models,
    "architectures": cmd_architectures,
    "gpus": cmd_gpus,
    "hw": cmd_hw,
    "demo": cmd_demo,
    "window": cmd_window,
    "run": cmd_run,
    "bench": cmd_bench,
    "compare": cmd_compare,
    "suites": cmd_suites,
    "plan": cmd_plan,
    "advise": cmd_advise,
    "load": cmd_load,
    "quantize": cmd_quantize,
}


def _run_module(module: str, rest: list[str]) -> int:
    """A frozen build's stand-in for ``python -m MODULE`` (see app.adapters.child)."""
    import runpy

    if not module.startswith("app.adapters."):
        print(f"fitscope: --run-module only runs FitScope's own workers, not {module!r}", file=sys.stderr)
        return 2
    sys.argv = [module, *rest]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0
    return 0


# -- input hygiene ---------------------------------------------------------------------------------

_NON_NEGATIVE = {"depth", "n_cpu_moe", "fit_target", "think", "temp"}
_MINUS_ONE_OK = {"n_gpu_layers"}  # -1: every layer
_INT_MAX = 1 << 31
_FLOAT_MAX = 1e9


def _bounded(kind: type, dest: str):
    """An argparse type that accepts only finite numbers in the range the option means."""
    low = -1 if dest in _MINUS_ONE_OK else 0 if dest in _NON_NEGATIVE else 1

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{clean_message(text, 40)!r} is not a {'whole number' if kind is int else 'number'}"
            ) from None
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        limit = _INT_MAX if kind is int else _FLOAT_MAX
        if kind is float and low == 1:
            if not 0 < value <= limit:
                raise argparse.ArgumentTypeError(f"{value:g} must be above 0 and at most {limit:g}")
        elif not low <= value <= limit:
            shown = f"{value:,}" if kind is int else f"{value:g}"
            top = f"{limit:,}" if kind is int else f"{limit:g}"
            raise argparse.ArgumentTypeError(f"{shown} must be from {low} to {top}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _harden(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Every int and float option of every command gets range checking (no NaN, no 0 tokens)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _harden(sub)
        elif action.type in (int, float):
            action.type = _bounded(action.type, action.dest)
    return parser


def clean_message(text: str, limit: int = 500) -> str:
    """One printable line of at most ``limit`` characters: control characters and escape sequences
    from files never reach the terminal."""
    text = re.sub(r"\x1b\[[0-9;?]*[ -/]*[@-~]", "", str(text))
    text = "".join(ch if ch.isprintable() else " " for ch in text)
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def main(argv: Sequence[str] | None = None) -> int:
    # The window's estimate worker is a spawned process; in a frozen build it re-enters here.
    # Elsewhere freeze_support does nothing, and importing multiprocessing would only slow the start.
    if getattr(sys, "frozen", False):
        import multiprocessing

        multiprocessing.freeze_support()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--run-module"] and len(argv) >= 2:
        return _run_module(argv[1], argv[2:])
    parser = _harden(build_parser())
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a one-line error already printed
        return exc.code if isinstance(exc.code, int) else 2
    if args.command is None:
        args = parser.parse_args(["window"])
    if args.command != "window" and threading.current_thread() is threading.main_thread():
        # SIGTERM like Ctrl+C: cleanup runs and llama.cpp children are ended, not orphaned.
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        return COMMANDS[args.command](args)
    except FitScopeError as exc:
        print(f"fitscope: {clean_message(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
    except Exception as exc:  # a defect: one line for the user, the traceback in the log
        import logging

        from app.adapters.logs import log_path, setup_logging

        setup_logging()
        logging.getLogger("fitscope").exception("fitscope %s failed", args.command)
        print(
            f"fitscope: {args.command} failed unexpectedly ({type(exc).__name__}: {clean_message(str(exc), 200)}); "
            f"details are in {log_path()}",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
