"""Fit the speed model on published llama-bench results and report its error on hardware left out.

    .venv/bin/python scripts/fit_speed.py            # print the cross-validation tables
    .venv/bin/python scripts/fit_speed.py --write    # also refit resources/speed_model.json
    .venv/bin/python scripts/fit_speed.py --markdown # the tables as the README prints them

The rows (tests/data/llama_bench_gpu.json, llama_bench_apple_cpu.json, llama_bench_budget.json;
every row names its source) cover discrete GPUs, Apple M-series, CPUs, unified-memory boxes, AMD
GPUs and GPUs with weights in system memory. Cross-validation holds rows out twice over: whole
sources (a repository, a thread, a page: rows of one source share a build, settings and a
methodology, and a new machine is a new source) and whole devices; their rows are predicted from
constants fitted on the rest (by source, each source left out in turn; by device, 5 folds of whole
devices; each prediction's range comes from an inner 5-fold cross-validation of its training rows,
grouped the same way). The sources gathered in one batch after the constants were fitted
(FRESH_SOURCES) stay out of the fit, a test set its constants are judged on. First it prints how far
apart two sources are where they measured the same device, build, model, weight format and test: the
floor under any held-out figure on those devices.
Targets, grouped by source: decode median error <= 10% with >= 80% inside the range; prefill median
<= 20%; rows with weights in system memory <= 20% for both; x86 CPUs <= 15%.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.core.speed.model import SPEED_MODEL_PATH, load_speed_model  # noqa: E402
from tests.speed_data import (  # noqa: E402
    DECODE_RELEASE,
    DECODE_RELEASE_DATE,
    EXCLUDED_SOURCES,
    FRESH_SOURCES,
    GROUP_FALLBACK,
    cross_validate,
    fit_model,
    fresh_held,
    held_out_intervals,
    load_rows,
    source_key,
    source_pairs,
)

KINDS = (("hybrid", "(weights in RAM)"), ("cpu", "(CPU rows)"), ("amd", "(AMD rows)"))


def figures(held) -> tuple[int, int, int, float, float]:
    """(rows, devices, sources, median |error|, share inside the range)."""
    if not held:
        return 0, 0, 0, 0.0, 0.0
    err = statistics.median(abs(h.error) for h in held)
    inside = sum(h.inside for h in held) / len(held)
    return (
        len(held),
        len({h.row.device for h in held}),
        len({source_key(h.row.source) for h in held}),
        100 * err,
        100 * inside,
    )


def table(held, markdown: bool) -> list[str]:
    """Per test: the whole, each family, then the hybrid, CPU and AMD rows."""
    lines = []
    if markdown:
        lines += [
            "| test / family | rows | devices | sources | median error | inside range |",
            "|---|---|---|---|---|---|",
        ]
    else:
        lines.append(f"{'test / family':18s} {'rows':>4s} {'devs':>4s} {'srcs':>4s} {'median err':>10s} {'inside':>7s}")
    for test, name in (("tg", "decode (tg)"), ("pp", "prefill (pp)")):
        rows_t = [h for h in held if h.row.test == test]
        groups = [(name, rows_t)]
        groups += [("  " + f, [h for h in rows_t if h.row.family == f]) for f in sorted({h.row.family for h in rows_t})]
        groups += [("  " + label, [h for h in rows_t if h.row.kind == kind]) for kind, label in KINDS]
        groups.append(("  (x86 CPUs)", [h for h in rows_t if h.row.family == "cpu-x86" and h.row.kind == "cpu"]))
        for label, chosen in groups:
            n, d, s, err, inside = figures(chosen)
            if markdown:
                bold = "**" if label == name else ""
                lines.append(f"| {bold}{label.strip()}{bold} | {n} | {d} | {s} | {err:.1f}% | {inside:.0f}% |")
            else:
                lines.append(f"{label:18s} {n:4d} {d:4d} {s:4d} {err:9.1f}% {inside:6.0f}%")
    return lines


def agreement(rows) -> list[str]:
    """How far apart two sources are that measured the same thing (``source_pairs``), per test."""
    pairs = source_pairs(rows)
    lines = ["Sources that measured the same device, build, model, weight format and test, against each other:"]
    for test, name in (("tg", "decode"), ("pp", "prefill")):
        chosen = [p for p in pairs if p.test == test]
        if not chosen:
            continue
        ratios = sorted(p.ratio for p in chosen)
        quarter, mid, three = (float(v) for v in np.percentile(ratios, [25, 50, 75]))
        lines.append(
            f"  {name}: {len(chosen)} pairs on {len({p.device for p in chosen})} devices from "
            f"{len({s for p in chosen for s in p.sources})} sources; apart by x{mid:.2f} (median; quartiles "
            f"x{quarter:.2f}-x{three:.2f}, largest x{ratios[-1]:.2f})"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="refit and write resources/speed_model.json")
    parser.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    args = parser.parse_args()
    rows = load_rows()
    n_sources = len({source_key(r.source) for r in rows})
    print(f"{len(rows)} published rows on {len({r.device for r in rows})} devices from {n_sources} sources")
    for source, why in EXCLUDED_SOURCES.items():
        print(f"left out: {source}: {why}")
    print()
    print("\n".join(agreement(rows)))
    print()
    for by in ("source", "device"):
        how = "each source left out in turn" if by == "source" else "5 folds of whole devices"
        print(f"Cross-validation grouped by {by} ({how}):\n")
        print("\n".join(table(cross_validate(rows, by=by), args.markdown)))
        print()
    fresh = load_rows(fresh=True)
    print(
        f"Sources kept out of the fit as a test set ({len(fresh)} rows on {len({r.device for r in fresh})} devices "
        f"from {len(FRESH_SOURCES)} sources, tests/data/llama_bench_fresh.md), predicted from the fit on the others:\n"
    )
    print("\n".join(table(fresh_held(rows), args.markdown)))
    print()
    model = fit_model(rows)
    fitted, h, g = model.families, model.hybrid, model.globals
    print(
        f"Shared: prompt kernels reach half their rate on {g.half_tokens:.0f} rows per matrix "
        f"(a mixture of experts' experts get a few rows of each ubatch); a ubatch reaches the experts "
        f"tokens^{g.routing_exponent:.2f} independent tokens would."
    )
    for kind, factors in sorted(g.formats().items()):
        shown = ", ".join(f"{fmt} x{v:.2f}" for fmt, v in sorted(factors.items()))
        print(f"Prefill of quantized formats on {kind} builds, against the family's factor: {shown}.")
    for kind, factors in sorted(g.read_rates().items()):
        shown = ", ".join(f"{fmt} x{v:.2f}" for fmt, v in sorted(factors.items()))
        print(f"Decode reads of each weight format on {kind}s, against the family's efficiency: {shown}.")
    print(
        f"Builds before {DECODE_RELEASE} (rows that print no build: dated before {DECODE_RELEASE_DATE}) decode on GPUs "
        f"at x{g.older_rate:.2f} of the current builds' read rate, which the shipped constants are for."
    )
    print(
        f"Weights in system memory ({h.rows} rows): host memory at {h.host_efficiency:.2f} of its spec bandwidth, "
        f"{h.host_flop_per_param:.2f} CPU FLOP per host parameter"
        + "".join(f" (+{v:.2f} for {fmt})" for fmt, v in sorted(h.format_flop_per_param.items()))
        + f", {h.sync_s * 1e6:.0f} us per host layer per token; "
        f"PCIe at {h.pcie_pinned:.2f} of the link (pinned, --no-mmap) and {h.pcie_pageable:.2f} (memory-mapped)."
    )
    if args.write:
        bands = held_out_intervals(rows)  # one inner cross-validation for both tests
        model = {
            "source": "fitted by scripts/fit_speed.py on tests/data/llama_bench_gpu.json, llama_bench_apple_cpu.json "
            "and llama_bench_budget.json (published llama-bench results, each row with its source)",
            "families": {k: v.model_dump() for k, v in sorted(fitted.items())},
            "hybrid": h.model_dump(),
            "prefill_half_tokens": g.half_tokens,
            "routing_exponent": g.routing_exponent,
            "prefill_format": g.formats(),
            "decode_format": g.read_rates(),
            # Fitted apart, on runs of several rows per step, by scripts/fit_rows.py (run it next).
            "decode_row_flop_per_param": load_speed_model().decode_row_flop_per_param,
            "decode_row_flop_by_build": load_speed_model().decode_row_flop_by_build,
            "fallback": GROUP_FALLBACK,
            "decode_interval": bands["tg"],
            "prefill_interval": bands["pp"],
            "builds_from": DECODE_RELEASE,
            "builds_from_date": DECODE_RELEASE_DATE,
        }
        SPEED_MODEL_PATH.write_text(json.dumps(model, indent=2) + "\n", encoding="utf-8")
        print(f"\nwrote {SPEED_MODEL_PATH.relative_to(ROOT)}; scripts/fit_rows.py --write refits further rows' cost")
    return 0


if __name__ == "__main__":
    sys.exit(main())
