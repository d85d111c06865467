"""The Run tab and the Load tab measure the same machine: single-sequence decode tokens/s from a
live run (`fitscope run`, llama_perf timings) and from the batching probe behind the Load tab
(one sequence's decode steps), both with no thread option, alternating.

    .venv/bin/python scripts/bench_run_vs_load.py [--gguf PATH] [--rounds 3]

Both must pick llama-server's thread count and agree within run-to-run noise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.adapters.batch_probe import measure_batching
from app.adapters.cpu_topology import llama_math_threads
from app.adapters.demo_model import demo_model_path
from app.adapters.llamacpp_runner import run_live
from app.core.speed.measure import RunSettings, summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", default=None, help="model file (default: the built-in demo model)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    path = args.gguf or str(demo_model_path())
    run_rates, load_rates = [], []
    print(f"{Path(path).name}: llama-server's thread count here is {llama_math_threads()}")
    print(f"{'round':>5s} {'Run tab tok/s':>14s} {'threads':>8s} {'Load tab tok/s':>15s} {'threads':>8s}")
    for i in range(args.rounds):
        settings = RunSettings(gguf_path=path, mode="bench", prompt_tokens=64, max_tokens=64, context_tokens=2048)
        result = run_live(settings)
        decode = summary(result)["decode_tokens_per_s"]
        profile = measure_batching(path, parallel=(1,), prompt_tokens=64, gen_tokens=64, repeat=2)
        run_rate = decode.median if decode else 0.0
        load_rate = profile.decode_tokens_per_s[1]
        run_rates.append(run_rate)
        load_rates.append(load_rate)
        print(f"{i + 1:5d} {run_rate:14.1f} {result.n_threads_used:8d} {load_rate:15.1f} {profile.n_threads:8d}")
    run_med, load_med = statistics.median(run_rates), statistics.median(load_rates)
    print(
        f"\nmedian: Run tab {run_med:.1f} tok/s, Load tab {load_med:.1f} tok/s; "
        f"difference {100 * (load_med - run_med) / run_med:+.1f}%"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
