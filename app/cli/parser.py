"""The arguments of every ``fitscope`` command, in one argparse tree.

Flags follow llama.cpp's own names (-c, -b, -ub, -fa, -ctk, -ctv, -np, -ngl) so a command can be
carried over to llama-server unchanged. Range checks and one-line errors come from ``app.cli``
(``_Parser``, ``_harden``); this module only says what each command takes.
"""

from __future__ import annotations

import argparse

from app.cli import _Parser
from app.core.hardware.host_memory import HOST_MEMORY, parse_host_memory
from app.core.model.tensors import CACHE_TYPES

CACHE_TYPE_NAMES = list(CACHE_TYPES)


def _host_memory(text: str) -> str:
    """``--host-memory``'s value as its canonical key (``parse_host_memory``)."""
    try:
        return parse_host_memory(text).key
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_estimate_args(p: argparse.ArgumentParser) -> None:
    src = p.add_argument_group("model (one of)")
    src.add_argument("--gguf", metavar="PATH", help="a local GGUF file (its real tensors are summed)")
    src.add_argument("--hf-config", metavar="PATH", help="a Hugging Face config.json")
    src.add_argument("--model", metavar="CATALOG_ID", help="a catalog model, e.g. llama-3.1-8b")
    src.add_argument(
        "--hf",
        metavar="ORG/REPO[/FILE.gguf]",
        help="a GGUF on the Hugging Face Hub, read from its header: alone, the repository's GGUF files are "
        "listed; with --quant or a file path, that file is estimated",
    )
    src.add_argument(
        "--ollama", metavar="MODEL[:TAG]", help="a model in Ollama's library (e.g. qwen3:30b), read from its header"
    )
    src.add_argument("--revision", default=None, help="a branch, tag or commit of the --hf repository (default main)")
    src.add_argument(
        "--mmproj",
        metavar="PATH",
        help="a vision projector GGUF loaded beside the model (as llama-server --mmproj)",
    )
    src.add_argument(
        "--projector",
        action="store_true",
        help="add the model's vision projector: the catalog's (F16, as published beside its GGUF), the --hf "
        "repository's mmproj file, or the --ollama model's projector layer",
    )
    src.add_argument(
        "--no-mmproj-offload",
        dest="mmproj_offload",
        action="store_false",
        help="keep the projector in host memory (llama-server's flag)",
    )
    spec = p.add_argument_group("speculative decoding (llama-server; one of)")
    spec.add_argument(
        "-md",
        "--model-draft",
        metavar="PATH",
        help="a draft model GGUF for speculative decoding: its weights, KV cache and buffers are added",
    )
    spec.add_argument("--draft", metavar="CATALOG_ID", help="a catalog model as the draft (same --quant)")
    spec.add_argument(
        "--mtp",
        action="store_true",
        help="draft with the model's own multi-token-prediction head (llama-server --spec-type draft-mtp)",
    )
    spec.add_argument("-ctkd", "--cache-type-k-draft", default="f16", choices=CACHE_TYPE_NAMES)
    spec.add_argument("-ctvd", "--cache-type-v-draft", default="f16", choices=CACHE_TYPE_NAMES)
    spec.add_argument(
        "-ngld", "--n-gpu-layers-draft", type=int, default=None, help="draft layers on the GPUs (default: all)"
    )
    src.add_argument(
        "--quant",
        default=None,
        help="llama.cpp preset for --model/--hf-config (default Q4_K_M; MXFP4_MOE for models released in MXFP4); "
        "for --hf, the quantization in the file's name (Q4_K_M, UD-Q4_K_XL, IQ4_XS...)",
    )
    dev = p.add_argument_group("hardware")
    dev.add_argument(
        "--gpu",
        action="append",
        metavar="local|CATALOG_ID",
        help="'local' for the detected GPUs (NVIDIA, Apple, AMD, Intel), or a catalog id (GPUs, Apple, "
        "unified-memory boxes, CPU servers: fitscope gpus lists them); repeat for several GPUs",
    )
    dev.add_argument("--cpu", action="store_true", help="run on the CPU only (host memory)")
    dev.add_argument(
        "--host-memory",
        type=_host_memory,
        default=None,
        metavar="DDRn-SPEED-Nch",
        help="host RAM beside catalog GPUs, for its bandwidth: its generation, speed and 64-bit channels, e.g. "
        "ddr4-2666-2ch (ddr4-2ch when the speed is not known: the decode range spans the generation's grades); "
        f"presets {', '.join(HOST_MEMORY)} (default ddr5-5600-2ch)",
    )
    dev.add_argument(
        "--host-ram-gib", type=float, default=None, help="host memory beside catalog GPUs (default: this machine's)"
    )
    dev.add_argument(
        "--host-cores",
        type=int,
        default=None,
        help="physical cores of the CPU beside catalog GPUs, for the share it computes (default: by --host-memory)",
    )
    dev.add_argument(
        "--pcie",
        metavar="GENxLANES",
        default=None,
        help="the GPUs' PCIe link, e.g. 4x16 or 3x4 (an eGPU); default: as the card is sold, or as NVML reports it",
    )
    llm = p.add_argument_group("llama.cpp settings (same flags as llama-server)")
    llm.add_argument(
        "-c",
        "--ctx-size",
        type=int,
        default=4096,
        help="llama.cpp's context in tokens, shared by the -np users (default 4096)",
    )
    llm.add_argument("-b", "--batch-size", type=int, default=None, help="default 2048 (Ollama: by the context)")
    llm.add_argument("-ub", "--ubatch-size", type=int, default=None, help="default 512 (Ollama: as -b)")
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
        default="auto",
        help="layers on the GPUs: a number, 'all', or 'auto' as llama-server's --fit places them (the default)",
    )
    moe = llm.add_mutually_exclusive_group()
    moe.add_argument("--n-cpu-moe", type=int, default=None, help="keep the experts of the first N layers in RAM")
    moe.add_argument("--cpu-moe", action="store_true", help="keep every layer's experts in RAM")
    llm.add_argument("--fit-target", type=int, default=1024, help="MiB kept free per GPU by -ngl auto (default 1024)")
    llm.add_argument("--no-mmap", action="store_true", help="load the weights instead of mapping them")
    llm.add_argument(
        "-t", "--threads", type=int, default=None, help="CPU threads (default: llama.cpp's, the physical cores)"
    )
    build = p.add_argument_group("llama.cpp build and program")
    build.add_argument(
        "--backend",
        choices=["auto", "cpu", "cuda", "rocm", "vulkan", "metal", "sycl"],
        default="auto",
        help="the llama.cpp build (default: by the GPUs' vendor; the CPU build without GPUs)",
    )
    build.add_argument(
        "--consumer",
        choices=["llama-server", "llama-cpp-python", "ollama"],
        default="llama-server",
        help="who runs llama.cpp: llama-server (default), llama-cpp-python (FitScope's own runs) or ollama "
        "(llama-server with Ollama's batch sizes)",
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
    est.add_argument(
        "--fastest",
        action="store_const",
        dest="command",
        const="tune",
        default="estimate",
        help="search for the fastest llama-server settings that fit (as fitscope tune)",
    )
    tune = sub.add_parser(
        "tune", help="the fastest llama-server settings for a model and hardware: -ngl, --n-cpu-moe, -ub, KV, -fa, -t"
    )
    _add_estimate_args(tune)
    tune.add_argument(
        "--goal",
        choices=["decode", "prompt"],
        default="decode",
        help="rank by decode speed (default) or by the time to answer a -p long prompt (prefill-weighted)",
    )
    tune.add_argument("--top", type=int, default=3, help="how many settings to show (default 3)")
    tune.add_argument(
        "--check",
        action="store_true",
        help="run the top settings live on this machine (llama.cpp, llama-bench style): predicted against measured",
    )
    models = sub.add_parser("models", help="list the model catalog")
    models.add_argument("--json", action="store_true")
    models.add_argument(
        "--remote", action="store_true", help="list the remote GGUF headers read before (the header cache) instead"
    )
    archs = sub.add_parser(
        "architectures", help="the llama.cpp architectures and whether FitScope's memory rules are exact for each"
    )
    archs.add_argument("--json", action="store_true")
    gpus = sub.add_parser("gpus", help="list the GPU/device catalog")
    gpus.add_argument("--json", action="store_true")
    hw = sub.add_parser(
        "hw", help="what this machine has: its GPUs (NVIDIA, Apple, AMD, Intel), the memory they can use, CPU/RAM"
    )
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
    plan.add_argument("--count", type=int, default=2, help="number of GPUs (with --nodes: per node; default 2)")
    plan.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="vLLM across this many nodes: tensor parallel inside each, pipeline parallel across (default 1)",
    )
    plan.add_argument("--head-address", default="HEAD_IP", help="with --nodes: the head node's address for Ray")
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
    plan.add_argument(
        "--link-gbps", type=float, default=10.0, help="network speed for --rpc-host or --nodes (default 10)"
    )
    plan.add_argument(
        "--rtt-ms", type=float, default=0.2, help="network round trip for --rpc-host or --nodes (default 0.2)"
    )
    plan.add_argument("--json", action="store_true")
    adv = sub.add_parser(
        "advise",
        help="which machine to buy for a model (--model, --gguf, --hf-config), or which models a machine runs well "
        "(--machine)",
    )
    adv_model = adv.add_mutually_exclusive_group(required=True)
    adv_model.add_argument("--model", metavar="CATALOG_ID")
    adv_model.add_argument("--gguf", metavar="PATH")
    adv_model.add_argument("--hf-config", metavar="PATH")
    adv_model.add_argument(
        "--machine",
        metavar="CATALOG_ID",
        help="the other question: which catalog models this machine runs well for the workload, best answers first "
        "('local' for this computer)",
    )
    adv.add_argument("--gpus", type=int, default=1, help="with --machine: GPUs in the box (1-8, default 1)")
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
