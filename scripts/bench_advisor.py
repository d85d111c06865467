"""Times the hardware advisor: the full catalog x quantization presets x offload options for one
workload, from a cold start of the sweep (tensor layouts computed) and warm (layouts kept).

    .venv/bin/python scripts/bench_advisor.py [--model llama-3.3-70b] [-c 16384] [--users 4] [--min-tps 15]

Prints, per workload, the configurations evaluated, how many needed the estimator, and the time.
Target: under 2 s for each, on a 2-core machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.core.advisor.records import Workload
from app.core.report.choices import ModelChoice
from app.services.advisor import advise

TARGET_S = 2.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.3-70b")
    parser.add_argument("-c", "--ctx-size", type=int, default=16384)
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--min-tps", type=float, default=15.0)
    args = parser.parse_args()
    workloads = [
        (args.model, "slight", args.ctx_size, args.users, args.min_tps),
        (args.model, "any", args.ctx_size, args.users, args.min_tps),
        ("gpt-oss-120b", "slight", 32768, 8, 20.0),
        ("qwen3-235b-a22b", "noticeable", 16384, 2, 10.0),
    ]
    worst = 0.0
    for model, floor, ctx, users, tps in workloads:
        w = Workload(
            model=ModelChoice(kind="catalog", ref=model),
            context_per_user_tokens=ctx,
            users=users,
            min_tokens_per_s=tps,
            quality_floor=floor,  # type: ignore[arg-type]
        )
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            advice = advise(w)
            times.append(time.perf_counter() - t0)
        worst = max(worst, *times)
        print(
            f"{model:18s} floor={floor:10s} -c {ctx:>6} users={users} min {tps:g} tok/s: "
            f"{advice.evaluated:5d} configurations ({len(advice.presets)} presets, {advice.estimated} estimated), "
            f"{len(advice.passing)} pass; cold {times[0]:.2f} s, warm {times[1]:.2f} s"
        )
    verdict = "within" if worst < TARGET_S else "OVER"
    print(f"worst {worst:.2f} s: {verdict} the {TARGET_S:.0f} s target")
    return 0 if worst < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
