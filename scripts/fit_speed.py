"""Fit the speed model on published llama-bench results and report its error on hardware left out.

    .venv/bin/python scripts/fit_speed.py            # print the cross-validation table
    .venv/bin/python scripts/fit_speed.py --write    # also refit resources/speed_model.json

The rows (tests/data/llama_bench_gpu.json, llama_bench_apple_cpu.json; every row names its source)
cover discrete GPUs, Apple M-series, CPUs and unified-memory boxes. Cross-validation holds whole
devices out: their rows are predicted from constants fitted on the other devices, so the figures say
how the model does on hardware it has never seen (5 folds of devices; the range of each fold
comes from an inner cross-validation of the other four). Targets: decode median error <= 10% with
>= 80% of results inside the range; prefill median <= 20% with >= 70% inside.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.core.speed.model import SPEED_MODEL_PATH  # noqa: E402
from tests.speed_data import GROUP_FALLBACK, cross_validate, fit, held_out_intervals, load_rows  # noqa: E402


def summary(held, label: str) -> str:
    if not held:
        return f"{label:16s}   0"
    err = statistics.median(abs(h.error) for h in held)
    inside = sum(h.inside for h in held) / len(held)
    devices = len({h.row.device for h in held})
    return f"{label:16s} {len(held):4d} {devices:4d} {100 * err:9.1f}% {100 * inside:8.0f}%"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="refit and write resources/speed_model.json")
    args = parser.parse_args()
    rows = load_rows()
    held = cross_validate(rows)
    print(f"{len(rows)} published rows on {len({r.device for r in rows})} devices; 5-fold cross-validation by device\n")
    print(f"{'test / family':16s} {'rows':>4s} {'devs':>4s} {'median err':>10s} {'inside':>9s}")
    for test, name in (("tg", "decode (tg)"), ("pp", "prefill (pp)")):
        rows_t = [h for h in held if h.row.test == test]
        print(summary(rows_t, name))
        for family in sorted({h.row.family for h in rows_t}):
            print(summary([h for h in rows_t if h.row.family == family], "  " + family))
        print(summary([h for h in rows_t if h.row.group == "cpu"], "  (CPU rows)"))
    if args.write:
        fitted = fit(rows)
        model = {
            "source": "fitted by scripts/fit_speed.py on tests/data/llama_bench_gpu.json and "
            "llama_bench_apple_cpu.json (published llama-bench results, each row with its source)",
            "families": {k: v.model_dump() for k, v in sorted(fitted.items())},
            "fallback": GROUP_FALLBACK,
            "decode_interval": held_out_intervals(rows, "tg"),
            "prefill_interval": held_out_intervals(rows, "pp"),
        }
        SPEED_MODEL_PATH.write_text(json.dumps(model, indent=2) + "\n", encoding="utf-8")
        print(f"\nwrote {SPEED_MODEL_PATH.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
