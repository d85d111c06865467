"""How long each built-in task suite takes on one model, and how the model does on it.

    .venv/bin/python scripts/bench_suites.py [--gguf PATH] [--suite NAME ...] [--show-failures]

Runs every prompt of each suite greedily through llama.cpp, exactly as one variant of
``fitscope compare`` does (the model's chat template when it has one, llama-server's thread count),
and prints per suite: the prompts, the wall time (the model loads once per suite, as in a compare),
the generated and prompt tokens, the decode speed, and the pass rate with its 95% interval. The
default model is the built-in demo model (Gemma 3 270M Q4_K_M). ``--show-failures`` prints each
failed prompt's answer and the check's reason.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", default=None, help="a GGUF file (default: the built-in demo model)")
    parser.add_argument("--suite", action="append", metavar="NAME|PATH", help="a suite (repeatable; default: all)")
    parser.add_argument("--show-failures", action="store_true", help="print the answer and reason of each failure")
    args = parser.parse_args()

    from app.adapters.ab_compare import prompt_jobs
    from app.adapters.demo_model import demo_model_path
    from app.adapters.suite_runner import SuiteRunSettings, run_suite
    from app.core.quality.evidence import wilson_interval
    from app.core.quality.quant_compare import score
    from app.core.quality.suite_reading import builtin_suites, find_suite

    gguf = args.gguf or str(demo_model_path())
    suites = [find_suite(s) for s in args.suite] if args.suite else list(builtin_suites().values())
    print(f"{Path(gguf).name}")
    print(
        f"{'suite':15s} {'prompts':>7s} {'time':>7s} {'load':>6s} {'gen tok':>7s} {'prompt tok':>10s} "
        f"{'tok/s':>6s}  pass rate (95%)"
    )
    total = 0.0
    for suite in suites:
        jobs = prompt_jobs([suite])
        start = time.perf_counter()
        run = run_suite(SuiteRunSettings(gguf_path=gguf, prompts=jobs))
        elapsed = time.perf_counter() - start
        total += elapsed
        answers = {(suite.name, o.id.split("/", 1)[1]): o.text for o in run.outcomes}
        errors = {(suite.name, o.id.split("/", 1)[1]): o.error for o in run.outcomes if o.error}
        rates, checked = score([suite], answers, errors)
        passed = sum(a.result.passed for a in checked)
        low, high = wilson_interval(passed, len(checked))
        generated = sum(len(o.tokens) for o in run.outcomes)
        prompt_tokens = sum(o.prompt_tokens for o in run.outcomes)
        decode = [o.decode_tokens_per_s for o in run.outcomes if o.decode_tokens_per_s]
        speed = sum(decode) / len(decode) if decode else 0.0
        print(
            f"{suite.name:15s} {len(suite.prompts):7d} {elapsed:6.1f}s {run.load_s:5.1f}s {generated:7d} "
            f"{prompt_tokens:10d} {speed:6.1f}  {rates[suite.name]:.0%} ({low:.0%}–{high:.0%}), "
            f"{passed}/{len(checked)} [{run.prompt_format}]"
        )
        if args.show_failures:
            for a in checked:
                if not a.result.passed:
                    print(f"    {a.prompt_id}: {a.result.reason}\n        answer: {a.text[:160]!r}")
    print(f"all suites: {total:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
