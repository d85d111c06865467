"""FitScope's estimate against public llama.cpp load logs from real GPUs, buffer by buffer.

    .venv/bin/python scripts/bench_gpu_logs.py

The logs (tests/data/gpu_load_logs.json, each with its source; tests/data/gpu_load_logs.md lists
them) were posted in public issue threads. The ones whose model, quantization and settings are
known carry a ``fitscope_case``; every printed buffer of those is estimated with the same settings
and the error printed, with a summary per buffer kind. The target for compute and pinned-host
buffers is 5% or 32 MiB, whichever is larger.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.gpu_logs import all_checks, load_logs  # noqa: E402


def main() -> int:
    logs = load_logs(ROOT / "tests" / "data" / "gpu_load_logs.json")
    checks = all_checks(logs)
    cased = sum("fitscope_case" in log for log in logs)
    print(f"{len(logs)} public load logs, {cased} with a known model and settings, {len(checks)} buffers compared\n")
    print(f"{'log':42s} {'buffer':28s} {'printed':>10s} {'FitScope':>10s} {'error':>9s} {'%':>7s}  ok")
    for c in checks:
        print(
            f"{c.log_id[:42]:42s} {c.buffer[:28]:28s} {c.printed_mib:9.1f}M {c.estimated_mib:9.1f}M "
            f"{c.error_mib:+8.1f}M {100 * c.error_fraction:+6.1f}%  {'yes' if c.within() else 'NO'}"
        )
    by_kind = defaultdict(list)
    for c in checks:
        by_kind[c.kind].append(c)
    print(f"\n{'kind':14s} {'n':>3s} {'median |err|':>13s} {'worst':>9s} {'within 5% or 32 MiB':>20s}")
    for kind, rows in sorted(by_kind.items()):
        errs = [abs(r.error_fraction) for r in rows]
        worst = max(rows, key=lambda r: abs(r.error_fraction))
        ok = sum(r.within() for r in rows)
        print(
            f"{kind:14s} {len(rows):3d} {100 * statistics.median(errs):12.1f}% {100 * worst.error_fraction:+8.1f}% "
            f"{ok:>12d} of {len(rows)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
