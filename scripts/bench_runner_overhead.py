"""What the app's runner costs: the same model and settings through FitScope's runner (a llama.cpp
child process streaming events to this process) and through a bare llama-cpp-python loop in this
process, alternating, and the ratio of their decode speeds.

The runner is given no thread count, as `fitscope run` with no --threads: it must pick
llama-server's (the physical cores). The bare loop is given that count explicitly (n_threads =
n_threads_batch = llama-server's), so the ratio shows both the runner's overhead and whether its
default matches llama.cpp's own tools.

    .venv/bin/python scripts/bench_runner_overhead.py [--gguf PATH] [-n 128] [--rounds 4]

Target: the runner keeps at least 95% of the bare decode tokens/s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.adapters.cpu_topology import llama_math_threads
from app.adapters.demo_model import demo_model_path
from app.adapters.llamacpp_runner import run_live
from app.core.speed.measure import RunSettings

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def bare_decode_tokens_per_s(llm, n_tokens: int) -> float:
    """Greedy decoding in a plain loop, timed like the runner: from the first token to the last."""
    llm.reset()
    tokens = llm.tokenize(PROMPT.encode(), add_bos=True)
    times = []
    start = time.perf_counter()
    for _token in llm.generate(tokens, temp=0.0, top_k=40, top_p=0.95, min_p=0.05, reset=True):
        times.append(time.perf_counter() - start)
        if len(times) >= n_tokens:
            break
    return (len(times) - 1) / (times[-1] - times[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", default=None, help="model file (default: the built-in demo model)")
    parser.add_argument("-n", "--n-predict", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("-c", "--ctx-size", type=int, default=2048)
    args = parser.parse_args()
    path = args.gguf or str(demo_model_path())

    import llama_cpp

    threads = llama_math_threads()
    llm = llama_cpp.Llama(
        model_path=path,
        n_ctx=args.ctx_size,
        flash_attn=True,
        swa_full=True,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    settings = RunSettings(
        gguf_path=path,
        prompt=PROMPT,
        max_tokens=args.n_predict,
        context_tokens=args.ctx_size,
        ignore_eos=True,
        repeat=1,
    )
    bare_decode_tokens_per_s(llm, 8)  # warm the caches once
    app_rates, bare_rates = [], []
    print(
        f"{Path(path).name}: {args.n_predict} tokens per run, {args.rounds} rounds, alternating; "
        f"bare loop with n_threads={threads} (llama-server's count here), runner with no thread option"
    )
    print(f"{'round':>5s} {'runner tok/s':>13s} {'bare tok/s':>11s} {'ratio':>7s}")
    for i in range(args.rounds):
        result = run_live(settings)
        if result.n_threads_used != threads:
            print(f"the runner used {result.n_threads_used} threads, not llama-server's {threads}")
            return 1
        app = result.runs[0].decode_tokens_per_s_wall or 0.0
        bare = bare_decode_tokens_per_s(llm, args.n_predict)
        app_rates.append(app)
        bare_rates.append(bare)
        print(f"{i + 1:5d} {app:13.1f} {bare:11.1f} {app / bare:7.3f}")
    ratio = statistics.median(app_rates) / statistics.median(bare_rates)
    print(
        f"\nmedian: runner {statistics.median(app_rates):.1f} tok/s, bare {statistics.median(bare_rates):.1f} tok/s; "
        f"the runner keeps {100 * ratio:.1f}% of the bare decode speed (target 95%)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
