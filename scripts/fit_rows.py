"""Fit what each further row of a decode step (another user) costs a GPU, and report the error on
sources left out.

    .venv/bin/python scripts/fit_rows.py           # print the held-out table
    .venv/bin/python scripts/fit_rows.py --write   # also write the constants to resources/speed_model.json

The points are published llama-bench runs of 1-8 rows per step (tests/data/microbatch_runs.json,
every table with its source), as tests/rows_data.py reads them: the estimate's per-token rate at N
rows against one row's, beside the published one. CUDA and ROCm builds share one constant; Metal, whose
small-batch kernels are its own, has its own (``tests.rows_data.OWN_BUILDS``). Each source is left out
in turn and predicted from its build's constant fitted on the others; a build with one source is also
shown with each device predicted from the others. Run it after scripts/fit_speed.py --write: the step
time it adds to is the one the single-row constants give.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.core.speed.model import SPEED_MODEL_PATH, load_speed_model  # noqa: E402
from tests.rows_data import fit_by_build, held_out, points, summary  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the constant to resources/speed_model.json")
    args = parser.parse_args()
    found = points()
    held = held_out(found)
    # A build with one source is judged by device instead: each chip predicted from the others.
    judged = {p.build for p, _ in held}
    held += [(p, e) for p, e in held_out(found, by="device") if p.build not in judged]
    print(
        f"{len(found)} points (2-8 rows) from {len({p.source for p in found})} sources on "
        f"{len({p.device for p in found})} devices; each source predicted from its build's constant fitted on "
        "the others (a build with one source: each device from the others):\n"
    )
    print(f"{'source':50s} {'device':22s} {'model':28s} {'rows':>4s} {'median err':>10s} {'worst':>6s}")
    tables: dict[tuple[str, str, str], list[tuple[int, float]]] = {}
    for p, e in held:
        tables.setdefault((p.source, p.device, p.model), []).append((p.rows, e))
    for (source, device, model), errs in tables.items():
        med, worst = summary([e for _, e in errs])
        largest = max((e for _, e in errs), key=abs)
        print(
            f"{source.removeprefix('https://github.com/'):50s} {device[:22]:22s} {model[:28]:28s} "
            f"{len(errs):4d} {100 * med:9.0f}% x{math.exp(largest):5.2f}"
        )
    k, own = fit_by_build(found)
    for build, name in (("", "CUDA and ROCm"), *((b, b.capitalize()) for b in own)):
        mine = [(p, e) for p, e in held if p.build == build]
        errors = [e for _, e in mine]
        med, worst = summary(errors)
        sources = {p.source for p, _ in mine}
        by_source = [statistics.median(abs(e) for p, e in mine if p.source == s) for s in sources if len(sources) > 1]
        print(
            f"\n{name}: {len(mine)} points from {len(sources)} source(s) on {len({p.device for p, _ in mine})} devices"
        )
        if len(sources) > 1:
            fast = sum(e > math.log(1.25) for e in errors)
            slow = sum(e < -math.log(1.25) for e in errors)
            print(
                f"  held out by source: median error {100 * med:.1f}% (median of the sources' medians "
                f"{100 * (math.exp(statistics.median(by_source)) - 1):.1f}%); {fast} of {len(errors)} points more "
                f"than 25% too fast per user, {slow} more than 25% too slow; the largest over-estimate x{worst:.2f}."
            )
        by_device = [e for p, e in held_out(found, by="device") if p.build == build]
        dev_med, dev_worst = summary(by_device)
        print(f"  held out by device: median error {100 * dev_med:.1f}%; the largest over-estimate x{dev_worst:.2f}.")
        constant = own.get(build, k)
        print(f"  fitted on all of them: {constant:.2f} FLOP per active parameter for each further row (shader rate).")
    if args.write:
        data = json.loads(SPEED_MODEL_PATH.read_text(encoding="utf-8"))
        data["decode_row_flop_per_param"] = k
        data["decode_row_flop_by_build"] = own
        SPEED_MODEL_PATH.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        load_speed_model.cache_clear()
        print(f"wrote {SPEED_MODEL_PATH.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
