"""Prints how the estimate holds at sequence counts the proof cases do not fix: every proof model at
two and three sequences, with llama-cpp-python's and llama-server's logits, against llama.cpp's dry run.

    .venv/bin/python scripts/bench_sequences.py [MODEL_ID ...]

Three sequences do not divide a ubatch of 512, so llama.cpp reserves a graph of 513 tokens; the
compute allowance is measured at one and four sequences. Each line: ok, OVER (above llama.cpp beyond
the proof's 2% / 8 MiB tolerance) or UNDER (below it beyond its 0.02 MiB print precision), then the
counts. Target: no UNDER.
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.core.common.errors import FitScopeError  # noqa: E402
from tests.support.proof import CASES, Case, run_case  # noqa: E402

SHAPES = ((3, 24576), (2, 16384), (3, 12288))  # (sequences, context): 8,192 / 8,192 / 4,096 cells each
CONSUMERS = ("llama-cpp-python", "llama-server")


def main(models: list[str]) -> int:
    quant: dict[str, str] = {}
    for c in CASES:
        quant.setdefault(c.model_id, c.quant)
    chosen = models or list(quant)
    tally: Counter[str] = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        for model in chosen:
            for sequences, context in SHAPES:
                for consumer in CONSUMERS:
                    case = Case(
                        model, quant=quant.get(model, "Q4_K_M"), context=context, parallel=sequences, consumer=consumer
                    )
                    try:
                        result = run_case(case, Path(tmp))
                    except FitScopeError as exc:
                        tally["llama.cpp failed"] += 1
                        print(f"FAIL  {case.label}: {str(exc).splitlines()[0][:160]}", flush=True)
                        continue
                    under = [r for r in result.rows if r.under]
                    over = [r for r in result.rows if not r.ok and not r.under]
                    tag = "UNDER" if under else "OVER" if over else "ok"
                    tally[tag] += 1
                    shown = ", ".join(
                        f"{r.component} {r.error_bytes / 2**20:+.2f} MiB ({r.error_percent:+.1f}%)"
                        for r in under + over
                    )
                    print(f"{tag:5s} {case.label} {shown}", flush=True)
    print("; ".join(f"{k}: {v}" for k, v in sorted(tally.items())))
    return 1 if tally["UNDER"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
